//! Slurm jobs as powerplane sees them: the version-neutral [`SlurmJob`] (what
//! [`crate::slurm_api::JobView::to_slurm_job`] makes of any REST version's answer) and
//! [`JobMapping`], how one becomes powerplane's [`Job`]. Below it: the versioned REST
//! layer ([`crate::slurm_api`]); above it: the adapter ([`crate::slurm_sync`]).

use std::collections::BTreeMap;

use serde::Deserialize;
use telemetry::{Job, JobState, Timestamp};

/// How Slurm jobs become powerplane jobs.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct JobMapping {
    /// A job's class by its partition (checked after `class=` in the comment).
    #[serde(default)]
    pub class_by_partition: BTreeMap<String, String>,
    /// A job's class by its QOS (checked after the partition).
    #[serde(default)]
    pub class_by_qos: BTreeMap<String, String>,
    /// The class of a job nothing else names.
    #[serde(default = "default_class")]
    pub default_class: String,
    /// Classes whose jobs may be deferred (a comment `deferrable=no|yes` overrides).
    #[serde(default = "default_deferrable")]
    pub deferrable_classes: Vec<String>,
    /// Classes whose jobs may be requeued (a comment `preemptible=no|yes` overrides);
    /// Slurm must also allow the job to requeue.
    #[serde(default)]
    pub preemptible_classes: Vec<String>,
    /// The run time of a job with neither `est=` in its comment nor a time limit.
    #[serde(default = "default_duration")]
    pub default_duration_s: f64,
}

fn default_class() -> String {
    "batch".into()
}
fn default_deferrable() -> Vec<String> {
    vec!["batch".into(), "training".into()]
}
fn default_duration() -> f64 {
    3600.0
}

impl Default for JobMapping {
    fn default() -> Self {
        JobMapping {
            class_by_partition: BTreeMap::new(),
            class_by_qos: BTreeMap::new(),
            default_class: default_class(),
            deferrable_classes: default_deferrable(),
            preemptible_classes: Vec::new(),
            default_duration_s: default_duration(),
        }
    }
}

/// A Slurm job as slurmrestd reports it: the fields powerplane reads.
#[derive(Debug, Clone, PartialEq)]
pub struct SlurmJob {
    pub job_id: u64,
    pub name: String,
    pub user: String,
    pub account: String,
    pub partition: String,
    pub qos: String,
    pub comment: String,
    /// `PENDING`, `RUNNING`, `SUSPENDED`, `COMPLETED`, `CANCELLED`, ...
    pub state: String,
    /// Why a pending job waits: `JobHeldAdmin`, `JobHeldUser`, `Resources`, ...
    pub reason: String,
    pub priority: i64,
    pub gpus: u32,
    pub submit: Option<Timestamp>,
    pub start: Option<Timestamp>,
    pub end: Option<Timestamp>,
    /// `--deadline`.
    pub deadline: Option<Timestamp>,
    /// `--time`, in seconds.
    pub time_limit_s: Option<f64>,
    /// Slurm may requeue it (`--requeue`, `JobRequeue`).
    pub requeue: bool,
    /// Times Slurm restarted (requeued) it.
    pub restarts: u64,
}

impl SlurmJob {
    /// powerplane's id for it.
    pub fn id(&self) -> String {
        crate::scheduler::JobId::slurm(self.job_id).to_string()
    }

    /// Pending with a hold (user's or admin's: priority 0).
    pub fn is_held(&self) -> bool {
        self.state == "PENDING"
            && (self.reason == "JobHeldAdmin" || self.reason == "JobHeldUser" || self.priority == 0)
    }

    pub fn is_pending(&self) -> bool {
        self.state == "PENDING"
    }
}

/// GPUs in a TRES string such as `gres:gpu:2`, `gres:gpu:a100:2` or
/// `gres/gpu=2,cpu=4` (several entries add up).
pub fn gres_gpus(tres: &str) -> Option<u32> {
    let mut total = None;
    for part in tres.split(',') {
        let part = part.trim();
        let count = if let Some(rest) = part.strip_prefix("gres:gpu") {
            // `gres:gpu` (1), `gres:gpu:2`, `gres:gpu:type:2`
            match rest.rsplit(':').next() {
                Some(c) if !rest.is_empty() => c.parse::<u32>().ok().or(Some(1)),
                _ => Some(1),
            }
        } else if let Some(rest) = part.strip_prefix("gres/gpu") {
            rest.rsplit('=').next().and_then(|c| c.parse::<u32>().ok())
        } else {
            None
        };
        if let Some(c) = count {
            total = Some(total.unwrap_or(0) + c);
        }
    }
    total
}

/// `key=value` tokens of a job comment, e.g. `class=batch deadline=2026-01-01T10:00:00Z est=3600`.
pub fn comment_tags(comment: &str) -> BTreeMap<String, String> {
    comment
        .split(|c: char| c.is_whitespace() || c == ',' || c == ';')
        .filter_map(|t| t.split_once('='))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect()
}

fn yes_no(v: Option<&String>) -> Option<bool> {
    match v.map(|s| s.to_ascii_lowercase()) {
        Some(s) if matches!(s.as_str(), "yes" | "true" | "1") => Some(true),
        Some(s) if matches!(s.as_str(), "no" | "false" | "0") => Some(false),
        _ => None,
    }
}

