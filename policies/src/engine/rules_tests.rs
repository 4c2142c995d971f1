//! Golden cases for the `[[rules]]` of the policy language: each action, durations and
//! hysteresis, minimum hold, ramps, stale signals, observe mode, conflicts, forecasts and
//! calendars, and the hierarchical budget and cooling-unit controllers.

use super::tests::{job, site, snapshot, t0};
use super::*;
use crate::forecast::StepSeries;
use crate::Forecast;
use proptest::prelude::*;
use telemetry::metric::names::*;
use telemetry::{EntityKind, JobState, Sample};

/// A policy of only the given rules (the built-in controllers off).
fn policy(rules: &str) -> Policy {
    let src = format!(
        "version = 1\n[budget]\nenabled = false\n[thermal]\nenabled = false\n[price]\nenabled = false\n{rules}"
    );
    Policy::parse("p.toml", &src).unwrap_or_else(|e| panic!("{e}"))
}

struct Sim {
    site: Site,
    policy: Policy,
    state: State,
    forecast: Forecast,
}

impl Sim {
    fn new(policy: Policy) -> Sim {
        Sim {
            site: site(),
            policy,
            state: State::default(),
            forecast: Forecast::default(),
        }
    }
    fn tick(&mut self, snap: &Snapshot, jobs: &[Job], at: f64) -> Vec<Decision> {
        let plan = evaluate(
            &Inputs {
                site: &self.site,
                snapshot: snap,
                jobs,
                prior: &self.state,
                policy: &self.policy,
                forecast: &self.forecast,
                job_table: None,
            },
            t0() + at,
        );
        self.state = plan.state;
        plan.decisions
    }
    fn cap(&self, gpu: &str) -> Option<f64> {
        let (node, i) = gpu.split_once(':').expect("node:index");
        self.state
            .caps
            .get(&EntityId::gpu(node, i.parse().expect("index")))
            .map(|c| c.watts)
    }
}

/// Inlets per rack, GPUs at 250 W.
fn inlets(site: &Site, r1: Option<f64>, r2: f64, now: Timestamp) -> Snapshot {
    let mut s = snapshot(site, &|_| 250.0, r2, now);
    match r1 {
        Some(t) => {
            s.ingest(
                Sample::new(EntityId::rack("r1"), INLET_TEMP_C, t, now, "t"),
                now,
            )
            .expect("ok");
        }
        None => {
            // r1's inlet reading goes stale: rebuild it without
            let mut fresh = Snapshot::new();
            for smp in s.samples() {
                if !(smp.entity == EntityId::rack("r1") && smp.metric.as_str() == INLET_TEMP_C) {
                    fresh.ingest(smp, now).expect("ok");
                }
            }
            s = fresh;
        }
    }
    s
}

fn node_of(site: &Site, rack: &str) -> String {
    site.nodes
        .iter()
        .find(|n| n.rack == rack)
        .map(|n| n.id.clone())
        .expect("a node")
}

const HOT_RACK: &str = r#"
[[rules]]
name = "hot-r1"
scope = "rack"
select = { name = "r1" }
when = "inlet_temp_c > 30 for 60s"
release = "inlet_temp_c < 28 for 120s"
action = { cap_pct = 80 }
"#;

#[test]
fn a_condition_must_hold_for_its_duration_and_releases_with_hysteresis() {
    let mut sim = Sim::new(policy(HOT_RACK));
    let n1 = format!("{}:0", node_of(&sim.site, "r1"));
    let n2 = format!("{}:0", node_of(&sim.site, "r2"));
    let s = |t: f64, at: f64| inlets(&site(), Some(t), 25.0, t0() + at);
    assert!(sim.tick(&s(31.0, 0.0), &[], 0.0).is_empty());
    assert!(
        sim.tick(&s(31.0, 30.0), &[], 30.0).is_empty(),
        "30 s is not 60 s"
    );
    let d = sim.tick(&s(31.0, 60.0), &[], 60.0);
    assert_eq!(sim.cap(&n1), Some(240.0), "80% of the A40's 300 W");
    assert_eq!(sim.cap(&n2), None, "the selector picks r1 only");
    assert_eq!(d.len(), 1);
    assert_eq!(d[0].rule, "rules.hot-r1");
    assert_eq!(d[0].values.get("inlet_temp_c"), Some(&31.0));
    assert!(
        d[0].release.contains("inlet_temp_c < 28 for 120s"),
        "{}",
        d[0].release
    );
    // between the thresholds: kept
    sim.tick(&s(29.0, 90.0), &[], 90.0);
    assert_eq!(sim.cap(&n1), Some(240.0));
    // below the release threshold, but not for long enough
    sim.tick(&s(27.0, 120.0), &[], 120.0);
    sim.tick(&s(27.0, 200.0), &[], 200.0);
    assert_eq!(sim.cap(&n1), Some(240.0));
    // a blip above the release threshold restarts the release timer
    sim.tick(&s(28.5, 210.0), &[], 210.0);
    sim.tick(&s(27.0, 240.0), &[], 240.0);
    sim.tick(&s(27.0, 330.0), &[], 330.0);
    assert_eq!(sim.cap(&n1), Some(240.0), "release needs 120 s in a row");
    let d = sim.tick(&s(27.0, 360.0), &[], 360.0);
    // released: the cap rises no faster than the budget's raise rate (60 W/min)
    assert!(sim.cap(&n1).is_some_and(|w| w > 240.0 && w <= 300.0) || sim.cap(&n1).is_none());
    assert!(!d.is_empty(), "the release is a decision");
    for at in [420.0, 480.0, 540.0] {
        sim.tick(&s(27.0, at), &[], at);
    }
    assert_eq!(sim.cap(&n1), None, "uncapped in the end");
}

