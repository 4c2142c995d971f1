//! Event-driven evaluation in `powerplane serve`: with a 15 s tick, a rack inlet that
//! jumps over its limit on MQTT is evaluated at once, and the cap command reaches the
//! node's agent topic long before the next tick (real Mosquitto, `powerplane agent`).

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::{mqtt_port, publish};

fn powerplane() -> Command {
    Command::new(env!("CARGO_BIN_EXE_powerplane"))
}

struct Kill(std::process::Child);

impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_hot_inlet_is_capped_at_once_not_at_the_next_tick() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let common::HotRack {
        node,
        topic,
        prefix,
    } = common::write_hot_rack(d, "events");
    let port = mqtt_port();
    std::fs::write(
        d.join("powerplane.toml"),
        format!(
            "[controller]\nsite = \"site.toml\"\npolicy = \"policy.toml\"\ntick_s = 15\nevent_debounce_ms = 20\nevent_max_per_s = 4\n\n[store]\nkind = \"embedded\"\npath = \"state.redb\"\n\n[mqtt]\nurl = \"mqtt://127.0.0.1:{port}\"\nmapping = \"mapping.toml\"\n\n[agents]\nkey_file = \"site.key\"\nlease_s = 60\nrenew_s = 20\nretry_s = 1\ntopic_prefix = \"{prefix}\"\n[agents.mqtt]\nurl = \"mqtt://127.0.0.1:{port}\"\n"
        ),
    )
    .expect("config");
    // what reaches the node's command topic, with when it arrived
    let mut sub = Kill(
        Command::new("mosquitto_sub")
            .args(["-p", &port.to_string(), "-t"])
            .arg(format!("{prefix}/nodes/{node}/cmd"))
            .stdout(Stdio::piped())
            .spawn()
            .expect("this test needs mosquitto_sub (mosquitto-clients)"),
    );
    let (tx, rx) = mpsc::channel::<(Instant, String)>();
    let out = sub.0.stdout.take().expect("stdout");
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send((Instant::now(), line)).is_err() {
                break;
            }
        }
    });
    let _agent = Kill(
        powerplane()
            .args(["agent", "--config"])
            .arg(d.join("agent.toml"))
            .stderr(Stdio::null())
            .spawn()
            .expect("agent"),
    );
    let started = Instant::now();
    let _serve = Kill(
        powerplane()
            .args(["serve", "--run-for-s", "14", "--config"])
            .arg(d.join("powerplane.toml"))
            .stderr(Stdio::null())
            .spawn()
            .expect("serve"),
    );
    // the first tick has run and both clients are subscribed
    std::thread::sleep(Duration::from_secs(3));
    while rx.try_recv().is_ok() {}
    let sent = Instant::now();
    publish(&format!("{topic}/b01/inlet"), "{\"c\": 36.0}");
    let next_tick = started + Duration::from_secs(15);
    let got = loop {
        let left = next_tick.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok((at, line)) if line.contains("set_power_limit") => break Some(at),
            Ok(_) => continue,
            Err(_) => break None,
        }
    };
    let at = got.expect("no cap command reached the agent before the next tick");
    let ms = at.duration_since(sent).as_secs_f64() * 1000.0;
    println!("event: inlet published -> cap command on the agent's topic in {ms:.1} ms");
    assert!(
        at < started + Duration::from_secs(13),
        "the command came {ms:.0} ms after the publish: at the tick, not at once"
    );
}
