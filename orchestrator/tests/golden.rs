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
            "5072ce8a88059dd126230451ee0535e18150768463043dc0cffce074a4aa487c",
            "f137bda3343c4ea523fd805066aae2b16ba1f6e6f5a4ba2d34389ad219cd31c2",
        ),
        (
            "7",
            "6d86c73571c0c10079f326d94d77b6803ac28b2362068b61a100f8b2e2f15f0c",
            "a80111f44a9b53ee5ac9e466077bd0317521441e7240451004d79dc7a7ebdd5b",
        ),
        (
            "19",
            "d11c17898e2ce7fcac588501fce56901c0591d266c79a3ff2c3937970fff2117",
            "1dd2452d8152b6cf1b7aece4d99af96c9e4e6a9419dfc3e1c181916f0d8c52e1",
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
            "b2bfe2258fbd88ca47dc5424ae52b8e282a2477d5e0bf047efcf357fe27ff7ce",
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
