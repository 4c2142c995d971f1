//! OpenADR 3 notifications over MQTT, where the VTN offers them (`GET /notifiers`
//! names a broker): the VEN subscribes to the topics the VTN names for events (its
//! own, `GET /notifiers/mqtt/topics/vens/{venID}/events`, and every VEN's,
//! `GET /notifiers/mqtt/topics/events`) and polls at once when a message comes. The
//! message itself is not trusted: the poll that follows reads what the VTN holds. The
//! broker going away costs nothing but latency: the VEN keeps polling every `poll_s`,
//! and the client reconnects with a backoff (a poll follows each subscription, to catch
//! up on what was missed; `openadr_notifier_connections_total` counts them).
//!
//! The client is rumqttc's async one on the VEN's runtime (a task of its own, stopped
//! with the VEN); its request channel is bounded (16) and only subscriptions go through
//! it (`try_subscribe`: never waited on).
//!
//! With `OAUTH2_BEARER_TOKEN`, the password is the VEN's bearer token, which expires:
//! each reconnection presents the token the VEN holds then (a watch the VEN writes
//! each time it takes one), and a broker that refuses the token (bad username or
//! password, not authorized) makes the VEN take a new one at once
//! (`openadr_notifier_refusals_total`), so the notifier outlives its first token.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rumqttc::{
    AsyncClient, ConnectReturnCode, ConnectionError, Event, MqttOptions, Packet, QoS, Transport,
};
use serde_json::Value;
use tokio::sync::{watch, Notify};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::openadr2b::call::Counters;
use crate::tls::Tls;

/// The broker a VTN names in `GET /notifiers` (`mqtt.URIS[0]`), and how it
/// authenticates clients (`ANONYMOUS` or `OAUTH2_BEARER_TOKEN` with its username:
/// `{clientID}` stands for the client's id).
#[derive(Debug, Clone, PartialEq)]
pub struct Broker {
    pub uri: String,
    /// `None`: anonymous; `Some(username)`: the bearer token as the password.
    pub bearer_username: Option<String>,
}

/// The MQTT notifier of a `GET /notifiers` answer, if the VTN offers one.
pub fn broker(body: &[u8]) -> Option<Broker> {
    let v: Value = serde_json::from_slice(body).ok()?;
    let m = v.get("mqtt").or_else(|| v.get("MQTT"))?;
    let uri = m
        .get("URIS")
        .or_else(|| m.get("uris"))?
        .as_array()?
        .iter()
        .find_map(Value::as_str)?
        .to_string();
    let auth = m.get("authentication");
    let method = auth
        .and_then(|a| a.get("method"))
        .and_then(Value::as_str)
        .unwrap_or("ANONYMOUS");
    // the spec's OAUTH2_BEARER_TOKEN; openleadr-vtn 0.2 writes OAUTH2BEARERTOKEN
    let bearer = method
        .replace('_', "")
        .eq_ignore_ascii_case("OAUTH2BEARERTOKEN");
    let bearer_username = bearer.then(|| {
        auth.and_then(|a| a.get("username"))
            .and_then(Value::as_str)
            .unwrap_or("{clientID}")
            .to_string()
    });
    Some(Broker {
        uri,
        bearer_username,
    })
}

/// The topics of a `GET /notifiers/mqtt/topics/…` answer: `ALL` where given (a
/// wildcard), else each operation's.
pub fn topics(body: &[u8]) -> Vec<String> {
    let Ok(v) = serde_json::from_slice::<Value>(body) else {
        return Vec::new();
    };
    let Some(t) = v.get("topics").and_then(Value::as_object) else {
        return Vec::new();
    };
    let get = |k: &str| {
        t.iter()
            .find(|(name, _)| name.eq_ignore_ascii_case(k))
            .and_then(|(_, v)| v.as_str())
            .map(str::to_string)
    };
    if let Some(all) = get("ALL") {
        return vec![all];
    }
    ["CREATE", "UPDATE", "DELETE"]
        .iter()
        .filter_map(|k| get(k))
        .collect()
}

/// What the notifier needs to run.
pub struct Subscription {
    pub broker: Broker,
    pub topics: Vec<String>,
    pub client_id: String,
    /// The VEN's bearer token now (the password under `OAUTH2_BEARER_TOKEN`).
    pub token: watch::Receiver<String>,
    /// Set when the broker refused the token: the VEN takes a new one at once.
    pub renew: Arc<AtomicBool>,
    pub tls: Tls,
}

/// Whether the broker refused the client's credentials (as opposed to being away).
fn refused_credentials(e: &ConnectionError) -> bool {
    matches!(
        e,
        ConnectionError::ConnectionRefused(
            ConnectReturnCode::BadUserNamePassword | ConnectReturnCode::NotAuthorized
        )
    )
}

