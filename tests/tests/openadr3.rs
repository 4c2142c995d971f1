//! The OpenADR 3 VEN against a real VTN: `openleadr-vtn` 0.2.8 from crates.io on the
//! machine's PostgreSQL (see `powerplane_tests::openadr3_vtn`). Events are created,
//! modified and deleted by the utility's business logic; reports are read back from
//! the VTN; the VTN is hung (SIGSTOP), resumed, killed and restarted with fresh state;
//! a refused secret is counted and retried.

use std::sync::Arc;
use std::time::{Duration, Instant};

use powerplane_tests::openadr3_vtn::{event_request, fresh_db, Vtn, VEN_CLIENT, VEN_SECRET};
use powerplane_tests::Broker;
use sources::openadr3::{Ven, VenConfig};
use sources::source::{CancellationToken, Stats};
use telemetry::grid::{EventStatus, GridEvent, GridTarget};
use telemetry::Timestamp;
use tokio::sync::watch;

const VEN_NAME: &str = "powerplane-site-a";

fn now() -> Timestamp {
    Timestamp::from(chrono::Utc::now())
}

fn rfc3339(t: Timestamp) -> String {
    t.to_datetime().format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string()
}

/// The VEN on a runtime of its own; the test's thread makes the VTN's calls.
struct Running {
    rt: tokio::runtime::Runtime,
    cancel: CancellationToken,
    events: watch::Receiver<Vec<GridEvent>>,
    stats: Stats,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.cancel.cancel();
        let task = std::mem::replace(&mut self.task, self.rt.spawn(async {}));
        self.rt.block_on(async {
            let _ = tokio::time::timeout(Duration::from_secs(10), task).await;
        });
    }
}

fn ven_config(vtn: &Vtn) -> VenConfig {
    let mut cfg = VenConfig::new(&vtn.url(), VEN_NAME, VEN_CLIENT, VEN_SECRET);
    cfg.poll_s = 1.0;
    cfg.report_s = 2.0;
    cfg.timeout_s = 2.0;
    cfg.backoff_max_s = 1.0;
    cfg
}

fn start_ven(cfg: VenConfig) -> Running {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let ven = Ven::new(cfg, Arc::new(|| Some(4321.5))).expect("ven");
    let stats = ven.stats();
    let (tx, rx) = watch::channel(Vec::new());
    let cancel = CancellationToken::new();
    let task = rt.spawn(ven.run(cancel.clone(), tx));
    Running {
        rt,
        cancel,
        events: rx,
        stats,
        task,
    }
}

fn counter(stats: &Stats, name: &str, label: Option<&str>) -> u64 {
    stats
        .read()
        .iter()
        .filter(|c| c.name == name)
        .filter(|c| label.is_none_or(|l| c.labels.iter().any(|(_, v)| v == l)))
        .map(|c| c.value)
        .sum()
}

