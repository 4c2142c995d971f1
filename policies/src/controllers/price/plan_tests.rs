//! Plan mode through the engine: holds, releases, deadlines, stale forecasts, and what
//! planning saves against the plain threshold on the same jobs and prices.

use proptest::prelude::*;
use telemetry::metric::names::*;
use telemetry::{EntityId, Job, JobState, Sample, Site, Snapshot, Timestamp};

use crate::policy::{OnStale, PriceMode};
use crate::{evaluate, Forecast, Inputs, Policy, State, StepSeries};

/// One rack of two 8-GPU A40 nodes; a feed with room for everything.
const SITE: &str = r#"
version = 1
[site]
name = "t"
[[feeds]]
id = "f"
rating_kw = 100
derate = 1.0
[[cooling]]
id = "c"
capacity_kw = 100
racks = ["r1"]
[[rooms]]
id = "h"
[[rows]]
id = "w"
room = "h"
[[racks]]
id = "r1"
row = "w"
power_budget_kw = 100
nodes = 2
gpus_per_node = 8
gpu_model = "A40"
node_base_w = 400
"#;

fn site() -> Site {
    Site::parse("t.toml", SITE).expect("valid test site")
}

fn t(h: f64) -> Timestamp {
    Timestamp::from_secs(1_700_002_800) + h * 3600.0
}

/// A day of prices: expensive evenings, cheap afternoons.
fn day_prices(days: usize) -> Vec<f64> {
    let shape = [
        0.12, 0.10, 0.09, 0.09, 0.10, 0.13, 0.18, 0.24, 0.26, 0.20, 0.12, 0.06, 0.03, 0.02, 0.04,
        0.08, 0.15, 0.24, 0.32, 0.34, 0.28, 0.22, 0.17, 0.14,
    ];
    (0..24 * days).map(|h| shape[h % 24]).collect()
}

fn forecast(prices: &[f64], stale: bool) -> Forecast {
    Forecast {
        price: StepSeries::new(
            prices
                .iter()
                .enumerate()
                .map(|(i, p)| (t(i as f64), *p))
                .collect(),
            3600.0,
        ),
        carbon: StepSeries::default(),
        stale,
    }
}

fn snapshot(site: &Site, now: Timestamp, price: Option<f64>) -> Snapshot {
    let mut s = Snapshot::new();
    for g in site.gpus() {
        s.ingest(
            Sample::new(EntityId::clone(&g.id), POWER_W, 30.0, now, "t"),
            now,
        )
        .expect("ok");
    }
    s.ingest(
        Sample::new(EntityId::rack("r1"), POWER_W, 1280.0, now, "t"),
        now,
    )
    .expect("ok");
    s.ingest(
        Sample::new(EntityId::rack("r1"), INLET_TEMP_C, 24.0, now, "t"),
        now,
    )
    .expect("ok");
    s.ingest(
        Sample::new(site.site_entity(), POWER_W, 1280.0, now, "t"),
        now,
    )
    .expect("ok");
    if let Some(p) = price {
        s.ingest(
            Sample::new(site.site_entity(), PRICE_PER_KWH, p, now, "t"),
            now,
        )
        .expect("ok");
    }
    s
}

fn waiting(id: &str, gpus: u32, hours: f64, submit: Timestamp, slack_h: f64) -> Job {
    Job {
        id: id.into(),
        scheduler: "t".into(),
        name: id.into(),
        user: "u".into(),
        project: "p".into(),
        class: "batch".into(),
        priority: 1,
        gpus,
        allocated: Vec::new(),
        state: JobState::Pending,
        submit_time: submit,
        start_time: None,
        end_time: None,
        deadline: Some(submit + hours * 3600.0 + slack_h * 3600.0),
        est_duration_s: hours * 3600.0,
        deferrable: true,
        preemptible: false,
        gpu_power_limit: None,
    }
}

fn policy(mode: PriceMode) -> Policy {
    let mut p = Policy::default();
    p.budget.enabled = false;
    p.thermal.enabled = false;
    p.price.mode = mode;
    p.price.defer_above = 0.15;
    p.price.margin_s = 600.0;
    p
}

fn step(
    site: &Site,
    jobs: &[Job],
    prior: &State,
    policy: &Policy,
    fc: &Forecast,
    now: Timestamp,
) -> crate::Plan {
    let snap = snapshot(site, now, fc.price.at(now));
    evaluate(
        &Inputs {
            site,
            snapshot: &snap,
            jobs,
            prior,
            policy,
            forecast: fc,
            job_table: None,
        },
        now,
    )
}

