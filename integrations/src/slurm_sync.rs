//! Keeps Slurm's holds in step with the plan, and knows which holds are powerplane's.
//!
//! Each hold powerplane places is written to the store (collection `slurm_holds`)
//! *before* the hold call, as an intent, and confirmed once Slurm shows the job held.
//! So after a crash at any point the hold is still known as ours: an intent whose job
//! Slurm shows held is confirmed, one whose job is not held is dropped. A held job
//! powerplane has no record of (an admin's or the user's hold) is never released, and
//! is never deferrable. A hold of ours that somebody else releases (`scontrol release`)
//! is dropped and that job is never held again. Every hold is released once the plan
//! no longer wants it or its lease has passed (the engine renews the lease every tick
//! while it wants the hold, and never past the job's latest start).
//!
//! Calls that fail are retried on the next pass: [`SlurmSync::apply`] compares the
//! whole desired set with what is ours each time, so it is idempotent.

use std::collections::{BTreeMap, BTreeSet};

use policies::Hold;
use serde::{Deserialize, Serialize};
use telemetry::{Job, JobState, Timestamp};
use tracing::{info, warn};

use crate::scheduler::{Commit, JobId};
use crate::slurm::{JobMapping, SlurmJob};
use crate::slurm_api::{ApiClient, SlurmApiConfig, SlurmApiError, Update};
use crate::store::{Store, StoreError, Tx};

pub use crate::scheduler::{Applied, Hints};

const HOLDS: &str = "slurm_holds";
const EXTERNAL: &str = "slurm_released_externally";
const SUSPENDED: &str = "slurm_suspended";

/// A hold powerplane placed (or is placing) on a Slurm job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OurHold {
    pub job_id: u64,
    pub rule: String,
    pub since: Timestamp,
    pub lease_until: Timestamp,
    /// Slurm has shown the job held (false: the hold call may not have gone through).
    pub confirmed: bool,
}

/// What the adapter counted.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct SlurmCounters {
    pub polls: u64,
    pub poll_errors: u64,
    pub holds: u64,
    pub releases: u64,
    pub requeues: u64,
    pub suspends: u64,
    pub resumes: u64,
    /// Hold, release and requeue calls that failed (retried on the next pass).
    pub action_errors: u64,
    /// Holds of ours someone else released.
    pub released_externally: u64,
    /// Holds not placed because the job was held by someone else or already running.
    pub skipped: u64,
    /// Attempts to build the slurmrestd client (find its version) that failed.
    pub connect_errors: u64,
    pub last_error: Option<String>,
}

/// The client's answer counters: those of the built client plus those of failed
/// builds (a build that fails leaves no client to count them).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct AnswerCounts {
    pub malformed: u64,
    pub oversized: u64,
    pub unauthorized: u64,
    pub timeouts: u64,
}

impl AnswerCounts {
    fn count(&mut self, e: &SlurmApiError) {
        match e {
            SlurmApiError::Decode { .. } => self.malformed += 1,
            SlurmApiError::TooLarge { .. } => self.oversized += 1,
            SlurmApiError::Unauthorized { .. } => self.unauthorized += 1,
            SlurmApiError::Timeout { .. } => self.timeouts += 1,
            _ => {}
        }
    }
}

/// Slurm's error numbers that say a call on a job can never succeed: invalid job id,
/// already completing or completed, no longer pending.
const FINAL_ERRORS: [i64; 3] = [2017, 2021, 2073];

/// How powerplane keeps a Slurm job from starting.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HoldWith {
    /// `hold` (priority 0, `JobHeldAdmin`): lasts until released.
    #[default]
    Hold,
    /// The job's begin time set to the hold's lease, pushed on while the hold is
    /// renewed: Slurm itself lets the job start when powerplane stops renewing (a dead
    /// controller included). Replaces the job's own `--begin`.
    BeginTime,
}

pub struct SlurmSync {
    /// How slurmrestd is reached; the client is built from it on first use, on the
    /// thread that calls the adapter (it blocks and does IO), and again after a
    /// build fails.
    pub api: SlurmApiConfig,
    client: Option<ApiClient>,
    /// Answer counters of builds that failed.
    build_counts: AnswerCounts,
    pub mapping: JobMapping,
    pub hold_with: HoldWith,
    holds: BTreeMap<u64, OurHold>,
    /// Jobs powerplane suspended, with the lease of the suspension.
    suspended: BTreeMap<u64, OurHold>,
    external: BTreeSet<u64>,
    /// The last poll, by job id.
    last: BTreeMap<u64, SlurmJob>,
    /// Jobs reported and not yet finished: one that vanishes from Slurm is finished.
    live: BTreeMap<u64, Job>,
    pub counters: SlurmCounters,
}

fn slurm_id(id: &str) -> Option<u64> {
    JobId::parse(id).and_then(|j| j.slurm_number())
}

