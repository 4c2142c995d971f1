//! `powerplane serve` against a publisher of made-up names, on the test's own
//! Mosquitto: 20,000 rack entities the site does not know (three readings each) and
//! 2,000 agent nodes it does not know. Serve's memory and `/metrics` stay where they
//! were, every refused reading and message is counted, the warnings are rate-limited,
//! and readings of the site's own entities published at the same time still arrive.
//! And 40 made-up Sparkplug B edge nodes, each an NBIRTH and three DBIRTHs of 15,000
//! aliased metrics: every oversized birth refused and counted, serve's memory flat.

mod common;

use std::io::Write;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{http, serve, serve_log};
use sources::mqtt::{Link, LinkEvent, MqttConfig};
use telemetry::agent_proto::{Channel, GpuReport, NodeReport, Topics, VERSION};
use telemetry::gpu_backend::GpuReading;

const KEY: &str = "3f6c0a1e9b2d4c8e7f5a6b3c2d1e0f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e";
const RACKS: usize = 20_000;
const READINGS_PER_RACK: usize = 3;
const NODES: usize = 2_000;
/// What the controller may grow by under the flood (serve's RSS).
const RSS_GROWTH_KB: u64 = 30 * 1024;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("port")
        .local_addr()
        .expect("addr")
        .port()
}

/// A Mosquitto of the test's own on a free port, without per-client queue limits (so
/// that what is published all reaches serve, and the counts can be exact).
struct Mosquitto {
    port: u16,
    child: Child,
    _dir: tempfile::TempDir,
}

impl Mosquitto {
    fn start() -> Mosquitto {
        let dir = tempfile::tempdir().expect("tmp");
        let port = free_port();
        let conf = dir.path().join("mosquitto.conf");
        std::fs::write(
            &conf,
            format!("per_listener_settings false\nallow_anonymous true\npersistence false\nmax_queued_messages 0\nmax_queued_bytes 0\nlistener {port} 127.0.0.1\n"),
        )
        .expect("conf");
        let child = Command::new("mosquitto")
            .arg("-c")
            .arg(&conf)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("this test needs mosquitto (Debian mosquitto): {e}"));
        let end = Instant::now() + Duration::from_secs(5);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < end, "mosquitto did not listen on {port}");
            std::thread::sleep(Duration::from_millis(50));
        }
        Mosquitto {
            port,
            child,
            _dir: dir,
        }
    }
}

impl Drop for Mosquitto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Publishes one message per line with the real `mosquitto_pub -l`.
fn publish_lines(port: u16, topic: &str, lines: &str) {
    let mut child = Command::new("mosquitto_pub")
        .args([
            "-h",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "-t",
            topic,
            "-l",
        ])
        .stdin(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| {
            panic!("this test needs mosquitto_pub (Debian mosquitto-clients): {e}")
        });
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(lines.as_bytes())
        .expect("write lines");
    assert!(child.wait().expect("mosquitto_pub").success());
}

fn rss_kb(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .expect("VmRSS")
}

fn metrics(port: u16) -> String {
    let (code, _, body) = http(port, "GET", "/metrics", None, b"");
    assert_eq!(code, 200, "{body}");
    body
}

