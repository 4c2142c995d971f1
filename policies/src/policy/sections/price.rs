//! The policy file's `[price]` section: the price controller's settings, read and checked.

use serde::{Deserialize, Serialize};

use super::{Section, SectionCheck};
use crate::policy::Policy;
use crate::rules::OnStale;

/// How the price rule decides when a deferrable job may start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PriceMode {
    /// Hold while the price now is above `defer_above` (needs only the price now).
    #[default]
    Threshold,
    /// Plan every waiting job's start into the cheapest slots of the price forecast
    /// that the GPUs and the facility budget have room for (needs a forecast).
    Plan,
}

/// Deferral of deferrable jobs while the price is high.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PriceRule {
    pub enabled: bool,
    /// `threshold` (the default, so that existing policies keep their meaning and a
    /// site without a forecast feed loses nothing) or `plan`.
    pub mode: PriceMode,
    /// Defer while the price per kWh is above this (threshold mode).
    pub defer_above: f64,
    /// Job classes the rule may defer (empty: every deferrable job).
    pub classes: Vec<String>,
    /// Release this long before the latest start that meets the deadline.
    pub margin_s: f64,
    /// A job without a deadline is deferred at most this long after submission.
    pub max_defer_s: f64,
    pub on_stale: OnStale,
    pub lease_s: f64,
    pub observe: bool,
    /// Plan mode: length of a planning slot, in seconds.
    pub plan_slot_s: f64,
    /// Plan mode: how far ahead to plan, in seconds.
    pub plan_horizon_s: f64,
    /// Plan mode: the share of the facility budget planned load may fill.
    pub plan_budget_share: f64,
    /// Plan mode: what an hour of delay costs per GPU of a held job, in the site's
    /// currency. A job is held only when the expected saving of its planned start
    /// (forecast price difference × its expected energy, plus carbon at
    /// `carbon_price_per_kg`) exceeds this cost for the delay. 0: any saving holds.
    pub delay_cost_per_gpu_hour: f64,
    /// Plan mode: a job is never planned to end later than this many times its run
    /// time after its submission ((end − submit) / run time), when given.
    pub max_slowdown: Option<f64>,
    /// Plan mode: a price per kg CO₂e, added to the energy price in the plan (with the
    /// carbon forecast) when given.
    pub carbon_price_per_kg: Option<f64>,
    /// Released and planned work is paced so that the facility's IT power stays at or
    /// under this, in kW (jobs at their latest start are released regardless).
    pub peak_target_kw: Option<f64>,
}

impl Default for PriceRule {
    fn default() -> Self {
        PriceRule {
            enabled: true,
            mode: PriceMode::Threshold,
            plan_slot_s: 900.0,
            plan_horizon_s: 48.0 * 3600.0,
            plan_budget_share: 0.9,
            delay_cost_per_gpu_hour: 0.0,
            max_slowdown: None,
            carbon_price_per_kg: None,
            peak_target_kw: None,
            defer_above: 0.20,
            classes: Vec::new(),
            margin_s: 600.0,
            max_defer_s: 8.0 * 3600.0,
            on_stale: OnStale::Ignore,
            lease_s: 600.0,
            observe: false,
        }
    }
}

/// The `[price]` section in the list of [`super::SECTIONS`].
pub(crate) const SECTION: Section = Section {
    key: "price",
    check,
};

/// Its impossible values, each at its key.
fn check(policy: &mut Policy, s: &mut SectionCheck<'_, '_>) {
    let p = &policy.price;
    s.check(
        p.defer_above.is_finite() && (-10.0..=100.0).contains(&p.defer_above),
        "defer_above",
        format!(
            "price: defer_above must be within -10..=100 per kWh, got {}",
            p.defer_above
        ),
    );
    s.check(
        p.margin_s >= 0.0,
        "margin_s",
        format!("price: margin_s must not be negative, got {}", p.margin_s),
    );
    s.check(
        p.max_defer_s > 0.0,
        "max_defer_s",
        format!("price: max_defer_s must be positive, got {}", p.max_defer_s),
    );
    s.check(
        p.lease_s >= 10.0,
        "lease_s",
        format!("price: lease_s must be at least 10, got {}", p.lease_s),
    );
    s.check(
        (60.0..=3600.0).contains(&p.plan_slot_s),
        "plan_slot_s",
        format!(
            "price: plan_slot_s must be within 60..=3600, got {}",
            p.plan_slot_s
        ),
    );
    s.check(
        p.plan_horizon_s >= p.plan_slot_s && p.plan_horizon_s <= 7.0 * 86400.0,
        "plan_horizon_s",
        format!(
            "price: plan_horizon_s must be within plan_slot_s..=604800, got {}",
            p.plan_horizon_s
        ),
    );
    s.check(
        p.plan_budget_share > 0.0 && p.plan_budget_share <= 1.0,
        "plan_budget_share",
        format!(
            "price: plan_budget_share must be within 0..=1, got {}",
            p.plan_budget_share
        ),
    );
    s.check(
        p.delay_cost_per_gpu_hour >= 0.0 && p.delay_cost_per_gpu_hour.is_finite(),
        "delay_cost_per_gpu_hour",
        format!(
            "price: delay_cost_per_gpu_hour must not be negative, got {}",
            p.delay_cost_per_gpu_hour
        ),
    );
    s.check(
        p.max_slowdown.is_none_or(|m| m >= 1.0),
        "max_slowdown",
        format!(
            "price: max_slowdown must be at least 1, got {}",
            p.max_slowdown.unwrap_or(0.0)
        ),
    );
    s.check(
        p.carbon_price_per_kg.is_none_or(|c| c >= 0.0),
        "carbon_price_per_kg",
        "price: carbon_price_per_kg must not be negative".to_string(),
    );
    s.check(
        p.peak_target_kw.is_none_or(|k| k > 0.0),
        "peak_target_kw",
        "price: peak_target_kw must be positive".to_string(),
    );
}
