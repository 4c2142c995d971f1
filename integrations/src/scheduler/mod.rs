//! The one trait every scheduler adapter implements ([`Scheduler`]), with typed ids
//! ([`SchedulerId`], [`JobId`]) and what the control loop and an adapter's reconciler
//! hand each other: the desired state in ([`Desired`]), the jobs, the adapter's view of
//! them and what it applied out ([`View`], [`Pass`]).
//!
//! Data flow: the control loop evaluates the plan and hands the holds, suspensions
//! and requeues it wants to each adapter's reconciler (in `orchestrator::schedulers`),
//! which runs the adapter on a thread of its own: [`Scheduler::poll`] reads the jobs,
//! [`Scheduler::apply`] brings the scheduler to the desired state. Both are blocking
//! calls with the adapter's deadline per request, and both are idempotent, so a newer
//! desired state may supersede an older one that was never applied. Store writes go
//! through [`Commit`], which the reconciler implements by sending them to the loop that
//! owns the store.
//!
//! Adding an adapter: a module here (or a folder) with a type that implements
//! [`Scheduler`] and its [`Adapter`] constant (its id, the scheduler name its jobs
//! carry, the prefix of their ids), one line in [`REGISTERED`], and one registration
//! line in `orchestrator::schedulers`.

pub mod error;
pub mod ids;
pub mod kubernetes;
pub mod slurm;
pub mod webhook;

use std::collections::{BTreeMap, BTreeSet};

use policies::Hold;
use serde::Serialize;
use telemetry::{Job, Timestamp};

pub use error::{Cause, SchedulerError};
pub use ids::{Adapter, JobId, SchedulerId, KUBERNETES, REGISTERED, SLURM, WEBHOOK};

use crate::store::{Store, StoreError, Tx};

/// Where an adapter's store writes go: the store itself (tests, tools) or the
/// control loop that owns it.
pub trait Commit {
    /// Commits `tx` atomically; `Ok` once it is durable.
    fn commit(&mut self, tx: Tx) -> Result<(), StoreError>;
}

impl Commit for Store {
    fn commit(&mut self, tx: Tx) -> Result<(), StoreError> {
        Store::commit(self, tx)
    }
}

/// A requeue the plan decided, numbered so that a reconciler carries out each one once
/// however many desired states repeat it.
#[derive(Debug, Clone, PartialEq)]
pub struct Requeue {
    pub seq: u64,
    pub job: JobId,
    pub reason: String,
}

/// What the plan wants of the schedulers now (all adapters; each takes its own jobs).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Desired {
    /// The holds in force, by job id.
    pub holds: BTreeMap<String, Hold>,
    /// The suspensions in force, by job id.
    pub suspended: BTreeMap<String, Hold>,
    /// Requeues not yet acknowledged, oldest first.
    pub requeues: Vec<Requeue>,
    /// The poll of each adapter whose jobs the plan saw (its count of successful
    /// polls): an adapter applies only a state computed on its latest poll, so a job
    /// it just found is never let go by a plan that has not seen it yet.
    pub polls: BTreeMap<SchedulerId, u64>,
    /// The GPU power limits of running jobs and what is in force on their GPUs, by job
    /// id (for the adapters that tell their jobs, as Kubernetes Events).
    pub limits: BTreeMap<String, JobLimit>,
}

/// A running job's GPU power limit and what its GPUs run at.
#[derive(Debug, Clone, PartialEq)]
pub struct JobLimit {
    /// What was asked, in words (`300W`, `80% of the default limit`, `the class
    /// training's 250W`).
    pub asked: String,
    /// The limit in watts on each of its GPUs (before the GPU's own range).
    pub asked_w: f64,
    /// Each GPU it holds and what it runs at.
    pub gpus: Vec<LimitGpu>,
}

/// One GPU of a job with a power limit.
#[derive(Debug, Clone, PartialEq)]
pub struct LimitGpu {
    pub gpu: telemetry::EntityId,
    /// The cap in force (watts, the rule whose cap it is); `None`: not capped.
    pub cap: Option<(f64, String)>,
    /// The GPU's own range: its minimum and its default limit.
    pub min_w: f64,
    pub default_w: f64,
}