/// The rule memory holds only what a later decision reads: timers for the timed
/// comparisons, the state of the targets where the rule is on. An untimed comparison
/// needs no timer, and a target where nothing is timed and the rule is off has no entry
/// (a timer left by an older build is dropped); the decisions are the same.
#[test]
fn rule_memory_keeps_only_timed_comparisons_and_active_targets() {
    let rules = r#"
[[rules]]
name = "hot"
scope = "rack"
select = { name = "r1" }
when = "inlet_temp_c > 30 for 60s and inlet_temp_c < 40"
release = "inlet_temp_c < 28"
action = { cap_pct = 80 }
"#;
    let mut sim = Sim::new(policy(rules));
    let s = |t: f64, at: f64| inlets(&site(), Some(t), 25.0, t0() + at);
    let memory = |sim: &Sim| {
        sim.state
            .rules
            .get("hot")
            .and_then(|m| m.get("r1"))
            .cloned()
    };
    // cool: the release and `when`'s second comparison are true but untimed, the
    // timed one false: nothing to remember
    sim.tick(&s(25.0, 0.0), &[], 0.0);
    assert_eq!(memory(&sim), None);
    // warm: only the timed comparison (index 0) has a timer
    sim.tick(&s(31.0, 10.0), &[], 10.0);
    let m = memory(&sim).expect("a timer runs");
    assert!(!m.active);
    assert_eq!(
        m.when_true.iter().collect::<Vec<_>>(),
        vec![(0, t0() + 10.0)]
    );
    assert!(m.release_true.is_empty());
    // on after 60 s of the timed one
    sim.tick(&s(31.0, 70.0), &[], 70.0);
    let m = memory(&sim).expect("on");
    assert!(m.active);
    assert_eq!(m.since, t0() + 70.0);
    // released at once (the release is untimed), then nothing is left
    let d = sim.tick(&s(25.0, 80.0), &[], 80.0);
    assert!(!d.is_empty(), "the release is a decision");
    assert_eq!(memory(&sim), None);
    // a timer an older build kept for an untimed comparison is dropped
    let mut old = policies_memory_with_untimed_timer(t0());
    sim.state
        .rules
        .insert("hot".into(), std::mem::take(&mut old));
    sim.tick(&s(25.0, 90.0), &[], 90.0);
    assert_eq!(memory(&sim), None);
}

/// A memory for rack r1 as an older build kept it: off, with a timer on the untimed
/// release comparison.
fn policies_memory_with_untimed_timer(at: Timestamp) -> crate::plan::RuleMemories {
    let mut m = crate::plan::RuleMemories::new();
    m.insert(
        "r1",
        crate::plan::RuleMemory {
            active: false,
            since: at,
            when_true: crate::plan::Timers::new(),
            release_true: [(0usize, at)].into_iter().collect(),
            level: None,
            level_at: at,
            done: false,
        },
    );
    m
}

#[test]
fn min_hold_keeps_a_rule_active() {
    let mut sim = Sim::new(policy(
        r#"
[[rules]]
name = "hot"
scope = "rack"
when = "inlet_temp_c > 30"
action = { cap_w = 200 }
min_hold = "5m"
"#,
    ));
    let n1 = format!("{}:0", node_of(&sim.site, "r1"));
    let s = |t: f64, at: f64| inlets(&site(), Some(t), t, t0() + at);
    sim.tick(&s(31.0, 0.0), &[], 0.0);
    assert_eq!(sim.cap(&n1), Some(200.0));
    sim.tick(&s(20.0, 60.0), &[], 60.0);
    sim.tick(&s(20.0, 240.0), &[], 240.0);
    assert_eq!(sim.cap(&n1), Some(200.0), "held 5 minutes");
    sim.tick(&s(20.0, 300.0), &[], 300.0);
    assert!(
        sim.cap(&n1).is_none_or(|w| w > 200.0),
        "released after 5 minutes"
    );
}

#[test]
fn a_ramp_bounds_how_fast_a_rule_cap_moves() {
    let mut sim = Sim::new(policy(
        r#"
[[rules]]
name = "evening"
scope = "site"
when = "inlet_temp_c > 0"
action = { cap_w = 150 }
ramp_per_min = 30
on_stale = "ignore"
"#,
    ));
    // the site entity has no inlet: put one there
    let at = |t: f64| {
        let mut s = snapshot(&site(), &|_| 250.0, 25.0, t0() + t);
        s.ingest(
            Sample::new(EntityId::site("t"), INLET_TEMP_C, 25.0, t0() + t, "t"),
            t0() + t,
        )
        .expect("ok");
        s
    };
    let n1 = format!("{}:0", node_of(&sim.site, "r1"));
    let mut seen = vec![];
    for i in 0..8 {
        let t = 60.0 * f64::from(i);
        sim.tick(&at(t), &[], t);
        seen.push(sim.cap(&n1).unwrap_or(300.0));
    }
    assert_eq!(
        seen,
        vec![300.0, 270.0, 240.0, 210.0, 180.0, 150.0, 150.0, 150.0]
    );
}

#[test]
fn stale_signals_follow_on_stale() {
    for (on_stale, expect) in [
        ("assume_worst", Some(240.0)),
        ("ignore", None),
        ("hold_last", None),
    ] {
        let mut sim = Sim::new(policy(&format!("{HOT_RACK}on_stale = \"{on_stale}\"\n")));
        let n1 = format!("{}:0", node_of(&sim.site, "r1"));
        let d = sim.tick(&inlets(&site(), None, 25.0, t0()), &[], 0.0);
        assert_eq!(sim.cap(&n1), expect, "{on_stale}");
        if expect.is_some() {
            assert!(d[0].reason.contains("stale"), "{:?}", d[0].reason);
        }
    }
    // hold_last keeps an active rule active while its signal is stale
    let mut sim = Sim::new(policy(&format!("{HOT_RACK}on_stale = \"hold_last\"\n")));
    let n1 = format!("{}:0", node_of(&sim.site, "r1"));
    sim.tick(&inlets(&site(), Some(35.0), 25.0, t0()), &[], 0.0);
    sim.tick(&inlets(&site(), Some(35.0), 25.0, t0() + 60.0), &[], 60.0);
    assert_eq!(sim.cap(&n1), Some(240.0));
    for at in [120.0, 300.0, 600.0] {
        sim.tick(&inlets(&site(), None, 25.0, t0() + at), &[], at);
        assert_eq!(sim.cap(&n1), Some(240.0), "hold_last at {at}");
    }
}

