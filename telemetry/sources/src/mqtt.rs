//! The MQTT source: subscribes to what the mapping needs and turns each message into
//! samples (or rejects, with a reason). It reconnects with backoff and resubscribes
//! after every reconnect. A message larger than `max_packet_bytes` is rejected and
//! counted without dropping the connection; only a packet over [`HARD_PACKET_LIMIT`]
//! makes the client drop the connection (and reconnect), to bound memory.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rumqttc::{Client, Event as MqttEvent, MqttOptions, Packet, QoS};
use serde::Deserialize;
use thiserror::Error;
use tracing::{info, warn};

use crate::tls::{client_config, Tls};
use std::sync::Arc;
use telemetry::decoder::Decoder;
use telemetry::mapping::{Decoded, Mapping, Reject};
use telemetry::Timestamp;

/// How to reach the broker and what to ask it for.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MqttConfig {
    /// `mqtt://host:port` (port 1883 when left out).
    pub url: String,
    #[serde(default)]
    pub client_id: Option<String>,
    /// Filters to subscribe to; empty: the ones the mapping needs.
    #[serde(default)]
    pub topics: Vec<String>,
    /// 0 or 1.
    #[serde(default)]
    pub qos: u8,
    #[serde(default)]
    pub username: Option<String>,
    #[serde(default)]
    pub password: Option<String>,
    /// A file holding the password (preferred: readable by the service only); read by
    /// [`MqttConfig::read_secrets`] when the config is loaded.
    #[serde(default)]
    pub password_file: Option<std::path::PathBuf>,
    /// Largest message accepted, in bytes.
    #[serde(default = "default_max_packet")]
    pub max_packet_bytes: usize,
    #[serde(default = "default_keep_alive")]
    pub keep_alive_s: u64,
    /// Share the subscriptions with other controllers in this group (`$share/GROUP/...`).
    #[serde(default)]
    pub shared_group: Option<String>,
    /// Trust settings for an `mqtts://` broker (default: the system's roots).
    #[serde(default)]
    pub tls: Option<Tls>,
    /// `"3.1.1"` (the default) or `"5"`.
    #[serde(default = "default_protocol")]
    pub protocol: String,
    /// Sparkplug B: the least time between two rebirth requests (NCMD `Node
    /// Control/Rebirth`) to one edge node, sent on data before its birth, a sequence
    /// gap or an alias its birth did not name; 0 sends none.
    #[serde(default = "default_rebirth_interval")]
    pub rebirth_interval_s: f64,
}

fn default_rebirth_interval() -> f64 {
    30.0
}

fn default_protocol() -> String {
    "3.1.1".to_string()
}

/// What the client accepts before it drops the connection: 16 MiB, or 8 × the
/// configured maximum when that is larger. Between the two, messages are rejected one
/// by one and the connection stays up.
pub const HARD_PACKET_LIMIT: usize = 16 * 1024 * 1024;

fn default_max_packet() -> usize {
    256 * 1024
}

fn default_keep_alive() -> u64 {
    30
}

impl MqttConfig {
    /// Reads `password_file` (relative to `base`) into `password`; both at once is an
    /// error.
    pub fn read_secrets(&mut self, base: &std::path::Path) -> Result<(), String> {
        let Some(f) = self.password_file.take() else {
            return Ok(());
        };
        if self.password.is_some() {
            return Err("give one of password or password_file, not both".into());
        }
        let password = crate::secret::read(base, &f).map_err(|e| format!("password_file: {e}"))?;
        self.password = Some(password);
        Ok(())
    }

    pub fn new(url: &str) -> Self {
        MqttConfig {
            url: url.to_string(),
            client_id: None,
            topics: Vec::new(),
            qos: 0,
            username: None,
            password: None,
            password_file: None,
            max_packet_bytes: default_max_packet(),
            keep_alive_s: default_keep_alive(),
            shared_group: None,
            tls: None,
            protocol: default_protocol(),
            rebirth_interval_s: default_rebirth_interval(),
        }
    }
}

