use super::*;
use policies::plan::Cap;
use telemetry::agent_proto::{GpuOutcome, GpuReport};
use telemetry::gpu_backend::GpuReading;

const SITE: &str = r#"
version = 1
[site]
name = "t"
[[feeds]]
id = "f"
rating_kw = 30
[[cooling]]
id = "c"
capacity_kw = 30
racks = ["r1"]
[[rooms]]
id = "h"
[[rows]]
id = "w"
room = "h"
[[racks]]
id = "r1"
row = "w"
power_budget_kw = 20
nodes = 2
gpus_per_node = 2
gpu_model = "A40"
"#;

fn key() -> Key {
    Key::from_text(&"7c".repeat(32)).expect("key")
}

fn at(s: f64) -> Timestamp {
    Timestamp::from_secs(1_790_000_000).plus_secs(s)
}

fn fleet() -> (Fleet, Site) {
    let site = Site::parse("t.toml", SITE).expect("site");
    (
        Fleet::new(
            &site,
            key(),
            Topics::default(),
            FleetConfig::default(),
            at(0.0),
        ),
        site,
    )
}

fn capped(site: &Site, gpus: &[usize], watts: f64) -> State {
    let all = site.gpus();
    let mut s = State::default();
    for i in gpus {
        s.caps.insert(
            all[*i].id.clone().into_owned(),
            Cap {
                watts,
                rule: "budget".into(),
                since: at(0.0),
                lease_until: at(600.0),
            },
        );
    }
    s
}

fn open(out: &[(String, Vec<u8>)]) -> Vec<(String, Command)> {
    out.iter()
        .map(|(t, p)| {
            (
                t.clone(),
                Command::open(&key(), p).expect("signed with the site key"),
            )
        })
        .collect()
}

fn ack_all(f: &mut Fleet, cmds: &[(String, Command)], now: Timestamp) {
    for (_, c) in cmds {
        let gpus = match &c.action {
            Action::SetPowerLimit {
                gpus: GpuSel::List(l),
                ..
            }
            | Action::Reset {
                gpus: GpuSel::List(l),
            } => l.clone(),
            _ => unreachable!("the controller names its GPUs"),
        };
        let watts = match &c.action {
            Action::SetPowerLimit { watts, .. } => *watts,
            _ => Some(300.0),
        };
        let ack = Ack {
            v: VERSION,
            node: c.node.clone(),
            id: Some(c.id.clone()),
            time: now,
            status: AckStatus::Applied,
            reason: None,
            detail: None,
            lease_until: Some(c.issued_at.plus_secs(c.lease_s)),
            gpus: gpus
                .iter()
                .map(|i| GpuOutcome {
                    index: *i,
                    applied_w: watts,
                    applied_mhz: None,
                    clamped: false,
                    error: None,
                })
                .collect(),
        };
        let topic = Topics::default().topic(&c.node, Channel::Ack);
        f.on_message(&topic, &ack.seal(&key()), now);
    }
}

#[test]
fn every_gpu_gets_a_leased_command_capped_ones_a_limit_the_rest_a_reset() {
    let (mut f, site) = fleet();
    let cmds = open(&f.commands(&capped(&site, &[0, 3], 180.0), at(0.0)));
    // two nodes, each with one capped and one uncapped GPU: four commands
    assert_eq!(cmds.len(), 4);
    assert!(cmds
        .iter()
        .all(|(_, c)| c.lease_s == 90.0 && c.issued_at == at(0.0)));
    let limits: Vec<_> = cmds
        .iter()
        .filter_map(|(t, c)| match &c.action {
            Action::SetPowerLimit { gpus, watts, .. } => Some((t.clone(), gpus.clone(), *watts)),
            _ => None,
        })
        .collect();
    let g = site.gpus();
    assert_eq!(
        limits,
        vec![
            (
                format!("powerplane/v1/nodes/{}/cmd", g[0].node.id),
                GpuSel::List(vec![g[0].index]),
                Some(180.0)
            ),
            (
                format!("powerplane/v1/nodes/{}/cmd", g[3].node.id),
                GpuSel::List(vec![g[3].index]),
                Some(180.0)
            ),
        ]
    );
    let ids: std::collections::BTreeSet<_> = cmds.iter().map(|(_, c)| c.id.clone()).collect();
    assert_eq!(ids.len(), 4, "every command has its own id");
}

