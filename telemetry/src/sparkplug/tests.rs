use super::*;
use crate::EntityId;

fn metric(name: Option<&str>, alias: Option<u64>, dt: u32, v: f64) -> Metric {
    Metric {
        name: name.map(str::to_string),
        alias,
        datatype: Some(dt),
        double_value: (dt == datatype::DOUBLE).then_some(v),
        float_value: (dt == datatype::FLOAT).then_some(v as f32),
        int_value: (dt == datatype::INT32 || dt == datatype::UINT32).then_some(v as i32 as u32),
        ..Metric::default()
    }
}

fn payload(seq: u64, metrics: Vec<Metric>) -> Vec<u8> {
    Payload {
        timestamp: Some(1_717_416_000_000),
        metrics,
        seq: Some(seq),
        uuid: None,
    }
    .encode_to_vec()
}

fn topic(kind: &str, device: Option<&str>) -> String {
    match device {
        Some(d) => format!("spBv1.0/dc1/{kind}/gw1/{d}"),
        None => format!("spBv1.0/dc1/{kind}/gw1"),
    }
}

fn handle(s: &mut Session, kind: &str, device: Option<&str>, p: &[u8]) -> Handled {
    let t = topic(kind, device);
    let parsed = parse_topic(&t).expect("sparkplug topic");
    s.handle(&parsed, p, 0)
}

#[test]
fn topics_split_into_group_type_node_device() {
    assert_eq!(
        parse_topic("spBv1.0/dc1/DDATA/gw1/cdu-1"),
        Some(Topic {
            group: "dc1",
            kind: "DDATA",
            node: "gw1",
            device: Some("cdu-1")
        })
    );
    assert_eq!(
        parse_topic("spBv1.0/dc1/NBIRTH/gw1").map(|t| t.device),
        Some(None)
    );
    assert_eq!(parse_topic("dc1/a/b/c"), None);
    assert_eq!(parse_topic("spBv1.0/dc1/DDATA/gw1/d/extra"), None);
}

#[test]
fn births_name_aliases_and_data_uses_them() {
    let mut s = Session::new();
    let birth = handle(
        &mut s,
        "NBIRTH",
        None,
        &payload(
            0,
            vec![metric(Some("Uptime"), Some(1), datatype::INT32, 5.0)],
        ),
    );
    assert!(birth.problems.is_empty());
    let dbirth = handle(
        &mut s,
        "DBIRTH",
        Some("cdu-1"),
        &payload(
            1,
            vec![
                metric(Some("Supply/Temp"), Some(10), datatype::FLOAT, 30.5),
                metric(Some("Flow"), Some(11), datatype::DOUBLE, 120.0),
            ],
        ),
    );
    assert_eq!(
        dbirth
            .values
            .iter()
            .map(|v| (v.name.as_str(), v.value))
            .collect::<Vec<_>>(),
        vec![("Supply/Temp", 30.5), ("Flow", 120.0)]
    );
    let data = handle(
        &mut s,
        "DDATA",
        Some("cdu-1"),
        &payload(
            2,
            vec![
                metric(None, Some(11), datatype::DOUBLE, 99.0),
                metric(None, Some(10), datatype::FLOAT, 31.0),
            ],
        ),
    );
    assert!(data.problems.is_empty(), "{:?}", data.problems);
    assert_eq!(
        data.values
            .iter()
            .map(|v| (v.name.as_str(), v.value))
            .collect::<Vec<_>>(),
        vec![("Flow", 99.0), ("Supply/Temp", 31.0)]
    );
    assert_eq!(data.values[0].timestamp_ms, Some(1_717_416_000_000));
}

#[test]
fn signed_integers_are_twos_complement() {
    let m = Metric {
        int_value: Some((-5i32) as u32),
        datatype: Some(datatype::INT32),
        ..Metric::default()
    };
    assert_eq!(m.number(None), Some(-5.0));
    let m = Metric {
        int_value: Some(0xFF),
        datatype: Some(datatype::INT8),
        ..Metric::default()
    };
    assert_eq!(m.number(None), Some(-1.0));
    let m = Metric {
        long_value: Some(u64::MAX),
        datatype: Some(datatype::INT64),
        ..Metric::default()
    };
    assert_eq!(m.number(None), Some(-1.0));
    let m = Metric {
        boolean_value: Some(true),
        datatype: Some(datatype::BOOLEAN),
        ..Metric::default()
    };
    assert_eq!(m.number(None), Some(1.0));
    let m = Metric {
        is_null: Some(true),
        double_value: Some(3.0),
        ..Metric::default()
    };
    assert_eq!(m.number(None), None);
}

