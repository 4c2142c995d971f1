//! The job registry: every job powerplane knows, as its scheduler last reported it.

use std::collections::{BTreeMap, VecDeque};

use policies::JobTable;
use telemetry::fasthash::FnvMap;
use telemetry::{EntityId, Job, Site};

/// How many finished jobs the registry remembers (to tell a finished job a scheduler
/// reports again from a change); older ones are forgotten (the store keeps them).
pub const FINISHED_KEPT: usize = 10_000;

/// The jobs powerplane knows: the active ones (not finished or cancelled) in id order,
/// and the most recently finished ones.
#[derive(Debug, Clone, Default)]
pub struct JobRegistry {
    /// Sorted by id.
    active: Vec<Job>,
    finished: FnvMap<String, Job>,
    /// Finished job ids, oldest first.
    finished_order: VecDeque<String>,
    /// The active jobs resolved on the site (their allocated GPUs as GPU indexes, their
    /// ids to positions), once for every evaluation until the jobs or the site change
    /// (see [`JobRegistry::active_on`]).
    table: Option<JobTable>,
    /// The GPUs the agents report each job holding (Kubernetes pods, from the
    /// kubelet), for jobs whose scheduler names none ([`JobRegistry::set_holders`]).
    holders: BTreeMap<String, Vec<EntityId>>,
}

impl JobRegistry {
    /// A registry holding the jobs restored from the store.
    pub fn from_jobs(jobs: impl IntoIterator<Item = Job>) -> Self {
        let mut r = JobRegistry::default();
        r.sync(jobs);
        r
    }

    /// Takes the scheduler's current view; returns the jobs that are new or changed.
    /// Jobs not in `incoming` are left as they are.
    pub fn sync(&mut self, incoming: impl IntoIterator<Item = Job>) -> Vec<Job> {
        let mut changed = Vec::new();
        for mut job in incoming {
            self.allocate(&mut job);
            let at = self.active.binary_search_by(|j| j.id.as_str().cmp(&job.id));
            match at {
                Ok(i) if self.active[i] == job => continue,
                Err(_) if self.finished.get(&job.id) == Some(&job) => continue,
                _ => {}
            }
            changed.push(job.clone());
            self.table = None;
            match (at, job.state.is_done()) {
                (Ok(i), false) => self.active[i] = job,
                (Ok(i), true) => {
                    self.active.remove(i);
                    self.finish(job);
                }
                (Err(i), false) => {
                    // a finished job the scheduler brings back (requeued) is active again
                    self.finished.remove(&job.id);
                    self.active.insert(i, job);
                }
                (Err(_), true) => self.finish(job),
            }
        }
        changed
    }

    /// A running job its scheduler gives no GPUs: those the agents report it holds.
    fn allocate(&self, job: &mut Job) {
        if job.allocated.is_empty() && job.state == telemetry::JobState::Running {
            if let Some(g) = self.holders.get(&job.id) {
                job.allocated = g.clone();
            }
        }
    }

    /// The GPUs the agents report each job holding, by job id: set as the allocation
    /// of the running jobs whose scheduler names none (a Kubernetes pod's GPUs come
    /// from its node's kubelet), now and on every later sync; a scheduler's own
    /// allocation stands.
    pub fn set_holders(&mut self, holders: BTreeMap<String, Vec<EntityId>>) {
        if holders == self.holders {
            return;
        }
        let old = std::mem::replace(&mut self.holders, holders);
        for j in &mut self.active {
            let from_agents = old.get(&j.id).is_some_and(|g| *g == j.allocated);
            if j.state != telemetry::JobState::Running || !(j.allocated.is_empty() || from_agents) {
                continue;
            }
            let want = self.holders.get(&j.id).cloned().unwrap_or_default();
            if j.allocated != want {
                j.allocated = want;
                self.table = None;
            }
        }
    }

    fn finish(&mut self, job: Job) {
        if self.finished.insert(job.id.clone(), job.clone()).is_none() {
            self.finished_order.push_back(job.id);
        }
        while self.finished_order.len() > FINISHED_KEPT {
            // (a job brought back to life and finished again is forgotten with its
            // first finish: the store still has it)
            if let Some(id) = self.finished_order.pop_front() {
                self.finished.remove(&id);
            }
        }
    }

    /// Jobs that are not finished or cancelled, in id order.
    pub fn active(&self) -> &[Job] {
        &self.active
    }

    /// The active jobs (as [`JobRegistry::active`]) with their table on `site` (their
    /// allocated GPUs and ids resolved): made again only after the jobs changed, or for
    /// another site.
    pub fn active_on(&mut self, site: &Site) -> (&[Job], &JobTable) {
        if !self
            .table
            .as_ref()
            .is_some_and(|t| t.fits(site, &self.active))
        {
            self.table = None;
        }
        let active = &self.active;
        let table = self
            .table
            .get_or_insert_with(|| JobTable::new(site, active));
        (active, table)
    }

    pub fn get(&self, id: &str) -> Option<&Job> {
        match self.active.binary_search_by(|j| j.id.as_str().cmp(id)) {
            Ok(i) => Some(&self.active[i]),
            Err(_) => self.finished.get(id),
        }
    }

