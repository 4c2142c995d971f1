//! The schedulers `serve` steers: the `[schedulers]` config section, the job view the
//! control loop evaluates, the plan's holds applied to each scheduler, and every job's
//! lifecycle (pending, held, released, running, capped, suspended, requeued, finished)
//! with each transition stored and logged.
//!
//! Each tick: [`Schedulers::jobs`] polls the schedulers when due (a failed poll keeps
//! the last view), the control loop evaluates the policy on them, then
//! [`Schedulers::apply`] brings each scheduler's holds to what is in force (the plan
//! with the operators' overrides). Applying is idempotent and failed calls are retried
//! on the next tick; which holds are powerplane's is kept in the store (see
//! [`integrations::slurm_sync`]), so a restart neither loses nor duplicates a hold.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;
use integrations::slurm::{Client, Endpoint, JobMapping};
use integrations::slurm_sync::SlurmSync;
use integrations::store::{Store, Tx};
use policies::State;
use serde::Deserialize;
use serde_json::json;
use telemetry::{Job, Timestamp};
use tracing::{info, warn};

use crate::registry::{Lifecycle, Lifecycles, Seen, Transition, LIFECYCLES, TRANSITIONS};

/// `[schedulers]` in `powerplane.toml`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SchedulersSection {
    #[serde(default)]
    pub slurm: Option<SlurmSection>,
}

/// `[schedulers.slurm]`: slurmrestd, and how its jobs map to powerplane's.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SlurmSection {
    /// `unix:/path/to/slurmrestd.sock` (rest_auth/local) or `http://host:port`.
    pub endpoint: String,
    /// Sent as `X-SLURM-USER-NAME` (root on the unix socket may act as any user).
    #[serde(default)]
    pub user: Option<String>,
    /// Seconds between polls of the job list (0: every tick).
    #[serde(default = "default_poll")]
    pub poll_s: f64,
    #[serde(default = "default_timeout")]
    pub timeout_s: f64,
    /// The `scontrol` that requeues (slurmrestd v0.0.38 cannot).
    #[serde(default = "default_scontrol")]
    pub scontrol: PathBuf,
    #[serde(default)]
    pub mapping: JobMapping,
}

fn default_poll() -> f64 {
    15.0
}
fn default_timeout() -> f64 {
    10.0
}
fn default_scontrol() -> PathBuf {
    PathBuf::from("scontrol")
}

/// Checks the section before anything starts.
pub fn check(s: &SchedulersSection, file: &str) -> Result<()> {
    if let Some(sl) = &s.slurm {
        Endpoint::parse(&sl.endpoint)
            .map_err(|e| anyhow::anyhow!("{file}: [schedulers.slurm] endpoint {e}"))?;
        anyhow::ensure!(
            sl.poll_s >= 0.0 && sl.poll_s.is_finite(),
            "{file}: [schedulers.slurm] poll_s must be 0 or more, got {}",
            sl.poll_s
        );
        anyhow::ensure!(
            sl.timeout_s > 0.0 && sl.timeout_s <= 300.0,
            "{file}: [schedulers.slurm] timeout_s must be within (0, 300], got {}",
            sl.timeout_s
        );
        anyhow::ensure!(
            sl.mapping.default_duration_s > 0.0,
            "{file}: [schedulers.slurm.mapping] default_duration_s must be above 0"
        );
    }
    Ok(())
}

/// The schedulers of one `serve`.
pub struct Schedulers {
    slurm: Option<SlurmSync>,
    poll_s: f64,
    last_poll: Option<Timestamp>,
    /// The schedulers' last view of their jobs.
    jobs: Vec<Job>,
    lifecycles: Lifecycles,
    /// Transitions stored since start.
    pub transitions: u64,
    /// The most recent transitions, oldest first, for the API.
    recent: std::collections::VecDeque<Transition>,
}

const RECENT: usize = 1000;