impl SlurmSync {
    /// The adapter with the holds the store says are ours.
    pub fn restore(
        api: SlurmApiConfig,
        mapping: JobMapping,
        store: &mut Store,
    ) -> Result<Self, StoreError> {
        let holds = store
            .records::<OurHold>(HOLDS)?
            .into_values()
            .map(|h| (h.job_id, h))
            .collect();
        let external = store
            .records::<u64>(EXTERNAL)?
            .into_values()
            .collect::<BTreeSet<_>>();
        let suspended = store
            .records::<OurHold>(SUSPENDED)?
            .into_values()
            .map(|h| (h.job_id, h))
            .collect();
        Ok(SlurmSync {
            api,
            client: None,
            build_counts: AnswerCounts::default(),
            mapping,
            hold_with: HoldWith::default(),
            holds,
            suspended,
            external,
            last: BTreeMap::new(),
            live: BTreeMap::new(),
            counters: SlurmCounters::default(),
        })
    }

    /// The slurmrestd client, built (and its version found) if it is not yet.
    ///
    /// # Errors
    /// The build's: slurmrestd unreachable, refused, or speaking no version of ours.
    pub fn connect(&mut self) -> Result<&ApiClient, SlurmApiError> {
        if self.client.is_none() {
            match self.api.build() {
                Ok(c) => {
                    info!(endpoint = %self.api.endpoint, version = %c.version(), "slurmrestd client ready");
                    self.client = Some(c);
                }
                Err(e) => {
                    self.build_counts.count(&e);
                    self.counters.connect_errors += 1;
                    self.counters.last_error = Some(e.to_string());
                    return Err(e);
                }
            }
        }
        self.client
            .as_ref()
            .ok_or_else(|| SlurmApiError::Config("the slurmrestd client is not built".into()))
    }

    /// The REST version in use, once the client is built.
    pub fn version(&self) -> Option<String> {
        self.client.as_ref().map(|c| c.version().to_string())
    }

    /// Answers refused or failed, since start.
    pub fn answer_counts(&self) -> AnswerCounts {
        let mut n = self.build_counts;
        if let Some(c) = &self.client {
            let get =
                |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
            n.malformed += get(&c.counters.malformed_total);
            n.oversized += get(&c.counters.oversized_total);
            n.unauthorized += get(&c.counters.unauthorized_total);
            n.timeouts += get(&c.counters.timeouts_total);
        }
        n
    }

    fn update(&mut self, job_id: u64, update: Update) -> Result<(), SlurmApiError> {
        self.connect()?.update(job_id, update)
    }

    /// The begin time `secs` from now (0: now).
    fn set_begin(&mut self, job_id: u64, secs: u64) -> Result<(), SlurmApiError> {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        let unix_s = now.saturating_add(i64::try_from(secs).unwrap_or(i64::MAX));
        self.update(job_id, Update::BeginAt { unix_s })
    }

    /// Holds powerplane has in Slurm, by powerplane job id.
    pub fn ours(&self) -> BTreeMap<String, OurHold> {
        self.holds
            .values()
            .map(|h| (JobId::slurm(h.job_id).to_string(), h.clone()))
            .collect()
    }

    /// The jobs of the last poll that Slurm suspended or requeued, by powerplane id.
    pub fn hinted(&self) -> BTreeMap<String, Hints> {
        self.last
            .keys()
            .map(|n| (JobId::slurm(*n).to_string(), self.hints_of(*n)))
            .filter(|(_, h)| *h != Hints::default())
            .collect()
    }

    fn hints_of(&self, n: u64) -> Hints {
        self.last
            .get(&n)
            .map(|j| Hints {
                suspended: j.state == "SUSPENDED",
                requeued: j.restarts > 0 && j.is_pending(),
            })
            .unwrap_or_default()
    }

