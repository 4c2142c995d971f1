//! The MQTT source: subscribes to what the mapping needs and turns each message into
//! samples (or rejects, with a reason). It reconnects with backoff and resubscribes
//! after every reconnect. A message larger than `max_packet_bytes` is rejected and
//! counted without dropping the connection; only a packet over [`HARD_PACKET_LIMIT`]
//! makes the client drop the connection (and reconnect), to bound memory.
//!
//! # Layout
//! - `mod.rs`: the `[mqtt]` client settings ([`MqttConfig`]), their errors, the URL
//!   and the backoff (with jitter) shared by both clients
//! - `source.rs`: [`MqttSource`], the telemetry source (JSON and Sparkplug B mappings)
//! - `link.rs`: [`Link`], the two-way connection of the agent protocol
//! - `as_source.rs`: [`MqttSource`] as a [`crate::source::Source`] (feature `source`)
//! - `conn.rs`: one client connection (MQTT 3.1.1 or 5) and the thread that pumps it

use std::time::{Duration, Instant};

use serde::Deserialize;
use thiserror::Error;

use crate::secret::PasswordError;
use crate::tls::{Tls, TlsError};

#[cfg(feature = "source")]
mod as_source;
mod conn;
mod link;
mod source;

pub use conn::PUMP_QUEUE;
pub use link::{Link, LinkEvent, Will, LINK_QUEUE};
#[cfg(test)]
use source::Rebirths;
pub use source::{Counters, Event, MqttSource};

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
    /// Sparkplug B: aliased metrics one edge node may hold (its own and all its
    /// devices'); a birth beyond it is refused (`too_many_metrics`).
    #[serde(default = "default_max_metrics_per_node")]
    pub sparkplug_max_metrics_per_node: usize,
    /// Sparkplug B: aliased metrics all edge nodes together may hold.
    #[serde(default = "default_max_metrics")]
    pub sparkplug_max_metrics: usize,
    /// Sparkplug B: the memory all edge nodes' state may take, in MiB.
    #[serde(default = "default_max_mib")]
    pub sparkplug_max_mib: usize,
    /// Sparkplug B: an edge node silent this long is forgotten (as after its death);
    /// 0 keeps it until its death.
    #[serde(default = "default_idle_s")]
    pub sparkplug_idle_s: f64,
}

fn default_max_metrics_per_node() -> usize {
    telemetry::sparkplug::DEFAULT_MAX_METRICS_PER_NODE
}

fn default_max_metrics() -> usize {
    telemetry::sparkplug::DEFAULT_MAX_METRICS
}

fn default_max_mib() -> usize {
    telemetry::sparkplug::DEFAULT_MAX_BYTES >> 20
}

fn default_idle_s() -> f64 {
    telemetry::sparkplug::DEFAULT_IDLE_S
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
    pub fn read_secrets(&mut self, base: &std::path::Path) -> Result<(), PasswordError> {
        let Some(f) = self.password_file.take() else {
            return Ok(());
        };
        if self.password.is_some() {
            return Err(PasswordError::Both);
        }
        let password = crate::secret::read(base, &f).map_err(PasswordError::File)?;
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
            sparkplug_max_metrics_per_node: default_max_metrics_per_node(),
            sparkplug_max_metrics: default_max_metrics(),
            sparkplug_max_mib: default_max_mib(),
            sparkplug_idle_s: default_idle_s(),
        }
    }

    /// The bounds of the Sparkplug B state, checked: a bound of 0, a node bound above
    /// the total, or an idle time out of 0..=30 days is an error.
    pub fn sparkplug_limits(&self) -> Result<telemetry::sparkplug::Limits, MqttConfigError> {
        let bad = |what: String| Err(MqttConfigError::BadSparkplugLimit(what));
        let (per_node, total, mib, idle) = (
            self.sparkplug_max_metrics_per_node,
            self.sparkplug_max_metrics,
            self.sparkplug_max_mib,
            self.sparkplug_idle_s,
        );
        if !(1..=1_000_000).contains(&per_node) {
            return bad(format!(
                "sparkplug_max_metrics_per_node must be within 1..=1000000, got {per_node}"
            ));
        }
        if !(per_node..=10_000_000).contains(&total) {
            return bad(format!(
                "sparkplug_max_metrics must be within sparkplug_max_metrics_per_node ({per_node})..=10000000, got {total}"
            ));
        }
        if !(1..=16_384).contains(&mib) {
            return bad(format!(
                "sparkplug_max_mib must be within 1..=16384, got {mib}"
            ));
        }
        if !(0.0..=30.0 * 86_400.0).contains(&idle) {
            return bad(format!(
                "sparkplug_idle_s must be within 0..=2592000 (30 days), got {idle}"
            ));
        }
        Ok(telemetry::sparkplug::Limits {
            max_metrics_per_node: per_node,
            max_metrics: total,
            max_bytes: mib << 20,
            idle_ms: (idle * 1000.0) as i64,
        })
    }
}

#[derive(Debug, Error)]
pub enum MqttConfigError {
    #[error("mqtt url {0:?}: expected mqtt://host[:port]")]
    BadUrl(String),
    #[error("mqtt url {0:?}: tls settings need an mqtts:// url")]
    TlsWithoutMqtts(String),
    #[error("mqtt tls: {0}")]
    Tls(#[source] TlsError),
    #[error("mqtt qos must be 0 or 1, got {0}")]
    BadQos(u8),
    #[error("mqtt protocol must be \"3.1.1\" or \"5\", got {0:?}")]
    BadProtocol(String),
    #[error("mqtt: nothing to subscribe to (no topics and an empty mapping)")]
    NoTopics,
    #[error("mqtt {0}")]
    BadSparkplugLimit(String),
}

/// `powerplane-{pid}-{n}`: unique per source in a process, since a broker drops the
/// older of two connections with one client id.
fn default_client_id() -> String {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(1);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("powerplane-{}-{n}", std::process::id())
}

/// The longest wait between reconnects (before jitter): a broker that comes back
/// has its clients back within about this long (tested: telemetry within 5 s).
pub const MAX_BACKOFF: Duration = Duration::from_secs(3);

/// 0.5 s, 1 s, 2 s, then 3 s ([`MAX_BACKOFF`]) between tries, before [`jittered`].
/// A broker is one process on the local network: trying every 3 s costs it nothing,
/// and a longer wait would leave the controller blind after it is back.
pub fn backoff(failures: u32) -> Duration {
    let ms = 500u64.saturating_mul(1u64 << failures.saturating_sub(1).min(3));
    Duration::from_millis(ms).min(MAX_BACKOFF)
}

/// `d` spread over 0.8..1.2 of itself, so that the clients a broker's restart
/// dropped together do not all come back in the same instant.
pub fn jittered(d: Duration) -> Duration {
    d.mul_f64(0.8 + 0.4 * crate::jitter::unit())
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
pub(crate) fn parse_url(url: &str) -> Result<(String, u16, bool), MqttConfigError> {
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
mod tests;
