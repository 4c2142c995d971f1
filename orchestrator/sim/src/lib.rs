//! The simulated facility: what `powerplane demo` (and later the backtest) drives.
//!
//! GPUs draw power and make progress as Zeus measured on real A40s under each power
//! limit; nodes draw a base load; rack inlets follow the heat load of their cooling unit
//! with a first-order lag; jobs arrive, wait for GPUs (or for a hold to end) and run.
//! It is deterministic: one seed, one run.
//!
//! # Layout
//!
//! - this module: the simulated facility: GPUs that respond to caps as measured by Zeus,
//!   racks whose inlets follow heat load, a price series and arriving jobs.
//! - [`events`]: the replays' event-driven evaluations, debounced as `serve`'s.
//! - [`workload`]: the seeded job generator.
//! - [`demo`]: `powerplane demo`, the simulated facility under the control loop.
//! - [`backtest`]: `powerplane backtest`, a job trace and real prices replayed under the
//!   policy and under a no-policy baseline.
#![forbid(unsafe_code)]

pub mod backtest;
pub mod demo;

pub use common::{curves, rng};
pub mod events;
mod fault;
pub mod workload;

pub use fault::Fault;

use std::collections::BTreeMap;

use integrations::prices::Series;
use policies::State;
use telemetry::metric::names::*;
use telemetry::{EntityId, EntityKind, GpuModel, Job, JobState, Sample, Site, Timestamp};

use control::{Actuator, Telemetry};
use curves::Curve;
use workload::{Generated, Generator, Workload};

/// Cooling electrical power per kW of heat removed (1 / coefficient of performance).
const CRAH_KW_PER_KW: f64 = 0.25;
const CDU_KW_PER_KW: f64 = 0.12;

/// What a cooling unit draws per kW of heat it removes.
pub fn cooling_kw_per_kw(unit: &telemetry::site::CoolingUnit) -> f64 {
    match unit.kind {
        telemetry::site::CoolingKind::Crah => CRAH_KW_PER_KW,
        telemetry::site::CoolingKind::Cdu => CDU_KW_PER_KW,
    }
}

/// The thermal model of the simulated facility, shared by the demo and the backtest:
/// where each rack's inlet is heading for the racks' power draw (W), and the electrical
/// power each cooling unit spends (W). `capacity_factor` scales every cooling unit's
/// capacity (a heat wave: 0.7).
///
/// Each unit's racks share its heat load: the inlet rises linearly with load up to the
/// unit's capacity (`full_load_rise_c` at full capacity), faster above it
/// (`overload_rise_c_per_kw`), and a rack drawing more than the unit's average sits
/// hotter by the unit's `rack_skew_c_per_kw`. Inlets follow their target with the unit's time
/// constant (first-order lag).
pub fn thermal_targets(
    site: &Site,
    rack_power_w: &[f64],
    capacity_factor: f64,
) -> (Vec<f64>, Vec<f64>) {
    thermal_targets_by_unit(
        site,
        rack_power_w,
        &vec![capacity_factor; site.cooling.len()],
    )
}

/// [`thermal_targets`] with a capacity factor per cooling unit (a unit with a failed
/// pump or a capacity drop has its own).
pub fn thermal_targets_by_unit(
    site: &Site,
    rack_power_w: &[f64],
    capacity_factor: &[f64],
) -> (Vec<f64>, Vec<f64>) {
    let mut target = vec![22.0; site.racks.len()];
    let mut cooling = vec![0.0; site.cooling.len()];
    for (ci, unit) in site.cooling.iter().enumerate() {
        let idx: Vec<usize> = unit
            .racks
            .iter()
            .filter_map(|r| site.rack_index(r))
            .collect();
        let capacity_kw =
            (unit.capacity_kw * capacity_factor.get(ci).copied().unwrap_or(1.0)).max(1e-6);
        let heat_kw: f64 = idx.iter().map(|&i| rack_power_w[i]).sum::<f64>() / 1000.0;
        let avg_kw = heat_kw / idx.len().max(1) as f64;
        let base = unit.supply_temp_c
            + unit.full_load_rise_c * heat_kw.min(capacity_kw) / capacity_kw
            + unit.overload_rise_c_per_kw * (heat_kw - capacity_kw).max(0.0);
        for &i in &idx {
            target[i] = base + unit.rack_skew_c_per_kw * (rack_power_w[i] / 1000.0 - avg_kw);
        }
        let per_kw = cooling_kw_per_kw(unit);
        cooling[ci] = heat_kw.min(capacity_kw) * per_kw * 1000.0;
    }
    (target, cooling)
}

