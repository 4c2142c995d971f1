use super::*;
use crate::plan::{Action, State};
use crate::{evaluate, Inputs, Policy};
use telemetry::{Job, JobState, Sample};

/// Four racks of two 8-GPU H100 nodes (64 GPUs), budgets far above what they draw: only
/// the grid controller acts. The nodes draw 1 kW each besides their GPUs.
const SITE: &str = r#"
version = 1
[site]
name = "g"
[[feeds]]
id = "f"
rating_kw = 400
derate = 1.0
[[cooling]]
id = "c"
capacity_kw = 400
racks = ["r1", "r2", "r3", "r4"]
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
gpu_model = "H100"
node_base_w = 1000
[[racks]]
id = "r2"
row = "w"
power_budget_kw = 100
nodes = 2
gpus_per_node = 8
gpu_model = "H100"
node_base_w = 1000
[[racks]]
id = "r3"
row = "w"
power_budget_kw = 100
nodes = 2
gpus_per_node = 8
gpu_model = "H100"
node_base_w = 1000
[[racks]]
id = "r4"
row = "w"
power_budget_kw = 100
nodes = 2
gpus_per_node = 8
gpu_model = "H100"
node_base_w = 1000
"#;

fn site() -> Site {
    Site::parse("g.toml", SITE).expect("valid test site")
}

fn t0() -> Timestamp {
    Timestamp::from_secs(1_800_000_000)
}

fn gpus(site: &Site) -> Vec<EntityId> {
    site.gpus().into_iter().map(|g| g.id.into_owned()).collect()
}

/// The site drawing `gpu_w` per busy GPU (60 W idle), the cooling `cooling_share` of IT,
/// and the grid readings given.
fn snapshot(
    site: &Site,
    busy: &[EntityId],
    gpu_w: f64,
    caps: &State,
    grid: &[(&str, f64)],
    now: Timestamp,
) -> (Snapshot, f64) {
    let mut s = Snapshot::new();
    let mut it = 8000.0;
    for g in site.gpus() {
        let mut w = if busy.contains(&g.id) { gpu_w } else { 60.0 };
        if let Some(c) = caps.caps.get(&g.id) {
            w = w.min(c.watts);
        }
        it += w;
        s.ingest(
            Sample::new(EntityId::clone(&g.id), POWER_W, w, now, "t"),
            now,
        )
        .expect("ok");
    }
    s.ingest(Sample::new(site.site_entity(), POWER_W, it, now, "t"), now)
        .expect("ok");
    s.ingest(
        Sample::new(
            EntityId::new(EntityKind::Cooling, "c"),
            COOLING_POWER_W,
            it * 0.25,
            now,
            "t",
        ),
        now,
    )
    .expect("ok");
    for (m, v) in grid {
        s.ingest(Sample::new(site.site_entity(), m, *v, now, "t"), now)
            .expect("ok");
    }
    (s, it * 1.25)
}

fn job(id: &str, class: &str, priority: i32, gpus: &[EntityId], state: JobState) -> Job {
    Job {
        id: id.into(),
        scheduler: "test".into(),
        name: id.into(),
        user: "u".into(),
        project: "p".into(),
        class: class.into(),
        priority,
        gpus: gpus.len().max(1) as u32,
        allocated: if state == JobState::Running {
            gpus.to_vec()
        } else {
            Vec::new()
        },
        state,
        submit_time: t0(),
        start_time: (state == JobState::Running).then(t0),
        end_time: None,
        deadline: None,
        est_duration_s: 3600.0,
        deferrable: false,
        preemptible: false,
        gpu_power_limit: None,
    }
}

fn policy() -> Policy {
    let mut p = Policy::default();
    p.thermal.enabled = false;
    p.price.enabled = false;
    p.grid.protect = vec!["inference".into()];
    p.grid.shed_order = vec!["batch".into()];
    p
}

fn run(
    site: &Site,
    snap: &Snapshot,
    jobs: &[Job],
    prior: &State,
    p: &Policy,
    now: Timestamp,
) -> crate::Plan {
    let forecast = crate::Forecast::default();
    evaluate(
        &Inputs {
            site,
            snapshot: snap,
            jobs,
            prior,
            policy: p,
            forecast: &forecast,
            job_table: None,
        },
        now,
    )
}