#[test]
fn observe_mode_reports_without_acting() {
    let mut sim = Sim::new(policy(&format!("{HOT_RACK}observe = true\n")));
    let n1 = node_of(&sim.site, "r1");
    sim.tick(&inlets(&site(), Some(35.0), 25.0, t0()), &[], 0.0);
    let d = sim.tick(&inlets(&site(), Some(35.0), 25.0, t0() + 60.0), &[], 60.0);
    assert!(sim.state.caps.is_empty());
    assert_eq!(
        sim.state
            .observed_caps
            .get(&EntityId::gpu(&n1, 0))
            .map(|c| c.watts),
        Some(240.0)
    );
    assert!(d.iter().all(|d| d.observe_only) && !d.is_empty());
}

#[test]
fn the_most_protective_cap_wins() {
    let mut sim = Sim::new(policy(
        r#"
[[rules]]
name = "pct"
scope = "rack"
action = { cap_pct = 90 }
[[rules]]
name = "watts"
scope = "node"
select = { name = "*" }
action = { cap_w = 230 }
[[rules]]
name = "one-gpu"
scope = "gpu"
select = { name = "*:0" }
action = { cap_w = 180 }
"#,
    ));
    let n1 = node_of(&sim.site, "r1");
    sim.tick(&inlets(&site(), Some(25.0), 25.0, t0()), &[], 0.0);
    let c0 = &sim.state.caps[&EntityId::gpu(&n1, 0)];
    let c1 = &sim.state.caps[&EntityId::gpu(&n1, 1)];
    assert_eq!((c0.watts, &*c0.rule), (180.0, "rules.one-gpu"));
    assert_eq!((c1.watts, &*c1.rule), (230.0, "rules.watts"));
}

#[test]
fn caps_never_go_below_the_gpu_minimum() {
    let mut sim = Sim::new(policy(
        "[[rules]]\nname = \"floor\"\nscope = \"site\"\naction = { cap_w = 20 }\n",
    ));
    sim.tick(&inlets(&site(), Some(25.0), 25.0, t0()), &[], 0.0);
    assert!(!sim.state.caps.is_empty());
    assert!(
        sim.state.caps.values().all(|c| c.watts == 100.0),
        "A40 minimum"
    );
}

#[test]
fn lock_clocks_with_a_lease_and_unlock() {
    let mut sim = Sim::new(policy(
        r#"
[[rules]]
name = "slow"
scope = "rack"
select = { name = "r2" }
when = "inlet_temp_c > 30"
action = { lock_clocks_mhz = 1200 }
lease = "2m"
"#,
    ));
    let d = sim.tick(&inlets(&site(), Some(25.0), 35.0, t0()), &[], 0.0);
    assert_eq!(sim.state.clocks.len(), 4);
    let lock = sim.state.clocks.values().next().expect("a lock");
    assert_eq!((lock.mhz, lock.lease_until), (1200.0, t0() + 120.0));
    assert!(matches!(d[0].action, Action::LockClocks { mhz } if mhz == 1200.0));
    let d = sim.tick(&inlets(&site(), Some(25.0), 25.0, t0() + 30.0), &[], 30.0);
    assert!(sim.state.clocks.is_empty());
    assert!(matches!(d[0].action, Action::UnlockClocks));
}

fn batch(id: &str, deadline_in: Option<f64>) -> Job {
    Job {
        class: "batch".into(),
        state: JobState::Pending,
        allocated: vec![],
        deferrable: true,
        deadline: deadline_in.map(|d| t0() + d),
        est_duration_s: 3600.0,
        ..job(id, 0, &[])
    }
}

fn priced(site: &Site, price: f64, at: f64) -> Snapshot {
    let mut s = inlets(site, Some(25.0), 25.0, t0() + at);
    s.ingest(
        Sample::new(site.site_entity(), PRICE_PER_KWH, price, t0() + at, "t"),
        t0() + at,
    )
    .expect("ok");
    s
}

const DEFER: &str = r#"
[[rules]]
name = "defer-batch"
scope = "job"
select = { class = "batch" }
when = "price > 0.30"
action = { hold = true }
lease = "10m"
"#;

#[test]
fn hold_defers_jobs_but_never_past_their_latest_start() {
    let mut sim = Sim::new(policy(DEFER));
    let jobs = [
        batch("far", Some(12.0 * 3600.0)),
        batch("near", Some(3600.0 + 300.0)),
        Job {
            class: "inference".into(),
            ..batch("other", None)
        },
    ];
    let d = sim.tick(&priced(&site(), 0.5, 0.0), &jobs, 0.0);
    assert!(sim.state.holds.contains_key("far"));
    assert!(
        !sim.state.holds.contains_key("near"),
        "its latest start minus the margin has passed"
    );
    assert!(!sim.state.holds.contains_key("other"), "not selected");
    let h = &sim.state.holds["far"];
    assert_eq!(
        (h.rule.as_str(), h.lease_until),
        ("rules.defer-batch", t0() + 600.0)
    );
    assert!(d.iter().any(|d| matches!(d.action, Action::Hold { .. })));
    // the lease never reaches past the latest start minus the margin
    let late = t0() + (12.0 * 3600.0 - 3600.0 - 600.0);
    for at in [3600.0, 20000.0, 30000.0, late.secs_since(t0()) - 60.0] {
        sim.tick(&priced(&site(), 0.5, at), &jobs, at);
        if let Some(h) = sim.state.holds.get("far") {
            assert!(h.lease_until <= late, "{} > {late}", h.lease_until);
        }
    }
    let d = sim.tick(
        &priced(&site(), 0.5, late.secs_since(t0())),
        &jobs,
        late.secs_since(t0()),
    );
    assert!(
        !sim.state.holds.contains_key("far"),
        "released at its latest start"
    );
    assert!(d.iter().any(|d| matches!(d.action, Action::Release)));
}