impl JobMapping {
    /// The powerplane job for a Slurm job. `ours`: powerplane holds it (a held job
    /// that is not ours is held by someone else, and is never deferrable: powerplane
    /// must not release it).
    pub fn map(&self, j: &SlurmJob, ours: bool, now: Timestamp) -> Job {
        let tags = comment_tags(&j.comment);
        let class = tags
            .get("class")
            .cloned()
            .or_else(|| self.class_by_partition.get(&j.partition).cloned())
            .or_else(|| self.class_by_qos.get(&j.qos).cloned())
            .unwrap_or_else(|| self.default_class.clone());
        let deadline = tags
            .get("deadline")
            .and_then(|d| Timestamp::parse_rfc3339(d).ok())
            .or(j.deadline);
        let est_duration_s = tags
            .get("est")
            .and_then(|e| e.parse::<f64>().ok())
            .filter(|e| e.is_finite() && *e > 0.0)
            .or(j.time_limit_s)
            .unwrap_or(self.default_duration_s);
        let held_by_others = j.is_held() && !ours;
        let deferrable = !held_by_others
            && yes_no(tags.get("deferrable"))
                .unwrap_or_else(|| self.deferrable_classes.contains(&class));
        let preemptible = j.requeue
            && yes_no(tags.get("preemptible"))
                .unwrap_or_else(|| self.preemptible_classes.contains(&class));
        let state = match j.state.as_str() {
            "PENDING" if ours => JobState::Held,
            "PENDING" | "REQUEUED" | "REQUEUE_FED" | "REQUEUE_HOLD" => JobState::Pending,
            "SUSPENDED" => JobState::Suspended,
            "RUNNING" | "COMPLETING" | "CONFIGURING" | "STAGE_OUT" | "RESIZING" | "SIGNALING"
            | "STOPPED" => JobState::Running,
            "COMPLETED" => JobState::Finished,
            _ => JobState::Cancelled,
        };
        Job {
            id: j.id(),
            scheduler: "slurm".into(),
            name: j.name.clone(),
            user: j.user.clone(),
            project: if j.account.is_empty() {
                j.user.clone()
            } else {
                j.account.clone()
            },
            class,
            priority: j.priority.clamp(i64::from(i32::MIN), i64::from(i32::MAX)) as i32,
            gpus: j.gpus,
            allocated: Vec::new(),
            state,
            submit_time: j.submit.unwrap_or(now),
            start_time: j.start.filter(|_| state != JobState::Pending),
            end_time: j.end.filter(|_| state.is_done()),
            deadline,
            est_duration_s,
            deferrable,
            preemptible,
            gpu_power_limit: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One job of a v0.0.38 answer, through the versioned layer.
    fn v0038(v: &serde_json::Value) -> Result<SlurmJob, crate::slurm_api::ShapeError> {
        crate::slurm_api::JobView::from_json(v).map(|j| j.to_slurm_job())
    }

    #[test]
    fn gpus_are_read_from_every_tres_form() {
        assert_eq!(gres_gpus("gres:gpu:2"), Some(2));
        assert_eq!(gres_gpus("gres:gpu:a100:3"), Some(3));
        assert_eq!(gres_gpus("gres:gpu"), Some(1));
        assert_eq!(gres_gpus("gres/gpu=4,cpu=2"), Some(4));
        assert_eq!(gres_gpus("cpu=2"), None);
        assert_eq!(gres_gpus(""), None);
    }

    #[test]
    fn the_comment_the_partition_and_the_time_limit_map_a_job() {
        let v = serde_json::json!({
            "job_id": 7, "name": "train", "user_name": "ana", "account": "physics",
            "partition": "long", "qos": "normal", "job_state": "PENDING",
            "state_reason": "Resources", "priority": 4000, "tres_per_node": "gres:gpu:2",
            "node_count": 2, "submit_time": 1_700_000_000, "start_time": 0, "deadline": 0,
            "time_limit": 90, "requeue": true, "restart_cnt": 0,
            "comment": "deadline=2023-11-15T00:00:00Z est=1800"
        });
        let j = v0038(&v).expect("job");
        let mut m = JobMapping::default();
        m.class_by_partition
            .insert("long".into(), "training".into());
        m.preemptible_classes.push("training".into());
        let job = m.map(&j, false, Timestamp::from_secs(1_700_000_100));
        assert_eq!(job.id, "slurm:7");
        assert_eq!(job.class, "training");
        assert_eq!(job.project, "physics");
        assert_eq!(job.gpus, 4);
        assert_eq!(job.est_duration_s, 1800.0);
        assert_eq!(
            job.deadline,
            Some(Timestamp::parse_rfc3339("2023-11-15T00:00:00Z").expect("t"))
        );
        assert!(job.deferrable && job.preemptible);
        assert_eq!(job.state, JobState::Pending);
        // without est=, the time limit (minutes) is the estimate
        let mut v2 = v.clone();
        v2["comment"] = "class=inference".into();
        let job = m.map(&v0038(&v2).expect("job"), false, Timestamp::from_secs(0));
        assert_eq!(
            (job.class.as_str(), job.est_duration_s),
            ("inference", 5400.0)
        );
        assert!(!job.deferrable);
        // held by an admin: never deferrable; held by powerplane: Held
        let mut v3 = v.clone();
        v3["state_reason"] = "JobHeldAdmin".into();
        v3["priority"] = 0.into();
        let held = v0038(&v3).expect("job");
        assert!(!m.map(&held, false, Timestamp::from_secs(0)).deferrable);
        let ours = m.map(&held, true, Timestamp::from_secs(0));
        assert!(ours.deferrable);
        assert_eq!(ours.state, JobState::Held);
    }
}