#[test]
fn a_job_is_held_until_its_planned_slot_and_released_when_it_comes() {
    let site = site();
    let fc = forecast(&day_prices(3), false);
    let pol = policy(PriceMode::Plan);
    // submitted at 05:00 (0.13), one hour long, 20 hours of slack: 13:00 costs 0.02
    let now = t(5.0);
    let jobs = vec![waiting("a", 4, 1.0, now, 20.0)];
    let plan = step(&site, &jobs, &State::default(), &pol, &fc, now);
    let hold = &plan.state.holds["a"];
    assert!(hold.reason.contains("planned start"), "{}", hold.reason);
    assert!(
        hold.reason.contains(&t(13.0).to_string()),
        "{}",
        hold.reason
    );
    assert!(hold.lease_until <= crate::price::release_by(&jobs[0], &pol.price));
    // a tick later it is still held; when 13:00 comes it is released
    let mut held = jobs.clone();
    held[0].state = JobState::Held;
    let plan2 = step(&site, &held, &plan.state, &pol, &fc, t(12.75));
    assert!(plan2.state.holds.contains_key("a"));
    let plan3 = step(&site, &held, &plan2.state, &pol, &fc, t(13.0));
    assert!(!plan3.state.holds.contains_key("a"));
    let d = plan3
        .decisions
        .iter()
        .find(|d| d.action == crate::Action::Release)
        .expect("a release");
    assert!(d.reason.contains("planned start reached"), "{}", d.reason);
}

#[test]
fn the_plan_has_the_room_the_contract_limit_leaves_not_the_feeds() {
    let site = site();
    let fc = forecast(&day_prices(3), false);
    let now = t(5.0);
    let jobs = vec![waiting("a", 4, 1.0, now, 20.0)];
    // the feed has room: held for the cheap afternoon
    let pol = policy(PriceMode::Plan);
    let plan = step(&site, &jobs, &State::default(), &pol, &fc, now);
    assert!(plan.state.holds.contains_key("a"));
    // a 2 kW contract leaves 0.9 × 2 kW − 880 W of idle floor, less than the job's
    // 1.4 kW in every slot: it fits nowhere, so it starts now
    let mut pol = policy(PriceMode::Plan);
    pol.budget.limits.push(crate::policy::Limit {
        scope: "site".into(),
        name: String::new(),
        limit_kw: 2.0,
        derate: 1.0,
    });
    let plan = step(&site, &jobs, &State::default(), &pol, &fc, now);
    assert!(plan.state.holds.is_empty(), "{:?}", plan.state.holds);
}

#[test]
fn the_latest_start_always_wins_over_the_plan() {
    let site = site();
    // every hour but the last is expensive: the plan would wait, the deadline says no
    let mut prices = vec![0.40; 47];
    prices.push(0.01);
    let fc = forecast(&prices, false);
    let pol = policy(PriceMode::Plan);
    let job = waiting("a", 2, 2.0, t(0.0), 3.0);
    let by = crate::price::release_by(&job, &pol.price);
    let mut state = State::default();
    let mut jobs = vec![job];
    let mut now = t(0.0);
    while now < by {
        let plan = step(&site, &jobs, &state, &pol, &fc, now);
        state = plan.state;
        if state.holds.contains_key("a") {
            jobs[0].state = JobState::Held;
            assert!(state.holds["a"].lease_until <= by);
        }
        now = now + 300.0;
    }
    let plan = step(&site, &jobs, &state, &pol, &fc, by);
    assert!(!plan.state.holds.contains_key("a"), "released by {by}");
}

#[test]
fn a_stale_forecast_does_what_on_stale_says() {
    let site = site();
    let fc = forecast(&day_prices(2), true);
    let mut held = waiting("a", 1, 1.0, t(5.0), 20.0);
    held.state = JobState::Held;
    let fresh = waiting("b", 1, 1.0, t(5.0), 20.0);
    let jobs = vec![held, fresh];
    let mut prior = State::default();
    prior.holds.insert(
        "a".into(),
        crate::Hold {
            rule: "price.defer".into(),
            since: t(5.0),
            lease_until: t(5.2),
            reason: "planned".into(),
        },
    );
    let mut pol = policy(PriceMode::Plan);
    for (on_stale, a, b) in [
        (OnStale::Ignore, false, false),
        (OnStale::HoldLast, true, false),
        (OnStale::AssumeWorst, true, true),
    ] {
        pol.price.on_stale = on_stale;
        let plan = step(&site, &jobs, &prior, &pol, &fc, t(5.1));
        assert_eq!(
            (
                plan.state.holds.contains_key("a"),
                plan.state.holds.contains_key("b")
            ),
            (a, b),
            "{on_stale:?}"
        );
    }
    // an empty forecast is as good as a stale one
    pol.price.on_stale = OnStale::AssumeWorst;
    let plan = step(&site, &jobs, &prior, &pol, &Forecast::default(), t(5.1));
    assert_eq!(plan.state.holds.len(), 2);
}