#[test]
fn cheap_again_releases_and_a_release_rule_wins_over_holds() {
    let mut sim = Sim::new(policy(&format!(
        "{DEFER}\n[[rules]]\nname = \"vip\"\nscope = \"job\"\nselect = {{ project = \"vip-*\" }}\naction = {{ release = true }}\n"
    )));
    let jobs = [
        batch("a", Some(86400.0)),
        Job {
            project: "vip-1".into(),
            ..batch("b", Some(86400.0))
        },
    ];
    sim.tick(&priced(&site(), 0.5, 0.0), &jobs, 0.0);
    assert!(sim.state.holds.contains_key("a"));
    assert!(!sim.state.holds.contains_key("b"), "release wins");
    let d = sim.tick(&priced(&site(), 0.1, 60.0), &jobs, 60.0);
    assert!(sim.state.holds.is_empty());
    assert!(d
        .iter()
        .any(|d| d.rule == "rules.defer-batch" && matches!(d.action, Action::Release)));
}

#[test]
fn requeue_once_and_suspend_until_released_only_preemptible_jobs() {
    let mut sim = Sim::new(policy(
        r#"
[[rules]]
name = "shed"
scope = "job"
select = { class = "training" }
when = "price > 1.0"
action = { requeue = true }
[[rules]]
name = "pause"
scope = "job"
select = { class = "batch" }
when = "price > 1.0"
action = { suspend = true }
"#,
    ));
    let site = site();
    let gpus: Vec<EntityId> = site.gpus().into_iter().map(|g| g.id.into_owned()).collect();
    let jobs = [
        Job {
            preemptible: true,
            ..job("train-p", 0, &gpus[0..2])
        },
        job("train-np", 0, &gpus[2..4]),
        Job {
            class: "batch".into(),
            preemptible: true,
            ..job("batch-p", 0, &gpus[4..6])
        },
    ];
    let d = sim.tick(&priced(&site, 2.0, 0.0), &jobs, 0.0);
    let kinds: Vec<(String, String)> = d
        .iter()
        .map(|d| (d.target.to_string(), d.action.to_string()))
        .collect();
    assert!(
        kinds.contains(&("job train-p".into(), "requeue".into())),
        "{kinds:?}"
    );
    assert!(
        !kinds.iter().any(|k| k.0 == "job train-np"),
        "not preemptible"
    );
    assert!(sim.state.suspended.contains_key("batch-p"));
    // the scheduler now reports the batch job suspended: it stays so, no resume
    let jobs = [
        jobs[0].clone(),
        jobs[1].clone(),
        Job {
            state: JobState::Suspended,
            ..jobs[2].clone()
        },
    ];
    let d = sim.tick(&priced(&site, 2.0, 30.0), &jobs, 30.0);
    assert!(
        !d.iter().any(|d| matches!(d.action, Action::Requeue)),
        "a requeue is sent once per activation"
    );
    assert!(
        !d.iter().any(|d| matches!(d.action, Action::Resume)),
        "{d:?}"
    );
    assert!(sim.state.suspended.contains_key("batch-p"));
    let d = sim.tick(&priced(&site, 0.2, 60.0), &jobs, 60.0);
    assert!(sim.state.suspended.is_empty());
    assert!(d.iter().any(|d| matches!(d.action, Action::Resume)));
}

fn hourly(prices: &[f64]) -> StepSeries {
    StepSeries::new(
        prices
            .iter()
            .enumerate()
            .map(|(i, p)| (t0() + 3600.0 * i as f64, *p))
            .collect(),
        3600.0,
    )
}

#[test]
fn forecast_signals_hold_until_the_cheapest_hours() {
    // a 1-hour job with 6 hours to go: the cheapest hour is the fifth
    let mut sim = Sim::new(policy(
        r#"
[[rules]]
name = "cheapest"
scope = "job"
select = { deferrable = true }
when = "price > price.cheapest_before_deadline"
action = { hold = true }
"#,
    ));
    sim.forecast.price = hourly(&[0.30, 0.25, 0.28, 0.22, 0.10, 0.26, 0.40]);
    let jobs = [Job {
        deadline: Some(t0() + 6.0 * 3600.0),
        ..batch("j", None)
    }];
    for h in 0..4 {
        let at = 3600.0 * f64::from(h) + 10.0;
        let price = sim.forecast.price.at(t0() + at).expect("covered");
        sim.tick(&priced(&site(), price, at), &jobs, at);
        assert!(sim.state.holds.contains_key("j"), "hour {h}");
    }
    let at = 4.0 * 3600.0 + 10.0;
    let d = sim.tick(&priced(&site(), 0.10, at), &jobs, at);
    assert!(sim.state.holds.is_empty(), "released in the cheapest hour");
    let release = d
        .iter()
        .find(|d| matches!(d.action, Action::Release))
        .expect("release");
    assert_eq!(release.rule, "rules.cheapest");
}

