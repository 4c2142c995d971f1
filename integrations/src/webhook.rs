//! Generic schedulers over signed webhooks: job events in, actions out.
//!
//! Both directions sign with HMAC-SHA256 over `"{timestamp}.{body}"` (the timestamp
//! in Unix seconds, as sent in `X-Powerplane-Timestamp`), hex-encoded in
//! `X-Powerplane-Signature: sha256=<hex>`. A receiver rejects a timestamp further than
//! its tolerance from its clock, which bounds replays.
//!
//! Outbound actions wait in a durable outbox in the store (collection
//! `webhook_outbox`, one record per action, in sequence order) until the receiver
//! answers 2xx. Failures are retried with exponential backoff and jitter; a job's
//! actions are delivered in order (a later one waits for the earlier); an action the
//! receiver refuses (4xx other than 408 and 429) or that runs out of attempts moves to
//! the dead-letter list (`webhook_dead`). Each action carries an idempotency key
//! (`Idempotency-Key`, also `id` in the body) that stays the same across retries and
//! restarts, so a receiver that saw it already can answer 2xx and do nothing. With
//! several replicas (`[ha]`) the outbox lives in the shared store, so a new leader
//! carries on with the same keys; each body also carries the `epoch` of the leader
//! that queued it.

use std::collections::BTreeMap;

use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;
use telemetry::{Job, JobState, Timestamp};
use tracing::info;

use crate::store::{Store, StoreError, Tx};

pub const TIMESTAMP_HEADER: &str = "X-Powerplane-Timestamp";
pub const SIGNATURE_HEADER: &str = "X-Powerplane-Signature";
pub const IDEMPOTENCY_HEADER: &str = "Idempotency-Key";
pub const ATTEMPT_HEADER: &str = "X-Powerplane-Attempt";

mod delivery;
mod error;

pub use delivery::{Outcome, Sender};
pub use error::{DeliveryError, EventError, KeyTooShort, PostError};

const OUTBOX: &str = "webhook_outbox";
const DEAD: &str = "webhook_dead";
const META: &str = "webhook_meta";

/// A shared webhook key (hex, as `openssl rand -hex 32` writes, or the text itself).
#[derive(Clone)]
pub struct WebhookKey(Vec<u8>);

impl std::fmt::Debug for WebhookKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WebhookKey(..)")
    }
}

impl WebhookKey {
    pub fn from_text(text: &str) -> Result<Self, KeyTooShort> {
        let t = text.trim();
        let bytes = hex::decode(t).unwrap_or_else(|_| t.as_bytes().to_vec());
        if bytes.len() < 16 {
            return Err(KeyTooShort(bytes.len()));
        }
        Ok(WebhookKey(bytes))
    }

    fn mac(&self, timestamp: &str, body: &[u8]) -> Hmac<Sha256> {
        let mut m = <Hmac<Sha256> as Mac>::new_from_slice(&self.0).expect("hmac takes any key");
        m.update(timestamp.as_bytes());
        m.update(b".");
        m.update(body);
        m
    }

    /// `sha256=<hex>` over `"{timestamp}.{body}"`.
    pub fn sign(&self, timestamp: &str, body: &[u8]) -> String {
        format!(
            "sha256={}",
            hex::encode(self.mac(timestamp, body).finalize().into_bytes())
        )
    }

    /// Checks a request's timestamp and signature headers.
    pub fn verify(
        &self,
        timestamp: Option<&str>,
        signature: Option<&str>,
        body: &[u8],
        now: Timestamp,
        tolerance_s: f64,
    ) -> Result<(), Rejected> {
        let (Some(ts), Some(sig)) = (timestamp, signature) else {
            return Err(Rejected::Unsigned);
        };
        let secs: i64 = ts.trim().parse().map_err(|_| Rejected::BadTimestamp)?;
        if (now.as_secs_f64() - secs as f64).abs() > tolerance_s {
            return Err(Rejected::Stale);
        }
        let Some(given) = sig
            .trim()
            .strip_prefix("sha256=")
            .and_then(|h| hex::decode(h).ok())
        else {
            return Err(Rejected::BadSignature);
        };
        // constant-time comparison
        self.mac(ts.trim(), body)
            .verify_slice(&given)
            .map_err(|_| Rejected::BadSignature)
    }
}

