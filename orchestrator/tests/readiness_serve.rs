//! `/readyz` tells a load balancer the truth. A disk stall (the embedded store on a
//! filesystem of the test's own, frozen with `fsfreeze`, while a hot rack has the
//! thermal rule step its caps every second) stops the loop in its commit:
//! `/readyz` fails with `loop` within a few tick periods while the API still answers,
//! `tick_age_seconds` grows on `/metrics`, and both come back once the disk does. A
//! broken edit of the policy file keeps the policy in force and the replica in: it is
//! reported in `/readyz`'s body and as `powerplane_policy_valid 0`.
//!
//! Needs root, a loop device, `mkfs.ext4` and `fsfreeze` (util-linux), as the dev and
//! CI machines have; it fails, loudly, where they are missing.

mod common;

#[path = "common/disk.rs"]
mod disk;

use std::time::{Duration, Instant};

use disk::Disk;

use common::{http, metric_value, serve, serve_log};

fn readyz(port: u16) -> Option<(u16, serde_json::Value)> {
    let (code, _, body) = http(port, "GET", "/readyz", None, b"");
    serde_json::from_str(&body).ok().map(|v| (code, v))
}

fn wait(what: &str, within: Duration, ok: &dyn Fn() -> bool, log: &dyn Fn() -> String) {
    let end = Instant::now() + within;
    while !ok() {
        assert!(
            Instant::now() < end,
            "{what}: not within {within:?}\n{}",
            log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn a_stalled_loop_fails_readyz_and_a_broken_policy_edit_does_not() {
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path();
    let disk = Disk::mount(&d.join("disk.img"), &d.join("disk"), "64M");
    let hot = common::write_hot_rack(d, "readiness");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("port")
        .local_addr()
        .expect("addr")
        .port();
    let config = d.join("powerplane.toml");
    std::fs::write(
        &config,
        format!(
            "[controller]\nsite = \"site.toml\"\npolicy = \"policy.toml\"\ntick_s = 0.5\npolicy_reload_s = 0.5\n[store]\nkind = \"embedded\"\npath = \"{}\"\n[mqtt]\nurl = \"mqtt://127.0.0.1:{}\"\nmapping = \"mapping.toml\"\n[http]\nlisten = \"127.0.0.1:{port}\"\n[[http.tokens]]\nname = \"v\"\nrole = \"viewer\"\ntoken = \"{}\"\n",
            disk.dir.join("state.redb").display(),
            common::mqtt_port(),
            common::VIEWER
        ),
    )
    .expect("config");
    let log = || serve_log(&config);
    let _serve = serve(&config, 120);
    // a hot rack, all along: the thermal rule steps its caps down every second, and
    // every step is written to the store
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop = done.clone();
    let topic = format!("{}/b01/inlet", hot.topic);
    let publisher = std::thread::spawn(move || {
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            common::publish(&topic, "{\"c\": 36.0}");
            std::thread::sleep(Duration::from_millis(500));
        }
    });
    let ready = || readyz(port).is_some_and(|(code, _)| code == 200);
    wait("ready", Duration::from_secs(30), &ready, &log);

    // a broken edit: the policy in force runs on, the replica stays in
    let good = std::fs::read_to_string(d.join("policy.toml")).expect("policy");
    std::fs::write(d.join("policy.toml"), format!("{good}\nrulez = 1\n")).expect("edit");
    let invalid = || {
        let (_, _, m) = http(port, "GET", "/metrics", None, b"");
        metric_value(&m, "powerplane_policy_valid") == Some(0.0)
    };
    wait(
        "the edit seen as invalid",
        Duration::from_secs(15),
        &invalid,
        &log,
    );
    let (code, body) = readyz(port).expect("readyz");
    assert_eq!(code, 200, "a typo takes no replica out: {body}");
    let policy = &body["checks"]["policy"];
    assert_eq!(policy["file_valid"], false, "{body}");
    assert!(
        policy["error"]
            .as_str()
            .is_some_and(|e| e.contains("rulez")),
        "the body names the problem: {body}"
    );
    std::fs::write(d.join("policy.toml"), good).expect("restore");

    // the disk stalls: the loop stops in its commit, the API goes on answering
    disk.freeze();
    let stalled = || {
        readyz(port).is_some_and(|(code, v)| {
            code == 503
                && v["failing"]
                    .as_array()
                    .is_some_and(|f| f.iter().any(|x| x == "loop"))
        })
    };
    let frozen_at = Instant::now();
    wait(
        "/readyz failing with loop",
        Duration::from_secs(20),
        &stalled,
        &log,
    );
    let noticed = frozen_at.elapsed();
    let (_, _, m) = http(port, "GET", "/metrics", None, b"");
    let age = metric_value(&m, "powerplane_tick_age_seconds").expect("tick age on /metrics");
    assert!(
        age >= 5.0,
        "the tick's age grows while the loop is stalled: {age}"
    );
    assert!(
        noticed < Duration::from_secs(15),
        "noticed after {noticed:?}, not within a few tick periods"
    );

    // the disk is back: so are the ticks and readiness
    disk.thaw();
    wait("ready again", Duration::from_secs(30), &ready, &log);
    let (_, _, m) = http(port, "GET", "/metrics", None, b"");
    let age = metric_value(&m, "powerplane_tick_age_seconds").expect("tick age");
    assert!(age < 5.0, "ticking again: {age}");
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    publisher.join().expect("publisher");
}
