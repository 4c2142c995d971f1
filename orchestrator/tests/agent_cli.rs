//! `powerplane serve` commanding a `powerplane agent`, both run as an operator runs
//! them, over the real Mosquitto: a thermal cap reaches the simulated GPUs, survives a
//! controller restart, and SIGTERM on the agent restores the defaults.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{mqtt_port, publish};

fn powerplane() -> Command {
    Command::new(env!("CARGO_BIN_EXE_powerplane"))
}

/// The status file serve writes, once `pred` holds for it.
fn status_until(
    path: &Path,
    within: Duration,
    pred: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let end = Instant::now() + within;
    let mut last = serde_json::Value::Null;
    while Instant::now() < end {
        if let Ok(b) = std::fs::read(path) {
            if let Ok(v) = serde_json::from_slice::<serde_json::Value>(&b) {
                if pred(&v) {
                    return v;
                }
                last = v;
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("the agents' status never got there; last: {last:#}");
}

fn node_gpus<'a>(status: &'a serde_json::Value, node: &str) -> Vec<&'a serde_json::Value> {
    status["gpus"]
        .as_array()
        .expect("gpus")
        .iter()
        .filter(|g| g["node"] == node)
        .collect()
}

#[test]
fn serve_caps_through_the_agent_keeps_the_cap_across_its_restart_and_sigterm_restores() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let common::HotRack {
        node,
        topic,
        prefix,
    } = common::write_hot_rack(d, "agentcli");
    let port = mqtt_port();
    let http_port = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("port")
        .local_addr()
        .expect("addr")
        .port();
    std::fs::write(
        d.join("powerplane.toml"),
        format!(
            "[controller]\nsite = \"site.toml\"\npolicy = \"policy.toml\"\ntick_s = 0.5\nledger_interval_s = 1\n\n[store]\nkind = \"embedded\"\npath = \"state.redb\"\n\n[mqtt]\nurl = \"mqtt://127.0.0.1:{port}\"\nmapping = \"mapping.toml\"\n\n[http]\nlisten = \"127.0.0.1:{http_port}\"\n[[http.tokens]]\nname = \"t\"\nrole = \"viewer\"\ntoken = \"0123456789abcdef-viewer\"\n\n[agents]\nkey_file = \"site.key\"\nlease_s = 30\nrenew_s = 2\nretry_s = 1\ntopic_prefix = \"{prefix}\"\nstatus_file = \"agents.json\"\n[agents.mqtt]\nurl = \"mqtt://127.0.0.1:{port}\"\n"
        ),
    )
    .expect("config");

    let mut agent = powerplane()
        .args(["agent", "--config"])
        .arg(d.join("agent.toml"))
        .stderr(Stdio::piped())
        .spawn()
        .expect("agent");
    let serve = powerplane()
        .args(["serve", "--run-for-s", "6", "--config"])
        .arg(d.join("powerplane.toml"))
        .stderr(Stdio::piped())
        .spawn()
        .expect("serve");
    std::thread::sleep(Duration::from_millis(1000));
    for _ in 0..4 {
        publish(&format!("{topic}/b01/inlet"), "{\"c\": 35.5}");
        std::thread::sleep(Duration::from_millis(400));
    }
    let status = d.join("agents.json");
    let capped = status_until(&status, Duration::from_secs(10), |s| {
        node_gpus(s, &node)
            .iter()
            .all(|g| g["desired"]["mode"] == "limit" && g["enforced_w"] == g["desired"]["watts"])
    });
    let gpus = node_gpus(&capped, &node);
    let cap = gpus[0]["desired"]["watts"].as_f64().expect("watts");
    assert!(
        (100.0..300.0).contains(&cap),
        "a thermal cap within the A40's range: {cap}"
    );
    assert!(gpus
        .iter()
        .all(|g| g["ack_status"] == "applied" && g["applied_w"].as_f64() == Some(cap)));
    let first_id = gpus[0]["sent"]["id"].as_str().expect("id").to_string();
    // the agents' side in /metrics, valid for promtool; the same per GPU in the API
    // the agent's report reaches the fleet at once and the snapshot on the next tick;
    // the thermal rule may step the cap meanwhile: compare within one scrape
    let value = |text: &str, prefix: &str| -> Option<f64> {
        text.lines()
            .find(|l| l.starts_with(prefix))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
    };
    let limit =
        format!("powerplane_gpu_power_limit_watts{{entity=\"gpu/{node}:0\",kind=\"gpu\"}} ");
    let capped = format!("powerplane_gpu_cap_watts{{entity=\"gpu/{node}:0\",");
    let ledger_idle = "powerplane_ledger_energy_joules_total{account=\"idle\",project=\"\"} ";
    let end = Instant::now() + Duration::from_secs(5);
    let metrics = loop {
        let (code, _, metrics) = common::http(http_port, "GET", "/metrics", None, b"");
        assert_eq!(code, 200);
        let (l, c) = (value(&metrics, &limit), value(&metrics, &capped));
        // the idle GPUs' energy, charged by the ledger (1 s intervals), as a counter
        let idle = value(&metrics, ledger_idle);
        if (l.is_some() && l == c && idle.is_some_and(|j| j > 0.0)) || Instant::now() > end {
            assert!(
                l.is_some() && l == c,
                "enforced {l:?} against cap {c:?} in:\n{metrics}"
            );
            assert!(
                idle.is_some_and(|j| j > 0.0),
                "no idle energy charged in:\n{metrics}"
            );
            break metrics;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    for needle in [
        "powerplane_gpus_in_sync ",
        "powerplane_agents{status=\"online\"} 1",
        "powerplane_agent_messages_total{kind=\"acks\"}",
        "# TYPE powerplane_ledger_energy_joules_total counter",
        "powerplane_ledger_carbon_grams_total{account=\"idle\",project=\"\"} ",
    ] {
        assert!(metrics.contains(needle), "{needle} missing in:\n{metrics}");
    }
    common::promtool_check(&metrics);
    let (code, _, body) = common::http(
        http_port,
        "GET",
        "/api/v1/gpus",
        Some("0123456789abcdef-viewer"),
        b"",
    );
    assert_eq!(code, 200);
    let api: serde_json::Value = serde_json::from_str(&body).expect("json");
    let g0 = api["gpus"]
        .as_array()
        .expect("gpus")
        .iter()
        .find(|g| g["id"] == format!("gpu/{node}:0"))
        .expect("gpu 0");
    // the cap in force and the agent's view of it, in one answer (at or below the first
    // cap: the inlet is still hot and the thermal rule may have stepped down since)
    let in_force = g0["cap"]["watts"].as_f64().expect("a cap in force");
    assert!(in_force <= cap, "{in_force} above {cap}");
    assert!(g0["agent"]["desired"]["watts"]
        .as_f64()
        .is_some_and(|d| d <= cap));
    assert!(g0["agent"]["enforced_w"].as_f64().is_some_and(|e| e <= cap));
    let out = serve.wait_with_output().expect("serve ran");
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{log}");
    assert!(log.contains("commanding the GPU agents"), "{log}");

    // the controller restarts: the caps come back from the store and are renewed by
    // the new process, while the agent held them on its lease
    std::fs::remove_file(&status).expect("rm status");
    let serve = powerplane()
        .args(["serve", "--run-for-s", "3", "--config"])
        .arg(d.join("powerplane.toml"))
        .stderr(Stdio::piped())
        .spawn()
        .expect("serve again");
    // (the thermal rule may have stepped further down meanwhile: the inlet is still hot)
    let renewed = status_until(&status, Duration::from_secs(10), |s| {
        node_gpus(s, &node).iter().all(|g| {
            g["ack_status"] == "applied"
                && g["desired"]["mode"] == "limit"
                && g["enforced_w"] == g["desired"]["watts"]
                && g["desired"]["watts"].as_f64().is_some_and(|w| w <= cap)
        })
    });
    let second_id = node_gpus(&renewed, &node)[0]["sent"]["id"]
        .as_str()
        .expect("id")
        .to_string();
    assert_ne!(
        first_id.split('-').next(),
        second_id.split('-').next(),
        "commands of the new controller"
    );
    let out = serve.wait_with_output().expect("serve ran");
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{log}");
    assert!(log.contains("restored from the store"), "{log}");

    // SIGTERM: the agent restores the default limits (on_exit = restore_default) and exits
    let killed = Command::new("kill")
        .args(["-TERM", &agent.id().to_string()])
        .status()
        .expect("kill");
    assert!(killed.success());
    let end = Instant::now() + Duration::from_secs(10);
    let code = loop {
        if let Some(c) = agent.try_wait().expect("wait") {
            break c;
        }
        assert!(Instant::now() < end, "the agent did not stop on SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut log = String::new();
    std::io::Read::read_to_string(agent.stderr.as_mut().expect("stderr"), &mut log).expect("log");
    assert!(code.success(), "{log}");
    assert_eq!(
        log.matches("stopping: default power limit restored")
            .count(),
        8,
        "{log}"
    );
    assert!(
        !log.contains("fail-safe is in force") && !log.contains("rejected"),
        "the cap held across the controller restart, without a lapse: {log}"
    );
    assert!(log.contains("agent stopped"), "{log}");
}

#[test]
fn the_agent_refuses_a_broken_config_with_a_clear_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    std::fs::write(d.join("site.key"), "short").expect("key");
    std::fs::write(
        d.join("agent.toml"),
        "key_file = \"site.key\"\n[mqtt]\nurl = \"mqtt://127.0.0.1:1\"\n",
    )
    .expect("cfg");
    let out = powerplane()
        .args(["agent", "--config"])
        .arg(d.join("agent.toml"))
        .output()
        .expect("agent");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("at least 16 are needed"), "{err}");

    std::fs::write(d.join("site.key"), "ab".repeat(32)).expect("key");
    std::fs::write(
        d.join("agent.toml"),
        "key_file = \"site.key\"\nfail_safe = \"cap\"\n[mqtt]\nurl = \"mqtt://127.0.0.1:1\"\n",
    )
    .expect("cfg");
    let out = powerplane()
        .args(["agent", "--config"])
        .arg(d.join("agent.toml"))
        .output()
        .expect("agent");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("fail_safe_cap_w"),
        "{err}"
    );

    std::fs::write(d.join("agent.toml"), "key_file = \"site.key\"\nfail_safe = \"restore_default\"\nintervall_s = 1\n[mqtt]\nurl = \"mqtt://127.0.0.1:1\"\n").expect("cfg");
    let out = powerplane()
        .args(["agent", "--config"])
        .arg(d.join("agent.toml"))
        .output()
        .expect("agent");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("agent.toml:3:") && err.contains("intervall_s"),
        "{err}"
    );
}
