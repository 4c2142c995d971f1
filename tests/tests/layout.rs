//! The layout DESIGN.md fixes, checked on the dependency graph itself: the vocabulary
//! and the engine carry no IO library, and the node agent carries no store, HTTP
//! server, scheduler client or policy engine, nor the HTTP client and Redfish poller
//! of the sources it does not run (its one HTTP/2 client speaks gRPC to the kubelet's
//! unix socket); the controller's crates depend only on those above
//! them (control, report, sim, runtime, api, serve, tools), and the control loop's
//! crate (with the store's contract it keeps its state through) on no IO library.

use std::collections::BTreeSet;
use std::process::Command;

fn workspace() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace")
        .to_path_buf()
}

/// The `.rs` files under `dir`, all the way down.
fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).expect("source folder").flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
    out
}

/// The crates `package` depends on (normal dependencies, all the way down).
fn tree(package: &str) -> BTreeSet<String> {
    cargo_tree(package, "{p}")
        .iter()
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect()
}

/// The features `package`'s build turns on in `dependency` (resolved for `package` alone).
fn features(package: &str, dependency: &str) -> BTreeSet<String> {
    cargo_tree(package, "{p} [{f}]")
        .iter()
        .filter(|l| l.split_whitespace().next() == Some(dependency))
        .filter_map(|l| l.rsplit_once('[').and_then(|(_, f)| f.strip_suffix(']')))
        .flat_map(|f| f.split(',').filter(|f| !f.is_empty()).map(str::to_string))
        .collect()
}

/// `cargo tree -p package -e normal` with one line per crate in `format`.
fn cargo_tree(package: &str, format: &str) -> BTreeSet<String> {
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
            "--format",
            format,
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
        .map(str::to_string)
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
        "powerplane-control",
        "powerplane-runtime",
        "powerplane-api",
        "powerplane-serve",
    ];
    let found: Vec<_> = banned.iter().filter(|c| deps.contains(**c)).collect();
    assert!(found.is_empty(), "the agent depends on {found:?}");
}

#[test]
fn the_node_agent_carries_no_http_client_nor_redfish_poller() {
    let deps = tree("powerplane-agent");
    assert!(deps.contains("rumqttc"), "the agent speaks MQTT");
    // hyper and h2 come in for one thing only: the kubelet's pod-resources gRPC over
    // its unix socket (agent/src/pods/grpc.rs); nothing that speaks HTTP over a network
    let banned = ["reqwest", "tower-http", "hyper-rustls", "hyper-tls"];
    let found: Vec<_> = banned.iter().filter(|c| deps.contains(**c)).collect();
    assert!(found.is_empty(), "the agent depends on {found:?}");
    let grpc = std::fs::read_to_string(workspace().join("orchestrator/agent/src/pods/grpc.rs"))
        .expect("the agent's gRPC client");
    assert!(
        grpc.contains("UnixStream") && !grpc.contains("TcpStream"),
        "the agent's HTTP/2 client dials the kubelet's unix socket only"
    );
    let hyper_users: Vec<String> = walk(&workspace().join("orchestrator/agent/src"))
        .into_iter()
        .filter(|p| {
            std::fs::read_to_string(p)
                .is_ok_and(|t| t.contains("hyper::") || t.contains("hyper_util::"))
        })
        .map(|p| p.display().to_string())
        .filter(|p| !p.ends_with("pods/grpc.rs") && !p.ends_with("pods/fake.rs"))
        .collect();
    assert!(
        hyper_users.is_empty(),
        "only the pod-resources client speaks HTTP in the agent: {hyper_users:?}"
    );
    let on = features("powerplane-agent", "telemetry-sources");
    assert!(on.contains("mqtt") && on.contains("nvml"), "{on:?}");
    let code: Vec<_> = ["redfish", "http-feeds"]
        .iter()
        .filter(|f| on.contains(**f))
        .collect();
    assert!(code.is_empty(), "the agent compiles the sources' {code:?}");
}

/// The controller's crates in their dependency order: each may depend on those before it.
const CONTROLLER: [&str; 7] = [
    "powerplane-control",
    "powerplane-report",
    "powerplane-sim",
    "powerplane-runtime",
    "powerplane-api",
    "powerplane-serve",
    "powerplane-tools",
];

#[test]
fn the_controllers_crates_depend_only_on_those_above_them() {
    for (i, package) in CONTROLLER.iter().enumerate() {
        let deps = tree(package);
        assert!(deps.contains(*package), "{package}: {deps:?}");
        let below: Vec<_> = CONTROLLER[i + 1..]
            .iter()
            .filter(|c| deps.contains(**c))
            .collect();
        assert!(below.is_empty(), "{package} depends on {below:?}");
    }
}

/// The control loop's crate is free of IO: it keeps its state through the `store`
/// crate's contract (the backends are in `integrations`), takes prices and feeds as
/// parsed series, and carries no async runtime, HTTP, MQTT, database or GPU library,
/// nor the edges' crates.
#[test]
fn the_control_loop_carries_no_io_library_nor_the_edges_crates() {
    let deps = tree("powerplane-control");
    assert!(deps.contains("powerplane-store"), "{deps:?}");
    let banned = [
        "tokio",
        "hyper",
        "reqwest",
        "axum",
        "tiny_http",
        "rumqttc",
        "redis",
        "redb",
        "nvml-wrapper",
        "rustls",
        "integrations",
        "telemetry-sources",
    ];
    let found: Vec<_> = banned.iter().filter(|c| deps.contains(**c)).collect();
    assert!(found.is_empty(), "the control loop depends on {found:?}");
}

/// The store's contract carries no backend's library.
#[test]
fn the_stores_contract_carries_no_backend_library() {
    let deps = tree("powerplane-store");
    let banned = ["tokio", "redis", "redb", "hyper"];
    let found: Vec<_> = banned.iter().filter(|c| deps.contains(**c)).collect();
    assert!(
        found.is_empty(),
        "the store's contract depends on {found:?}"
    );
}
