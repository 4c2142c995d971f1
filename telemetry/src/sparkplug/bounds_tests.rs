//! The session's bounds: births beyond a node's or the site's limits refused, deaths
//! and silence freeing what a node held, and the state flat under a flood of made-up
//! gateways (issue 36: 40 nodes of three 15,000-metric DBIRTHs once grew RSS by 357 MB).

use super::*;
use crate::EntityId;

/// A birth (or data) of `n` aliased metrics, aliases from `first`.
fn births(seq: u64, first: u64, n: u64, pad: usize) -> Vec<u8> {
    let metrics = (first..first + n)
        .map(|a| Metric {
            name: Some(format!("Made/Up/{a:06}/{}", "x".repeat(pad))),
            alias: Some(a),
            datatype: Some(datatype::DOUBLE),
            double_value: Some(a as f64),
            ..Metric::default()
        })
        .collect();
    Payload {
        timestamp: Some(1_717_416_000_000),
        metrics,
        seq: Some(seq),
        uuid: None,
    }
    .encode_to_vec()
}

fn data(seq: u64, alias: u64) -> Vec<u8> {
    Payload {
        metrics: vec![Metric {
            alias: Some(alias),
            datatype: Some(datatype::DOUBLE),
            double_value: Some(1.0),
            ..Metric::default()
        }],
        seq: Some(seq),
        ..Payload::default()
    }
    .encode_to_vec()
}

fn send(
    s: &mut Session,
    node: &str,
    kind: &str,
    device: Option<&str>,
    p: &[u8],
    now_ms: i64,
) -> Handled {
    let t = match device {
        Some(d) => format!("spBv1.0/dc1/{kind}/{node}/{d}"),
        None => format!("spBv1.0/dc1/{kind}/{node}"),
    };
    s.handle(&parse_topic(&t).expect("topic"), p, now_ms)
}

/// [`send`], and the sums checked against a recount.
fn on(
    s: &mut Session,
    node: &str,
    kind: &str,
    device: Option<&str>,
    p: &[u8],
    now_ms: i64,
) -> Handled {
    let h = send(s, node, kind, device, p, now_ms);
    assert_eq!(s.held(), s.recount(), "the sums follow every message");
    h
}

fn reasons(h: &Handled) -> Vec<&'static str> {
    h.problems.iter().map(|p| p.0).collect()
}

fn limits(per_node: usize, total: usize) -> Limits {
    Limits {
        max_metrics_per_node: per_node,
        max_metrics: total,
        ..Limits::default()
    }
}

#[test]
fn a_birth_beyond_the_per_node_limit_is_refused_and_what_it_replaced_is_freed() {
    let mut s = Session::with_limits(limits(100, 10_000));
    assert!(on(&mut s, "gw1", "NBIRTH", None, &births(0, 1, 50, 0), 0)
        .problems
        .is_empty());
    let a = on(&mut s, "gw1", "DBIRTH", Some("a"), &births(1, 1, 40, 0), 0);
    assert!(a.problems.is_empty());
    assert_eq!(a.values.len(), 40);
    assert_eq!(s.held().metrics, 90);
    let b = on(&mut s, "gw1", "DBIRTH", Some("b"), &births(2, 1, 20, 0), 0);
    assert_eq!(reasons(&b), ["too_many_metrics"]);
    assert!(b.values.is_empty(), "a refused birth yields nothing");
    assert!(
        b.problems[0]
            .1
            .contains("sparkplug_max_metrics_per_node (100)"),
        "{:?}",
        b.problems
    );
    assert_eq!(s.held().metrics, 90);
    // the refused device's data names aliases nobody holds: a rebirth is asked for
    let d = on(&mut s, "gw1", "DDATA", Some("b"), &data(3, 1), 0);
    assert_eq!(reasons(&d), ["unknown_alias"]);
    // device a's rebirth replaces its 40 aliases; 60 would be 110 > 100: refused, and
    // its old aliases are gone with it
    let again = on(&mut s, "gw1", "DBIRTH", Some("a"), &births(4, 1, 60, 0), 0);
    assert_eq!(reasons(&again), ["too_many_metrics"]);
    assert_eq!(s.held().metrics, 50);
    // an NBIRTH beyond the limit forgets the node: its data is data before a birth
    let n = on(&mut s, "gw1", "NBIRTH", None, &births(0, 1, 150, 0), 0);
    assert_eq!(reasons(&n), ["too_many_metrics"]);
    assert_eq!(s.held(), Held::default());
    assert_eq!(
        reasons(&on(&mut s, "gw1", "NDATA", None, &data(1, 1), 0)),
        ["no_birth"]
    );
}

#[test]
fn the_total_limit_holds_across_many_nodes() {
    let mut s = Session::with_limits(limits(100, 1_000));
    let mut refused = 0;
    for i in 0..50 {
        let h = on(
            &mut s,
            &format!("gw{i}"),
            "NBIRTH",
            None,
            &births(0, 1, 100, 0),
            0,
        );
        if reasons(&h) == ["too_many_metrics"] {
            assert!(
                h.problems[0].1.contains("sparkplug_max_metrics (1000)"),
                "{:?}",
                h.problems
            );
            refused += 1;
        }
    }
    assert_eq!((s.held().metrics, s.held().nodes, refused), (1_000, 10, 40));
    // the bytes are bounded too: long names fill them before the count does
    let mut s = Session::with_limits(Limits {
        max_bytes: 1 << 20,
        ..limits(1_000, 1_000_000)
    });
    for i in 0..50 {
        on(
            &mut s,
            &format!("gw{i}"),
            "NBIRTH",
            None,
            &births(0, 1, 1_000, 400),
            0,
        );
    }
    assert!(s.held().bytes <= 1 << 20, "{:?}", s.held());
    assert_eq!(s.held().nodes, 2, "{:?}", s.held());
}

