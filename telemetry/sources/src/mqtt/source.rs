//! [`MqttSource`]: subscribes to what the mapping needs and turns each message into
//! samples (or rejects, with a reason), asking Sparkplug edge nodes for a rebirth when
//! their state is lost.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tracing::{info, warn};

use super::conn::{Conn, Step};
use super::{backoff, parse_url, MqttConfig, MqttConfigError};
use crate::tls::client_config;
use telemetry::decoder::Decoder;
use telemetry::mapping::{Decoded, Mapping, Reject};
use telemetry::Timestamp;

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
pub(super) struct Rebirths {
    pub(super) last: BTreeMap<(String, String), Instant>,
}

impl Rebirths {
    pub(super) fn allow(&mut self, group: &str, node: &str, every: Duration, now: Instant) -> bool {
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
    pub(super) cfg: MqttConfig,
    decoder: Decoder,
    host: String,
    port: u16,
    tls: Option<Arc<rustls::ClientConfig>>,
    filters: Vec<String>,
    pub counters: Counters,
    /// A copy of `counters` as of the last event, for [`crate::source::Stats`].
    pub(super) shared: Arc<Mutex<Counters>>,
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
        let limits = cfg.sparkplug_limits()?;
        Ok(MqttSource {
            cfg,
            decoder: Decoder::with_limits(mapping, limits),
            host,
            port,
            tls,
            filters,
            counters: Counters::default(),
            shared: Arc::default(),
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
                    self.connected(&conn);
                    self.share();
                    sink(Event::Connected);
                }
                Step::Publish { topic, payload } => {
                    let decoded =
                        self.message(&conn, &topic, &payload, &source, clock, &mut limiter);
                    self.share();
                    sink(Event::Message {
                        bytes: payload.len(),
                        topic,
                        decoded,
                    });
                }
                Step::Error { message, oversize } => {
                    failures += 1;
                    let lost = self.lost(message, oversize, failures);
                    self.share();
                    sink(lost);
                }
            }
        }
        conn.disconnect();
    }
}

impl MqttSource {
    /// Makes the counters as they are now readable elsewhere.
    fn share(&self) {
        *self.shared.lock().unwrap_or_else(|p| p.into_inner()) = self.counters.clone();
    }

    /// Connected (again): subscribes to every filter.
    fn connected(&mut self, conn: &Conn) {
        self.counters.connects += 1;
        for f in &self.filters {
            if let Err(e) = conn.subscribe(f, self.cfg.qos) {
                warn!(filter = %f, error = %e, "mqtt subscribe failed");
            }
        }
        info!(url = %self.cfg.url, protocol = %self.cfg.protocol, filters = ?self.filters, "mqtt connected");
    }

    /// One message decoded (or rejected as oversize), counted and its rejects logged;
    /// a rebirth it calls for is requested.
    fn message(
        &mut self,
        conn: &Conn,
        topic: &str,
        payload: &[u8],
        source: &str,
        clock: &dyn Fn() -> Timestamp,
        limiter: &mut telemetry::log_limit::LogLimiter,
    ) -> Decoded {
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
            self.decoder.decode(topic, payload, source, clock())
        };
        if let Some(r) = decoded.rebirth.as_mut() {
            self.rebirth(conn, r, clock(), limiter);
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
        decoded
    }

    /// The connection failed or dropped after `failures` failures in a row.
    fn lost(&mut self, message: String, oversize: bool, failures: u32) -> Event {
        self.counters.disconnects += 1;
        if oversize {
            *self.counters.rejects.entry("oversize").or_default() += 1;
        }
        let retry_in = backoff(failures);
        warn!(url = %self.cfg.url, error = %message, retry_in_ms = retry_in.as_millis() as u64, "mqtt connection lost");
        // the connection's pump thread waits `retry_in` before it tries again
        Event::Disconnected {
            error: message,
            retry_in,
        }
    }
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
