use chrono::Datelike;
use chrono_tz::Tz;
use telemetry::prices::Series;
use telemetry::{Job, JobState, Site, Timestamp};

use super::facility::{self, Facility, SimJob};
use super::inputs::alignment;
use super::trace::{self, When};
use crate::curves;

#[test]
fn a_trace_from_another_year_keeps_its_weekday_and_local_hour() {
    let text = "timestamp,duration,num_gpus,gpu_time,cluster\n\
                2017-10-09 07:01:55,66.0,1,66.0,a\n\
                2017-10-29 02:30:00,60.0,1,60.0,a\n\
                2017-12-24 23:00:00,60.0,1,60.0,a\n";
    let (_, jobs) = trace::parse("p.csv", text).expect("trace");
    let tz: Tz = "Europe/Berlin".parse().expect("tz");
    let (align, statement) = alignment(&jobs, tz, Some(2024), Timestamp(0));
    assert!(statement.contains("365 weeks"), "{statement}");
    for j in &jobs {
        let When::Local(orig) = j.submit else {
            panic!("local times")
        };
        let moved = align(&j.submit)
            .to_datetime()
            .with_timezone(&tz)
            .naive_local();
        assert_eq!(moved.year(), 2024);
        assert_eq!(moved.weekday(), orig.weekday());
        assert_eq!(moved.time(), orig.time(), "{orig} -> {moved}");
    }
}

fn managed(jobs: Vec<SimJob>) -> Facility {
    let site = Site::parse(
        "site.toml",
        include_str!("../../../tests/fixtures/backtest/site.toml"),
    )
    .expect("site");
    let start = Timestamp::from_secs(1_717_372_800);
    Facility::new(
        site,
        curves::CurveSet::measured(),
        Series::default(),
        Series::default(),
        jobs,
        1e9,
        Box::new(|_| vec![1.0]),
        start,
    )
    .with_node_power(facility::NodeMode::Managed, Default::default())
}

fn down(node: &str) -> policies::node_power::NodeAction {
    policies::node_power::NodeAction::Down {
        node: node.into(),
        reason: "test".into(),
    }
}

fn power_of(f: &Facility, node: &str) -> policies::node_power::Power {
    f.node_views()
        .into_iter()
        .find(|n| n.id == node)
        .expect("node")
        .power
}

/// Safety invariant 9: a powered-down node comes back when the controller stops
/// renewing its lease.
#[test]
fn a_node_the_controller_stops_renewing_comes_back_after_its_lease() {
    use policies::node_power::Power;
    let mut f = managed(Vec::new());
    let node = f.node_views()[0].id.clone();
    let t0 = f.now();
    f.apply_node_actions(&[down(&node)], t0, 900.0);
    // the controller renews every tick for an hour: the node stays off
    for _ in 0..12 {
        f.step(300.0);
        let now = f.now();
        f.apply_node_actions(&[], now, 900.0);
        assert!(
            matches!(
                power_of(&f, &node),
                Power::Off { .. } | Power::ShuttingDown { .. }
            ),
            "{:?}",
            power_of(&f, &node)
        );
    }
    assert!(matches!(power_of(&f, &node), Power::Off { .. }));
    // the controller dies: within the lease and a boot time the node is on again
    let died = f.now();
    while f.now().secs_since(died) < 900.0 + 300.0 + 300.0 {
        f.step(300.0);
    }
    assert_eq!(power_of(&f, &node), Power::On);
    assert_eq!(f.totals.lease_resumes, 1);
}

/// A training job of the trace, not yet arrived.
fn pending(id: &str, gpus: u32, submit: Timestamp, est_duration_s: f64) -> Job {
    Job {
        id: id.into(),
        scheduler: "trace".into(),
        name: id.into(),
        user: "u".into(),
        project: "p".into(),
        class: "training".into(),
        priority: 0,
        gpus,
        allocated: Vec::new(),
        state: JobState::Pending,
        submit_time: submit,
        start_time: None,
        end_time: None,
        deadline: None,
        est_duration_s,
        deferrable: false,
        preemptible: false,
        gpu_power_limit: None,
    }
}

/// A job that arrives while the nodes it needs are off resumes them and starts
/// after their boot time, with no controller.
#[test]
fn waiting_work_resumes_the_nodes_it_needs_without_a_controller() {
    let start = Timestamp::from_secs(1_717_372_800);
    let job = pending("big", 128, start + 1800.0, 600.0);
    let mut f = managed(vec![SimJob::new(job, 600.0, 0, None)]);
    let t0 = f.now();
    let all: Vec<_> = f.node_views().iter().map(|n| down(&n.id)).collect();
    f.apply_node_actions(&all, t0, 1e6);
    while !f.done() && f.now().secs_since(t0) < 6.0 * 3600.0 {
        f.step(300.0);
    }
    assert!(f.done(), "the job ran");
    let j = &f.jobs[0].job;
    let waited = j.start_time.expect("started").secs_since(j.submit_time);
    assert!(waited >= 300.0, "it waited for the boot: {waited} s");
    assert!(f.totals.power_ups >= 16, "{}", f.totals.power_ups);
}

