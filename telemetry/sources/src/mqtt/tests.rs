use super::*;
use telemetry::mapping::Mapping;

#[test]
fn rebirth_requests_are_rate_limited_per_node_and_can_be_switched_off() {
    let mut r = Rebirths::default();
    let t0 = Instant::now();
    let every = Duration::from_secs(30);
    assert!(r.allow("g", "gw1", every, t0));
    assert!(!r.allow("g", "gw1", every, t0 + Duration::from_secs(5)));
    assert!(r.allow("g", "gw2", every, t0 + Duration::from_secs(5)));
    assert!(r.allow("g", "gw1", every, t0 + Duration::from_secs(31)));
    assert!(!r.allow("g", "gw3", Duration::ZERO, t0));
    let mut full = Rebirths::default();
    for i in 0..telemetry::sparkplug::MAX_NODES {
        full.last.insert(("g".into(), format!("n{i}")), t0);
    }
    assert!(!full.allow("g", "new", every, t0 + Duration::from_secs(1)));
    assert!(
        full.allow("g", "new", every, t0 + Duration::from_secs(40)),
        "old ones forgotten"
    );
    assert_eq!(full.last.len(), 1);
}

#[test]
fn urls_name_host_and_port() {
    assert_eq!(
        parse_url("mqtt://127.0.0.1:1884").ok(),
        Some(("127.0.0.1".into(), 1884, false))
    );
    assert_eq!(
        parse_url("tcp://broker").ok(),
        Some(("broker".into(), 1883, false))
    );
    assert_eq!(parse_url("mqtts://b").ok(), Some(("b".into(), 8883, true)));
    assert!(matches!(
        parse_url("http://x"),
        Err(MqttConfigError::BadUrl(u)) if u == "http://x"
    ));
    assert!(matches!(
        parse_url("mqtt://:1"),
        Err(MqttConfigError::BadUrl(u)) if u == "mqtt://:1"
    ));
}

#[test]
fn backoff_grows_to_a_few_seconds_and_is_jittered() {
    let d: Vec<u64> = (1..=10).map(|f| backoff(f).as_millis() as u64).collect();
    assert_eq!(
        d,
        vec![500, 1000, 2000, 3000, 3000, 3000, 3000, 3000, 3000, 3000]
    );
    assert_eq!(backoff(u32::MAX), MAX_BACKOFF);
    let waits: Vec<Duration> = (0..200).map(|_| jittered(backoff(10))).collect();
    assert!(
        waits
            .iter()
            .all(|w| (2400..=3600).contains(&(w.as_millis() as u64))),
        "{waits:?}"
    );
    assert!(
        waits.iter().any(|w| *w != waits[0]),
        "the waits are spread, not all {:?}",
        waits[0]
    );
}

#[test]
fn shared_subscriptions_prefix_every_filter() {
    let m = Mapping::parse("m.toml", "version = 1\n[[json]]\ntopic = \"a/{r}/t\"\nentity = \"rack/{r}\"\nmetric = \"inlet_temp_c\"\nvalue = \"/v\"\n").expect("mapping");
    let mut cfg = MqttConfig::new("mqtt://127.0.0.1");
    cfg.shared_group = Some("ctl".into());
    let s = MqttSource::new(cfg, m).expect("source");
    assert_eq!(s.filters(), ["$share/ctl/a/+/t"]);
}

mod slow_broker {
    use super::*;
    use std::io::{Read, Write};

    /// A broker that takes `delay` to answer CONNECT (a slow TLS handshake, a broker
    /// busy with every agent reconnecting at once).
    fn slow_broker(delay: Duration) -> u16 {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = l.local_addr().expect("addr").port();
        std::thread::spawn(move || {
            for s in l.incoming() {
                let Ok(mut s) = s else { continue };
                std::thread::spawn(move || {
                    let mut buf = [0u8; 1024];
                    if s.read(&mut buf).unwrap_or(0) == 0 {
                        return;
                    }
                    std::thread::sleep(delay);
                    let _ = s.write_all(&[0x20, 0x02, 0x00, 0x00]); // CONNACK, accepted
                    while s.read(&mut buf).unwrap_or(0) > 0 {}
                });
            }
        });
        port
    }

