//! `powerplane backtest` end to end: the real binary on small in-repo fixtures (a
//! 128-GPU site, 300 synthetic jobs over three days, a week of hourly prices).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/backtest")
        .join(name)
}

fn backtest(out: &Path, jobs: &Path, scenario: &str) -> Output {
    backtest_with(
        out,
        jobs,
        scenario,
        &fixture("policy.toml"),
        &fixture("prices.csv"),
    )
}

fn backtest_with(out: &Path, jobs: &Path, scenario: &str, policy: &Path, prices: &Path) -> Output {
    backtest_command(out, jobs, scenario, policy, prices)
        .output()
        .expect("powerplane runs")
}

/// `powerplane backtest` on the fixture site with these inputs, for more arguments.
fn backtest_command(
    out: &Path,
    jobs: &Path,
    scenario: &str,
    policy: &Path,
    prices: &Path,
) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_powerplane"));
    c.arg("backtest")
        .arg("--site")
        .arg(fixture("site.toml"))
        .arg("--policy")
        .arg(policy)
        .arg("--jobs")
        .arg(jobs)
        .arg("--prices")
        .arg(prices)
        .arg("--scenario")
        .arg(fixture(scenario))
        .arg("--out")
        .arg(out);
    c
}

fn summary(out: &Path) -> Value {
    let text = std::fs::read_to_string(out.join("summary.json")).expect("summary.json");
    serde_json::from_str(&text).expect("summary.json is JSON")
}

fn num(v: &Value, path: &str) -> f64 {
    v.pointer(path)
        .and_then(Value::as_f64)
        .unwrap_or_else(|| panic!("{path} missing in {v}"))
}

// carbon_kg is null here: these runs have no carbon file (not measured)
const FIELDS: [&str; 14] = [
    "energy_kwh",
    "cost",
    "demand_charge",
    "peak_kw",
    "budget_violation_s",
    "thermal_violation_s",
    "deadline_misses",
    "wait_mean_s",
    "wait_p95_s",
    "slowdown_mean",
    "slowdown_p95",
    "gpu_hours",
    "it_kwh",
    "cooling_kwh",
];

#[test]
fn the_summary_compares_both_runs_and_adds_up() {
    let dir = tempfile::tempdir().expect("tempdir");
    let o = backtest(dir.path(), &fixture("jobs.csv"), "scenario.toml");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let s = summary(dir.path());
    for run in ["baseline", "policy", "power_save"] {
        for f in FIELDS {
            num(&s, &format!("/{run}/{f}"));
        }
        // energy is the sum of its parts
        let e = num(&s, &format!("/{run}/energy_kwh"));
        let parts = num(&s, &format!("/{run}/it_kwh")) + num(&s, &format!("/{run}/cooling_kwh"));
        assert!(
            (e - parts).abs() < 1e-6 * e.max(1.0),
            "{run}: {e} vs {parts}"
        );
        // no more GPU-hours than the GPUs had hours
        let cap = num(&s, "/gpus") * num(&s, "/span_h");
        let gh = num(&s, &format!("/{run}/gpu_hours"));
        assert!(gh > 0.0 && gh <= cap, "{run}: {gh} GPU-hours of {cap}");
        assert!(num(&s, &format!("/{run}/wait_p95_s")) >= 0.0);
        assert!(num(&s, &format!("/{run}/slowdown_mean")) >= 1.0 - 1e-9);
    }
    for f in ["cost", "energy"] {
        num(&s, &format!("/savings_pct/{f}"));
    }
    assert_eq!(num(&s, "/jobs"), 300.0);
    assert_eq!(
        num(&s, "/policy/deadline_misses"),
        0.0,
        "the example policy meets every deadline"
    );
    // the same work is done either way
    let (b, p) = (num(&s, "/baseline/gpu_hours"), num(&s, "/policy/gpu_hours"));
    assert!((b - p).abs() < 1e-6 * b, "{b} vs {p}");
    // the policy moved deferrable jobs into cheaper hours
    assert!(num(&s, "/policy/jobs_deferred") > 0.0);
    assert!(num(&s, "/policy/cost") < num(&s, "/baseline/cost"), "{}", s);
    let savings = num(&s, "/savings_pct/cost");
    let expect =
        100.0 * (num(&s, "/baseline/cost") - num(&s, "/policy/cost")) / num(&s, "/baseline/cost");
    assert!((savings - expect).abs() < 1e-9);
    let html = std::fs::read_to_string(dir.path().join("report.html")).expect("report.html");
    assert!(html.contains("<svg") && html.contains("Baseline against policy"));
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(stdout.contains("savings: cost"), "{stdout}");
}

