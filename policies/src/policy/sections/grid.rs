//! The policy file's `[grid]` section: how the facility meets a grid (demand-response)
//! event's target at the meter, its type and its checks.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{Section, SectionCheck};
use crate::policy::Policy;

/// The `[grid]` table of a policy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GridRule {
    /// On by default: it acts only while an edge publishes a grid event.
    pub enabled: bool,
    /// Job classes never held, capped or suspended for an event (inference serving,
    /// say). A job whose latest start is within `[budget] protect_slack_s` is protected
    /// too.
    pub protect: Vec<String>,
    /// Classes shed first, in this order; classes not listed after them, by priority.
    pub shed_order: Vec<String>,
    /// A flexible GPU is not capped below this fraction of its default limit (nor below
    /// its own minimum limit).
    pub floor_fraction: f64,
    /// The floor per class, where it differs.
    pub floor_by_class: BTreeMap<String, f64>,
    /// Hold queued deferrable jobs while the event (and its rebound limit) is in force,
    /// never past their latest start.
    pub hold: bool,
    /// Suspend preemptible running jobs when caps at their floors do not meet the
    /// target.
    pub suspend: bool,
    /// Aim this fraction under the target (meters and readings are not exact).
    pub margin: f64,
    /// Meter power over IT power, used where neither the meter (`facility_power_w`) nor
    /// every cooling unit's power is read.
    pub overhead_ratio: f64,
    /// After an event, the facility is kept under its pre-event baseline this long, s
    /// (held work comes back paced by the room under it; caps rise at
    /// `[budget] raise_w_per_min`).
    pub rebound_s: f64,
    /// The lease of the event's caps, holds and suspensions, s.
    pub lease_s: f64,
}

impl Default for GridRule {
    fn default() -> Self {
        GridRule {
            enabled: true,
            protect: Vec::new(),
            shed_order: Vec::new(),
            floor_fraction: 0.5,
            floor_by_class: BTreeMap::new(),
            hold: true,
            suspend: true,
            margin: 0.02,
            overhead_ratio: 1.3,
            rebound_s: 1800.0,
            lease_s: 300.0,
        }
    }
}

impl GridRule {
    pub fn is_default(&self) -> bool {
        *self == GridRule::default()
    }

    /// The floor of a job class, as a fraction of a GPU's default limit.
    pub fn floor_of(&self, class: &str) -> f64 {
        self.floor_by_class
            .get(class)
            .copied()
            .unwrap_or(self.floor_fraction)
    }
}

/// The `[grid]` section in the list of [`super::SECTIONS`].
pub(crate) const SECTION: Section = Section { key: "grid", check };

/// Its impossible values, each at its key.
fn check(policy: &mut Policy, s: &mut SectionCheck<'_, '_>) {
    let g = &policy.grid;
    let fraction = |f: f64| (0.0..=1.0).contains(&f);
    s.check(
        fraction(g.floor_fraction),
        "floor_fraction",
        format!(
            "grid: floor_fraction must be within 0..=1 (got {})",
            g.floor_fraction
        ),
    );
    for (class, f) in &g.floor_by_class {
        s.check(
            fraction(*f),
            "floor_by_class",
            format!("grid: floor_by_class.{class} must be within 0..=1 (got {f})"),
        );
    }
    s.check(
        (0.0..0.5).contains(&g.margin),
        "margin",
        format!("grid: margin must be within 0..0.5 (got {})", g.margin),
    );
    s.check(
        (1.0..=5.0).contains(&g.overhead_ratio),
        "overhead_ratio",
        format!(
            "grid: overhead_ratio (meter over IT power) must be within 1..=5 (got {})",
            g.overhead_ratio
        ),
    );
    s.check(
        g.rebound_s >= 0.0 && g.lease_s >= 10.0,
        "rebound_s",
        format!(
            "grid: rebound_s must not be negative and lease_s at least 10 (got {}, {})",
            g.rebound_s, g.lease_s
        ),
    );
    for class in &g.protect {
        s.check(
            !g.shed_order.contains(class),
            "protect",
            format!("grid: class `{class}` is both protected and in shed_order"),
        );
    }
}