#[test]
fn percentiles_and_calendar_signals() {
    let mut sim = Sim::new(policy(
        r#"
[[rules]]
name = "peak"
scope = "site"
when = "price > price.p50(6h) and hour >= 8 and hour < 20 and weekend == 0"
action = { cap_pct = 90 }
"#,
    ));
    sim.forecast.price = hourly(&[0.3, 0.1, 0.1, 0.1, 0.3, 0.3, 0.3]);
    // t0 is Tuesday 2023-11-14 22:13 UTC: after 20 h
    sim.tick(&priced(&site(), 0.3, 0.0), &[], 0.0);
    assert!(sim.state.caps.is_empty(), "outside 8..20");
    // 10 hours later, 08:13 on Wednesday
    sim.forecast.price = StepSeries::new(
        [0.3, 0.3, 0.3, 0.3, 0.1, 0.1, 0.3]
            .iter()
            .enumerate()
            .map(|(i, p)| (t0() + 36000.0 + 3600.0 * i as f64, *p))
            .collect(),
        3600.0,
    );
    let d = sim.tick(&priced(&site(), 0.3, 36000.0), &[], 36000.0);
    // 0.3 for 4 of the 6 hours ahead: the median is 0.3, and 0.3 > 0.3 fails
    assert!(d.is_empty(), "{d:?}");
    sim.forecast.price = StepSeries::new(
        [0.3, 0.1, 0.1, 0.1, 0.1, 0.3, 0.3]
            .iter()
            .enumerate()
            .map(|(i, p)| (t0() + 36000.0 + 3600.0 * i as f64, *p))
            .collect(),
        3600.0,
    );
    let d = sim.tick(&priced(&site(), 0.3, 36060.0), &[], 36060.0);
    assert!(
        !sim.state.caps.is_empty(),
        "price above the median, a weekday morning"
    );
    assert_eq!(d[0].values.get("price.p50(6h)"), Some(&0.1));
    assert!(d[0].values.contains_key("hour"));
}

#[test]
fn a_row_budget_from_the_policy_cuts_both_racks() {
    let mut p = Policy::default();
    p.thermal.enabled = false;
    p.price.enabled = false;
    p.budget.limits = vec![crate::policy::Limit {
        scope: "row".into(),
        name: "w".into(),
        limit_kw: 2.0,
        derate: 1.0,
    }];
    let mut sim = Sim::new(p);
    // 8 GPUs at 300 W + 400 W base = 2.8 kW against a 2.0 kW row budget (racks 2 kW each)
    let s = snapshot(&sim.site, &|_| 300.0, 25.0, t0());
    let d = sim.tick(&s, &[], 0.0);
    let caps: Vec<f64> = sim.state.caps.values().map(|c| c.watts).collect();
    assert_eq!(caps.len(), 8);
    let total: f64 = caps.iter().sum::<f64>() + 400.0;
    assert!(total <= 2000.0 * (1.0 - 0.03) + 1e-6, "{total}");
    assert!(sim.state.caps.values().all(|c| &*c.rule == "budget.row"));
    assert!(
        d.iter().all(|d| d.reason.contains("row/w")),
        "{:?}",
        d[0].reason
    );
    assert!(d[0].release.contains("demand under"), "{}", d[0].release);
}

#[test]
fn the_cut_order_cuts_the_listed_class_first() {
    let mut p = Policy::default();
    p.thermal.enabled = false;
    p.price.enabled = false;
    p.budget.cut_order = vec!["batch".into()];
    let mut sim = Sim::new(p);
    let site = site();
    let gpus: Vec<EntityId> = site.gpus().into_iter().map(|g| g.id.into_owned()).collect();
    // the batch job has the higher priority, but its class is cut first
    let jobs = [
        Job {
            class: "batch".into(),
            ..job("b", 9, &gpus[0..4])
        },
        job("t", 1, &gpus[4..8]),
    ];
    // facility 3 kW: 8 × 300 + 400 = 2.8 kW plus a margin… lower the feed with a limit
    sim.policy.budget.limits = vec![crate::policy::Limit {
        scope: "site".into(),
        name: String::new(),
        limit_kw: 2.5,
        derate: 1.0,
    }];
    let s = snapshot(&site, &|_| 300.0, 25.0, t0());
    sim.tick(&s, &jobs, 0.0);
    let cap = |g: &EntityId| sim.state.caps.get(g).map_or(300.0, |c| c.watts);
    assert!(gpus[0..4].iter().all(|g| cap(g) < 300.0), "batch cut");
    assert!(
        gpus[4..8].iter().all(|g| cap(g) == 300.0),
        "training untouched"
    );
}

#[test]
fn a_cooling_unit_short_of_capacity_caps_the_racks_it_serves() {
    let mut p = Policy::default();
    p.budget.enabled = false;
    p.price.enabled = false;
    p.thermal.supply_limit_c = Some(24.0);
    let mut sim = Sim::new(p);
    let unit = EntityId::new(EntityKind::Cooling, "c");
    let at = |load: f64, supply: f64, t: f64| {
        let mut s = snapshot(&site(), &|_| 250.0, 25.0, t0() + t);
        s.ingest(
            Sample::new(unit.clone(), HEAT_LOAD_KW, load, t0() + t, "t"),
            t0() + t,
        )
        .expect("ok");
        s.ingest(
            Sample::new(unit.clone(), SUPPLY_TEMP_C, supply, t0() + t, "t"),
            t0() + t,
        )
        .expect("ok");
        s
    };
    sim.tick(&at(8.0, 18.0, 0.0), &[], 0.0);
    assert!(sim.state.caps.is_empty(), "8 of 10 kW, supply fine");
    let d = sim.tick(&at(11.0, 18.0, 60.0), &[], 60.0);
    assert_eq!(sim.state.thermal.len(), 2, "both racks of the unit");
    assert!(d[0].reason.contains("heat_load_kw"), "{}", d[0].reason);
    let mut sim2 = Sim::new(sim.policy.clone());
    sim2.tick(&at(5.0, 26.0, 0.0), &[], 0.0);
    assert_eq!(sim2.state.thermal.len(), 2, "supply above its limit");
}