#[test]
fn the_same_inputs_and_seed_give_the_same_summary() {
    let a = tempfile::tempdir().expect("tempdir");
    let b = tempfile::tempdir().expect("tempdir");
    for d in [&a, &b] {
        let o = backtest(d.path(), &fixture("jobs.csv"), "scenario.toml");
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    let read = |d: &tempfile::TempDir| {
        std::fs::read_to_string(d.path().join("summary.json")).expect("summary")
    };
    assert_eq!(read(&a), read(&b));
}

#[test]
fn a_lowered_contract_is_kept_by_the_policy_and_broken_by_the_baseline() {
    let dir = tempfile::tempdir().expect("tempdir");
    let o = backtest(dir.path(), &fixture("jobs.csv"), "scenario-contract.toml");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let s = summary(dir.path());
    assert_eq!(num(&s, "/budget_kw"), 16.0);
    assert!(
        num(&s, "/baseline/budget_violation_s") > 0.0,
        "the baseline goes over 16 kW: {s}"
    );
    assert_eq!(num(&s, "/policy/budget_violation_s"), 0.0, "{s}");
    assert!(num(&s, "/policy/peak_kw") <= 16.0);
    assert_eq!(num(&s, "/policy/deadline_misses"), 0.0);
    let scen = s["scenario"].as_array().expect("scenario lines");
    assert!(scen
        .iter()
        .any(|l| l.as_str().is_some_and(|l| l.contains("16 kW"))));
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).expect("write");
    p
}

#[test]
fn bad_traces_are_refused_with_their_file_and_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    let missing = write(
        dir.path(),
        "missing.csv",
        "submit,gpus\n2024-06-03 10:00:00,1\n",
    );
    let o = backtest(&dir.path().join("out"), &missing, "scenario.toml");
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("missing.csv:1: missing column \"duration_s\""),
        "{err}"
    );
    let bad = write(
        dir.path(),
        "bad.csv",
        "submit,duration_s,gpus\n2024-06-03 10:00:00,600,1\n2024-06-03 10:05:00,600,two\n",
    );
    let o = backtest(&dir.path().join("out"), &bad, "scenario.toml");
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("bad.csv:3: gpus \"two\" is not a GPU count"),
        "{err}"
    );
    let when = write(
        dir.path(),
        "when.csv",
        "submit,duration_s,gpus\nyesterday,600,1\n",
    );
    let o = backtest(&dir.path().join("out"), &when, "scenario.toml");
    assert_eq!(o.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&o.stderr)
            .contains("when.csv:2: submit \"yesterday\" is not a time"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(!dir.path().join("out/summary.json").exists());
}