    #[test]
    fn a_link_reaches_a_broker_that_answers_slower_than_its_poll_interval() {
        let port = slow_broker(Duration::from_millis(400));
        let (_link, events) = Link::open(
            &MqttConfig::new(&format!("mqtt://127.0.0.1:{port}")),
            Vec::new(),
            None,
        )
        .expect("link");
        let end = Instant::now() + Duration::from_secs(5);
        loop {
            match events.recv_timeout(Duration::from_millis(100)) {
                Ok(LinkEvent::Connected) => break,
                _ => assert!(
                    Instant::now() < end,
                    "never connected to a broker that answers in 400 ms"
                ),
            }
        }
    }
}

#[cfg(feature = "source")]
mod as_a_source {
    use super::*;
    use crate::source::{Batch, CancellationToken, Output, Run, Source};
    use std::sync::{Arc, Mutex};

    #[derive(Default)]
    struct Kept(Mutex<Vec<Batch>>);

    impl Output for Kept {
        fn push(&self, _kind: &'static str, batch: Batch) {
            self.0.lock().expect("lock").push(batch);
        }
    }

    #[test]
    fn a_source_stops_when_its_token_is_cancelled_and_its_counters_stay_readable() {
        let m = Mapping::parse(
            "m.toml",
            "version = 1\n[[json]]\ntopic = \"a/{r}/t\"\nentity = \"rack/{r}\"\nmetric = \"inlet_temp_c\"\nvalue = \"/v\"\n",
        )
        .expect("mapping");
        // nobody listens on port 1: the source keeps failing to connect
        let source: Box<dyn Source> =
            Box::new(MqttSource::new(MqttConfig::new("mqtt://127.0.0.1:1"), m).expect("source"));
        assert_eq!(source.kind(), "mqtt");
        let stats = source.stats();
        let cancel = CancellationToken::new();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        let task = rt.spawn(source.run(Run {
            cancel: cancel.clone(),
            out: Arc::new(Kept::default()),
            clock: || telemetry::Timestamp(0),
        }));
        std::thread::sleep(Duration::from_millis(300));
        cancel.cancel();
        rt.block_on(async {
            tokio::time::timeout(Duration::from_secs(5), task)
                .await
                .expect("stopped in time")
                .expect("joined");
        });
        let counters = stats.read();
        assert!(counters.iter().any(|c| c.name == "mqtt_disconnects_total"));
        assert!(counters.iter().all(|c| c.name.starts_with("mqtt_")));
    }
}

#[test]
fn sparkplug_bounds_have_defaults_and_are_checked() {
    let cfg: MqttConfig = toml::from_str("url = \"mqtt://b\"").expect("config");
    assert_eq!(
        cfg.sparkplug_limits().expect("defaults"),
        telemetry::sparkplug::Limits::default()
    );
    let cfg: MqttConfig = toml::from_str(
        "url = \"mqtt://b\"\nsparkplug_max_metrics_per_node = 100\nsparkplug_max_metrics = 1000\nsparkplug_max_mib = 2\nsparkplug_idle_s = 0",
    )
    .expect("config");
    let l = cfg.sparkplug_limits().expect("limits");
    assert_eq!(
        (
            l.max_metrics_per_node,
            l.max_metrics,
            l.max_bytes,
            l.idle_ms
        ),
        (100, 1000, 2 << 20, 0)
    );
    let mut bad = cfg.clone();
    bad.sparkplug_max_metrics = 10;
    let e = bad
        .sparkplug_limits()
        .expect_err("total below a node's")
        .to_string();
    assert!(e.contains("sparkplug_max_metrics must be within"), "{e}");
    let mut bad = cfg;
    bad.sparkplug_max_metrics_per_node = 0;
    assert!(bad.sparkplug_limits().is_err());
}