/// What the engine plans with in the simulator: the next `horizon_s` of the price and
/// carbon series (as `serve` hands it the next 48 h of its feed).
pub fn forecast(
    prices: &Series,
    carbon: &Series,
    now: Timestamp,
    horizon_s: f64,
) -> policies::Forecast {
    let horizon = now.plus_secs(horizon_s);
    let window = |s: &Series| {
        let pts = s.points();
        let from = pts.partition_point(|(t, _)| *t <= now).saturating_sub(1);
        let to = pts.partition_point(|(t, _)| *t < horizon);
        let step = match pts.len() {
            n if n >= 2 => pts[n - 1].0.secs_since(pts[n - 2].0),
            _ => 3600.0,
        };
        policies::StepSeries::new(pts[from..to.max(from)].to_vec(), step)
    };
    policies::Forecast {
        price: window(prices),
        carbon: window(carbon),
        stale: false,
    }
}

struct SimGpu {
    id: EntityId,
    node: usize,
    rack: usize,
    model: GpuModel,
    limit_w: f64,
    lease_until: Option<Timestamp>,
    job: Option<usize>,
    power_w: f64,
    energy_j: f64,
}

struct SimJob {
    gen: Generated,
    done_s: f64,
    hold_until: Option<Timestamp>,
}

/// Totals the simulator keeps for the summary.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SimStats {
    pub jobs_submitted: usize,
    pub jobs_started: usize,
    pub jobs_finished: usize,
    pub deadline_misses: usize,
    /// Sum over GPUs of seconds run under a limit below default.
    pub capped_gpu_s: f64,
    /// GPU-seconds of work delivered (at full-speed equivalent).
    pub work_gpu_s: f64,
    /// Leases that ran out before the controller renewed them.
    pub leases_expired: usize,
}

pub struct Facility {
    site: Site,
    curves: Vec<Curve>,
    gpus: Vec<SimGpu>,
    jobs: Vec<SimJob>,
    inlet_c: Vec<f64>,
    rack_power_w: Vec<f64>,
    cooling_power_w: Vec<f64>,
    prices: Series,
    carbon: Series,
    gen: Generator,
    next_arrival: Timestamp,
    start: Timestamp,
    now: Timestamp,
    faults: Vec<Fault>,
    pub stats: SimStats,
}

impl Facility {
    pub fn new(
        site: Site,
        prices: Series,
        carbon: Series,
        workload: Workload,
        seed: u64,
        start: Timestamp,
    ) -> Self {
        let curves = curves::a40();
        let mut gen = Generator::new(seed, workload, curves.len());
        let gpus = site
            .gpus()
            .into_iter()
            .map(|g| SimGpu {
                id: g.id.into_owned(),
                node: g.node_index,
                rack: g.rack_index,
                model: g.model.clone(),
                limit_w: g.model.default_w,
                lease_until: None,
                job: None,
                power_w: g.model.idle_w,
                energy_j: 0.0,
            })
            .collect();
        let first_gap = gen.next_gap_s();
        let racks = site.racks.len();
        let mut f = Facility {
            inlet_c: site
                .racks
                .iter()
                .map(|r| site.cooling_of(&r.id).map_or(22.0, |c| c.supply_temp_c))
                .collect(),
            rack_power_w: vec![0.0; racks],
            cooling_power_w: vec![0.0; site.cooling.len()],
            site,
            curves,
            gpus,
            jobs: Vec::new(),
            prices,
            carbon,
            gen,
            next_arrival: start + first_gap,
            start,
            now: start,
            faults: Vec::new(),
            stats: SimStats::default(),
        };
        f.warm_start();
        f.update_power();
        f.settle_thermal();
        f
    }

    /// Fills the facility to its initial share with jobs part-way through.
    fn warm_start(&mut self) {
        let target = (self.gpus.len() as f64 * self.gen.initial_fill()) as usize;
        let mut busy = 0;
        let mut tries = 0;
        while busy < target && tries < 10_000 {
            tries += 1;
            let back = self.gen.uniform() * 3600.0;
            let mut g = self.gen.job(self.now + -back);
            g.job.deadline = g.job.deadline.map(|d| d + back);
            let done = g.work_s * self.gen.uniform() * 0.8;
            if busy + g.job.gpus as usize > self.gpus.len() {
                continue;
            }
            let idx = self.jobs.len();
            self.stats.jobs_submitted += 1;
            self.jobs.push(SimJob {
                gen: g,
                done_s: done,
                hold_until: None,
            });
            if self.place(idx) {
                busy += self.jobs[idx].gen.job.gpus as usize;
            }
        }
    }

