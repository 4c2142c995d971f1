//! Node power through Redfish `ComputerSystem.Reset` against the real sushy-emulator
//! (`--fake`: its fake systems driver changes the power state after a delay), started
//! on a free port of its own.

use std::time::{Duration, Instant};

use orchestrator::node_power::{PowerState, RedfishPower};
use policies::node_power::NodeAction;

#[path = "common/sushy_emulator.rs"]
mod sushy_emulator;
use sushy_emulator::Emulator;

fn wait_for(r: &RedfishPower, system: &str, want: PowerState) -> Duration {
    let start = Instant::now();
    // generous: the fake driver takes several seconds, the machine is loaded
    while start.elapsed() < Duration::from_secs(120) {
        if r.power_state(system).expect("power state") == want {
            return start.elapsed();
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    panic!("{system} never reached {want:?}");
}

#[test]
fn nodes_are_powered_down_and_up_through_computer_system_reset() {
    let emu = Emulator::start();
    let (r, system) = emu.first_system();
    let sys = system.clone();
    let of = move |node: &str| (node == "n1").then(|| sys.clone());
    // power up (the fake system starts off), then down, through the node actions
    let up = [NodeAction::Up {
        node: "n1".into(),
        reason: "work due".into(),
    }];
    assert!(r.apply(&up, &of).is_empty());
    wait_for(&r, &system, PowerState::On);
    let down = [NodeAction::Down {
        node: "n1".into(),
        reason: "idle".into(),
    }];
    assert!(r.apply(&down, &of).is_empty());
    wait_for(&r, &system, PowerState::Off);
    // a node without a system, and a reset type the system does not allow, are errors
    let errs = r.apply(
        &[NodeAction::Up {
            node: "n2".into(),
            reason: "x".into(),
        }],
        &of,
    );
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert!(errs[0].contains("no Redfish system"));
    let e = r.reset(&system, "PowerCycleTheMoon").expect_err("refused");
    assert!(e.to_string().contains("not allowed"), "{e}");
}