#[derive(Debug, Error, PartialEq)]
pub enum MqttConfigError {
    #[error("mqtt url {0:?}: expected mqtt://host[:port]")]
    BadUrl(String),
    #[error("mqtt url {0:?}: tls settings need an mqtts:// url")]
    TlsWithoutMqtts(String),
    #[error("mqtt tls: {0}")]
    Tls(String),
    #[error("mqtt qos must be 0 or 1, got {0}")]
    BadQos(u8),
    #[error("mqtt protocol must be \"3.1.1\" or \"5\", got {0:?}")]
    BadProtocol(String),
    #[error("mqtt: nothing to subscribe to (no topics and an empty mapping)")]
    NoTopics,
}

/// What the source tells its owner.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    Connected,
    /// The connection failed or dropped; the source will retry after `retry_in`.
    Disconnected {
        error: String,
        retry_in: Duration,
    },
    Message {
        topic: String,
        bytes: usize,
        decoded: Decoded,
    },
}

/// Counters per reason, for metrics.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Counters {
    pub messages: u64,
    pub samples: u64,
    pub rejects: BTreeMap<&'static str, u64>,
    pub connects: u64,
    pub disconnects: u64,
    /// Sparkplug rebirth requests sent, and those held back by `rebirth_interval_s`.
    pub rebirths_sent: u64,
    pub rebirths_held: u64,
}

/// When each edge node was last asked for a rebirth; at most
/// [`telemetry::sparkplug::MAX_NODES`] remembered (a publisher of made-up node names
/// gets no requests once it is full of recent ones).
#[derive(Debug, Default)]
struct Rebirths {
    last: BTreeMap<(String, String), Instant>,
}

impl Rebirths {
    fn allow(&mut self, group: &str, node: &str, every: Duration, now: Instant) -> bool {
        if every.is_zero() {
            return false;
        }
        let key = (group.to_string(), node.to_string());
        if let Some(t) = self.last.get(&key) {
            if now.duration_since(*t) < every {
                return false;
            }
        }
        if self.last.len() >= telemetry::sparkplug::MAX_NODES {
            self.last.retain(|_, t| now.duration_since(*t) < every);
            if self.last.len() >= telemetry::sparkplug::MAX_NODES {
                return false;
            }
        }
        self.last.insert(key, now);
        true
    }
}

pub struct MqttSource {
    cfg: MqttConfig,
    decoder: Decoder,
    host: String,
    port: u16,
    tls: Option<Arc<rustls::ClientConfig>>,
    filters: Vec<String>,
    pub counters: Counters,
    rebirths: Rebirths,
}

impl MqttSource {
    pub fn new(cfg: MqttConfig, mapping: Mapping) -> Result<Self, MqttConfigError> {
        let (host, port, secure) = parse_url(&cfg.url)?;
        let tls = match (secure, &cfg.tls) {
            (false, Some(_)) => return Err(MqttConfigError::TlsWithoutMqtts(cfg.url.clone())),
            (false, None) => None,
            (true, t) => Some(Arc::new(
                client_config(&t.clone().unwrap_or_default()).map_err(MqttConfigError::Tls)?,
            )),
        };
        if cfg.protocol != "3.1.1" && cfg.protocol != "5" {
            return Err(MqttConfigError::BadProtocol(cfg.protocol.clone()));
        }
        if cfg.qos > 1 {
            return Err(MqttConfigError::BadQos(cfg.qos));
        }
        let base = if cfg.topics.is_empty() {
            mapping.topic_filters()
        } else {
            cfg.topics.clone()
        };
        if base.is_empty() {
            return Err(MqttConfigError::NoTopics);
        }
        let filters = match &cfg.shared_group {
            Some(g) => base.iter().map(|f| format!("$share/{g}/{f}")).collect(),
            None => base,
        };
        Ok(MqttSource {
            cfg,
            decoder: Decoder::new(mapping),
            host,
            port,
            tls,
            filters,
            counters: Counters::default(),
            rebirths: Rebirths::default(),
        })
    }

    pub fn filters(&self) -> &[String] {
        &self.filters
    }