#[test]
fn three_runs_power_saving_turns_idle_nodes_off_and_the_policy_beats_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let policy = std::fs::read_to_string(fixture("policy.toml")).expect("policy");
    let policy = write(
        dir.path(),
        "policy.toml",
        &format!(
            "{policy}\n[node_power]\nenabled = true\nreserve_gpus = 8\nidle_s = 600\nboot_s = 300\n"
        ),
    );
    let out = dir.path().join("out");
    let o = backtest_with(
        &out,
        &fixture("jobs.csv"),
        "scenario.toml",
        &policy,
        &fixture("prices.csv"),
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let s = summary(&out);
    assert_eq!(num(&s, "/suspend_time_s"), 1800.0);
    // no management never powers a node down; power saving and the policy do
    assert_eq!(num(&s, "/baseline/power_downs"), 0.0);
    assert!(num(&s, "/power_save/power_downs") > 0.0, "{s}");
    assert!(num(&s, "/power_save/node_off_h") > 0.0);
    assert!(num(&s, "/policy/node_off_h") > 0.0);
    assert!(num(&s, "/power_save/energy_kwh") < num(&s, "/baseline/energy_kwh"));
    // the same work in all three, no misses, and the policy costs less than both
    let gh = num(&s, "/baseline/gpu_hours");
    for run in ["power_save", "policy"] {
        assert!((num(&s, &format!("/{run}/gpu_hours")) - gh).abs() < 1e-6 * gh);
        assert_eq!(num(&s, &format!("/{run}/deadline_misses")), 0.0);
    }
    assert!(num(&s, "/savings_vs_power_save_pct/cost") > 0.0, "{s}");
    let expect = 100.0 * (num(&s, "/power_save/cost") - num(&s, "/policy/cost"))
        / num(&s, "/power_save/cost");
    assert!((num(&s, "/savings_vs_power_save_pct/cost") - expect).abs() < 1e-9);
    assert!(num(&s, "/deferred_wait_mean_s") > 0.0);
    assert!(num(&s, "/saving_per_wait_hour") > 0.0);
    // where the saving against power saving comes from: five parts that add up to it
    let d = &s["against_power_save"];
    let saving = num(d, "/saving");
    let cost_gap = num(&s, "/power_save/cost") - num(&s, "/policy/cost");
    assert!(
        (saving - cost_gap).abs() < 1e-6 * cost_gap.abs().max(1.0),
        "{d}"
    );
    let parts: f64 = [
        "node_power",
        "caps",
        "cooling",
        "price_shifting",
        "demand_charge",
    ]
    .iter()
    .map(|k| num(d, &format!("/{k}")))
    .sum();
    assert!((parts - saving).abs() < 1e-6 * saving.abs().max(1.0), "{d}");
    // the kWh behind the volumes add up to the runs' energy gap
    let kwh: f64 = ["node_power_kwh", "caps_kwh", "cooling_kwh"]
        .iter()
        .map(|k| num(d, &format!("/{k}")))
        .sum();
    let energy_gap = num(&s, "/power_save/energy_kwh") - num(&s, "/policy/energy_kwh");
    assert!(
        (kwh - energy_gap).abs() < 1e-6 * energy_gap.abs().max(1.0),
        "{d}"
    );
    assert_eq!(
        num(d, "/cooling_kwh"),
        num(&s, "/power_save/cooling_kwh") - num(&s, "/policy/cooling_kwh")
    );
    assert_eq!(
        num(d, "/power_downs"),
        num(&s, "/policy/power_downs") - num(&s, "/power_save/power_downs")
    );
    assert_eq!(
        num(d, "/capped_gpu_hours"),
        num(&s, "/policy/capped_gpu_hours")
    );
    assert_eq!(num(d, "/jobs_deferred"), num(&s, "/policy/jobs_deferred"));
    // the policy holds jobs for cheaper hours: they wait longer than under power saving
    assert!(num(d, "/added_wait_h") > 0.0, "{d}");
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("saving against power saving"),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
    // no carbon file: carbon is not measured, not 0
    assert!(s["policy"]["carbon_kg"].is_null(), "{}", s["policy"]);
    assert!(s["savings_pct"]["carbon"].is_null());
    assert!(String::from_utf8_lossy(&o.stdout).contains("not measured"));
}

