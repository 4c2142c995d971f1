//! The MQTT source against a real Mosquitto, with messages published by the real
//! `mosquitto_pub` client: good, malformed, oversized, out of range, out of order; and a
//! broker that goes away and comes back.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use powerplane_tests::{mosquitto_pub, mqtt_port, self_signed, Broker};
use sources::mqtt::{Counters, Event, MqttConfig, MqttSource};
use telemetry::mapping::Mapping;
use telemetry::{Snapshot, Timestamp};

fn mapping(prefix: &str) -> Mapping {
    let src = format!(
        r#"version = 1
[[json]]
topic = "{prefix}/{{room}}/{{rack}}/inlet"
entity = "rack/{{rack}}"
metric = "inlet_temp_c"
value = "/value"
unit = "degF"
timestamp = "/ts"
parse_strings = true
[[json]]
topic = "{prefix}/cdu/{{cdu}}"
entity = "cooling/{{cdu}}"
readings = [
  {{ metric = "supply_temp_c", value = "/supply_c" }},
  {{ metric = "flow_lpm", value = "/flow_gpm", unit = "GPM" }},
]
"#
    );
    Mapping::parse("mapping.toml", &src).expect("valid mapping")
}

fn now() -> Timestamp {
    Timestamp::from(chrono::Utc::now())
}

/// Runs a source in a thread; events come back on a channel.
struct Running {
    events: mpsc::Receiver<Event>,
    stop: Arc<AtomicBool>,
    handle: Option<std::thread::JoinHandle<Counters>>,
}

impl Running {
    fn start(cfg: MqttConfig, mapping: Mapping) -> Running {
        let (tx, events) = mpsc::channel();
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let handle = std::thread::spawn(move || {
            let mut source = MqttSource::new(cfg, mapping).expect("source");
            let keep = || !flag.load(Ordering::SeqCst);
            source.run(&keep, &now, &mut |e| {
                let _ = tx.send(e);
            });
            source.counters.clone()
        });
        Running {
            events,
            stop,
            handle: Some(handle),
        }
    }

    /// Waits for an event matching `f`, up to 10 s.
    fn wait_for(&self, what: &str, f: impl Fn(&Event) -> bool) -> Event {
        let end = Instant::now() + Duration::from_secs(10);
        while Instant::now() < end {
            if let Ok(e) = self.events.recv_timeout(Duration::from_millis(100)) {
                if f(&e) {
                    return e;
                }
            }
        }
        panic!("no {what} within 10 s");
    }

    fn finish(mut self) -> Counters {
        self.stop.store(true, Ordering::SeqCst);
        self.handle
            .take()
            .expect("running")
            .join()
            .expect("source thread")
    }
}

fn unique(name: &str) -> String {
    format!("pptest-{}-{name}", std::process::id())
}

