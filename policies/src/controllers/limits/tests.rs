use std::sync::Arc;

use telemetry::metric::names::POWER_W;
use telemetry::{EntityId, Job, JobState, PowerLimit, Sample, Site, Snapshot, Timestamp};

use super::RULE;
use crate::plan::State;
use crate::{evaluate, Inputs, Policy};

/// One rack of two 8-GPU H100 nodes (700 W default, 200 W minimum), budgets far above
/// what they draw: only the limits act.
const SITE: &str = r#"
version = 1
[site]
name = "l"
[[feeds]]
id = "f"
rating_kw = 400
derate = 1.0
[[cooling]]
id = "c"
capacity_kw = 400
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
gpu_model = "H100"
"#;

fn t0() -> Timestamp {
    Timestamp::from_secs(1_800_000_000)
}

fn job(id: &str, class: &str, gpus: &[EntityId], limit: Option<&str>) -> Job {
    Job {
        id: id.into(),
        scheduler: "kubernetes".into(),
        name: id.into(),
        user: "u".into(),
        project: "p".into(),
        class: class.into(),
        priority: 0,
        gpus: gpus.len() as u32,
        allocated: gpus.to_vec(),
        state: JobState::Running,
        submit_time: t0(),
        start_time: Some(t0()),
        end_time: None,
        deadline: None,
        est_duration_s: 3600.0,
        deferrable: false,
        preemptible: false,
        gpu_power_limit: limit.map(|l| PowerLimit::parse(l).expect("limit")),
    }
}

fn policy(extra: &str) -> Policy {
    Policy::parse(
        "p.toml",
        &format!("version = 1\n[thermal]\nenabled = false\n[price]\nenabled = false\n{extra}"),
    )
    .expect("policy")
}

/// The caps in force after `ticks` evaluations (caps step down over ticks).
fn settle(site: &Site, jobs: &[Job], p: &Policy, ticks: u32) -> State {
    let mut snap = Snapshot::new();
    for g in site.gpus() {
        snap.ingest(
            Sample::new(EntityId::clone(&g.id), POWER_W, 650.0, t0(), "t"),
            t0(),
        )
        .expect("ok");
    }
    let forecast = crate::Forecast::default();
    let mut prior = State::default();
    for k in 0..ticks {
        let now = t0().plus_secs(f64::from(k) * 15.0);
        prior = evaluate(
            &Inputs {
                site,
                snapshot: &snap,
                jobs,
                prior: &prior,
                policy: p,
                forecast: &forecast,
                job_table: None,
            },
            now,
        )
        .state;
    }
    prior
}

fn cap(state: &State, g: &EntityId) -> Option<(f64, Arc<str>)> {
    state.caps.get(g).map(|c| (c.watts, c.rule.clone()))
}

#[test]
fn a_job_is_capped_at_its_own_limit_or_its_class_whichever_is_lower() {
    let site = Site::parse("l.toml", SITE).expect("site");
    let g: Vec<EntityId> = site.gpus().into_iter().map(|g| g.id.into_owned()).collect();
    let p = policy("[limits]\nclasses = { inference = \"400W\", training = \"50%\" }\n");
    let jobs = [
        // its own 300 W under its class's 400 W
        job("k8s:ml/a", "inference", &g[0..2], Some("300W")),
        // its own 80 % (560 W) over its class's 50 % (350 W)
        job("k8s:ml/b", "training", &g[2..4], Some("80%")),
        // no limit of its own: its class's
        job("k8s:ml/c", "inference", &g[4..5], None),
        // below the GPU's minimum: raised to it
        job("k8s:ml/d", "batch", &g[5..6], Some("50W")),
        // no limit anywhere: not capped
        job("k8s:ml/e", "batch", &g[6..8], None),
    ];
    let s = settle(&site, &jobs, &p, 20);
    let rule: Arc<str> = Arc::from(RULE);
    assert_eq!(cap(&s, &g[0]), Some((300.0, rule.clone())));
    assert_eq!(cap(&s, &g[1]), Some((300.0, rule.clone())));
    assert_eq!(cap(&s, &g[2]), Some((350.0, rule.clone())));
    assert_eq!(cap(&s, &g[4]), Some((400.0, rule.clone())));
    let min = site.gpus()[5].model.min_w;
    assert_eq!(cap(&s, &g[5]), Some((min, rule.clone())));
    assert_eq!(cap(&s, &g[6]), None);
    assert_eq!(cap(&s, &g[8]), None, "a GPU no job holds");
    // with `jobs = false` only the classes count
    let p = policy("[limits]\njobs = false\nclasses = { inference = \"400W\" }\n");
    let s = settle(&site, &jobs, &p, 20);
    assert_eq!(cap(&s, &g[0]), Some((400.0, rule.clone())));
    assert_eq!(cap(&s, &g[2]), None);
}

#[test]
fn a_more_protective_cap_of_another_rule_wins_over_a_limit() {
    let site = Site::parse("l.toml", SITE).expect("site");
    let g: Vec<EntityId> = site.gpus().into_iter().map(|g| g.id.into_owned()).collect();
    // an SRE rule caps every GPU at 250 W; the pod asks 300 W: 250 W stays
    let p = policy(
        "[[rules]]\nname = \"cap-all\"\nscope = \"site\"\nwhen = \"power_w > 0\"\naction = { cap_w = 250 }\n",
    );
    let jobs = [job("k8s:ml/a", "inference", &g[0..1], Some("300W"))];
    let s = settle(&site, &jobs, &p, 20);
    assert_eq!(s.caps.get(&g[0]).map(|c| c.watts), Some(250.0));
    assert_ne!(s.caps.get(&g[0]).map(|c| c.rule.as_ref()), Some(RULE));
    // a pod asking less than the rule: the pod's limit wins
    let jobs = [job("k8s:ml/a", "inference", &g[0..1], Some("220W"))];
    let s = settle(&site, &jobs, &p, 20);
    assert_eq!(
        s.caps.get(&g[0]).map(|c| (c.watts, c.rule.as_ref())),
        Some((220.0, RULE))
    );
}

#[test]
fn a_limit_ends_with_its_job_and_bad_limits_are_refused_at_the_policy() {
    let site = Site::parse("l.toml", SITE).expect("site");
    let g: Vec<EntityId> = site.gpus().into_iter().map(|g| g.id.into_owned()).collect();
    let p = policy("");
    let mut jobs = vec![job("k8s:ml/a", "inference", &g[0..1], Some("300W"))];
    let s = settle(&site, &jobs, &p, 20);
    assert!(s.caps.contains_key(&g[0]));
    jobs[0].state = JobState::Finished;
    let s = settle(&site, &jobs, &p, 40);
    assert!(!s.caps.contains_key(&g[0]), "{:?}", s.caps.get(&g[0]));
    for bad in [
        "[limits]\nclasses = { inference = \"0W\" }\n",
        "[limits]\nclasses = { inference = \"120%\" }\n",
        "[limits]\nclasses = { inference = \"fast\" }\n",
        "[limits]\nlease_s = 1\n",
        "[limits]\nbogus = 1\n",
    ] {
        let e = Policy::parse("p.toml", &format!("version = 1\n{bad}")).expect_err(bad);
        let e = e.to_string();
        assert!(
            e.contains("p.toml:")
                && [
                    "limits",
                    "watts",
                    "percentage",
                    "power limit",
                    "unknown field"
                ]
                .iter()
                .any(|w| e.contains(w)),
            "{bad}: {e}"
        );
    }
}
