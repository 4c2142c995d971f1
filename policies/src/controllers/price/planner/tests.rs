use super::*;
use proptest::prelude::*;

fn t(h: f64) -> Timestamp {
    // on a whole hour, so the slots line up with the price steps
    Timestamp::from_secs(1_700_002_800) + h * 3600.0
}

fn hourly(prices: &[f64]) -> StepSeries {
    StepSeries::new(
        prices
            .iter()
            .enumerate()
            .map(|(i, p)| (t(i as f64), *p))
            .collect(),
        3600.0,
    )
}

fn job(id: &str, gpus: u32, hours: f64, latest_h: f64) -> PlanJob {
    PlanJob {
        id: id.into(),
        gpus,
        watts: f64::from(gpus) * 300.0,
        duration_s: hours * 3600.0,
        latest_start: t(latest_h),
        delay_cost_per_s: 0.0,
    }
}

const HOURLY: Horizon = Horizon {
    slot_s: 3600.0,
    horizon_s: 6.0 * 3600.0,
};

const ROOMY: Capacity = Capacity {
    gpus: 8,
    power_w: 1e9,
};

#[test]
fn a_job_starts_in_the_cheapest_slot_before_its_latest_start() {
    let price = hourly(&[0.30, 0.10, 0.20, 0.05, 0.40, 0.40]);
    let s = plan(&[job("a", 1, 1.0, 3.0)], &[], ROOMY, &price, HOURLY, t(0.0));
    assert_eq!(s.placements[0].start, t(3.0));
    assert!((s.placements[0].mean_price - 0.05).abs() < 1e-9);
    // the cheapest hour comes after its latest start: the cheapest one before it
    let s = plan(&[job("b", 1, 1.0, 2.5)], &[], ROOMY, &price, HOURLY, t(0.0));
    assert_eq!(s.placements[0].start, t(1.0));
    // a two-hour run: 0.20 + 0.05 beats 0.10 + 0.20
    let s = plan(&[job("c", 1, 2.0, 3.0)], &[], ROOMY, &price, HOURLY, t(0.0));
    assert_eq!(s.placements[0].start, t(2.0));
    assert!(!s.placements[0].forced);
}

#[test]
fn the_first_slot_starts_now_and_the_rest_follow_the_grid() {
    let price = hourly(&[0.10, 0.30, 0.30, 0.30, 0.30, 0.30]);
    let now = t(0.5);
    let s = plan(&[job("a", 1, 0.25, 4.0)], &[], ROOMY, &price, HOURLY, now);
    assert_eq!(s.slot_starts[0], now);
    assert_eq!(s.slot_starts[1], t(1.0));
    assert_eq!(
        s.placements[0].start, now,
        "the cheap hour is the one in force"
    );
}

#[test]
fn jobs_that_do_not_fit_together_spread_to_the_next_cheapest_slots() {
    let price = hourly(&[0.30, 0.10, 0.20, 0.05, 0.40, 0.40]);
    let jobs = [
        job("a", 6, 1.0, 4.0),
        job("b", 6, 1.0, 4.0),
        job("c", 6, 1.0, 4.0),
    ];
    let s = plan(&jobs, &[], ROOMY, &price, HOURLY, t(0.0));
    let starts: Vec<Timestamp> = s.placements.iter().map(|p| p.start).collect();
    assert_eq!(starts, vec![t(3.0), t(1.0), t(2.0)]);
    assert!(s.gpus.iter().all(|g| *g <= 8));
    // the power budget binds the same way
    let tight = Capacity {
        gpus: 100,
        power_w: 1900.0,
    };
    let s = plan(&jobs, &[], tight, &price, HOURLY, t(0.0));
    let starts: Vec<Timestamp> = s.placements.iter().map(|p| p.start).collect();
    assert_eq!(starts, vec![t(3.0), t(1.0), t(2.0)]);
}

