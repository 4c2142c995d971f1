//! The job registry: every job powerplane knows, as its scheduler last reported it.

use std::collections::BTreeMap;

use telemetry::Job;

#[derive(Debug, Clone, Default)]
pub struct JobRegistry {
    jobs: BTreeMap<String, Job>,
}

impl JobRegistry {
    /// A registry holding the jobs restored from the store.
    pub fn from_jobs(jobs: impl IntoIterator<Item = Job>) -> Self {
        JobRegistry {
            jobs: jobs.into_iter().map(|j| (j.id.clone(), j)).collect(),
        }
    }

    /// Takes the scheduler's current view; returns the jobs that are new or changed.
    pub fn sync(&mut self, incoming: impl IntoIterator<Item = Job>) -> Vec<Job> {
        let mut changed = Vec::new();
        for job in incoming {
            if self.jobs.get(&job.id) != Some(&job) {
                changed.push(job.clone());
                self.jobs.insert(job.id.clone(), job);
            }
        }
        changed
    }

    /// Jobs that are not finished or cancelled, in id order.
    pub fn active(&self) -> Vec<Job> {
        self.jobs
            .values()
            .filter(|j| !j.state.is_done())
            .cloned()
            .collect()
    }

    pub fn get(&self, id: &str) -> Option<&Job> {
        self.jobs.get(id)
    }

    pub fn all(&self) -> impl Iterator<Item = &Job> {
        self.jobs.values()
    }

    pub fn len(&self) -> usize {
        self.jobs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.jobs.is_empty()
    }
}

/// Where a job is in its life, as powerplane tracks it across schedulers.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum Lifecycle {
    /// Submitted, waiting to start.
    Pending,
    /// Held by powerplane (the scheduler will not start it).
    Held,
    /// Was held by powerplane, released, waiting to start.
    Released,
    Running,
    /// Running on at least one GPU powerplane caps.
    Capped,
    /// Suspended by the scheduler.
    Suspended,
    /// Put back in the queue after it started.
    Requeued,
    /// Finished, failed or cancelled.
    Finished,
}

impl std::fmt::Display for Lifecycle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = serde_json::to_value(self)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default();
        f.write_str(&s)
    }
}

/// One change of a job's [`Lifecycle`], as the store keeps it.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Transition {
    pub time: telemetry::Timestamp,
    pub job: String,
    /// `None` for a job seen for the first time.
    pub from: Option<Lifecycle>,
    pub to: Lifecycle,
    pub reason: String,
}

/// What the lifecycle of a job depends on besides the job itself.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Seen {
    /// powerplane holds it in its scheduler.
    pub held_by_us: bool,
    /// One of its GPUs is capped.
    pub capped: bool,
    pub suspended: bool,
    /// The scheduler put it back in the queue after it ran.
    pub requeued: bool,
}

/// Every job's lifecycle, with the rules that move it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Lifecycles {
    pub jobs: BTreeMap<String, Lifecycle>,
}

/// The store collection of lifecycles and the log of transitions.
pub const LIFECYCLES: &str = "job_lifecycle";
pub const TRANSITIONS: &str = "job_transitions";

impl Lifecycles {
    /// The lifecycle a job is in now, given the one before.
    pub fn next(prior: Option<Lifecycle>, job: &Job, seen: Seen) -> Lifecycle {
        use telemetry::JobState as S;
        match job.state {
            S::Finished | S::Cancelled => Lifecycle::Finished,
            S::Suspended => Lifecycle::Suspended,
            S::Running if seen.suspended => Lifecycle::Suspended,
            S::Running if seen.capped => Lifecycle::Capped,
            S::Running => Lifecycle::Running,
            S::Held if seen.held_by_us => Lifecycle::Held,
            S::Held | S::Pending if seen.held_by_us => Lifecycle::Held,
            S::Held | S::Pending => match prior {
                Some(Lifecycle::Held | Lifecycle::Released) => Lifecycle::Released,
                Some(
                    Lifecycle::Running
                    | Lifecycle::Capped
                    | Lifecycle::Suspended
                    | Lifecycle::Requeued,
                ) => Lifecycle::Requeued,
                _ if seen.requeued => Lifecycle::Requeued,
                _ => Lifecycle::Pending,
            },
        }
    }

    /// Moves a job to where it is now; returns the transition when it moved.
    pub fn observe(
        &mut self,
        job: &Job,
        seen: Seen,
        now: telemetry::Timestamp,
    ) -> Option<Transition> {
        let prior = self.jobs.get(&job.id).copied();
        let to = Self::next(prior, job, seen);
        if prior == Some(to) {
            return None;
        }
        self.jobs.insert(job.id.clone(), to);
        let reason = match (prior, to) {
            (None, _) => format!("seen in {}", job.scheduler),
            (_, Lifecycle::Held) => "held by powerplane".into(),
            (Some(Lifecycle::Held), Lifecycle::Released) => "released by powerplane".into(),
            (_, Lifecycle::Capped) => "a GPU of the job is capped".into(),
            (Some(Lifecycle::Capped), Lifecycle::Running) => "its GPUs are uncapped".into(),
            (_, to) => format!("the scheduler reports it {to}"),
        };
        Some(Transition {
            time: now,
            job: job.id.clone(),
            from: prior,
            to,
            reason,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use telemetry::{JobState, Timestamp};

    fn job(state: JobState) -> Job {
        Job {
            id: "slurm:1".into(),
            scheduler: "slurm".into(),
            name: "j".into(),
            user: "u".into(),
            project: "p".into(),
            class: "batch".into(),
            priority: 1,
            gpus: 1,
            allocated: Vec::new(),
            state,
            submit_time: Timestamp(0),
            start_time: None,
            end_time: None,
            deadline: None,
            est_duration_s: 60.0,
            deferrable: true,
            preemptible: false,
        }
    }

    #[test]
    fn a_job_moves_through_held_released_running_capped_requeued_finished() {
        let mut l = Lifecycles::default();
        let t = Timestamp(0);
        let mut path = Vec::new();
        let mut step = |state, seen| {
            if let Some(tr) = l.observe(&job(state), seen, t) {
                path.push(tr.to);
            }
        };
        let none = Seen::default();
        step(JobState::Pending, none);
        step(JobState::Pending, none);
        step(
            JobState::Pending,
            Seen {
                held_by_us: true,
                ..none
            },
        );
        step(
            JobState::Held,
            Seen {
                held_by_us: true,
                ..none
            },
        );
        step(JobState::Held, none);
        step(JobState::Pending, none);
        step(JobState::Running, none);
        step(
            JobState::Running,
            Seen {
                capped: true,
                ..none
            },
        );
        step(
            JobState::Running,
            Seen {
                suspended: true,
                ..none
            },
        );
        step(JobState::Pending, none);
        step(JobState::Finished, none);
        assert_eq!(
            path,
            vec![
                Lifecycle::Pending,
                Lifecycle::Held,
                Lifecycle::Released,
                Lifecycle::Running,
                Lifecycle::Capped,
                Lifecycle::Suspended,
                Lifecycle::Requeued,
                Lifecycle::Finished
            ]
        );
    }
}
