//! The policy file's `[node_power]` section, its type and its checks.

use serde::{Deserialize, Serialize};

use super::{Section, SectionCheck};
use crate::policy::Policy;

/// How the warm reserve of `[node_power]` is sized.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ReserveMode {
    /// From the recent arrivals: no work coming, no reserve.
    #[default]
    Forecast,
    /// Always `reserve_gpus` (or `reserve_share`).
    Fixed,
}

/// The `[node_power]` table of a policy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NodePowerRule {
    pub enabled: bool,
    /// Idle GPUs kept on beyond what the work due within a boot time needs; with
    /// `reserve = "forecast"` the most kept.
    pub reserve_gpus: u32,
    /// The same as a share of the site's GPUs (the larger of the two holds).
    pub reserve_share: f64,
    /// How the warm reserve is sized: `forecast` (the GPUs expected to be submitted
    /// within a boot and a shutdown time at the rate of the last `reserve_window_s`,
    /// at most `reserve_gpus`/`reserve_share`) or `fixed` (always that many).
    pub reserve: ReserveMode,
    /// The window the arrival rate is measured over, s.
    pub reserve_window_s: f64,
    /// A node is powered down after this long with no work, s.
    pub idle_s: f64,
    /// The same while the price is above the mean of the forecast's next 24 h.
    pub idle_s_expensive: Option<f64>,
    /// A node powered down stays off at least this long unless work needs it, s.
    pub min_off_s: f64,
    /// At most this many power-downs in any minute.
    pub max_downs_per_min: u32,
    /// Boot time (power-up until the node takes work), s; `boot_s_by_model` per GPU
    /// model of the node where given.
    pub boot_s: f64,
    /// Shutdown time, s.
    pub shutdown_s: f64,
    pub boot_s_by_model: std::collections::BTreeMap<String, f64>,
    /// A node not back this long after its power-up is marked failed.
    pub resume_timeout_s: f64,
    /// What a powered-down node still draws (BMC, fans), W.
    pub off_w: f64,
    /// A power-down carries a lease: a node the controller stops renewing it for is
    /// brought back when it ends, s.
    pub lease_s: f64,
}

impl Default for NodePowerRule {
    fn default() -> Self {
        NodePowerRule {
            enabled: false,
            reserve_gpus: 8,
            reserve_share: 0.05,
            reserve: ReserveMode::Forecast,
            reserve_window_s: 3600.0,
            idle_s: 900.0,
            idle_s_expensive: None,
            min_off_s: 600.0,
            max_downs_per_min: 8,
            boot_s: 300.0,
            shutdown_s: 60.0,
            boot_s_by_model: Default::default(),
            resume_timeout_s: 900.0,
            off_w: 15.0,
            lease_s: 900.0,
        }
    }
}

impl NodePowerRule {
    pub fn is_default(&self) -> bool {
        *self == NodePowerRule::default()
    }

    pub fn boot_s_of(&self, model: &str) -> f64 {
        self.boot_s_by_model
            .get(model)
            .copied()
            .unwrap_or(self.boot_s)
    }
}

/// The `[node_power]` section in the list of [`super::SECTIONS`].
pub(crate) const SECTION: Section = Section {
    key: "node_power",
    check,
};

/// Its impossible values, each at its key.
fn check(policy: &mut Policy, s: &mut SectionCheck<'_, '_>) {
    let n = &policy.node_power;
    s.check(
        (0.0..1.0).contains(&n.reserve_share) && n.idle_s >= 0.0 && n.min_off_s >= 0.0,
        "reserve_share",
        format!(
            "node_power: reserve_share must be within 0..1 and idle_s, min_off_s not negative (got {}, {}, {})",
            n.reserve_share, n.idle_s, n.min_off_s
        ),
    );
    s.check(
        n.reserve_window_s.is_finite() && n.reserve_window_s >= 60.0,
        "reserve_window_s",
        format!(
            "node_power: reserve_window_s must be at least 60 (got {})",
            n.reserve_window_s
        ),
    );
    s.check(
        n.max_downs_per_min >= 1
            && n.boot_s > 0.0
            && n.resume_timeout_s >= n.boot_s
            && n.lease_s >= 10.0,
        "max_downs_per_min",
        format!(
            "node_power: max_downs_per_min must be at least 1, boot_s positive, resume_timeout_s at least boot_s and lease_s at least 10 (got {}, {}, {}, {})",
            n.max_downs_per_min, n.boot_s, n.resume_timeout_s, n.lease_s
        ),
    );
}
