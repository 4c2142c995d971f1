//! The slim `powerplane-agent` binary reads GPUs and refuses a broken config, as
//! `powerplane agent` does.

use std::process::Command;

fn agent() -> Command {
    Command::new(env!("CARGO_BIN_EXE_powerplane-agent"))
}

#[test]
fn the_slim_binary_reads_simulated_gpus_once() {
    let out = agent()
        .args([
            "--once",
            "--json",
            "--backend",
            "sim",
            "--gpus",
            "4",
            "--node",
            "n1",
        ])
        .output()
        .expect("powerplane-agent runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(v["node"], "n1");
    assert_eq!(v["gpus"].as_array().map(Vec::len), Some(4));
    for g in v["gpus"].as_array().into_iter().flatten() {
        let (min, max, limit) = (
            g["min_limit_w"].as_f64().expect("min"),
            g["max_limit_w"].as_f64().expect("max"),
            g["power_limit_w"].as_f64().expect("limit"),
        );
        assert!(min <= limit && limit <= max, "{g}");
    }
}

#[test]
fn the_slim_binary_refuses_a_broken_config_with_every_problem() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = dir.path().join("agent.toml");
    std::fs::write(&cfg, "colour = \"red\"\nshape = 3\n").expect("config");
    let out = agent()
        .arg("--config")
        .arg(&cfg)
        .output()
        .expect("powerplane-agent runs");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("agent.toml:1:1: unknown field `colour`"),
        "{err}"
    );
    assert!(
        err.contains("agent.toml:2:1: unknown field `shape`"),
        "{err}"
    );
}