#[test]
fn deaths_free_what_the_node_and_its_devices_held() {
    let mut s = Session::new();
    on(&mut s, "gw1", "NBIRTH", None, &births(0, 1, 100, 0), 0);
    on(&mut s, "gw1", "DBIRTH", Some("a"), &births(1, 1, 100, 0), 0);
    on(&mut s, "gw1", "DBIRTH", Some("b"), &births(2, 1, 100, 0), 0);
    let cdu = EntityId::new(crate::EntityKind::Cooling, "cdu-a");
    s.remember(
        &parse_topic("spBv1.0/dc1/DDATA/gw1/a").expect("topic"),
        &cdu,
    );
    assert_eq!(s.held(), s.recount());
    assert_eq!(s.held().metrics, 300);
    let a = on(&mut s, "gw1", "DDEATH", Some("a"), b"", 0);
    assert_eq!(a.death, Some(Some("a".to_string())));
    assert_eq!(a.dead.into_iter().collect::<Vec<_>>(), [cdu]);
    assert_eq!(s.held().metrics, 200);
    assert_eq!(
        reasons(&on(&mut s, "gw1", "DDATA", Some("a"), &data(3, 1), 0)),
        ["unknown_alias"]
    );
    let n = on(&mut s, "gw1", "NDEATH", None, b"", 0);
    assert_eq!(n.death, Some(None));
    assert_eq!(s.held(), Held::default(), "nothing of the node is kept");
}

#[test]
fn silent_nodes_are_forgotten_after_idle_ms() {
    let mut s = Session::with_limits(Limits {
        idle_ms: 60_000,
        ..Limits::default()
    });
    on(&mut s, "quiet", "NBIRTH", None, &births(0, 1, 10, 0), 0);
    on(&mut s, "talks", "NBIRTH", None, &births(0, 1, 10, 0), 0);
    on(&mut s, "talks", "NDATA", None, &data(1, 1), 50_000);
    assert_eq!(s.held().nodes, 2);
    let h = on(&mut s, "talks", "NDATA", None, &data(2, 1), 61_000);
    assert!(h.problems.is_empty(), "{:?}", h.problems);
    assert_eq!((s.held().nodes, s.held().metrics, s.expired()), (1, 10, 1));
    assert_eq!(
        reasons(&on(&mut s, "quiet", "NDATA", None, &data(1, 1), 62_000)),
        ["no_birth"]
    );
    // idle_ms 0 keeps a node until its death
    let mut s = Session::with_limits(Limits {
        idle_ms: 0,
        ..Limits::default()
    });
    on(&mut s, "quiet", "NBIRTH", None, &births(0, 1, 10, 0), 0);
    on(
        &mut s,
        "other",
        "NBIRTH",
        None,
        &births(0, 1, 10, 0),
        86_400_000,
    );
    assert_eq!(s.held().nodes, 2);
}

#[test]
fn the_state_stays_flat_under_a_flood_of_made_up_gateways() {
    let mut s = Session::new();
    // the finding's flood: 40 nodes, an NBIRTH and three DBIRTHs of 15,000 metrics each
    let big: Vec<_> = (1..=3).map(|seq| births(seq, 1, 15_000, 20)).collect();
    let mut after = Vec::new();
    for round in 0..2 {
        for i in 0..40 {
            let node = format!("made-up-{i}");
            send(
                &mut s,
                &node,
                "NBIRTH",
                None,
                &births(0, 100_000, 10, 0),
                round,
            );
            for (d, birth) in ["d1", "d2", "d3"].into_iter().zip(&big) {
                let h = send(&mut s, &node, "DBIRTH", Some(d), birth, round);
                assert_eq!(reasons(&h), ["too_many_metrics"]);
            }
        }
        assert_eq!(s.held(), s.recount());
        after.push(s.held());
    }
    assert_eq!(after[0].metrics, 400, "only the NBIRTHs' 10 metrics each");
    assert!(after.windows(2).all(|w| w[0] == w[1]), "{after:?}");
    // births within the per-node limit, from ever more nodes: the total bounds them
    let within = births(0, 1, 4_000, 20);
    let (mut metrics, mut bytes) = (0, 0);
    for i in 0..30 {
        send(&mut s, &format!("flood-{i}"), "NBIRTH", None, &within, 1);
        metrics = metrics.max(s.held().metrics);
        bytes = bytes.max(s.held().bytes);
    }
    assert!(metrics <= DEFAULT_MAX_METRICS, "{metrics}");
    assert!(bytes <= DEFAULT_MAX_BYTES, "{bytes}");
    assert!(
        metrics > DEFAULT_MAX_METRICS - 4_000,
        "filled up to the bound: {metrics}"
    );
    let full = s.held();
    for i in 30..50 {
        send(&mut s, &format!("flood-{i}"), "NBIRTH", None, &within, 2);
    }
    assert_eq!(
        s.held(),
        full,
        "full: new births are refused, nothing grows"
    );
    assert_eq!(s.held(), s.recount());
}
