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

use telemetry::metric::names::{COOLING_CAPACITY_KW, INLET_TEMP_C, POWER_W};
use telemetry::site::CoolingUnit;
use telemetry::snapshot::Slot;
use telemetry::{EntityId, EntityKind, GpuModel, Job, JobState, Site, Snapshot, Timestamp};

use crate::index::{Held, Index, JobTable};
use crate::plan::{round3, RackPrediction, ThermalLevel};
use crate::policy::{OnStale, ThermalRule};
use crate::thermal::{unit_state, Step};
use crate::thermal_model::{self, Load, Params, RackFit};
use crate::{Cap, State};

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

/// A GPU's power limit under `fraction` of its default limit.
fn limit_w(m: &GpuModel, fraction: f64) -> f64 {
    (m.default_w * fraction).clamp(m.min_w, m.max_w)
}

/// What a queued job adds when it starts on an idle GPU of model `m`, but its share of
/// its node's base power.
fn start_gpu_w(m: &GpuModel, fraction: f64) -> f64 {
    (limit_w(m, fraction).min(m.default_w) - m.idle_w).max(0.0)
}

/// Every rack's planned load, in site order, with the racks' GPUs laid out rack by rack
/// in lists shared by all racks (no lists made per rack).
#[derive(Debug, Default)]
struct Loads<'m> {
    racks: Vec<RackLoad<'m>>,
    /// Each GPU's demand: what it would draw under no cap (a running job's), or its
    /// idle draw; rack by rack, in site order within a rack.
    demands: Vec<f64>,
    /// Each GPU's model, as `demands`.
    models: Vec<&'m GpuModel>,
    /// Each idle GPU's model and the share of its node's base power a job adds when it
    /// starts on it, rack by rack.
    idle: Vec<(&'m GpuModel, f64)>,
}

/// One rack's part of [`Loads`].
#[derive(Debug, Clone, Default)]
struct RackLoad<'m> {
    /// What is not GPU: the rack's power reading less its GPUs' draw, else its nodes'
    /// base power.
    other_w: f64,
    /// Its GPUs in [`Loads::demands`] and [`Loads::models`].
    gpus: std::ops::Range<usize>,
    /// Its idle GPUs in [`Loads::idle`].
    idle: std::ops::Range<usize>,
    /// The rack's power reading, when usable.
    measured_w: Option<f64>,
    /// When every GPU of the rack is of one model: it, what the demands add up to
    /// uncapped, and the highest demand (NaN when the sum is). A cap level then makes
    /// one limit for the rack, and one at or over the highest demand caps nothing.
    uniform: Option<(&'m GpuModel, f64, f64)>,
    /// The rack's slot in the snapshot (its readings are looked up by it).
    slot: Option<Slot>,
}

impl<'m> Loads<'m> {
    /// Rack `r`'s load with its GPUs.
    fn rack(&self, r: usize) -> Rack<'_, 'm> {
        let load = &self.racks[r];
        Rack {
            load,
            demands: &self.demands[load.gpus.clone()],
            models: &self.models[load.gpus.clone()],
            idle: &self.idle[load.idle.clone()],
        }
    }
}

/// A rack's planned load: what is not GPU, its GPUs, and its idle GPUs, in site order.
struct Rack<'l, 'm> {
    load: &'l RackLoad<'m>,
    demands: &'l [f64],
    models: &'l [&'m GpuModel],
    idle: &'l [(&'m GpuModel, f64)],
}

impl<'m> Rack<'_, 'm> {
    fn draw_w(&self, fraction: f64) -> f64 {
        let other_w = self.load.other_w;
        match self.load.uniform {
            Some((m, uncapped_w, max_w)) => {
                let limit = limit_w(m, fraction);
                if max_w <= limit {
                    // every GPU draws its demand: the sum is the uncapped one
                    other_w + uncapped_w
                } else {
                    other_w + self.demands.iter().map(|d| d.min(limit)).sum::<f64>()
                }
            }
            None => {
                other_w
                    + self
                        .demands
                        .iter()
                        .zip(self.models)
                        .map(|(d, m)| d.min(limit_w(m, fraction)))
                        .sum::<f64>()
            }
        }
    }

    /// What `n` and `m` (n ≤ m) queued GPUs add if they start on this rack's idle GPUs,
    /// in one walk: each sum is the one [`Iterator::sum`] makes of its first GPUs.
    fn start_w(&self, fraction: f64, n: usize, m: usize) -> (f64, f64) {
        let m = m.min(self.idle.len());
        let n = n.min(m);
        let start: f64 = std::iter::empty::<f64>().sum();
        let (first, rest) = (&self.idle[..n], &self.idle[n..m]);
        match self.load.uniform {
            Some((model, _, _)) => {
                let gpu_w = start_gpu_w(model, fraction);
                let first_n = first.iter().fold(start, |s, (_, b)| s + (gpu_w + b));
                let all = rest.iter().fold(first_n, |s, (_, b)| s + (gpu_w + b));
                (first_n, all)
            }
            None => {
                let add = |s: f64, (g, b): &(&GpuModel, f64)| s + (start_gpu_w(g, fraction) + b);
                let first_n = first.iter().fold(start, add);
                let all = rest.iter().fold(first_n, add);
                (first_n, all)
            }
        }
    }
}