/// A small world: jobs arrive, wait for GPUs or for a hold, run for their duration.
/// Returns (energy cost, deadline misses, most GPUs busy at once).
fn simulate(mode: PriceMode, jobs: &[Job]) -> (f64, usize, u32) {
    let site = site();
    let fc = forecast(&day_prices(4), false);
    let pol = policy(mode);
    let total: u32 = 16;
    let mut all = jobs.to_vec();
    let mut state = State::default();
    let (mut cost, mut peak) = (0.0, 0);
    let dt = 300.0;
    let mut now = t(0.0);
    while now < t(90.0) {
        let visible: Vec<Job> = all
            .iter()
            .filter(|j| j.submit_time <= now && !j.state.is_done())
            .cloned()
            .collect();
        let plan = step(&site, &visible, &state, &pol, &fc, now);
        state = plan.state;
        let mut busy: u32 = all
            .iter()
            .filter(|j| j.state == JobState::Running)
            .map(|j| j.gpus)
            .sum();
        for j in all.iter_mut() {
            if j.submit_time > now || j.state.is_done() || j.state == JobState::Running {
                continue;
            }
            if state.holds.contains_key(&j.id) {
                j.state = JobState::Held;
            } else if busy + j.gpus <= total {
                j.state = JobState::Running;
                j.start_time = Some(now);
                busy += j.gpus;
            } else {
                j.state = JobState::Pending;
            }
        }
        peak = peak.max(busy);
        let price = fc.price.at(now).unwrap_or(0.0);
        cost += price * f64::from(busy) * 0.3 * dt / 3600.0;
        now = now + dt;
        for j in all.iter_mut() {
            if j.state == JobState::Running
                && j.start_time
                    .is_some_and(|s| now.secs_since(s) >= j.est_duration_s)
            {
                j.state = JobState::Finished;
                j.end_time = Some(now);
            }
        }
    }
    let misses = all
        .iter()
        .filter(|j| match (j.end_time, j.deadline) {
            (Some(e), Some(d)) => e > d,
            (None, _) => true,
            _ => false,
        })
        .count();
    (cost, misses, peak)
}

fn workload(seed: u64, n: usize) -> Vec<Job> {
    let mut x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let mut next = || {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((x >> 33) as f64) / f64::from(1u32 << 31)
    };
    (0..n)
        .map(|i| {
            let submit = t(next() * 48.0);
            let hours = 0.25 + next() * 3.0;
            let gpus = 1 + (next() * 8.0) as u32;
            waiting(
                &format!("j{i:03}"),
                gpus,
                hours,
                submit,
                8.0 + next() * 16.0,
            )
        })
        .collect()
}

#[test]
fn planning_beats_the_threshold_on_cost_for_the_same_jobs_and_prices() {
    let jobs = workload(7, 60);
    let (threshold, t_miss, t_peak) = simulate(PriceMode::Threshold, &jobs);
    let (planned, p_miss, p_peak) = simulate(PriceMode::Plan, &jobs);
    eprintln!("threshold {threshold:.2}, plan {planned:.2}");
    assert_eq!(p_miss, 0, "no deferred job misses its deadline");
    assert!(t_peak <= 16 && p_peak <= 16);
    assert!(
        planned < threshold * 0.9,
        "plan {planned:.2} should cost clearly less than threshold {threshold:.2} (misses {t_miss})"
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(12))]
    #[test]
    fn under_the_plan_no_deferred_job_misses_its_deadline(seed in 0u64..1000, n in 1usize..40) {
        let jobs = workload(seed, n);
        let (_, misses, peak) = simulate(PriceMode::Plan, &jobs);
        prop_assert!(peak <= 16);
        prop_assert_eq!(misses, 0);
    }
}