#[test]
fn time_without_a_price_is_counted_as_a_gap_never_at_the_last_price() {
    let dir = tempfile::tempdir().expect("tempdir");
    let all = std::fs::read_to_string(fixture("prices.csv")).expect("prices");
    // the header and the first two days only: the trace runs three days and more
    let short: String = all.lines().take(1 + 48).map(|l| format!("{l}\n")).collect();
    let prices = write(dir.path(), "short.csv", &short);
    let out = dir.path().join("out");
    let o = backtest_with(
        &out,
        &fixture("jobs.csv"),
        "scenario.toml",
        &fixture("policy.toml"),
        &prices,
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let s = summary(&out);
    let span_s = num(&s, "/span_h") * 3600.0;
    // the prices cover 2024-06-02 00:00 to 06-04 00:00 (+02:00, 06-03 22:00 UTC);
    // the run starts on 06-02 22:10 UTC: 23 h 50 min of it has prices
    let covered = 23.0 * 3600.0 + 50.0 * 60.0;
    for run in ["baseline", "policy", "power_save"] {
        let gap = num(&s, &format!("/{run}/price_gap_s"));
        assert!(
            (gap - (span_s - covered)).abs() <= 600.0,
            "{run}: gap {gap} s of {span_s} s"
        );
    }
    // the full series costs more: the gap was not priced at the last price held
    let full = dir.path().join("full");
    let o = backtest(&full, &fixture("jobs.csv"), "scenario.toml");
    assert!(o.status.success());
    let f = summary(&full);
    assert!(num(&f, "/baseline/price_gap_s") == 0.0);
    assert!(num(&s, "/baseline/cost") < num(&f, "/baseline/cost"));
    assert!(String::from_utf8_lossy(&o.stdout).contains("savings"));
}

#[test]
fn a_job_larger_than_the_site_is_refused_with_its_line_before_the_replay() {
    let dir = tempfile::tempdir().expect("tempdir");
    let big = write(
        dir.path(),
        "big.csv",
        "submit,duration_s,gpus,id\n2024-06-03 10:00:00,600,1,small\n2024-06-03 10:05:00,600,129,huge\n",
    );
    let o = backtest(&dir.path().join("out"), &big, "scenario.toml");
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("big.csv:3: job huge needs 129 GPUs, the site has 128"),
        "{err}"
    );
    assert!(!dir.path().join("out/summary.json").exists());
}

#[test]
fn capacity_grows_the_site_by_racks_until_the_contract_no_longer_holds() {
    let dir = tempfile::tempdir().expect("tempdir");
    let policy = std::fs::read_to_string(fixture("policy.toml")).expect("policy");
    let policy = write(
        dir.path(),
        "policy.toml",
        &format!("{policy}\n[node_power]\nenabled = true\nreserve_gpus = 8\nidle_s = 600\n"),
    );
    let out = dir.path().join("out");
    let o = backtest_command(
        &out,
        &fixture("jobs.csv"),
        "scenario.toml",
        &policy,
        &fixture("prices.csv"),
    )
    .args([
        "--capacity",
        "--capacity-step",
        "1",
        "--capacity-max-steps",
        "2",
    ])
    .output()
    .expect("powerplane runs");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = std::fs::read_to_string(out.join("capacity.json")).expect("capacity.json");
    let c: Value = serde_json::from_str(&text).expect("JSON");
    // 48 kW (60 kW derated to 80%) over 392 W per GPU at its peak (300 W, 50 W of its
    // node, 12% cooling)
    assert_eq!(num(&c, "/contract_kw"), 48.0);
    assert!((num(&c, "/gpu_peak_w") - 392.0).abs() < 1e-6, "{c}");
    assert!((num(&c, "/nameplate_gpus") - 48000.0 / 392.0).abs() < 1e-6);
    let steps = c["steps"].as_array().expect("steps");
    assert!(!steps.is_empty());
    // whole racks of 64 GPUs, from the site's own two
    for (i, s) in steps.iter().enumerate() {
        assert_eq!(num(s, "/racks"), 2.0 + i as f64);
        assert_eq!(num(s, "/gpus"), 128.0 + 64.0 * i as f64);
        // the load grows with the site: as many jobs per GPU at every size
        assert!(
            (num(s, "/load") - num(s, "/gpus") / 128.0).abs() < 1e-9,
            "{s}"
        );
        let passed = s["passed"].as_bool().expect("passed");
        let ok = num(s, "/budget_violation_s") == 0.0
            && num(s, "/thermal_violation_s") == 0.0
            && num(s, "/gpu_hours_lost") <= 0.01;
        assert_eq!(passed, ok, "{s}");
        // it stops at the first size that does not hold
        if !passed {
            assert_eq!(i, steps.len() - 1);
        }
    }
    let largest = num(&c, "/largest_gpus");
    let best = steps
        .iter()
        .filter(|s| s["passed"].as_bool() == Some(true))
        .map(|s| num(s, "/gpus"))
        .fold(0.0, f64::max);
    assert_eq!(largest, best);
    // the test trace keeps well under 48 kW: the grown sites hold it
    assert!(largest >= 192.0, "{c}");
    let all = steps.iter().all(|s| s["passed"].as_bool() == Some(true));
    assert_eq!(c["at_least"].as_bool(), Some(all));
    assert!(out.join("racks-2/summary.json").exists());
    assert!(out.join("racks-2-unconstrained/summary.json").exists());
    let summary = |d: &str| -> Value {
        serde_json::from_str(
            &std::fs::read_to_string(out.join(d).join("summary.json")).expect("summary"),
        )
        .expect("JSON")
    };
    let (two, three) = (summary("racks-2"), summary("racks-3"));
    assert!(
        two.get("load").is_none(),
        "the site as given: the trace as it is"
    );
    assert_eq!(num(&three, "/load"), 1.5);
    let jobs = |v: &Value| num(v, "/jobs");
    assert!(
        jobs(&three) > 1.3 * jobs(&two) && jobs(&three) < 1.7 * jobs(&two),
        "half as many jobs again on half as many GPUs again: {} and {}",
        jobs(&two),
        jobs(&three)
    );
    assert_eq!(
        summary("racks-3-unconstrained")["jobs"],
        three["jobs"],
        "the unconstrained run replays the same load"
    );
    assert!(String::from_utf8_lossy(&o.stdout).contains("over nameplate"));
}