    pub fn now(&self) -> Timestamp {
        self.now
    }

    /// The facility with cooling faults to inject.
    pub fn with_faults(mut self, faults: Vec<Fault>) -> Self {
        self.faults = faults;
        self
    }

    /// Each cooling unit's share of its capacity now (faults in force).
    fn capacity_factors(&self) -> Vec<f64> {
        let at = self.now.secs_since(self.start);
        self.site
            .cooling
            .iter()
            .map(|u| {
                self.faults
                    .iter()
                    .filter(|f| f.unit == u.id && f.at_s <= at)
                    .map(|f| f.factor)
                    .fold(1.0, f64::min)
            })
            .collect()
    }

    /// Power and inlets settled under the limits in force, as if the facility had run
    /// under them for a while (a warm start under control).
    pub fn settle(&mut self) {
        self.update_power();
        self.settle_thermal();
    }

    pub fn site(&self) -> &Site {
        &self.site
    }

    pub fn price_at(&self, t: Timestamp) -> Option<f64> {
        self.prices.at(t)
    }

    pub fn carbon_at(&self, t: Timestamp) -> Option<f64> {
        self.carbon.at(t)
    }

    /// The next 48 hours of the simulated price and carbon feeds.
    pub fn forecast(&self, now: Timestamp) -> policies::Forecast {
        forecast(&self.prices, &self.carbon, now, 48.0 * 3600.0)
    }

    /// Advances the world by `dt_s` seconds.
    pub fn step(&mut self, dt_s: f64) {
        self.step_with(dt_s, true);
    }

    /// A step without the scheduler's cycle: the physics only (for the readings a
    /// replay takes between ticks; the scheduler still cycles once per tick).
    pub fn advance(&mut self, dt_s: f64) {
        self.step_with(dt_s, false);
    }

    fn step_with(&mut self, dt_s: f64, cycle: bool) {
        let end = self.now + dt_s;
        self.expire_leases(end);
        // the scheduler's cycle starts what was already queued; jobs arriving during this
        // step wait for the next one, so the controller sees every job pending first
        self.now = end;
        if cycle {
            self.schedule();
        }
        while self.next_arrival <= end {
            let g = self.gen.job(self.next_arrival);
            self.stats.jobs_submitted += 1;
            self.jobs.push(SimJob {
                gen: g,
                done_s: 0.0,
                hold_until: None,
            });
            let gap = self.gen.next_gap_s();
            self.next_arrival = self.next_arrival + gap;
        }
        self.progress(dt_s);
        self.update_power();
        for g in &mut self.gpus {
            g.energy_j += g.power_w * dt_s;
        }
        self.update_thermal(dt_s);
    }

    fn expire_leases(&mut self, now: Timestamp) {
        for g in &mut self.gpus {
            if g.lease_until.is_some_and(|l| l <= now) {
                // an agent that hears nothing restores the default limit
                g.limit_w = g.model.default_w;
                g.lease_until = None;
                self.stats.leases_expired += 1;
            }
        }
        for j in &mut self.jobs {
            if j.hold_until.is_some_and(|h| h <= now) {
                j.hold_until = None;
                if j.gen.job.state == JobState::Held {
                    j.gen.job.state = JobState::Pending;
                }
            }
        }
    }

    /// Starts waiting jobs on free GPUs: priority first, then submission order.
    fn schedule(&mut self) {
        let mut waiting: Vec<usize> = (0..self.jobs.len())
            .filter(|&i| self.jobs[i].gen.job.state == JobState::Pending)
            .collect();
        waiting.sort_by_key(|&i| {
            (
                -self.jobs[i].gen.job.priority,
                self.jobs[i].gen.job.submit_time,
                i,
            )
        });
        for i in waiting {
            self.place(i);
        }
    }

    /// Places a job on free GPUs, whole nodes first for big jobs. Returns whether it started.
    fn place(&mut self, idx: usize) -> bool {
        let want = self.jobs[idx].gen.job.gpus as usize;
        let mut free_by_node: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
        for (gi, g) in self.gpus.iter().enumerate() {
            if g.job.is_none() {
                free_by_node.entry(g.node).or_default().push(gi);
            }
        }
        let free: usize = free_by_node.values().map(Vec::len).sum();
        if free < want {
            return false;
        }
        // best fit: the node with the fewest free GPUs that still fits, else the fullest-free first
        let mut nodes: Vec<(usize, Vec<usize>)> = free_by_node.into_iter().collect();
        nodes.sort_by_key(|(n, v)| {
            (
                if v.len() >= want { 0 } else { 1 },
                if v.len() >= want {
                    v.len()
                } else {
                    usize::MAX - v.len()
                },
                *n,
            )
        });
        let chosen: Vec<usize> = nodes.into_iter().flat_map(|(_, v)| v).take(want).collect();
        for &gi in &chosen {
            self.gpus[gi].job = Some(idx);
        }
        let now = self.now;
        let job = &mut self.jobs[idx].gen.job;
        job.allocated = chosen.iter().map(|&gi| self.gpus[gi].id.clone()).collect();
        job.state = JobState::Running;
        job.start_time = Some(now);
        self.stats.jobs_started += 1;
        true
    }

