//! Delivering the outbox: what is due, one signed POST per action ([`Sender`]), and
//! each outcome recorded (delivered, retried with backoff, dead-lettered). Split so a
//! POST never holds the outbox: the webhook reconciler picks the due actions, posts
//! them unlocked, and records the outcomes.

use std::collections::BTreeSet;

use telemetry::Timestamp;
use tracing::{info, warn};

use super::{
    jitter, seq_key, Delivery, DeliveryError, Outbox, OutboxConfig, PostError, WebhookKey,
    ATTEMPT_HEADER, DEAD, IDEMPOTENCY_HEADER, OUTBOX, SIGNATURE_HEADER, TIMESTAMP_HEADER,
};
use crate::scheduler::Commit;
use crate::store::Tx;

impl Outbox {
    /// What is due now, oldest first, at most `per_pass`: a job's action only once
    /// its earlier ones are delivered or dead, and not before its `next_at`.
    pub fn due(&self, now: Timestamp) -> Vec<Delivery> {
        let mut blocked: BTreeSet<&str> = BTreeSet::new();
        let mut out = Vec::new();
        for d in self.queue.values() {
            if blocked.contains(d.job.as_str()) {
                continue;
            }
            if d.next_at > now || out.len() >= self.config.per_pass {
                blocked.insert(&d.job);
                continue;
            }
            out.push(d.clone());
        }
        out
    }

    /// When the next action falls due (each job's first waiting action counts).
    pub fn next_due(&self) -> Option<Timestamp> {
        let mut seen: BTreeSet<&str> = BTreeSet::new();
        self.queue
            .values()
            .filter(|d| seen.insert(d.job.as_str()))
            .map(|d| d.next_at)
            .min()
    }

    /// What posts actions: the receiver and the key, without the queue, so a POST
    /// never holds the outbox.
    pub fn sender(&self) -> Sender {
        Sender {
            config: self.config.clone(),
            key: self.key.clone(),
        }
    }

    /// Records the outcome of one attempt (`attempt`, 1-based) at `d`, durably with
    /// `tx`: delivered, retried later with backoff and jitter, or dead-lettered.
    pub fn record(
        &mut self,
        d: Delivery,
        attempt: u32,
        result: Result<(), DeliveryError>,
        now: Timestamp,
        tx: &mut Tx,
    ) -> Outcome {
        let seq = d.seq;
        let e = match result {
            Ok(()) => {
                tx.delete_record(OUTBOX, &seq_key(seq));
                self.queue.remove(&seq);
                self.counters.delivered += 1;
                info!(job = %d.job, id = %d.id, attempt, "webhook action delivered");
                return Outcome::Delivered;
            }
            Err(e) => e,
        };
        self.counters.failed_attempts += 1;
        self.counters.last_error = Some(e.to_string());
        let mut d = d;
        d.attempts = attempt;
        d.last_error = Some(e.to_string());
        if e.refused() || attempt >= self.config.max_attempts {
            warn!(job = %d.job, id = %d.id, attempt, error = %e, "webhook action dead-lettered");
            tx.delete_record(OUTBOX, &seq_key(seq));
            tx.put_record(DEAD, &seq_key(seq), &d);
            self.queue.remove(&seq);
            self.counters.dead += 1;
            return Outcome::Dead;
        }
        let backoff = (self.config.backoff_s * 2f64.powi(attempt.saturating_sub(1).min(30) as i32))
            .min(self.config.max_backoff_s);
        // half fixed, half random: retries of many senders spread out
        d.next_at = now.plus_secs(backoff * (0.5 + 0.5 * jitter()));
        warn!(job = %d.job, id = %d.id, attempt, retry_in_s = d.next_at.secs_since(now), error = %e, "webhook delivery failed; retrying");
        tx.put_record(OUTBOX, &seq_key(seq), &d);
        self.queue.insert(seq, d);
        Outcome::Retry
    }

    /// Tries what is due, oldest first, a job's actions in order. Returns the ids
    /// delivered. A receiver that is down or hangs is so for every job: the pass
    /// stops there, so it costs one timeout at most; one that answered (an HTTP
    /// error) may still take other jobs' actions.
    pub fn deliver(&mut self, now: Timestamp, store: &mut dyn Commit) -> Vec<String> {
        let mut delivered = Vec::new();
        let mut blocked: BTreeSet<String> = BTreeSet::new();
        let mut tx = Tx::new();
        let sender = self.sender();
        for d in self.due(now) {
            if blocked.contains(&d.job) {
                continue;
            }
            let attempt = d.attempts + 1;
            let result = sender.post(&d, attempt);
            let unanswered = matches!(&result, Err(DeliveryError::Unanswered(_)));
            let (job, id) = (d.job.clone(), d.id.clone());
            match self.record(d, attempt, result, now, &mut tx) {
                Outcome::Delivered => delivered.push(id),
                Outcome::Dead => {}
                Outcome::Retry => {
                    blocked.insert(job);
                    if unanswered {
                        break;
                    }
                }
            }
        }
        if let Err(e) = store.commit(tx) {
            warn!(error = %e, "cannot save the webhook outbox; deliveries may repeat after a restart");
        }
        delivered
    }
}

/// What became of one delivery attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Delivered,
    /// Failed; tried again after a backoff.
    Retry,
    /// Refused, or out of attempts: moved to the dead-letter list.
    Dead,
}

/// Posts outbox actions to the receiver, signed.
#[derive(Clone)]
pub struct Sender {
    config: OutboxConfig,
    key: WebhookKey,
}

impl Sender {
    /// One POST, by the receiver's client (its deadline and TLS): the status decides
    /// (2xx delivered; 408, 429 and 5xx retried; any other 4xx refused for good).
    pub fn post(&self, d: &Delivery, attempt: u32) -> Result<(), DeliveryError> {
        let ts = (chrono::Utc::now().timestamp()).to_string();
        let sig = self.key.sign(&ts, d.body.as_bytes());
        let url = &self.config.url;
        let resp = self
            .config
            .client
            .post(url)
            .header("Content-Type", "application/json")
            .header(TIMESTAMP_HEADER, ts)
            .header(SIGNATURE_HEADER, sig)
            .header(IDEMPOTENCY_HEADER, d.id.as_str())
            .header(ATTEMPT_HEADER, attempt.to_string())
            .body(d.body.clone())
            .send()
            .map_err(|e| DeliveryError::Unanswered(PostError::of(url, &e)))?;
        // the status is the answer; the body is not read (the connection is not kept
        // for one the receiver may still be writing)
        let status = resp.status().as_u16();
        match status {
            200..=299 => Ok(()),
            408 | 429 => Err(DeliveryError::Status { status }),
            400..=499 => Err(DeliveryError::Refused { status }),
            _ => Err(DeliveryError::Status { status }),
        }
    }
}
