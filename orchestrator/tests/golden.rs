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
//! short, with the scope's other idle GPUs), instead of a fixed reserve at the facility
//! that only the running jobs made room for; so more cap decisions (on idle GPUs), and
//! in the 16 kW contract backtest 214.8 capped GPU-hours instead of 206.7 (the same
//! peak, 15.35 kW).

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
            "329913030a28aa658d5d0cadf74861b0c55ad0cc48b0ed798af889d606f7d4e0",
            "6be0cd38284bb2353ba12ef01b91e1a84621133921dd3cdaaf2cc10234f75f7a",
        ),
        (
            "7",
            "cf8f0da77ac20719d17eb7db8d28b214ae7e1f74bd942ce204bd11db6e4fd26f",
            "fe4222eda86d09ce76018b6fee07e88e82fea8cfd1ad011405eb5e6d730a362d",
        ),
        (
            "19",
            "8cc2550d55738e3d9f89dac503d673e9071d931457420e4c8269bcf17817cc23",
            "f53e7394d58cf0075e94f994633e22315ce9a452281b9e52b678e09b72d45c28",
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
            "1054a75a69947d9154143f0d21493ddf00fcda2072b2439f8badc4cb3250f410",
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
