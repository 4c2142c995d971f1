//! Predictive thermal headroom: for each cooling unit, the highest cap level (a fraction
//! of each GPU's default limit, in steps of `step_pct`) under which every rack's inlet,
//! predicted by [`crate::thermal_model`] over `horizon_tau` time constants with the
//! planned load (running jobs at their demand, plus the queued jobs and the holds that
//! end within the horizon landing on idle GPUs), stays under its limit − `margin_c`.
//! Caps fall to that level at once (levels a quarter of `step_pct` apart); they lift
//! at most one step per `step_interval_s`, after `min_hold_s`, to the highest level
//! whose prediction is also under limit − margin − `release_below_c`.
//! A reading over its limit (the model was wrong) or a cooling unit short of headroom
//! tightens one more step, as the reactive rule does.

use std::collections::BTreeMap;

use telemetry::metric::names::{COOLING_CAPACITY_KW, INLET_TEMP_C};
use telemetry::site::CoolingUnit;
use telemetry::{EntityId, EntityKind, Job, Site, Snapshot, Timestamp};

use crate::index::Index;
use crate::plan::{round3, RackPrediction, ThermalLevel};
use crate::policy::{OnStale, ThermalRule};
use crate::thermal::{unit_state, Step};
use crate::thermal_model::{self, Load, Params, RackFit};
use crate::{Cap, State};

mod loads;
mod plans;

use loads::{rack_loads, Loads, Queue};
use plans::{grid, Plans, RackView, GRID_PER_STEP};

/// What the predictive rule decided this tick.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    pub levels: BTreeMap<String, ThermalLevel>,
    pub steps: Vec<Step>,
    /// Each rack's fitted model after this tick's reading.
    pub fits: BTreeMap<String, RackFit>,
    /// Each rack's predicted inlet under the level in force after the tick (racks with
    /// an inlet reading).
    pub predictions: BTreeMap<String, RackPrediction>,
}

/// Evaluates the predictive thermal rule.
#[allow(clippy::too_many_arguments)]
pub fn evaluate(
    site: &Site,
    index: &Index<'_>,
    snapshot: &Snapshot,
    jobs: &[Job],
    prior: &State,
    prior_caps: &[Option<&Cap>],
    rule: &ThermalRule,
    release_margin_s: f64,
    now: Timestamp,
) -> Outcome {
    let table = index.allocations(jobs);
    let loads = rack_loads(index, snapshot, &table, jobs, prior_caps, now);
    let queue = Queue::new(jobs, &table, prior, release_margin_s);
    let ctx = UnitInputs {
        site,
        loads: &loads,
        snapshot,
        queue: &queue,
        prior_fits: by_rack(site, &prior.thermal_models),
        prior_levels: by_rack(site, &prior.thermal),
        rule,
        now,
    };
    let mut decided = Decided {
        steps: Vec::new(),
        levels: vec![None; site.racks.len()],
        fits: vec![None; site.racks.len()],
        predictions: vec![None; site.racks.len()],
        release: None,
    };
    for unit in &site.cooling {
        unit_evaluate(&ctx, unit, &mut decided);
    }
    let order = racks_by_id(site);
    Outcome {
        levels: by_id(site, &order, decided.levels),
        steps: decided.steps,
        fits: by_id(site, &order, decided.fits),
        predictions: by_id(site, &order, decided.predictions),
    }
}

/// Each rack's entry in a map by rack id, by rack index (each id looked up once, not
/// each rack searched for in the map).
fn by_rack<'p, V>(site: &Site, map: &'p BTreeMap<String, V>) -> Vec<Option<&'p V>> {
    let mut out = vec![None; site.racks.len()];
    for (id, v) in map {
        if let Some(r) = site.rack_index(id) {
            out[r] = Some(v);
        }
    }
    out
}

/// The racks' indexes in the order of their ids (sorted once for the maps by rack id;
/// racks of one id, if a site has any, in site order).
fn racks_by_id(site: &Site) -> Vec<usize> {
    let mut order: Vec<usize> = (0..site.racks.len()).collect();
    order.sort_by(|&a, &b| site.racks[a].id.cmp(&site.racks[b].id));
    order
}

/// A map by rack id of each rack's entry, made at once from the entries in the ids'
/// `order` (no search per rack, nothing left to sort).
fn by_id<V>(site: &Site, order: &[usize], mut by_rack: Vec<Option<V>>) -> BTreeMap<String, V> {
    order
        .iter()
        .filter_map(|&r| Some((site.racks[r].id.clone(), by_rack[r].take()?)))
        .collect()
}

/// What the units decide, by rack index ([`Outcome`]'s maps once every unit is done).
struct Decided {
    steps: Vec<Step>,
    levels: Vec<Option<ThermalLevel>>,
    fits: Vec<Option<RackFit>>,
    predictions: Vec<Option<RackPrediction>>,
    /// The last release text written and the temperature it names (racks of one inlet
    /// limit share it: written once).
    release: Option<(u64, String)>,
}

