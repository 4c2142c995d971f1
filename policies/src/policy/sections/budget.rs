//! The policy file's `[budget]` section: the facility and rack power budgets' settings, read and checked.

use serde::{Deserialize, Serialize};

use super::{Section, SectionCheck};
use crate::policy::Policy;
use crate::rules::OnStale;

/// Facility and rack power budgets.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BudgetRule {
    pub enabled: bool,
    /// Aim this fraction below the budget, to absorb a rise between ticks.
    pub margin: f64,
    /// Caps are lifted only when demand falls below budget × this.
    pub release_ratio: f64,
    /// How fast a cap may rise, in W per minute per GPU (caps fall at once).
    pub raise_w_per_min: f64,
    /// Changes smaller than this are not made (avoids churn).
    pub deadband_w: f64,
    /// What a missing or stale power reading counts as.
    pub on_stale: OnStale,
    pub lease_s: f64,
    pub observe: bool,
    /// Job classes cut first, in order (after idle GPUs); unlisted classes last, each
    /// by job priority.
    pub cut_order: Vec<String>,
    /// A running job whose slack (latest start − now, as `job.slack_s`: deadline −
    /// estimated duration − now) is at most this many seconds is cut last, after every
    /// other job whatever its class and priority, and a budget cap it carries is not
    /// held between the two thresholds: slowed down, it would miss its deadline.
    pub protect_slack_s: f64,
    /// Budgets the site file does not give (rows, rooms) or that the policy lowers
    /// (a contract limit for the site, a feed, a PDU, a rack).
    pub limits: Vec<Limit>,
}

/// A power budget set by the policy: `{ scope = "row", name = "row-a", limit_kw = 120 }`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limit {
    /// site, feed, pdu, branch (`pdu.branch`), row, room or rack.
    pub scope: String,
    /// The entity's name (ignored for the site).
    #[serde(default)]
    pub name: String,
    pub limit_kw: f64,
    /// Usable share of the limit (continuous-load derating).
    #[serde(default = "one")]
    pub derate: f64,
}

fn one() -> f64 {
    1.0
}

impl Default for BudgetRule {
    fn default() -> Self {
        BudgetRule {
            enabled: true,
            margin: 0.03,
            release_ratio: 0.90,
            raise_w_per_min: 60.0,
            deadband_w: 5.0,
            on_stale: OnStale::AssumeWorst,
            lease_s: 300.0,
            observe: false,
            cut_order: Vec::new(),
            protect_slack_s: 3600.0,
            limits: Vec::new(),
        }
    }
}

/// The `[budget]` section in the list of [`super::SECTIONS`].
pub(crate) const SECTION: Section = Section {
    key: "budget",
    check,
};

/// Its impossible values, each at its key.
fn check(policy: &mut Policy, s: &mut SectionCheck<'_, '_>) {
    let b = &policy.budget;
    s.check(
        (0.0..0.5).contains(&b.margin),
        "margin",
        format!("budget: margin must be within 0..0.5, got {}", b.margin),
    );
    s.check(
        b.release_ratio > 0.5 && b.release_ratio <= 1.0,
        "release_ratio",
        format!(
            "budget: release_ratio must be within 0.5..=1, got {}",
            b.release_ratio
        ),
    );
    s.check(
        b.raise_w_per_min > 0.0,
        "raise_w_per_min",
        format!(
            "budget: raise_w_per_min must be positive, got {}",
            b.raise_w_per_min
        ),
    );
    s.check(
        (0.0..=100.0).contains(&b.deadband_w),
        "deadband_w",
        format!(
            "budget: deadband_w must be within 0..=100, got {}",
            b.deadband_w
        ),
    );
    s.check(
        b.protect_slack_s >= 0.0 && b.protect_slack_s.is_finite(),
        "protect_slack_s",
        format!(
            "budget: protect_slack_s must be a number of seconds, 0 or more, got {}",
            b.protect_slack_s
        ),
    );
    s.check(
        b.lease_s >= 10.0,
        "lease_s",
        format!("budget: lease_s must be at least 10, got {}", b.lease_s),
    );
    for l in &b.limits {
        s.check(
            ["site", "feed", "pdu", "branch", "row", "room", "rack"].contains(&l.scope.as_str()),
            "limits",
            format!(
                "budget.limits: scope `{}` must be site, feed, pdu, branch, row, room or rack",
                l.scope
            ),
        );
        s.check(
            l.scope == "site" || !l.name.is_empty(),
            "limits",
            format!("budget.limits: a {} limit needs a name", l.scope),
        );
        s.check(
            l.limit_kw > 0.0 && l.limit_kw.is_finite() && l.derate > 0.0 && l.derate <= 1.0,
                "limits",
            format!(
                "budget.limits: {} {}: limit_kw must be positive and derate within 0..=1, got {} and {}",
                l.scope, l.name, l.limit_kw, l.derate
            ),
        );
    }
}
