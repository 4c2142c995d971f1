//! Thermal headroom: a rack whose inlet is above its limit, or whose cooling unit is
//! short of headroom (CDU supply or return temperature above its limit, heat load
//! above its capacity), gets its GPUs capped, one step at a time, until it recovers;
//! the cap relaxes one step at a time once every signal is back under its release
//! threshold and the cap has been held `min_hold_s`.

pub(crate) mod controller;
pub mod model;
pub mod predictive;

use std::collections::BTreeMap;

use telemetry::metric::names::{HEAT_LOAD_KW, INLET_TEMP_C, RETURN_TEMP_C, SUPPLY_TEMP_C};
use telemetry::{EntityId, Site, Snapshot, Timestamp};

use crate::plan::round3;
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
    /// What would relax it.
    pub release: String,
}

/// What a cooling unit's signals say: short of headroom (with why), recovered, or
/// neither.
#[derive(Debug, Clone, Default)]
pub(crate) struct UnitState {
    pub(crate) hot: Option<String>,
    pub(crate) cool: bool,
    values: BTreeMap<String, f64>,
    release: Vec<String>,
}

/// Checks a cooling unit's supply and return temperatures and heat load against the
/// rule's limits. A signal the unit never reported is not checked; one that went
/// stale follows `on_stale`.
pub(crate) fn unit_state(
    unit: &telemetry::site::CoolingUnit,
    snapshot: &Snapshot,
    rule: &ThermalRule,
    now: Timestamp,
) -> UnitState {
    let id = EntityId::new(telemetry::EntityKind::Cooling, &unit.id);
    let mut st = UnitState {
        cool: true,
        ..UnitState::default()
    };
    let checks = [
        (
            SUPPLY_TEMP_C,
            rule.supply_limit_c,
            rule.supply_limit_c.map(|l| l - rule.release_below_c),
            "°C",
        ),
        (
            RETURN_TEMP_C,
            rule.return_limit_c,
            rule.return_limit_c.map(|l| l - rule.release_below_c),
            "°C",
        ),
        (
            HEAT_LOAD_KW,
            Some(unit.capacity_kw * rule.max_load_ratio),
            Some(unit.capacity_kw * rule.load_release_ratio),
            "kW",
        ),
    ];
    for (metric, limit, release, unit_name) in checks {
        let (Some(limit), Some(release)) = (limit, release) else {
            continue;
        };
        let Some(o) = snapshot.observe(&id, metric, now) else {
            continue;
        };
        st.values
            .insert(format!("{}.{metric}", unit.id), round3(o.value));
        st.values
            .insert(format!("{}.{metric}_limit", unit.id), round3(limit));
        st.release
            .push(format!("{}.{metric} < {}", unit.id, round3(release)));
        if !o.usable() {
            match rule.on_stale {
                OnStale::AssumeWorst => {
                    st.hot = Some(format!("{} {metric} stale: assuming the worst", unit.id));
                    st.cool = false;
                }
                OnStale::HoldLast => st.cool = false,
                OnStale::Ignore => {}
            }
            continue;
        }
        if o.value > limit {
            st.hot = Some(format!(
                "{} {metric} {:.1} {unit_name} above {:.1} {unit_name}",
                unit.id, o.value, limit
            ));
        }
        if o.value >= release {
            st.cool = false;
        }
    }
    st
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
    let units: BTreeMap<&str, UnitState> = site
        .cooling
        .iter()
        .map(|u| (u.id.as_str(), unit_state(u, snapshot, rule, now)))
        .collect();
    for rack in &site.racks {
        let unit = units.get(rack.cooling.as_str());
        let prev = prior.thermal.get(&rack.id);
        let fraction = prev.map_or(1.0, |p| p.fraction);
        let since = prev.map_or(now, |p| p.since);
        let held_s = now.secs_since(since);
        let mut values = BTreeMap::new();
        values.insert("limit_c".to_string(), rack.inlet_limit_c);
        let reading = inlet_reading(snapshot, rack, now, &mut values);
        // hot: tighten; cool: relax; neither: keep
        let (hot, cool, why) = inlet_signals(reading, rack, rule);
        // the cooling unit that serves the rack can make it hot and keep it from cooling
        let (hot, cool, why) = match unit {
            Some(u) => {
                values.extend(u.values.clone());
                match (&u.hot, hot) {
                    (Some(h), false) => (true, false, h.clone()),
                    (Some(h), true) => (true, false, format!("{why}; {h}")),
                    (None, _) => (hot, cool && u.cool, why),
                }
            }
            None => (hot, cool, why),
        };
        let release = release_text(rack, unit, rule);
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
                release: release.clone(),
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
                release: release.clone(),
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

/// The rack's inlet reading, when usable, with what it shows in `values`.
fn inlet_reading(
    snapshot: &Snapshot,
    rack: &telemetry::site::Rack,
    now: Timestamp,
    values: &mut BTreeMap<String, f64>,
) -> Option<f64> {
    let obs = snapshot.observe(&EntityId::rack(&rack.id), INLET_TEMP_C, now);
    match obs {
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
    }
}

/// What the rack's inlet says: (hot, cool, why); a missing reading follows `on_stale`.
fn inlet_signals(
    reading: Option<f64>,
    rack: &telemetry::site::Rack,
    rule: &ThermalRule,
) -> (bool, bool, String) {
    match reading {
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
    }
}

/// What would relax the rack's cap: its inlet and its unit's signals under their
/// release thresholds.
fn release_text(
    rack: &telemetry::site::Rack,
    unit: Option<&UnitState>,
    rule: &ThermalRule,
) -> String {
    let mut release = vec![format!(
        "inlet_temp_c < {:.1}",
        rack.inlet_limit_c - rule.release_below_c
    )];
    if let Some(u) = unit {
        release.extend(u.release.iter().cloned());
    }
    format!(
        "{} (one step per {}s, held at least {}s)",
        release.join(" and "),
        rule.step_interval_s,
        rule.min_hold_s
    )
}