/// Why an inbound request was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Rejected {
    Unsigned,
    BadTimestamp,
    Stale,
    BadSignature,
    BadEvent,
}

impl Rejected {
    pub fn reason(self) -> &'static str {
        match self {
            Rejected::Unsigned => "unsigned",
            Rejected::BadTimestamp => "bad_timestamp",
            Rejected::Stale => "stale_timestamp",
            Rejected::BadSignature => "bad_signature",
            Rejected::BadEvent => "bad_event",
        }
    }
}

/// What happened to a job, as a scheduler reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    Submitted,
    Started,
    Finished,
    Cancelled,
}

/// `POST /api/v1/events`: one job event.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobEvent {
    pub event: EventKind,
    /// The scheduler's name (`[a-z0-9_-]`, not `slurm`): the job's id becomes
    /// `{scheduler}:{job}`.
    pub scheduler: String,
    pub job: String,
    #[serde(default)]
    pub time: Option<String>,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub class: Option<String>,
    #[serde(default)]
    pub project: Option<String>,
    #[serde(default)]
    pub user: Option<String>,
    #[serde(default)]
    pub priority: Option<i32>,
    #[serde(default)]
    pub gpus: Option<u32>,
    /// RFC 3339.
    #[serde(default)]
    pub deadline: Option<String>,
    #[serde(default)]
    pub est_duration_s: Option<f64>,
    #[serde(default)]
    pub deferrable: Option<bool>,
    #[serde(default)]
    pub preemptible: Option<bool>,
    /// GPUs the job runs on, as entity ids (`gpu/<node>/<index>`), for cap notices.
    #[serde(default)]
    pub allocated: Option<Vec<String>>,
}

impl JobEvent {
    /// Parses and checks an event body.
    pub fn parse(body: &[u8]) -> Result<JobEvent, EventError> {
        let e: JobEvent = serde_json::from_slice(body)?;
        let ok_name = |s: &str| {
            !s.is_empty()
                && s.len() <= 64
                && s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        };
        if !ok_name(&e.scheduler) || e.scheduler == "slurm" || e.scheduler == "kubernetes" {
            return Err(EventError::Scheduler(e.scheduler));
        }
        if e.job.is_empty() || e.job.len() > 128 || e.job.chars().any(char::is_control) {
            return Err(EventError::Job);
        }
        if let Some(d) = &e.est_duration_s {
            if !d.is_finite() || *d <= 0.0 || *d > 365.0 * 86400.0 {
                return Err(EventError::Duration(*d));
            }
        }
        if let Some(g) = e.gpus {
            if g > 100_000 {
                return Err(EventError::Gpus(g));
            }
        }
        for g in e.allocated.iter().flatten() {
            g.parse::<telemetry::EntityId>()
                .map_err(|err| EventError::Allocated {
                    gpu: g.clone(),
                    message: err.to_string(),
                })?;
        }
        for t in [&e.time, &e.deadline].into_iter().flatten() {
            Timestamp::parse_rfc3339(t).map_err(|err| EventError::Time {
                time: t.clone(),
                message: err.to_string(),
            })?;
        }
        Ok(e)
    }

    pub fn id(&self) -> String {
        format!("{}:{}", self.scheduler, self.job)
    }

    /// The job after this event (`prior`: what was known of it).
    pub fn apply(&self, prior: Option<&Job>, deferrable_classes: &[String], now: Timestamp) -> Job {
        let at = self
            .time
            .as_deref()
            .and_then(|t| Timestamp::parse_rfc3339(t).ok())
            .unwrap_or(now);
        let mut job = prior.cloned().unwrap_or_else(|| self.new_job(at));
        self.fill(&mut job, deferrable_classes);
        self.move_state(&mut job, prior.is_none(), at);
        job
    }

    /// The job as first known, before the event's fields.
    fn new_job(&self, at: Timestamp) -> Job {
        Job {
            id: self.id(),
            scheduler: self.scheduler.clone(),
            name: String::new(),
            user: String::new(),
            project: String::new(),
            class: "batch".into(),
            priority: 0,
            gpus: 0,
            allocated: Vec::new(),
            state: JobState::Pending,
            submit_time: at,
            start_time: None,
            end_time: None,
            deadline: None,
            est_duration_s: 3600.0,
            deferrable: false,
            preemptible: false,
            gpu_power_limit: None,
        }
    }