impl Decided {
    /// What would lift a cap: the prediction under `release_c` at a higher level.
    fn release(&mut self, release_c: f64, rule: &ThermalRule) -> String {
        match &self.release {
            Some((bits, text)) if *bits == release_c.to_bits() => text.clone(),
            _ => {
                let text = format!(
                    "predicted inlet < {release_c:.1} °C at a higher level (at most one step per {}s, held at least {}s)",
                    rule.step_interval_s, rule.min_hold_s
                );
                self.release = Some((release_c.to_bits(), text.clone()));
                text
            }
        }
    }
}

/// What every cooling unit's evaluation looks at.
struct UnitInputs<'a> {
    site: &'a Site,
    loads: &'a Loads<'a>,
    snapshot: &'a Snapshot,
    queue: &'a Queue,
    /// The prior state's fitted model and level of each rack, by rack index.
    prior_fits: Vec<Option<&'a RackFit>>,
    prior_levels: Vec<Option<&'a ThermalLevel>>,
    rule: &'a ThermalRule,
    now: Timestamp,
}

/// The fitted model of each rack of `unit`, updated with this tick's readings.
fn rack_views(
    inputs: &UnitInputs<'_>,
    unit: &CoolingUnit,
    out: &mut Decided,
) -> (Vec<RackView>, f64) {
    let UnitInputs {
        site,
        loads,
        snapshot,
        rule,
        now,
        ..
    } = *inputs;
    let cooling = EntityId::new(EntityKind::Cooling, &unit.id);
    let capacity_kw = snapshot
        .observe(&cooling, COOLING_CAPACITY_KW, now)
        .filter(|o| o.usable())
        .map_or(unit.capacity_kw, |o| o.value);
    // a unit's racks mostly follow one another in the site: each is looked for after
    // the one before it first, and found by its id only when it is not there
    let mut after: Option<usize> = None;
    let idx: Vec<usize> = unit
        .racks
        .iter()
        .filter_map(|r| {
            let i = match after {
                Some(i) if site.racks.get(i).is_some_and(|next| next.id == *r) => i,
                _ => site.rack_index(r)?,
            };
            after = Some(i + 1);
            Some(i)
        })
        .collect();
    let unit_w: Option<f64> = idx.iter().map(|&r| loads.racks[r].measured_w).sum();
    let inlet = snapshot.metric_id(INLET_TEMP_C);
    let mut views = Vec::with_capacity(idx.len());
    for &r in &idx {
        let rack = &site.racks[r];
        let load = &loads.racks[r];
        let obs = inlet
            .zip(load.slot)
            .and_then(|(m, s)| snapshot.observe_slot(s, m, now));
        let inlet_c = obs.filter(|o| o.usable()).map(|o| o.value);
        let old = inputs.prior_fits[r];
        let mut fit = old.cloned();
        if let (Some(t), Some(uw), Some(rw)) = (inlet_c, unit_w, load.measured_w) {
            let p = Params::new(unit, capacity_kw, old, rule.fit_max_rms_c);
            let load = Load {
                unit_kw: uw / 1000.0,
                rack_kw: rw / 1000.0,
            };
            fit = Some(thermal_model::update(old, unit, &p, load, t, now));
        }
        // the fit the rack's step shows: this one, else one an earlier unit made
        let shown = match &fit {
            Some(f) => {
                out.fits[r] = Some(f.clone());
                Some(f.clone())
            }
            None => out.fits[r].clone(),
        };
        views.push(RackView {
            rack: r,
            fit: shown,
            inlet_c,
            limit_c: rack.inlet_limit_c,
            params: Params::new(unit, capacity_kw, fit.as_ref(), rule.fit_max_rms_c),
        });
    }
    (views, capacity_kw)
}

fn unit_evaluate(inputs: &UnitInputs<'_>, unit: &CoolingUnit, out: &mut Decided) {
    let UnitInputs {
        site,
        loads,
        snapshot,
        queue,
        rule,
        now,
        ..
    } = *inputs;
    let (views, capacity_kw) = rack_views(inputs, unit, out);
    let horizon_s = rule.horizon_tau * unit.time_constant_s;
    let queued = queue.gpus(now, horizon_s);
    let step = rule.step_pct / 100.0;
    let plans = Plans {
        loads: views.iter().map(|v| loads.rack(v.rack)).collect(),
        views: &views,
        queued,
        horizon_s,
        memo: Default::default(),
    };
    let fits = |f: f64, slack: f64| {
        plans.at(f, |_, p| {
            p.iter()
                .zip(&views)
                .all(|(p, v)| p.is_none_or(|p| p <= v.limit_c - rule.margin_c - slack))
        })
    };
    let levels = grid(step / GRID_PER_STEP);
    let wanted = levels
        .iter()
        .copied()
        .find(|&f| fits(f, 0.0))
        .unwrap_or(0.0);
    // the highest level the hysteresis allows lifting to
    let liftable = levels
        .iter()
        .copied()
        .find(|&f| fits(f, rule.release_below_c))
        .unwrap_or(0.0);
    let signals = unit_state(unit, snapshot, rule, now);
    for vi in 0..views.len() {
        let ctx = RackCtx {
            site,
            plans: &plans,
            views: &views,
            vi,
            horizon_s,
            capacity_kw,
        };
        let prev = inputs.prior_levels[views[vi].rack];
        rack_step(&ctx, prev, rule, &signals, (wanted, liftable), now, out);
    }
}