/// Each rack's planned load, in site order.
fn rack_loads<'m>(
    index: &Index<'m>,
    snapshot: &Snapshot,
    alloc: &JobTable,
    jobs: &[Job],
    prior_caps: &[Option<&Cap>],
    now: Timestamp,
) -> Loads<'m> {
    let site = index.site;
    let mut busy = vec![false; index.gpus.len()];
    for (k, _) in jobs
        .iter()
        .enumerate()
        .filter(|(_, j)| j.state == JobState::Running)
    {
        for i in alloc.of(k) {
            busy[i] = true;
        }
    }
    // each rack's GPUs and idle GPUs, then where each rack's lie in the shared lists
    let mut counts = vec![(0usize, 0usize); site.racks.len()];
    for (g, &b) in index.gpus.iter().zip(&busy) {
        let c = &mut counts[g.rack_index];
        c.0 += 1;
        c.1 += usize::from(!b);
    }
    let (mut gpus_at, mut idle_at) = (0, 0);
    let mut racks: Vec<RackLoad> = counts
        .iter()
        .map(|&(n, idle)| {
            let load = RackLoad {
                gpus: gpus_at..gpus_at + n,
                idle: idle_at..idle_at + idle,
                ..RackLoad::default()
            };
            (gpus_at, idle_at) = (gpus_at + n, idle_at + idle);
            load
        })
        .collect();
    // every place is written below: the first GPU's model only fills them until then
    let filler = index.gpus.first().map(|g| g.model);
    let mut loads = Loads {
        demands: vec![0.0; gpus_at],
        models: filler.map_or_else(Vec::new, |m| vec![m; gpus_at]),
        idle: filler.map_or_else(Vec::new, |m| vec![(m, 0.0); idle_at]),
        racks: Vec::new(),
    };
    let mut fill: Vec<Fill> = racks
        .iter()
        .map(|r| Fill {
            gpu_at: r.gpus.start,
            idle_at: r.idle.start,
            drawn_w: 0.0,
            model: None,
            same: true,
            uncapped_w: std::iter::empty::<f64>().sum(),
            max_w: f64::NEG_INFINITY,
        })
        .collect();
    let power = index.metric_id(POWER_W);
    for (i, g) in index.gpus.iter().enumerate() {
        let m = g.model;
        let draw = power
            .and_then(|p| index.gpu_observe_id(i, p, now))
            .filter(|o| o.usable())
            .map(|o| o.value);
        let is_busy = busy[i];
        let cap = prior_caps[i].map(|c| c.watts);
        // a GPU at its cap would draw more without it: its default limit
        let demand_w = match (draw, cap) {
            (Some(d), Some(c)) if d >= c - (0.03 * c).max(5.0) => m.default_w,
            (Some(d), _) => d,
            (None, _) if is_busy => m.default_w,
            (None, _) => m.idle_w,
        };
        let f = &mut fill[g.rack_index];
        f.drawn_w += draw.unwrap_or(demand_w);
        loads.demands[f.gpu_at] = demand_w;
        loads.models[f.gpu_at] = m;
        f.gpu_at += 1;
        if !is_busy {
            loads.idle[f.idle_at] = (m, 0.5 * g.node.base_w / f64::from(g.node.gpus.max(1)));
            f.idle_at += 1;
        }
        match f.model {
            None => f.model = Some(m),
            Some(first) => f.same &= std::ptr::eq(first, m),
        }
        f.uncapped_w += demand_w;
        f.max_w = f.max_w.max(demand_w);
    }
    let rack_power = snapshot.metric_id(POWER_W);
    for (ri, rack) in site.racks.iter().enumerate() {
        let slot = snapshot.slot(&EntityId::rack(&rack.id));
        let measured = rack_power
            .zip(slot)
            .and_then(|(m, s)| snapshot.observe_slot(s, m, now))
            .filter(|o| o.usable())
            .map(|o| o.value);
        let base: f64 = rack.nodes.iter().map(|&n| site.nodes[n].base_w).sum();
        let load = &mut racks[ri];
        load.slot = slot;
        load.measured_w = measured;
        let f = &fill[ri];
        load.other_w = measured.map_or(base, |w| (w - f.drawn_w).max(0.0));
        // no demand is NaN when their sum is not
        let max_w = if f.uncapped_w.is_nan() {
            f64::NAN
        } else {
            f.max_w
        };
        load.uniform = f.model.filter(|_| f.same).map(|m| (m, f.uncapped_w, max_w));
    }
    loads.racks = racks;
    loads
}

