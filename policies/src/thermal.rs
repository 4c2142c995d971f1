//! Thermal headroom: a rack whose inlet is above its limit gets its GPUs capped, one
//! step at a time, until the inlet falls; the cap relaxes one step at a time once the
//! inlet is below limit − `release_below_c` and the cap has been held `min_hold_s`.

use std::collections::BTreeMap;

use telemetry::metric::names::INLET_TEMP_C;
use telemetry::{EntityId, Site, Snapshot, Timestamp};

use crate::budget::round3;
use crate::plan::ThermalLevel;
use crate::policy::{OnStale, ThermalRule};
use crate::State;

/// A change of one rack's thermal cap level.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    pub rack: String,
    /// New fraction of the default limit (1.0: released).
    pub fraction: f64,
    pub values: BTreeMap<String, f64>,
    pub reason: String,
}

/// The next thermal levels per rack, and the steps taken this tick.
pub fn evaluate(
    site: &Site,
    snapshot: &Snapshot,
    prior: &State,
    rule: &ThermalRule,
    now: Timestamp,
) -> (BTreeMap<String, ThermalLevel>, Vec<Step>) {
    let mut levels = BTreeMap::new();
    let mut steps = Vec::new();
    let step = rule.step_pct / 100.0;
    for rack in &site.racks {
        let prev = prior.thermal.get(&rack.id);
        let fraction = prev.map_or(1.0, |p| p.fraction);
        let since = prev.map_or(now, |p| p.since);
        let held_s = now.secs_since(since);
        let obs = snapshot.observe(&EntityId::rack(&rack.id), INLET_TEMP_C, now);
        let mut values = BTreeMap::new();
        values.insert("limit_c".to_string(), rack.inlet_limit_c);
        let reading = match obs {
            Some(o) if o.usable() => {
                values.insert("inlet_temp_c".to_string(), round3(o.value));
                Some(o.value)
            }
            Some(o) => {
                values.insert("inlet_temp_c".to_string(), round3(o.value));
                values.insert("age_s".to_string(), round3(o.age_s));
                None
            }
            None => None,
        };
        // hot: tighten; cool: relax; neither: keep
        let (hot, cool, why) = match reading {
            Some(t) => (
                t > rack.inlet_limit_c,
                t < rack.inlet_limit_c - rule.release_below_c,
                format!("inlet {t:.1} °C against limit {:.1} °C", rack.inlet_limit_c),
            ),
            None => match rule.on_stale {
                OnStale::AssumeWorst => (
                    true,
                    false,
                    "inlet reading stale or missing: assuming the worst".to_string(),
                ),
                OnStale::HoldLast => (false, false, String::new()),
                OnStale::Ignore => (
                    false,
                    true,
                    "inlet reading stale or missing: rule ignored".to_string(),
                ),
            },
        };
        let mut next = ThermalLevel { fraction, since };
        let first = prev.is_none();
        if hot && fraction > 0.0 && (first || held_s >= rule.step_interval_s) {
            next = ThermalLevel {
                fraction: (fraction - step).max(0.0),
                since: now,
            };
            steps.push(Step {
                rack: rack.id.clone(),
                fraction: next.fraction,
                values: values.clone(),
                reason: format!("{why}: tighten to {:.0}% of default", next.fraction * 100.0),
            });
        } else if cool && prev.is_some() && held_s >= rule.min_hold_s.max(rule.step_interval_s) {
            let f = (fraction + step).min(1.0);
            let reason = if f >= 1.0 - 1e-9 {
                format!("{why}: released")
            } else {
                format!("{why}: relax to {:.0}% of default", f * 100.0)
            };
            steps.push(Step {
                rack: rack.id.clone(),
                fraction: f,
                values: values.clone(),
                reason,
            });
            next = ThermalLevel {
                fraction: f,
                since: now,
            };
        }
        if next.fraction < 1.0 - 1e-9 {
            levels.insert(rack.id.clone(), next);
        }
    }
    (levels, steps)
}
