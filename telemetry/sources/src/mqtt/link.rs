//! [`Link`]: the two-way MQTT 3.1.1 connection of the agent protocol.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rumqttc::{Client, Event as MqttEvent, MqttOptions, Packet, QoS};
use tracing::{info, warn};

use super::conn::{pump, V4Event};
use super::{
    backoff, default_client_id, parse_url, MqttConfig, MqttConfigError, HARD_PACKET_LIMIT,
};
use crate::tls::client_config;

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
        let o = options(cfg, will)?;
        let (client, mut conn) = Client::new(o, 1024);
        let (tx, events) = std::sync::mpsc::sync_channel(LINK_QUEUE);
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let polled = pump(
            stop.clone(),
            |e: &V4Event| e.is_err(),
            move || conn.recv().ok(),
        );
        let dropped = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let reader = Reader {
            polled,
            tx,
            sub: client.clone(),
            filters,
            url: cfg.url.clone(),
            halt: stop.clone(),
            lost: dropped.clone(),
        };
        let thread = std::thread::Builder::new()
            .name("mqtt-link".into())
            .spawn(move || reader.run())
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

/// The client's options for `cfg`: MQTT 3.1.1 only, TLS for `mqtts://`, credentials and
/// the last will.
fn options(cfg: &MqttConfig, will: Option<Will>) -> Result<MqttOptions, MqttConfigError> {
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
    Ok(o)
}

/// The link's thread: takes the pump's events, subscribes on every connect and hands
/// messages to the owner's channel.
struct Reader {
    polled: std::sync::mpsc::Receiver<V4Event>,
    tx: std::sync::mpsc::SyncSender<LinkEvent>,
    sub: Client,
    filters: Vec<String>,
    url: String,
    halt: Arc<std::sync::atomic::AtomicBool>,
    lost: Arc<std::sync::atomic::AtomicU64>,
}

impl Reader {
    fn run(self) {
        let keep = || !self.halt.load(std::sync::atomic::Ordering::Relaxed);
        let mut failures = 0u32;
        while keep() {
            let ev = match self.polled.recv_timeout(Duration::from_millis(100)) {
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => continue,
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
                Ok(ev) => ev,
            };
            let sent = match ev {
                Ok(MqttEvent::Incoming(Packet::ConnAck(_))) => {
                    failures = 0;
                    for f in &self.filters {
                        if let Err(e) = self.sub.try_subscribe(f.clone(), QoS::AtLeastOnce) {
                            warn!(filter = %f, error = %e, "mqtt subscribe failed");
                        }
                    }
                    info!(url = %self.url, filters = ?self.filters, "mqtt connected");
                    self.send(LinkEvent::Connected)
                }
                Ok(MqttEvent::Incoming(Packet::Publish(p))) => self.send(LinkEvent::Message {
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
                    warn!(url = %self.url, error = %e, retry_in_ms = retry_in.as_millis() as u64, "mqtt connection lost");
                    self.send(LinkEvent::Disconnected(e.to_string()))
                }
            };
            if sent.is_err() {
                break;
            }
        }
    }

    /// A full queue drops incoming messages (counted) rather than memory; Err: nobody
    /// listens any more.
    fn send(&self, e: LinkEvent) -> Result<(), ()> {
        match self.tx.try_send(e) {
            Err(std::sync::mpsc::TrySendError::Disconnected(_)) => Err(()),
            Err(std::sync::mpsc::TrySendError::Full(_)) => {
                self.lost.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                Ok(())
            }
            Ok(()) => Ok(()),
        }
    }
}