    fn progress(&mut self, dt_s: f64) {
        let mut speed: BTreeMap<usize, f64> = BTreeMap::new();
        for g in &self.gpus {
            if let Some(j) = g.job {
                let curve = &self.curves[self.jobs[j].gen.curve];
                let (_, s) = curve.at(g.limit_w / g.model.max_w);
                // a job runs at the pace of its slowest GPU
                let e = speed.entry(j).or_insert(1.0);
                *e = e.min(s);
                if g.limit_w < g.model.default_w - 0.5 {
                    self.stats.capped_gpu_s += dt_s;
                }
            }
        }
        for (j, s) in speed {
            let job = &mut self.jobs[j];
            let step = (dt_s * s).min(job.gen.work_s - job.done_s).max(0.0);
            job.done_s += step;
            self.stats.work_gpu_s += step * f64::from(job.gen.job.gpus);
            if job.done_s >= job.gen.work_s - 1e-9 {
                job.gen.job.state = JobState::Finished;
                job.gen.job.end_time = Some(self.now);
                if job.gen.job.deadline.is_some_and(|d| d < self.now) {
                    self.stats.deadline_misses += 1;
                }
                for g in &mut self.gpus {
                    if g.job == Some(j) {
                        g.job = None;
                    }
                }
                self.stats.jobs_finished += 1;
            }
        }
    }

    fn update_power(&mut self) {
        let mut rack_w = vec![0.0; self.site.racks.len()];
        let mut node_busy: BTreeMap<usize, (u32, u32)> = BTreeMap::new();
        for g in &mut self.gpus {
            g.power_w = match g.job {
                Some(j) => {
                    let (p, _) = self.curves[self.jobs[j].gen.curve].at(g.limit_w / g.model.max_w);
                    (p * g.model.max_w).max(g.model.idle_w)
                }
                None => g.model.idle_w.min(g.limit_w),
            };
            rack_w[g.rack] += g.power_w;
            let e = node_busy.entry(g.node).or_default();
            e.0 += u32::from(g.job.is_some());
            e.1 += 1;
        }
        for (ri, rack) in self.site.racks.iter().enumerate() {
            for &ni in &rack.nodes {
                let (busy, total) = node_busy.get(&ni).copied().unwrap_or((0, 0));
                let share = if total > 0 {
                    f64::from(busy) / f64::from(total)
                } else {
                    0.0
                };
                rack_w[ri] += self.site.nodes[ni].base_w * (0.5 + 0.5 * share);
            }
        }
        self.rack_power_w = rack_w;
    }

    /// Where each rack's inlet is heading, and the cooling power spent.
    fn thermal_targets(&mut self) -> Vec<f64> {
        let factors = self.capacity_factors();
        let (target, cooling) = thermal_targets_by_unit(&self.site, &self.rack_power_w, &factors);
        self.cooling_power_w = cooling;
        target
    }

    fn update_thermal(&mut self, dt_s: f64) {
        let target = self.thermal_targets();
        for (ri, rack) in self.site.racks.iter().enumerate() {
            let tau = self
                .site
                .cooling_of(&rack.id)
                .map_or(300.0, |c| c.time_constant_s);
            let k = 1.0 - (-dt_s / tau).exp();
            self.inlet_c[ri] += (target[ri] - self.inlet_c[ri]) * k;
        }
    }

    fn settle_thermal(&mut self) {
        self.inlet_c = self.thermal_targets();
    }

    pub fn it_power_w(&self) -> f64 {
        self.rack_power_w.iter().sum()
    }

    pub fn cooling_power_w(&self) -> f64 {
        self.cooling_power_w.iter().sum()
    }

    pub fn rack_power_w(&self) -> &[f64] {
        &self.rack_power_w
    }

    pub fn inlet_c(&self) -> &[f64] {
        &self.inlet_c
    }

