//! The policy file's `[thermal]` section: the thermal and predictive controllers' settings, read and checked.

use serde::{Deserialize, Serialize};

use super::{Section, SectionCheck};
use crate::policy::Policy;
use crate::rules::OnStale;

/// Rack inlet temperature against the rack's `inlet_limit_c`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ThermalRule {
    pub enabled: bool,
    /// `predictive` (the default): cap before the limit is crossed, from a thermal
    /// model's prediction; `reactive`: step caps once a limit is crossed.
    pub mode: ThermalMode,
    /// Predictive: the predicted peak inlet is kept at least this far under the limit.
    pub margin_c: f64,
    /// Predictive: how far ahead to predict, in time constants of the rack's cooling unit.
    pub horizon_tau: f64,
    /// Predictive: a fitted model whose one-tick error (RMS) is above this falls back
    /// to the site file's prior.
    pub fit_max_rms_c: f64,
    /// How much the rack's GPU cap falls per step, in % of the GPU's default limit.
    pub step_pct: f64,
    /// Time between two steps (tighten or relax).
    pub step_interval_s: f64,
    /// Release starts only below limit − this.
    pub release_below_c: f64,
    /// A cap is kept at least this long before it relaxes.
    pub min_hold_s: f64,
    /// Cooling units (CDUs): tighten the racks a unit serves while its supply
    /// temperature is above this (°C); `None`: not checked.
    pub supply_limit_c: Option<f64>,
    /// … or its return temperature above this (°C); `None`: not checked.
    pub return_limit_c: Option<f64>,
    /// … or its heat load above capacity × this.
    pub max_load_ratio: f64,
    /// Relax only once the heat load is under capacity × this.
    pub load_release_ratio: f64,
    pub on_stale: OnStale,
    pub lease_s: f64,
    pub observe: bool,
}

impl Default for ThermalRule {
    fn default() -> Self {
        ThermalRule {
            enabled: true,
            mode: ThermalMode::Predictive,
            margin_c: 0.5,
            horizon_tau: 3.0,
            fit_max_rms_c: 0.3,
            step_pct: 10.0,
            step_interval_s: 120.0,
            release_below_c: 1.5,
            min_hold_s: 300.0,
            supply_limit_c: None,
            return_limit_c: None,
            max_load_ratio: 1.0,
            load_release_ratio: 0.9,
            on_stale: OnStale::HoldLast,
            lease_s: 300.0,
            observe: false,
        }
    }
}

/// How the thermal rule decides when to cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ThermalMode {
    /// Step caps down once an inlet (or a cooling unit's signal) is over its limit.
    Reactive,
    /// Cap before the limit: keep the inlet predicted over the horizon under
    /// limit − `margin_c` (see `thermal_model`).
    #[default]
    Predictive,
}

/// The `[thermal]` section in the list of [`super::SECTIONS`].
pub(crate) const SECTION: Section = Section {
    key: "thermal",
    check,
};

/// Its impossible values, each at its key.
fn check(policy: &mut Policy, s: &mut SectionCheck<'_, '_>) {
    let t = &policy.thermal;
    check_steps(t, s);
    check_cooling(t, s);
    check_prediction(t, s);
}

/// The reactive steps: their size, pace and release.
fn check_steps(t: &ThermalRule, s: &mut SectionCheck<'_, '_>) {
    s.check(
        t.step_pct > 0.0 && t.step_pct <= 50.0,
        "step_pct",
        format!(
            "thermal: step_pct must be within 0..=50, got {}",
            t.step_pct
        ),
    );
    s.check(
        t.step_interval_s >= 1.0,
        "step_interval_s",
        format!(
            "thermal: step_interval_s must be at least 1, got {}",
            t.step_interval_s
        ),
    );
    s.check(
        (0.0..=10.0).contains(&t.release_below_c),
        "release_below_c",
        format!(
            "thermal: release_below_c must be within 0..=10, got {}",
            t.release_below_c
        ),
    );
    s.check(
        t.min_hold_s >= 0.0,
        "min_hold_s",
        format!(
            "thermal: min_hold_s must not be negative, got {}",
            t.min_hold_s
        ),
    );
}

/// The cooling units' limits: heat load and supply and return temperatures.
fn check_cooling(t: &ThermalRule, s: &mut SectionCheck<'_, '_>) {
    s.check(
        t.max_load_ratio > 0.0
            && t.max_load_ratio <= 1.5
            && t.load_release_ratio > 0.0
            && t.load_release_ratio < t.max_load_ratio,
        "load_release_ratio",
        format!(
            "thermal: need 0 < load_release_ratio < max_load_ratio <= 1.5, got {} and {}",
            t.load_release_ratio, t.max_load_ratio
        ),
    );
    for (key, v) in [
        ("supply_limit_c", t.supply_limit_c),
        ("return_limit_c", t.return_limit_c),
    ] {
        if let Some(v) = v {
            s.check(
                (5.0..=80.0).contains(&v),
                key,
                format!("thermal: {key} must be within 5..=80 °C, got {v}"),
            );
        }
    }
}

/// The prediction's margin, horizon and fit, and the lease.
fn check_prediction(t: &ThermalRule, s: &mut SectionCheck<'_, '_>) {
    s.check(
        (0.0..=10.0).contains(&t.margin_c),
        "margin_c",
        format!(
            "thermal: margin_c must be within 0..=10, got {}",
            t.margin_c
        ),
    );
    s.check(
        (0.5..=20.0).contains(&t.horizon_tau),
        "horizon_tau",
        format!(
            "thermal: horizon_tau must be within 0.5..=20, got {}",
            t.horizon_tau
        ),
    );
    s.check(
        t.fit_max_rms_c > 0.0 && t.fit_max_rms_c <= 10.0,
        "fit_max_rms_c",
        format!(
            "thermal: fit_max_rms_c must be within 0..=10, got {}",
            t.fit_max_rms_c
        ),
    );
    s.check(
        t.lease_s >= 10.0,
        "lease_s",
        format!("thermal: lease_s must be at least 10, got {}", t.lease_s),
    );
}