/// One rack's GPUs as [`rack_loads`] walks them in site order: where its next GPU and
/// idle GPU go in [`Loads`], and what [`RackLoad::other_w`] and [`RackLoad::uniform`]
/// are made of.
struct Fill<'m> {
    gpu_at: usize,
    idle_at: usize,
    /// What its GPUs draw: their readings, else their demands.
    drawn_w: f64,
    /// Its first GPU's model, and whether every GPU so far is of that model.
    model: Option<&'m GpuModel>,
    same: bool,
    /// Its GPUs' demands added up (as [`Iterator::sum`] does) and the highest.
    uncapped_w: f64,
    max_w: f64,
}

/// The queued jobs' GPUs as [`Queue::gpus`] counts them (made once per evaluation).
struct Queue {
    /// GPUs of the pending jobs that are not held.
    free: usize,
    /// The held jobs that have a latest start: when each hold must end (the latest
    /// start less the price rule's `release_margin_s`), in order, with the GPUs of the
    /// held jobs whose hold ends by then.
    held_ends: Vec<(Timestamp, usize)>,
}

impl Queue {
    fn new(jobs: &[Job], table: &JobTable, prior: &State, release_margin_s: f64) -> Queue {
        let held = Held::new(&prior.holds, jobs, table);
        let mut free = 0;
        let mut held_ends = Vec::new();
        for (k, j) in jobs
            .iter()
            .enumerate()
            .filter(|(_, j)| matches!(j.state, JobState::Pending | JobState::Held))
        {
            let gpus = j.gpus as usize;
            if held.get(k).is_none() {
                free += gpus;
            } else if let Some(t) = j.latest_start() {
                held_ends.push((t + -release_margin_s, gpus));
            }
        }
        held_ends.sort_unstable();
        let mut total = 0;
        for e in &mut held_ends {
            total += e.1;
            e.1 = total;
        }
        Queue { free, held_ends }
    }

    /// GPUs of the queued jobs that may start within `horizon_s`: pending and not held,
    /// or held with a hold that must end within the horizon (the job's latest start,
    /// less the price rule's `release_margin_s`, falls in it). A hold's lease is
    /// renewed every tick, so it is not taken for its end.
    fn gpus(&self, now: Timestamp, horizon_s: f64) -> usize {
        let by = now + horizon_s;
        let k = self.held_ends.partition_point(|&(t, _)| t <= by);
        self.free + k.checked_sub(1).map_or(0, |k| self.held_ends[k].1)
    }
}

/// One rack of a unit, as the unit's search sees it.
struct RackView {
    rack: usize,
    /// The rack's fitted model after this tick's reading (as in [`Outcome::fits`]).
    fit: Option<RackFit>,
    inlet_c: Option<f64>,
    limit_c: f64,
    params: Params,
}

/// The unit's planned loads under `fraction`: (unit kW, each rack's kW).
fn planned(racks: &[Rack<'_, '_>], fraction: f64, queued: usize) -> Load2 {
    let mut unit_w = 0.0;
    let mut left = queued;
    let mut rack_w = Vec::with_capacity(racks.len());
    for l in racks {
        let n = left.min(l.idle.len());
        left -= n;
        let draw = l.draw_w(fraction);
        // the rack itself: as if every queued GPU landed on it (the worst case)
        let (start_n, start_all) = l.start_w(fraction, n, queued);
        unit_w += draw + start_n;
        rack_w.push(draw + start_all);
    }
    Load2 {
        unit_kw: unit_w / 1000.0,
        rack_kw: rack_w.into_iter().map(|w| w / 1000.0).collect(),
    }
}