#[test]
fn under_a_heat_wave_and_a_pump_failure_the_predictive_rule_keeps_the_inlets_under_their_limits() {
    // the three days of the fixture trace with cdu-a at half its capacity and, for six
    // hours, half of that (scenario-hot.toml): the policy concentrates work into the
    // cheap hours, and the reactive thermal rule lets the inlets run over before it caps
    let dir = tempfile::tempdir().expect("tempdir");
    let run = |policy: &str| {
        let out = dir.path().join(policy);
        let o = backtest_with(
            &out,
            &fixture("jobs.csv"),
            "scenario-hot.toml",
            &fixture(policy),
            &fixture("prices.csv"),
        );
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let stdout = String::from_utf8_lossy(&o.stdout).to_string();
        assert!(
            stdout.contains("heat wave: cooling capacity −50%")
                && stdout.contains("cooling fault: cdu-a at 50% of its capacity for 6 h"),
            "{stdout}"
        );
        summary(&out)
    };
    let predictive = run("policy.toml");
    let reactive = run("policy-reactive.toml");
    let over = |s: &Value| num(s, "/policy/thermal_violation_s");
    assert_eq!(over(&predictive), 0.0, "predictive: {predictive}");
    assert!(over(&reactive) > 0.0, "the scenario binds: {reactive}");
    let gpuh = |s: &Value| num(s, "/policy/gpu_hours");
    assert!(
        (gpuh(&predictive) - gpuh(&reactive)).abs() <= 0.01 * gpuh(&reactive),
        "GPU-hours {} against {}",
        gpuh(&predictive),
        gpuh(&reactive)
    );
    assert_eq!(num(&predictive, "/policy/budget_violation_s"), 0.0);
}

