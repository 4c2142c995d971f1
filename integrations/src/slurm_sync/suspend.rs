//! The suspensions of [`SlurmSync`]: running jobs the plan wants suspended, resumed
//! once it no longer does; a record of each in the store, like holds.

use std::collections::BTreeMap;

use policies::Hold;
use telemetry::Timestamp;
use tracing::warn;

use super::{wanted, OurHold, SlurmSync, SUSPENDED};
use crate::scheduler::{Applied, Commit, JobId};
use crate::slurm_api::Update;
use crate::store::Tx;

impl SlurmSync {
    /// Jobs powerplane suspended, by powerplane job id.
    pub fn suspended(&self) -> BTreeMap<String, OurHold> {
        self.suspended
            .values()
            .map(|h| (JobId::slurm(h.job_id).to_string(), h.clone()))
            .collect()
    }

    /// Brings Slurm's suspensions to `desired` (the plan's `suspended`): suspends the
    /// running jobs wanted and not yet suspended, resumes those powerplane suspended
    /// that are no longer wanted or whose lease has passed. A job suspended by
    /// somebody else is never resumed; the record is kept in the store like holds.
    pub fn apply_suspensions(
        &mut self,
        desired: &BTreeMap<String, Hold>,
        now: Timestamp,
        store: &mut dyn Commit,
    ) -> Vec<Applied> {
        let mut done = Vec::new();
        let wanted = wanted(desired, now);
        for id in self.suspended.keys().copied().collect::<Vec<_>>() {
            if !wanted.contains_key(&id) {
                done.extend(self.resume(id, store));
            }
        }
        for (id, h) in wanted {
            if let Some(s) = self.suspended.get_mut(&id) {
                if s.lease_until != h.lease_until {
                    s.lease_until = h.lease_until;
                    let rec = s.clone();
                    let mut tx = Tx::new();
                    tx.put_record(SUSPENDED, &id.to_string(), &rec);
                    if let Err(e) = store.commit(tx) {
                        warn!(job = id, error = %e, "cannot save a Slurm suspension record");
                    }
                }
                continue;
            }
            if self.last.get(&id).is_none_or(|j| j.state != "RUNNING") {
                self.counters.skipped += 1;
                continue;
            }
            done.extend(self.suspend(id, h, now, store));
        }
        done
    }

    /// Resumes `id` (if Slurm still shows it suspended) and drops its record.
    fn resume(&mut self, id: u64, store: &mut dyn Commit) -> Option<Applied> {
        let gone = self.last.get(&id).is_none_or(|j| j.state != "SUSPENDED");
        let result = if gone {
            Ok(())
        } else {
            self.update(id, Update::Resume)
        };
        let mut done = None;
        match result {
            Ok(()) => {
                if !gone {
                    self.counters.resumes += 1;
                    done = Some(Applied {
                        job: JobId::slurm(id).to_string(),
                        action: "resume",
                        detail: "resumed in Slurm".into(),
                    });
                }
                self.suspended.remove(&id);
                let mut tx = Tx::new();
                tx.delete_record(SUSPENDED, &id.to_string());
                if let Err(e) = store.commit(tx) {
                    warn!(job = id, error = %e, "cannot delete a Slurm suspension record");
                }
            }
            Err(e) => self.failed("resume", id, &e),
        }
        done
    }

    /// Suspends the running job `id`, its record stored first.
    fn suspend(
        &mut self,
        id: u64,
        h: &Hold,
        now: Timestamp,
        store: &mut dyn Commit,
    ) -> Option<Applied> {
        let rec = OurHold::new(id, h, now, true);
        // recorded first: a crash after the call still knows the suspension is ours
        let mut tx = Tx::new();
        tx.put_record(SUSPENDED, &id.to_string(), &rec);
        if let Err(e) = store.commit(tx) {
            self.counters.action_errors += 1;
            warn!(job = id, error = %e, "not suspended: the store cannot record it");
            return None;
        }
        match self.update(id, Update::Suspend) {
            Ok(()) => {
                self.counters.suspends += 1;
                if let Some(j) = self.last.get_mut(&id) {
                    j.state = "SUSPENDED".into();
                }
                self.suspended.insert(id, rec);
                Some(Applied {
                    job: JobId::slurm(id).to_string(),
                    action: "suspend",
                    detail: format!("suspended in Slurm until {}", h.lease_until),
                })
            }
            Err(e) => {
                let mut tx = Tx::new();
                tx.delete_record(SUSPENDED, &id.to_string());
                let _ = store.commit(tx);
                self.failed("suspend", id, &e);
                None
            }
        }
    }
}