/// A plan that suspends `ids` until `lease_until`.
fn suspending(ids: &[&str], lease_until: Timestamp) -> policies::State {
    let mut state = policies::State::default();
    for id in ids {
        state.suspended.insert(
            (*id).into(),
            policies::Hold {
                rule: "grid".into(),
                since: lease_until,
                lease_until,
                reason: "test".into(),
            },
        );
    }
    state
}

/// A suspended job stops where it is and keeps its GPUs, which draw their idle power;
/// it runs on when the plan lets it go, or when the suspension's lease ends unrenewed
/// (the controller gone), and finishes as late as it was stopped.
#[test]
fn a_suspended_job_keeps_its_gpus_idle_and_runs_on_when_let_go_or_its_lease_ends() {
    use control::Actuator;
    let start = Timestamp::from_secs(1_717_372_800);
    let job = |id: &str| {
        let mut j = pending(id, 8, start, 3600.0);
        j.preemptible = true;
        SimJob::new(j, 3600.0, 0, None)
    };
    let mut f = Facility::new(
        Site::parse(
            "site.toml",
            include_str!("../../../tests/fixtures/backtest/site.toml"),
        )
        .expect("site"),
        curves::CurveSet::measured(),
        Series::default(),
        Series::default(),
        vec![job("a"), job("b")],
        1e9,
        Box::new(|_| vec![1.0]),
        start,
    );
    f.step(600.0);
    let running_kw = f.it_power_w();
    let done = f.jobs[0].done_s;
    assert!(done > 0.0 && f.jobs[0].job.state == JobState::Running);
    // the plan suspends a for 15 minutes and renews once: it runs nothing for 20 min
    let t = f.now();
    f.apply(&suspending(&["a"], t + 900.0), t);
    assert_eq!(f.jobs[0].job.state, JobState::Suspended);
    assert!(f.it_power_w() < running_kw, "its GPUs idle");
    let changed = f.take_jobs();
    assert!(changed
        .iter()
        .any(|j| j.id == "a" && j.state == JobState::Suspended));
    f.step(600.0);
    let t = f.now();
    f.apply(&suspending(&["a"], t + 900.0), t);
    f.step(600.0);
    assert_eq!(f.jobs[0].done_s, done, "no progress while suspended");
    assert_eq!(f.jobs[0].job.allocated.len(), 8, "it keeps its GPUs");
    assert!((f.totals.suspended_gpu_s - 8.0 * 1200.0).abs() < 1e-6);
    assert_eq!(
        f.jobs[0].suspended_at,
        vec![start + 600.0],
        "one suspension"
    );
    // the plan lets it go: it runs on
    let t = f.now();
    f.apply(&policies::State::default(), t);
    assert_eq!(f.jobs[0].job.state, JobState::Running);
    // b is suspended by a plan that is never renewed: its lease ends and it runs on
    f.apply(&suspending(&["b"], t + 900.0), t);
    f.step(300.0);
    f.step(300.0);
    assert_eq!(f.jobs[1].job.state, JobState::Suspended);
    f.step(300.0);
    assert_eq!(f.jobs[1].job.state, JobState::Running, "the lease ended");
    while !f.done() && f.now().secs_since(start) < 6.0 * 3600.0 {
        f.step(300.0);
    }
    let ran = |k: usize| {
        let j = &f.jobs[k].job;
        j.end_time
            .expect("finished")
            .secs_since(j.start_time.expect("started"))
    };
    // a ran 1200 s suspended, b 900 s (its lease); each finishes that much later
    assert!((ran(0) - (3600.0 + 1200.0)).abs() < 1e-6, "{}", ran(0));
    assert!((ran(1) - (3600.0 + 900.0)).abs() < 1e-6, "{}", ran(1));
}

fn generic_trace(n: usize) -> Vec<trace::TraceJob> {
    let mut text = String::from("id,submit,duration_s,gpus\n");
    for i in 0..n {
        text.push_str(&format!("j{i},{},{},{}\n", i * 60, 600 + i, 1 + i % 8));
    }
    trace::parse("t.csv", &text).expect("trace").1
}

