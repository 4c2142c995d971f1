//! Running under systemd as the units in `deploy/systemd` say: the units pass
//! `systemd-analyze verify` and its offline security check, `serve` speaks the notify
//! protocol (READY, WATCHDOG from its loop, STOPPING) over a real datagram socket, and
//! `POWERPLANE_LOG_FORMAT=json` gives one JSON object a line.

use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

fn systemd_analyze(args: &[&str], dir: &Path) -> std::process::Output {
    Command::new("systemd-analyze")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("this test needs systemd-analyze (Debian's systemd package)")
}

/// The unit with its binary path pointing at the binary under test (verify checks
/// that ExecStart is executable).
fn unit_copy(name: &str, dir: &Path) -> PathBuf {
    let text = std::fs::read_to_string(root().join("deploy/systemd").join(name)).expect("unit");
    // `powerplane agent` runs the same code as `powerplane-agent`
    let bin = env!("CARGO_BIN_EXE_powerplane");
    let text = text
        .replace("/usr/bin/powerplane-agent", &format!("{bin} agent"))
        .replace("/usr/bin/powerplane", bin);
    let p = dir.join(name);
    std::fs::write(&p, text).expect("unit copy");
    p
}

#[test]
fn the_units_verify_and_are_hardened() {
    let dir = tempfile::tempdir().expect("tempdir");
    // (unit, the highest exposure level `systemd-analyze security` may give it)
    for (name, most) in [
        ("powerplane.service", 2.0),
        ("powerplane-agent.service", 3.5),
    ] {
        unit_copy(name, dir.path());
        let v = systemd_analyze(&["verify", "--man=no", name], dir.path());
        let err = String::from_utf8_lossy(&v.stderr);
        // verify exits 0 on keys it ignores: any line about our unit is a problem
        assert!(
            v.status.success() && !err.contains(name),
            "{name}: systemd-analyze verify:\n{err}"
        );
        let text = std::fs::read_to_string(dir.path().join(name)).expect("unit");
        for key in [
            "Type=notify",
            "WatchdogSec=",
            "LimitNOFILE=",
            "ProtectSystem=strict",
            "SystemCallFilter=@system-service",
            "NoNewPrivileges=yes",
        ] {
            assert!(text.contains(key), "{name} lacks {key}");
        }
        let s = systemd_analyze(&["security", "--offline=yes", name], dir.path());
        let out = String::from_utf8_lossy(&s.stdout);
        let level: f64 = out
            .lines()
            .find_map(|l| {
                l.split_once("Overall exposure level for ")?
                    .1
                    .split_once(": ")
            })
            .and_then(|(_, rest)| rest.split_whitespace().next()?.parse().ok())
            .unwrap_or_else(|| panic!("{name}: no exposure level in:\n{out}"));
        assert!(level <= most, "{name}: exposure {level} above {most}");
    }
    let serve = std::fs::read_to_string(dir.path().join("powerplane.service")).expect("unit");
    assert!(
        serve.lines().any(|l| l.trim() == "CapabilityBoundingSet="),
        "serve needs no capability"
    );
    let agent = std::fs::read_to_string(dir.path().join("powerplane-agent.service")).expect("unit");
    assert!(agent.contains("CapabilityBoundingSet=CAP_SYS_ADMIN"));
}

/// A site, policy and config for a serve with no edges but its loop.
fn write_config(d: &Path, tick_s: f64) -> PathBuf {
    for f in ["site.toml", "policy.toml", "prices.csv"] {
        std::fs::copy(root().join("examples/demo").join(f), d.join(f)).expect("copy");
    }
    let cfg = d.join("powerplane.toml");
    std::fs::write(
        &cfg,
        format!(
            "[controller]\nsite = \"site.toml\"\npolicy = \"policy.toml\"\ntick_s = {tick_s}\n\n[store]\nkind = \"embedded\"\npath = \"state.redb\"\n\n[prices]\nfile = \"prices.csv\"\n"
        ),
    )
    .expect("config");
    cfg
}

fn recv_until(sock: &UnixDatagram, within: Duration, want: &str) -> Vec<String> {
    let end = Instant::now() + within;
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    while Instant::now() < end {
        sock.set_read_timeout(Some(Duration::from_millis(100)))
            .expect("timeout");
        if let Ok(n) = sock.recv(&mut buf) {
            let m = String::from_utf8_lossy(&buf[..n]).into_owned();
            let done = m.contains(want);
            got.push(m);
            if done {
                return got;
            }
        }
    }
    panic!("no {want:?} within {within:?}; got {got:?}");
}

#[test]
fn serve_notifies_ready_pings_the_watchdog_from_its_loop_and_says_stopping() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = write_config(dir.path(), 1.0);
    let sock_path = dir.path().join("notify.sock");
    let sock = UnixDatagram::bind(&sock_path).expect("bind");
    let mut serve = Command::new(env!("CARGO_BIN_EXE_powerplane"))
        .args(["serve", "--run-for-s", "60", "--config"])
        .arg(&cfg)
        .env("NOTIFY_SOCKET", &sock_path)
        .env("WATCHDOG_USEC", "400000")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("serve");
    let first = recv_until(&sock, Duration::from_secs(30), "READY=1");
    assert!(
        first
            .iter()
            .any(|m| m.contains("STATUS=") && m.contains("GPUs")),
        "{first:?}"
    );
    // half the watchdog interval: about 5 pings in a second, ticks or not
    let t = Instant::now();
    let mut pings = 0;
    while t.elapsed() < Duration::from_millis(1100) {
        let m = recv_until(&sock, Duration::from_secs(2), "WATCHDOG=1");
        pings += m.iter().filter(|m| m.contains("WATCHDOG=1")).count();
    }
    assert!((3..=8).contains(&pings), "{pings} watchdog pings in 1.1 s");
    let killed = Command::new("kill")
        .args(["-TERM", &serve.id().to_string()])
        .status()
        .expect("kill");
    assert!(killed.success());
    recv_until(&sock, Duration::from_secs(10), "STOPPING=1");
    let status = serve.wait().expect("wait");
    assert!(status.success(), "serve exited with {status}");
}

#[test]
fn json_logs_are_one_object_a_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = write_config(dir.path(), 0.5);
    let out = Command::new(env!("CARGO_BIN_EXE_powerplane"))
        .args(["serve", "--run-for-s", "2", "--config"])
        .arg(&cfg)
        .env("POWERPLANE_LOG_FORMAT", "json")
        .output()
        .expect("serve");
    assert!(out.status.success());
    let log = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = log.lines().collect();
    assert!(lines.len() >= 2, "too few log lines: {log}");
    for l in &lines {
        let v: serde_json::Value =
            serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}"));
        assert!(v["level"].is_string() && v["timestamp"].is_string(), "{l}");
        assert!(v["message"].is_string(), "{l}");
    }
    assert!(
        lines.iter().any(|l| l.contains("restored from the store")),
        "{log}"
    );
}
