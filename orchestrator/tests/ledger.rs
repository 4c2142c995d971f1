//! The energy ledger on the simulated facility: it conserves energy against what the
//! simulator drew, and `powerplane report` reads it back.

mod common;

use std::path::Path;
use std::process::Command;

use integrations::store::{Account, Store};
use orchestrator::demo::{self, DemoConfig, Input};
use telemetry::Timestamp;

#[test]
fn the_ledger_conserves_the_simulated_facility_energy_within_half_a_percent() {
    let dir = tempfile::tempdir().expect("tmp");
    let cfg = DemoConfig {
        minutes: 120,
        seed: 3,
        tick_s: 15.0,
        site: Input::builtin("site.toml", demo::DEFAULT_SITE),
        policy: Input::builtin("policy.toml", demo::DEFAULT_POLICY),
        prices: Input::builtin("prices.csv", demo::DEFAULT_PRICES),
        start: Timestamp::parse_rfc3339("2024-06-03T06:00:00+02:00").expect("start"),
        out: dir.path().to_path_buf(),
        faults: Vec::new(),
        uncontrolled_start: false,
        sample_s: None,
    };
    let summary = demo::run(&cfg, &mut std::io::sink()).expect("demo");
    let mut store = Store::new(Box::new(
        orchestrator::embedded::EmbeddedBackend::open(&dir.path().join("state.redb"))
            .expect("store"),
    ));
    let entries: Vec<_> = store
        .ledger(1, 1_000_000)
        .expect("ledger")
        .into_iter()
        .map(|e| e.1)
        .collect();
    drop(store);
    let ledger_kwh: f64 = entries.iter().map(|e| e.energy_kwh).sum();
    let measured = summary.it_kwh + summary.cooling_kwh;
    let err = (ledger_kwh - measured).abs() / measured;
    assert!(
        err < 0.005,
        "ledger {ledger_kwh:.3} kWh against {measured:.3} kWh drawn: {:.3}% apart",
        100.0 * err
    );
    // jobs, idle and overhead are all there, and cost follows the price in force
    assert!(entries
        .iter()
        .any(|e| matches!(e.account, Account::Job { .. })));
    assert!(entries.iter().any(|e| e.account == Account::Idle));
    let overhead: f64 = entries
        .iter()
        .filter(|e| e.account == Account::Overhead)
        .map(|e| e.energy_kwh)
        .sum();
    assert!(
        (overhead - summary.cooling_kwh).abs() / summary.cooling_kwh < 0.005,
        "overhead {overhead} vs cooling {}",
        summary.cooling_kwh
    );
    let cost: f64 = entries.iter().map(|e| e.cost).sum();
    assert!(
        (cost - summary.cost).abs() / summary.cost < 0.01,
        "ledger cost {cost} vs {}",
        summary.cost
    );

    // and the report command reads the same totals back
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace");
    let out = Command::new(env!("CARGO_BIN_EXE_powerplane"))
        .args([
            "report",
            "--group-by",
            "project",
            "--format",
            "json",
            "--site",
        ])
        .arg(root.join("examples/demo/site.toml"))
        .arg("--store")
        .arg(dir.path().join("state.redb"))
        .output()
        .expect("report");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let total = v["total"]["energy_kwh"].as_f64().expect("total");
    assert!((total - ledger_kwh).abs() < 1e-6);
    let rows = v["rows"].as_array().expect("rows");
    assert!(
        rows.iter().any(|r| r["key"] == "(overhead)") && rows.iter().any(|r| r["key"] == "(idle)")
    );
    let sum: f64 = rows.iter().filter_map(|r| r["energy_kwh"].as_f64()).sum();
    assert!((sum - total).abs() < 1e-6, "the groups add up to the total");
    assert!(
        v["total"]["capped_gpu_hours"]
            .as_f64()
            .is_some_and(|h| h > 0.0),
        "the demo caps"
    );

    // HTML: one self-contained page that Chromium renders with its headings
    let html = dir.path().join("energy.html");
    let out = Command::new(env!("CARGO_BIN_EXE_powerplane"))
        .args(["report", "--format", "html", "--out"])
        .arg(&html)
        .arg("--site")
        .arg(root.join("examples/demo/site.toml"))
        .arg("--store")
        .arg(dir.path().join("state.redb"))
        .output()
        .expect("report");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let shot = dir.path().join("energy.png");
    let dom = common::chromium(&format!("file://{}", html.display()), &shot);
    let pixels = common::png_pixels(&shot);
    let green = pixels
        .iter()
        .filter(|p| {
            (i32::from(p[0]) - 24).abs() < 30
                && (i32::from(p[1]) - 128).abs() < 30
                && (i32::from(p[2]) - 56).abs() < 30
        })
        .count();
    assert!(
        green > 200,
        "the cost bars are drawn ({green} green pixels)"
    );
    for h in [
        "Energy report — demo-hall",
        "Power and price over time",
        "Caps in force",
        "Energy and cost by project",
        "Rack inlet temperatures",
        "Hottest inlet per rack",
    ] {
        assert!(dom.contains(h), "{h} missing");
    }
}

#[test]
fn report_refuses_bad_arguments_clearly() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace");
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_powerplane"))
            .arg("report")
            .args(args)
            .output()
            .expect("report")
    };
    let site = root.join("examples/demo/site.toml").display().to_string();
    for (args, says) in [
        (
            vec![
                "--group-by",
                "planet",
                "--site",
                &site,
                "--store",
                "/nonexistent.redb",
            ],
            "use job, project, user, rack or day",
        ),
        (
            vec![
                "--format",
                "pdf",
                "--site",
                &site,
                "--store",
                "/nonexistent.redb",
            ],
            "use table, csv, json or html",
        ),
        (
            vec!["--site", &site, "--store", "/nonexistent.redb"],
            "no store at",
        ),
        (vec![], "say where the ledger is"),
    ] {
        let out = run(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains(says),
            "{args:?}: {err}"
        );
    }
}