    /// GPUs whose limit is below default now.
    pub fn capped_gpus(&self) -> usize {
        self.gpus
            .iter()
            .filter(|g| g.limit_w < g.model.default_w - 0.5)
            .count()
    }

    /// Every job that is not finished, plus the ones that finished since `since`.
    pub fn jobs(&self) -> Vec<Job> {
        self.jobs.iter().map(|j| j.gen.job.clone()).collect()
    }
}

impl Telemetry for Facility {
    fn poll(&mut self, now: Timestamp) -> Vec<Sample> {
        let src = "sim";
        let mut out = Vec::with_capacity(self.gpus.len() * 3 + self.site.racks.len() * 2 + 8);
        for g in &self.gpus {
            out.push(Sample::new(
                EntityId::clone(&g.id),
                POWER_W,
                g.power_w,
                now,
                src,
            ));
            out.push(Sample::new(
                EntityId::clone(&g.id),
                ENERGY_J,
                g.energy_j,
                now,
                src,
            ));
            out.push(Sample::new(
                EntityId::clone(&g.id),
                POWER_LIMIT_W,
                g.limit_w,
                now,
                src,
            ));
        }
        facility_samples(
            &FacilityReadings {
                site: &self.site,
                rack_power_w: &self.rack_power_w,
                inlet_c: &self.inlet_c,
                cooling_power_w: &self.cooling_power_w,
                it_power_w: self.it_power_w(),
                prices: &self.prices,
                carbon: &self.carbon,
            },
            now,
            src,
            &mut out,
        );
        // what each cooling unit reports it can remove (its BMC's capacity reading)
        for (unit, f) in self.site.cooling.iter().zip(self.capacity_factors()) {
            out.push(Sample::new(
                EntityId::new(EntityKind::Cooling, &unit.id),
                COOLING_CAPACITY_KW,
                unit.capacity_kw * f,
                now,
                src,
            ));
        }
        out
    }
}

/// What a simulated facility reports above its GPUs, as both the demo's and the
/// backtest's simulators publish it each tick.
pub(crate) struct FacilityReadings<'a> {
    pub site: &'a Site,
    pub rack_power_w: &'a [f64],
    pub inlet_c: &'a [f64],
    pub cooling_power_w: &'a [f64],
    pub it_power_w: f64,
    pub prices: &'a Series,
    pub carbon: &'a Series,
}

/// Rack power and inlet, cooling power, the site's IT power, and the price and carbon
/// intensity in force, as samples.
pub(crate) fn facility_samples(
    r: &FacilityReadings<'_>,
    now: Timestamp,
    src: &str,
    out: &mut Vec<Sample>,
) {
    for (ri, rack) in r.site.racks.iter().enumerate() {
        let e = EntityId::rack(&rack.id);
        out.push(Sample::new(
            e.clone(),
            POWER_W,
            r.rack_power_w[ri],
            now,
            src,
        ));
        out.push(Sample::new(e, INLET_TEMP_C, r.inlet_c[ri], now, src));
    }
    for (ci, unit) in r.site.cooling.iter().enumerate() {
        let e = EntityId::new(EntityKind::Cooling, &unit.id);
        out.push(Sample::new(
            e,
            COOLING_POWER_W,
            r.cooling_power_w[ci],
            now,
            src,
        ));
    }
    let site = r.site.site_entity();
    out.push(Sample::new(site.clone(), POWER_W, r.it_power_w, now, src));
    if let Some(p) = r.prices.at(now) {
        out.push(Sample::new(site.clone(), PRICE_PER_KWH, p, now, src));
    }
    if let Some(c) = r.carbon.at(now) {
        out.push(Sample::new(site, CARBON_G_PER_KWH, c, now, src));
    }
}

impl Actuator for Facility {
    fn apply(&mut self, state: &State, _now: Timestamp) -> Vec<String> {
        for g in &mut self.gpus {
            match state.caps.get(&g.id) {
                Some(c) => {
                    g.limit_w = g.model.clamp_limit(c.watts);
                    g.lease_until = Some(c.lease_until);
                }
                None => {
                    g.limit_w = g.model.default_w;
                    g.lease_until = None;
                }
            }
        }
        for j in &mut self.jobs {
            let job = &mut j.gen.job;
            match state.holds.get(&job.id) {
                Some(h) if matches!(job.state, JobState::Pending | JobState::Held) => {
                    job.state = JobState::Held;
                    j.hold_until = Some(h.lease_until);
                }
                _ => {
                    if job.state == JobState::Held {
                        job.state = JobState::Pending;
                    }
                    j.hold_until = None;
                }
            }
        }
        Vec::new()
    }
}

#[cfg(test)]
mod tests;