#[test]
fn a_load_factor_subsamples_below_one_and_copies_above_one_keeping_each_jobs_shape() {
    let jobs = generic_trace(2000);
    assert_eq!(
        trace::scaled(jobs.clone(), 1.0),
        jobs,
        "1: the trace as it is"
    );
    let ids = |v: &[trace::TraceJob]| {
        v.iter()
            .map(|j| j.id.clone())
            .collect::<std::collections::BTreeSet<_>>()
    };
    // below 1: a deterministic subsample, nested (5% within 20%), about the share asked
    let small = trace::scaled(jobs.clone(), 0.05);
    let part = trace::scaled(jobs.clone(), 0.2);
    assert_eq!(
        small,
        trace::scaled(jobs.clone(), 0.05),
        "the same on every run"
    );
    assert!(
        (60..=140).contains(&small.len()),
        "5% of 2,000: {}",
        small.len()
    );
    assert!(
        (320..=480).contains(&part.len()),
        "20% of 2,000: {}",
        part.len()
    );
    assert!(ids(&small).is_subset(&ids(&part)));
    assert!(
        small.iter().all(|j| jobs.contains(j)),
        "kept jobs unchanged"
    );
    // above 1: every job twice, half of them three times, copies like their job
    let more = trace::scaled(jobs.clone(), 2.5);
    assert!(
        (4800..=5200).contains(&more.len()),
        "2.5 x 2,000: {}",
        more.len()
    );
    assert_eq!(ids(&more).len(), more.len(), "unique ids");
    for j in &jobs {
        let copies: Vec<_> = more
            .iter()
            .filter(|c| c.id == j.id || c.id.starts_with(&format!("{}+", j.id)))
            .collect();
        assert!(
            (2..=3).contains(&copies.len()),
            "{}: {}",
            j.id,
            copies.len()
        );
        for c in copies {
            assert_eq!(
                (c.submit, c.duration_s, c.gpus, &c.class),
                (j.submit, j.duration_s, j.gpus, &j.class)
            );
        }
    }
}

/// The IT power of the fixture hall with every GPU of `model`, before and while one
/// 8-GPU job of workload `w` runs uncapped.
fn idle_and_busy_w(model: &str, w: usize) -> (f64, f64) {
    let text = include_str!("../../../tests/fixtures/backtest/site.toml")
        .replace("gpu_model = \"A40\"", &format!("gpu_model = \"{model}\""));
    let site = Site::parse("site.toml", &text).expect("site");
    let start = Timestamp::from_secs(1_717_372_800);
    let job = pending("j", 8, start + 600.0, 86400.0);
    let mut f = Facility::new(
        site,
        curves::CurveSet::measured(),
        Series::default(),
        Series::default(),
        vec![SimJob::new(job, 86400.0, w, None)],
        1e9,
        Box::new(|_| vec![1.0]),
        start,
    );
    f.step(300.0);
    let idle = f.it_power_w();
    f.step(600.0);
    f.step(300.0);
    assert_eq!(f.point().busy_gpus, 8, "the job runs");
    (idle, f.it_power_w())
}

/// A hall of several GPU models: each GPU runs a job's workload on its own model's
/// measured curve (Zeus's V100 sweep: 222 W at its 250 W top), not the A40's.
#[test]
fn each_gpu_draws_its_own_models_measurement_of_the_jobs_workload() {
    let set = curves::CurveSet::measured();
    let w = set
        .workloads()
        .iter()
        .position(|c| c.name == "imagenet/resnet50/bs128")
        .expect("resnet50");
    // what 8 GPUs add over idle at their default limit, in watts of the model's sweep
    let busy_w = |model: &str| {
        let g = telemetry::GpuModel::builtin(model).expect("known model");
        let m = set.curve(set.set_of(model), w);
        let max = m.sweep_max_w.unwrap_or(g.max_w);
        8.0 * ((m.curve.at(g.default_w / max).0 * max).max(g.idle_w) - g.idle_w)
    };
    let (a40_idle, a40_busy) = idle_and_busy_w("A40", w);
    let (v100_idle, v100_busy) = idle_and_busy_w("V100", w);
    // the node's base power rises the same for both; the GPUs add their own draw
    let base = (a40_busy - a40_idle) - busy_w("A40");
    assert!(base > 0.0, "the node's base power rises with work: {base}");
    let v100_added = v100_busy - v100_idle - base;
    assert!(
        (v100_added - busy_w("V100")).abs() < 1e-6,
        "V100s draw {v100_added} W over idle, their curve says {}",
        busy_w("V100")
    );
    assert!(
        (busy_w("V100") - busy_w("A40")).abs() > 50.0,
        "the models differ"
    );
}