/// A 3 h event shedding 25% on the fixture: published to the engine, measured in
/// `summary.json` against the run without it, and drawn in the report; a scenario
/// without one has no `demand_response` at all.
#[test]
fn a_grid_event_is_measured_at_the_meter_against_the_run_without_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let base = std::fs::read_to_string(fixture("scenario.toml")).expect("scenario");
    let event = "\n[[grid_events]]\nid = \"peak\"\nstart = \"2024-06-04T15:00:00+02:00\"\nduration_min = 180\nshed_pct = 25\n";
    let scenario = write(dir.path(), "scenario-dr.toml", &(base + event));
    let out = dir.path().join("out");
    let o = backtest(&out, &fixture("jobs.csv"), scenario.to_str().expect("path"));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let s = summary(&out);
    let dr = s["demand_response"].as_array().expect("demand_response");
    assert_eq!(dr.len(), 1);
    let e = &dr[0];
    assert_eq!(e["id"], "peak");
    assert_eq!(e["start"], "2024-06-04T13:00:00Z");
    assert_eq!(num(e, "/duration_min"), 180.0);
    let (baseline, target) = (num(e, "/baseline_kw"), num(e, "/target_kw"));
    assert!(baseline > 0.0, "{e}");
    assert!((target - 0.75 * baseline).abs() < 1e-9, "{e}");
    let (metered, delivered) = (num(e, "/metered_kw"), num(e, "/delivered_kw"));
    assert!((delivered - (baseline - metered)).abs() < 1e-9, "{e}");
    // the work in the window, with and without the event
    let (gh, gh0) = (num(e, "/gpu_hours"), num(e, "/gpu_hours_without_event"));
    assert!(gh0 > 0.0, "work was done in the window: {e}");
    assert!(
        (num(e, "/gpu_hours_lost_pct") - (gh0 - gh) / gh0 * 100.0).abs() < 1e-9,
        "{e}"
    );
    assert!(num(e, "/rebound_peak_kw") > 0.0, "{e}");
    assert!(num(e, "/rebound_peak_without_event_kw") > 0.0, "{e}");
    match e["time_to_target_s"].as_f64() {
        Some(t) => {
            assert!((0.0..=180.0 * 60.0).contains(&t), "{e}");
            assert!(num(e, "/tracking_error_p95_pct") >= 0.0, "{e}");
        }
        None => assert!(e["tracking_error_p95_pct"].is_null(), "{e}"),
    }
    let lines = s["scenario"].as_array().expect("scenario lines");
    assert!(lines.iter().any(|l| l
        .as_str()
        .is_some_and(|l| l.contains("grid event peak: shed 25%"))));
    let html = std::fs::read_to_string(out.join("report.html")).expect("report");
    assert!(html.contains("Grid event peak"), "the event's chart");
    // the policy's other figures and the baseline run are those of a run without grid
    // events up to the event; without one, no demand_response key at all
    let plain = dir.path().join("plain");
    let o = backtest(&plain, &fixture("jobs.csv"), "scenario.toml");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let p = summary(&plain);
    assert!(p.get("demand_response").is_none(), "{p}");
    assert_eq!(
        p["baseline"], s["baseline"],
        "the baseline run ignores grid events"
    );
}

/// With the batch class preemptible, an event deeper than holds and caps can reach
/// (65%) suspends running batch jobs: the meter comes down further, the suspensions are
/// counted, every job still runs to its end and no deadline is missed.
#[test]
fn a_grid_event_suspends_preemptible_jobs_when_holds_and_caps_fall_short() {
    let dir = tempfile::tempdir().expect("tempdir");
    let base = std::fs::read_to_string(fixture("scenario.toml")).expect("scenario");
    let event = "\n[[grid_events]]\nid = \"peak\"\nstart = \"2024-06-04T15:00:00+02:00\"\nduration_min = 180\nshed_pct = 65\n";
    let run = |name: &str, scenario: String| {
        let path = write(dir.path(), &format!("{name}.toml"), &scenario);
        let out = dir.path().join(name);
        let o = backtest(&out, &fixture("jobs.csv"), path.to_str().expect("path"));
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        summary(&out)
    };
    let preemptible = base.replace("slack_h = 24\n", "slack_h = 24\npreemptible = true\n");
    assert_ne!(preemptible, base, "the fixture's batch class");
    let plain = run("plain", base.clone() + event);
    let pre = run("pre", preemptible + event);
    let html = std::fs::read_to_string(dir.path().join("pre").join("report.html")).expect("report");
    let said = format!(
        "jobs suspended {}",
        pre["demand_response"][0]["jobs_suspended"]
    );
    assert!(html.contains(&said), "the report says {said}");
    let (e0, e) = (&plain["demand_response"][0], &pre["demand_response"][0]);
    assert_eq!(num(e0, "/jobs_suspended"), 0.0, "none preemptible: {e0}");
    assert_eq!(num(e0, "/suspended_gpu_hours"), 0.0, "{e0}");
    assert!(num(e, "/jobs_suspended") > 0.0, "{e}");
    assert!(num(e, "/suspended_gpu_hours") > 0.0, "{e}");
    assert!(
        num(e, "/metered_kw") < num(e0, "/metered_kw"),
        "suspensions shed more: {} against {}",
        num(e, "/metered_kw"),
        num(e0, "/metered_kw")
    );
    assert_eq!(num(e, "/deadline_misses"), 0.0, "{e}");
    assert!(
        num(e, "/rebound_peak_kw") <= num(e, "/baseline_kw") + 1e-9,
        "resumed under the rebound limit: {e}"
    );
    let gpuh = |s: &Value| num(s, "/policy/gpu_hours");
    assert!(
        (gpuh(&pre) - gpuh(&plain)).abs() <= 1e-6 * gpuh(&plain),
        "every job runs to its end: {} against {}",
        gpuh(&pre),
        gpuh(&plain)
    );
}

