//! The policy file: thresholds and behaviours of the first rules, as SREs write them.
//!
//! ```toml
//! version = 1
//! [budget]
//! margin = 0.03
//! [thermal]
//! step_pct = 10
//! on_stale = "hold_last"
//! [price]
//! defer_above = 0.20
//! classes = ["batch", "training"]
//! ```

use serde::{Deserialize, Serialize};
use telemetry::diag::{from_toml_error, Collector, Diagnostics};
use toml::Spanned;

pub use crate::rules::OnStale;

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

/// A whole policy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Policy {
    pub version: i64,
    #[serde(default)]
    pub budget: BudgetRule,
    #[serde(default)]
    pub thermal: ThermalRule,
    #[serde(default)]
    pub price: PriceRule,
    /// Off unless the policy turns it on; left out of the serialized policy while it
    /// is the default (so `policy explain` does not list it as disabled).
    #[serde(
        default,
        skip_serializing_if = "crate::node_power::NodePowerRule::is_default"
    )]
    pub node_power: crate::node_power::NodePowerRule,
    /// The `[[rules]]` tables, validated (filled by [`Policy::parse`]).
    #[serde(skip)]
    pub rules: Vec<crate::rules::Rule>,
    /// The `[[rules]]` tables as read; compiled into `rules` by [`Policy::parse`].
    #[serde(default, rename = "rules", skip_serializing)]
    raw_rules: Vec<toml::Value>,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            version: 1,
            budget: BudgetRule::default(),
            thermal: ThermalRule::default(),
            price: PriceRule::default(),
            node_power: Default::default(),
            rules: Vec::new(),
            raw_rules: Vec::new(),
        }
    }
}

#[derive(Deserialize)]
struct Positions {
    version: Spanned<toml::Value>,
    #[serde(default)]
    budget: Option<Spanned<toml::Table>>,
    #[serde(default)]
    thermal: Option<Spanned<toml::Table>>,
    #[serde(default)]
    price: Option<Spanned<toml::Table>>,
    #[serde(default)]
    node_power: Option<Spanned<toml::Table>>,
    #[serde(default)]
    rules: Vec<crate::rules::RawRule>,
}

