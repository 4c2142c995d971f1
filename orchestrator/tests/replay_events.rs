//! Event-driven evaluation in the replays: with readings between ticks
//! (`demo --sample-s`, the backtest scenario's `sample_s`), a reading that crosses a
//! threshold is evaluated at once on simulated time, as `serve` does, and the replay
//! stays deterministic: the same inputs give the same decisions at the same times and
//! byte-identical outputs, run after run.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

fn run(args: &[&std::ffi::OsStr]) -> Output {
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
    out
}

fn read(p: &Path) -> Vec<u8> {
    std::fs::read(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// The number in "N evaluations on events between ticks" on the demo's stderr.
fn event_evaluations(stderr: &[u8]) -> u64 {
    String::from_utf8_lossy(stderr)
        .lines()
        .find_map(|l| {
            l.strip_suffix(")")
                .filter(|l| l.contains("evaluations on events between ticks"))
                .and_then(|l| l.split_whitespace().next())
                .and_then(|n| n.parse().ok())
        })
        .unwrap_or(0)
}

#[test]
fn the_demo_evaluates_crossings_between_ticks_and_repeats_itself_byte_for_byte() {
    let dir = tempfile::tempdir().expect("tempdir");
    let demo = |name: &str, extra: &[&str]| {
        let out = dir.path().join(name);
        let mut args: Vec<&std::ffi::OsStr> = vec![
            "demo".as_ref(),
            "--minutes".as_ref(),
            "90".as_ref(),
            // row B's air handler loses a pump at minute 30: its racks' inlets climb
            // between ticks (with the power budget kept, the racks' power crosses
            // nothing between them)
            "--fault".as_ref(),
            "crah-b=pump@30".as_ref(),
            "--out".as_ref(),
            out.as_os_str(),
        ];
        args.extend(extra.iter().map(|a| std::ffi::OsStr::new(*a)));
        let o = run(&args);
        (out, o)
    };
    let (a, oa) = demo("a", &["--sample-s", "1"]);
    let (b, ob) = demo("b", &["--sample-s", "1"]);
    let (ticks, ot) = demo("ticks", &[]);
    let n = event_evaluations(&oa.stderr);
    assert!(
        n > 0,
        "no evaluation between ticks in 90 minutes of the demo read every second:\n{}",
        String::from_utf8_lossy(&oa.stderr)
    );
    assert_eq!(
        n,
        event_evaluations(&ob.stderr),
        "the same evaluations again"
    );
    assert_eq!(event_evaluations(&ot.stderr), 0, "ticks only: none between");
    for f in ["audit.jsonl", "report.csv", "jobs.csv"] {
        assert!(
            read(&a.join(f)) == read(&b.join(f)),
            "{f} differs run to run"
        );
    }
    // some decision was made off the 15 s tick grid: by an evaluation on an event
    let audit = String::from_utf8(read(&a.join("audit.jsonl"))).expect("utf-8");
    let off_grid = audit
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| v.get("time").and_then(|t| t.as_str()).map(String::from))
        .filter_map(|t| telemetry::Timestamp::parse_rfc3339(&t).ok())
        .filter(|t| t.0 % 15_000 != 0)
        .count();
    assert!(
        off_grid > 0,
        "every decision is on the tick grid: the events decided nothing"
    );
    let tick_audit = String::from_utf8(read(&ticks.join("audit.jsonl"))).expect("utf-8");
    assert_ne!(audit, tick_audit, "the events changed nothing");
}

#[test]
fn the_backtest_with_readings_between_ticks_writes_the_same_summary_every_run() {
    let f = root().join("orchestrator/tests/fixtures/backtest");
    let dir = tempfile::tempdir().expect("tempdir");
    let scenario = std::fs::read_to_string(f.join("scenario-contract.toml")).expect("scenario");
    let sampled = dir.path().join("scenario-sampled.toml");
    // the contract limit and a deep heat wave: the facility's power and the racks'
    // inlets move between ticks (the scheduler still cycles once per tick)
    std::fs::write(
        &sampled,
        scenario.replace("tick_s = 300\n", "tick_s = 300\nsample_s = 30\n")
            + "\n[heat_wave]\nstart = \"2024-06-03T06:00:00+02:00\"\ndays = 2\ncooling_drop = 0.9\n",
    )
    .expect("scenario");
    let backtest = |name: &str| {
        let out = dir.path().join(name);
        run(&[
            "backtest".as_ref(),
            "--site".as_ref(),
            f.join("site.toml").as_os_str(),
            "--policy".as_ref(),
            f.join("policy.toml").as_os_str(),
            "--jobs".as_ref(),
            f.join("jobs.csv").as_os_str(),
            "--prices".as_ref(),
            f.join("prices.csv").as_os_str(),
            "--scenario".as_ref(),
            sampled.as_os_str(),
            "--out".as_ref(),
            out.as_os_str(),
        ]);
        read(&out.join("summary.json"))
    };
    let a = backtest("a");
    let b = backtest("b");
    assert!(a == b, "summary.json differs run to run");
    let summary: serde_json::Value = serde_json::from_slice(&a).expect("json");
    assert_eq!(summary["sample_s"], 30.0);
    let n = summary["event_evaluations"].as_u64().unwrap_or(0);
    assert!(
        n > 0,
        "no evaluation between ticks: {}",
        String::from_utf8_lossy(&a)
    );
}
