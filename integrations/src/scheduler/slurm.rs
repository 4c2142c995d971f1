//! Slurm as a [`Scheduler`]: [`SlurmSync`] polled and applied by its reconciler.

use serde_json::json;
use telemetry::{Job, Timestamp};
use tracing::{info, warn};

use super::{
    Adapter, Commit, Counter, Desired, JobId, Pass, Requeues, Scheduler, SchedulerError,
    SchedulerId, View,
};
use crate::slurm_sync::SlurmSync;

/// Slurm's jobs, through slurmrestd (`slurm:<job number>`).
pub const ADAPTER: Adapter = Adapter {
    id: SchedulerId::new("slurm"),
    scheduler: "slurm",
    prefix: "slurm",
};

impl Scheduler for SlurmSync {
    fn id(&self) -> SchedulerId {
        ADAPTER.id
    }

    fn requeues(&self) -> Requeues {
        Requeues::Reconciler
    }

    fn poll(
        &mut self,
        now: Timestamp,
        store: &mut dyn Commit,
    ) -> Result<Option<Vec<Job>>, SchedulerError> {
        Ok(Some(SlurmSync::poll(self, now, store)?))
    }

    fn apply(&mut self, desired: &Desired, now: Timestamp, store: &mut dyn Commit) -> Pass {
        // no client (slurmrestd down at start, or refusing): one failure, so the
        // reconciler retries the build after its backoff rather than once per job
        if let Err(e) = self.connect() {
            warn!(error = %e, "slurmrestd client not ready; retried after the backoff");
            return Pass {
                applied: Vec::new(),
                failed: 1,
            };
        }
        let errors = self.counters.action_errors;
        let mut applied = SlurmSync::apply(self, &desired.holds, now, store);
        applied.extend(self.apply_suspensions(&desired.suspended, now, store));
        Pass {
            applied,
            failed: (self.counters.action_errors - errors) as u32,
        }
    }

    fn requeue(&mut self, job: &JobId) -> Result<(), SchedulerError> {
        match SlurmSync::requeue(self, &job.to_string()) {
            Ok(()) => {
                info!(job = %job, "requeued in Slurm");
                Ok(())
            }
            Err(e) => {
                warn!(job = %job, error = %e, "Slurm requeue failed");
                Err(e.into())
            }
        }
    }

    fn view(&self) -> View {
        View {
            held_by_us: self.ours().into_keys().collect(),
            hints: self.hinted(),
        }
    }

    fn status(&self) -> serde_json::Value {
        json!({
            "endpoint": self.api.endpoint,
            "api_version": self.version(),
            "answers": self.answer_counts(),
            "counters": self.counters,
            "holds": self.ours(),
            "suspended": self.suspended(),
        })
    }

    fn counters(&self) -> Vec<Counter> {
        let c = &self.counters;
        let a = self.answer_counts();
        vec![
            (
                "slurm_connect_errors_total",
                "Attempts to reach slurmrestd and find its API version that failed",
                c.connect_errors as f64,
            ),
            (
                "slurm_malformed_total",
                "slurmrestd answers that were not the JSON expected",
                a.malformed as f64,
            ),
            (
                "slurm_oversized_total",
                "slurmrestd answers refused for exceeding max_answer_bytes",
                a.oversized as f64,
            ),
            (
                "slurm_unauthorized_total",
                "slurmrestd calls refused for authentication (expired or wrong token, wrong uid)",
                a.unauthorized as f64,
            ),
            (
                "slurm_timeouts_total",
                "slurmrestd calls that passed their deadline",
                a.timeouts as f64,
            ),
            (
                "slurm_polls_total",
                "Polls of slurmrestd's job list",
                c.polls as f64,
            ),
            (
                "slurm_poll_errors_total",
                "Polls of slurmrestd that failed",
                c.poll_errors as f64,
            ),
            (
                "slurm_holds_total",
                "Holds powerplane placed in Slurm",
                c.holds as f64,
            ),
            (
                "slurm_releases_total",
                "Holds powerplane released in Slurm",
                c.releases as f64,
            ),
            (
                "slurm_action_errors_total",
                "Slurm hold, release and requeue calls that failed (retried)",
                c.action_errors as f64,
            ),
            (
                "slurm_released_externally_total",
                "Holds of powerplane's someone else released",
                c.released_externally as f64,
            ),
            (
                "slurm_holds_in_force",
                "Slurm jobs powerplane holds now",
                self.ours().len() as f64,
            ),
        ]
    }
}