/// The meter after the plan's caps, as the snapshot's model draws it.
fn meter_after(
    site: &Site,
    busy: &[EntityId],
    gpu_w: f64,
    plan: &crate::Plan,
    suspended: &[EntityId],
) -> f64 {
    let busy: Vec<EntityId> = busy
        .iter()
        .filter(|g| !suspended.contains(g))
        .cloned()
        .collect();
    snapshot(site, &busy, gpu_w, &plan.state, &[], t0()).1
}

#[test]
fn the_target_is_the_lowest_of_what_is_asked() {
    let a = Asked {
        active: true,
        shed_fraction: Some(0.25),
        shed_w: Some(100.0),
        cap_w: Some(900.0),
        baseline_w: None,
    };
    assert_eq!(a.target_w(1000.0), Some(750.0));
    let b = Asked {
        active: true,
        cap_w: Some(600.0),
        ..Asked::default()
    };
    assert_eq!(b.target_w(1000.0), Some(600.0));
    assert_eq!(Asked::default().target_w(1000.0), None);
}

#[test]
fn an_event_takes_its_baseline_once_then_a_rebound_follows_and_ends() {
    let rule = GridRule::default();
    let m = |w: f64| Meter {
        meter_w: w,
        it_w: w / 1.25,
        from: MeterFrom::ItAndCooling,
    };
    let on = Asked {
        active: true,
        shed_fraction: Some(0.2),
        ..Asked::default()
    };
    let first = step(None, &on, &m(1000.0), &rule, false, t0()).expect("event");
    assert_eq!(
        (first.baseline_w, first.target_w, first.since),
        (1000.0, 800.0, t0())
    );
    // later ticks keep the baseline though the meter fell
    let later = step(Some(&first), &on, &m(790.0), &rule, false, t0() + 60.0).expect("event");
    assert_eq!(
        (later.baseline_w, later.target_w, later.since),
        (1000.0, 800.0, t0())
    );
    // the edge's own baseline wins
    let given = Asked {
        baseline_w: Some(1100.0),
        ..on
    };
    let g = step(Some(&later), &given, &m(790.0), &rule, false, t0() + 120.0).expect("event");
    assert_eq!((g.baseline_w, g.target_w), (1100.0, 880.0));
    // the event ends: the rebound holds the baseline for rebound_s
    let end = t0() + 3600.0;
    let r = step(
        Some(&later),
        &Asked::default(),
        &m(800.0),
        &rule,
        false,
        end,
    )
    .expect("rebound");
    assert_eq!(r.rebound_until, Some(end + rule.rebound_s));
    assert_eq!(r.target_w, 1000.0);
    assert!(!r.event_active());
    let still = step(
        Some(&r),
        &Asked::default(),
        &m(900.0),
        &rule,
        false,
        end + 60.0,
    )
    .expect("rebound");
    assert_eq!(still.rebound_until, r.rebound_until);
    let over = end + rule.rebound_s;
    assert!(step(Some(&r), &Asked::default(), &m(900.0), &rule, false, over).is_none());
    // held work still waiting keeps the rebound limit past its time
    let held =
        step(Some(&r), &Asked::default(), &m(900.0), &rule, true, over).expect("still held work");
    assert_eq!(held.target_w, 1000.0);
    // no rebound where the policy gives none
    let none = GridRule {
        rebound_s: 0.0,
        ..GridRule::default()
    };
    assert!(step(
        Some(&later),
        &Asked::default(),
        &m(800.0),
        &none,
        false,
        end
    )
    .is_none());
}

#[test]
fn with_no_event_the_grid_controller_changes_no_plan() {
    let site = site();
    let g = gpus(&site);
    let jobs = vec![
        job("a", "training", 1, &g[0..32], JobState::Running),
        job("q", "batch", 1, &[], JobState::Pending),
    ];
    let (snap, _) = snapshot(&site, &g[0..32], 600.0, &State::default(), &[], t0());
    let p = policy();
    let mut off = p.clone();
    off.grid.enabled = false;
    let a = run(&site, &snap, &jobs, &State::default(), &p, t0());
    let b = run(&site, &snap, &jobs, &State::default(), &off, t0());
    assert_eq!(a, b);
    assert!(a.state.grid.is_none());
    // an event at level 0 (`grid_event_active` 0) is no event
    let (snap0, _) = snapshot(
        &site,
        &g[0..32],
        600.0,
        &State::default(),
        &[(GRID_EVENT_ACTIVE, 0.0), (GRID_SHED_FRACTION, 0.3)],
        t0(),
    );
    assert_eq!(run(&site, &snap0, &jobs, &State::default(), &p, t0()), a);
}