impl Policy {
    /// Parses and validates a policy file; every problem at once, with positions.
    pub fn parse(file: &str, src: &str) -> Result<Policy, Diagnostics> {
        let mut policy: Policy = telemetry::diag::parse_all(file, src)?;
        let pos: Positions = toml::from_str(src).map_err(|e| from_toml_error(file, src, &e))?;
        let mut c = Collector::new(file, src);
        policy.raw_rules.clear();
        policy.rules = crate::rules::compile(src, pos.rules.clone(), &mut c);
        if policy.version != 1 {
            c.at(
                pos.version.span(),
                format!("unsupported policy version {}, expected 1", policy.version),
            );
        }
        let field = |t: &Option<Spanned<toml::Table>>, key: &str| {
            t.as_ref()
                .map(|t| {
                    // the table's own span starts at its header; a key's value sits in it
                    let start = t.span().start;
                    let text = &src[start.min(src.len())..];
                    text.find(&format!("{key} ="))
                        .or_else(|| text.find(&format!("{key}=")))
                        .map(|i| start + i)
                        .unwrap_or(start)
                })
                .unwrap_or(0)
        };
        let mut check = |ok: bool, t: &Option<Spanned<toml::Table>>, key: &str, msg: String| {
            if !ok {
                let at = field(t, key);
                c.at(at..at, msg);
            }
        };
        let b = &policy.budget;
        check(
            (0.0..0.5).contains(&b.margin),
            &pos.budget,
            "margin",
            format!("budget: margin must be within 0..0.5, got {}", b.margin),
        );
        check(
            b.release_ratio > 0.5 && b.release_ratio <= 1.0,
            &pos.budget,
            "release_ratio",
            format!(
                "budget: release_ratio must be within 0.5..=1, got {}",
                b.release_ratio
            ),
        );
        check(
            b.raise_w_per_min > 0.0,
            &pos.budget,
            "raise_w_per_min",
            format!(
                "budget: raise_w_per_min must be positive, got {}",
                b.raise_w_per_min
            ),
        );
        check(
            (0.0..=100.0).contains(&b.deadband_w),
            &pos.budget,
            "deadband_w",
            format!(
                "budget: deadband_w must be within 0..=100, got {}",
                b.deadband_w
            ),
        );
        check(
            b.protect_slack_s >= 0.0 && b.protect_slack_s.is_finite(),
            &pos.budget,
            "protect_slack_s",
            format!(
                "budget: protect_slack_s must be a number of seconds, 0 or more, got {}",
                b.protect_slack_s
            ),
        );
        check(
            b.lease_s >= 10.0,
            &pos.budget,
            "lease_s",
            format!("budget: lease_s must be at least 10, got {}", b.lease_s),
        );
        for l in &b.limits {
            check(
                ["site", "feed", "pdu", "branch", "row", "room", "rack"]
                    .contains(&l.scope.as_str()),
                &pos.budget,
                "limits",
                format!(
                    "budget.limits: scope `{}` must be site, feed, pdu, branch, row, room or rack",
                    l.scope
                ),
            );
            check(
                l.scope == "site" || !l.name.is_empty(),
                &pos.budget,
                "limits",
                format!("budget.limits: a {} limit needs a name", l.scope),
            );
            check(
                l.limit_kw > 0.0 && l.limit_kw.is_finite() && l.derate > 0.0 && l.derate <= 1.0,
                &pos.budget,
                "limits",
                format!(
                    "budget.limits: {} {}: limit_kw must be positive and derate within 0..=1, got {} and {}",
                    l.scope, l.name, l.limit_kw, l.derate
                ),
            );
        }
        let t = &policy.thermal;
        check(
            t.step_pct > 0.0 && t.step_pct <= 50.0,
            &pos.thermal,
            "step_pct",
            format!(
                "thermal: step_pct must be within 0..=50, got {}",
                t.step_pct
            ),
        );
        check(
            t.step_interval_s >= 1.0,
            &pos.thermal,
            "step_interval_s",
            format!(
                "thermal: step_interval_s must be at least 1, got {}",
                t.step_interval_s
            ),
        );
        check(
            (0.0..=10.0).contains(&t.release_below_c),
            &pos.thermal,
            "release_below_c",
            format!(
                "thermal: release_below_c must be within 0..=10, got {}",
                t.release_below_c
            ),
        );
        check(
            t.min_hold_s >= 0.0,
            &pos.thermal,
            "min_hold_s",
            format!(
                "thermal: min_hold_s must not be negative, got {}",
                t.min_hold_s
            ),
        );
        check(
            t.max_load_ratio > 0.0
                && t.max_load_ratio <= 1.5
                && t.load_release_ratio > 0.0
                && t.load_release_ratio < t.max_load_ratio,
            &pos.thermal,
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
                check(
                    (5.0..=80.0).contains(&v),
                    &pos.thermal,
                    key,
                    format!("thermal: {key} must be within 5..=80 °C, got {v}"),
                );
            }
        }
        check(
            (0.0..=10.0).contains(&t.margin_c),
            &pos.thermal,
            "margin_c",
            format!(
                "thermal: margin_c must be within 0..=10, got {}",
                t.margin_c
            ),
        );
        check(
            (0.5..=20.0).contains(&t.horizon_tau),
            &pos.thermal,
            "horizon_tau",
            format!(
                "thermal: horizon_tau must be within 0.5..=20, got {}",
                t.horizon_tau
            ),
        );
        check(
            t.fit_max_rms_c > 0.0 && t.fit_max_rms_c <= 10.0,
            &pos.thermal,
            "fit_max_rms_c",
            format!(
                "thermal: fit_max_rms_c must be within 0..=10, got {}",
                t.fit_max_rms_c
            ),
        );
        check(
            t.lease_s >= 10.0,
            &pos.thermal,
            "lease_s",
            format!("thermal: lease_s must be at least 10, got {}", t.lease_s),
        );
        let p = &policy.price;
        check(
            p.defer_above.is_finite() && (-10.0..=100.0).contains(&p.defer_above),
            &pos.price,
            "defer_above",
            format!(
                "price: defer_above must be within -10..=100 per kWh, got {}",
                p.defer_above
            ),
        );
        check(
            p.margin_s >= 0.0,
            &pos.price,
            "margin_s",
            format!("price: margin_s must not be negative, got {}", p.margin_s),
        );
        check(
            p.max_defer_s > 0.0,
            &pos.price,
            "max_defer_s",
            format!("price: max_defer_s must be positive, got {}", p.max_defer_s),
        );
        check(
            p.lease_s >= 10.0,
            &pos.price,
            "lease_s",
            format!("price: lease_s must be at least 10, got {}", p.lease_s),
        );
        check(
            (60.0..=3600.0).contains(&p.plan_slot_s),
            &pos.price,
            "plan_slot_s",
            format!(
                "price: plan_slot_s must be within 60..=3600, got {}",
                p.plan_slot_s
            ),
        );
        check(
            p.plan_horizon_s >= p.plan_slot_s && p.plan_horizon_s <= 7.0 * 86400.0,
            &pos.price,
            "plan_horizon_s",
            format!(
                "price: plan_horizon_s must be within plan_slot_s..=604800, got {}",
                p.plan_horizon_s
            ),
        );
        check(
            p.plan_budget_share > 0.0 && p.plan_budget_share <= 1.0,
            &pos.price,
            "plan_budget_share",
            format!(
                "price: plan_budget_share must be within 0..=1, got {}",
                p.plan_budget_share
            ),
        );
        check(
            p.delay_cost_per_gpu_hour >= 0.0 && p.delay_cost_per_gpu_hour.is_finite(),
            &pos.price,
            "delay_cost_per_gpu_hour",
            format!(
                "price: delay_cost_per_gpu_hour must not be negative, got {}",
                p.delay_cost_per_gpu_hour
            ),
        );
        check(
            p.max_slowdown.is_none_or(|m| m >= 1.0),
            &pos.price,
            "max_slowdown",
            format!(
                "price: max_slowdown must be at least 1, got {}",
                p.max_slowdown.unwrap_or(0.0)
            ),
        );
        check(
            p.carbon_price_per_kg.is_none_or(|c| c >= 0.0),
            &pos.price,
            "carbon_price_per_kg",
            "price: carbon_price_per_kg must not be negative".to_string(),
        );
        check(
            p.peak_target_kw.is_none_or(|k| k > 0.0),
            &pos.price,
            "peak_target_kw",
            "price: peak_target_kw must be positive".to_string(),
        );
        let n = &policy.node_power;
        check(
            (0.0..1.0).contains(&n.reserve_share) && n.idle_s >= 0.0 && n.min_off_s >= 0.0,
            &pos.node_power,
            "reserve_share",
            format!(
                "node_power: reserve_share must be within 0..1 and idle_s, min_off_s not negative (got {}, {}, {})",
                n.reserve_share, n.idle_s, n.min_off_s
            ),
        );
        check(
            n.max_downs_per_min >= 1
                && n.boot_s > 0.0
                && n.resume_timeout_s >= n.boot_s
                && n.lease_s >= 10.0,
            &pos.node_power,
            "max_downs_per_min",
            format!(
                "node_power: max_downs_per_min must be at least 1, boot_s positive, resume_timeout_s at least boot_s and lease_s at least 10 (got {}, {}, {}, {})",
                n.max_downs_per_min, n.boot_s, n.resume_timeout_s, n.lease_s
            ),
        );
        c.finish()?;
        Ok(policy)
    }
}