/// Why the notifier cannot start (the VEN then polls only).
#[derive(Debug, thiserror::Error)]
pub enum NotifierError {
    #[error("the VTN's broker: {0}")]
    Url(#[from] crate::mqtt::MqttConfigError),
    #[error("TLS to the VTN's broker: {0}")]
    Tls(#[from] crate::tls::TlsError),
}

/// Starts a notifier of its own on the current runtime, with its own counters (the
/// VEN's `openadr_notifier_*`, `openadr_notifications_total` and
/// `openadr_errors_total{reason="notifier"}`): every message on the topics (and every
/// subscription) wakes `wake`. Stops when `cancel` is cancelled.
pub fn start(
    s: Subscription,
    wake: Arc<Notify>,
    cancel: CancellationToken,
) -> Result<crate::source::Stats, NotifierError> {
    let counters = Arc::new(Counters::default());
    spawn(s, wake, counters.clone(), cancel)?;
    Ok(crate::source::Stats::new(move || counters.read()))
}

/// The client's options for `s`, and the username it presents with the VEN's token
/// (`None`: anonymous).
fn options(s: &Subscription) -> Result<(MqttOptions, Option<String>), NotifierError> {
    let (host, port, secure) = crate::mqtt::parse_url(&s.broker.uri)?;
    static SEQ: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let id = format!(
        "powerplane-ven-{}-{}",
        std::process::id(),
        SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    );
    let mut o = MqttOptions::new(id, host, port);
    o.set_keep_alive(Duration::from_secs(30));
    o.set_clean_session(true);
    if secure {
        let config = crate::tls::client_config(&s.tls)?;
        o.set_transport(Transport::tls_with_config(
            rumqttc::TlsConfiguration::Rustls(Arc::new(config)),
        ));
    }
    let user = s
        .broker
        .bearer_username
        .as_ref()
        .map(|u| u.replace("{clientID}", &s.client_id));
    if let Some(user) = &user {
        o.set_credentials(user.clone(), s.token.borrow().clone());
    }
    Ok((o, user))
}

/// Starts the notifier on the runtime: every message on `topics` (and every
/// connection) wakes `wake`. Stops when `cancel` is cancelled.
pub(crate) fn spawn(
    s: Subscription,
    wake: Arc<Notify>,
    counters: Arc<Counters>,
    cancel: CancellationToken,
) -> Result<(), NotifierError> {
    let (o, user) = options(&s)?;
    let (client, mut events) = AsyncClient::new(o, 16);
    let (uri, topics, mut token, renew) = (s.broker.uri.clone(), s.topics, s.token, s.renew);
    tokio::spawn(async move {
        let mut failures = 0u32;
        loop {
            let ev = tokio::select! {
                _ = cancel.cancelled() => break,
                ev = events.poll() => ev,
            };
            match ev {
                Ok(Event::Incoming(Packet::ConnAck(_))) => {
                    failures = 0;
                    for t in &topics {
                        if let Err(e) = client.try_subscribe(t.as_str(), QoS::AtLeastOnce) {
                            warn!(topic = %t, error = %e, "openadr3 notifier cannot subscribe");
                        }
                    }
                }
                // subscribed: from here on nothing is missed; a poll catches up on what
                // came before
                Ok(Event::Incoming(Packet::SubAck(_))) => {
                    counters.inc("openadr_notifier_connections_total");
                    info!(broker = %uri, topics = ?topics, "openadr3 notifier subscribed");
                    wake.notify_one();
                }
                Ok(Event::Incoming(Packet::Publish(_))) => {
                    counters.inc("openadr_notifications_total");
                    wake.notify_one();
                }
                Ok(_) => {}
                Err(e) => {
                    failures = failures.saturating_add(1);
                    counters.add("openadr_errors_total", ("reason", "notifier"), 1);
                    let wait = crate::openadr2b::ven::backoff(failures, 30.0);
                    if user.is_some() && refused_credentials(&e) {
                        // the token expired or was revoked: a new one, at once
                        counters.inc("openadr_notifier_refusals_total");
                        if failures == 1 {
                            warn!(broker = %uri, error = %e, "openadr3 notifier's token refused by the broker: the VEN takes a new one; polling goes on");
                        }
                        renew.store(true, Ordering::Relaxed);
                        wake.notify_one();
                    } else if failures == 1 {
                        warn!(broker = %uri, error = %e, "openadr3 notifier lost its broker: polling goes on; it reconnects");
                    }
                    tokio::select! {
                        _ = cancel.cancelled() => break,
                        _ = tokio::time::sleep(Duration::from_secs_f64(wait)) => {}
                    }
                    // the next connection presents the token the VEN holds now
                    if let Some(user) = &user {
                        if token.has_changed().unwrap_or(false) {
                            let fresh = token.borrow_and_update().clone();
                            events.mqtt_options.set_credentials(user.clone(), fresh);
                        }
                    }
                }
            }
        }
        let _ = client.try_disconnect();
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_vtns_mqtt_notifier_and_its_topics_are_read() {
        let b = broker(
            br#"{"websocket":true,"mqtt":{"URIS":["mqtt://127.0.0.1:1883"],"serialization":"JSON",
                 "authentication":{"method":"OAUTH2_BEARER_TOKEN","username":"{clientID}"}}}"#,
        )
        .expect("offered");
        assert_eq!(b.uri, "mqtt://127.0.0.1:1883");
        assert_eq!(b.bearer_username.as_deref(), Some("{clientID}"));
        let anon = broker(
            br#"{"mqtt":{"URIS":["mqtts://b:8883"],"authentication":{"method":"ANONYMOUS"}}}"#,
        )
        .expect("offered");
        assert_eq!(anon.bearer_username, None);
        // openleadr-vtn 0.2.8's spelling of the method
        let vtn = broker(
            br#"{"mqtt":{"URIS":["mqtt://b:1883"],"serialization":"JSON",
                 "authentication":{"method":"OAUTH2BEARERTOKEN","username":"{clientID}"}}}"#,
        )
        .expect("offered");
        assert_eq!(vtn.bearer_username.as_deref(), Some("{clientID}"));
        assert_eq!(broker(br#"{"websocket":true,"mqtt":null}"#), None);
        assert_eq!(broker(b"not json"), None);
        assert_eq!(
            topics(br#"{"topics":{"CREATE":"events/create","UPDATE":"events/update","DELETE":"events/delete","ALL":"events/+"}}"#),
            vec!["events/+"]
        );
        assert_eq!(
            topics(br#"{"topics":{"update":"e/u","delete":"e/d"}}"#),
            vec!["e/u", "e/d"]
        );
        assert!(topics(br#"{"topics":[]}"#).is_empty());
    }
}
