//! The async Redfish poller against BMCs that hang, fail, answer junk or come back:
//! simulated BMCs (the DMTF rack-PDU mockup from `tests/fixtures`, served by
//! [`powerplane_tests::mock_bmc`]) beside the hanging and refusing fakes.

use std::time::{Duration, Instant};

use powerplane_tests::mock_bmc::{MockBmcs, Mode};
use powerplane_tests::{workspace_root, AuthBmc, BadBmc};
use sources::redfish::{EndpointConfig, EndpointStats, Options, Poller};
use telemetry::Timestamp;

fn now() -> Timestamp {
    Timestamp::from(chrono::Utc::now())
}

fn pdus(n: usize, delay: Duration) -> MockBmcs {
    MockBmcs::start(
        &workspace_root().join("tests/fixtures/redfish/public-pdu"),
        n,
        delay,
        2,
    )
}

fn stats_of(poller: &Poller, name: &str) -> EndpointStats {
    poller
        .stats()
        .snapshot()
        .into_iter()
        .find(|s| s.endpoint == name)
        .unwrap_or_else(|| panic!("no stats for {name}"))
}

#[test]
fn a_hanging_bmc_does_not_delay_the_others_beyond_the_poll_deadline() {
    let bmcs = pdus(4, Duration::from_millis(10));
    let hang = BadBmc::hanging();
    // a GET timeout far beyond the poll deadline: only the deadline can save the poll
    let mut hanging = EndpointConfig::new("hang", &hang.url);
    hanging.timeout_s = 60.0;
    let mut configs = vec![hanging];
    configs.extend((0..4).map(|i| {
        let mut c = EndpointConfig::new(&format!("pdu{i}"), &bmcs.url(i));
        c.timeout_s = 60.0;
        c
    }));
    let mut poller = Poller::new(configs, 64).expect("poller");
    let deadline = Duration::from_secs(2);
    poller.interval = Some(deadline);
    let slack = Duration::from_millis(700);

    // discovery: the hanging one's walk goes on in the background, the others are read
    let t = Instant::now();
    let r = poller.poll(now());
    let took = t.elapsed();
    assert!(took < deadline + slack, "first poll took {took:?}");
    assert!(r[0].deferred && r[0].samples.is_empty(), "{:?}", r[0]);
    for p in &r[1..] {
        assert!(p.error.is_none() && !p.samples.is_empty(), "{p:?}");
        assert!(p.discovery);
    }

    // steady state: the others' re-reads are not held up by the hanging discovery
    let t = Instant::now();
    let r = poller.poll(now());
    let took = t.elapsed();
    assert!(took < Duration::from_secs(1), "second poll took {took:?}");
    assert!(r[0].deferred);
    for p in &r[1..] {
        assert!(
            p.error.is_none() && !p.samples.is_empty() && !p.discovery,
            "{p:?}"
        );
    }

    // a discovered BMC that starts hanging: its re-read is cut off at the deadline
    bmcs.set_mode(1, Mode::Hanging);
    let t = Instant::now();
    let r = poller.poll(now());
    let took = t.elapsed();
    assert!(
        took >= deadline && took < deadline + slack,
        "the poll ends at its deadline: {took:?}"
    );
    assert!(r[2].overrun && r[2].error.is_some(), "{:?}", r[2]);
    for p in [&r[1], &r[3], &r[4]] {
        assert!(p.error.is_none() && !p.samples.is_empty(), "{p:?}");
        assert!(
            p.elapsed < Duration::from_secs(1),
            "{}: {:?}",
            p.endpoint,
            p.elapsed
        );
    }
    assert_eq!(stats_of(&poller, "pdu1").overruns, 1);
    // backing off now: the next poll skips it and is quick again
    let t = Instant::now();
    let r = poller.poll(now());
    assert!(r[2].skipped, "{:?}", r[2]);
    assert!(t.elapsed() < Duration::from_secs(1));
}