#[test]
fn a_shed_is_met_by_holding_deferrable_work_and_capping_flexible_classes_first() {
    let site = site();
    let g = gpus(&site);
    let mut deferrable = job("queued", "batch", 1, &[], JobState::Pending);
    deferrable.deferrable = true;
    deferrable.gpus = 8;
    let jobs = vec![
        job("serve", "inference", 5, &g[0..16], JobState::Running),
        job("batch", "batch", 1, &g[16..32], JobState::Running),
        job("train", "training", 3, &g[32..64], JobState::Running),
        deferrable,
        job("urgent", "batch", 1, &[], JobState::Pending),
    ];
    let busy = &g[..];
    let grid = [(GRID_EVENT_ACTIVE, 1.0), (GRID_SHED_FRACTION, 0.25)];
    let (snap, baseline) = snapshot(&site, busy, 650.0, &State::default(), &grid, t0());
    let plan = run(&site, &snap, &jobs, &State::default(), &policy(), t0());
    let m = plan.state.grid.as_ref().expect("event in force");
    assert!((m.baseline_w - baseline).abs() < 1e-6, "{m:?}");
    assert!((m.target_w - baseline * 0.75).abs() < 1e-6);
    assert_eq!(m.shortfall_w, 0.0, "{m:?}");
    // the inference job is never capped; the batch job is cut before training
    for x in &g[0..16] {
        assert!(plan.state.caps.get(x).is_none(), "inference capped: {x}");
    }
    let cap = |x: &EntityId| plan.state.caps.get(x).map(|c| c.watts);
    let batch = cap(&g[16]).expect("batch capped");
    assert!(batch >= 0.5 * 700.0 - 1e-6, "under the floor: {batch}");
    let train = cap(&g[40]).unwrap_or(700.0);
    assert!(
        train >= batch,
        "training cut before batch: {train} < {batch}"
    );
    assert_eq!(&*plan.state.caps.get(&g[16]).expect("cap").rule, RULE);
    // the meter after the caps is under the target
    let after = meter_after(&site, busy, 650.0, &plan, &[]);
    assert!(
        after <= m.target_w,
        "meter {after} over target {}",
        m.target_w
    );
    assert!(
        after >= m.target_w * 0.95,
        "over-shed: {after} against {}",
        m.target_w
    );
    // the deferrable job is held, the other one is not
    let h = plan.state.holds.get("queued").expect("deferrable job held");
    assert_eq!(h.rule, RULE);
    // every cap and hold of the event has a lease (invariant 2): a controller that goes
    // silent leaves nothing capped or held
    let lease = policy().grid.lease_s;
    assert_eq!(h.lease_until, t0() + lease);
    for c in plan.state.caps.values().filter(|c| &*c.rule == RULE) {
        assert_eq!(c.lease_until, t0() + lease, "{c:?}");
    }
    assert!(!plan.state.holds.contains_key("urgent"));
    let d = plan
        .decisions
        .iter()
        .find(|d| d.rule == RULE && matches!(d.action, Action::Cap { .. }))
        .expect("a cap decision");
    assert!(d.reason.contains("grid event: meter"), "{}", d.reason);
    assert!(d.values.contains_key("target_kw"), "{:?}", d.values);
}

#[test]
fn a_target_out_of_reach_suspends_preemptible_jobs_and_names_the_shortfall() {
    let site = site();
    let g = gpus(&site);
    let mut pre = job("pre", "batch", 1, &g[32..48], JobState::Running);
    pre.preemptible = true;
    let jobs = vec![
        job("serve", "inference", 5, &g[0..32], JobState::Running),
        pre,
        job("train", "training", 3, &g[48..64], JobState::Running),
    ];
    let busy = &g[..];
    // a cap that flexible work at its floors cannot reach
    let (_, baseline) = snapshot(&site, busy, 650.0, &State::default(), &[], t0());
    let cap_w = baseline * 0.55;
    let grid = [(GRID_EVENT_ACTIVE, 1.0), (GRID_CAP_W, cap_w)];
    let (snap, _) = snapshot(&site, busy, 650.0, &State::default(), &grid, t0());
    let plan = run(&site, &snap, &jobs, &State::default(), &policy(), t0());
    assert!(
        plan.state.suspended.contains_key("pre"),
        "{:?}",
        plan.state.suspended
    );
    assert!(!plan.state.suspended.contains_key("serve"));
    assert!(
        !plan.state.suspended.contains_key("train"),
        "not preemptible"
    );
    assert!(plan
        .decisions
        .iter()
        .any(|d| d.rule == RULE && matches!(d.action, Action::Suspend { .. })));
    let m = plan.state.grid.as_ref().expect("memory");
    // inference alone draws 32 × 650 W: the target is short by what the rest cannot give
    assert!(m.shortfall_w > 0.0, "{m:?}");
    assert!(m.floor_w > cap_w, "{m:?}");
    // no suspensions where the policy allows none
    let mut p = policy();
    p.grid.suspend = false;
    let plan = run(&site, &snap, &jobs, &State::default(), &p, t0());
    assert!(plan.state.suspended.is_empty());
}