#[test]
fn running_jobs_take_their_room_until_their_expected_end() {
    let price = hourly(&[0.30, 0.10, 0.20, 0.05, 0.40, 0.40]);
    let busy = [Committed {
        gpus: 4,
        watts: 1200.0,
        until: t(4.0),
    }];
    let s = plan(
        &[job("a", 6, 1.0, 5.0)],
        &busy,
        ROOMY,
        &price,
        HOURLY,
        t(0.0),
    );
    assert_eq!(s.placements[0].start, t(4.0), "no room before the run ends");
}

#[test]
fn a_job_with_no_room_before_its_latest_start_starts_now() {
    let price = hourly(&[0.30, 0.10, 0.20, 0.05, 0.40, 0.40]);
    let busy = [Committed {
        gpus: 8,
        watts: 2400.0,
        until: t(5.0),
    }];
    let s = plan(
        &[job("a", 2, 1.0, 2.0)],
        &busy,
        ROOMY,
        &price,
        HOURLY,
        t(0.0),
    );
    assert_eq!(s.placements[0].start, t(0.0));
    assert!(s.placements[0].forced);
}

#[test]
fn slots_past_the_forecast_cost_its_mean() {
    // two known hours, a four-hour horizon
    let price = hourly(&[0.40, 0.10]);
    let s = plan(&[job("a", 1, 1.0, 3.0)], &[], ROOMY, &price, HOURLY, t(0.0));
    assert_eq!(s.placements[0].start, t(1.0));
}

#[test]
fn fifty_thousand_jobs_over_two_days_plan_without_breaking_a_rule() {
    let prices: Vec<f64> = (0..49)
        .map(|h| 0.1 + 0.05 * ((h as f64) * 0.7).sin())
        .collect();
    let price = hourly(&prices);
    let jobs: Vec<PlanJob> = (0..50_000)
        .map(|i| {
            let mut j = job(
                &format!("j{i}"),
                1 + (i % 8) as u32,
                0.25 + (i % 7) as f64 * 0.5,
                1.0 + (i % 40) as f64,
            );
            j.watts = f64::from(j.gpus) * 300.0;
            j
        })
        .collect();
    let cap = Capacity {
        gpus: 20_000,
        power_w: 20_000.0 * 300.0,
    };
    let h = Horizon {
        slot_s: 900.0,
        horizon_s: 48.0 * 3600.0,
    };
    let started = std::time::Instant::now();
    let s = plan(&jobs, &[], cap, &price, h, t(0.0));
    let took = started.elapsed();
    assert_eq!(s.placements.len(), jobs.len());
    for (j, p) in jobs.iter().zip(&s.placements) {
        assert!(p.start <= j.latest_start || p.forced, "{p:?}");
    }
    eprintln!("planned 50,000 jobs over 48 h of 15-minute slots in {took:?}");
}

fn arb_jobs() -> impl Strategy<Value = Vec<(u32, f64, f64)>> {
    proptest::collection::vec((1u32..9, 0.1f64..10.0, 0.0f64..30.0), 0..40)
}

proptest! {
    #[test]
    fn plans_respect_latest_starts_and_capacity_and_are_deterministic(
        specs in arb_jobs(),
        prices in proptest::collection::vec(-0.1f64..0.6, 1..40),
        now_h in 0.0f64..2.0,
        cap_gpus in 8u32..40,
        power_share in 0.3f64..1.0,
    ) {
        let price = hourly(&prices);
        let jobs: Vec<PlanJob> = specs
            .iter()
            .enumerate()
            .map(|(i, (g, hours, latest))| job(&format!("j{i:02}"), *g, *hours, now_h + latest))
            .collect();
        let cap = Capacity { gpus: cap_gpus, power_w: f64::from(cap_gpus) * 300.0 * power_share };
        let h = Horizon { slot_s: 900.0, horizon_s: 36.0 * 3600.0 };
        let now = t(now_h);
        let s = plan(&jobs, &[], cap, &price, h, now);
        prop_assert_eq!(s.placements.len(), jobs.len());
        let mut forced = false;
        for (j, p) in jobs.iter().zip(&s.placements) {
            prop_assert_eq!(&j.id, &p.id);
            prop_assert!(p.start >= now);
            // never planned past its latest start (a job that fits nowhere starts now)
            prop_assert!(p.start <= j.latest_start.max(now), "{:?} {:?}", j, p);
            forced |= p.forced;
        }
        if !forced {
            for k in 0..s.gpus.len() {
                prop_assert!(s.gpus[k] <= cap.gpus, "slot {}: {} GPUs", k, s.gpus[k]);
                prop_assert!(s.watts[k] <= cap.power_w + 1e-6, "slot {}: {} W", k, s.watts[k]);
            }
        }
        // the same inputs, in any order, give the same plan
        prop_assert_eq!(&plan(&jobs, &[], cap, &price, h, now), &s);
        let mut rev = jobs.clone();
        rev.reverse();
        let r = plan(&rev, &[], cap, &price, h, now);
        let mut a: Vec<_> = s.placements.clone();
        let mut b: Vec<_> = r.placements.clone();
        a.sort_by(|x, y| x.id.cmp(&y.id));
        b.sort_by(|x, y| x.id.cmp(&y.id));
        prop_assert_eq!(a, b);
    }
}