    /// The fields the event carries, written over the job's.
    fn fill(&self, job: &mut Job, deferrable_classes: &[String]) {
        if let Some(v) = &self.name {
            job.name = v.clone();
        }
        if let Some(v) = &self.user {
            job.user = v.clone();
        }
        if let Some(v) = &self.project {
            job.project = v.clone();
        }
        if let Some(v) = &self.class {
            job.class = v.clone();
        }
        if let Some(v) = self.priority {
            job.priority = v;
        }
        if let Some(v) = self.gpus {
            job.gpus = v;
        }
        if let Some(d) = self
            .deadline
            .as_deref()
            .and_then(|t| Timestamp::parse_rfc3339(t).ok())
        {
            job.deadline = Some(d);
        }
        if let Some(v) = self.est_duration_s {
            job.est_duration_s = v;
        }
        job.deferrable = self
            .deferrable
            .unwrap_or_else(|| deferrable_classes.contains(&job.class));
        if let Some(v) = self.preemptible {
            job.preemptible = v;
        }
        if let Some(a) = &self.allocated {
            job.allocated = a.iter().filter_map(|g| g.parse().ok()).collect();
        }
    }

    /// The job's state and times after the event (`first`: nothing was known of it).
    fn move_state(&self, job: &mut Job, first: bool, at: Timestamp) {
        match self.event {
            EventKind::Submitted => {
                if first {
                    job.state = JobState::Pending;
                    job.submit_time = at;
                }
            }
            EventKind::Started => {
                job.state = JobState::Running;
                job.start_time = Some(at);
            }
            EventKind::Finished => {
                job.state = JobState::Finished;
                job.end_time = Some(at);
            }
            EventKind::Cancelled => {
                job.state = JobState::Cancelled;
                job.end_time = Some(at);
            }
        }
    }
}

/// An action for a scheduler.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "snake_case")]
pub enum Action {
    /// Do not start the job before `until` unless a release comes first; a later hold
    /// for the same job extends it.
    Hold {
        until: String,
    },
    Release,
    Requeue,
    Suspend,
    Resume,
    /// The job's GPUs run capped (`watts` per GPU, the lowest cap), or no longer
    /// (`watts` null).
    CapNotice {
        watts: Option<f64>,
    },
}

impl Action {
    pub fn kind(&self) -> &'static str {
        match self {
            Action::Hold { .. } => "hold",
            Action::Release => "release",
            Action::Requeue => "requeue",
            Action::Suspend => "suspend",
            Action::Resume => "resume",
            Action::CapNotice { .. } => "cap_notice",
        }
    }
}

/// One action waiting in the outbox, or dead.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Delivery {
    pub seq: u64,
    /// The idempotency key.
    pub id: String,
    pub job: String,
    /// The JSON body, exactly as signed and sent.
    pub body: String,
    pub created: Timestamp,
    pub attempts: u32,
    pub next_at: Timestamp,
    #[serde(default)]
    pub last_error: Option<String>,
}

/// How the outbox delivers.
#[derive(Debug, Clone)]
pub struct OutboxConfig {
    /// `https://` (or `http://`) URL of the receiver.
    pub url: String,
    /// The receiver's client, from the one outbound HTTP stack
    /// ([`sources::http::blocking_client`]): its deadline (`timeout_s`) and TLS (the
    /// site's CA, a pin, a client certificate). Blocking: the webhook reconciler posts
    /// from a thread of its own.
    pub client: reqwest::blocking::Client,
    pub max_attempts: u32,
    pub backoff_s: f64,
    pub max_backoff_s: f64,
    /// Deliveries tried per pass at most (a pass of the webhook reconciler).
    pub per_pass: usize,
}

/// Delivery counters.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct OutboxCounters {
    pub enqueued: u64,
    pub delivered: u64,
    pub failed_attempts: u64,
    pub dead: u64,
    pub last_error: Option<String>,
}