#[test]
fn a_clock_lock_is_sent_as_a_locked_clock_unless_the_gpu_is_capped() {
    let (mut f, site) = fleet();
    let g = site.gpus();
    let mut state = capped(&site, &[0], 180.0);
    for i in [0, 1] {
        state.clocks.insert(
            g[i].id.clone().into_owned(),
            policies::ClockLock {
                mhz: 1200.0,
                rule: "rules.slow".into(),
                since: at(0.0),
                lease_until: at(300.0),
            },
        );
    }
    let cmds = open(&f.commands(&state, at(0.0)));
    let for_gpu = |i: u32, node: &str| {
        cmds.iter()
            .find(|(t, c)| t.contains(node) && c.action.gpus().contains(i))
            .map(|(_, c)| c.action.clone())
            .expect("a command for every GPU")
    };
    assert!(matches!(
        for_gpu(g[0].index, &g[0].node.id),
        Action::SetPowerLimit { watts: Some(w), .. } if w == 180.0
    ));
    assert!(matches!(
        for_gpu(g[1].index, &g[1].node.id),
        Action::LockSmClocks { min_mhz, max_mhz, .. } if min_mhz == 1200.0 && max_mhz == 1200.0
    ));
}

#[test]
fn unacknowledged_commands_are_retried_with_backoff_and_acknowledged_ones_renewed() {
    let (mut f, site) = fleet();
    let state = capped(&site, &[0], 200.0);
    let first = open(&f.commands(&state, at(0.0)));
    assert!(
        f.commands(&state, at(4.0)).is_empty(),
        "nothing before retry_s"
    );
    let retry = open(&f.commands(&state, at(5.0)));
    assert_eq!(retry.len(), first.len(), "no ack: everything again");
    assert!(
        f.commands(&state, at(14.0)).is_empty(),
        "the second retry waits twice as long"
    );
    assert_eq!(f.commands(&state, at(15.0)).len(), first.len());
    assert_eq!(
        f.counters.get("commands_retried"),
        Some(&(2 * first.len() as u64))
    );

    let (mut f, site) = fleet();
    let cmds = open(&f.commands(&state, at(0.0)));
    ack_all(&mut f, &cmds, at(0.2));
    assert!(
        f.commands(&state, at(29.0)).is_empty(),
        "acknowledged: quiet until renewal"
    );
    assert_eq!(
        f.commands(&state, at(30.0)).len(),
        cmds.len(),
        "renewed before the 90 s lease ends"
    );
    // a new cap goes out at once, whatever the renewal clock says
    let changed = open(&f.commands(&capped(&site, &[0], 150.0), at(31.0)));
    assert_eq!(changed.len(), 1);
    assert!(
        matches!(changed[0].1.action, Action::SetPowerLimit { watts: Some(w), .. } if w == 150.0)
    );
}

#[test]
fn acks_with_a_bad_signature_are_refused_and_reports_become_samples() {
    let (mut f, site) = fleet();
    let state = capped(&site, &[0], 200.0);
    let cmds = open(&f.commands(&state, at(0.0)));
    let g0 = &site.gpus()[0];
    let forged = Ack {
        v: VERSION,
        node: g0.node.id.clone(),
        id: Some(cmds[0].1.id.clone()),
        time: at(0.1),
        status: AckStatus::Applied,
        reason: None,
        detail: None,
        lease_until: None,
        gpus: vec![],
    };
    let other = Key::from_text("not the site key but long enough").expect("key");
    let topic = Topics::default().topic(&g0.node.id, Channel::Ack);
    f.on_message(&topic, &forged.seal(&other), at(0.1));
    assert_eq!(f.counters.get("acks_bad_signature"), Some(&1));
    assert!(f.books().all(|b| !b.sent.as_ref().is_some_and(|s| s.acked)));

    ack_all(&mut f, &cmds, at(0.2));
    let reading = GpuReading {
        index: g0.index,
        uuid: "GPU-x".into(),
        name: "A40".into(),
        power_w: 190.0,
        energy_j: Some(1e6),
        temp_c: 61.0,
        sm_clock_mhz: 1500.0,
        mem_clock_mhz: 7000.0,
        utilization_pct: 99.0,
        power_limit_w: 200.0,
        default_limit_w: 300.0,
        min_limit_w: 100.0,
        max_limit_w: 300.0,
        throttle_reasons: vec![],
        pids: vec![],
        sm_clock_min_mhz: 210.0,
        sm_clock_max_mhz: 1740.0,
    };
    let report = NodeReport {
        v: VERSION,
        node: g0.node.id.clone(),
        time: at(1.0),
        seq: 1,
        backend: "sim".into(),
        gpus: vec![GpuReport {
            reading,
            processes: vec![],
            desired: None,
            pods: vec![],
        }],
        errors: vec![],
    };
    let topic = Topics::default().topic(&g0.node.id, Channel::Gpus);
    let samples = f.on_message(&topic, &serde_json::to_vec(&report).expect("json"), at(1.0));
    let power = samples
        .iter()
        .find(|s| s.metric.as_str() == POWER_W)
        .expect("power");
    assert_eq!(
        (power.entity.clone(), power.value),
        (g0.id.clone().into_owned(), 190.0)
    );
    assert!(samples
        .iter()
        .any(|s| s.metric.as_str() == ENERGY_J && s.value == 1e6));
    let book = f.books().find(|b| b.gpu == *g0.id).expect("book");
    assert_eq!(
        (book.applied_w, book.enforced_w),
        (Some(200.0), Some(200.0))
    );
    assert!(book.in_sync());
    f.on_message(&topic, b"{garbage", at(2.0));
    assert_eq!(f.counters.get("reports_malformed"), Some(&1));
}

