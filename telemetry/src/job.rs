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
    /// The power each of its GPUs may draw at most, as the job asks (a Kubernetes
    /// pod's `powerplane.io/gpu-power-limit`); the engine's caps and the policy's
    /// class limit combine with it, the most protective winning.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_power_limit: Option<PowerLimit>,
}

/// A GPU power limit: watts, or a share of the GPU's default power limit.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum PowerLimit {
    Watts(f64),
    /// Percent of the GPU's default limit, in (0, 100].
    Percent(f64),
}

/// Why a text is not a GPU power limit.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PowerLimitError {
    #[error("{text:?}: a GPU power limit is watts (\"300W\") or a percentage (\"80%\")")]
    NotALimit {
        text: String,
        #[source]
        source: std::num::ParseFloatError,
    },
    #[error("{0:?}: a percentage within (0, 100]")]
    Percent(String),
    #[error("{0:?}: watts within (0, 10000]")]
    Watts(String),
}

impl PowerLimit {
    /// `"300W"`, `"300 W"`, `"300"` (watts) or `"80%"`.
    pub fn parse(s: &str) -> Result<PowerLimit, PowerLimitError> {
        let t = s.trim();
        let number = |n: &str| {
            n.trim()
                .parse::<f64>()
                .map_err(|source| PowerLimitError::NotALimit {
                    text: s.to_string(),
                    source,
                })
        };
        if let Some(p) = t.strip_suffix('%') {
            let v = number(p)?;
            if !(v.is_finite() && v > 0.0 && v <= 100.0) {
                return Err(PowerLimitError::Percent(s.to_string()));
            }
            return Ok(PowerLimit::Percent(v));
        }
        let v = number(t.strip_suffix(['W', 'w']).unwrap_or(t))?;
        if !(v.is_finite() && v > 0.0 && v <= 10_000.0) {
            return Err(PowerLimitError::Watts(s.to_string()));
        }
        Ok(PowerLimit::Watts(v))
    }

    /// The limit in watts on a GPU whose default limit is `default_w`.
    pub fn watts(self, default_w: f64) -> f64 {
        match self {
            PowerLimit::Watts(w) => w,
            PowerLimit::Percent(p) => default_w * p / 100.0,
        }
    }
}

impl std::fmt::Display for PowerLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PowerLimit::Watts(w) => write!(f, "{w}W"),
            PowerLimit::Percent(p) => write!(f, "{p}%"),
        }
    }
}

impl Serialize for PowerLimit {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for PowerLimit {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        PowerLimit::parse(&s).map_err(serde::de::Error::custom)
    }
}

impl Job {
    /// The latest start that still meets the deadline at full power, if there is a deadline.
    pub fn latest_start(&self) -> Option<Timestamp> {
        self.latest_start_at(|| 1.0)
    }

    /// The latest start that still meets the deadline at full power on GPUs that run at
    /// `speed()` times the pace its estimate is given at (asked only of a job with a
    /// deadline).
    pub fn latest_start_at(&self, speed: impl FnOnce() -> f64) -> Option<Timestamp> {
        self.deadline.map(|d| d + -(self.est_duration_s / speed()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn power_limits_parse_and_refusals_say_what_a_limit_is() {
        assert_eq!(PowerLimit::parse(" 300 W"), Ok(PowerLimit::Watts(300.0)));
        assert_eq!(PowerLimit::parse("80 %"), Ok(PowerLimit::Percent(80.0)));
        let refused = |s: &str| PowerLimit::parse(s).map_err(|e| e.to_string());
        assert_eq!(
            refused("lots"),
            Err(r#""lots": a GPU power limit is watts ("300W") or a percentage ("80%")"#.into())
        );
        assert_eq!(
            refused("120%"),
            Err(r#""120%": a percentage within (0, 100]"#.into())
        );
        assert_eq!(
            refused("0W"),
            Err(r#""0W": watts within (0, 10000]"#.into())
        );
    }
}