#[test]
fn messages_from_a_real_client_become_samples_or_counted_rejects() {
    let prefix = unique("ingest");
    let mut cfg = MqttConfig::new(&format!("mqtt://127.0.0.1:{}", mqtt_port()));
    cfg.max_packet_bytes = 4096;
    cfg.qos = 1;
    let run = Running::start(cfg, mapping(&prefix));
    run.wait_for("connection", |e| *e == Event::Connected);
    std::thread::sleep(Duration::from_millis(300)); // let the subscription settle
    let t = chrono::Utc::now().timestamp();
    let port = mqtt_port();
    mosquitto_pub(
        port,
        &format!("{prefix}/h1/a01/inlet"),
        format!(r#"{{"value": 80.6, "ts": {t}}}"#).as_bytes(),
        &["-q", "1"],
    );
    mosquitto_pub(
        port,
        &format!("{prefix}/h1/a01/inlet"),
        format!(r#"{{"value": 70.0, "ts": {}}}"#, t - 30).as_bytes(),
        &["-q", "1"],
    );
    mosquitto_pub(
        port,
        &format!("{prefix}/h1/a02/inlet"),
        format!(r#"{{"value": 932, "ts": {t}}}"#).as_bytes(),
        &["-q", "1"],
    );
    mosquitto_pub(
        port,
        &format!("{prefix}/h1/a03/inlet"),
        b"{\"value\": ",
        &["-q", "1"],
    );
    mosquitto_pub(
        port,
        &format!("{prefix}/h1/a04/inlet"),
        format!(r#"{{"value": "NaN", "ts": {t}}}"#).as_bytes(),
        &["-q", "1"],
    );
    mosquitto_pub(
        port,
        &format!("{prefix}/cdu/cdu-1"),
        br#"{"supply_c": 30.0, "flow_gpm": 100}"#,
        &["-q", "1"],
    );
    mosquitto_pub(
        port,
        &format!("{prefix}/h1/a05/inlet"),
        &vec![b' '; 8192],
        &["-q", "1"],
    );
    mosquitto_pub(
        port,
        &format!("{prefix}/h1/a06/inlet"),
        format!(r#"{{"value": 77, "ts": {t}}}"#).as_bytes(),
        &["-q", "1"],
    );

    // every message that arrives is decoded into the snapshot or rejected with a reason
    let mut snap = Snapshot::new();
    let mut rejected: Vec<String> = Vec::new();
    let end = Instant::now() + Duration::from_secs(10);
    while Instant::now() < end
        && snap
            .observe(&"rack/a06".parse().expect("id"), "inlet_temp_c", now())
            .is_none()
    {
        let ev = run.events.recv_timeout(Duration::from_millis(100));
        if let Ok(Event::Disconnected { error, .. }) = &ev {
            rejected.push(format!("disconnected: {error}"));
        }
        if let Ok(Event::Message { decoded, .. }) = ev {
            rejected.extend(decoded.rejects.iter().map(|r| r.reason.to_string()));
            for s in decoded.samples {
                if let Err(e) = snap.ingest(s, now()) {
                    rejected.push(e.reason().to_string());
                }
            }
        }
    }
    let counters = run.finish();
    let value = |e: &str, m: &str| {
        snap.reading(&e.parse().expect("id"), m)
            .map(|r| (r.value * 1000.0).round() / 1000.0)
    };
    assert_eq!(
        value("rack/a01", "inlet_temp_c"),
        Some(27.0),
        "80.6 °F, and the older 70 °F did not replace it"
    );
    assert_eq!(
        value("rack/a06", "inlet_temp_c"),
        Some(25.0),
        "the source carried on after the oversized message: {counters:?} {rejected:?}"
    );
    assert_eq!(value("cooling/cdu-1", "supply_temp_c"), Some(30.0));
    assert_eq!(value("cooling/cdu-1", "flow_lpm"), Some(378.541));
    assert_eq!(
        value("rack/a02", "inlet_temp_c"),
        None,
        "500 °C is not believed"
    );
    rejected.sort();
    assert_eq!(
        rejected,
        vec!["bad_json", "not_finite", "out_of_range", "oversize"],
        "{counters:?}"
    );
    assert_eq!(counters.rejects.get("oversize"), Some(&1), "{counters:?}");
    assert_eq!(
        counters.disconnects, 0,
        "an oversized message does not cost the connection: {counters:?}"
    );
    assert_eq!(counters.messages, 8);
}

#[test]
fn the_source_reconnects_and_resubscribes_when_the_broker_comes_back() {
    let mut broker = Broker::start();
    let prefix = unique("reconnect");
    let run = Running::start(
        MqttConfig::new(&format!("mqtt://127.0.0.1:{}", broker.port)),
        mapping(&prefix),
    );
    run.wait_for("first connection", |e| *e == Event::Connected);
    broker.stop();
    run.wait_for("disconnection", |e| matches!(e, Event::Disconnected { .. }));
    broker.restart();
    run.wait_for("reconnection", |e| *e == Event::Connected);
    std::thread::sleep(Duration::from_millis(300));
    let t = chrono::Utc::now().timestamp();
    mosquitto_pub(
        broker.port,
        &format!("{prefix}/h/b01/inlet"),
        format!(r#"{{"value": 86, "ts": {t}}}"#).as_bytes(),
        &[],
    );
    let got = run.wait_for("a message after the reconnect", |e| {
        matches!(e, Event::Message { .. })
    });
    let Event::Message { decoded, .. } = got else {
        unreachable!()
    };
    assert_eq!(decoded.samples.len(), 1);
    assert!((decoded.samples[0].value - 30.0).abs() < 1e-9);
    let counters = run.finish();
    assert!(
        counters.connects >= 2 && counters.disconnects >= 1,
        "{counters:?}"
    );
}

#[test]
fn sparkplug_b_from_a_gateway_becomes_samples_and_a_death_marks_them() {
    use prost::Message;
    use telemetry::sparkplug::{datatype, Metric, Payload};
    let group = unique("spb");
    let src = format!(
        r#"version = 1
[[sparkplug]]
group = "{group}"
node = "{{gw}}"
device = "{{cdu}}"
metric = "Secondary/Supply Temp"
entity = "cooling/{{cdu}}"
to = "supply_temp_c"
unit = "degF"
[[sparkplug]]
group = "{group}"
node = "{{gw}}"
device = "{{cdu}}"
metric = "Heat Load"
entity = "cooling/{{cdu}}"
to = "heat_load_kw"
"#
    );
    let mapping = Mapping::parse("mapping.toml", &src).expect("valid mapping");
    let run = Running::start(
        MqttConfig::new(&format!("mqtt://127.0.0.1:{}", mqtt_port())),
        mapping,
    );
    run.wait_for("connection", |e| *e == Event::Connected);
    std::thread::sleep(Duration::from_millis(300));
    let m = |name: Option<&str>, alias: u64, v: f64| Metric {
        name: name.map(str::to_string),
        alias: Some(alias),
        datatype: Some(datatype::DOUBLE),
        double_value: Some(v),
        ..Metric::default()
    };
    let p = |seq: u64, metrics: Vec<Metric>| {
        Payload {
            timestamp: None,
            metrics,
            seq: Some(seq),
            uuid: None,
        }
        .encode_to_vec()
    };
    let port = mqtt_port();
    mosquitto_pub(
        port,
        &format!("spBv1.0/{group}/NBIRTH/gw-7"),
        &p(0, vec![]),
        &[],
    );
    mosquitto_pub(
        port,
        &format!("spBv1.0/{group}/DBIRTH/gw-7/cdu-3"),
        &p(
            1,
            vec![
                m(Some("Secondary/Supply Temp"), 1, 86.0),
                m(Some("Heat Load"), 2, 42.5),
                m(Some("Unmapped"), 3, 1.0),
            ],
        ),
        &[],
    );
    mosquitto_pub(
        port,
        &format!("spBv1.0/{group}/DDATA/gw-7/cdu-3"),
        &p(2, vec![m(None, 1, 87.8)]),
        &[],
    );
    mosquitto_pub(
        port,
        &format!("spBv1.0/{group}/DDATA/gw-7/cdu-3"),
        &p(9, vec![m(None, 2, 40.0)]),
        &[],
    );
    mosquitto_pub(
        port,
        &format!("spBv1.0/{group}/DDEATH/gw-7/cdu-3"),
        &p(10, vec![]),
        &[],
    );

    let mut samples = Vec::new();
    let mut reasons = Vec::new();
    let mut dead = Vec::new();
    let end = Instant::now() + Duration::from_secs(10);
    while Instant::now() < end && dead.is_empty() {
        let ev = run.events.recv_timeout(Duration::from_millis(100));
        if let Ok(Event::Message { decoded, .. }) = ev {
            samples.extend(decoded.samples.into_iter().map(|s| {
                (
                    s.entity.to_string(),
                    s.metric.to_string(),
                    (s.value * 1000.0).round() / 1000.0,
                )
            }));
            reasons.extend(decoded.rejects.into_iter().map(|r| r.reason));
            dead.extend(decoded.dead.into_iter().map(|e| e.to_string()));
        }
    }
    run.finish();
    assert_eq!(
        samples,
        vec![
            (
                "cooling/cdu-3".to_string(),
                "supply_temp_c".to_string(),
                30.0
            ),
            (
                "cooling/cdu-3".to_string(),
                "heat_load_kw".to_string(),
                42.5
            ),
            (
                "cooling/cdu-3".to_string(),
                "supply_temp_c".to_string(),
                31.0
            ),
            (
                "cooling/cdu-3".to_string(),
                "heat_load_kw".to_string(),
                40.0
            ),
        ]
    );
    assert_eq!(reasons, vec!["sequence_gap"], "seq 9 after 2");
    assert_eq!(dead, vec!["cooling/cdu-3"]);
}

#[test]
fn sparkplug_stale_deaths_are_ignored_and_lost_state_asks_the_gateway_for_a_rebirth() {
    use prost::Message;
    use telemetry::sparkplug::{datatype, Metric, Payload, BD_SEQ, REBIRTH};
    let group = unique("spb-rebirth");
    let src = format!(
        "version = 1\n[[sparkplug]]\ngroup = \"{group}\"\nnode = \"{{gw}}\"\nmetric = \"Inlet\"\nentity = \"rack/{{gw}}\"\nto = \"inlet_temp_c\"\n"
    );
    let mapping = Mapping::parse("mapping.toml", &src).expect("valid mapping");
    let port = mqtt_port();
    // the gateway's side: the real mosquitto_sub waits for the rebirth request
    let sub = std::process::Command::new("mosquitto_sub")
        .args([
            "-h",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "-C",
            "1",
            "-W",
            "20",
            "-N",
        ])
        .args(["-t", &format!("spBv1.0/{group}/NCMD/gw-1")])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("this test needs mosquitto_sub (Debian mosquitto-clients)");
    let run = Running::start(
        MqttConfig::new(&format!("mqtt://127.0.0.1:{port}")),
        mapping,
    );
    run.wait_for("connection", |e| *e == Event::Connected);
    std::thread::sleep(Duration::from_millis(300));
    let bd = |n: u64| Metric {
        name: Some(BD_SEQ.into()),
        datatype: Some(datatype::UINT64),
        long_value: Some(n),
        ..Metric::default()
    };
    let inlet = |v: f64| Metric {
        name: Some("Inlet".into()),
        alias: Some(1),
        datatype: Some(datatype::DOUBLE),
        double_value: Some(v),
        ..Metric::default()
    };
    let p = |seq: Option<u64>, metrics: Vec<Metric>| {
        Payload {
            seq,
            metrics,
            ..Payload::default()
        }
        .encode_to_vec()
    };
    let topic = |kind: &str| format!("spBv1.0/{group}/{kind}/gw-1");
    mosquitto_pub(
        port,
        &topic("NBIRTH"),
        &p(Some(0), vec![bd(1), inlet(24.0)]),
        &[],
    );
    // the will of the gateway's previous session, delivered late
    mosquitto_pub(port, &topic("NDEATH"), &p(None, vec![bd(0)]), &[]);
    mosquitto_pub(port, &topic("NDATA"), &p(Some(1), vec![inlet(25.0)]), &[]);
    // messages lost: seq 7 after 1
    mosquitto_pub(port, &topic("NDATA"), &p(Some(7), vec![inlet(26.0)]), &[]);
    let out = sub.wait_with_output().expect("mosquitto_sub");
    assert!(
        out.status.success(),
        "no rebirth request reached the gateway"
    );
    let req = Payload::decode(out.stdout.as_slice()).expect("an NCMD payload");
    assert_eq!(req.metrics.len(), 1);
    assert_eq!(req.metrics[0].name.as_deref(), Some(REBIRTH));
    assert_eq!(req.metrics[0].boolean_value, Some(true));
    // the current session's death counts
    mosquitto_pub(port, &topic("NDEATH"), &p(None, vec![bd(1)]), &[]);

    let (mut values, mut reasons, mut dead, mut rebirths) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let end = Instant::now() + Duration::from_secs(10);
    while Instant::now() < end && dead.is_empty() {
        if let Ok(Event::Message { decoded, .. }) =
            run.events.recv_timeout(Duration::from_millis(100))
        {
            values.extend(decoded.samples.iter().map(|s| s.value));
            reasons.extend(decoded.rejects.iter().map(|r| r.reason));
            dead.extend(decoded.dead.iter().map(|e| e.to_string()));
            rebirths.extend(decoded.rebirth.map(|r| r.sent));
        }
    }
    let counters = run.finish();
    assert_eq!(
        values,
        vec![24.0, 25.0, 26.0],
        "the stale death marked nothing"
    );
    assert_eq!(reasons, vec!["stale_death", "sequence_gap"]);
    assert_eq!(dead, vec!["rack/gw-1"]);
    assert_eq!(rebirths, vec![true]);
    assert_eq!((counters.rebirths_sent, counters.rebirths_held), (1, 0));
}

/// Payloads from Eclipse Tahu's Python encoder (`tests/fixtures/sparkplug/tahu_payloads.py`
/// in the test venv, from the PyPI package `mqtt-spb-wrapper`).
fn tahu_payloads(dir: &std::path::Path) {
    let root = powerplane_tests::workspace_root();
    let python = root.join(".venv/bin/python");
    let out = std::process::Command::new(&python)
        .arg(root.join("tests/fixtures/sparkplug/tahu_payloads.py"))
        .arg(dir)
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "this test needs {} (scripts/test makes it): {e}",
                python.display()
            )
        });
    assert!(
        out.status.success(),
        "the Tahu encoder failed (scripts/test installs mqtt-spb-wrapper into .venv): {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn sparkplug_from_an_independent_encoder_tahu_is_read_typed_and_its_sessions_followed() {
    let dir = tempfile::tempdir().expect("tmp");
    tahu_payloads(dir.path());
    let file = |n: &str| std::fs::read(dir.path().join(n)).expect("payload");
    let group = unique("spb-tahu");
    let src = format!(
        "version = 1\n\
         [[sparkplug]]\ngroup = \"{group}\"\nnode = \"{{gw}}\"\nmetric = \"Inlet\"\nentity = \"rack/{{gw}}\"\nto = \"inlet_temp_c\"\n\
         [[sparkplug]]\ngroup = \"{group}\"\nnode = \"{{gw}}\"\nmetric = \"Leak\"\nentity = \"cooling/{{gw}}\"\nto = \"leak_detected\"\n\
         [[sparkplug]]\ngroup = \"{group}\"\nnode = \"{{gw}}\"\nmetric = \"Status\"\nentity = \"rack/{{gw}}\"\nto = \"humidity_pct\"\n\
         [[sparkplug]]\ngroup = \"{group}\"\nnode = \"{{gw}}\"\nmetric = \"Fan\"\nentity = \"rack/{{gw}}\"\nto = \"temperature_c\"\n"
    );
    let mapping = Mapping::parse("mapping.toml", &src).expect("valid mapping");
    let port = mqtt_port();
    let run = Running::start(
        MqttConfig::new(&format!("mqtt://127.0.0.1:{port}")),
        mapping,
    );
    run.wait_for("connection", |e| *e == Event::Connected);
    std::thread::sleep(Duration::from_millis(300));
    let topic = |kind: &str| format!("spBv1.0/{group}/{kind}/gw-t");
    mosquitto_pub(port, &topic("NBIRTH"), &file("nbirth.bin"), &[]);
    mosquitto_pub(port, &topic("NDATA"), &file("ndata.bin"), &[]);
    mosquitto_pub(port, &topic("NDEATH"), &file("ndeath-stale.bin"), &[]);
    mosquitto_pub(port, &topic("NDEATH"), &file("ndeath.bin"), &[]);
    let (mut samples, mut reasons, mut dead) = (Vec::new(), Vec::new(), Vec::new());
    let end = Instant::now() + Duration::from_secs(10);
    while Instant::now() < end && dead.is_empty() {
        if let Ok(Event::Message { decoded, .. }) =
            run.events.recv_timeout(Duration::from_millis(100))
        {
            samples.extend(
                decoded
                    .samples
                    .iter()
                    .map(|s| (s.entity.to_string(), s.metric.to_string(), s.value, s.ts.0)),
            );
            reasons.extend(decoded.rejects.iter().map(|r| r.reason));
            dead.extend(decoded.dead.iter().map(|e| e.to_string()));
        }
    }
    run.finish();
    let t = 1_790_000_000_000;
    assert_eq!(
        samples,
        vec![
            ("rack/gw-t".to_string(), "inlet_temp_c".to_string(), 24.5, t),
            (
                "cooling/gw-t".to_string(),
                "leak_detected".to_string(),
                0.0,
                t
            ),
            (
                "rack/gw-t".to_string(),
                "temperature_c".to_string(),
                -3.0,
                t
            ),
            (
                "rack/gw-t".to_string(),
                "inlet_temp_c".to_string(),
                25.25,
                t + 1000
            ),
            (
                "cooling/gw-t".to_string(),
                "leak_detected".to_string(),
                1.0,
                t + 1000
            ),
        ],
        "a Float, a Boolean leak and a signed Int16 as Tahu encodes them"
    );
    // the String metric is refused in the birth and the data; the earlier session's
    // will is ignored; the current one's marks the readings
    assert_eq!(reasons, vec!["wrong_type", "wrong_type", "stale_death"]);
    dead.sort();
    assert_eq!(dead, vec!["cooling/gw-t", "rack/gw-t"]);
}

#[test]
fn a_tls_broker_is_trusted_only_as_the_config_says() {
    use sources::tls::Tls;
    let dir = tempfile::tempdir().expect("tempdir");
    let (cert, key, fingerprint) = self_signed(dir.path());
    let broker = Broker::start_tls(&cert, &key);
    let url = format!(
        "mqtts://127.0.0.1:{}",
        broker.tls_port.expect("tls listener")
    );
    let prefix = unique("tls");

    // the system's roots do not vouch for it: the connection fails, and says why
    let run = Running::start(MqttConfig::new(&url), mapping(&prefix));
    let refused = run.wait_for("a refused connection", |e| {
        matches!(e, Event::Disconnected { .. })
    });
    run.finish();
    let Event::Disconnected { error, .. } = refused else {
        unreachable!()
    };
    assert!(
        error.to_lowercase().contains("certificate") || error.to_lowercase().contains("tls"),
        "{error}"
    );

    for tls in [
        Tls {
            pinned_sha256: Some(fingerprint.clone()),
            ..Tls::default()
        },
        Tls {
            ca_file: Some(cert.display().to_string()),
            ..Tls::default()
        },
        Tls {
            insecure: true,
            ..Tls::default()
        },
    ] {
        let mut cfg = MqttConfig::new(&url);
        cfg.tls = Some(tls.clone());
        let run = Running::start(cfg, mapping(&prefix));
        run.wait_for("a TLS connection", |e| *e == Event::Connected);
        std::thread::sleep(Duration::from_millis(300));
        let t = chrono::Utc::now().timestamp();
        mosquitto_pub(
            broker.port,
            &format!("{prefix}/h/c01/inlet"),
            format!(r#"{{"value": 86, "ts": {t}}}"#).as_bytes(),
            &[],
        );
        let got = run.wait_for("a message over TLS", |e| matches!(e, Event::Message { .. }));
        run.finish();
        let Event::Message { decoded, .. } = got else {
            unreachable!()
        };
        assert_eq!(decoded.samples.len(), 1, "{tls:?}");
    }
}

#[test]
fn mqtt_5_with_a_shared_subscription_splits_the_stream_between_controllers() {
    let prefix = unique("v5share");
    let mk = |id: &str| {
        let mut cfg = MqttConfig::new(&format!("mqtt://127.0.0.1:{}", mqtt_port()));
        cfg.protocol = "5".into();
        cfg.shared_group = Some(unique("group"));
        cfg.client_id = Some(unique(id));
        Running::start(cfg, mapping(&prefix))
    };
    let (a, b) = (mk("a"), mk("b"));
    a.wait_for("a connected", |e| *e == Event::Connected);
    b.wait_for("b connected", |e| *e == Event::Connected);
    std::thread::sleep(Duration::from_millis(400));
    let t = chrono::Utc::now().timestamp();
    for i in 0..20 {
        mosquitto_pub(
            mqtt_port(),
            &format!("{prefix}/h/r{i:02}/inlet"),
            format!(r#"{{"value": 80, "ts": {t}}}"#).as_bytes(),
            &["-V", "mqttv5"],
        );
    }
    std::thread::sleep(Duration::from_millis(800));
    let count = |r: &Running| {
        std::iter::from_fn(|| r.events.try_recv().ok())
            .filter(|e| matches!(e, Event::Message { .. }))
            .count()
    };
    let (na, nb) = (count(&a), count(&b));
    a.finish();
    b.finish();
    assert_eq!(
        na + nb,
        20,
        "every message to exactly one of the two: {na} + {nb}"
    );
    assert!(na > 0 && nb > 0, "both got a share: {na} + {nb}");
}

#[test]
fn a_broker_that_wants_a_password_gets_it() {
    let broker = Broker::start_with_password("telemetry", "s3cret");
    let prefix = unique("auth");
    let url = format!("mqtt://127.0.0.1:{}", broker.port);
    let anonymous = Running::start(MqttConfig::new(&url), mapping(&prefix));
    anonymous.wait_for("a refusal", |e| matches!(e, Event::Disconnected { .. }));
    anonymous.finish();
    let mut cfg = MqttConfig::new(&url);
    cfg.username = Some("telemetry".into());
    cfg.password = Some("s3cret".into());
    let run = Running::start(cfg, mapping(&prefix));
    run.wait_for("an authenticated connection", |e| *e == Event::Connected);
    std::thread::sleep(Duration::from_millis(300));
    let t = chrono::Utc::now().timestamp();
    mosquitto_pub(
        broker.port,
        &format!("{prefix}/h/d01/inlet"),
        format!(r#"{{"value": 86, "ts": {t}}}"#).as_bytes(),
        &["-u", "telemetry", "-P", "s3cret"],
    );
    let got = run.wait_for("a message", |e| matches!(e, Event::Message { .. }));
    run.finish();
    let Event::Message { decoded, .. } = got else {
        unreachable!()
    };
    assert_eq!(decoded.samples.len(), 1);
}

#[test]
fn telemetry_is_back_within_5_s_of_a_broker_that_was_down_for_10_s() {
    let mut broker = Broker::start();
    let prefix = unique("backoff");
    let run = Running::start(
        MqttConfig::new(&format!("mqtt://127.0.0.1:{}", broker.port)),
        mapping(&prefix),
    );
    run.wait_for("first connection", |e| *e == Event::Connected);
    broker.stop();
    run.wait_for("disconnection", |e| matches!(e, Event::Disconnected { .. }));
    // down long enough that a doubling backoff would wait 8 s or more by now
    std::thread::sleep(Duration::from_secs(10));
    broker.restart();
    let back = Instant::now();
    // publish until a sample arrives (a message sent before the source has subscribed
    // again is not kept for it)
    let topic = format!("{prefix}/h/b02/inlet");
    let sample = loop {
        assert!(
            back.elapsed() < Duration::from_secs(5),
            "no sample within 5 s of the broker being back"
        );
        let t = chrono::Utc::now().timestamp();
        mosquitto_pub(
            broker.port,
            &topic,
            format!(r#"{{"value": 86, "ts": {t}}}"#).as_bytes(),
            &[],
        );
        let until = Instant::now() + Duration::from_millis(250);
        let mut got = None;
        while let Some(left) = until.checked_duration_since(Instant::now()) {
            match run.events.recv_timeout(left) {
                Ok(Event::Message { decoded, .. }) if !decoded.samples.is_empty() => {
                    got = Some(decoded.samples[0].clone());
                    break;
                }
                Ok(_) => {}
                Err(_) => break,
            }
        }
        if let Some(s) = got {
            break s;
        }
    };
    let took = back.elapsed();
    assert!(took < Duration::from_secs(5), "a sample after {took:?}");
    assert!((sample.value - 30.0).abs() < 1e-9);
    let counters = run.finish();
    assert!(counters.connects >= 2, "{counters:?}");
}

#[test]
fn a_sparkplug_birth_beyond_the_bounds_is_refused_and_counted_by_the_source() {
    use prost::Message;
    use telemetry::sparkplug::{datatype, Metric, Payload};
    let group = unique("spb-bounds");
    let src = format!(
        "version = 1\n[[sparkplug]]\ngroup = \"{group}\"\nnode = \"{{gw}}\"\nmetric = \"Inlet\"\nentity = \"rack/{{gw}}\"\nto = \"inlet_temp_c\"\n"
    );
    let mapping = Mapping::parse("mapping.toml", &src).expect("valid mapping");
    let port = mqtt_port();
    let mut cfg = MqttConfig::new(&format!("mqtt://127.0.0.1:{port}"));
    cfg.sparkplug_max_metrics_per_node = 100;
    cfg.rebirth_interval_s = 0.0;
    let run = Running::start(cfg, mapping);
    run.wait_for("connection", |e| *e == Event::Connected);
    std::thread::sleep(Duration::from_millis(300));
    let birth = |n: u64| {
        let mut metrics: Vec<Metric> = (2..n + 1)
            .map(|a| Metric {
                name: Some(format!("Made/Up/{a}")),
                alias: Some(a),
                datatype: Some(datatype::DOUBLE),
                double_value: Some(1.0),
                ..Metric::default()
            })
            .collect();
        metrics.push(Metric {
            name: Some("Inlet".into()),
            alias: Some(1),
            datatype: Some(datatype::DOUBLE),
            double_value: Some(24.0),
            ..Metric::default()
        });
        Payload {
            seq: Some(0),
            metrics,
            ..Payload::default()
        }
        .encode_to_vec()
    };
    let topic = |kind: &str| format!("spBv1.0/{group}/{kind}/gw-1");
    // 150 aliased metrics where 100 are allowed: refused whole
    mosquitto_pub(port, &topic("NBIRTH"), &birth(150), &[]);
    // 100: taken
    mosquitto_pub(port, &topic("NBIRTH"), &birth(100), &[]);
    let (mut values, mut reasons) = (Vec::new(), Vec::new());
    let end = Instant::now() + Duration::from_secs(10);
    while Instant::now() < end && values.is_empty() {
        if let Ok(Event::Message { decoded, .. }) =
            run.events.recv_timeout(Duration::from_millis(100))
        {
            values.extend(decoded.samples.iter().map(|s| s.value));
            reasons.extend(decoded.rejects.iter().map(|r| r.reason));
        }
    }
    let counters = run.finish();
    assert_eq!(reasons, vec!["too_many_metrics"]);
    assert_eq!(values, vec![24.0], "the birth within the bound counts");
    assert_eq!(
        counters.rejects.get("too_many_metrics"),
        Some(&1),
        "{counters:?}"
    );
}