#[test]
fn messages_from_nodes_the_site_does_not_know_are_refused_and_counted() {
    let (mut f, _) = fleet();
    let t = Topics::default();
    let health = br#"{"v":1,"node":"x","status":"online","time":null,"dry_run":false,"fail_safe_gpus":[],"counters":{}}"#;
    for i in 0..2000 {
        let node = format!("made-up-{i}");
        f.on_message(&t.topic(&node, Channel::Health), health, at(1.0));
        let report = f.on_message(&t.topic(&node, Channel::Gpus), b"{}", at(1.0));
        assert!(report.is_empty());
    }
    assert_eq!(f.counters.get("unknown_node"), Some(&4000));
    assert!(f.nodes().is_empty(), "no state for made-up nodes");
    assert_eq!(
        f.counters.get("reports_malformed"),
        None,
        "refused before decoding"
    );
}

#[test]
fn a_new_term_sends_every_gpu_its_state_again_under_the_new_epoch() {
    let (mut f, site) = fleet();
    let state = capped(&site, &[0], 180.0);
    let first = open(&f.commands(&state, at(0.0)));
    assert!(
        first.iter().all(|(_, c)| c.epoch.is_none()),
        "no [ha]: no epoch"
    );
    ack_all(&mut f, &first, at(0.1));
    assert!(
        f.commands(&state, at(1.0)).is_empty(),
        "acknowledged: nothing due"
    );
    // elected (or taking over): everything at once, with the epoch
    f.set_epoch(Some(7));
    let again = open(&f.commands(&state, at(1.5)));
    assert_eq!(again.len(), first.len(), "every GPU commanded anew");
    assert!(again.iter().all(|(_, c)| c.epoch == Some(7)));
    ack_all(&mut f, &again, at(1.6));
    // the same term: nothing new
    f.set_epoch(Some(7));
    assert!(f.commands(&state, at(2.0)).is_empty());
}

#[test]
fn each_agents_clock_skew_is_measured_from_its_reports() {
    let (mut f, site) = fleet();
    let report = |node: &str, time: Timestamp| NodeReport {
        v: VERSION,
        node: node.into(),
        time,
        seq: 1,
        backend: "sim".into(),
        gpus: vec![],
        errors: vec![],
    };
    let nodes: Vec<String> = site.nodes.iter().map(|n| n.id.clone()).collect();
    // one agent 10 minutes slow, one 10 minutes fast
    for (node, skew) in [(&nodes[0], -600.0), (&nodes[1], 600.0)] {
        let topic = Topics::default().topic(node, Channel::Gpus);
        let r = report(node, at(100.0 + skew));
        f.on_message(&topic, &serde_json::to_vec(&r).expect("json"), at(100.2));
    }
    let skew = f.status().clock_skew_s.clone();
    assert!((skew[&nodes[0]] + 600.2).abs() < 1e-6, "{skew:?}");
    assert!((skew[&nodes[1]] - 599.8).abs() < 1e-6, "{skew:?}");
    assert_eq!(f.counters.get("reports_clock_skewed"), Some(&2));
    // each node is named in a warning of its own, once per 10 minutes: a third
    // skewed node is not drowned by the first two, the first is not named again
    assert!(f.measure_skew("n-third", at(0.0), at(30.0)));
    assert!(!f.measure_skew(&nodes[0], at(0.0), at(30.0)));
    assert!(
        !f.measure_skew("n-third", at(0.0), at(2.0)),
        "within 10 s: no warning"
    );
    // a node whose clock is set right again shows it at its next report
    let topic = Topics::default().topic(&nodes[0], Channel::Gpus);
    let r = report(&nodes[0], at(110.0));
    f.on_message(&topic, &serde_json::to_vec(&r).expect("json"), at(110.1));
    assert!((f.clock_skew_s()[&nodes[0]] + 0.1).abs() < 1e-6);
}