    /// Runs until `keep_going` says stop, handing every event to `sink`. `clock` gives
    /// the receive time of each message.
    pub fn run(
        &mut self,
        keep_going: &dyn Fn() -> bool,
        clock: &dyn Fn() -> Timestamp,
        sink: &mut dyn FnMut(Event),
    ) {
        let mut conn = Conn::open(&self.cfg, &self.host, self.port, self.tls.clone());
        let mut failures: u32 = 0;
        let mut limiter = telemetry::log_limit::LogLimiter::default();
        let source = format!("mqtt:{}", self.cfg.url);
        while keep_going() {
            limiter.warn_suppressed("mqtt", Instant::now());
            match conn.next(Duration::from_millis(100)) {
                Step::Idle | Step::Other => {}
                Step::Closed => break,
                Step::ConnAck => {
                    failures = 0;
                    self.counters.connects += 1;
                    for f in &self.filters {
                        if let Err(e) = conn.subscribe(f, self.cfg.qos) {
                            warn!(filter = %f, error = %e, "mqtt subscribe failed");
                        }
                    }
                    info!(url = %self.cfg.url, protocol = %self.cfg.protocol, filters = ?self.filters, "mqtt connected");
                    sink(Event::Connected);
                }
                Step::Publish { topic, payload } => {
                    self.counters.messages += 1;
                    let mut decoded = if payload.len() > self.cfg.max_packet_bytes {
                        Decoded {
                            dead: Vec::new(),
                            rebirth: None,
                            samples: Vec::new(),
                            rejects: vec![Reject {
                                reason: "oversize",
                                detail: format!(
                                    "{topic}: {} bytes is over the {} byte limit",
                                    payload.len(),
                                    self.cfg.max_packet_bytes
                                ),
                            }],
                        }
                    } else {
                        self.decoder.decode(&topic, &payload, &source, clock())
                    };
                    if let Some(r) = decoded.rebirth.as_mut() {
                        self.rebirth(&conn, r, clock(), &mut limiter);
                    }
                    self.counters.samples += decoded.samples.len() as u64;
                    for r in &decoded.rejects {
                        *self.counters.rejects.entry(r.reason).or_default() += 1;
                        if let Some(left_out) = limiter.allow(r.reason, Instant::now()) {
                            warn!(
                                reason = r.reason,
                                left_out, "mqtt message rejected: {}", r.detail
                            );
                        }
                    }
                    sink(Event::Message {
                        bytes: payload.len(),
                        topic,
                        decoded,
                    });
                }
                Step::Error { message, oversize } => {
                    failures += 1;
                    self.counters.disconnects += 1;
                    if oversize {
                        *self.counters.rejects.entry("oversize").or_default() += 1;
                    }
                    let retry_in = backoff(failures);
                    warn!(url = %self.cfg.url, error = %message, retry_in_ms = retry_in.as_millis() as u64, "mqtt connection lost");
                    // the connection's pump thread waits `retry_in` before it tries again
                    sink(Event::Disconnected {
                        error: message,
                        retry_in,
                    });
                }
            }
        }
        conn.disconnect();
    }
}

impl MqttSource {
    /// Asks an edge node for its births again, at most once per `rebirth_interval_s`.
    fn rebirth(
        &mut self,
        conn: &Conn,
        r: &mut telemetry::mapping::Rebirth,
        now: Timestamp,
        limiter: &mut telemetry::log_limit::LogLimiter,
    ) {
        let every = Duration::from_secs_f64(self.cfg.rebirth_interval_s.clamp(0.0, 86_400.0));
        if !self
            .rebirths
            .allow(&r.group, &r.node, every, Instant::now())
        {
            self.counters.rebirths_held += 1;
            return;
        }
        let topic = telemetry::sparkplug::command_topic(&r.group, &r.node);
        let ms = u64::try_from(now.0).unwrap_or(0);
        match conn.publish(&topic, telemetry::sparkplug::rebirth_request(ms)) {
            Ok(()) => {
                r.sent = true;
                self.counters.rebirths_sent += 1;
                if let Some(left_out) = limiter.allow("rebirth", Instant::now()) {
                    info!(group = %r.group, node = %r.node, left_out, "sparkplug rebirth requested");
                }
            }
            Err(e) => {
                self.counters.rebirths_held += 1;
                warn!(topic = %topic, error = %e, "sparkplug rebirth request not queued");
            }
        }
    }
}

/// What the connection produced.
enum Step {
    Idle,
    Closed,
    ConnAck,
    Publish {
        topic: String,
        payload: bytes::Bytes,
    },
    Other,
    Error {
        message: String,
        oversize: bool,
    },
}

type V4Event = Result<MqttEvent, rumqttc::ConnectionError>;
type V5Event = Result<rumqttc::v5::Event, rumqttc::v5::ConnectionError>;

