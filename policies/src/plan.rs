//! What the engine decides: the desired state (caps and holds, each with a lease) and
//! the decisions that changed it.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};
use telemetry::{EntityId, Timestamp};

/// A power cap on one GPU.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Cap {
    pub watts: f64,
    /// The rule whose cap is in force (the most protective one).
    pub rule: String,
    /// When this cap level was set.
    pub since: Timestamp,
    /// The cap ends here unless renewed: an agent that hears nothing reverts.
    pub lease_until: Timestamp,
}

/// A job held (deferred) by powerplane.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Hold {
    pub rule: String,
    pub since: Timestamp,
    /// The hold ends here unless renewed; never after the job's latest start.
    pub lease_until: Timestamp,
    pub reason: String,
}

/// The thermal rule's memory for one rack.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ThermalLevel {
    /// The rack's GPU cap as a fraction of each GPU's default limit (1.0: uncapped).
    pub fraction: f64,
    pub since: Timestamp,
}

/// What the predictive thermal rule expects of one rack's inlet, under the caps in force
/// after the tick and the planned load (running jobs, the queued jobs and the holds
/// that end within the horizon).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RackPrediction {
    /// The inlet reading the prediction starts from.
    pub inlet_c: f64,
    /// The inlet expected `horizon_s` from now.
    pub predicted_c: f64,
    /// The highest inlet expected within the horizon, and in how many seconds.
    pub peak_c: f64,
    pub peak_in_s: f64,
    pub horizon_s: f64,
    pub limit_c: f64,
    pub margin_c: f64,
}

impl RackPrediction {
    /// Predicted headroom: limit − margin − predicted peak (negative: the rule will cap).
    pub fn headroom_c(&self) -> f64 {
        self.limit_c - self.margin_c - self.peak_c
    }
}

/// A rule's memory for one of its targets (an entity or a job).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RuleMemory {
    pub active: bool,
    /// When it last switched on or off.
    pub since: Timestamp,
    /// Since when each comparison of `when` has been true (by comparison index).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub when_true: BTreeMap<usize, Timestamp>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub release_true: BTreeMap<usize, Timestamp>,
    /// The rule's cap level (W or %) while it ramps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub level: Option<f64>,
    pub level_at: Timestamp,
    /// A one-shot action (requeue) was taken in this activation.
    #[serde(default)]
    pub done: bool,
}

/// A locked SM clock on one GPU.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClockLock {
    pub mhz: f64,
    pub rule: String,
    pub since: Timestamp,
    pub lease_until: Timestamp,
}

/// Everything in force. The engine takes the prior one and returns the next.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct State {
    /// Caps per GPU; a GPU not listed runs at its default limit.
    pub caps: BTreeMap<EntityId, Cap>,
    /// Holds per job id.
    pub holds: BTreeMap<String, Hold>,
    /// Thermal cap level per rack id.
    pub thermal: BTreeMap<String, ThermalLevel>,
    /// What rules in observe mode would have in force (never actuated).
    #[serde(default)]
    pub observed_caps: BTreeMap<EntityId, Cap>,
    #[serde(default)]
    pub observed_holds: BTreeMap<String, Hold>,
    /// Locked SM clocks per GPU.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub clocks: BTreeMap<EntityId, ClockLock>,
    /// Preemptible jobs suspended by a rule, with the lease of the suspension.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub suspended: BTreeMap<String, Hold>,
    /// Each rule's memory per target: `rule name` → `target` → memory.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub rules: BTreeMap<String, BTreeMap<String, RuleMemory>>,
    /// The predictive thermal rule's fitted model per rack id.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub thermal_models: BTreeMap<String, crate::thermal_model::RackFit>,
}

/// What a decision is about. In JSON its fields sit in the decision itself:
/// `"entity": "rack/a01", "gpus": [...]` or `"job": "slurm:12"`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Target {
    /// A set of GPUs, named by the entity that holds them (a rack) and listed.
    Gpus {
        entity: EntityId,
        gpus: Vec<EntityId>,
    },
    Job {
        job: String,
    },
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Gpus { entity, gpus } => write!(f, "{} GPUs of {entity}", gpus.len()),
            Target::Job { job } => write!(f, "job {job}"),
        }
    }
}

/// What to do.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Action {
    Cap {
        watts: f64,
    },
    Uncap,
    Hold {
        until: Timestamp,
    },
    Release,
    LockClocks {
        mhz: f64,
    },
    UnlockClocks,
    /// Requeue a running preemptible job (it goes back to pending).
    Requeue,
    Suspend {
        until: Timestamp,
    },
    Resume,
    /// A new policy is in force (`serve` reloaded the file): audit only.
    PolicyLoaded {
        sha256: String,
    },
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Action::Cap { watts } => write!(f, "cap at {watts:.0} W"),
            Action::Uncap => f.write_str("uncap"),
            Action::Hold { until } => write!(f, "hold until {until}"),
            Action::Release => f.write_str("release"),
            Action::LockClocks { mhz } => write!(f, "lock clocks at {mhz:.0} MHz"),
            Action::UnlockClocks => f.write_str("unlock clocks"),
            Action::Requeue => f.write_str("requeue"),
            Action::Suspend { until } => write!(f, "suspend until {until}"),
            Action::Resume => f.write_str("resume"),
            Action::PolicyLoaded { sha256 } => {
                write!(f, "policy {} in force", sha256.get(..12).unwrap_or(sha256))
            }
        }
    }
}

/// One change, with why.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Decision {
    pub time: Timestamp,
    pub rule: String,
    #[serde(flatten)]
    pub target: Target,
    pub action: Action,
    /// The values that triggered it (measurements and thresholds).
    pub values: BTreeMap<String, f64>,
    pub reason: String,
    /// What would undo it (the release condition), for `policy explain` and the audit.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub release: String,
    /// Logged and reported only: the rule is in observe mode.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub observe_only: bool,
}

/// The engine's answer for one tick.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    /// The desired state after this tick.
    pub state: State,
    /// What changed, in a deterministic order.
    pub decisions: Vec<Decision>,
    /// The planned start of each job the price plan holds (for node power: nodes are
    /// brought back before the work planned on them starts).
    pub planned_starts: BTreeMap<String, Timestamp>,
    /// Each rack's predicted inlet (the predictive thermal rule only), by rack id.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub predictions: BTreeMap<String, RackPrediction>,
}

/// Rounded to three decimals, as values are written in decisions.
pub(crate) fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}