struct Load2 {
    unit_kw: f64,
    rack_kw: Vec<f64>,
}

/// The unit's planned heat (kW) and the predicted inlet of each rack after `horizon_s`
/// under `fraction`.
fn predictions(
    loads: &[Rack<'_, '_>],
    racks: &[RackView],
    fraction: f64,
    queued: usize,
    horizon_s: f64,
) -> (f64, Vec<Option<f64>>) {
    let l = planned(loads, fraction, queued);
    let p = racks
        .iter()
        .zip(&l.rack_kw)
        .map(|(v, &rack_kw)| {
            v.inlet_c.map(|t| {
                v.params.predict_c(
                    t,
                    Load {
                        unit_kw: l.unit_kw,
                        rack_kw,
                    },
                    horizon_s,
                )
            })
        })
        .collect();
    (l.unit_kw, p)
}

/// A cap level (its bits), the unit's planned kW under it and each rack's predicted inlet.
type PlanAt = (u64, f64, Vec<Option<f64>>);

/// One unit's planned heat and predicted inlets per cap level, each level made once
/// (the searches and the decisions' values try the same levels).
struct Plans<'a> {
    /// The loads of the unit's racks, as `views`.
    loads: Vec<Rack<'a, 'a>>,
    views: &'a [RackView],
    queued: usize,
    horizon_s: f64,
    memo: std::cell::RefCell<Vec<PlanAt>>,
}

impl Plans<'_> {
    /// `read(unit kW, each rack's predicted inlet)` under `fraction`.
    fn at<R>(&self, fraction: f64, read: impl FnOnce(f64, &[Option<f64>]) -> R) -> R {
        let mut memo = self.memo.borrow_mut();
        let at = match memo.iter().position(|(k, _, _)| *k == fraction.to_bits()) {
            Some(i) => i,
            None => {
                let (unit_kw, p) = predictions(
                    &self.loads,
                    self.views,
                    fraction,
                    self.queued,
                    self.horizon_s,
                );
                memo.push((fraction.to_bits(), unit_kw, p));
                memo.len() - 1
            }
        };
        read(memo[at].1, &memo[at].2)
    }
}

/// Cap levels tried per `step_pct`: caps fall to the finer level the prediction needs.
const GRID_PER_STEP: f64 = 4.0;

/// The cap levels tried, from uncapped down: 1, 1 − step, …, 0 (each GPU's minimum).
fn grid(step: f64) -> Vec<f64> {
    let mut v = vec![1.0];
    let mut f: f64 = 1.0;
    while f - step > 1e-9 {
        f -= step;
        v.push((f * 1e6).round() / 1e6);
    }
    v.push(0.0);
    v
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
    let fit = v.fit.as_ref();
    let mut next = ThermalLevel { fraction, since };
    if target < fraction - 1e-9 {
        next = ThermalLevel {
            fraction: target,
            since: now,
        };
        let mut values = ctx.values(target, rule, fit);
        let unchanged = ctx.peak_c(fraction);
        values.insert("predicted_peak_unchanged_c".into(), unchanged);
        let reason = if why.is_empty() {
            format!(
                "predicted inlet {unchanged:.1} °C within {:.0} s at the current load, against limit {:.1} °C − margin {:.1} °C",
                ctx.horizon_s, rack.inlet_limit_c, rule.margin_c
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
    } else if prev.is_some()
        && may_relax
        && liftable > fraction + 1e-9
        && held_s >= rule.min_hold_s.max(rule.step_interval_s)
    {
        let f = liftable.min(fraction + rule.step_pct / 100.0).min(1.0);
        let values = ctx.values(f, rule, fit);
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
        next = ThermalLevel {
            fraction: f,
            since: now,
        };
    }
    if let Some(inlet_c) = v.inlet_c {
        let predicted_c = ctx
            .plans
            .at(next.fraction, |_, p| p[ctx.vi])
            .unwrap_or(inlet_c);
        // the inlet moves towards its prediction: the peak is now or at the horizon
        let (peak_c, peak_in_s) = if predicted_c > inlet_c {
            (predicted_c, ctx.horizon_s)
        } else {
            (inlet_c, 0.0)
        };
        out.predictions[v.rack] = Some(RackPrediction {
            inlet_c,
            predicted_c: round3(predicted_c),
            peak_c: round3(peak_c),
            peak_in_s,
            horizon_s: ctx.horizon_s,
            limit_c: rack.inlet_limit_c,
            margin_c: rule.margin_c,
        });
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
