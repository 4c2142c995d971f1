//! The policy file's `[limits]` section: GPU power limits per job class, combined with
//! what each job asks for itself (a Kubernetes pod's `powerplane.io/gpu-power-limit`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use telemetry::PowerLimit;

use super::{Section, SectionCheck};
use crate::policy::Policy;

/// The `[limits]` table of a policy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsRule {
    /// On by default: it caps only the GPUs of running jobs that ask for a limit or
    /// whose class has one.
    pub enabled: bool,
    /// The limit of each class's GPUs (`"300W"`, or `"80%"` of the GPU's default
    /// limit); a job's own limit and every other cap combine with it, the lowest
    /// winning.
    pub classes: BTreeMap<String, PowerLimit>,
    /// Honour the limits jobs ask for themselves (`false`: class limits only).
    pub jobs: bool,
    /// The lease of these caps, s (renewed every tick while the job runs).
    pub lease_s: f64,
}

impl Default for LimitsRule {
    fn default() -> Self {
        LimitsRule {
            enabled: true,
            classes: BTreeMap::new(),
            jobs: true,
            lease_s: 300.0,
        }
    }
}

impl LimitsRule {
    pub fn is_default(&self) -> bool {
        *self == LimitsRule::default()
    }

    /// The limit in force for a job of `class` asking `asked`, on a GPU whose default
    /// limit is `default_w`: the lower of the two, in watts.
    pub fn limit_w(&self, class: &str, asked: Option<PowerLimit>, default_w: f64) -> Option<f64> {
        let own = asked.filter(|_| self.jobs).map(|l| l.watts(default_w));
        let by_class = self.classes.get(class).map(|l| l.watts(default_w));
        match (own, by_class) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

/// The `[limits]` section in the list of [`super::SECTIONS`].
pub(crate) const SECTION: Section = Section {
    key: "limits",
    check,
};

/// Its impossible values, each at its key (the limits themselves are checked as they
/// are read).
fn check(policy: &mut Policy, s: &mut SectionCheck<'_, '_>) {
    let l = &policy.limits;
    s.check(
        l.lease_s.is_finite() && l.lease_s >= 10.0,
        "lease_s",
        format!("limits: lease_s must be at least 10 (got {})", l.lease_s),
    );
}
