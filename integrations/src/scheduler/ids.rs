//! Typed ids of schedulers and their jobs: which adapter a job belongs to is read from
//! its id once, here, instead of string prefixes at every use.

use serde::Serialize;

/// The adapters powerplane steers jobs through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SchedulerId {
    /// slurmrestd (`slurm:<job number>`).
    Slurm,
    /// Kubernetes scheduling gates (`k8s:<namespace>/<name>`).
    Kubernetes,
    /// Any other scheduler, over signed webhooks (`<scheduler>:<job>`, e.g. `lsf:42`).
    Webhook,
}

impl SchedulerId {
    /// Every adapter, each once.
    pub const ALL: [SchedulerId; 3] = [
        SchedulerId::Slurm,
        SchedulerId::Kubernetes,
        SchedulerId::Webhook,
    ];

    /// The adapter of a job by the scheduler name it carries (`Job::scheduler`).
    pub fn of_scheduler(name: &str) -> SchedulerId {
        match name {
            "slurm" => SchedulerId::Slurm,
            "kubernetes" => SchedulerId::Kubernetes,
            _ => SchedulerId::Webhook,
        }
    }

    /// The adapter of a job.
    pub fn of(job: &telemetry::Job) -> SchedulerId {
        SchedulerId::of_scheduler(&job.scheduler)
    }

    pub fn name(self) -> &'static str {
        match self {
            SchedulerId::Slurm => "slurm",
            SchedulerId::Kubernetes => "kubernetes",
            SchedulerId::Webhook => "webhook",
        }
    }
}

impl std::fmt::Display for SchedulerId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A job's id: its adapter, the prefix as written (`slurm`, `k8s`, or a webhook
/// scheduler's name) and the scheduler's own id of the job.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct JobId {
    scheduler: SchedulerId,
    prefix: String,
    local: String,
}

const SLURM: &str = "slurm";
const KUBERNETES: &str = "k8s";

impl JobId {
    /// Reads `prefix:local`; `None` for an id without a prefix or with an empty part.
    pub fn parse(id: &str) -> Option<JobId> {
        let (prefix, local) = id.split_once(':')?;
        if prefix.is_empty() || local.is_empty() {
            return None;
        }
        let scheduler = match prefix {
            SLURM => SchedulerId::Slurm,
            KUBERNETES => SchedulerId::Kubernetes,
            _ => SchedulerId::Webhook,
        };
        Some(JobId {
            scheduler,
            prefix: prefix.to_string(),
            local: local.to_string(),
        })
    }

    /// A Slurm job by its number.
    pub fn slurm(number: u64) -> JobId {
        JobId {
            scheduler: SchedulerId::Slurm,
            prefix: SLURM.into(),
            local: number.to_string(),
        }
    }

    /// A Kubernetes pod.
    pub fn pod(namespace: &str, name: &str) -> JobId {
        JobId {
            scheduler: SchedulerId::Kubernetes,
            prefix: KUBERNETES.into(),
            local: format!("{namespace}/{name}"),
        }
    }

    pub fn scheduler(&self) -> SchedulerId {
        self.scheduler
    }

    /// The scheduler's own id of the job (`42` in `slurm:42`).
    pub fn local(&self) -> &str {
        &self.local
    }

    /// The prefix as written (`lsf` in `lsf:42`).
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The Slurm job number, for a Slurm job.
    pub fn slurm_number(&self) -> Option<u64> {
        match self.scheduler {
            SchedulerId::Slurm => self.local.parse().ok(),
            _ => None,
        }
    }
}

impl std::fmt::Display for JobId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.prefix, self.local)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_know_their_scheduler_and_print_as_they_were_read() {
        let s = JobId::parse("slurm:42").expect("slurm");
        assert_eq!(
            (s.scheduler(), s.slurm_number()),
            (SchedulerId::Slurm, Some(42))
        );
        assert_eq!(s, JobId::slurm(42));
        assert_eq!(s.to_string(), "slurm:42");
        let k = JobId::parse("k8s:ns/pod-1").expect("pod");
        assert_eq!(k.scheduler(), SchedulerId::Kubernetes);
        assert_eq!(k, JobId::pod("ns", "pod-1"));
        assert_eq!(k.slurm_number(), None);
        let w = JobId::parse("lsf:a:b").expect("webhook");
        assert_eq!(
            (w.scheduler(), w.prefix(), w.local()),
            (SchedulerId::Webhook, "lsf", "a:b")
        );
        assert_eq!(w.to_string(), "lsf:a:b");
        for bad in ["", "nocolon", ":1", "slurm:"] {
            assert_eq!(JobId::parse(bad), None, "{bad:?}");
        }
        assert_eq!(JobId::parse("slurm:x").and_then(|j| j.slurm_number()), None);
        assert_eq!(SchedulerId::of_scheduler("lsf"), SchedulerId::Webhook);
        assert_eq!(
            SchedulerId::of_scheduler("kubernetes"),
            SchedulerId::Kubernetes
        );
    }
}
