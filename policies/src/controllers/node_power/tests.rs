use super::*;
use proptest::prelude::*;

fn t(s: f64) -> Timestamp {
    Timestamp::from_secs(1_700_000_000) + s
}

fn node(i: usize, free: u32, power: Power, idle_since: Option<f64>) -> NodeView {
    NodeView {
        id: format!("n{i}"),
        model: "A40".into(),
        gpus: 8,
        free,
        power,
        idle_since: idle_since.map(t),
    }
}

fn rule() -> NodePowerRule {
    NodePowerRule {
        enabled: true,
        reserve_gpus: 8,
        reserve_share: 0.0,
        idle_s: 600.0,
        max_downs_per_min: 100,
        ..Default::default()
    }
}

fn downs(a: &[NodeAction]) -> Vec<&str> {
    a.iter()
        .filter(|a| matches!(a, NodeAction::Down { .. }))
        .map(NodeAction::node)
        .collect()
}

fn ups(a: &[NodeAction]) -> Vec<&str> {
    a.iter()
        .filter(|a| matches!(a, NodeAction::Up { .. }))
        .map(NodeAction::node)
        .collect()
}

#[test]
fn idle_nodes_beyond_the_reserve_are_powered_down_busy_ones_never() {
    let nodes = vec![
        node(0, 0, Power::On, None),
        node(1, 8, Power::On, Some(0.0)),
        node(2, 8, Power::On, Some(0.0)),
        node(3, 8, Power::On, Some(0.0)),
    ];
    let a = decide(&nodes, &[], &rule(), Inputs::default(), t(1000.0));
    // one idle node stays on: the reserve of 8 GPUs
    assert_eq!(downs(&a), vec!["n1", "n2"]);
    // not idle long enough: nothing
    let a = decide(&nodes, &[], &rule(), Inputs::default(), t(500.0));
    assert!(a.is_empty(), "{a:?}");
}

#[test]
fn planned_work_within_the_boot_time_keeps_nodes_on_and_brings_them_back() {
    let nodes = vec![
        node(0, 8, Power::On, Some(0.0)),
        node(1, 8, Power::On, Some(0.0)),
        node(2, 8, Power::Off { since: t(900.0) }, None),
    ];
    // 16 GPUs due in 200 s (boot 300 s): both idle nodes stay on, and the reserve
    // would want the off node, but it has not been off min_off_s
    let need = [Need {
        at: t(1200.0),
        gpus: 16,
        model: None,
    }];
    let a = decide(&nodes, &need, &rule(), Inputs::default(), t(1000.0));
    assert!(downs(&a).is_empty(), "{a:?}");
    assert!(ups(&a).is_empty(), "{a:?}");
    // 24 GPUs due: the off node comes back at once (work does not wait for min_off_s)
    let need = [Need {
        at: t(1200.0),
        gpus: 24,
        model: None,
    }];
    let a = decide(&nodes, &need, &rule(), Inputs::default(), t(1000.0));
    assert_eq!(ups(&a), vec!["n2"]);
    // work due later than a boot time does not keep nodes on
    let need = [Need {
        at: t(5000.0),
        gpus: 16,
        model: None,
    }];
    let a = decide(&nodes, &need, &rule(), Inputs::default(), t(1000.0));
    assert_eq!(downs(&a), vec!["n0"]);
}

#[test]
fn power_downs_are_rate_limited_and_expensive_hours_shorten_the_idle_time() {
    let nodes: Vec<NodeView> = (0..10).map(|i| node(i, 8, Power::On, Some(0.0))).collect();
    let mut r = rule();
    r.max_downs_per_min = 3;
    let a = decide(&nodes, &[], &r, Inputs::default(), t(1000.0));
    assert_eq!(downs(&a).len(), 3);
    let a = decide(
        &nodes,
        &[],
        &r,
        Inputs {
            downs_last_min: 2,
            ..Inputs::default()
        },
        t(1000.0),
    );
    assert_eq!(downs(&a).len(), 1);
    r.idle_s_expensive = Some(120.0);
    let cheap = decide(&nodes, &[], &r, Inputs::default(), t(300.0));
    assert!(cheap.is_empty());
    let dear = decide(
        &nodes,
        &[],
        &r,
        Inputs {
            expensive: true,
            ..Inputs::default()
        },
        t(300.0),
    );
    assert_eq!(downs(&dear).len(), 3);
    // during a grid event, nodes idle for any time at all go down (rate limited)
    let at = |idle_for: f64| {
        let nodes: Vec<NodeView> = (0..10).map(|i| node(i, 8, Power::On, Some(0.0))).collect();
        decide(
            &nodes,
            &[],
            &r,
            Inputs {
                grid_event: true,
                ..Inputs::default()
            },
            t(idle_for),
        )
    };
    assert_eq!(downs(&at(1.0)).len(), 3);
    assert!(decide(&nodes, &[], &r, Inputs::default(), t(1.0)).is_empty());
}