/// One client connection, MQTT 3.1.1 or 5, seen through what the source needs.
///
/// A pump thread drives the connection with blocking polls: a poll cut short by a
/// timeout would abandon a connect in progress (rumqttc connects inside the poll), so
/// a broker slower than the timeout would never be reached. The pump backs off after
/// an error and stops when told to or when the receiver goes away.
enum Conn {
    V4(rumqttc::Client, std::sync::mpsc::Receiver<V4Event>, Pump),
    V5(
        rumqttc::v5::Client,
        std::sync::mpsc::Receiver<V5Event>,
        Pump,
    ),
}

/// The stop flag of a connection's pump thread.
struct Pump(Arc<std::sync::atomic::AtomicBool>);

impl Drop for Pump {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Events between the client's connection and its reader. Overflow policy: block.
/// A reader that falls this far behind stops the pump, so the connection stops being
/// read and TCP pushes back on the broker (which queues or drops for a slow
/// subscriber by its own limits); nothing grows here.
pub const PUMP_QUEUE: usize = 4096;

/// Runs `poll` on a thread of its own until it ends, `stop` is set or nobody listens;
/// after an error it waits the backoff before polling again.
fn pump<T: Send + 'static>(
    stop: Arc<std::sync::atomic::AtomicBool>,
    is_err: fn(&T) -> bool,
    mut poll: impl FnMut() -> Option<T> + Send + 'static,
) -> std::sync::mpsc::Receiver<T> {
    let (tx, rx) = std::sync::mpsc::sync_channel(PUMP_QUEUE);
    let spawned = std::thread::Builder::new()
        .name("mqtt-pump".into())
        .spawn(move || {
            let keep = || !stop.load(std::sync::atomic::Ordering::Relaxed);
            let mut failures = 0u32;
            while keep() {
                let Some(ev) = poll() else { break };
                let err = is_err(&ev);
                if tx.send(ev).is_err() {
                    break;
                }
                if err {
                    failures += 1;
                    sleep_while(backoff(failures), &keep);
                } else {
                    failures = 0;
                }
            }
        });
    if let Err(e) = spawned {
        warn!(error = %e, "cannot start the mqtt thread");
    }
    rx
}

fn oversize(debug: &str) -> bool {
    debug.contains("PayloadSizeLimitExceeded") || debug.contains("PayloadTooLong")
}

impl Conn {
    fn open(
        cfg: &MqttConfig,
        host: &str,
        port: u16,
        tls: Option<Arc<rustls::ClientConfig>>,
    ) -> Conn {
        let id = cfg.client_id.clone().unwrap_or_else(default_client_id);
        let keep_alive = Duration::from_secs(cfg.keep_alive_s.max(5));
        let hard = HARD_PACKET_LIMIT.max(cfg.max_packet_bytes.saturating_mul(8));
        let creds = cfg.username.clone().zip(cfg.password.clone());
        if cfg.protocol == "5" {
            let mut o = rumqttc::v5::MqttOptions::new(id, host, port);
            o.set_keep_alive(keep_alive);
            o.set_max_packet_size(Some(u32::try_from(hard).unwrap_or(u32::MAX)));
            o.set_clean_start(true);
            if let Some(t) = tls {
                o.set_transport(rumqttc::Transport::tls_with_config(
                    rumqttc::TlsConfiguration::Rustls(t),
                ));
            }
            if let Some((u, p)) = creds {
                o.set_credentials(u, p);
            }
            let (c, mut conn) = rumqttc::v5::Client::new(o, 64);
            let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let rx = pump(
                stop.clone(),
                |e: &V5Event| e.is_err(),
                move || conn.recv().ok(),
            );
            Conn::V5(c, rx, Pump(stop))
        } else {
            let mut o = MqttOptions::new(id, host, port);
            o.set_keep_alive(keep_alive);
            o.set_max_packet_size(hard, 64 * 1024);
            o.set_clean_session(true);
            if let Some(t) = tls {
                o.set_transport(rumqttc::Transport::tls_with_config(
                    rumqttc::TlsConfiguration::Rustls(t),
                ));
            }
            if let Some((u, p)) = creds {
                o.set_credentials(u, p);
            }
            let (c, mut conn) = Client::new(o, 64);
            let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let rx = pump(
                stop.clone(),
                |e: &V4Event| e.is_err(),
                move || conn.recv().ok(),
            );
            Conn::V4(c, rx, Pump(stop))
        }
    }