impl Policy {
    /// Checks the policy against a site: selectors that pick nothing, caps below the
    /// minimum limit of a GPU they apply to, budget limits naming unknown equipment.
    /// `src` is the policy file's text (for positions).
    pub fn check_site(
        &self,
        file: &str,
        src: &str,
        site: &telemetry::Site,
    ) -> Result<(), Diagnostics> {
        let mut c = Collector::new(file, src);
        let index = crate::index::Index::new(site, site.gpus());
        for rule in &self.rules {
            if rule.scope == crate::rules::ScopeKind::Job {
                continue;
            }
            let targets = index.targets(rule.scope, &rule.select);
            if targets.is_empty() {
                c.at(
                    rule.select_at..rule.select_at,
                    format!(
                        "rule `{}`: selects no {} of site {}",
                        rule.name,
                        rule.scope.name(),
                        site.name
                    ),
                );
                continue;
            }
            let below: Vec<String> = match rule.action {
                crate::rules::RuleAction::CapW(w) => {
                    let mut models: Vec<(&str, f64)> = targets
                        .iter()
                        .flat_map(|(_, g)| g.iter().map(|&i| index.gpus[i].model))
                        .filter(|m| w < m.min_w)
                        .map(|m| (m.name.as_str(), m.min_w))
                        .collect();
                    models.sort_by(|a, b| a.0.cmp(b.0));
                    models.dedup();
                    models
                        .into_iter()
                        .map(|(n, min)| format!("{n} accepts no less than {min} W"))
                        .collect()
                }
                crate::rules::RuleAction::CapPct(p) => {
                    let mut models: Vec<(&str, f64)> = targets
                        .iter()
                        .flat_map(|(_, g)| g.iter().map(|&i| index.gpus[i].model))
                        .filter(|m| m.default_w * p / 100.0 < m.min_w)
                        .map(|m| (m.name.as_str(), m.min_w))
                        .collect();
                    models.sort_by(|a, b| a.0.cmp(b.0));
                    models.dedup();
                    models
                        .into_iter()
                        .map(|(n, min)| format!("{n} accepts no less than {min} W"))
                        .collect()
                }
                _ => Vec::new(),
            };
            if !below.is_empty() {
                c.at(
                    rule.action_at..rule.action_at,
                    format!(
                        "rule `{}`: cap below the GPUs' minimum ({}); it would be raised to the minimum",
                        rule.name,
                        below.join(", ")
                    ),
                );
            }
        }
        let entities = site.entities();
        let budget_at = src.find("[budget").unwrap_or(0);
        for l in &self.budget.limits {
            let kind = match l.scope.as_str() {
                "site" => continue,
                "feed" => telemetry::EntityKind::Feed,
                "pdu" => telemetry::EntityKind::Pdu,
                "branch" => telemetry::EntityKind::Branch,
                "row" => telemetry::EntityKind::Row,
                "room" => telemetry::EntityKind::Room,
                _ => telemetry::EntityKind::Rack,
            };
            if !entities.contains(&telemetry::EntityId::new(kind, &l.name)) {
                let at = src[budget_at..]
                    .find(&format!("\"{}\"", l.name))
                    .map_or(budget_at, |i| budget_at + i);
                c.at(
                    at..at,
                    format!(
                        "budget.limits: site {} has no {} `{}`",
                        site.name, l.scope, l.name
                    ),
                );
            }
        }
        c.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_fill_what_the_file_leaves_out() {
        let p =
            Policy::parse("p.toml", "version = 1\n[price]\ndefer_above = 0.3\n").expect("valid");
        assert_eq!(p.price.defer_above, 0.3);
        assert_eq!(p.budget, BudgetRule::default());
    }

    #[test]
    fn every_problem_is_reported_with_its_position() {
        let src = "version = 1\n[budget]\nmargin = 0.9\n[thermal]\nstep_pct = 80\nlease_s = 1\n";
        let err = Policy::parse("p.toml", src).expect_err("invalid");
        assert_eq!(
            err.to_string(),
            "p.toml:3:1: budget: margin must be within 0..0.5, got 0.9\n\
             p.toml:5:1: thermal: step_pct must be within 0..=50, got 80\n\
             p.toml:6:1: thermal: lease_s must be at least 10, got 1"
        );
    }

    #[test]
    fn unknown_keys_and_bad_values_are_errors() {
        let err = Policy::parse("p.toml", "version = 1\n[thermal]\non_stale = \"panic\"\n")
            .expect_err("bad enum");
        assert!(
            err.to_string()
                .starts_with("p.toml:3:12: unknown variant `panic`"),
            "{err}"
        );
        let err =
            Policy::parse("p.toml", "version = 1\n[price]\ndefer_abov = 1\n").expect_err("typo");
        assert!(
            err.to_string()
                .starts_with("p.toml:3:1: unknown field `defer_abov`"),
            "{err}"
        );
    }

    #[test]
    fn value_and_node_power_keys_are_checked() {
        let p = Policy::parse(
            "p.toml",
            "version = 1\n[price]\nmode = \"plan\"\ndelay_cost_per_gpu_hour = 0.03\nmax_slowdown = 4\npeak_target_kw = 500\n[node_power]\nenabled = true\nreserve_gpus = 16\nboot_s_by_model = { H100 = 600 }\n",
        )
        .expect("valid");
        assert_eq!(p.price.delay_cost_per_gpu_hour, 0.03);
        assert_eq!(p.price.max_slowdown, Some(4.0));
        assert!(p.node_power.enabled);
        assert_eq!(p.node_power.boot_s_of("H100"), 600.0);
        assert_eq!(p.node_power.boot_s_of("A40"), 300.0);
        let err = Policy::parse(
            "p.toml",
            "version = 1\n[price]\ndelay_cost_per_gpu_hour = -1\nmax_slowdown = 0.5\n[node_power]\nreserve_share = 2\nmax_downs_per_min = 0\n",
        )
        .expect_err("bad values");
        let e = err.to_string();
        for want in [
            "delay_cost_per_gpu_hour must not be negative",
            "max_slowdown must be at least 1",
            "node_power: reserve_share must be within 0..1",
            "node_power: max_downs_per_min must be at least 1",
        ] {
            assert!(e.contains(want), "{want}: {e}");
        }
    }
}