/// The value of one series, by its exact name and labels.
fn value(metrics: &str, series: &str) -> Option<f64> {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

fn report(node: &str, power_w: f64) -> Vec<u8> {
    let reading = GpuReading {
        index: 0,
        uuid: format!("GPU-{node}"),
        name: "A40".into(),
        power_w,
        energy_j: Some(1e6),
        temp_c: 61.0,
        sm_clock_mhz: 1500.0,
        mem_clock_mhz: 7000.0,
        utilization_pct: 99.0,
        power_limit_w: 300.0,
        default_limit_w: 300.0,
        min_limit_w: 100.0,
        max_limit_w: 300.0,
        throttle_reasons: vec![],
        pids: vec![],
        sm_clock_min_mhz: 210.0,
        sm_clock_max_mhz: 1740.0,
    };
    let r = NodeReport {
        v: VERSION,
        node: node.into(),
        time: ::common::wall_clock(),
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
    serde_json::to_vec(&r).expect("json")
}

/// A client that publishes as made-up agents would.
fn agents_link(port: u16) -> Link {
    let mut cfg = MqttConfig::new(&format!("mqtt://127.0.0.1:{port}"));
    cfg.client_id = Some(format!("bounded-agents-{}", std::process::id()));
    let (link, events) = Link::open(&cfg, vec!["bounded/unused".into()], None).expect("link");
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        assert!(
            Instant::now() < end,
            "the test's MQTT client did not connect"
        );
        if let Ok(LinkEvent::Connected) = events.recv_timeout(Duration::from_millis(100)) {
            return link;
        }
    }
}

fn publish(link: &Link, topic: &str, payload: Vec<u8>) {
    // the client's queue is bounded: wait for room rather than lose a message
    let end = Instant::now() + Duration::from_secs(10);
    while !link.publish(topic, payload.clone(), false, false) {
        assert!(Instant::now() < end, "cannot queue {topic}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn write_config(d: &Path, broker: u16, http_port: u16, topic: &str, prefix: &str) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("root");
    std::fs::copy(root.join("examples/demo/site.toml"), d.join("site.toml")).expect("site");
    std::fs::write(
        d.join("policy.toml"),
        "version = 1\n[budget]\nenabled = false\n[thermal]\nenabled = false\n",
    )
    .expect("policy");
    std::fs::write(
        d.join("mapping.toml"),
        format!("version = 1\n[[json]]\ntopic = \"{topic}\"\neach = \"/racks\"\nentity = \"rack/{{/rack}}\"\nreadings = [\n  {{ metric = \"inlet_temp_c\", value = \"/c\" }},\n  {{ metric = \"humidity_pct\", value = \"/h\" }},\n  {{ metric = \"power_w\", value = \"/w\" }},\n]\n"),
    )
    .expect("mapping");
    std::fs::write(d.join("site.key"), KEY).expect("key");
    std::fs::write(
        d.join("powerplane.toml"),
        format!("[controller]\nsite = \"site.toml\"\npolicy = \"policy.toml\"\ntick_s = 0.5\n[store]\nkind = \"embedded\"\npath = \"s.redb\"\n[mqtt]\nurl = \"mqtt://127.0.0.1:{broker}\"\nmapping = \"mapping.toml\"\n[agents]\nkey_file = \"site.key\"\ntopic_prefix = \"{prefix}\"\n[agents.mqtt]\nurl = \"mqtt://127.0.0.1:{broker}\"\n[http]\nlisten = \"127.0.0.1:{http_port}\"\nmetrics_public = true\n[[http.tokens]]\nname = \"v\"\nrole = \"viewer\"\ntoken = \"{}\"\n", common::VIEWER),
    )
    .expect("config");
}

fn wait_for(what: &str, within: Duration, config: &Path, mut ok: impl FnMut() -> bool) {
    let end = Instant::now() + within;
    while !ok() {
        assert!(
            Instant::now() < end,
            "{what}: not within {within:?}\n{}",
            serve_log(config)
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// One message of rack `a01`'s readings, with inlet `c`.
fn known_rack(c: f64) -> String {
    format!("{{\"racks\":[{{\"rack\":\"a01\",\"c\":{c},\"h\":40,\"w\":5000}}]}}\n")
}

/// Publishes the made-up racks (with one line of junk) and agents, and in the middle
/// of them a reading of rack `a01` (27.5 °C) and a report of `known` (211 W).
fn flood(port: u16, topic: &'static str, link: &Link, topics: &Topics, known: &str) {
    let mut lines = String::new();
    for i in 0..RACKS {
        lines.push_str(&format!(
            "{{\"racks\":[{{\"rack\":\"made-up-{i}\",\"c\":25,\"h\":40,\"w\":5000}}]}}\n"
        ));
        if i == RACKS / 2 {
            lines.push_str(&known_rack(27.5));
            lines.push_str("not json at all\n");
        }
    }
    let racks = std::thread::spawn(move || publish_lines(port, topic, &lines));
    for i in 0..NODES {
        let node = format!("made-up-node-{i}");
        let health = format!(
            "{{\"v\":{VERSION},\"node\":\"{node}\",\"status\":\"online\",\"time\":null,\"dry_run\":false,\"fail_safe_gpus\":[],\"counters\":{{}}}}"
        );
        publish(
            link,
            &topics.topic(&node, Channel::Health),
            health.into_bytes(),
        );
        publish(
            link,
            &topics.topic(&node, Channel::Gpus),
            report(&node, 250.0),
        );
        if i == NODES / 2 {
            publish(
                link,
                &topics.topic(known, Channel::Gpus),
                report(known, 211.0),
            );
        }
    }
    racks.join().expect("publisher");
}

/// One warning per interval, with the count left out, not one per message.
fn warnings_are_rate_limited(config: &Path) {
    let log = serve_log(config);
    let refused = log.matches("readings refused").count();
    let agents = log.matches("agent message refused").count();
    assert!((1..=4).contains(&refused), "{refused} lines:\n{log}");
    assert!((1..=4).contains(&agents), "{agents} lines:\n{log}");
}

#[test]
fn made_up_racks_and_agents_grow_nothing_and_are_counted_while_known_ones_arrive() {
    let broker = Mosquitto::start();
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path();
    let http_port = free_port();
    let topic = "bounded/racks";
    let prefix = "bounded/v1";
    write_config(d, broker.port, http_port, topic, prefix);
    let config = d.join("powerplane.toml");
    let mut s = serve(&config, 300);
    let pid = s.0.id();
    let topics = Topics::new(prefix);
    let link = agents_link(broker.port);
    let known = "a01-n01";
    let gpu_power = format!("powerplane_power_watts{{entity=\"gpu/{known}:0\",kind=\"gpu\"}}");
    let inlet = "powerplane_inlet_temperature_celsius{entity=\"rack/a01\",kind=\"rack\"}";

    // before: the site's own readings, and serve settled
    wait_for("serve answering", Duration::from_secs(30), &config, || {
        http(http_port, "GET", "/metrics", None, b"").0 == 200
    });
    wait_for(
        "the site's readings",
        Duration::from_secs(30),
        &config,
        || {
            publish_lines(broker.port, topic, &known_rack(24.5));
            publish(
                &link,
                &topics.topic(known, Channel::Gpus),
                report(known, 190.0),
            );
            std::thread::sleep(Duration::from_millis(600));
            let m = metrics(http_port);
            value(&m, inlet) == Some(24.5) && value(&m, &gpu_power) == Some(190.0)
        },
    );
    std::thread::sleep(Duration::from_secs(2));
    let (rss_before, metrics_before) = (rss_kb(pid), metrics(http_port).len());

    // the flood, with the site's own readings in the middle of it
    flood(broker.port, topic, &link, &topics, known);

    let unknown_entity = "powerplane_samples_rejected_total{reason=\"unknown_entity\"}";
    let unknown_node = "powerplane_agent_messages_total{kind=\"unknown_node\"}";
    let want_readings = (RACKS * READINGS_PER_RACK) as f64;
    let want_messages = (NODES * 2) as f64;
    let mut last = String::new();
    wait_for(
        "every refusal counted",
        Duration::from_secs(120),
        &config,
        || {
            last = metrics(http_port);
            value(&last, unknown_entity) >= Some(want_readings)
                && value(&last, unknown_node) >= Some(want_messages)
        },
    );
    assert_eq!(value(&last, unknown_entity), Some(want_readings), "{last}");
    assert_eq!(value(&last, unknown_node), Some(want_messages));
    // the site's own readings, published in the middle of the flood, arrived
    assert_eq!(value(&last, inlet), Some(27.5), "{last}");
    assert_eq!(value(&last, &gpu_power), Some(211.0), "{last}");
    assert!(!last.contains("made-up"), "no made-up name on /metrics");
    assert_eq!(
        value(&last, "powerplane_mqtt_rejected_total{reason=\"bad_json\"}"),
        Some(1.0),
        "the decoder's reject is on /metrics"
    );
    // the MQTT source's own counters: every message of the flood and its readings
    let mqtt = |name: &str| value(&last, &format!("powerplane_mqtt_{name}_total")).unwrap_or(0.0);
    assert!(
        mqtt("messages") >= (RACKS + 2) as f64,
        "{}",
        mqtt("messages")
    );
    assert!(mqtt("samples") >= want_readings, "{}", mqtt("samples"));
    assert!(mqtt("connects") >= 1.0);
    assert_eq!(
        value(&last, "powerplane_buffer_dropped_samples_total"),
        Some(0.0)
    );
    // the loop kept its cadence through the flood (printed; bound far below a lease)
    let delay = value(&last, "powerplane_tick_delay_max_seconds").expect("tick delay");
    eprintln!(
        "largest tick delay under the flood: {:.1} ms",
        delay * 1000.0
    );
    assert!(
        delay < 1.0,
        "the loop fell {delay} s behind under the flood"
    );
    std::thread::sleep(Duration::from_secs(2));
    let (rss_after, metrics_after) = (rss_kb(pid), metrics(http_port).len());
    let growth = rss_after.saturating_sub(rss_before);
    eprintln!(
        "serve RSS {rss_before} kB -> {rss_after} kB (+{growth} kB); /metrics {metrics_before} -> {metrics_after} bytes"
    );
    assert!(
        growth < RSS_GROWTH_KB,
        "serve grew by {growth} kB under the flood (bound {RSS_GROWTH_KB} kB)"
    );
    let ratio = metrics_after as f64 / metrics_before as f64;
    assert!(
        (0.9..=1.1).contains(&ratio),
        "/metrics went from {metrics_before} to {metrics_after} bytes"
    );
    common::promtool_check(&last);

    warnings_are_rate_limited(&config);
    let _ = s.0.kill();
    let _ = s.0.wait();
}

/// An NBIRTH and three DBIRTHs of `SPARKPLUG_METRICS` aliased metrics each, from each
/// of `SPARKPLUG_NODES` made-up edge nodes: the flood that once grew serve by 357 MB.
const SPARKPLUG_NODES: usize = 40;
const SPARKPLUG_METRICS: u64 = 15_000;

fn sparkplug_birth(seq: u64, metrics: u64) -> Vec<u8> {
    use prost::Message;
    use telemetry::sparkplug::{datatype, Metric, Payload};
    Payload {
        seq: Some(seq),
        timestamp: Some(1_717_416_000_000),
        metrics: (1..=metrics)
            .map(|a| Metric {
                name: Some(format!("Made/Up/{a}")),
                alias: Some(a),
                datatype: Some(datatype::DOUBLE),
                double_value: Some(1.0),
                ..Metric::default()
            })
            .collect(),
        uuid: None,
    }
    .encode_to_vec()
}

#[test]
fn a_sparkplug_flood_of_made_up_gateways_is_refused_counted_and_grows_nothing() {
    let broker = Mosquitto::start();
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path();
    let http_port = free_port();
    write_config(d, broker.port, http_port, "bounded/racks", "bounded/v1");
    // births of 15,000 metrics are about 400 kB: let them through the packet limit, so
    // that the Sparkplug bounds are what refuses them
    let mut text = std::fs::read_to_string(d.join("powerplane.toml")).expect("config");
    text = text.replace(
        "mapping = \"mapping.toml\"\n",
        "mapping = \"mapping.toml\"\nmax_packet_bytes = 1048576\n",
    );
    std::fs::write(d.join("powerplane.toml"), text).expect("config");
    let mut mapping = std::fs::read_to_string(d.join("mapping.toml")).expect("mapping");
    mapping.push_str("[[sparkplug]]\ngroup = \"flood\"\nnode = \"{gw}\"\nmetric = \"Inlet\"\nentity = \"rack/{gw}\"\nto = \"inlet_temp_c\"\n");
    std::fs::write(d.join("mapping.toml"), mapping).expect("mapping");
    let config = d.join("powerplane.toml");
    let mut s = serve(&config, 300);
    let pid = s.0.id();
    let link = agents_link(broker.port);
    wait_for("serve answering", Duration::from_secs(30), &config, || {
        http(http_port, "GET", "/metrics", None, b"").0 == 200
    });
    let refused = "powerplane_mqtt_rejected_total{reason=\"too_many_metrics\"}";
    assert_eq!(
        value(&metrics(http_port), refused),
        Some(0.0),
        "exported from 0"
    );
    std::thread::sleep(Duration::from_secs(2));
    let rss_before = rss_kb(pid);

    let births: Vec<Vec<u8>> = (1..=3)
        .map(|seq| sparkplug_birth(seq, SPARKPLUG_METRICS))
        .collect();
    let node_birth = sparkplug_birth(0, 10);
    // three floods, each of new nodes: the first may leave buffers behind, the next
    // two must leave nothing (before the bounds, each grew serve by some 357 MB)
    let mut rss = vec![rss_before];
    let mut published = 0;
    for flood in 0..3 {
        for i in 0..SPARKPLUG_NODES {
            let node = format!("made-up-gw-{flood}-{i}");
            publish(
                &link,
                &format!("spBv1.0/flood/NBIRTH/{node}"),
                node_birth.clone(),
            );
            for (dev, birth) in births.iter().enumerate() {
                let topic = format!("spBv1.0/flood/DBIRTH/{node}/dev-{dev}");
                publish(&link, &topic, birth.clone());
                published += birth.len();
            }
        }
        let want = ((flood + 1) * SPARKPLUG_NODES * births.len()) as f64;
        let mut last = String::new();
        wait_for(
            "every refused birth counted",
            Duration::from_secs(120),
            &config,
            || {
                last = metrics(http_port);
                value(&last, refused) >= Some(want)
            },
        );
        assert_eq!(value(&last, refused), Some(want), "{last}");
        std::thread::sleep(Duration::from_secs(2));
        rss.push(rss_kb(pid));
    }
    eprintln!(
        "serve RSS {rss:?} kB: before, and after each flood of {} MB of Sparkplug births",
        published / 3_000_000
    );
    let first = rss[1].saturating_sub(rss[0]);
    let then = rss[3].saturating_sub(rss[1]);
    // the first: messages of 450 kB queued while the (debug build's) decoder works
    // through them, and the allocator's pages kept (measured: +49 MB)
    assert!(
        first < 3 * RSS_GROWTH_KB,
        "serve grew by {first} kB under the first Sparkplug flood (bound {} kB)",
        3 * RSS_GROWTH_KB
    );
    assert!(
        then < RSS_GROWTH_KB / 2,
        "serve grew by {then} kB under two more floods of new nodes (bound {} kB)",
        RSS_GROWTH_KB / 2
    );
    let _ = s.0.kill();
    let _ = s.0.wait();
}

#[test]
fn a_redfish_endpoint_naming_an_entity_the_site_lacks_stops_serve_before_it_starts() {
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path();
    write_config(d, 1, free_port(), "bounded/racks", "bounded/v1");
    let mut text = std::fs::read_to_string(d.join("powerplane.toml")).expect("config");
    text.push_str("[redfish]\n[[redfish.endpoints]]\nname = \"pdu\"\nurl = \"http://127.0.0.1:1\"\nentities = { \"RackPDUs/1\" = \"pdu/pdu-a01\", \"RackPDUs/2\" = \"pdu/made-up\", \"Chassis/1\" = \"node/made-up\" }\n");
    std::fs::write(d.join("powerplane.toml"), text).expect("config");
    let out = Command::new(env!("CARGO_BIN_EXE_powerplane"))
        .args(["serve", "--check", "--config"])
        .arg(d.join("powerplane.toml"))
        .output()
        .expect("serve --check");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("entities.\"RackPDUs/2\" = \"pdu/made-up\": the site file has no such entity"),
        "{err}"
    );
    assert!(
        err.contains("\"node/made-up\""),
        "every problem at once: {err}"
    );
    assert!(
        !err.contains("pdu/pdu-a01\":"),
        "the site's own PDU is fine: {err}"
    );
}
