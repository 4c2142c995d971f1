use super::*;
use telemetry::grid::{GridInterval, GridTarget};

fn t(s: i64) -> Timestamp {
    Timestamp::from_secs(1_800_000_000 + s)
}

fn wire(id: &str, modified: &str, start: i64, dur: f64, reports: bool) -> WireEvent {
    WireEvent {
        id: id.into(),
        program_id: "p1".into(),
        name: String::new(),
        modified: modified.into(),
        intervals: vec![GridInterval {
            start: t(start),
            duration_s: dur,
            target: GridTarget::ShedFraction(0.25),
        }],
        reports: if reports {
            vec![ReportKind::Power("DEMAND")]
        } else {
            Vec::new()
        },
        skipped: Vec::new(),
    }
}

fn programs() -> BTreeMap<String, String> {
    [("p1".to_string(), "ers-10".to_string())].into()
}

#[test]
fn a_poll_is_the_whole_list_new_versions_are_numbered_and_the_missing_are_cancelled() {
    let mut e = Events::default();
    let m = e.merge(vec![wire("a", "m1", 100, 600.0, false)], &programs(), t(0));
    assert_eq!((m.fresh, m.changed, m.refused), (1, true, 0));
    let a = &e.held["a"].event;
    assert_eq!(
        (a.source.as_str(), a.program.as_str()),
        ("openadr3", "ers-10")
    );
    assert_eq!((a.modification, a.status), (0, EventStatus::Pending));
    // the same again: nothing changed
    let m = e.merge(vec![wire("a", "m1", 100, 600.0, false)], &programs(), t(10));
    assert_eq!((m.fresh, m.changed), (0, false));
    // modified: a new version
    let m = e.merge(vec![wire("a", "m2", 100, 900.0, false)], &programs(), t(20));
    assert!(m.changed);
    assert_eq!(e.held["a"].event.modification, 1);
    assert_eq!(e.held["a"].event.end(), Some(t(1000)));
    // gone from the list: cancelled, shown so for a while, then forgotten
    let m = e.merge(Vec::new(), &programs(), t(30));
    assert!(m.changed);
    let a = &e.held["a"].event;
    assert_eq!((a.status, a.modification), (EventStatus::Cancelled, 2));
    assert!(
        a.interval_at(t(200)).is_none(),
        "a cancelled event is not in force"
    );
    assert!(!e.tick(t(200)), "the clock moves no cancelled event");
    e.merge(Vec::new(), &programs(), t(30 + CANCELLED_KEPT_S as i64 - 1));
    assert!(e.held.contains_key("a"));
    let m = e.merge(Vec::new(), &programs(), t(30 + CANCELLED_KEPT_S as i64));
    assert!(m.changed && e.held.is_empty());
}

#[test]
fn statuses_follow_the_clock() {
    let mut e = Events::default();
    e.merge(vec![wire("a", "m1", 100, 600.0, false)], &programs(), t(0));
    assert_eq!(e.next_change(t(0)), Some(t(100)));
    assert!(e.tick(t(100)));
    assert_eq!(e.held["a"].event.status, EventStatus::Active);
    assert!(!e.tick(t(200)));
    assert_eq!(e.next_change(t(200)), Some(t(700)));
    assert!(e.tick(t(700)));
    assert_eq!(e.held["a"].event.status, EventStatus::Completed);
    assert_eq!(e.next_change(t(700)), None);
}

#[test]
fn at_most_max_events_are_held_and_those_not_ended_come_first() {
    let mut e = Events::default();
    let mut listed: Vec<WireEvent> = (0..MAX_EVENTS)
        .map(|i| wire(&format!("old{i}"), "m", -10_000, 60.0, false))
        .collect();
    listed.push(wire("now", "m", 0, 600.0, false));
    let m = e.merge(listed, &programs(), t(10));
    assert_eq!((e.held.len(), m.refused), (MAX_EVENTS, 1));
    assert!(e.held.contains_key("now"), "the event in force is held");
}

#[test]
fn the_meter_is_sampled_in_an_event_and_reported_every_period_and_at_its_end() {
    let mut e = Events::default();
    e.merge(
        vec![
            wire("a", "m", 0, 150.0, true),
            wire("b", "m", 0, 150.0, false),
        ],
        &programs(),
        t(0),
    );
    assert_eq!(e.sample(t(0), Some(1000.0), 10.0), Some(t(10)));
    assert_eq!(e.sample(t(5), Some(9999.0), 10.0), Some(t(10)), "not due");
    e.sample(t(10), Some(3000.0), 10.0);
    assert!(e.due_reports(t(59), 60.0).is_empty());
    assert_eq!(e.next_report(60.0), Some(t(60)));
    let r = e.due_reports(t(60), 60.0);
    assert_eq!(r.len(), 1, "only the event that asks for reports");
    assert_eq!(
        (
            r[0].event_id.as_str(),
            r[0].program_id.as_str(),
            r[0].mean_w,
            r[0].start,
            r[0].seconds
        ),
        ("a", "p1", 2000.0, t(0), 60.0)
    );
    e.sample(t(100), Some(500.0), 10.0);
    assert!(e.tick(t(150)), "ended");
    let r = e.due_reports(t(150), 60.0);
    assert_eq!((r.len(), r[0].mean_w, r[0].start), (1, 500.0, t(60)));
    assert!(
        e.due_reports(t(400), 60.0).is_empty(),
        "nothing after the last"
    );
    assert_eq!(e.next_report(60.0), None);
    // no meter known: nothing is reported
    let mut e = Events::default();
    e.merge(vec![wire("c", "m", 0, 600.0, true)], &programs(), t(0));
    e.sample(t(0), None, 10.0);
    assert!(e.due_reports(t(60), 60.0).is_empty());
}

#[test]
fn reports_wait_in_order_until_taken_within_their_bound() {
    let r = |i: i64| DueReport {
        event_id: format!("e{i}"),
        program_id: "p1".into(),
        kinds: vec![ReportKind::Power("DEMAND")],
        mean_w: 1000.0,
        start: t(i),
        seconds: 1.0,
    };
    let mut o = Outbox::default();
    o.push(vec![r(0), r(1)]);
    // a failed POST leaves the report at the front; the next round sends it first
    assert_eq!(o.front().map(|x| x.event_id.as_str()), Some("e0"));
    o.sent();
    o.push(vec![r(2)]);
    assert_eq!(o.front().map(|x| x.event_id.as_str()), Some("e1"));
    // bounded: the oldest go first, counted
    o.push((3..3 + MAX_UNSENT as i64).map(r).collect());
    assert_eq!(o.take_dropped(), 2);
    assert_eq!(o.take_dropped(), 0);
    assert_eq!(o.front().map(|x| x.event_id.as_str()), Some("e3"));
    for _ in 0..MAX_UNSENT {
        o.sent();
    }
    assert!(o.is_empty());
}