#[test]
fn a_hold_shows_its_saving_and_delay_cost_and_a_costly_delay_is_not_taken() {
    let site = site();
    let fc = forecast(&day_prices(3), false);
    let mut pol = policy(PriceMode::Plan);
    // 05:00 (0.13) → 13:00 (0.02): 4 GPUs × 350 W for an hour, 1.4 kWh × 0.11 = 0.154
    let now = t(5.0);
    let jobs = vec![waiting("a", 4, 1.0, now, 20.0)];
    pol.price.delay_cost_per_gpu_hour = 0.001; // 8 h × 4 GPUs: 0.032
    let plan = step(&site, &jobs, &State::default(), &pol, &fc, now);
    let hold = &plan.state.holds["a"];
    assert!(
        hold.reason.contains("expected saving") && hold.reason.contains("> delay cost 0.032"),
        "{}",
        hold.reason
    );
    assert_eq!(plan.planned_starts.get("a"), Some(&t(13.0)));
    // 0.05 per GPU-hour: waiting 8 h costs 1.6, far more than it saves, and no
    // shorter wait is worth it either at this rate: it starts now
    pol.price.delay_cost_per_gpu_hour = 0.05;
    let plan = step(&site, &jobs, &State::default(), &pol, &fc, now);
    assert!(plan.state.holds.is_empty(), "{:?}", plan.state.holds);
    assert!(plan.planned_starts.is_empty());
    // max_slowdown 3: it must end within 3 h of its submission, so it may start by
    // 07:00; 06:00 (0.18) is dearer than now (0.13): it starts now
    pol.price.delay_cost_per_gpu_hour = 0.0;
    pol.price.max_slowdown = Some(3.0);
    let plan = step(&site, &jobs, &State::default(), &pol, &fc, now);
    assert!(plan.state.holds.is_empty(), "{:?}", plan.state.holds);
}

proptest! {
    /// Released work never takes the facility above the peak target: held jobs whose
    /// planned start has come are released only while the target has room.
    #[test]
    fn released_work_never_makes_a_peak_above_the_target(
        gpus in proptest::collection::vec(1u32..5, 1..16),
        target_kw in 1.5f64..8.0,
    ) {
        let site = site();
        let fc = forecast(&vec![0.10; 72], false);
        let mut pol = policy(PriceMode::Plan);
        pol.budget.enabled = true;
        pol.price.peak_target_kw = Some(target_kw);
        let now = t(5.0);
        let mut prior = State::default();
        let jobs: Vec<Job> = gpus
            .iter()
            .enumerate()
            .map(|(i, g)| {
                let mut j = waiting(&format!("j{i:02}"), *g, 1.0, t(0.0), 30.0);
                j.state = JobState::Held;
                prior.holds.insert(
                    j.id.clone(),
                    crate::Hold {
                        rule: "price.defer".into(),
                        since: t(0.0),
                        lease_until: now + 600.0,
                        reason: "test".into(),
                    },
                );
                j
            })
            .collect();
        let plan = step(&site, &jobs, &prior, &pol, &fc, now);
        // the snapshot's facility draws 1,280 W; a busy A40 with its node share 350 W
        let released: f64 = jobs
            .iter()
            .filter(|j| !plan.state.holds.contains_key(&j.id))
            .map(|j| f64::from(j.gpus) * 350.0)
            .sum();
        prop_assert!(
            1280.0 + released <= target_kw * 1000.0 + 1e-6,
            "released {} W under a {} kW target",
            released,
            target_kw
        );
    }
}

/// The test site under a tariff with a demand charge.
fn billed_site() -> Site {
    Site::parse(
        "t.toml",
        &format!("{SITE}[tariff]\ndefault_per_kwh = 0.10\ndemand_charge_per_kw = 10\n"),
    )
    .expect("valid test site")
}

/// Every job held, waiting since `t(0)`.
fn held_jobs(gpus: &[u32], now: Timestamp) -> (Vec<Job>, State) {
    let mut prior = State::default();
    let jobs = gpus
        .iter()
        .enumerate()
        .map(|(i, g)| {
            let mut j = waiting(&format!("j{i:02}"), *g, 1.0, t(0.0), 30.0);
            j.state = JobState::Held;
            prior.holds.insert(
                j.id.clone(),
                crate::Hold {
                    rule: "price.defer".into(),
                    since: t(0.0),
                    lease_until: now + 600.0,
                    reason: "test".into(),
                },
            );
            j
        })
        .collect();
    (jobs, prior)
}

