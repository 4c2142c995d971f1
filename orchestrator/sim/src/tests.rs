//! The simulated facility: leases, holds, caps, faults and determinism.
use super::*;
use policies::{Cap, Hold};
use telemetry::metric::names::COOLING_CAPACITY_KW;
use telemetry::{EntityId, EntityKind};

const SITE: &str = include_str!("../../../examples/demo/site.toml");
const PRICES: &str = include_str!("../../../examples/demo/prices.csv");

fn facility() -> Facility {
    let site = Site::parse("site.toml", SITE).expect("site");
    let prices = Series::from_csv("p.csv", PRICES, "price_per_kwh").expect("prices");
    let start = Timestamp::parse_rfc3339("2024-06-03T06:00:00+02:00").expect("start");
    Facility::new(
        site,
        prices,
        Series::default(),
        Workload::default(),
        9,
        start,
    )
}

fn limit(f: &Facility, id: &EntityId) -> f64 {
    f.gpus
        .iter()
        .find(|g| &g.id == id)
        .map(|g| g.limit_w)
        .expect("gpu")
}

#[test]
fn a_cap_whose_lease_is_not_renewed_reverts_to_the_default_limit() {
    let mut f = facility();
    let gpu = EntityId::gpu("a01-n01", 0);
    let now = f.now();
    let mut state = State::default();
    state.caps.insert(
        gpu.clone(),
        Cap {
            watts: 150.0,
            rule: "test".into(),
            since: now,
            lease_until: now + 300.0,
        },
    );
    f.apply(&state, now);
    assert_eq!(limit(&f, &gpu), 150.0);
    for _ in 0..19 {
        f.step(15.0);
    }
    assert_eq!(limit(&f, &gpu), 150.0, "still inside the lease at 285 s");
    f.step(15.0);
    assert_eq!(
        limit(&f, &gpu),
        300.0,
        "the controller went silent: default restored at 300 s"
    );
    assert_eq!(f.stats.leases_expired, 1);
}

#[test]
fn a_hold_whose_lease_is_not_renewed_lets_the_job_run() {
    let mut f = facility();
    f.step(15.0);
    let waiting = f
        .jobs()
        .into_iter()
        .find(|j| j.state == JobState::Pending)
        .or_else(|| {
            (0..40).find_map(|_| {
                f.step(15.0);
                f.jobs().into_iter().find(|j| j.state == JobState::Pending)
            })
        });
    let job = waiting.expect("a job arrives");
    let now = f.now();
    let mut state = State::default();
    state.holds.insert(
        job.id.clone(),
        Hold {
            rule: "test".into(),
            since: now,
            lease_until: now + 60.0,
            reason: "test".into(),
        },
    );
    f.apply(&state, now);
    let state_of = |f: &Facility| {
        f.jobs()
            .into_iter()
            .find(|j| j.id == job.id)
            .map(|j| j.state)
    };
    assert_eq!(state_of(&f), Some(JobState::Held));
    for _ in 0..3 {
        f.step(15.0);
    }
    assert_eq!(state_of(&f), Some(JobState::Held), "held within its lease");
    f.step(15.0);
    assert_ne!(
        state_of(&f),
        Some(JobState::Held),
        "released when the lease ran out"
    );
}