#[test]
fn a_failing_bmc_is_backed_off_and_recovers_when_it_answers_again() {
    let bmcs = pdus(2, Duration::ZERO);
    bmcs.set_mode(1, Mode::Failing);
    let configs = (0..2)
        .map(|i| EndpointConfig::new(&format!("pdu{i}"), &bmcs.url(i)))
        .collect();
    let mut poller = Poller::with_options(
        configs,
        Options {
            concurrency: 16,
            backoff_max: Duration::from_secs(2),
            ..Options::default()
        },
    )
    .expect("poller");
    let every = Duration::from_millis(200);
    poller.interval = Some(every);
    let polls = 25; // 5 s
    for _ in 0..polls {
        let t = Instant::now();
        let r = poller.poll(now());
        assert!(
            r[0].error.is_none() && !r[0].samples.is_empty(),
            "{:?}",
            r[0]
        );
        std::thread::sleep(every.saturating_sub(t.elapsed()));
    }
    let failing = bmcs.requests(1);
    // tries at about 0, 1, 3 and 5 s (1 s, 2 s, then 2 s at most, each ±25%)
    assert!(
        (2..=6).contains(&failing),
        "{failing} requests in {polls} polls of a failing BMC"
    );
    let s = stats_of(&poller, "pdu1");
    assert!(s.backing_off && s.skipped >= polls - 6, "{s:?}");
    assert_eq!(
        s.failures.get("status_5xx").copied(),
        Some(failing),
        "{s:?}"
    );

    // it answers again: read within one backoff (at most 2.5 s) and healthy after
    bmcs.set_mode(1, Mode::Ok);
    let t = Instant::now();
    let back = loop {
        let r = poller.poll(now());
        if r[1].error.is_none() && !r[1].skipped && !r[1].deferred {
            break r;
        }
        assert!(
            t.elapsed() < Duration::from_secs(4),
            "still not back: {:?}",
            r[1]
        );
        std::thread::sleep(every);
    };
    assert!(!back[1].samples.is_empty(), "{:?}", back[1]);
    assert!(!stats_of(&poller, "pdu1").backing_off);
    let r = poller.poll(now());
    assert!(!r[1].skipped && r[1].error.is_none());
}

#[test]
fn the_failure_counters_show_the_reason() {
    let bmcs = pdus(2, Duration::ZERO);
    bmcs.set_mode(0, Mode::Failing);
    bmcs.set_mode(1, Mode::Junk);
    let hang = BadBmc::hanging();
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        format!("http://{}", l.local_addr().expect("addr"))
    };
    let auth = AuthBmc::start(&bmcs.url(0), false, usize::MAX);
    let mut hanging = EndpointConfig::new("hang", &hang.url);
    hanging.timeout_s = 0.5;
    let configs = vec![
        EndpointConfig::new("failing", &bmcs.url(0)),
        EndpointConfig::new("junk", &bmcs.url(1)),
        hanging,
        EndpointConfig::new("closed", &closed),
        EndpointConfig::new("auth", &auth.url),
        EndpointConfig::new("missing", &format!("http://{}/bmc/999", bmcs.addr)),
    ];
    let mut poller = Poller::new(configs, 16).expect("poller");
    let r = poller.poll(now());
    assert!(r.iter().all(|p| p.error.is_some()), "{r:?}");
    let expected = [
        ("failing", "status_5xx"),
        ("junk", "bad_json"),
        ("hang", "timeout"),
        ("closed", "connect"),
        ("auth", "auth"),
        ("missing", "status_4xx"),
    ];
    let stats = poller.stats().snapshot();
    for (name, reason) in expected {
        let s = stats.iter().find(|s| s.endpoint == name).expect("stats");
        assert_eq!(
            s.failures.keys().copied().collect::<Vec<_>>(),
            vec![reason],
            "{name}: {s:?}"
        );
        assert_eq!(s.failures[reason], 1, "{name}: one GET, one failure");
    }
    // as /metrics shows them: per endpoint of the config and reason
    let families = orchestrator::redfish::metrics(&stats);
    for (name, reason) in expected {
        let v = families
            .iter()
            .find(|m| {
                m.name == "redfish_failures_total"
                    && m.labels
                        == vec![
                            ("endpoint", name.to_string()),
                            ("reason", reason.to_string()),
                        ]
            })
            .map(|m| m.value);
        assert_eq!(v, Some(1.0), "{name} {reason}");
    }
}

#[test]
fn a_resource_that_goes_away_is_rediscovered_without_backing_off() {
    let bmcs = pdus(1, Duration::ZERO);
    let mut poller =
        Poller::new(vec![EndpointConfig::new("pdu", &bmcs.url(0))], 16).expect("poller");
    let outlets = |p: &sources::redfish::Polled| {
        let mut v: Vec<String> = p
            .samples
            .iter()
            .filter(|s| {
                s.entity.kind == telemetry::EntityKind::Outlet && s.metric.as_str() == "power_w"
            })
            .map(|s| s.entity.to_string())
            .collect();
        v.sort();
        v
    };
    let first = poller.poll(now()).remove(0);
    assert!(first.discovery && outlets(&first).len() == 9, "{first:?}");
    let steady = poller.poll(now()).remove(0);
    assert!(!steady.discovery && outlets(&steady).len() == 9);

    bmcs.remove(0, "/redfish/v1/PowerEquipment/RackPDUs/1/Outlets/A1");
    let gone = poller.poll(now()).remove(0);
    assert!(gone.error.is_none(), "a 404 is not a dead BMC: {gone:?}");
    assert_eq!(gone.rejects.first().map(|r| r.reason), Some("http_status"));
    let again = poller.poll(now()).remove(0);
    assert!(
        again.discovery && !again.skipped,
        "discovered again at once: {again:?}"
    );
    let left = outlets(&again);
    assert_eq!(left.len(), 8, "{left:?}");
    assert!(!left.iter().any(|o| o.ends_with(".A1")));
    let steady = poller.poll(now()).remove(0);
    assert!(!steady.discovery && steady.rejects.is_empty() && outlets(&steady) == left);
    assert_eq!(
        stats_of(&poller, "pdu").failures.get("status_4xx").copied(),
        Some(2)
    );
}