impl JobLimit {
    /// What to tell the job: (warning, reason, note); the same words while nothing
    /// changes.
    pub fn tell(&self) -> (bool, &'static str, String) {
        let n = self.gpus.len();
        if n == 0 {
            return (
                false,
                "PowerLimitPending",
                format!(
                    "GPU power limit {}: waiting to learn which GPUs the pod holds (the node's agent reports them from the kubelet)",
                    self.asked
                ),
            );
        }
        let min = self
            .gpus
            .iter()
            .map(|g| g.min_w)
            .fold(f64::INFINITY, f64::min);
        if self.asked_w < min {
            return (
                true,
                "PowerLimitRaised",
                format!(
                    "GPU power limit {} ({:.0} W) is below the GPU's minimum {:.0} W: {:.0} W applied on {} GPU(s)",
                    self.asked, self.asked_w, min, min, n
                ),
            );
        }
        // a GPU not capped at or under its default limit already runs within the limit
        let uncapped: Vec<String> = self
            .gpus
            .iter()
            .filter(|g| g.cap.is_none() && self.asked_w < g.default_w - 0.5)
            .map(|g| g.gpu.to_string())
            .collect();
        if !uncapped.is_empty() {
            return (
                true,
                "PowerLimitNotApplied",
                format!(
                    "GPU power limit {} not in force on {} (the plan does not cap them; the limits rule may be disabled)",
                    self.asked,
                    uncapped.join(", ")
                ),
            );
        }
        let lower: Vec<String> = self
            .gpus
            .iter()
            .filter_map(|g| {
                g.cap
                    .as_ref()
                    .filter(|(w, _)| *w < self.asked_w - 0.5)
                    .map(|(w, rule)| format!("{} at {w:.0} W by {rule}", g.gpu))
            })
            .collect();
        if lower.is_empty() {
            (
                false,
                "PowerLimitApplied",
                format!(
                    "GPU power limit {} ({:.0} W) in force on {} GPU(s)",
                    self.asked, self.asked_w, n
                ),
            )
        } else {
            (
                false,
                "PowerLimitApplied",
                format!(
                    "GPU power limit {} ({:.0} W) in force; a lower cap holds {}",
                    self.asked,
                    self.asked_w,
                    lower.join(", ")
                ),
            )
        }
    }
}

/// One thing an adapter did to a job, for the log, the status and the audit.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Applied {
    pub job: String,
    pub action: &'static str,
    pub detail: String,
}

/// A hint the job alone does not carry: the scheduler suspended or requeued it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Hints {
    pub suspended: bool,
    pub requeued: bool,
}

/// What an adapter knows about its jobs beyond the jobs themselves.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct View {
    /// Jobs powerplane holds in this scheduler (by job id).
    pub held_by_us: BTreeSet<String>,
    /// Jobs with a hint, by job id.
    pub hints: BTreeMap<String, Hints>,
}

/// The outcome of one [`Scheduler::apply`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Pass {
    pub applied: Vec<Applied>,
    /// Calls that failed (retried on a later pass, after a backoff).
    pub failed: u32,
}

/// How an adapter takes the plan's requeues of its jobs: declared by the adapter
/// ([`Scheduler::requeues`]), so the loop routes them without a branch per scheduler.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Requeues {
    /// Its reconciler carries out each once ([`Scheduler::requeue`]); the loop keeps
    /// it until the reconciler acknowledges it.
    Reconciler,
    /// Queued as actions with the job's others (the outbound webhook's outbox).
    Outbox,
    /// It cannot requeue: each is dropped with this warning.
    Never(&'static str),
}

/// A counter or gauge for `/metrics`: (name, help, value); names ending in `_total`
/// are counters.
pub type Counter = (&'static str, &'static str, f64);

/// A scheduler powerplane steers. The calls block (each request under the adapter's
/// deadline) and run on the adapter's reconciler thread, never on the control loop.
pub trait Scheduler: Send {
    fn id(&self) -> SchedulerId;

    /// How the plan's requeues of this adapter's jobs are carried out.
    fn requeues(&self) -> Requeues {
        Requeues::Never("the scheduler cannot requeue powerplane's jobs; ignored")
    }

    /// Whether `/api/v1/schedulers` and `/metrics` show this adapter's status and
    /// counters under its name (`false`: another part shows them for it, as the
    /// webhook's section does for its deliveries).
    fn reports(&self) -> bool {
        true
    }

    /// Reads the scheduler's jobs as powerplane sees them (a job gone from the
    /// scheduler comes back once as finished). `Ok(None)`: this adapter learns of its
    /// jobs otherwise (events).
    fn poll(
        &mut self,
        now: Timestamp,
        store: &mut dyn Commit,
    ) -> Result<Option<Vec<Job>>, SchedulerError>;

    /// Brings the scheduler to `desired` (idempotent: what is already so is left).
    fn apply(&mut self, desired: &Desired, now: Timestamp, store: &mut dyn Commit) -> Pass;

    /// Requeues one of this adapter's jobs.
    fn requeue(&mut self, job: &JobId) -> Result<(), SchedulerError> {
        Err(SchedulerError::CannotRequeue {
            job: job.to_string(),
            scheduler: self.id().to_string(),
        })
    }

    /// Which of its jobs powerplane holds, and hints, as of the last poll or pass.
    fn view(&self) -> View;

    /// What `/api/v1/schedulers` shows of this adapter.
    fn status(&self) -> serde_json::Value;

    /// The adapter's counters and gauges for `/metrics`.
    fn counters(&self) -> Vec<Counter>;

    /// When the adapter wants another pass without a new desired state (a retry
    /// that falls due), if ever.
    fn next_due(&self) -> Option<Timestamp> {
        None
    }
}