/// A job suspended for an event stays suspended while the event is in force, until
/// its deadline needs it running: then it is resumed, the event or not.
#[test]
fn a_suspended_job_is_resumed_when_its_slack_comes_down_to_the_protected_slack() {
    let site = site();
    let g = gpus(&site);
    let mut pre = job("pre", "batch", 1, &g[32..48], JobState::Running);
    pre.preemptible = true;
    let mut jobs = vec![
        job("serve", "inference", 5, &g[0..32], JobState::Running),
        pre,
        job("train", "training", 3, &g[48..64], JobState::Running),
    ];
    let busy = &g[..];
    let (_, baseline) = snapshot(&site, busy, 650.0, &State::default(), &[], t0());
    let grid = [(GRID_EVENT_ACTIVE, 1.0), (GRID_CAP_W, baseline * 0.55)];
    let (snap, _) = snapshot(&site, busy, 650.0, &State::default(), &grid, t0());
    let first = run(&site, &snap, &jobs, &State::default(), &policy(), t0());
    assert!(first.state.suspended.contains_key("pre"));
    // the scheduler reports it suspended: it stays so
    jobs[1].state = JobState::Suspended;
    let plan = run(&site, &snap, &jobs, &first.state, &policy(), t0());
    assert!(
        plan.state.suspended.contains_key("pre"),
        "{:?}",
        plan.state.suspended
    );
    // its deadline comes within the protected slack (an hour): resumed
    let protect_s = policy().budget.protect_slack_s;
    jobs[1].deadline = Some(t0() + (jobs[1].est_duration_s + protect_s - 60.0));
    let plan = run(&site, &snap, &jobs, &first.state, &policy(), t0());
    assert!(
        !plan.state.suspended.contains_key("pre"),
        "{:?}",
        plan.state.suspended
    );
    // with more slack than that it stays suspended
    jobs[1].deadline = Some(t0() + (jobs[1].est_duration_s + protect_s + 600.0));
    let plan = run(&site, &snap, &jobs, &first.state, &policy(), t0());
    assert!(plan.state.suspended.contains_key("pre"));
}

/// After the event, suspended jobs come back as the room under the rebound limit
/// allows, those cut last first, never all at once.
#[test]
fn after_the_event_suspended_jobs_come_back_only_as_room_allows() {
    let site = site();
    let g = gpus(&site);
    let mut jobs = vec![job("serve", "inference", 5, &g[0..32], JobState::Running)];
    for k in 0..4 {
        let mut b = job(
            &format!("b{k}"),
            "batch",
            k,
            &g[32 + 8 * k as usize..40 + 8 * k as usize],
            JobState::Running,
        );
        b.preemptible = true;
        jobs.push(b);
    }
    let p = policy();
    let busy = &g[0..64];
    let (_, baseline) = snapshot(&site, busy, 650.0, &State::default(), &[], t0());
    let grid = [(GRID_EVENT_ACTIVE, 1.0), (GRID_CAP_W, baseline * 0.6)];
    let (snap, _) = snapshot(&site, busy, 650.0, &State::default(), &grid, t0());
    let during = run(&site, &snap, &jobs, &State::default(), &p, t0());
    let suspended: Vec<String> = during.state.suspended.keys().cloned().collect();
    assert!(suspended.len() >= 3, "{suspended:?}");
    // the lowest priority is cut first
    assert!(suspended.contains(&"b0".to_string()), "{suspended:?}");
    for j in jobs.iter_mut().filter(|j| suspended.contains(&j.id)) {
        j.state = JobState::Suspended;
    }
    // the event ends: the meter is under the baseline by what the suspended jobs shed
    let running: Vec<EntityId> = jobs
        .iter()
        .filter(|j| j.state == JobState::Running)
        .flat_map(|j| j.allocated.clone())
        .collect();
    let now = t0() + 3600.0;
    let ended = [(GRID_EVENT_ACTIVE, 0.0)];
    let (snap, _) = snapshot(&site, &running, 650.0, &during.state, &ended, now);
    let after = run(&site, &snap, &jobs, &during.state, &p, now);
    let resumed: Vec<&String> = suspended
        .iter()
        .filter(|j| !after.state.suspended.contains_key(*j))
        .collect();
    assert!(
        !resumed.is_empty(),
        "some come back: {:?}",
        after.state.suspended
    );
    assert!(
        resumed.len() < suspended.len(),
        "not all at once: {:?}",
        after.state.suspended
    );
    // those cut last (the highest priority) first
    let top = suspended
        .iter()
        .max_by_key(|id| jobs.iter().find(|j| &j.id == *id).map(|j| j.priority))
        .expect("one");
    assert!(resumed.contains(&top), "{resumed:?}");
    assert!(
        after.state.suspended.contains_key("b0"),
        "cut first, back last"
    );
    assert!(
        after.state.grid.is_some(),
        "the rebound holds while jobs are suspended"
    );
}

