//! The layout DESIGN.md fixes, checked on the dependency graph itself: the vocabulary
//! and the engine carry no IO library, and the node agent carries no store, HTTP
//! server, scheduler client or policy engine.

use std::collections::BTreeSet;
use std::process::Command;

/// The crates `package` depends on (normal dependencies, all the way down).
fn tree(package: &str) -> BTreeSet<String> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .current_dir(root)
        .args([
            "tree",
            "-p",
            package,
            "-e",
            "normal",
            "--prefix",
            "none",
            "--locked",
            "--offline",
        ])
        .output()
        .expect("cargo tree runs");
    assert!(
        out.status.success(),
        "cargo tree -p {package}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect()
}

#[test]
fn the_vocabulary_and_the_engine_carry_no_io_library() {
    let io = [
        "tokio",
        "hyper",
        "reqwest",
        "rumqttc",
        "nvml-wrapper",
        "redis",
        "redb",
    ];
    for package in ["telemetry", "policies"] {
        let deps = tree(package);
        assert!(deps.contains(package), "{package}: {deps:?}");
        let found: Vec<_> = io.iter().filter(|c| deps.contains(**c)).collect();
        assert!(found.is_empty(), "{package} depends on {found:?}");
    }
}

#[test]
fn the_node_agent_carries_no_store_http_server_scheduler_client_or_engine() {
    let deps = tree("powerplane-agent");
    assert!(deps.contains("nvml-wrapper"), "the agent reads NVML");
    let banned = [
        "redb",
        "redis",
        "axum",
        "tiny_http",
        "policies",
        "integrations",
        "orchestrator",
    ];
    let found: Vec<_> = banned.iter().filter(|c| deps.contains(**c)).collect();
    assert!(found.is_empty(), "the agent depends on {found:?}");
}
