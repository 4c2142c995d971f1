//! `powerplane serve` with `[node_power]`: idle nodes powered down and up through
//! Redfish `ComputerSystem.Reset` on the real sushy-emulator (`--fake`, started on a
//! free port of its own; its fake systems start off and change state after a delay).
//!
//! Safety invariant 9 (the lease, as Redfish allows it): on take-over the controller
//! powers up the nodes it finds off, and at shutdown it powers up the nodes it
//! powered down.

mod common;

use std::time::{Duration, Instant};

use common::{http, metric_value as value, promtool_check, serve, serve_log, VIEWER};
use orchestrator::node_power::PowerState;

#[path = "common/sushy_emulator.rs"]
mod sushy_emulator;
use sushy_emulator::{wait_for, Emulator};

#[test]
fn serve_powers_idle_nodes_down_through_redfish_and_back_up_at_shutdown() {
    let emu = Emulator::start();
    let (r, system) = emu.first_system();
    // the fake system starts off: the controller finds it off when it takes over
    assert_eq!(r.power_state(&system).expect("state"), PowerState::Off);

    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path();
    common::write_site_and_deferral_policy(d);
    // no work at all: a01-n01 is idle; nothing kept in reserve
    let mut policy = std::fs::read_to_string(d.join("policy.toml")).expect("policy");
    policy.push_str(
        "[node_power]\nenabled = true\nreserve_gpus = 0\nreserve_share = 0.0\nidle_s = 15\nmin_off_s = 3600\nboot_s = 60\nshutdown_s = 10\n",
    );
    std::fs::write(d.join("policy.toml"), policy).expect("policy");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("port")
        .local_addr()
        .expect("addr")
        .port();
    let config = d.join("powerplane.toml");
    std::fs::write(
        &config,
        format!(
            "[controller]\nsite = \"site.toml\"\npolicy = \"policy.toml\"\ntick_s = 0.5\n[store]\nkind = \"embedded\"\npath = \"s.redb\"\n[node_power]\nurl = \"{}\"\ntimeout_s = 5\npoll_s = 1\nsystems = {{ \"a01-n01\" = \"{system}\" }}\n[http]\nlisten = \"127.0.0.1:{port}\"\n[[http.tokens]]\nname = \"v\"\nrole = \"viewer\"\ntoken = \"{VIEWER}\"\n",
            emu.url
        ),
    )
    .expect("config");
    let mut serve = serve(&config, 300);
    let log = || serve_log(&config);
    // take-over: what was off comes back
    wait_for(&r, &system, PowerState::On, &log);
    // idle for idle_s with nothing due: powered down
    wait_for(&r, &system, PowerState::Off, &log);
    let started = Instant::now();
    let metrics = loop {
        let (code, _, body) = http(port, "GET", "/metrics", None, b"");
        if code == 200 && value(&body, "powerplane_nodes_off") == Some(1.0) {
            break body;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the node is off but not on /metrics ({code}):\n{body}\n{}",
            log()
        );
        std::thread::sleep(Duration::from_millis(300));
    };
    assert_eq!(
        value(&metrics, "powerplane_node_power_downs_total"),
        Some(1.0)
    );
    assert_eq!(
        value(&metrics, "powerplane_node_power_failed_resumes_total"),
        Some(0.0)
    );
    // nodes not bound to a system are never powered down
    assert_eq!(value(&metrics, "powerplane_nodes_failed"), Some(0.0));
    // the off node's GPUs read 0 W, fresh: off, not stale
    let gpu = metrics
        .lines()
        .find(|l| l.starts_with("powerplane_power_watts{") && l.contains("a01-n01:0"))
        .unwrap_or_else(|| panic!("no reading of a01-n01:0:\n{metrics}"));
    assert!(gpu.trim_end().ends_with(" 0"), "{gpu}");
    promtool_check(&metrics);
    // shutdown ends the lease: the node this controller powered down comes back
    let pid = serve.0.id().to_string();
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("kill");
    assert!(killed.success());
    let status = serve.0.wait().expect("serve exits");
    assert!(status.success(), "{status:?}\n{}", log());
    wait_for(&r, &system, PowerState::On, &log);
    assert!(
        log().contains("shutting down, powering the node up"),
        "{}",
        log()
    );
}