    fn next(&mut self, wait: Duration) -> Step {
        use std::sync::mpsc::RecvTimeoutError as Rt;
        match self {
            Conn::V4(_, conn, _) => match conn.recv_timeout(wait) {
                Err(Rt::Timeout) => Step::Idle,
                Err(Rt::Disconnected) => Step::Closed,
                Ok(Ok(MqttEvent::Incoming(Packet::ConnAck(_)))) => Step::ConnAck,
                Ok(Ok(MqttEvent::Incoming(Packet::Publish(p)))) => Step::Publish {
                    topic: p.topic,
                    payload: p.payload,
                },
                Ok(Ok(_)) => Step::Other,
                Ok(Err(e)) => Step::Error {
                    oversize: oversize(&format!("{e:?}")),
                    message: e.to_string(),
                },
            },
            Conn::V5(_, conn, _) => {
                use rumqttc::v5::mqttbytes::v5::Packet as P5;
                match conn.recv_timeout(wait) {
                    Err(Rt::Timeout) => Step::Idle,
                    Err(Rt::Disconnected) => Step::Closed,
                    Ok(Ok(rumqttc::v5::Event::Incoming(P5::ConnAck(_)))) => Step::ConnAck,
                    Ok(Ok(rumqttc::v5::Event::Incoming(P5::Publish(p)))) => Step::Publish {
                        topic: String::from_utf8_lossy(&p.topic).into_owned(),
                        payload: p.payload,
                    },
                    Ok(Ok(_)) => Step::Other,
                    Ok(Err(e)) => Step::Error {
                        oversize: oversize(&format!("{e:?}")),
                        message: e.to_string(),
                    },
                }
            }
        }
    }

    /// Queues a QoS 0 publish without blocking (a full request queue refuses it).
    fn publish(&self, topic: &str, payload: Vec<u8>) -> Result<(), String> {
        match self {
            Conn::V4(c, ..) => c
                .try_publish(topic, QoS::AtMostOnce, false, payload)
                .map_err(|e| e.to_string()),
            Conn::V5(c, ..) => c
                .try_publish(
                    topic,
                    rumqttc::v5::mqttbytes::QoS::AtMostOnce,
                    false,
                    payload,
                )
                .map_err(|e| e.to_string()),
        }
    }

    fn subscribe(&self, filter: &str, qos: u8) -> Result<(), String> {
        match self {
            Conn::V4(c, ..) => c
                .try_subscribe(
                    filter,
                    if qos == 1 {
                        QoS::AtLeastOnce
                    } else {
                        QoS::AtMostOnce
                    },
                )
                .map_err(|e| e.to_string()),
            Conn::V5(c, ..) => {
                use rumqttc::v5::mqttbytes::QoS as Q5;
                c.try_subscribe(
                    filter,
                    if qos == 1 {
                        Q5::AtLeastOnce
                    } else {
                        Q5::AtMostOnce
                    },
                )
                .map_err(|e| e.to_string())
            }
        }
    }

    fn disconnect(&self) {
        let _ = match self {
            Conn::V4(c, _, pump) => {
                pump.0.store(true, std::sync::atomic::Ordering::Relaxed);
                c.try_disconnect().map_err(|e| e.to_string())
            }
            Conn::V5(c, _, pump) => {
                pump.0.store(true, std::sync::atomic::Ordering::Relaxed);
                c.try_disconnect().map_err(|e| e.to_string())
            }
        };
    }
}

/// What a [`Link`] saw.
#[derive(Debug, Clone, PartialEq)]
pub enum LinkEvent {
    /// Connected (again); the subscriptions are renewed.
    Connected,
    Message {
        topic: String,
        payload: Vec<u8>,
    },
    Disconnected(String),
}

/// A two-way MQTT 3.1.1 connection for the agent protocol: publish from any thread,
/// incoming messages on a channel. A thread of its own drives the connection,
/// reconnects with backoff and subscribes again after every reconnect.
pub struct Link {
    client: Client,
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// Messages dropped: outgoing ones refused because the queue was full (broker
    /// unreachable), incoming ones because the reader fell [`LINK_QUEUE`] behind.
    pub dropped: Arc<std::sync::atomic::AtomicU64>,
}

/// Incoming messages a [`Link`] holds for a slow reader before it drops them.
pub const LINK_QUEUE: usize = 4096;

