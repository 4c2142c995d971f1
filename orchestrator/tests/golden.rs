//! The rebuild of the runtime must not change a decision: the demo's audit log and
//! report, and the backtest's summary, are byte-identical to those of the main branch
//! before the rebuild (commit 8a3b32f, recorded with the same commands).
//!
//! A change that means to alter decisions (a new controller, a changed default) updates
//! these hashes in the same commit and says why.
//!
//! The demo runs here as it ran then: the reactive thermal controller (the demo policy
//! with `[thermal] mode = "reactive"`, examples/demo/policy-reactive.toml)
//! and the facility started uncapped (`--uncontrolled-start`). The predictive controller,
//! the default since, changes these outputs on purpose; its figures are in
//! docs/performance.md (scripts/thermal-bench). The backtest likewise runs its fixture
//! policy in reactive mode (policy-reactive.toml beside it).
//!
//! The demo's hashes and the contract backtest's changed once since, on purpose: the
//! feed-forward power budget (docs/policy.md), shared by both thermal controllers. The
//! jobs about to start are placed on the idle GPUs with the least headroom and count
//! there at their maximum in every budget scope (capped while idle where a scope is
//! short), instead of a fixed reserve at the facility that only the running jobs made
//! room for; so more cap decisions (on idle GPUs), and in the 16 kW contract backtest
//! a peak of 15.45 kW instead of 15.35 kW (still under the budget less its margin).

use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

fn sha256(path: &Path) -> String {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn run(args: &[&std::ffi::OsStr]) {
    // from the workspace root: the summary names its trace by the path it was given
    let out = Command::new(env!("CARGO_BIN_EXE_powerplane"))
        .current_dir(root())
        .args(args)
        .output()
        .expect("powerplane runs");
    assert!(
        out.status.success(),
        "powerplane {args:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_demo_writes_the_same_audit_log_and_report_as_before_the_rebuild() {
    // seed, audit.jsonl, report.csv
    let golden = [
        (
            "1",
            "2f735c6455b8cd42e9b685c789482ac8c9d9a8110132be2f4c900e2b185f010c",
            "49956d0f5f09de873a7eccb9cd60c0ab0937c9d06726ff2e28c0cf15d16c2832",
        ),
        (
            "7",
            "258e7fbc84680c2d9b6d072174515ce3be7fe9cfc079ccb7f1434b7ce35a5d87",
            "11b0d5d83023d3418b59fee9b6a200c7c69d70b19f394d9246cd41398256d1e2",
        ),
        (
            "19",
            "0f5d75b9e4c1da70643b7b478309cf54174a6a15fcb111dc5634e43d51e5f95d",
            "4776588d2e51d9ebc237fd71807239ddfa33c175eae775ef1d1ca02dd693c5cc",
        ),
    ];
    let dir = tempfile::tempdir().expect("tempdir");
    for (seed, audit, report) in golden {
        let out = dir.path().join(format!("demo-{seed}"));
        run(&[
            "demo".as_ref(),
            "--seed".as_ref(),
            seed.as_ref(),
            "--out".as_ref(),
            out.as_os_str(),
            "--policy".as_ref(),
            root()
                .join("examples/demo/policy-reactive.toml")
                .as_os_str(),
            "--uncontrolled-start".as_ref(),
        ]);
        assert_eq!(
            sha256(&out.join("audit.jsonl")),
            audit,
            "seed {seed}: audit.jsonl"
        );
        assert_eq!(
            sha256(&out.join("report.csv")),
            report,
            "seed {seed}: report.csv"
        );
    }
}

#[test]
fn the_backtest_writes_the_same_summary_as_before_the_rebuild() {
    let f = Path::new("orchestrator/tests/fixtures/backtest");
    let golden = [
        (
            "scenario.toml",
            "58e00a0a1e87670ebfaf8c4438f034243228c11e518dd5c21155c6ef428de4c7",
        ),
        (
            "scenario-contract.toml",
            "537b116a3e185d4889092c127c4b77c8d8ddbfd5a0eb358403d2a6aaf1ed8692",
        ),
    ];
    let dir = tempfile::tempdir().expect("tempdir");
    for (scenario, summary) in golden {
        let out = dir.path().join(scenario);
        run(&[
            "backtest".as_ref(),
            "--site".as_ref(),
            f.join("site.toml").as_os_str(),
            "--policy".as_ref(),
            f.join("policy-reactive.toml").as_os_str(),
            "--jobs".as_ref(),
            f.join("jobs.csv").as_os_str(),
            "--prices".as_ref(),
            f.join("prices.csv").as_os_str(),
            "--scenario".as_ref(),
            f.join(scenario).as_os_str(),
            "--out".as_ref(),
            out.as_os_str(),
        ]);
        assert_eq!(sha256(&out.join("summary.json")), summary, "{scenario}");
    }
}