/// Everything one rack's step looks at.
struct RackCtx<'a> {
    site: &'a Site,
    plans: &'a Plans<'a>,
    views: &'a [RackView],
    vi: usize,
    horizon_s: f64,
    capacity_kw: f64,
}

impl RackCtx<'_> {
    /// The predicted peak under `fraction` as a decision shows it (rounded; NaN without
    /// an inlet reading).
    fn peak_c(&self, fraction: f64) -> f64 {
        let v = &self.views[self.vi];
        match v.inlet_c {
            Some(t) => {
                let predicted = self.plans.at(fraction, |_, p| p[self.vi]);
                round3(predicted.unwrap_or(t).max(t))
            }
            None => f64::NAN,
        }
    }

    /// The values a decision shows: the inlet now, the predicted peak under `fraction`
    /// and when, the margin, and the model's parameters and fit quality.
    fn values(
        &self,
        fraction: f64,
        rule: &ThermalRule,
        fit: Option<&RackFit>,
    ) -> BTreeMap<String, f64> {
        let v = &self.views[self.vi];
        let (unit_kw, predicted) = self.plans.at(fraction, |kw, p| (kw, p[self.vi]));
        let p = &v.params;
        // in the keys' order: the map is made at once, without a search per key
        let mut m: Vec<(&str, f64)> = Vec::with_capacity(15);
        m.push(("capacity_kw", round3(self.capacity_kw)));
        if let Some(f) = fit {
            m.push(("fit_rms_c", round3(f.rms_c)));
            m.push(("fit_samples", f64::from(f.samples)));
        }
        if let Some(t) = v.inlet_c {
            m.push(("inlet_temp_c", round3(t)));
        }
        m.push(("limit_c", v.limit_c));
        m.push(("margin_c", rule.margin_c));
        m.push(("model_fitted", f64::from(u8::from(p.fitted))));
        m.push(("model_offset_c", round3(p.offset_c)));
        m.push(("model_rise_c", round3(p.rise_c)));
        m.push(("model_tau_s", p.tau_s));
        m.push(("planned_heat_kw", round3(unit_kw)));
        if let Some(t) = v.inlet_c {
            let p = predicted.unwrap_or(t);
            m.push(("predicted_peak_c", round3(p.max(t))));
            m.push((
                "predicted_peak_in_s",
                if p > t { self.horizon_s } else { 0.0 },
            ));
        }
        m.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()
    }

    /// The step that tightens the rack from `fraction` to `target` (`why`: the
    /// backstop's reason, empty for the prediction alone).
    fn tighten(
        &self,
        fraction: f64,
        target: f64,
        why: String,
        release_c: f64,
        rule: &ThermalRule,
        out: &mut Decided,
    ) {
        let v = &self.views[self.vi];
        let rack = &self.site.racks[v.rack];
        let mut values = self.values(target, rule, v.fit.as_ref());
        let unchanged = self.peak_c(fraction);
        values.insert("predicted_peak_unchanged_c".into(), unchanged);
        let reason = if why.is_empty() {
            format!(
                "predicted inlet {unchanged:.1} °C within {:.0} s at the current load, against limit {:.1} °C − margin {:.1} °C",
                self.horizon_s, rack.inlet_limit_c, rule.margin_c
            )
        } else {
            why
        };
        let release = out.release(release_c, rule);
        out.steps.push(Step {
            rack: rack.id.clone(),
            fraction: target,
            values,
            reason: format!("{reason}: tighten to {:.0}% of default", target * 100.0),
            release,
        });
    }

    /// The step that relaxes the rack to `f` (released at 1).
    fn relax(&self, f: f64, release_c: f64, rule: &ThermalRule, out: &mut Decided) {
        let v = &self.views[self.vi];
        let rack = &self.site.racks[v.rack];
        let values = self.values(f, rule, v.fit.as_ref());
        let peak = values.get("predicted_peak_c").copied().unwrap_or(f64::NAN);
        let reason = if f >= 1.0 - 1e-9 {
            format!("predicted inlet {peak:.1} °C uncapped: released")
        } else {
            format!(
                "predicted inlet {peak:.1} °C: relax to {:.0}% of default",
                f * 100.0
            )
        };
        let release = out.release(release_c, rule);
        out.steps.push(Step {
            rack: rack.id.clone(),
            fraction: f,
            values,
            reason,
            release,
        });
    }

    /// The rack's prediction under the level `fraction` in force after the tick.
    fn prediction(&self, inlet_c: f64, fraction: f64, rule: &ThermalRule) -> RackPrediction {
        let rack = &self.site.racks[self.views[self.vi].rack];
        let predicted_c = self
            .plans
            .at(fraction, |_, p| p[self.vi])
            .unwrap_or(inlet_c);
        // the inlet moves towards its prediction: the peak is now or at the horizon
        let (peak_c, peak_in_s) = if predicted_c > inlet_c {
            (predicted_c, self.horizon_s)
        } else {
            (inlet_c, 0.0)
        };
        RackPrediction {
            inlet_c,
            predicted_c: round3(predicted_c),
            peak_c: round3(peak_c),
            peak_in_s,
            horizon_s: self.horizon_s,
            limit_c: rack.inlet_limit_c,
            margin_c: rule.margin_c,
        }
    }
}