/// A last will: published by the broker when the connection dies uncleanly.
#[derive(Debug, Clone)]
pub struct Will {
    pub topic: String,
    pub payload: Vec<u8>,
    pub retain: bool,
}

impl Link {
    /// Connects (in the background) and subscribes to `filters` at QoS 1; what arrives
    /// comes out of the receiver.
    pub fn open(
        cfg: &MqttConfig,
        filters: Vec<String>,
        will: Option<Will>,
    ) -> Result<(Link, std::sync::mpsc::Receiver<LinkEvent>), MqttConfigError> {
        let (host, port, secure) = parse_url(&cfg.url)?;
        if cfg.protocol != "3.1.1" {
            return Err(MqttConfigError::BadProtocol(format!(
                "{} (the agent protocol speaks MQTT 3.1.1)",
                cfg.protocol
            )));
        }
        let tls = match (secure, &cfg.tls) {
            (false, Some(_)) => return Err(MqttConfigError::TlsWithoutMqtts(cfg.url.clone())),
            (false, None) => None,
            (true, t) => Some(Arc::new(
                client_config(&t.clone().unwrap_or_default()).map_err(MqttConfigError::Tls)?,
            )),
        };
        let id = cfg.client_id.clone().unwrap_or_else(default_client_id);
        let mut o = MqttOptions::new(id, host, port);
        o.set_keep_alive(Duration::from_secs(cfg.keep_alive_s.max(5)));
        let hard = HARD_PACKET_LIMIT.max(cfg.max_packet_bytes.saturating_mul(8));
        o.set_max_packet_size(hard, hard);
        o.set_clean_session(true);
        if let Some(t) = tls {
            o.set_transport(rumqttc::Transport::tls_with_config(
                rumqttc::TlsConfiguration::Rustls(t),
            ));
        }
        if let Some((u, p)) = cfg.username.clone().zip(cfg.password.clone()) {
            o.set_credentials(u, p);
        }
        if let Some(w) = will {
            o.set_last_will(rumqttc::LastWill::new(
                w.topic,
                w.payload,
                QoS::AtLeastOnce,
                w.retain,
            ));
        }
        let (client, mut conn) = Client::new(o, 1024);
        let (tx, events) = std::sync::mpsc::sync_channel(LINK_QUEUE);
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let sub = client.clone();
        let url = cfg.url.clone();
        let halt = stop.clone();
        let polled = pump(
            stop.clone(),
            |e: &V4Event| e.is_err(),
            move || conn.recv().ok(),
        );
        let dropped = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let lost = dropped.clone();
        let thread = std::thread::Builder::new()
            .name("mqtt-link".into())
            .spawn(move || {
                let keep = || !halt.load(std::sync::atomic::Ordering::Relaxed);
                let mut failures = 0u32;
                while keep() {
                    let ev = match polled.recv_timeout(Duration::from_millis(100)) {
                        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => continue,
                        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
                        Ok(ev) => ev,
                    };
                    // a full queue drops incoming messages (counted) rather than memory
                    let send = |e: LinkEvent| match tx.try_send(e) {
                        Err(std::sync::mpsc::TrySendError::Disconnected(_)) => Err(()),
                        Err(std::sync::mpsc::TrySendError::Full(_)) => {
                            lost.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            Ok(())
                        }
                        Ok(()) => Ok(()),
                    };
                    let sent = match ev {
                        Ok(MqttEvent::Incoming(Packet::ConnAck(_))) => {
                            failures = 0;
                            for f in &filters {
                                if let Err(e) = sub.try_subscribe(f.clone(), QoS::AtLeastOnce) {
                                    warn!(filter = %f, error = %e, "mqtt subscribe failed");
                                }
                            }
                            info!(url = %url, filters = ?filters, "mqtt connected");
                            send(LinkEvent::Connected)
                        }
                        Ok(MqttEvent::Incoming(Packet::Publish(p))) => send(LinkEvent::Message {
                            topic: p.topic,
                            payload: p.payload.to_vec(),
                        }),
                        // a clean disconnect asked by `close`: done
                        Ok(MqttEvent::Outgoing(rumqttc::Outgoing::Disconnect)) => break,
                        Ok(_) => Ok(()),
                        Err(e) => {
                            failures += 1;
                            let retry_in = backoff(failures);
                            // the pump waits `retry_in` before it tries again
                            warn!(url = %url, error = %e, retry_in_ms = retry_in.as_millis() as u64, "mqtt connection lost");
                            send(LinkEvent::Disconnected(e.to_string()))
                        }
                    };
                    if sent.is_err() {
                        break;
                    }
                }
            })
            .map_err(|e| MqttConfigError::BadUrl(format!("cannot start the mqtt thread: {e}")))?;
        Ok((
            Link {
                client,
                stop,
                thread: Some(thread),
                dropped,
            },
            events,
        ))
    }