#[test]
fn a_node_not_back_in_time_is_marked_failed_and_replaced() {
    let nodes = vec![
        node(0, 0, Power::On, None),
        node(1, 8, Power::Booting { since: t(0.0) }, None),
        node(2, 8, Power::Off { since: t(0.0) }, None),
    ];
    let need = [Need {
        at: t(1000.0),
        gpus: 8,
        model: None,
    }];
    let a = decide(&nodes, &need, &rule(), Inputs::default(), t(1000.0));
    assert!(a
        .iter()
        .any(|a| matches!(a, NodeAction::Failed { node, .. } if node == "n1")));
    assert_eq!(ups(&a), vec!["n2"]);
}

#[test]
fn a_disabled_rule_brings_every_node_back() {
    let nodes = vec![node(0, 8, Power::Off { since: t(0.0) }, None)];
    let a = decide(
        &nodes,
        &[],
        &NodePowerRule::default(),
        Inputs::default(),
        t(10.0),
    );
    assert_eq!(ups(&a), vec!["n0"]);
}

fn arb_node() -> impl Strategy<Value = (u32, u8, f64)> {
    (0u32..=8, 0u8..4, 0.0f64..3000.0)
}

proptest! {
    /// Never a node powered down that runs work, nor one whose GPUs the work due
    /// within its boot time needs: after the decision, the GPUs on (or booting) cover
    /// every need due within the boot time, or every node that could was powered up.
    #[test]
    fn never_a_powered_down_node_that_due_work_needs(
        spec in proptest::collection::vec(arb_node(), 1..20),
        needs in proptest::collection::vec((0.0f64..2000.0, 1u32..24), 0..6),
        downs_last_min in 0u32..4,
    ) {
        let now = t(3000.0);
        let nodes: Vec<NodeView> = spec
            .iter()
            .enumerate()
            .map(|(i, &(free, p, s))| {
                let power = match p {
                    0 | 1 => Power::On,
                    2 => Power::Off { since: t(s) },
                    _ => Power::Booting { since: t(2900.0) },
                };
                let free = if power == Power::On { free } else { 8 };
                node(i, free, power, (free == 8).then_some(s))
            })
            .collect();
        let needs: Vec<Need> = needs
            .iter()
            .map(|&(at, gpus)| Need { at: now + at, gpus, model: None })
            .collect();
        let r = rule();
        let a = decide(&nodes, &needs, &r, Inputs { downs_last_min, ..Inputs::default() }, now);
        let down = downs(&a);
        let up = ups(&a);
        for n in &nodes {
            if down.contains(&n.id.as_str()) {
                prop_assert!(n.free == n.gpus && n.power == Power::On, "{n:?} powered down");
            }
        }
        let due: u32 = needs
            .iter()
            .filter(|d| d.at.secs_since(now) <= r.boot_s + r.shutdown_s)
            .map(|d| d.gpus)
            .sum();
        let supply: u32 = nodes
            .iter()
            .filter(|n| !down.contains(&n.id.as_str()))
            .filter(|n| {
                matches!(n.power, Power::On | Power::Booting { .. })
                    || up.contains(&n.id.as_str())
            })
            .map(|n| n.free)
            .sum();
        let off_left = nodes
            .iter()
            .filter(|n| matches!(n.power, Power::Off { .. }) && !up.contains(&n.id.as_str()))
            .count();
        prop_assert!(supply >= due || off_left == 0, "{supply} on for {due} due, {off_left} off left");
        prop_assert!(down.len() as u32 <= r.max_downs_per_min.saturating_sub(downs_last_min));
    }
}

fn of_model(i: usize, model: &str, power: Power) -> NodeView {
    NodeView {
        model: model.into(),
        ..node(i, 8, power, Some(0.0))
    }
}