#[test]
fn a_suspended_job_keeps_its_gpus_runs_nothing_and_runs_on_when_its_lease_ends() {
    let mut f = facility();
    f.step(15.0);
    let job = f
        .jobs()
        .into_iter()
        .find(|j| j.state == JobState::Running)
        .expect("the warm start runs jobs");
    let done = |f: &Facility| {
        f.jobs
            .iter()
            .find(|j| j.gen.job.id == job.id)
            .map(|j| j.done_s)
            .expect("job")
    };
    let power = |f: &Facility| -> f64 {
        f.gpus
            .iter()
            .filter(|g| job.allocated.contains(&g.id))
            .map(|g| g.power_w)
            .sum()
    };
    let busy_w = power(&f);
    let now = f.now();
    let mut state = State::default();
    state.suspended.insert(
        job.id.clone(),
        Hold {
            rule: "test".into(),
            since: now,
            lease_until: now + 60.0,
            reason: "test".into(),
        },
    );
    f.apply(&state, now);
    let before = done(&f);
    for _ in 0..3 {
        f.step(15.0);
    }
    let now_job = f.jobs().into_iter().find(|j| j.id == job.id).expect("job");
    assert_eq!(now_job.state, JobState::Suspended, "within its lease");
    assert_eq!(now_job.allocated, job.allocated, "it keeps its GPUs");
    assert_eq!(done(&f), before, "no progress while suspended");
    assert!(power(&f) < busy_w, "its GPUs draw idle power");
    f.step(15.0);
    assert_eq!(
        f.jobs()
            .into_iter()
            .find(|j| j.id == job.id)
            .map(|j| j.state),
        Some(JobState::Running),
        "resumed when the lease ran out"
    );
    f.step(15.0);
    assert!(done(&f) > before, "it runs on");
}

#[test]
fn a_capped_gpu_draws_no_more_than_its_cap() {
    let mut f = facility();
    let busy = f
        .gpus
        .iter()
        .position(|g| g.job.is_some())
        .expect("warm start fills GPUs");
    let id = f.gpus[busy].id.clone();
    let p_full = f.gpus[busy].power_w;
    let mut state = State::default();
    let now = f.now();
    state.caps.insert(
        id.clone(),
        Cap {
            watts: 120.0,
            rule: "test".into(),
            since: now,
            lease_until: now + 600.0,
        },
    );
    f.apply(&state, now);
    f.update_power();
    let p_capped = f.gpus[busy].power_w;
    assert!(
        p_capped <= 120.0 + 1e-9 && p_capped < p_full,
        "{p_full} W -> {p_capped} W"
    );
}

#[test]
fn a_cooling_fault_is_reported_as_capacity_and_heats_the_racks_it_cools() {
    let site = Site::parse("site.toml", SITE).expect("site");
    assert!(
        Fault::parse("crah-z=0.5@10", &site).is_err(),
        "no such unit"
    );
    assert!(
        Fault::parse("crah-b=1.5@10", &site).is_err(),
        "factor over 1"
    );
    assert!(Fault::parse("crah-b@10", &site).is_err(), "no factor");
    let pump = Fault::parse("crah-b=pump@1", &site).expect("pump");
    assert_eq!((pump.factor, pump.at_s), (Fault::PUMP_FAILURE_FACTOR, 60.0));
    let run = |faults: Vec<Fault>| {
        let mut f = facility().with_faults(faults);
        for _ in 0..40 {
            f.step(15.0);
        }
        let capacity = f
            .poll(f.now())
            .into_iter()
            .find(|s| {
                s.entity == EntityId::new(EntityKind::Cooling, "crah-b")
                    && s.metric.as_str() == COOLING_CAPACITY_KW
            })
            .map(|s| s.value);
        (f.inlet_c().to_vec(), capacity)
    };
    let (calm, cap_calm) = run(Vec::new());
    let (hot, cap_hot) = run(vec![pump]);
    assert_eq!((cap_calm, cap_hot), (Some(16.0), Some(8.0)));
    // a01..a03 are cooled by crah-a, b01..b03 by crah-b
    assert_eq!(calm[..3], hot[..3], "crah-a's racks are untouched");
    for i in 3..6 {
        assert!(
            hot[i] > calm[i] + 1.0,
            "rack {i}: {} -> {}",
            calm[i],
            hot[i]
        );
    }
}

#[test]
fn the_same_seed_gives_the_same_world() {
    let run = || {
        let mut f = facility();
        for _ in 0..100 {
            f.step(15.0);
        }
        (f.stats.clone(), f.it_power_w(), f.inlet_c().to_vec())
    };
    assert_eq!(run(), run());
}
