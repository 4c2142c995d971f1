//! The poll of [`SlurmSync`]: Slurm's jobs read, powerplane's hold records reconciled
//! with what Slurm shows, and the jobs returned as powerplane sees them.

use std::collections::BTreeSet;

use telemetry::{Job, JobState, Timestamp};
use tracing::{info, warn};

use super::{is_running, slurm_id, HoldWith, OurHold, SlurmSync, EXTERNAL, HOLDS};
use crate::scheduler::Commit;
use crate::slurm::SlurmJob;
use crate::slurm_api::{ApiClient, SlurmApiError};
use crate::store::Tx;

/// Why a hold record is dropped: (what, why), `what` being `gone` or
/// `released_externally`.
type Verdict = (&'static str, &'static str);

impl SlurmSync {
    /// Reads Slurm's jobs, reconciles the holds with what Slurm shows, and returns the
    /// jobs as powerplane sees them (jobs gone from Slurm come back once as finished).
    /// A poll that fails leaves the previous view as it was.
    pub fn poll(
        &mut self,
        now: Timestamp,
        store: &mut dyn Commit,
    ) -> Result<Vec<Job>, SlurmApiError> {
        self.counters.polls += 1;
        let jobs = match self.connect().and_then(ApiClient::jobs) {
            Ok(j) => j,
            Err(e) => {
                self.counters.poll_errors += 1;
                self.counters.last_error = Some(e.to_string());
                return Err(e);
            }
        };
        self.last = jobs
            .into_iter()
            .map(|j| (j.job_id, j.to_slurm_job()))
            .collect();
        let mut tx = Tx::new();
        self.reconcile_holds(&mut tx);
        self.forget_external(&mut tx);
        if let Err(e) = store.commit(tx) {
            warn!(error = %e, "cannot save the Slurm hold records; retried next pass");
        }
        let out = self.jobs_seen(now);
        self.counters.last_error = None;
        Ok(out)
    }

    /// Confirms each hold record whose job Slurm shows held, and drops those whose job
    /// is gone or that someone else released (writes in `tx`).
    fn reconcile_holds(&mut self, tx: &mut Tx) {
        let ids: Vec<u64> = self.holds.keys().copied().collect();
        for id in ids {
            let Some(h) = self.holds.get(&id).cloned() else {
                continue;
            };
            match self.verdict(&h, self.last.get(&id)) {
                None if !h.confirmed => {
                    let h = OurHold {
                        confirmed: true,
                        ..h
                    };
                    tx.put_record(HOLDS, &id.to_string(), &h);
                    self.holds.insert(id, h);
                }
                None => {}
                Some((what, why)) => {
                    if what == "released_externally" {
                        self.counters.released_externally += 1;
                        self.external.insert(id);
                        tx.put_record(EXTERNAL, &id.to_string(), &id);
                        warn!(job = id, "{why}");
                    } else {
                        info!(job = id, "hold record dropped: {why}");
                    }
                    tx.delete_record(HOLDS, &id.to_string());
                    self.holds.remove(&id);
                }
            }
        }
    }

    /// What Slurm's view of the job says of our hold on it: `None` while it stands.
    fn verdict(&self, h: &OurHold, job: Option<&SlurmJob>) -> Option<Verdict> {
        let begin = self.hold_with == HoldWith::BeginTime;
        match job {
            None => Some(("gone", "the job is gone from Slurm")),
            Some(j) if j.is_held() => None,
            Some(j) if begin && j.is_pending() => None,
            Some(j) if !j.is_pending() && !is_running(j) => {
                Some(("gone", "the job ended while powerplane held it"))
            }
            Some(j) if !j.is_pending() => Some((
                "released_externally",
                "the job started while powerplane held it; someone released it",
            )),
            Some(_) if h.confirmed => Some((
                "released_externally",
                "someone else released the job; powerplane will not hold it again",
            )),
            Some(_) => Some(("gone", "the hold never reached Slurm")),
        }
    }

    /// Forgets the external releases of jobs Slurm no longer knows.
    fn forget_external(&mut self, tx: &mut Tx) {
        for id in self.external.clone() {
            if !self.last.contains_key(&id) {
                self.external.remove(&id);
                tx.delete_record(EXTERNAL, &id.to_string());
            }
        }
    }

    /// The jobs of the last poll as powerplane sees them, and those gone from Slurm
    /// since the one before as finished (once).
    fn jobs_seen(&mut self, now: Timestamp) -> Vec<Job> {
        let mut out: Vec<Job> = self
            .last
            .values()
            .map(|j| {
                let mut job = self.mapping.map(j, self.holds.contains_key(&j.job_id), now);
                if self.external.contains(&j.job_id) {
                    job.deferrable = false;
                }
                job
            })
            .collect();
        let present: BTreeSet<u64> = self.last.keys().copied().collect();
        for (id, job) in std::mem::take(&mut self.live) {
            if !present.contains(&id) {
                let mut gone = job;
                gone.state = JobState::Finished;
                gone.end_time.get_or_insert(now);
                out.push(gone);
            }
        }
        self.live = out
            .iter()
            .filter(|j| !j.state.is_done())
            .filter_map(|j| slurm_id(&j.id).map(|n| (n, j.clone())))
            .collect();
        out
    }
}
