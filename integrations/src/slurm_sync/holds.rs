//! The holds of [`SlurmSync`]: what the plan no longer wants released, what it still
//! wants renewed, what it newly wants placed (the intent stored before the call).

use std::collections::BTreeMap;

use policies::Hold;
use telemetry::Timestamp;
use tracing::{info, warn};

use super::{is_final, wanted, HoldWith, OurHold, SlurmSync, HOLDS};
use crate::scheduler::{Applied, Commit, JobId};
use crate::slurm_api::Update;
use crate::store::Tx;

impl SlurmSync {
    /// Brings Slurm's holds to `desired` (the plan's holds, all schedulers): holds
    /// what is wanted and not yet held, releases what is ours and no longer wanted or
    /// past its lease. Returns what it did; failures are counted and retried next pass.
    pub fn apply(
        &mut self,
        desired: &BTreeMap<String, Hold>,
        now: Timestamp,
        store: &mut dyn Commit,
    ) -> Vec<Applied> {
        let mut done = Vec::new();
        let wanted = wanted(desired, now);
        // releases first: what is ours and no longer wanted (or past its lease)
        let ours: Vec<u64> = self.holds.keys().copied().collect();
        for id in ours {
            if !wanted.contains_key(&id) {
                done.extend(self.release(id, store));
            }
        }
        for (id, h) in wanted {
            if let Some(ours) = self.holds.get(&id).cloned() {
                self.renew(id, ours, h, now, store);
                continue;
            }
            if self.external.contains(&id) {
                continue;
            }
            match self.last.get(&id) {
                Some(j) if j.is_pending() && !j.is_held() => {}
                _ => {
                    // running, held by someone else, or unknown: not ours to hold
                    self.counters.skipped += 1;
                    continue;
                }
            }
            done.extend(self.place(id, h, now, store));
        }
        done
    }

    /// Releases our hold on `id`.
    fn release(&mut self, id: u64, store: &mut dyn Commit) -> Option<Applied> {
        let released = match self.hold_with {
            HoldWith::Hold => self.update(id, Update::Release),
            HoldWith::BeginTime => self.set_begin(id, 0),
        };
        match released {
            Ok(()) => {
                self.counters.releases += 1;
                self.forget(id, store);
                if let Some(j) = self.last.get_mut(&id) {
                    j.reason = "None".into();
                    j.priority = j.priority.max(1);
                }
                return Some(Applied {
                    job: JobId::slurm(id).to_string(),
                    action: "release",
                    detail: "released in Slurm".into(),
                });
            }
            Err(e) if is_final(&e) => {
                // the job ended or left the queue: nothing of ours to release
                self.forget(id, store);
                info!(job = id, error = %e, "hold dropped: Slurm cannot release it");
            }
            Err(e) => self.failed("release", id, &e),
        }
        None
    }

    /// Renews our hold `ours` on `id` to the lease of `h`.
    fn renew(&mut self, id: u64, ours: OurHold, h: &Hold, now: Timestamp, store: &mut dyn Commit) {
        if ours.lease_until == h.lease_until {
            return;
        }
        if self.hold_with == HoldWith::BeginTime {
            // the begin time is the lease Slurm enforces: push it on once half
            // of what was sent has passed
            if ours.lease_until.secs_since(now) >= h.lease_until.secs_since(now) / 2.0 {
                return;
            }
            let secs = h.lease_until.secs_since(now).ceil().max(1.0) as u64;
            if let Err(e) = self.set_begin(id, secs) {
                self.failed("renew", id, &e);
                return;
            }
        }
        let renewed = OurHold {
            lease_until: h.lease_until,
            ..ours
        };
        self.save(&renewed, store);
        self.holds.insert(id, renewed);
    }

    /// Places a hold on the pending job `id`, its intent stored first.
    fn place(
        &mut self,
        id: u64,
        h: &Hold,
        now: Timestamp,
        store: &mut dyn Commit,
    ) -> Option<Applied> {
        let intent = OurHold::new(id, h, now, false);
        // the intent is durable before Slurm is asked: a crash after the call
        // still knows the hold is ours
        if let Err(e) = store.commit({
            let mut tx = Tx::new();
            tx.put_record(HOLDS, &id.to_string(), &intent);
            tx
        }) {
            self.counters.action_errors += 1;
            self.counters.last_error = Some(e.to_string());
            warn!(job = id, error = %e, "hold not placed: the store cannot record it");
            return None;
        }
        self.holds.insert(id, intent.clone());
        let placed = match self.hold_with {
            HoldWith::Hold => self.update(id, Update::Hold),
            HoldWith::BeginTime => {
                self.set_begin(id, h.lease_until.secs_since(now).ceil().max(1.0) as u64)
            }
        };
        match placed {
            Ok(()) => {
                self.counters.holds += 1;
                if let (Some(j), HoldWith::Hold) = (self.last.get_mut(&id), self.hold_with) {
                    j.reason = "JobHeldAdmin".into();
                    j.priority = 0;
                }
                let h = OurHold {
                    confirmed: true,
                    ..intent
                };
                self.save(&h, store);
                self.holds.insert(id, h);
                return Some(Applied {
                    job: JobId::slurm(id).to_string(),
                    action: "hold",
                    detail: format!("held in Slurm until {}", intent.lease_until),
                });
            }
            Err(e) if is_final(&e) => {
                self.forget(id, store);
                self.failed("hold", id, &e);
            }
            Err(e) => self.failed("hold", id, &e),
        }
        None
    }
}