/// One rack's next level: down at once to what the prediction allows (one step more
/// when a reading is over its limit or the unit is short of headroom), up one step
/// at a time with the hysteresis and the minimum hold. `prev`: the rack's level before.
#[allow(clippy::too_many_arguments)]
fn rack_step(
    ctx: &RackCtx<'_>,
    prev: Option<&ThermalLevel>,
    rule: &ThermalRule,
    signals: &crate::thermal::UnitState,
    (wanted, liftable): (f64, f64),
    now: Timestamp,
    out: &mut Decided,
) {
    let v = &ctx.views[ctx.vi];
    let rack = &ctx.site.racks[v.rack];
    let fraction = prev.map_or(1.0, |p| p.fraction);
    let since = prev.map_or(now, |p| p.since);
    let held_s = now.secs_since(since);
    let may_step = prev.is_none() || held_s >= rule.step_interval_s;
    let (target, why, may_relax) = backstops(
        v.inlet_c,
        rack.inlet_limit_c,
        fraction,
        wanted,
        may_step,
        rule,
        signals,
    );
    // what would lift the cap: written only for the racks that step
    let release_c = rack.inlet_limit_c - rule.margin_c - rule.release_below_c;
    let mut next = ThermalLevel { fraction, since };
    if target < fraction - 1e-9 {
        next = ThermalLevel {
            fraction: target,
            since: now,
        };
        ctx.tighten(fraction, target, why, release_c, rule, out);
    } else if prev.is_some()
        && may_relax
        && liftable > fraction + 1e-9
        && held_s >= rule.min_hold_s.max(rule.step_interval_s)
    {
        let f = liftable.min(fraction + rule.step_pct / 100.0).min(1.0);
        ctx.relax(f, release_c, rule, out);
        next = ThermalLevel {
            fraction: f,
            since: now,
        };
    }
    if let Some(inlet_c) = v.inlet_c {
        out.predictions[v.rack] = Some(ctx.prediction(inlet_c, next.fraction, rule));
    }
    if next.fraction < 1.0 - 1e-9 {
        out.levels[v.rack] = Some(next);
    }
}

/// The reactive backstops on top of the prediction: a reading over its limit, a stale
/// reading (`on_stale`) and a cooling unit short of headroom. Returns the level wanted,
/// why (empty: the prediction alone) and whether the cap may lift.
fn backstops(
    inlet_c: Option<f64>,
    limit_c: f64,
    fraction: f64,
    wanted: f64,
    may_step: bool,
    rule: &ThermalRule,
    signals: &crate::thermal::UnitState,
) -> (f64, String, bool) {
    let step = rule.step_pct / 100.0;
    let mut target = wanted;
    let mut why = String::new();
    let mut may_relax = signals.cool;
    match inlet_c {
        Some(t) if t > limit_c && may_step => {
            target = target.min(fraction - step);
            why = format!("inlet {t:.1} °C over its limit {limit_c:.1} °C");
        }
        Some(_) => {}
        None => match rule.on_stale {
            OnStale::AssumeWorst if may_step => {
                target = target.min(fraction - step);
                why = "inlet reading stale or missing: assuming the worst".into();
            }
            OnStale::AssumeWorst | OnStale::HoldLast => may_relax = false,
            OnStale::Ignore => {}
        },
    }
    if let (Some(h), true) = (&signals.hot, may_step) {
        target = target.min(fraction - step);
        why = if why.is_empty() {
            h.clone()
        } else {
            format!("{why}; {h}")
        };
    }
    (target.max(0.0), why, may_relax)
}

#[cfg(test)]
mod tests;