/// The durable outbox.
pub struct Outbox {
    pub config: OutboxConfig,
    key: WebhookKey,
    queue: BTreeMap<u64, Delivery>,
    next_seq: u64,
    pub counters: OutboxCounters,
    /// The leader's fencing epoch (with `[ha]`), in every action's body.
    pub epoch: Option<u64>,
}

fn seq_key(seq: u64) -> String {
    format!("{seq:020}")
}

/// A random number in [0, 1) (jitter needs no more).
fn jitter() -> f64 {
    sources::jitter::unit()
}

impl Outbox {
    /// The outbox with what the store still holds.
    pub fn restore(
        config: OutboxConfig,
        key: WebhookKey,
        store: &mut Store,
    ) -> Result<Self, StoreError> {
        let queue: BTreeMap<u64, Delivery> = store
            .records::<Delivery>(OUTBOX)?
            .into_values()
            .map(|d| (d.seq, d))
            .collect();
        let stored_next = store
            .records::<u64>(META)?
            .get("next_seq")
            .copied()
            .unwrap_or(1);
        let dead_max = store
            .records::<Delivery>(DEAD)?
            .values()
            .map(|d| d.seq)
            .max()
            .unwrap_or(0);
        let next_seq = stored_next
            .max(queue.keys().next_back().map_or(1, |s| s + 1))
            .max(dead_max + 1);
        Ok(Outbox {
            config,
            key,
            queue,
            next_seq,
            counters: OutboxCounters::default(),
            // the epoch 0 fences a follower: it never enqueues
            epoch: store.fence().filter(|e| *e > 0),
        })
    }

    pub fn pending(&self) -> Vec<&Delivery> {
        self.queue.values().collect()
    }

    /// Puts an action for a job in the outbox (durably, with `tx`).
    pub fn enqueue(
        &mut self,
        job: &Job,
        action: &Action,
        reason: &str,
        now: Timestamp,
        tx: &mut Tx,
    ) {
        let seq = self.next_seq;
        self.next_seq += 1;
        let id = format!("pp-{}-{seq}", now.0);
        let id_of = crate::scheduler::JobId::parse(&job.id);
        let (scheduler, job_id) = id_of
            .as_ref()
            .map_or(("", job.id.as_str()), |j| (j.prefix(), j.local()));
        let mut body = serde_json::json!({
            "id": id,
            "time": now.to_datetime().to_rfc3339(),
            "job": job.id,
            "scheduler": scheduler,
            "scheduler_job": job_id,
            "reason": reason,
        });
        if let (Some(b), Some(e)) = (body.as_object_mut(), self.epoch) {
            b.insert("epoch".into(), e.into());
        }
        if let (Some(b), Ok(serde_json::Value::Object(a))) =
            (body.as_object_mut(), serde_json::to_value(action))
        {
            b.extend(a);
        }
        let d = Delivery {
            seq,
            id,
            job: job.id.clone(),
            body: body.to_string(),
            created: now,
            attempts: 0,
            next_at: now,
            last_error: None,
        };
        tx.put_record(OUTBOX, &seq_key(seq), &d);
        tx.put_record(META, "next_seq", &self.next_seq);
        info!(job = %job.id, action = action.kind(), id = %d.id, "webhook action queued");
        self.queue.insert(seq, d);
        self.counters.enqueued += 1;
    }