#[test]
fn a_sequence_gap_is_reported_and_the_values_kept() {
    let mut s = Session::new();
    handle(
        &mut s,
        "NBIRTH",
        None,
        &payload(0, vec![metric(Some("P"), Some(1), datatype::DOUBLE, 1.0)]),
    );
    let gap = handle(
        &mut s,
        "NDATA",
        None,
        &payload(5, vec![metric(None, Some(1), datatype::DOUBLE, 2.0)]),
    );
    assert_eq!(gap.problems[0].0, "sequence_gap");
    assert_eq!(gap.values.len(), 1);
    let next = handle(
        &mut s,
        "NDATA",
        None,
        &payload(6, vec![metric(None, Some(1), datatype::DOUBLE, 3.0)]),
    );
    assert!(next.problems.is_empty());
    // 255 wraps to 0
    handle(&mut s, "NDATA", None, &payload(255, vec![]));
    assert!(handle(&mut s, "NDATA", None, &payload(0, vec![]))
        .problems
        .is_empty());
}

#[test]
fn a_sequence_number_beyond_255_is_refused_not_followed_and_u64_max_does_not_overflow() {
    // found by the fuzzer: seq u64::MAX after it was followed panicked (`last + 1`)
    let mut s = Session::new();
    handle(&mut s, "NBIRTH", None, &payload(0, vec![]));
    for seq in [u64::MAX, u64::MAX] {
        let h = handle(&mut s, "NDATA", None, &payload(seq, vec![]));
        assert_eq!(h.problems[0].0, "bad_sequence", "{:?}", h.problems);
        assert!(h.problems[0].1.contains("beyond 0..=255"));
        assert!(h.rebirth);
    }
    // the sequence followed is still the birth's
    assert!(handle(&mut s, "NDATA", None, &payload(1, vec![]))
        .problems
        .is_empty());
    // a birth beyond 255 is its own problem, once
    let b = handle(&mut s, "NBIRTH", None, &payload(u64::MAX, vec![]));
    assert_eq!(b.problems.len(), 1, "{:?}", b.problems);
    assert!(handle(&mut s, "NDATA", None, &payload(0, vec![]))
        .problems
        .is_empty());
}

#[test]
fn data_before_birth_unknown_aliases_and_garbage_are_rejected() {
    let mut s = Session::new();
    assert_eq!(
        handle(&mut s, "NDATA", None, &payload(1, vec![])).problems[0].0,
        "no_birth"
    );
    handle(&mut s, "NBIRTH", None, &payload(0, vec![]));
    let unknown = handle(
        &mut s,
        "NDATA",
        None,
        &payload(1, vec![metric(None, Some(42), datatype::DOUBLE, 1.0)]),
    );
    assert_eq!(unknown.problems[0].0, "unknown_alias");
    assert_eq!(
        handle(&mut s, "NDATA", None, b"\xff\xff\xff").problems[0].0,
        "bad_protobuf"
    );
    assert_eq!(
        handle(&mut s, "NBIRTH", None, &payload(7, vec![])).problems[0].0,
        "bad_sequence"
    );
}

#[test]
fn deaths_name_what_died() {
    let mut s = Session::new();
    handle(&mut s, "NBIRTH", None, &payload(0, vec![]));
    let t = topic("DDATA", Some("cdu-1"));
    let parsed = parse_topic(&t).expect("topic");
    s.remember(&parsed, &EntityId::new(crate::EntityKind::Cooling, "cdu-1"));
    let death = handle(&mut s, "DDEATH", Some("cdu-1"), b"");
    assert_eq!(death.death, Some(Some("cdu-1".to_string())));
    assert_eq!(death.dead.len(), 1);
    assert!(
        s.entities_of(&parsed, Some("cdu-1")).is_empty(),
        "forgotten with the device"
    );
    assert_eq!(handle(&mut s, "NDEATH", None, b"").death, Some(None));
    assert_eq!(
        handle(&mut s, "NDATA", None, &payload(1, vec![])).problems[0].0,
        "no_birth",
        "a dead node must be born again"
    );
}