#[test]
fn after_the_event_the_rebound_limit_releases_held_work_only_as_room_allows() {
    let site = site();
    let g = gpus(&site);
    let mut jobs = vec![job("train", "training", 3, &g[0..48], JobState::Running)];
    for k in 0..4 {
        let mut q = job(&format!("q{k}"), "batch", 1, &[], JobState::Pending);
        q.deferrable = true;
        q.gpus = 8;
        jobs.push(q);
    }
    let p = policy();
    let busy = &g[0..48];
    let grid = [(GRID_EVENT_ACTIVE, 1.0), (GRID_SHED_FRACTION, 0.2)];
    let (snap, baseline) = snapshot(&site, busy, 650.0, &State::default(), &grid, t0());
    let during = run(&site, &snap, &jobs, &State::default(), &p, t0());
    assert_eq!(during.state.holds.len(), 4);
    // the event ends: the meter is well under the baseline, with room for some of the
    // held work (each 8-GPU job about 8 × (700 + 125) W)
    let now = t0() + 3600.0;
    let (snap, _) = snapshot(
        &site,
        busy,
        650.0,
        &during.state,
        &[(GRID_EVENT_ACTIVE, 0.0)],
        now,
    );
    let after = run(&site, &snap, &jobs, &during.state, &p, now);
    let m = after.state.grid.as_ref().expect("rebound");
    assert!(!m.event_active());
    assert!((m.target_w - baseline).abs() < 1e-6);
    let released = 4 - after.state.holds.len();
    assert!(
        released >= 1,
        "some work comes back: {:?}",
        after.state.holds
    );
    assert!(released < 4, "not all at once: {:?}", after.state.holds);
    assert!(after
        .decisions
        .iter()
        .any(|d| d.action == Action::Release && d.rule == RULE));
    // past the rebound's time, the work still held keeps it: nothing comes back at
    // once while the meter has no room under the baseline
    let later = now + p.grid.rebound_s + 1.0;
    // the work released has started
    for j in jobs.iter_mut().filter(|j| j.id.starts_with('q')) {
        if !after.state.holds.contains_key(&j.id) {
            j.state = JobState::Running;
        }
    }
    let (snap, _) = snapshot(&site, busy, 650.0, &after.state, &[], later);
    let kept = run(&site, &snap, &jobs, &after.state, &p, later);
    assert!(
        kept.state.grid.is_some(),
        "the rebound ended with work held"
    );
    assert_eq!(kept.state.holds.len(), after.state.holds.len());
    // the training job ends: the room takes the rest, then the rebound is over
    jobs[0].state = JobState::Finished;
    let (snap, _) = snapshot(&site, &[], 650.0, &kept.state, &[], later + 60.0);
    let freed = run(&site, &snap, &jobs, &kept.state, &p, later + 60.0);
    assert!(freed.state.holds.is_empty(), "{:?}", freed.state.holds);
    let (snap, _) = snapshot(&site, &[], 650.0, &freed.state, &[], later + 120.0);
    let done = run(&site, &snap, &jobs, &freed.state, &p, later + 120.0);
    assert!(done.state.grid.is_none());
}