    /// Queues a message; never blocks. A full queue (the broker has been unreachable
    /// for a while) refuses it and counts it.
    pub fn publish(&self, topic: &str, payload: Vec<u8>, qos1: bool, retain: bool) -> bool {
        let qos = if qos1 {
            QoS::AtLeastOnce
        } else {
            QoS::AtMostOnce
        };
        match self.client.try_publish(topic, qos, retain, payload) {
            Ok(()) => true,
            Err(_) => {
                self.dropped
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                false
            }
        }
    }

    /// Sends what is queued (waiting up to `linger`), disconnects and stops the thread.
    pub fn close(&mut self, linger: Duration) {
        std::thread::sleep(linger);
        let _ = self.client.try_disconnect();
        let end = Instant::now() + Duration::from_secs(2);
        while Instant::now() < end && self.thread.as_ref().is_some_and(|t| !t.is_finished()) {
            std::thread::sleep(Duration::from_millis(10));
        }
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// `powerplane-{pid}-{n}`: unique per source in a process, since a broker drops the
/// older of two connections with one client id.
fn default_client_id() -> String {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(1);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("powerplane-{}-{n}", std::process::id())
}

/// 0.5 s, 1 s, 2 s ... up to 30 s.
pub fn backoff(failures: u32) -> Duration {
    let ms = 500u64.saturating_mul(1u64 << failures.saturating_sub(1).min(6));
    Duration::from_millis(ms.min(30_000))
}

fn sleep_while(d: Duration, keep_going: &dyn Fn() -> bool) {
    let end = Instant::now() + d;
    while Instant::now() < end && keep_going() {
        std::thread::sleep(
            Duration::from_millis(50).min(end.saturating_duration_since(Instant::now())),
        );
    }
}

/// (host, port, TLS or not).
fn parse_url(url: &str) -> Result<(String, u16, bool), MqttConfigError> {
    let bad = || MqttConfigError::BadUrl(url.to_string());
    let (rest, secure) = if let Some(r) = url
        .strip_prefix("mqtt://")
        .or_else(|| url.strip_prefix("tcp://"))
    {
        (r, false)
    } else if let Some(r) = url
        .strip_prefix("mqtts://")
        .or_else(|| url.strip_prefix("ssl://"))
    {
        (r, true)
    } else {
        return Err(bad());
    };
    let rest = rest.trim_end_matches('/');
    let (host, port) = match rest.rsplit_once(':') {
        Some((h, p)) => (h, p.parse::<u16>().map_err(|_| bad())?),
        None => (rest, if secure { 8883 } else { 1883 }),
    };
    if host.is_empty() {
        return Err(bad());
    }
    Ok((host.to_string(), port, secure))
}

#[cfg(test)]
mod tests {
    use super::*;

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
            parse_url("mqtt://127.0.0.1:1884"),
            Ok(("127.0.0.1".into(), 1884, false))
        );
        assert_eq!(
            parse_url("tcp://broker"),
            Ok(("broker".into(), 1883, false))
        );
        assert_eq!(parse_url("mqtts://b"), Ok(("b".into(), 8883, true)));
        assert_eq!(
            parse_url("http://x"),
            Err(MqttConfigError::BadUrl("http://x".into()))
        );
        assert_eq!(
            parse_url("mqtt://:1"),
            Err(MqttConfigError::BadUrl("mqtt://:1".into()))
        );
    }

    #[test]
    fn backoff_grows_and_is_bounded() {
        let d: Vec<u64> = (1..=10).map(|f| backoff(f).as_millis() as u64).collect();
        assert_eq!(
            d,
            vec![500, 1000, 2000, 4000, 8000, 16000, 30000, 30000, 30000, 30000]
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
}

#[cfg(test)]
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