fn arb_policy() -> impl Strategy<Value = String> {
    (
        prop_oneof![Just("site"), Just("rack"), Just("node"), Just("gpu")],
        prop_oneof![
            (1.0f64..400.0).prop_map(|w| format!("cap_w = {w:.1}")),
            (1.0f64..100.0).prop_map(|p| format!("cap_pct = {p:.1}")),
        ],
        20.0f64..40.0,
        proptest::option::of(1.0f64..100.0),
    )
        .prop_map(|(scope, action, t, ramp)| {
            let signal = if scope == "gpu" { "gpu_temp_c" } else { "max(gpu_temp_c)" };
            format!(
                "[[rules]]\nname = \"r\"\nscope = \"{scope}\"\nwhen = \"{signal} > {t:.1}\"\naction = {{ {action} }}\n{}",
                ramp.map(|r| format!("ramp_per_min = {r:.1}\n")).unwrap_or_default()
            )
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Whatever the rules say, a cap in force is within the GPU's own constraints, and
    /// the same inputs give the same plan.
    #[test]
    fn caps_stay_in_gpu_constraints_and_plans_are_deterministic(
        rules in proptest::collection::vec(arb_policy(), 1..4),
        temps in proptest::collection::vec(10.0f64..60.0, 6),
    ) {
        let src: String = rules
            .iter()
            .enumerate()
            .map(|(i, r)| r.replacen("name = \"r\"", &format!("name = \"r{i}\""), 1))
            .collect();
        // Two random rules can cap the same GPUs under the same condition: such a policy
        // is refused when it loads (a contradiction), so it never runs.
        let full = format!(
            "version = 1\n[budget]\nenabled = false\n[thermal]\nenabled = false\n[price]\nenabled = false\n{src}"
        );
        let parsed = Policy::parse("p.toml", &full);
        if let Err(e) = &parsed {
            prop_assume!(!e.to_string().contains("contradicts"), "contradictory rules");
        }
        let p = policy(&src);
        let site = site();
        let mut a = Sim::new(p.clone());
        let mut b = Sim::new(p);
        for (i, t) in temps.iter().enumerate() {
            let at = 60.0 * i as f64;
            let mut s = snapshot(&site, &|_| 250.0, 25.0, t0() + at);
            for g in site.gpus() {
                s.ingest(Sample::new(EntityId::clone(&g.id), GPU_TEMP_C, *t, t0() + at, "t"), t0() + at).expect("ok");
            }
            let da = a.tick(&s, &[], at);
            let db = b.tick(&s, &[], at);
            prop_assert_eq!(&da, &db);
            prop_assert_eq!(&a.state, &b.state);
            for g in site.gpus() {
                if let Some(c) = a.state.caps.get(&g.id) {
                    prop_assert!(c.watts >= g.model.min_w && c.watts <= g.model.max_w, "{}", c.watts);
                    prop_assert!(c.lease_until > t0() + at, "every cap has a lease");
                }
            }
        }
    }

    /// No job held by a rule is held past its latest start minus the margin.
    #[test]
    fn no_held_job_misses_its_latest_start(
        deadlines in proptest::collection::vec(0.0f64..20.0, 1..12),
        prices in proptest::collection::vec(0.0f64..1.0, 1..30),
    ) {
        let mut sim = Sim::new(policy(DEFER));
        let jobs: Vec<Job> = deadlines
            .iter()
            .enumerate()
            .map(|(i, h)| batch(&format!("j{i}"), Some(h * 3600.0)))
            .collect();
        for (i, p) in prices.iter().enumerate() {
            let at = 1800.0 * i as f64;
            sim.tick(&priced(&site(), *p, at), &jobs, at);
            for (id, h) in &sim.state.holds {
                let j = jobs.iter().find(|j| &j.id == id).expect("known");
                let by = j.latest_start().expect("deadline") + -600.0;
                prop_assert!(t0() + at < by, "{id} held at {at} past {by}");
                prop_assert!(h.lease_until <= by);
            }
        }
    }
}

/// Two racks on two PDUs each (a+b feeds), PDUs rated 1.2 kW: a rack alone fits its
/// 2 kW budget but the PDU it shares with the other rack does not.
const TWO_PDUS: &str = r#"
version = 1
[site]
name = "t"
[[feeds]]
id = "fa"
rating_kw = 10
derate = 1.0
[[feeds]]
id = "fb"
rating_kw = 10
derate = 1.0
[[pdus]]
id = "pa"
feed = "fa"
rating_kw = 1.2
derate = 1.0
[[pdus]]
id = "pb"
feed = "fb"
rating_kw = 10
derate = 1.0
[[cooling]]
id = "c"
capacity_kw = 10
racks = ["r1", "r2"]
[[rooms]]
id = "h"
[[rows]]
id = "w"
room = "h"
[[racks]]
id = "r1"
row = "w"
pdus = ["pa", "pb"]
power_budget_kw = 2
nodes = 1
gpus_per_node = 4
gpu_model = "A40"
node_base_w = 200
[[racks]]
id = "r2"
row = "w"
pdus = ["pa", "pb"]
power_budget_kw = 2
nodes = 1
gpus_per_node = 4
gpu_model = "A40"
node_base_w = 200
"#;

#[test]
fn a_pdu_shared_by_two_racks_is_kept_under_its_rating() {
    let mut p = Policy::default();
    p.thermal.enabled = false;
    p.price.enabled = false;
    let mut sim = Sim::new(p);
    sim.site = Site::parse("two.toml", TWO_PDUS).expect("valid");
    // 8 × 300 W + 400 W = 2.8 kW, half of it (1.4 kW) through pa, rated 1.2 kW
    let s = snapshot(&sim.site, &|_| 300.0, 25.0, t0());
    sim.tick(&s, &[], 0.0);
    assert_eq!(sim.state.caps.len(), 8);
    assert!(sim.state.caps.values().all(|c| &*c.rule == "budget.pdu"));
    let through_pa: f64 = sim.state.caps.values().map(|c| c.watts / 2.0).sum::<f64>() + 200.0;
    assert!(through_pa <= 1200.0 * 0.97 + 1e-6, "{through_pa}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// A feasible row budget set by the policy is never exceeded by what the GPUs may
    /// draw under their caps.
    #[test]
    fn a_feasible_row_budget_is_never_exceeded(
        draws in proptest::collection::vec(30.0f64..300.0, 8),
        limit_kw in 1.0f64..3.5,
    ) {
        let mut p = Policy::default();
        p.thermal.enabled = false;
        p.price.enabled = false;
        p.budget.limits = vec![crate::policy::Limit { scope: "row".into(), name: "w".into(), limit_kw, derate: 1.0 }];
        let mut sim = Sim::new(p);
        let site = site();
        let ids: Vec<EntityId> = site.gpus().into_iter().map(|g| g.id.into_owned()).collect();
        let draw = |g: &EntityId| draws[ids.iter().position(|x| x == g).unwrap_or(0)];
        let s = snapshot(&site, &draw, 25.0, t0());
        sim.tick(&s, &[], 0.0);
        let floor: f64 = 400.0 + draws.iter().map(|d| d.min(100.0)).sum::<f64>();
        let target = limit_kw * 1000.0 * 0.97;
        let after: f64 = 400.0
            + ids.iter().map(|g| sim.state.caps.get(g).map_or(draw(g), |c| c.watts.min(draw(g)))).sum::<f64>();
        let before: f64 = 400.0 + draws.iter().sum::<f64>();
        if floor <= target && before > target {
            prop_assert!(after <= target + 1e-6, "{after} > {target}");
        }
        for (g, c) in &sim.state.caps {
            let _ = g;
            prop_assert!(c.watts >= 100.0 && c.watts <= 300.0);
        }
    }
}

/// One rack of two nodes (4 A40 each), each node on one outlet of branch A (2 kW
/// rated, derated 0.8 to 1.6 kW); the rack and the PDU have room to spare.
const BRANCH: &str = r#"
version = 1
[site]
name = "t"
[[feeds]]
id = "f"
rating_kw = 20
[[pdus]]
id = "p1"
feed = "f"
rating_kw = 10
derate = 0.8
branches = [{ id = "A", rating_kw = 2 }]
outlets = [{ id = "A1", branch = "A", rating_kw = 2 }, { id = "A2", branch = "A", rating_kw = 2 }]
[[cooling]]
id = "c"
capacity_kw = 30
racks = ["r"]
[[rooms]]
id = "h"
[[rows]]
id = "w"
room = "h"
[[racks]]
id = "r"
row = "w"
pdus = ["p1"]
power_budget_kw = 8
[[nodes]]
id = "n1"
rack = "r"
gpus = 4
gpu_model = "A40"
base_w = 100
outlets = ["p1.A1"]
[[nodes]]
id = "n2"
rack = "r"
gpus = 4
gpu_model = "A40"
base_w = 100
outlets = ["p1.A2"]
"#;

#[test]
fn a_branch_circuit_is_kept_under_its_derated_rating() {
    let mut p = Policy::default();
    p.thermal.enabled = false;
    p.price.enabled = false;
    let mut sim = Sim::new(p);
    sim.site = Site::parse("branch.toml", BRANCH).unwrap_or_else(|e| panic!("{e}"));
    let mut s = Snapshot::new();
    for g in sim.site.gpus() {
        s.ingest(
            Sample::new(EntityId::clone(&g.id), POWER_W, 300.0, t0(), "t"),
            t0(),
        )
        .expect("ok");
    }
    let d = sim.tick(&s, &[], 0.0);
    // 8 × 300 + 200 = 2.6 kW on a branch with 1.6 kW usable
    assert_eq!(sim.state.caps.len(), 8, "{d:?}");
    assert!(sim.state.caps.values().all(|c| &*c.rule == "budget.branch"));
    let total: f64 = sim.state.caps.values().map(|c| c.watts).sum::<f64>() + 200.0;
    assert!(total <= 1600.0 * 0.97 + 1e-6, "{total}");
}

#[test]
fn a_hold_rule_in_observe_mode_reports_without_holding() {
    let mut sim = Sim::new(policy(&format!("{DEFER}observe = true\n")));
    let jobs = [batch("far", Some(12.0 * 3600.0))];
    let d = sim.tick(&priced(&site(), 0.5, 0.0), &jobs, 0.0);
    assert!(sim.state.holds.is_empty());
    assert!(sim.state.observed_holds.contains_key("far"));
    assert!(d.iter().all(|d| d.observe_only) && d.len() == 1, "{d:?}");
    assert!(
        sim.tick(&priced(&site(), 0.5, 60.0), &jobs, 60.0)
            .is_empty(),
        "said once"
    );
    let d = sim.tick(&priced(&site(), 0.1, 120.0), &jobs, 120.0);
    assert!(sim.state.observed_holds.is_empty());
    assert!(matches!(d[0].action, Action::Release) && d[0].observe_only);
}

/// Caps running training only while no work waits behind it.
const CAP_UNLESS_QUEUED: &str = r#"
[[rules]]
name = "efficient"
scope = "job"
select = { class = "training" }
when = "queue.short_gpus == 0"
release = "queue.short_gpus > 0"
action = { cap_w = 200 }
lease = "15m"
"#;

#[test]
fn queue_signals_count_the_waiting_work_beyond_the_free_gpus() {
    let site = site();
    let gpus: Vec<EntityId> = site.gpus().into_iter().map(|g| g.id.into_owned()).collect();
    let total = gpus.len();
    assert!(total >= 4, "the test site has {total} GPUs");
    let now = t0() + 60.0;
    // one job runs on all but two GPUs; one more, not yet placed, holds a third
    let running = job("run", 0, &gpus[..total - 2]);
    let unplaced = Job {
        allocated: vec![],
        gpus: 1,
        ..job("unplaced", 0, &[])
    };
    let waiting = |id: &str, n: u32, deadline_in: f64| Job {
        gpus: n,
        deadline: Some(now + deadline_in),
        ..batch(id, None)
    };
    let held = Job {
        state: JobState::Held,
        gpus: 64,
        ..batch("held", None)
    };
    let q = |jobs: &[Job]| crate::rules_eval::queue_of(jobs, total, now);
    // one free GPU left: a 1-GPU wait is not short, a 3-GPU one is 2 short
    let fits = [
        running.clone(),
        unplaced.clone(),
        held.clone(),
        waiting("a", 1, 7200.0),
    ];
    assert_eq!(q(&fits), (1.0, 1.0, 0.0, 7200.0 - 3600.0));
    let short = [
        running.clone(),
        unplaced,
        held,
        waiting("a", 1, 7200.0),
        waiting("b", 2, 5400.0),
    ];
    assert_eq!(q(&short), (2.0, 3.0, 2.0, 5400.0 - 3600.0));
    // nothing waits: no slack to speak of
    assert_eq!(q(&[running]), (0.0, 0.0, 0.0, 1e12));
}

#[test]
fn a_cap_that_waits_for_an_empty_queue_lifts_while_work_is_short_of_gpus() {
    let site = site();
    let gpus: Vec<EntityId> = site.gpus().into_iter().map(|g| g.id.into_owned()).collect();
    let total = gpus.len();
    let mut sim = Sim::new(policy(CAP_UNLESS_QUEUED));
    let running = job("train", 0, &gpus[..total - 1]);
    let snap = |at: f64| inlets(&site, Some(25.0), 25.0, t0() + at);
    let first = |sim: &Sim| sim.state.caps.get(&gpus[0]).map(|c| c.watts);
    // one GPU free and a 1-GPU job waiting: it fits, the cap holds
    let fits = [
        running.clone(),
        Job {
            gpus: 1,
            ..batch("w1", None)
        },
    ];
    sim.tick(&snap(0.0), &fits, 0.0);
    assert_eq!(first(&sim), Some(200.0), "nothing waits behind the cap");
    // a 4-GPU job waits for GPUs the running work holds: the cap lifts
    let short = [
        running.clone(),
        Job {
            gpus: 4,
            ..batch("w4", None)
        },
    ];
    sim.tick(&snap(300.0), &short, 300.0);
    assert_eq!(first(&sim), None, "work waits behind the capped job");
    // the queue drains: capped again
    sim.tick(&snap(600.0), std::slice::from_ref(&running), 600.0);
    assert_eq!(first(&sim), Some(200.0));
}

const CAP_WHILE_SLACK: &str = r#"
[[rules]]
name = "batch-slack"
scope = "job"
select = { class = "batch" }
when = "job.slack_s > 7200"
release = "job.slack_s < 3600"
action = { cap_w = 200 }
lease = "15m"
"#;

#[test]
fn slack_is_counted_at_the_pace_of_the_slowest_model_a_job_runs_on() {
    // r2's GPUs run at half the reference's pace; r1's at the reference's
    let src = super::tests::SITE.replace(
        "[[racks]]\nid = \"r2\"",
        "[gpu_models.SLOW]\nmin_w = 100\nmax_w = 300\nspeed = 0.5\n[[racks]]\nid = \"r2\"",
    );
    let mut parts: Vec<&str> = src.rsplitn(2, "gpu_model = \"A40\"").collect();
    parts.reverse();
    let src = parts.join("gpu_model = \"SLOW\"");
    let site = Site::parse("t.toml", &src).unwrap_or_else(|e| panic!("{e}"));
    let speeds: Vec<(&str, f64)> = site
        .gpus()
        .iter()
        .map(|g| (g.rack.id.as_str(), g.model.speed))
        .collect();
    assert!(
        speeds.contains(&("r1", 1.0)) && speeds.contains(&("r2", 0.5)),
        "{speeds:?}"
    );
    let on = |rack: &str| -> Vec<EntityId> {
        site.gpus()
            .into_iter()
            .filter(|g| g.rack.id == rack)
            .map(|g| g.id.into_owned())
            .collect()
    };
    // 4 h of work at the reference pace, due in 7 h: 3 h of slack on r1, none on r2
    let running = |id: &str, gpus: &[EntityId]| Job {
        state: JobState::Running,
        allocated: gpus.to_vec(),
        gpus: gpus.len() as u32,
        est_duration_s: 4.0 * 3600.0,
        ..batch(id, Some(7.0 * 3600.0))
    };
    let jobs = [running("fast", &on("r1")), running("slow", &on("r2"))];
    let mut sim = Sim::new(policy(CAP_WHILE_SLACK));
    sim.site = site.clone();
    sim.tick(&inlets(&site, Some(25.0), 25.0, t0()), &jobs, 0.0);
    let cap = |g: &EntityId| sim.state.caps.get(g).map(|c| c.watts);
    assert_eq!(
        cap(&on("r1")[0]),
        Some(200.0),
        "3 h of slack at the reference pace"
    );
    assert_eq!(
        cap(&on("r2")[0]),
        None,
        "at half the pace the 4 h take 8 h: the deadline has no slack to cap into"
    );
}