/// Waits until `want` holds of the counters, within `secs`.
fn counters_when(stats: &Stats, secs: f64, what: &str, want: impl Fn(&Stats) -> bool) {
    let t0 = Instant::now();
    while !want(stats) {
        assert!(
            t0.elapsed().as_secs_f64() < secs,
            "no {what} within {secs} s; the VEN's counters: {:?}",
            stats.read()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The events once `want` holds of them, within `secs`.
fn events_when(
    ven: &Running,
    secs: f64,
    what: &str,
    want: impl Fn(&[GridEvent]) -> bool,
) -> Vec<GridEvent> {
    let (rx, t0) = (&ven.events, Instant::now());
    loop {
        {
            let e = rx.borrow();
            if want(&e) {
                return e.clone();
            }
        }
        assert!(
            t0.elapsed().as_secs_f64() < secs,
            "no {what} within {secs} s; the VEN holds {:#?}; its counters: {:?}",
            *rx.borrow(),
            ven.stats.read()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn event<'a>(events: &'a [GridEvent], id: &str) -> Option<&'a GridEvent> {
    events.iter().find(|e| e.id == id)
}

fn id_of(v: &serde_json::Value) -> String {
    v["id"].as_str().expect("id").to_string()
}

/// A 30-minute SIMPLE event at `level` of `program`, from now; its id.
fn simple_event_now(vtn: &Vtn, program: &str, level: f64) -> String {
    let e = vtn.bl_ok(
        "POST",
        "/events",
        Some(event_request(
            program,
            &rfc3339(now()),
            30,
            "SIMPLE",
            &[level],
        )),
    );
    id_of(&e)
}

#[test]
fn an_event_is_followed_reported_modified_and_cancelled() {
    let vtn = Vtn::start();
    vtn.add_ven_client();
    let ers = vtn.program("ers-10");
    let other = vtn.program("capacity-other");
    let mut cfg = ven_config(&vtn);
    cfg.programs = vec!["ers-10".into()];
    let ven = start_ven(cfg);

    // the VEN finds no VEN object of its name and creates one
    counters_when(&ven.stats, 20.0, "registration", |s| {
        counter(s, "openadr_registrations_total", None) == 1
    });
    assert!(vtn.knows_ven(VEN_NAME), "the VTN lists the VEN");
    assert_eq!(counter(&ven.stats, "openadr_tokens_total", None), 1);

    // an event in force: a cap at the meter, two intervals
    let t0 = now();
    let start = rfc3339(t0.plus_secs(-5.0));
    let e = vtn.bl_ok(
        "POST",
        "/events",
        Some(event_request(
            &ers,
            &start,
            10,
            "IMPORT_CAPACITY_LIMIT",
            &[800.0, 650.0],
        )),
    );
    let id = id_of(&e);
    let got = events_when(&ven, 10.0, "the event", |e| event(e, &id).is_some());
    let ev = event(&got, &id).expect("held");
    assert_eq!(
        (ev.source.as_str(), ev.program.as_str()),
        ("openadr3", "ers-10")
    );
    assert_eq!((ev.modification, ev.status), (0, EventStatus::Active));
    assert_eq!(ev.intervals.len(), 2);
    assert_eq!(ev.intervals[0].target, GridTarget::CapW(800_000.0));
    assert_eq!(ev.intervals[1].target, GridTarget::CapW(650_000.0));
    assert_eq!(ev.intervals[1].start, ev.intervals[0].end());
    assert_eq!(ev.intervals[0].duration_s, 600.0);
    let off = ev.intervals[0].start.secs_since(t0);
    assert!((-5.5..=-4.5).contains(&off), "started {off} s from now");
    assert!(ev.interval_at(now()).is_some(), "in force now");

    // the meter is reported while it is in force, as the event asked
    let t_report = Instant::now();
    let reports = loop {
        let r = vtn.bl_ok("GET", &format!("/reports?eventID={id}"), None);
        if r.as_array().is_some_and(|a| !a.is_empty()) {
            break r;
        }
        assert!(
            t_report.elapsed() < Duration::from_secs(15),
            "no report within 15 s; the VEN's counters: {:?}",
            ven.stats.read()
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let r = &reports[0];
    assert_eq!(r["clientName"], VEN_NAME);
    assert_eq!(r["eventID"], id.as_str());
    let payload = &r["resources"][0]["intervals"][0]["payloads"][0];
    assert_eq!(payload["type"], "DEMAND");
    let kw = payload["values"][0].as_f64().expect("a number");
    assert!(
        (kw - 4.3215).abs() < 0.001,
        "reported {kw} kW for a meter at 4.3215 kW"
    );

    // an event of a program the site did not enrol in is not taken
    vtn.bl_ok(
        "POST",
        "/events",
        Some(event_request(
            &other,
            &rfc3339(t0),
            10,
            "IMPORT_CAPACITY_LIMIT",
            &[1.0],
        )),
    );

    // modified: a new version with the new cap
    let mut changed = event_request(&ers, &start, 10, "IMPORT_CAPACITY_LIMIT", &[500.0]);
    changed["eventName"] = serde_json::json!("peak, deeper");
    vtn.bl_ok("PUT", &format!("/events/{id}"), Some(changed));
    let got = events_when(&ven, 10.0, "the modified event", |e| {
        event(e, &id).is_some_and(|e| e.modification == 1)
    });
    let ev = event(&got, &id).expect("held");
    assert_eq!(ev.intervals.len(), 1);
    assert_eq!(ev.intervals[0].target, GridTarget::CapW(500_000.0));
    assert_eq!(got.len(), 1, "only the enrolled program's event: {got:#?}");

    // deleted on the VTN: cancelled, in force no more
    vtn.delete_event(&id);
    let got = events_when(&ven, 10.0, "the cancelled event", |e| {
        event(e, &id).is_some_and(|e| e.status == EventStatus::Cancelled)
    });
    assert!(event(&got, &id).expect("held").interval_at(now()).is_none());
    assert_eq!(
        counter(&ven.stats, "openadr_errors_total", None),
        counter(&ven.stats, "openadr_errors_total", Some("report_refused")),
        "no call failed but reports for the deleted event: {:?}",
        ven.stats.read()
    );
    assert!(counter(&ven.stats, "openadr_reports_sent_total", None) >= 1);
    assert!(!ven.task.is_finished());
}

#[test]
fn the_ven_rides_out_a_vtn_that_hangs_and_one_that_restarts_with_fresh_state() {
    let mut vtn = Vtn::start();
    vtn.add_ven_client();
    let program = vtn.program("ers-30");
    let ven = start_ven(ven_config(&vtn));
    let start = rfc3339(now().plus_secs(-1.0));
    let e = vtn.bl_ok(
        "POST",
        "/events",
        Some(event_request(&program, &start, 30, "SIMPLE", &[2.0])),
    );
    let id = id_of(&e);
    let before = events_when(&ven, 15.0, "the event", |e| event(e, &id).is_some());
    assert_eq!(
        event(&before, &id).expect("held").intervals[0].target,
        GridTarget::Level(2)
    );

    // hung: each call ends by its deadline, counted; the event holds as it was
    vtn.signal("-STOP");
    counters_when(&ven.stats, 15.0, "timed-out calls", |s| {
        counter(s, "openadr_errors_total", Some("timeout")) >= 2
    });
    assert_eq!(*ven.events.borrow(), before, "a hung VTN changes no event");
    vtn.signal("-CONT");
    let polls = counter(&ven.stats, "openadr_polls_total", None);
    counters_when(&ven.stats, 15.0, "polls after the VTN resumed", |s| {
        counter(s, "openadr_polls_total", None) >= polls + 2
    });

    // killed, and back on the same port with fresh state: the VEN registers again,
    // takes the list as it is now (its event is gone: cancelled), and the new events
    let port = vtn.port;
    let registered = counter(&ven.stats, "openadr_reregistrations_total", None);
    vtn.kill();
    drop(vtn);
    counters_when(&ven.stats, 15.0, "an unreachable VTN", |s| {
        counter(s, "openadr_errors_total", Some("unreachable")) >= 1
    });
    let vtn = Vtn::start_on(port, fresh_db());
    vtn.add_ven_client();
    let program = vtn.program("ers-30");
    counters_when(&ven.stats, 20.0, "a registration with the new VTN", |s| {
        counter(s, "openadr_reregistrations_total", None) > registered
    });
    assert!(vtn.knows_ven(VEN_NAME), "the new VTN knows the VEN");
    let e2 = vtn.bl_ok(
        "POST",
        "/events",
        Some(event_request(
            &program,
            &rfc3339(now()),
            30,
            "SIMPLE",
            &[3.0],
        )),
    );
    let id2 = id_of(&e2);
    let got = events_when(&ven, 15.0, "the new VTN's event", |e| {
        event(e, &id2).is_some_and(|e| e.intervals[0].target == GridTarget::Level(3))
    });
    // the new VTN numbers its events afresh: the old id may come back as a new event
    if id2 != id {
        assert_eq!(
            event(&got, &id).expect("held").status,
            EventStatus::Cancelled
        );
    }
    assert!(!ven.task.is_finished());
}

#[test]
fn a_refused_secret_is_counted_retried_with_backoff_and_never_fatal() {
    let vtn = Vtn::start();
    vtn.add_ven_client();
    let mut cfg = ven_config(&vtn);
    cfg.client_secret = "not the secret".into();
    let ven = start_ven(cfg);
    counters_when(&ven.stats, 15.0, "refused tokens", |s| {
        counter(s, "openadr_errors_total", Some("unauthorized")) >= 2
    });
    let n = counter(&ven.stats, "openadr_errors_total", Some("unauthorized"));
    std::thread::sleep(Duration::from_secs(3));
    let m = counter(&ven.stats, "openadr_errors_total", Some("unauthorized"));
    // backed off (at most 1 s here, at least half of it): a handful of tries, no flood
    assert!(m - n <= 8, "{n} → {m} refusals in 3 s");
    assert_eq!(counter(&ven.stats, "openadr_tokens_total", None), 0);
    assert_eq!(counter(&ven.stats, "openadr_polls_total", None), 0);
    assert!(ven.events.borrow().is_empty());
    assert!(!ven.task.is_finished());
}

#[test]
fn a_vtns_mqtt_notification_brings_an_event_at_once_and_a_lost_broker_leaves_polling() {
    let mut broker = Broker::start();
    let vtn = Vtn::start_with_mqtt(broker.port);
    vtn.add_ven_client();
    let program = vtn.program("ers-10");
    let mut cfg = ven_config(&vtn);
    // polls far apart: what comes at once came by notification
    cfg.poll_s = 600.0;
    let ven = start_ven(cfg);
    // both topics (its own and every VEN's) acknowledged, and the poll each
    // acknowledgement wakes done: a later poll was woken by a notification
    counters_when(&ven.stats, 20.0, "the notifier subscribed", |s| {
        counter(s, "openadr_notifier_connections_total", None) >= 2
            && counter(s, "openadr_polls_total", None) >= 2
    });
    std::thread::sleep(Duration::from_millis(500));
    let polls = counter(&ven.stats, "openadr_polls_total", None);
    let t0 = Instant::now();
    let id = simple_event_now(&vtn, &program, 1.0);
    events_when(&ven, 5.0, "the notified event", |e| event(e, &id).is_some());
    let latency = t0.elapsed();
    counters_when(&ven.stats, 5.0, "the notification counted", |s| {
        counter(s, "openadr_notifications_total", None) >= 1
    });
    assert!(counter(&ven.stats, "openadr_polls_total", None) > polls);
    eprintln!("event created → held by the VEN: {latency:?}");

    // deleted: notified as well
    vtn.delete_event(&id);
    events_when(&ven, 5.0, "the notified delete", |e| {
        event(e, &id).is_some_and(|e| e.status == EventStatus::Cancelled)
    });

    // the broker goes away: counted, the VEN keeps going (polling every poll_s)
    broker.stop();
    counters_when(&ven.stats, 15.0, "the lost broker counted", |s| {
        counter(s, "openadr_errors_total", Some("notifier")) >= 1
    });
    // back: the notifier reconnects and notifications work again
    let connections = counter(&ven.stats, "openadr_notifier_connections_total", None);
    broker.restart();
    // subscribed again: two topics, two acknowledgements
    counters_when(&ven.stats, 45.0, "the notifier subscribed again", |s| {
        counter(s, "openadr_notifier_connections_total", None) >= connections + 2
    });
    // (openleadr-vtn's own MQTT client does not come back by itself: the utility's
    // notification is published on the VTN's topic for it)
    let id = simple_event_now(&vtn, &program, 2.0);
    let topics = vtn.bl_ok("GET", "/notifiers/mqtt/topics/events", None);
    let topic = topics["topics"]["CREATE"]
        .as_str()
        .unwrap_or_else(|| panic!("no create topic: {topics}"));
    powerplane_tests::mosquitto_pub(broker.port, topic, b"{}", &[]);
    events_when(
        &ven,
        5.0,
        "an event notified after the broker came back",
        |e| event(e, &id).is_some(),
    );
    assert!(!ven.task.is_finished());
}

#[test]
fn a_broker_that_refuses_the_vens_token_makes_it_take_a_new_one_and_polling_goes_on() {
    // the broker knows the VTN's own client only: every token the VEN presents is
    // refused, as an expired one would be
    let broker = Broker::start_with_password("vtn", "vtn");
    let vtn = Vtn::start_with_mqtt(broker.port);
    vtn.add_ven_client();
    let program = vtn.program("ers-10");
    let ven = start_ven(ven_config(&vtn));
    counters_when(&ven.stats, 20.0, "a refused token renewed", |s| {
        counter(s, "openadr_notifier_refusals_total", None) >= 1
            && counter(s, "openadr_tokens_total", None) >= 2
    });
    assert_eq!(
        counter(&ven.stats, "openadr_notifier_connections_total", None),
        0
    );
    // a refusal is no VTN failure: the VEN keeps its VEN object and polls on
    assert_eq!(
        counter(&ven.stats, "openadr_errors_total", Some("unauthorized")),
        0
    );
    let id = simple_event_now(&vtn, &program, 1.0);
    events_when(&ven, 10.0, "the polled event", |e| event(e, &id).is_some());
    // renewals follow the notifier's backoff, not a flood
    let (tokens, t0) = (
        counter(&ven.stats, "openadr_tokens_total", None),
        Instant::now(),
    );
    std::thread::sleep(Duration::from_secs(4));
    let more = counter(&ven.stats, "openadr_tokens_total", None) - tokens;
    assert!(more <= 6, "{more} tokens taken in {:?}", t0.elapsed());
    assert!(!ven.task.is_finished());
}

#[test]
fn the_notifier_reconnects_with_the_token_the_ven_holds_now() {
    use sources::openadr3::notify;
    use std::sync::atomic::{AtomicBool, Ordering};
    let broker = Broker::start_with_password("ven-7", "fresh-token");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let (token, rx) = watch::channel("stale-token".to_string());
    let renew = Arc::new(AtomicBool::new(false));
    let wake = Arc::new(tokio::sync::Notify::new());
    let cancel = CancellationToken::new();
    let sub = notify::Subscription {
        broker: notify::Broker {
            uri: format!("mqtt://127.0.0.1:{}", broker.port),
            bearer_username: Some("{clientID}".into()),
        },
        topics: vec!["vtn/events".into()],
        client_id: "ven-7".into(),
        token: rx,
        renew: renew.clone(),
        tls: sources::tls::Tls::default(),
    };
    let stats = rt
        .block_on(async { notify::start(sub, wake.clone(), cancel.clone()) })
        .expect("notifier");
    // the stale token is refused, counted, and a new one asked for
    counters_when(&stats, 10.0, "the stale token refused", |s| {
        counter(s, "openadr_notifier_refusals_total", None) >= 1
    });
    assert!(renew.load(Ordering::Relaxed), "no new token asked for");
    assert_eq!(
        counter(&stats, "openadr_notifier_connections_total", None),
        0
    );
    // the VEN takes a new token: the next connection presents it and subscribes
    token.send_replace("fresh-token".into());
    counters_when(
        &stats,
        20.0,
        "the notifier subscribed with the new token",
        |s| counter(s, "openadr_notifier_connections_total", None) >= 1,
    );
    let refusals = counter(&stats, "openadr_notifier_refusals_total", None);
    powerplane_tests::mosquitto_pub(
        broker.port,
        "vtn/events",
        b"{}",
        &["-u", "ven-7", "-P", "fresh-token"],
    );
    counters_when(&stats, 5.0, "the notification", |s| {
        counter(s, "openadr_notifications_total", None) >= 1
    });
    assert_eq!(
        counter(&stats, "openadr_notifier_refusals_total", None),
        refusals
    );
    cancel.cancel();
}