/// [`step`] with the ledger's demand readings in the snapshot (W).
fn step_billed(
    site: &Site,
    jobs: &[Job],
    prior: &State,
    policy: &Policy,
    fc: &Forecast,
    now: Timestamp,
    peaks: (Option<f64>, Option<f64>),
) -> crate::Plan {
    let mut snap = snapshot(site, now, fc.price.at(now));
    for (m, v) in [(PERIOD_PEAK_W, peaks.0), (DAY_PEAK_W, peaks.1)] {
        if let Some(v) = v {
            snap.ingest(Sample::new(site.site_entity(), m, v, now, "t"), now)
                .expect("ok");
        }
    }
    evaluate(
        &Inputs {
            site,
            snapshot: &snap,
            jobs,
            prior,
            policy,
            forecast: fc,
            job_table: None,
        },
        now,
    )
}

#[test]
fn without_a_policy_target_a_demand_charge_paces_under_the_billed_peak_so_far() {
    let site = billed_site();
    let fc = forecast(&[0.10; 72], false);
    let mut pol = policy(PriceMode::Threshold);
    pol.budget.enabled = true;
    let now = t(5.0);
    // five 2-GPU jobs (700 W each) on a facility drawing 1,280 W
    let (jobs, prior) = held_jobs(&[2; 5], now);
    let released = |plan: &crate::Plan| {
        jobs.iter()
            .filter(|j| !plan.state.holds.contains_key(&j.id))
            .count()
    };
    // the period's peak so far is 3.4 kW: room for three of them
    let plan = step_billed(
        &site,
        &jobs,
        &prior,
        &pol,
        &fc,
        now,
        (Some(3400.0), Some(2000.0)),
    );
    assert_eq!(released(&plan), 3);
    let hold = plan.state.holds.values().next().expect("two still held");
    assert!(
        hold.reason.contains(
            "under the peak target 3.4 kW (automatic: the billing period's peak so far 3.4 kW)"
        ),
        "{}",
        hold.reason
    );
    let d = plan
        .decisions
        .iter()
        .find(|d| d.values.contains_key("peak_target_kw"))
        .expect("a decision with the target");
    assert_eq!(d.values["peak_target_kw"], 3.4);
    assert_eq!(d.values["period_peak_kw"], 3.4);
    // early in a period the last day's peak is the floor
    let plan = step_billed(
        &site,
        &jobs,
        &prior,
        &pol,
        &fc,
        now,
        (Some(1500.0), Some(2700.0)),
    );
    assert_eq!(released(&plan), 2);
    // the policy's own target wins
    pol.price.peak_target_kw = Some(5.0);
    let plan = step_billed(&site, &jobs, &prior, &pol, &fc, now, (Some(1500.0), None));
    assert_eq!(released(&plan), 5);
    // no demand charge, or nothing measured yet: no automatic target
    pol.price.peak_target_kw = None;
    let plan = step_billed(&site, &jobs, &prior, &pol, &fc, now, (None, None));
    assert_eq!(released(&plan), 5);
    let plan = step_billed(
        &self::site(),
        &jobs,
        &prior,
        &pol,
        &fc,
        now,
        (Some(1500.0), None),
    );
    assert_eq!(released(&plan), 5);
}

proptest! {
    /// With a demand charge and no `peak_target_kw`, released work never takes the
    /// facility above the billed peak so far (floored by the last day's peak).
    #[test]
    fn released_work_never_raises_the_billed_peak(
        gpus in proptest::collection::vec(1u32..5, 1..16),
        period_kw in proptest::option::of(0.5f64..8.0),
        day_kw in proptest::option::of(0.5f64..8.0),
        threshold in proptest::bool::ANY,
    ) {
        let site = billed_site();
        let fc = forecast(&vec![0.10; 72], false);
        let mut pol = policy(if threshold { PriceMode::Threshold } else { PriceMode::Plan });
        pol.budget.enabled = true;
        let now = t(5.0);
        let (jobs, prior) = held_jobs(&gpus, now);
        let w = |kw: Option<f64>| kw.map(|k| k * 1000.0);
        let plan = step_billed(&site, &jobs, &prior, &pol, &fc, now, (w(period_kw), w(day_kw)));
        let released: f64 = jobs
            .iter()
            .filter(|j| !plan.state.holds.contains_key(&j.id))
            .map(|j| f64::from(j.gpus) * 350.0)
            .sum();
        if period_kw.is_some() || day_kw.is_some() {
            let target = period_kw.unwrap_or(0.0).max(day_kw.unwrap_or(0.0));
            // what the facility draws already is not the released work's doing
            prop_assert!(
                released <= (target * 1000.0 - 1280.0).max(0.0) + 1e-6,
                "released {} W under a billed peak of {} kW",
                released,
                target
            );
        }
    }
}