#[test]
fn work_that_may_run_on_any_model_keeps_its_gpus_on_once_not_on_every_model() {
    // three models of four idle nodes each, no reserve; 16 GPUs of any-model work due
    let mut nodes = Vec::new();
    for (k, model) in ["A40", "V100", "P100"].iter().enumerate() {
        for j in 0..4 {
            nodes.push(of_model(4 * k + j, model, Power::On));
        }
    }
    let r = NodePowerRule {
        reserve_gpus: 0,
        ..rule()
    };
    let need = [Need {
        at: t(1000.0),
        gpus: 16,
        model: None,
    }];
    let a = decide(&nodes, &need, &r, Inputs::default(), t(1000.0));
    // 16 GPUs stay on (two nodes), not 16 on each of the three models
    assert_eq!(downs(&a).len(), 10, "{a:?}");
    assert!(ups(&a).is_empty());
    // work bound to a model still counts on that model alone
    let need = [
        Need {
            at: t(1000.0),
            gpus: 8,
            model: Some("V100".into()),
        },
        Need {
            at: t(1000.0),
            gpus: 8,
            model: None,
        },
    ];
    let a = decide(&nodes, &need, &r, Inputs::default(), t(1000.0));
    assert_eq!(downs(&a).len(), 10, "{a:?}");
    let down = downs(&a);
    let v100_on = nodes
        .iter()
        .filter(|n| n.model == "V100" && !down.contains(&n.id.as_str()))
        .count();
    assert!(v100_on >= 1, "the V100 work keeps a V100 node: {a:?}");
}

#[test]
fn work_for_any_model_takes_an_idle_node_of_another_model_before_one_is_brought_back() {
    // A40: one node off; V100: two idle nodes on. 8 GPUs of any-model work due now.
    let nodes = vec![
        of_model(0, "A40", Power::Off { since: t(0.0) }),
        of_model(1, "V100", Power::On),
        of_model(2, "V100", Power::On),
    ];
    let r = NodePowerRule {
        reserve_gpus: 0,
        ..rule()
    };
    let need = [Need {
        at: t(1000.0),
        gpus: 8,
        model: None,
    }];
    let a = decide(&nodes, &need, &r, Inputs::default(), t(1000.0));
    assert!(
        ups(&a).is_empty(),
        "no power-up while a V100 is idle: {a:?}"
    );
    assert_eq!(downs(&a), vec!["n1"], "{a:?}");
    // 24 GPUs: both V100s stay and the A40 comes back for the rest
    let need = [Need {
        at: t(1000.0),
        gpus: 24,
        model: None,
    }];
    let a = decide(&nodes, &need, &r, Inputs::default(), t(1000.0));
    assert_eq!(ups(&a), vec!["n0"], "{a:?}");
    assert!(downs(&a).is_empty(), "{a:?}");
}

#[test]
fn work_for_any_model_and_the_reserve_go_to_the_models_the_site_lists_first() {
    // the site lists its A40 nodes first (the scheduler prefers them): with both
    // models' nodes off, work for any model brings an A40 back, not a P100
    let nodes = vec![
        of_model(0, "A40", Power::Off { since: t(0.0) }),
        of_model(1, "A40", Power::Off { since: t(0.0) }),
        of_model(2, "P100", Power::Off { since: t(0.0) }),
        of_model(3, "P100", Power::Off { since: t(0.0) }),
        of_model(4, "P100", Power::Off { since: t(0.0) }),
    ];
    let r = NodePowerRule {
        reserve_gpus: 0,
        ..rule()
    };
    let need = |gpus| {
        [Need {
            at: t(1000.0),
            gpus,
            model: None,
        }]
    };
    let a = decide(&nodes, &need(8), &r, Inputs::default(), t(1000.0));
    assert_eq!(ups(&a), vec!["n0"], "{a:?}");
    // more than the A40s hold: both A40s, then a P100
    let a = decide(&nodes, &need(20), &r, Inputs::default(), t(1000.0));
    assert_eq!(ups(&a), vec!["n0", "n1", "n2"], "{a:?}");
    // idle nodes of both models on: the work keeps an A40 on, the idle P100s go down
    let on: Vec<NodeView> = nodes
        .iter()
        .map(|n| NodeView {
            power: Power::On,
            idle_since: Some(t(0.0)),
            ..n.clone()
        })
        .collect();
    // one A40 goes down and one stays; every P100 goes down
    let one_a40_stays = |a: &[NodeAction], why: &str| {
        let d = downs(a);
        let a40s_down = d.iter().filter(|n| ["n0", "n1"].contains(n)).count();
        assert_eq!(a40s_down, 1, "one A40 stays on for {why}: {a:?}");
        assert!(
            d.contains(&"n2") && d.contains(&"n3") && d.contains(&"n4"),
            "{a:?}"
        );
    };
    let a = decide(&on, &need(8), &r, Inputs::default(), t(1000.0));
    one_a40_stays(&a, "the work");
    // the warm reserve likewise stays on the first model
    let r = NodePowerRule {
        reserve_gpus: 8,
        ..rule()
    };
    let a = decide(&on, &[], &r, Inputs::default(), t(1000.0));
    one_a40_stays(&a, "the reserve");
}

