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
            "[possible values: job, project, user, rack, day]",
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
            "[possible values: table, csv, json, html]",
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

/// Does nothing: a tick's evaluation only.
struct Nothing;

impl orchestrator::control::Actuator for Nothing {
    fn apply(&mut self, _: &policies::State, _: Timestamp) -> Vec<String> {
        Vec::new()
    }
}

#[test]
fn the_ledger_keeps_the_billing_periods_peak_and_report_charges_it() {
    let dir = tempfile::tempdir().expect("tmp");
    let site_text = format!(
        "{}\n[tariff]\ndefault_per_kwh = 0.2\ndemand_charge_per_kw = 10\ndemand_interval_min = 15\n",
        demo::DEFAULT_SITE
    );
    let start = Timestamp::parse_rfc3339("2024-06-03T06:00:00+02:00").expect("start");
    let cfg = DemoConfig {
        minutes: 120,
        seed: 3,
        tick_s: 15.0,
        site: Input::builtin("site.toml", &site_text),
        policy: Input::builtin("policy.toml", demo::DEFAULT_POLICY),
        prices: Input::builtin("prices.csv", demo::DEFAULT_PRICES),
        start,
        out: dir.path().to_path_buf(),
        faults: Vec::new(),
        uncontrolled_start: false,
        sample_s: None,
    };
    demo::run(&cfg, &mut std::io::sink()).expect("demo");
    let db = dir.path().join("state.redb");
    let open = || {
        Store::new(Box::new(
            orchestrator::embedded::EmbeddedBackend::open(&db).expect("store"),
        ))
    };
    let mut store = open();
    let entries: Vec<_> = store
        .ledger(1, 1_000_000)
        .expect("ledger")
        .into_iter()
        .map(|e| e.1)
        .collect();
    let records: std::collections::BTreeMap<String, orchestrator::demand::PeriodPeak> = store
        .records(orchestrator::demand::COLLECTION)
        .expect("records");
    drop(store);
    // the peak is the highest 15-minute average of what the ledger measured
    let mut windows: std::collections::BTreeMap<i64, (f64, f64)> = Default::default();
    for e in &entries {
        let w = windows
            .entry((e.start.secs_since(start) / 900.0).floor() as i64)
            .or_default();
        w.0 += e.energy_kwh;
        if e.account != Account::Overhead {
            w.1 += e.energy_kwh;
        }
    }
    assert_eq!(windows.len(), 8, "two hours of 15-minute intervals");
    let (peak_w, &(kwh, _)) = windows
        .iter()
        .max_by(|a, b| a.1 .0.total_cmp(&b.1 .0))
        .expect("a peak");
    let it_kw = windows.values().map(|w| w.1 * 4.0).fold(0.0, f64::max);
    assert_eq!(records.len(), 1, "{:?}", records.keys());
    let p = &records["2024-06"];
    assert!(
        (p.kw - kwh * 4.0).abs() < 1e-6 * p.kw,
        "{} vs {}",
        p.kw,
        kwh * 4.0
    );
    assert!(
        (p.it_kw - it_kw).abs() < 1e-6 * it_kw,
        "{} vs {it_kw}",
        p.it_kw
    );
    assert_eq!(p.start, start + *peak_w as f64 * 900.0);
    let attributed: f64 = p.entries.iter().map(|e| e.energy_kwh).sum();
    assert!((attributed - kwh).abs() < 1e-6 * kwh);
    assert!(p
        .entries
        .iter()
        .any(|e| matches!(e.account, Account::Job { .. })));

    // the report charges the period's peak and splits it by the peak interval's energy
    let site_file = dir.path().join("site.toml");
    std::fs::write(&site_file, &site_text).expect("site");
    let out = Command::new(env!("CARGO_BIN_EXE_powerplane"))
        .args([
            "report",
            "--group-by",
            "project",
            "--format",
            "json",
            "--site",
        ])
        .arg(&site_file)
        .arg("--store")
        .arg(&db)
        .output()
        .expect("report");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let period = &v["demand_periods"][0];
    assert_eq!(period["source"], "demand intervals");
    assert!((period["peak_kw"].as_f64().expect("kw") - p.kw).abs() < 1e-9);
    let charge = v["demand_charge"].as_f64().expect("charge");
    assert!((charge - p.kw * 10.0).abs() < 1e-6);
    let energy = v["total"]["cost"].as_f64().expect("cost");
    assert!((v["total_cost"].as_f64().expect("total") - (energy + charge)).abs() < 1e-6);
    let shares: f64 = v["rows"]
        .as_array()
        .expect("rows")
        .iter()
        .filter_map(|r| r["demand_charge"].as_f64())
        .sum();
    assert!(
        (shares - charge).abs() < 1e-6,
        "shares add up to the charge"
    );

    // a restart resumes the period's peak: the engine reads it on the first tick
    let site = telemetry::Site::parse("site.toml", &site_text).expect("site");
    let policy = policies::Policy::parse("policy.toml", demo::DEFAULT_POLICY).expect("policy");
    let mut control =
        orchestrator::control::ControlLoop::restore(site.clone(), policy, open(), 60.0)
            .expect("restore");
    let now = start + 3.0 * 3600.0;
    control.tick(now, Vec::new(), Vec::new(), &mut Nothing);
    let seen = control
        .snapshot()
        .observe(
            &site.site_entity(),
            telemetry::metric::names::PERIOD_PEAK_W,
            now,
        )
        .expect("period_peak_w after a restart");
    assert!((seen.value - p.it_kw * 1000.0).abs() < 1e-6);
}