#[test]
fn a_bad_grid_event_is_refused_naming_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let scenario = write(
        dir.path(),
        "bad.toml",
        "[[grid_events]]\nid = \"x\"\nstart = \"2024-06-04T15:00:00+02:00\"\nduration_min = 60\nshed_pct = 25\ntarget_kw = 10\n",
    );
    let o = backtest(
        &dir.path().join("out"),
        &fixture("jobs.csv"),
        scenario.to_str().expect("path"),
    );
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains(
            "bad.toml: grid event 1 (x): give exactly one of shed_pct or target_kw, got both"
        ),
        "{err}"
    );
}

#[test]
fn load_replays_a_share_of_the_trace_or_more_of_it_and_refuses_a_factor_out_of_range() {
    let run = |load: &str| {
        let dir = tempfile::tempdir().expect("tempdir");
        let o = backtest_command(
            dir.path(),
            &fixture("jobs.csv"),
            "scenario.toml",
            &fixture("policy.toml"),
            &fixture("prices.csv"),
        )
        .arg(format!("--load={load}"))
        .output()
        .expect("powerplane runs");
        (o, dir)
    };
    let (o, dir) = run("0.5");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("(its load x0.5)"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let half = summary(dir.path());
    assert_eq!(num(&half, "/load"), 0.5);
    let jobs = num(&half, "/jobs");
    assert!((120.0..=180.0).contains(&jobs), "half of 300 jobs: {jobs}");
    let (o, dir) = run("2");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let double = summary(dir.path());
    assert_eq!(num(&double, "/jobs"), 600.0, "every job twice");
    // twice the work is done, by both runs alike
    let (b, p) = (
        num(&double, "/baseline/gpu_hours"),
        num(&double, "/policy/gpu_hours"),
    );
    assert!((b - p).abs() < 1e-6 * b, "{b} vs {p}");
    for bad in ["0", "-1", "nan", "x"] {
        let (o, _dir) = run(bad);
        assert!(!o.status.success(), "--load {bad} accepted");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.contains("--load") && err.contains("a factor above 0"),
            "{err}"
        );
    }
}

#[test]
fn a_missed_deadline_is_listed_with_the_jobs_times() {
    // two jobs that each need the whole 128-GPU site, submitted together: the second
    // can only start when the first ends, two hours after its own deadline allows
    let dir = tempfile::tempdir().expect("tempdir");
    let jobs = write(
        dir.path(),
        "jobs.csv",
        "id,submit,duration_s,gpus,class,deadline\n\
         first,2024-06-03 10:00:00,7200,128,training,\n\
         second,2024-06-03 10:00:00,3600,128,training,2024-06-03 11:30:00\n",
    );
    let out = dir.path().join("out");
    let o = backtest(&out, &jobs, "scenario.toml");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let s = summary(&out);
    for run in ["baseline", "power_save", "policy"] {
        assert_eq!(num(&s, &format!("/{run}/deadline_misses")), 1.0, "{run}");
        let missed = s[run]["missed"].as_array().expect("missed listed");
        assert_eq!(missed.len(), 1, "{run}: {missed:?}");
        let m = &missed[0];
        assert_eq!(m["id"], "second", "{run}: {m}");
        assert_eq!(m["gpus"], 128);
        assert!(
            m["deadline"]
                .as_str()
                .is_some_and(|d| d.starts_with("2024-06-03T09:30")),
            "{m}"
        );
        // it started once the first job was done, after its deadline allowed
        let start = m["start"].as_str().expect("started");
        let end = m["end"].as_str().expect("ended");
        assert!(start > "2024-06-03T09:30" && end > start, "{m}");
    }
    // a run without a miss lists none
    let dir2 = tempfile::tempdir().expect("tempdir");
    let o = backtest(dir2.path(), &fixture("jobs.csv"), "scenario.toml");
    assert!(o.status.success());
    assert!(summary(dir2.path())["policy"].get("missed").is_none());
}