impl Schedulers {
    /// Opens the configured schedulers and restores what the store knows of them
    /// (powerplane's holds, each job's lifecycle).
    pub fn open(section: Option<&SchedulersSection>, store: &mut Store) -> Result<Self> {
        let lifecycles = Lifecycles {
            jobs: store.records::<Lifecycle>(LIFECYCLES)?,
        };
        let mut poll_s = f64::INFINITY;
        let slurm = match section.and_then(|s| s.slurm.as_ref()) {
            Some(s) => {
                let endpoint = Endpoint::parse(&s.endpoint).map_err(anyhow::Error::msg)?;
                let mut client = Client::new(endpoint);
                client.user = s.user.clone();
                client.timeout = Duration::from_secs_f64(s.timeout_s);
                client.scontrol = s.scontrol.clone();
                let sync = SlurmSync::restore(client, s.mapping.clone(), store)?;
                info!(endpoint = %s.endpoint, poll_s = s.poll_s, holds = sync.ours().len(), "steering Slurm through slurmrestd");
                poll_s = s.poll_s;
                Some(sync)
            }
            None => None,
        };
        Ok(Schedulers {
            slurm,
            poll_s,
            last_poll: None,
            jobs: Vec::new(),
            lifecycles,
            transitions: 0,
            recent: Default::default(),
        })
    }

    pub fn is_empty(&self) -> bool {
        self.slurm.is_none()
    }

    /// The jobs to evaluate: polled from the schedulers when due, else the last view.
    pub fn jobs(&mut self, now: Timestamp, store: &mut Store) -> Vec<Job> {
        let due = self
            .last_poll
            .is_none_or(|t| now.secs_since(t) >= self.poll_s);
        if let (true, Some(s)) = (due, self.slurm.as_mut()) {
            self.last_poll = Some(now);
            match s.poll(now, store) {
                Ok(jobs) => self.jobs = jobs,
                Err(e) => {
                    warn!(error = %e, "Slurm poll failed; evaluating the last view of its jobs")
                }
            }
        }
        self.jobs.clone()
    }

    /// Brings the schedulers' holds to `actuated` and records each job's lifecycle.
    pub fn apply(&mut self, actuated: &State, now: Timestamp, store: &mut Store) {
        if let Some(s) = self.slurm.as_mut() {
            for a in s.apply(&actuated.holds, now, store) {
                info!(job = %a.job, action = a.action, "{}", a.detail);
            }
        }
        let ours = self.slurm.as_ref().map(|s| s.ours()).unwrap_or_default();
        let mut tx = Tx::new();
        for job in &self.jobs {
            if job.state.is_done()
                && self.lifecycles.jobs.get(&job.id) == Some(&Lifecycle::Finished)
            {
                continue;
            }
            let hints = self
                .slurm
                .as_ref()
                .map(|s| s.hints(&job.id))
                .unwrap_or_default();
            let seen = Seen {
                held_by_us: ours.contains_key(&job.id),
                capped: job.allocated.iter().any(|g| actuated.caps.contains_key(g)),
                suspended: hints.suspended,
                requeued: hints.requeued,
            };
            if let Some(t) = self.lifecycles.observe(job, seen, now) {
                info!(job = %t.job, from = ?t.from, to = %t.to, "{}", t.reason);
                tx.put_record(LIFECYCLES, &t.job, &t.to);
                tx.append_record(TRANSITIONS, &t);
                self.transitions += 1;
                if self.recent.len() == RECENT {
                    self.recent.pop_front();
                }
                self.recent.push_back(t);
            }
        }
        if let Err(e) = store.commit(tx) {
            warn!(error = %e, "cannot store job transitions");
        }
    }

    /// What `/api/v1/schedulers` shows.
    pub fn status(&self) -> serde_json::Value {
        let slurm = self.slurm.as_ref().map(|s| {
            json!({
                "endpoint": s.client.endpoint.to_string(),
                "counters": s.counters,
                "holds": s.ours(),
            })
        });
        let lifecycle: BTreeMap<&String, &Lifecycle> = self
            .lifecycles
            .jobs
            .iter()
            .filter(|(_, l)| **l != Lifecycle::Finished)
            .collect();
        json!({
            "slurm": slurm,
            "lifecycle": lifecycle,
            "transitions": self.recent,
        })
    }

    /// Counters for `/metrics`: (name, help, value).
    pub fn counters(&self) -> Vec<(&'static str, &'static str, f64)> {
        let Some(s) = &self.slurm else {
            return Vec::new();
        };
        let c = &s.counters;
        vec![
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
                s.ours().len() as f64,
            ),
        ]
    }
}