    pub fn hints(&self, id: &str) -> Hints {
        slurm_id(id)
            .and_then(|n| self.last.get(&n))
            .map(|j| Hints {
                suspended: j.state == "SUSPENDED",
                requeued: j.restarts > 0 && j.is_pending(),
            })
            .unwrap_or_default()
    }

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
        let ids: Vec<u64> = self.holds.keys().copied().collect();
        for id in ids {
            let Some(h) = self.holds.get(&id).cloned() else {
                continue;
            };
            let begin = self.hold_with == HoldWith::BeginTime;
            let verdict = match self.last.get(&id) {
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
            };
            match verdict {
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
        // forget external releases of jobs Slurm no longer knows
        for id in self.external.clone() {
            if !self.last.contains_key(&id) {
                self.external.remove(&id);
                tx.delete_record(EXTERNAL, &id.to_string());
            }
        }
        if let Err(e) = store.commit(tx) {
            warn!(error = %e, "cannot save the Slurm hold records; retried next pass");
        }
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
        self.counters.last_error = None;
        Ok(out)
    }

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
        let wanted: BTreeMap<u64, &Hold> = desired
            .iter()
            .filter(|(_, h)| h.lease_until > now)
            .filter_map(|(id, h)| slurm_id(id).map(|n| (n, h)))
            .collect();
        // releases first: what is ours and no longer wanted (or past its lease)
        let ours: Vec<u64> = self.holds.keys().copied().collect();
        for id in ours {
            if wanted.contains_key(&id) {
                continue;
            }
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
                    done.push(Applied {
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
        }
        for (id, h) in wanted {
            if let Some(ours) = self.holds.get(&id).cloned() {
                if ours.lease_until == h.lease_until {
                    continue;
                }
                if self.hold_with == HoldWith::BeginTime {
                    // the begin time is the lease Slurm enforces: push it on once half
                    // of what was sent has passed
                    if ours.lease_until.secs_since(now) >= h.lease_until.secs_since(now) / 2.0 {
                        continue;
                    }
                    let secs = h.lease_until.secs_since(now).ceil().max(1.0) as u64;
                    if let Err(e) = self.set_begin(id, secs) {
                        self.failed("renew", id, &e);
                        continue;
                    }
                }
                let renewed = OurHold {
                    lease_until: h.lease_until,
                    ..ours
                };
                self.save(&renewed, store);
                self.holds.insert(id, renewed);
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
            let intent = OurHold {
                job_id: id,
                rule: h.rule.clone(),
                since: now,
                lease_until: h.lease_until,
                confirmed: false,
            };
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
                continue;
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
                    done.push(Applied {
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
        }
        done
    }

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
        let wanted: BTreeMap<u64, &Hold> = desired
            .iter()
            .filter(|(_, h)| h.lease_until > now)
            .filter_map(|(id, h)| slurm_id(id).map(|n| (n, h)))
            .collect();
        for id in self.suspended.keys().copied().collect::<Vec<_>>() {
            if wanted.contains_key(&id) {
                continue;
            }
            let gone = self.last.get(&id).is_none_or(|j| j.state != "SUSPENDED");
            let result = if gone {
                Ok(())
            } else {
                self.update(id, Update::Resume)
            };
            match result {
                Ok(()) => {
                    if !gone {
                        self.counters.resumes += 1;
                        done.push(Applied {
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
            let rec = OurHold {
                job_id: id,
                rule: h.rule.clone(),
                since: now,
                lease_until: h.lease_until,
                confirmed: true,
            };
            // recorded first: a crash after the call still knows the suspension is ours
            let mut tx = Tx::new();
            tx.put_record(SUSPENDED, &id.to_string(), &rec);
            if let Err(e) = store.commit(tx) {
                self.counters.action_errors += 1;
                warn!(job = id, error = %e, "not suspended: the store cannot record it");
                continue;
            }
            match self.update(id, Update::Suspend) {
                Ok(()) => {
                    self.counters.suspends += 1;
                    if let Some(j) = self.last.get_mut(&id) {
                        j.state = "SUSPENDED".into();
                    }
                    self.suspended.insert(id, rec);
                    done.push(Applied {
                        job: JobId::slurm(id).to_string(),
                        action: "suspend",
                        detail: format!("suspended in Slurm until {}", h.lease_until),
                    });
                }
                Err(e) => {
                    let mut tx = Tx::new();
                    tx.delete_record(SUSPENDED, &id.to_string());
                    let _ = store.commit(tx);
                    self.failed("suspend", id, &e);
                }
            }
        }
        done
    }

    /// Requeues a running job (only when Slurm allows it to requeue).
    pub fn requeue(&mut self, id: &str) -> Result<(), SlurmApiError> {
        let n = slurm_id(id).ok_or_else(|| SlurmApiError::Command {
            args: format!("requeue {id}"),
            message: "not a Slurm job".into(),
        })?;
        match self.update(n, Update::Requeue) {
            Ok(()) => {
                self.counters.requeues += 1;
                Ok(())
            }
            Err(e) => {
                self.failed("requeue", n, &e);
                Err(e)
            }
        }
    }

    fn failed(&mut self, what: &str, id: u64, e: &SlurmApiError) {
        self.counters.action_errors += 1;
        self.counters.last_error = Some(e.to_string());
        warn!(job = id, error = %e, "Slurm {what} failed; retried next pass");
    }

    fn save(&mut self, h: &OurHold, store: &mut dyn Commit) {
        let mut tx = Tx::new();
        tx.put_record(HOLDS, &h.job_id.to_string(), h);
        if let Err(e) = store.commit(tx) {
            warn!(job = h.job_id, error = %e, "cannot save a Slurm hold record");
        }
    }

    fn forget(&mut self, id: u64, store: &mut dyn Commit) {
        self.holds.remove(&id);
        let mut tx = Tx::new();
        tx.delete_record(HOLDS, &id.to_string());
        if let Err(e) = store.commit(tx) {
            warn!(job = id, error = %e, "cannot delete a Slurm hold record");
        }
    }
}

fn is_running(j: &SlurmJob) -> bool {
    matches!(
        j.state.as_str(),
        "RUNNING" | "SUSPENDED" | "COMPLETING" | "CONFIGURING" | "STAGE_OUT" | "RESIZING"
    )
}

/// Slurm answered that the call cannot succeed (the job ended, is unknown, or is no
/// longer pending): retrying does not help. By Slurm's error numbers, not its text.
fn is_final(e: &SlurmApiError) -> bool {
    matches!(e, SlurmApiError::Api { numbers, .. } if numbers.iter().any(|n| FINAL_ERRORS.contains(n)))
}