#[test]
fn made_up_edge_nodes_grow_the_session_only_up_to_its_bound() {
    let mut s = Session::new();
    let birth = payload(
        0,
        vec![metric(Some("temp"), Some(1), datatype::DOUBLE, 20.0)],
    );
    let data = payload(1, vec![metric(None, Some(1), datatype::DOUBLE, 21.0)]);
    for i in 0..(MAX_NODES + 50) {
        let node = format!("made-up-{i}");
        let t = format!("spBv1.0/g/NDATA/{node}");
        let h = s.handle(&parse_topic(&t).expect("topic"), &data, 0);
        assert_eq!(
            h.problems[0].0, "no_birth",
            "data before a birth keeps nothing"
        );
    }
    assert_eq!(s.nodes.len(), 0);
    let mut refused = 0;
    for i in 0..(MAX_NODES + 50) {
        let t = format!("spBv1.0/g/NBIRTH/made-up-{i}");
        let h = s.handle(&parse_topic(&t).expect("topic"), &birth, 0);
        if h.problems.first().is_some_and(|p| p.0 == "too_many_nodes") {
            refused += 1;
        }
    }
    assert_eq!((s.nodes.len(), refused), (MAX_NODES, 50));
}

fn bd(seq: u64) -> Metric {
    Metric {
        name: Some(BD_SEQ.to_string()),
        datatype: Some(datatype::UINT64),
        long_value: Some(seq),
        ..Metric::default()
    }
}

#[test]
fn a_death_of_an_earlier_session_is_ignored_and_the_current_one_counts() {
    let mut s = Session::new();
    handle(&mut s, "NBIRTH", None, &payload(0, vec![bd(3)]));
    let death = |n: u64| {
        Payload {
            metrics: vec![bd(n)],
            ..Payload::default()
        }
        .encode_to_vec()
    };
    let stale = handle(&mut s, "NDEATH", None, &death(2));
    assert_eq!(stale.death, None, "the will of session 2 arrived late");
    assert_eq!(stale.problems[0].0, "stale_death");
    assert!(
        handle(&mut s, "NDATA", None, &payload(1, vec![]))
            .problems
            .is_empty(),
        "the node is still alive"
    );
    let real = handle(&mut s, "NDEATH", None, &death(3));
    assert_eq!(real.death, Some(None));
    assert!(real.problems.is_empty());
    // a death without bdSeq (an older gateway) is believed
    handle(&mut s, "NBIRTH", None, &payload(0, vec![bd(4)]));
    assert_eq!(handle(&mut s, "NDEATH", None, b"").death, Some(None));
}

#[test]
fn lost_state_calls_for_a_rebirth() {
    let mut s = Session::new();
    let before = handle(&mut s, "NDATA", None, &payload(3, vec![]));
    assert!(before.rebirth, "data before birth");
    handle(
        &mut s,
        "NBIRTH",
        None,
        &payload(0, vec![metric(Some("P"), Some(1), datatype::DOUBLE, 1.0)]),
    );
    assert!(!handle(&mut s, "NDATA", None, &payload(1, vec![])).rebirth);
    assert!(
        handle(&mut s, "NDATA", None, &payload(5, vec![])).rebirth,
        "a gap"
    );
    let alias = handle(
        &mut s,
        "NDATA",
        None,
        &payload(6, vec![metric(None, Some(9), datatype::DOUBLE, 1.0)]),
    );
    assert!(alias.rebirth, "an alias the birth did not name");
    let req = Payload::decode(rebirth_request(5).as_slice()).expect("ncmd");
    assert_eq!(req.metrics[0].name.as_deref(), Some(REBIRTH));
    assert_eq!(req.metrics[0].boolean_value, Some(true));
    assert_eq!(command_topic("dc1", "gw1"), "spBv1.0/dc1/NCMD/gw1");
}

#[test]
fn a_string_metric_is_text_never_a_number() {
    let m = Metric {
        datatype: Some(datatype::STRING),
        string_value: Some("42.5".into()),
        ..Metric::default()
    };
    assert_eq!(m.number(None), None);
    assert_eq!(m.kind(None), ValueKind::Text);
    let mut s = Session::new();
    let h = handle(
        &mut s,
        "NBIRTH",
        None,
        &payload(
            0,
            vec![Metric {
                name: Some("Inlet".into()),
                ..m.clone()
            }],
        ),
    );
    assert_eq!(h.values[0].kind, ValueKind::Text);
    assert!(h.values[0].value.is_nan());
}
