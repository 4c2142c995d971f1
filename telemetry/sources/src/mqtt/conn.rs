//! One client connection, MQTT 3.1.1 or 5, and the pump thread that drives it.

use std::sync::Arc;
use std::time::Duration;

use rumqttc::{Client, Event as MqttEvent, MqttOptions, Packet, QoS};
use thiserror::Error;
use tracing::warn;

use super::{backoff, default_client_id, jittered, sleep_while, MqttConfig, HARD_PACKET_LIMIT};

/// Why the client did not queue a request (its request queue is full or closed).
#[derive(Debug, Error)]
pub(super) enum RequestError {
    #[error(transparent)]
    V4(Box<rumqttc::ClientError>),
    #[error(transparent)]
    V5(Box<rumqttc::v5::ClientError>),
}

/// What the connection produced.
pub(super) enum Step {
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

pub(super) type V4Event = Result<MqttEvent, rumqttc::ConnectionError>;
type V5Event = Result<rumqttc::v5::Event, rumqttc::v5::ConnectionError>;

/// One client connection, MQTT 3.1.1 or 5, seen through what the source needs.
///
/// A pump thread drives the connection with blocking polls: a poll cut short by a
/// timeout would abandon a connect in progress (rumqttc connects inside the poll), so
/// a broker slower than the timeout would never be reached. The pump backs off after
/// an error and stops when told to or when the receiver goes away.
pub(super) enum Conn {
    V4(rumqttc::Client, std::sync::mpsc::Receiver<V4Event>, Pump),
    V5(
        rumqttc::v5::Client,
        std::sync::mpsc::Receiver<V5Event>,
        Pump,
    ),
}

/// The stop flag of a connection's pump thread.
pub(super) struct Pump(Arc<std::sync::atomic::AtomicBool>);

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
pub(super) fn pump<T: Send + 'static>(
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
                    sleep_while(jittered(backoff(failures)), &keep);
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
    pub(super) fn open(
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

    pub(super) fn next(&mut self, wait: Duration) -> Step {
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
    pub(super) fn publish(&self, topic: &str, payload: Vec<u8>) -> Result<(), RequestError> {
        match self {
            Conn::V4(c, ..) => c
                .try_publish(topic, QoS::AtMostOnce, false, payload)
                .map_err(|e| RequestError::V4(Box::new(e))),
            Conn::V5(c, ..) => c
                .try_publish(
                    topic,
                    rumqttc::v5::mqttbytes::QoS::AtMostOnce,
                    false,
                    payload,
                )
                .map_err(|e| RequestError::V5(Box::new(e))),
        }
    }

    pub(super) fn subscribe(&self, filter: &str, qos: u8) -> Result<(), RequestError> {
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
                .map_err(|e| RequestError::V4(Box::new(e))),
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
                .map_err(|e| RequestError::V5(Box::new(e)))
            }
        }
    }

    pub(super) fn disconnect(&self) {
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