#[test]
fn a_later_start_is_taken_only_when_its_saving_beats_the_cost_of_the_delay() {
    // 1 GPU at 300 W for an hour: 0.3 kWh; waiting 3 h saves 0.25 per kWh: 0.075
    let price = hourly(&[0.30, 0.30, 0.30, 0.05, 0.30, 0.30]);
    let mut j = job("a", 1, 1.0, 4.0);
    let s = plan(&[j.clone()], &[], ROOMY, &price, HOURLY, t(0.0));
    assert_eq!(s.placements[0].start, t(3.0));
    assert!((s.placements[0].saving - 0.075).abs() < 1e-9, "{s:?}");
    // a delay cost of 0.02 per GPU-hour: 3 h cost 0.06 < 0.075, still worth it
    j.delay_cost_per_s = 0.02 / 3600.0;
    let s = plan(&[j.clone()], &[], ROOMY, &price, HOURLY, t(0.0));
    assert_eq!(s.placements[0].start, t(3.0));
    assert!((s.placements[0].delay_cost - 0.06).abs() < 1e-9);
    // 0.03 per GPU-hour: 3 h cost 0.09 > 0.075: it starts now
    j.delay_cost_per_s = 0.03 / 3600.0;
    let s = plan(&[j], &[], ROOMY, &price, HOURLY, t(0.0));
    assert_eq!(s.placements[0].start, t(0.0));
    assert_eq!(s.placements[0].saving, 0.0);
}

proptest! {
    /// A job that could start now is planned later only when the expected saving of
    /// the later start exceeds what the delay costs.
    #[test]
    fn a_hold_is_placed_only_when_its_saving_exceeds_its_delay_cost(
        specs in arb_jobs(),
        prices in proptest::collection::vec(0.0f64..0.6, 1..40),
        delay_per_gpu_h in 0.0f64..0.2,
        cap_gpus in 8u32..40,
    ) {
        let price = hourly(&prices);
        let jobs: Vec<PlanJob> = specs
            .iter()
            .enumerate()
            .map(|(i, (g, hours, latest))| PlanJob {
                delay_cost_per_s: delay_per_gpu_h * f64::from(*g) / 3600.0,
                ..job(&format!("j{i:02}"), *g, *hours, *latest)
            })
            .collect();
        let cap = Capacity { gpus: cap_gpus, power_w: 1e9 };
        let h = Horizon { slot_s: 900.0, horizon_s: 36.0 * 3600.0 };
        let now = t(0.0);
        let s = plan(&jobs, &[], cap, &price, h, now);
        for (j, p) in jobs.iter().zip(&s.placements) {
            if p.start > now && p.fits_now {
                prop_assert!(p.saving > p.delay_cost - 1e-9, "{:?} {:?}", j, p);
                let delay_h = p.start.secs_since(now) / 3600.0;
                let cost = delay_per_gpu_h * f64::from(j.gpus) * delay_h;
                prop_assert!((p.delay_cost - cost).abs() < 1e-9);
            }
        }
    }
}
