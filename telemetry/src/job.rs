//! A job as powerplane sees it: who runs what, where, with what slack.

use serde::{Deserialize, Serialize};

use crate::{EntityId, Timestamp};

/// Where a job is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobState {
    /// Submitted, waiting for GPUs.
    Pending,
    /// Held (deferred) by powerplane; the scheduler will not start it.
    Held,
    Running,
    /// Stopped by the scheduler at powerplane's request; resumes later.
    Suspended,
    Finished,
    Cancelled,
}

impl JobState {
    pub fn is_done(self) -> bool {
        matches!(self, JobState::Finished | JobState::Cancelled)
    }
}

/// A scheduler's job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Job {
    /// Unique across schedulers, e.g. `slurm:1234`.
    pub id: String,
    pub scheduler: String,
    pub name: String,
    pub user: String,
    pub project: String,
    /// A class the policy selects on, e.g. `training`, `inference`, `batch`.
    pub class: String,
    /// Higher runs first and is capped last.
    pub priority: i32,
    /// GPUs requested.
    pub gpus: u32,
    /// GPUs held while running.
    #[serde(default)]
    pub allocated: Vec<EntityId>,
    pub state: JobState,
    pub submit_time: Timestamp,
    #[serde(default)]
    pub start_time: Option<Timestamp>,
    #[serde(default)]
    pub end_time: Option<Timestamp>,
    /// Latest acceptable end.
    #[serde(default)]
    pub deadline: Option<Timestamp>,
    /// Estimated run time at full power, in seconds.
    pub est_duration_s: f64,
    /// May be started later than submitted.
    pub deferrable: bool,
    /// May be requeued or suspended in an emergency.
    pub preemptible: bool,
}

impl Job {
    /// The latest start that still meets the deadline at full power, if there is a deadline.
    pub fn latest_start(&self) -> Option<Timestamp> {
        self.deadline.map(|d| d + -self.est_duration_s)
    }
}
