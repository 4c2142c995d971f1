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
//!
//! # Layout
//!
//! - this file: the adapter, its records and counters, the client it builds.
//! - [`poll`]: Slurm's jobs read and the hold records reconciled with them.
//! - [`holds`]: holds released, renewed and placed ([`SlurmSync::apply`]).
//! - [`suspend`]: suspensions and resumes ([`SlurmSync::apply_suspensions`]).

mod holds;
mod poll;
mod suspend;

use std::collections::{BTreeMap, BTreeSet};

use policies::Hold;
use serde::{Deserialize, Serialize};
use telemetry::{Job, Timestamp};
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

impl OurHold {
    /// The record of the plan's hold `h` on Slurm job `id`, made at `now`.
    fn new(id: u64, h: &Hold, now: Timestamp, confirmed: bool) -> Self {
        OurHold {
            job_id: id,
            rule: h.rule.clone(),
            since: now,
            lease_until: h.lease_until,
            confirmed,
        }
    }
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

/// The Slurm jobs of `desired` whose lease has not passed, by job number.
fn wanted(desired: &BTreeMap<String, Hold>, now: Timestamp) -> BTreeMap<u64, &Hold> {
    desired
        .iter()
        .filter(|(_, h)| h.lease_until > now)
        .filter_map(|(id, h)| slurm_id(id).map(|n| (n, h)))
        .collect()
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