    /// Every job known (the active ones and the finished ones remembered), in id order.
    pub fn all(&self) -> impl Iterator<Item = &Job> {
        let mut v: Vec<&Job> = self.active.iter().chain(self.finished.values()).collect();
        v.sort_unstable_by(|a, b| a.id.cmp(&b.id));
        v.into_iter()
    }

    /// Jobs known: the active ones and the finished ones remembered.
    pub fn len(&self) -> usize {
        self.active.len() + self.finished.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
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
            gpu_power_limit: None,
        }
    }

    fn numbered(n: usize, state: JobState) -> Job {
        Job {
            id: format!("trace:{n:06}"),
            ..job(state)
        }
    }

    #[test]
    fn the_job_table_is_made_once_and_again_when_the_jobs_or_the_site_change() {
        let site = Site::parse("site.toml", crate::examples::DEFAULT_SITE).expect("demo site");
        let gpus = site.gpus();
        let gpu = |i: usize| gpus[i].id.clone().into_owned();
        let mut r = JobRegistry::default();
        let mut a = job(JobState::Running);
        a.allocated = vec![gpu(9), telemetry::EntityId::gpu("no-such-node", 0), gpu(3)];
        r.sync([a.clone()]);
        let mut b = numbered(7, JobState::Pending);
        b.allocated = Vec::new();
        r.sync([b.clone()]);
        let (jobs, table) = r.active_on(&site);
        assert_eq!(jobs, [a.clone(), b.clone()]);
        assert_eq!(
            table.of(0).collect::<Vec<_>>(),
            [9, 3],
            "unknown GPUs left out"
        );
        assert_eq!(table.of(1).count(), 0);
        assert_eq!(table.position(jobs, &a.id), Some(0));
        assert_eq!(table.position(jobs, &b.id), Some(1));
        assert_eq!(table.position(jobs, "slurm:404"), None);
        // the same view again: nothing changed, the table is kept
        assert!(r.sync([a.clone()]).is_empty());
        assert!(r.table.as_ref().is_some_and(|x| x.fits(&site, &r.active)));
        // the job moves: resolved again
        a.allocated = vec![gpu(0)];
        r.sync([a.clone()]);
        assert!(r.table.is_none());
        assert_eq!(r.active_on(&site).1.of(0).collect::<Vec<_>>(), [0]);
        // another site (a reload) has another GPU table: resolved again on it
        let reloaded = Site::parse("site.toml", crate::examples::DEFAULT_SITE).expect("demo site");
        let kept = r.table.as_ref().expect("kept since the last change");
        assert!(!kept.fits(&reloaded, &r.active));
        let (jobs, table) = r.active_on(&reloaded);
        assert!(table.fits(&reloaded, &[a, b]));
        assert_eq!(table.position(jobs, "trace:000007"), Some(1));
    }

    #[test]
    fn the_registry_reports_changes_keeps_active_jobs_in_order_and_forgets_old_finished_ones() {
        let mut r = JobRegistry::default();
        let first: Vec<Job> = (0..5)
            .rev()
            .map(|n| numbered(n, JobState::Pending))
            .collect();
        assert_eq!(r.sync(first.clone()).len(), 5, "all new");
        assert!(
            r.sync(first).is_empty(),
            "the same view again changes nothing"
        );
        let ids: Vec<&str> = r.active().iter().map(|j| j.id.as_str()).collect();
        assert_eq!(
            ids,
            [
                "trace:000000",
                "trace:000001",
                "trace:000002",
                "trace:000003",
                "trace:000004"
            ]
        );
        // one starts, one finishes; the others are not reported and stay as they were
        let changed = r.sync([
            numbered(1, JobState::Running),
            numbered(3, JobState::Finished),
        ]);
        assert_eq!(changed.len(), 2);
        assert_eq!(r.active().len(), 4);
        assert_eq!(
            r.get("trace:000001").map(|j| j.state),
            Some(JobState::Running)
        );
        assert_eq!(
            r.get("trace:000003").map(|j| j.state),
            Some(JobState::Finished)
        );
        assert!(r.active().iter().all(|j| !j.state.is_done()));
        // a scheduler listing a finished job again (Slurm keeps them a while) is no change
        assert!(r.sync([numbered(3, JobState::Finished)]).is_empty());
        // a finished job brought back (requeued) is active again
        assert_eq!(r.sync([numbered(3, JobState::Pending)]).len(), 1);
        assert!(r.active().iter().any(|j| j.id == "trace:000003"));
        // a long-running controller does not keep every finished job for ever
        let many = FINISHED_KEPT + 500;
        r.sync((10..10 + many).map(|n| numbered(n, JobState::Finished)));
        assert_eq!(r.len(), r.active().len() + FINISHED_KEPT);
        assert!(
            r.get("trace:000010").is_none(),
            "the oldest finished job is forgotten"
        );
        assert!(r.get(&format!("trace:{:06}", 9 + many)).is_some());
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
