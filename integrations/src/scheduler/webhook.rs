//! The outbound webhook as a [`Scheduler`]: its reconciler delivers what the control
//! loop put in the [`Outbox`]. The outbox is shared and locked only to pick the due
//! actions and to record each outcome, never across a POST, so the loop's enqueueing
//! never waits on a receiver that hangs.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, MutexGuard};

use serde_json::json;
use telemetry::{Job, Timestamp};
use tracing::warn;

use super::{
    Applied, Commit, Counter, Desired, Pass, Requeues, Scheduler, SchedulerError, SchedulerId,
    View, WEBHOOK,
};
use crate::store::Tx;
use crate::webhook::{DeliveryError, Outbox, Outcome};

/// A handle on the shared outbox.
#[derive(Clone)]
pub struct OutboxDelivery {
    outbox: Arc<Mutex<Outbox>>,
}

impl OutboxDelivery {
    pub fn new(outbox: Arc<Mutex<Outbox>>) -> Self {
        OutboxDelivery { outbox }
    }

    /// The outbox, for a moment (enqueue, status).
    pub fn lock(&self) -> MutexGuard<'_, Outbox> {
        self.outbox.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Scheduler for OutboxDelivery {
    fn id(&self) -> SchedulerId {
        WEBHOOK
    }

    fn requeues(&self) -> Requeues {
        Requeues::Outbox
    }

    /// The webhook's section shows the outbox's status and counters.
    fn reports(&self) -> bool {
        false
    }

    fn poll(
        &mut self,
        _now: Timestamp,
        _store: &mut dyn Commit,
    ) -> Result<Option<Vec<Job>>, SchedulerError> {
        // webhook jobs arrive as events
        Ok(None)
    }

    /// Delivers what is due, a job's actions in order. Each action's retries are the
    /// outbox's own (its `next_at`, see [`Scheduler::next_due`]); a receiver that does
    /// not answer ends the pass with a failure, so the reconciler backs off before
    /// trying the next job's action against it.
    fn apply(&mut self, _desired: &Desired, now: Timestamp, store: &mut dyn Commit) -> Pass {
        let (due, sender) = {
            let o = self.lock();
            (o.due(now), o.sender())
        };
        let mut tx = Tx::new();
        let mut blocked = BTreeSet::new();
        let mut applied = Vec::new();
        let mut failed = 0;
        for d in due {
            if blocked.contains(&d.job) {
                continue;
            }
            let attempt = d.attempts + 1;
            let result = sender.post(&d, attempt);
            let unanswered = matches!(&result, Err(DeliveryError::Unanswered(_)));
            let (job, id) = (d.job.clone(), d.id.clone());
            match self.lock().record(d, attempt, result, now, &mut tx) {
                Outcome::Delivered => applied.push(Applied {
                    job,
                    action: "deliver",
                    detail: format!("webhook action {id} delivered"),
                }),
                Outcome::Dead => {}
                Outcome::Retry => {
                    blocked.insert(job);
                    if unanswered {
                        // the reconciler backs off before the next pass
                        failed = 1;
                        break;
                    }
                }
            }
        }
        if let Err(e) = store.commit(tx) {
            warn!(error = %e, "cannot save the webhook outbox; deliveries may repeat after a restart");
        }
        Pass { applied, failed }
    }

    fn view(&self) -> View {
        View::default()
    }

    fn status(&self) -> serde_json::Value {
        let o = self.lock();
        json!({
            "url": o.config.url,
            "counters": o.counters,
            "waiting": o.pending(),
        })
    }

    fn counters(&self) -> Vec<Counter> {
        let o = self.lock();
        let c = &o.counters;
        vec![
            (
                "webhook_actions_enqueued_total",
                "Scheduler actions queued for the webhook",
                c.enqueued as f64,
            ),
            (
                "webhook_actions_delivered_total",
                "Scheduler actions the webhook receiver took",
                c.delivered as f64,
            ),
            (
                "webhook_delivery_failures_total",
                "Webhook delivery attempts that failed (retried with backoff)",
                c.failed_attempts as f64,
            ),
            (
                "webhook_actions_dead_total",
                "Scheduler actions dead-lettered",
                c.dead as f64,
            ),
            (
                "webhook_actions_waiting",
                "Scheduler actions in the outbox",
                o.pending().len() as f64,
            ),
        ]
    }

    fn next_due(&self) -> Option<Timestamp> {
        self.lock().next_due()
    }
}