    /// The dead-letter list.
    pub fn dead(store: &mut Store) -> Result<Vec<Delivery>, StoreError> {
        Ok(store.records::<Delivery>(DEAD)?.into_values().collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> WebhookKey {
        WebhookKey::from_text("00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff")
            .expect("key")
    }

    #[test]
    fn a_signature_verifies_and_any_change_or_a_stale_time_is_rejected() {
        let now = Timestamp::from_secs(1_700_000_000);
        let body = br#"{"event":"submitted"}"#;
        let sig = key().sign("1700000000", body);
        assert!(sig.starts_with("sha256=") && sig.len() == 7 + 64);
        let v = |ts: &str, sig: &str, body: &[u8], at: Timestamp| {
            key().verify(Some(ts), Some(sig), body, at, 300.0)
        };
        assert_eq!(v("1700000000", &sig, body, now), Ok(()));
        assert_eq!(
            v("1700000000", &sig, b"{\"event\":\"finished\"}", now),
            Err(Rejected::BadSignature)
        );
        assert_eq!(
            v("1700000001", &sig, body, now),
            Err(Rejected::BadSignature)
        );
        assert_eq!(
            v("1700000000", &sig, body, now.plus_secs(301.0)),
            Err(Rejected::Stale)
        );
        assert_eq!(v("soon", &sig, body, now), Err(Rejected::BadTimestamp));
        assert_eq!(
            key().verify(None, Some(&sig), body, now, 300.0),
            Err(Rejected::Unsigned)
        );
        // the documented construction: HMAC-SHA256(key, "{ts}.{body}")
        let mut m = <Hmac<Sha256> as Mac>::new_from_slice(&key().0).expect("mac");
        m.update(b"1700000000.{\"event\":\"submitted\"}");
        assert_eq!(
            sig,
            format!("sha256={}", hex::encode(m.finalize().into_bytes()))
        );
    }

    #[test]
    fn a_key_that_is_not_hex_is_its_trimmed_text_and_signatures_are_lower_case() {
        let upper = "00112233445566778899AABBCCDDEEFF00112233445566778899AABBCCDDEEFF";
        assert_eq!(WebhookKey::from_text(upper).expect("key").0, key().0);
        let text = " a shared secret, not hex \n";
        assert_eq!(
            WebhookKey::from_text(text).expect("key").0,
            b"a shared secret, not hex".to_vec()
        );
        let odd = "00112233445566778899aabbccddeeff0";
        assert_eq!(WebhookKey::from_text(odd).expect("key").0, odd.as_bytes());
        assert!(WebhookKey::from_text("abcd").is_err());

        let now = Timestamp::from_secs(1_700_000_000);
        let sig = key().sign("1700000000", b"{}");
        let digits = &sig["sha256=".len()..];
        assert!(digits
            .bytes()
            .all(|b| b.is_ascii_digit() || b.is_ascii_lowercase()));
        let v = |sig: &str| key().verify(Some("1700000000"), Some(sig), b"{}", now, 300.0);
        assert_eq!(
            v(&format!("sha256={}", digits.to_ascii_uppercase())),
            Ok(())
        );
        assert_eq!(v(digits), Err(Rejected::BadSignature));
        assert_eq!(v("sha256=zz"), Err(Rejected::BadSignature));
        assert_eq!(v("sha256="), Err(Rejected::BadSignature));
    }

    #[test]
    fn events_build_the_job_and_bad_ones_are_refused() {
        let now = Timestamp::from_secs(1_700_000_000);
        let e = JobEvent::parse(br#"{"event":"submitted","scheduler":"lsf","job":"42","class":"batch","project":"p","user":"u","gpus":2,"deadline":"2023-11-15T00:00:00Z","est_duration_s":600}"#).expect("event");
        let job = e.apply(None, &["batch".to_string()], now);
        assert_eq!(job.id, "lsf:42");
        assert!(job.deferrable);
        assert_eq!((job.gpus, job.state), (2, JobState::Pending));
        let started = JobEvent::parse(br#"{"event":"started","scheduler":"lsf","job":"42"}"#)
            .expect("event")
            .apply(Some(&job), &["batch".to_string()], now.plus_secs(5.0));
        assert_eq!(started.state, JobState::Running);
        assert_eq!(started.gpus, 2, "what an event leaves out is kept");
        for bad in [
            &br#"{"event":"exploded","scheduler":"lsf","job":"1"}"#[..],
            br#"{"event":"submitted","scheduler":"slurm","job":"1"}"#,
            br#"{"event":"submitted","scheduler":"kubernetes","job":"1"}"#,
            br#"{"event":"submitted","scheduler":"lsf","job":""}"#,
            br#"{"event":"submitted","scheduler":"lsf","job":"1","est_duration_s":-1}"#,
            br#"{"event":"submitted","scheduler":"lsf","job":"1","deadline":"tomorrow"}"#,
            br#"{"event":"submitted","scheduler":"lsf","job":"1","colour":"red"}"#,
            b"not json",
        ] {
            assert!(
                JobEvent::parse(bad).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }
}