#[test]
fn a_due_rediscovery_runs_beside_the_re_reads_and_delays_none() {
    let bmcs = pdus(1, Duration::from_millis(20));
    // member by member: the first discovery's GETs are then those of every later one
    // (with `$expand` it would also send the one probe the mock refuses)
    let mut cfg = EndpointConfig::new("pdu", &bmcs.url(0));
    cfg.expand = false;
    let mut poller = Poller::with_options(
        vec![cfg],
        Options {
            concurrency: 16,
            rediscover_every: 2,
            ..Options::default()
        },
    )
    .expect("poller");
    let first = poller.poll(now()).remove(0);
    assert!(first.discovery && first.error.is_none(), "{first:?}");
    let discovery_gets = bmcs.requests(0);
    poller.interval = Some(Duration::from_secs(1));
    let polls = 8;
    for _ in 0..polls {
        let t = Instant::now();
        let p = poller.poll(now()).remove(0);
        assert!(
            !p.deferred && !p.discovery && p.error.is_none() && !p.samples.is_empty(),
            "read every poll while rediscovering: {p:?}"
        );
        assert!(
            t.elapsed() < Duration::from_millis(700),
            "{:?}",
            t.elapsed()
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    // 13 re-reads per poll; the rest are rediscoveries in the background
    let extra = bmcs.requests(0) as i64 - discovery_gets as i64 - 13 * polls;
    assert!(
        extra >= discovery_gets as i64,
        "at least one rediscovery: {extra} GETs beyond the re-reads"
    );
}

#[test]
fn an_oversized_resource_or_collection_is_refused_and_the_rest_read() {
    let bmcs = pdus(2, Duration::ZERO);
    // a 9 MiB outlet (over the 8 MiB limit)
    let big = format!("{{\"Id\": \"A1\", \"Oem\": \"{}\"}}", "x".repeat(9 << 20));
    bmcs.replace(
        0,
        "/redfish/v1/PowerEquipment/RackPDUs/1/Outlets/A1",
        big.into_bytes(),
    );
    // a sensor collection that lists 5,000 members
    let listed: Vec<String> = (0..5000)
        .map(|k| format!("{{\"@odata.id\": \"/redfish/v1/Chassis/PDU/Sensors/S{k}\"}}"))
        .collect();
    let coll = format!("{{\"Members\": [{}]}}", listed.join(","));
    bmcs.replace(1, "/redfish/v1/Chassis/PDU/Sensors", coll.into_bytes());
    let configs = (0..2)
        .map(|i| EndpointConfig::new(&format!("pdu{i}"), &bmcs.url(i)))
        .collect();
    let mut poller = Poller::new(configs, 64).expect("poller");
    let r = poller.poll(now());
    let outlets = |p: &sources::redfish::Polled| {
        p.samples
            .iter()
            .filter(|s| {
                s.entity.kind == telemetry::EntityKind::Outlet && s.metric.as_str() == "power_w"
            })
            .count()
    };
    assert!(r[0].error.is_none(), "{:?}", r[0].error);
    assert!(
        r[0].rejects.iter().any(|x| x.reason == "oversize"),
        "{:?}",
        r[0].rejects
    );
    assert_eq!(outlets(&r[0]), 8, "the other outlets are read");
    assert_eq!(
        stats_of(&poller, "pdu0").failures.get("oversize").copied(),
        Some(1)
    );

    assert!(r[1].error.is_none(), "{:?}", r[1].error);
    assert!(
        r[1].rejects.iter().any(|x| x.reason == "oversize"),
        "the long list is refused"
    );
    assert_eq!(outlets(&r[1]), 9);
    let sent = bmcs.requests(1);
    assert!(
        (1024..1024 + 200).contains(&sent),
        "{sent} GETs: 1,024 listed sensors read, not 5,000"
    );
}
