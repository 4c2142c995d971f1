//! Typed ids of schedulers and their jobs: which adapter a job belongs to is read from
//! its id once, here, instead of string prefixes at every use.
//!
//! The set of adapters is open: each declares its [`Adapter`] (its id, the scheduler
//! name its jobs carry and the prefix of their ids) beside its `impl Scheduler`, and
//! [`REGISTERED`] lists them, one line each. A job whose prefix no adapter claims belongs
//! to the outbound webhook ([`WEBHOOK`]), which steers any other scheduler.

use serde::Serialize;

pub use super::kubernetes::ADAPTER as KUBERNETES;
pub use super::slurm::ADAPTER as SLURM;

/// An adapter powerplane steers jobs through, by the name it goes by in logs,
/// `/metrics` and the API (`slurm`, `kubernetes`, `webhook`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(transparent)]
pub struct SchedulerId(&'static str);

/// What ties jobs to an adapter: its id, the scheduler name its jobs carry
/// (`Job::scheduler`) and the prefix of their ids (`slurm` in `slurm:42`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Adapter {
    pub id: SchedulerId,
    pub scheduler: &'static str,
    pub prefix: &'static str,
}

/// Any other scheduler, over signed webhooks (`<scheduler>:<job>`, e.g. `lsf:42`): the
/// adapter of every job no entry of [`REGISTERED`] claims.
pub const WEBHOOK: SchedulerId = SchedulerId("webhook");

/// The adapters that claim jobs by name and prefix, one registration line each.
pub const REGISTERED: &[Adapter] = &[SLURM, KUBERNETES];

impl SchedulerId {
    /// An adapter's id by its name; for a new adapter's [`Adapter`] constant.
    pub const fn new(name: &'static str) -> SchedulerId {
        SchedulerId(name)
    }

    /// Every adapter, each once: those in [`REGISTERED`], then the webhook.
    pub fn all() -> impl Iterator<Item = SchedulerId> {
        REGISTERED.iter().map(|a| a.id).chain([WEBHOOK])
    }

    /// The adapter of a job by the scheduler name it carries (`Job::scheduler`).
    pub fn of_scheduler(name: &str) -> SchedulerId {
        REGISTERED
            .iter()
            .find(|a| a.scheduler == name)
            .map_or(WEBHOOK, |a| a.id)
    }

    /// The adapter of a job.
    pub fn of(job: &telemetry::Job) -> SchedulerId {
        SchedulerId::of_scheduler(&job.scheduler)
    }

    /// The adapter of a job id's prefix.
    fn of_prefix(prefix: &str) -> SchedulerId {
        REGISTERED
            .iter()
            .find(|a| a.prefix == prefix)
            .map_or(WEBHOOK, |a| a.id)
    }

    pub fn name(self) -> &'static str {
        self.0
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

impl JobId {
    /// Reads `prefix:local`; `None` for an id without a prefix or with an empty part.
    pub fn parse(id: &str) -> Option<JobId> {
        let (prefix, local) = id.split_once(':')?;
        if prefix.is_empty() || local.is_empty() {
            return None;
        }
        Some(JobId {
            scheduler: SchedulerId::of_prefix(prefix),
            prefix: prefix.to_string(),
            local: local.to_string(),
        })
    }

    /// A job of `adapter` by the scheduler's own id of it.
    pub fn of(adapter: Adapter, local: impl Into<String>) -> JobId {
        JobId {
            scheduler: adapter.id,
            prefix: adapter.prefix.into(),
            local: local.into(),
        }
    }

    /// A Slurm job by its number.
    pub fn slurm(number: u64) -> JobId {
        JobId::of(SLURM, number.to_string())
    }

    /// A Kubernetes pod.
    pub fn pod(namespace: &str, name: &str) -> JobId {
        JobId::of(KUBERNETES, format!("{namespace}/{name}"))
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
        if self.scheduler == SLURM.id {
            self.local.parse().ok()
        } else {
            None
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
        assert_eq!((s.scheduler(), s.slurm_number()), (SLURM.id, Some(42)));
        assert_eq!(s, JobId::slurm(42));
        assert_eq!(s.to_string(), "slurm:42");
        let k = JobId::parse("k8s:ns/pod-1").expect("pod");
        assert_eq!(k.scheduler(), KUBERNETES.id);
        assert_eq!(k, JobId::pod("ns", "pod-1"));
        assert_eq!(k.slurm_number(), None);
        let w = JobId::parse("lsf:a:b").expect("webhook");
        assert_eq!(
            (w.scheduler(), w.prefix(), w.local()),
            (WEBHOOK, "lsf", "a:b")
        );
        assert_eq!(w.to_string(), "lsf:a:b");
        for bad in ["", "nocolon", ":1", "slurm:"] {
            assert_eq!(JobId::parse(bad), None, "{bad:?}");
        }
        assert_eq!(JobId::parse("slurm:x").and_then(|j| j.slurm_number()), None);
        assert_eq!(SchedulerId::of_scheduler("lsf"), WEBHOOK);
        assert_eq!(SchedulerId::of_scheduler("kubernetes"), KUBERNETES.id);
        assert_eq!(
            SchedulerId::all()
                .map(SchedulerId::name)
                .collect::<Vec<_>>(),
            ["slurm", "kubernetes", "webhook"]
        );
        assert_eq!(
            serde_json::to_string(&KUBERNETES.id).expect("json"),
            "\"kubernetes\""
        );
    }
}