fn a_job(state: telemetry::JobState, submit: f64, gpus: u32) -> telemetry::Job {
    telemetry::Job {
        id: format!("j{submit}"),
        scheduler: "test".into(),
        name: "j".into(),
        user: "u".into(),
        project: "p".into(),
        class: "batch".into(),
        priority: 0,
        gpus,
        allocated: Vec::new(),
        state,
        submit_time: t(submit),
        start_time: None,
        end_time: None,
        deadline: None,
        est_duration_s: 3600.0,
        deferrable: true,
        preemptible: false,
        gpu_power_limit: None,
    }
}

#[test]
fn the_forecast_reserve_is_what_arrives_within_a_boot_time_at_most_the_configured_one() {
    let nodes: Vec<NodeView> = (0..4).map(|i| node(i, 8, Power::On, Some(0.0))).collect();
    let r = NodePowerRule {
        reserve_gpus: 16,
        ..rule()
    };
    let with = |rate: Option<f64>, r: &NodePowerRule| {
        let inputs = Inputs {
            arrivals_gpus_per_s: rate,
            ..Inputs::default()
        };
        downs(&decide(&nodes, &[], r, inputs, t(1000.0))).len()
    };
    // nothing submitted lately: no node kept warm
    assert_eq!(with(Some(0.0), &r), 4);
    // a trickle (2 GPUs an hour), or less than a node's worth, keeps none
    assert_eq!(with(Some(2.0 / 3600.0), &r), 4);
    assert_eq!(with(Some(7.0 / 360.0), &r), 4);
    // 8 GPUs within a boot and a shutdown time (360 s): one node
    assert_eq!(with(Some(8.0 / 360.0), &r), 3);
    // a flood: at most the configured 16 GPUs
    assert_eq!(with(Some(1.0), &r), 2);
    // not measured: the configured reserve
    assert_eq!(with(None, &r), 2);
    // `reserve = "fixed"`: always the configured reserve
    let fixed = NodePowerRule {
        reserve: ReserveMode::Fixed,
        ..r.clone()
    };
    assert_eq!(with(Some(0.0), &fixed), 2);
}

#[test]
fn the_arrival_rate_counts_the_gpus_submitted_within_the_window() {
    use telemetry::JobState::*;
    let jobs = [
        a_job(Pending, 100.0, 8),
        a_job(Running, 3000.0, 4),
        a_job(Finished, 3500.0, 4),
        // before the window and after now: not counted
        a_job(Running, -10.0, 64),
        a_job(Pending, 3700.0, 64),
    ];
    let rate = arrival_rate(&jobs, t(3600.0), 3600.0);
    assert!((rate - 16.0 / 3600.0).abs() < 1e-12, "{rate}");
}

#[test]
fn a_held_job_is_due_at_its_planned_start_else_its_latest_start_else_never() {
    use telemetry::JobState::*;
    let now = t(1000.0);
    assert_eq!(due_at(&a_job(Pending, 0.0, 8), None, now), Some(now));
    assert_eq!(
        due_at(&a_job(Held, 0.0, 8), Some(t(5000.0)), now),
        Some(t(5000.0))
    );
    // a deadline: due at its latest start (the deadline less its run time)
    let mut j = a_job(Held, 0.0, 8);
    j.deadline = Some(t(10_000.0));
    assert_eq!(due_at(&j, None, now), Some(t(10_000.0 - 3600.0)));
    // past it already: due now
    j.deadline = Some(t(2000.0));
    assert_eq!(due_at(&j, None, now), Some(now));
    // a hold with no end in sight keeps no node on
    assert_eq!(due_at(&a_job(Held, 0.0, 8), None, now), None);
    assert_eq!(due_at(&a_job(Running, 0.0, 8), None, now), None);
}

#[test]
fn decisions_minutes_apart_may_power_down_a_minutes_worth_for_each_minute() {
    let nodes: Vec<NodeView> = (0..40).map(|i| node(i, 8, Power::On, Some(0.0))).collect();
    let r = NodePowerRule {
        reserve_gpus: 0,
        max_downs_per_min: 4,
        ..rule()
    };
    let with = |interval_s: f64, downs_last_min: u32| {
        let inputs = Inputs {
            interval_s,
            downs_last_min,
            ..Inputs::default()
        };
        downs(&decide(&nodes, &[], &r, inputs, t(1000.0))).len()
    };
    assert_eq!(with(0.0, 0), 4, "seconds apart: a minute's worth");
    assert_eq!(with(30.0, 0), 4);
    assert_eq!(
        with(300.0, 0),
        20,
        "five minutes apart: five minutes' worth"
    );
    assert_eq!(with(300.0, 3), 17);
}