#[test]
fn a_job_near_its_latest_start_is_neither_held_nor_capped() {
    let site = site();
    let g = gpus(&site);
    let mut near = job("near", "batch", 1, &g[0..32], JobState::Running);
    near.deadline = Some(t0() + 3600.0 + 60.0);
    let mut queued = job("qnear", "batch", 1, &[], JobState::Pending);
    queued.deferrable = true;
    queued.deadline = Some(t0() + 3600.0 + 30.0);
    let jobs = vec![
        near,
        queued,
        job("train", "training", 1, &g[32..64], JobState::Running),
    ];
    let grid = [(GRID_EVENT_ACTIVE, 1.0), (GRID_SHED_FRACTION, 0.1)];
    let (snap, _) = snapshot(&site, &g, 650.0, &State::default(), &grid, t0());
    let plan = run(&site, &snap, &jobs, &State::default(), &policy(), t0());
    for x in &g[0..32] {
        assert!(
            plan.state.caps.get(x).is_none(),
            "near-deadline job capped: {x}"
        );
    }
    assert!(
        plan.state.caps.get(&g[40]).is_some(),
        "the other job takes the shed"
    );
    assert!(!plan.state.holds.contains_key("qnear"));
    // a hold never outlasts the job's latest start (less the price rule's margin): 100 s
    // of slack, under the hold's 300 s lease (nothing protected by slack here)
    let mut p = policy();
    p.budget.protect_slack_s = 0.0;
    let margin = p.price.margin_s;
    let mut later = job("qlater", "batch", 1, &[], JobState::Pending);
    later.deferrable = true;
    later.deadline = Some(t0() + (3600.0 + margin + 100.0));
    let plan = run(
        &site,
        &snap,
        std::slice::from_ref(&later),
        &State::default(),
        &p,
        t0(),
    );
    let h = plan
        .state
        .holds
        .get("qlater")
        .expect("held: its latest start is 100 s away");
    assert_eq!(h.lease_until, t0() + 100.0, "{h:?}");
}

mod invariants {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Whatever the jobs, draws and shed: protected work is never capped, held or
        /// suspended by the event; flexible GPUs are never capped under their floor;
        /// and where the controller says the target is reachable, the meter after its
        /// caps and suspensions is under it.
        #[test]
        fn protected_work_is_never_touched_and_a_reachable_target_is_met(
            classes in proptest::collection::vec(0usize..3, 8),
            preemptible in proptest::collection::vec(any::<bool>(), 8),
            draw in 150.0f64..700.0,
            shed in 0.05f64..0.6,
        ) {
            let site = site();
            let g = gpus(&site);
            let names = ["inference", "training", "batch"];
            let mut jobs = Vec::new();
            for (k, c) in classes.iter().enumerate() {
                let mut j = job(&format!("j{k}"), names[*c], k as i32, &g[k * 8..k * 8 + 8], JobState::Running);
                j.preemptible = preemptible[k];
                jobs.push(j);
            }
            let mut q = job("q", "inference", 1, &[], JobState::Pending);
            q.deferrable = true;
            jobs.push(q);
            let grid = [(GRID_EVENT_ACTIVE, 1.0), (GRID_SHED_FRACTION, shed)];
            let (snap, _) = snapshot(&site, &g, draw, &State::default(), &grid, t0());
            let plan = run(&site, &snap, &jobs, &State::default(), &policy(), t0());
            let m = plan.state.grid.clone().expect("event in force");
            let mut suspended_gpus = Vec::new();
            for (k, c) in classes.iter().enumerate() {
                let gs = &g[k * 8..k * 8 + 8];
                let id = format!("j{k}");
                if *c == 0 {
                    for x in gs {
                        prop_assert!(plan.state.caps.get(x).is_none(), "inference GPU {x} capped");
                    }
                    prop_assert!(!plan.state.suspended.contains_key(&id));
                } else {
                    for x in gs {
                        if let Some(cap) = plan.state.caps.get(x) {
                            // the default floor: half of an H100's 700 W default limit
                            prop_assert!(cap.watts >= 350.0 - 1e-6, "{x} capped at {} under its floor", cap.watts);
                        }
                    }
                }
                if plan.state.suspended.contains_key(&id) {
                    prop_assert!(preemptible[k]);
                    suspended_gpus.extend(gs.iter().cloned());
                }
            }
            prop_assert!(!plan.state.holds.contains_key("q"), "protected queued job held");
            if m.shortfall_w == 0.0 {
                let after = meter_after(&site, &g, draw, &plan, &suspended_gpus);
                prop_assert!(after <= m.target_w + 1.0, "meter {} over target {} ({m:?})", after, m.target_w);
            }
        }
    }
}
