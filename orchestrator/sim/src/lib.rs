//! The simulated facility: what `powerplane demo` drives, and the parts the backtest's
//! trace-driven facility (`backtest::facility`) shares with it.
//!
//! GPUs draw power and make progress as Zeus measured on real A40s under each power
//! limit, and go back to their default limit when a cap's lease ends ([`gpu`]); nodes
//! draw a base load; rack inlets follow the heat load of their cooling unit with a
//! first-order lag ([`thermal`]); jobs arrive, wait for GPUs (or for a hold to end,
//! [`hold`]) and run; the facility reports what a real one would ([`readings`]).
//! This module's [`Facility`] is the generator-driven front end: its jobs come from a
//! seeded [`workload::Generator`]. It is deterministic: one seed, one run.
//!
//! # Layout
//!
//! - this module: the generator-driven facility the demo drives.
//! - [`gpu`], [`thermal`], [`hold`], [`readings`]: the parts both front ends share:
//!   GPUs under caps with leases, rack inlets and cooling, holds, the readings.
//! - [`events`]: the replays' event-driven evaluations, debounced as `serve`'s.
//! - [`workload`]: the seeded job generator.
//! - [`demo`]: `powerplane demo`, the simulated facility under the control loop.
//! - [`backtest`]: `powerplane backtest`, a job trace and real prices replayed under the
//!   policy and under a no-policy baseline, on the trace-driven front end.
#![forbid(unsafe_code)]

pub mod backtest;
pub mod demo;
pub use common::{curves, rng};
pub mod events;
mod fault;
pub(crate) mod gpu;
pub(crate) mod hold;
pub(crate) mod readings;
pub(crate) mod thermal;
pub mod workload;

pub use fault::{Fault, FaultError};
pub use thermal::{cooling_kw_per_kw, thermal_targets, thermal_targets_by_unit};

use std::collections::BTreeMap;

use policies::State;
use telemetry::prices::Series;
use telemetry::{Job, JobState, Sample, Site, Timestamp};

use control::{Actuator, Telemetry};
use curves::Curve;
use gpu::Gpus;
use readings::{GpuReadings, Readings};
use workload::{Generated, Generator, Workload};

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

struct SimJob {
    gen: Generated,
    done_s: f64,
    hold_until: Option<Timestamp>,
    /// While suspended: the suspension's lease (the job keeps its GPUs, runs nothing).
    suspended_until: Option<Timestamp>,
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
    gpus: Gpus,
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
        let gpus = Gpus::of(&site);
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
                suspended_until: None,
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
                suspended_until: None,
            });
            let gap = self.gen.next_gap_s();
            self.next_arrival = self.next_arrival + gap;
        }
        self.progress(dt_s);
        self.update_power();
        for g in self.gpus.iter_mut() {
            g.energy_j += g.power_w * dt_s;
        }
        self.update_thermal(dt_s);
    }

    fn expire_leases(&mut self, now: Timestamp) {
        self.stats.leases_expired += self.gpus.expire_leases(now);
        for j in &mut self.jobs {
            hold::expire(&mut j.gen.job, &mut j.hold_until, now);
            hold::expire_suspension(&mut j.gen.job, &mut j.suspended_until, now);
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
        for g in self.gpus.iter_mut() {
            if let Some(j) = g.job.filter(|&j| self.jobs[j].suspended_until.is_none()) {
                let (_, s) = g.busy(j, &self.curves[self.jobs[j].gen.curve]);
                // a job runs at the pace of its slowest GPU
                let e = speed.entry(j).or_insert(1.0);
                *e = e.min(s);
                if g.capped() {
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
                for g in self.gpus.iter_mut() {
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
        for g in self.gpus.iter_mut() {
            let job = g.job.filter(|&j| self.jobs[j].suspended_until.is_none());
            g.power_w = match job {
                Some(j) => g.busy(j, &self.curves[self.jobs[j].gen.curve]).0,
                None => g.idle_w(),
            };
            rack_w[g.rack] += g.power_w;
            let e = node_busy.entry(g.node).or_default();
            e.0 += u32::from(job.is_some());
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
                rack_w[ri] += gpu::node_base_w(self.site.nodes[ni].base_w, share);
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
        thermal::follow(&self.site, &mut self.inlet_c, &target, dt_s);
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
        self.gpus.iter().filter(|g| g.capped()).count()
    }

    /// Every job that is not finished, plus the ones that finished since `since`.
    pub fn jobs(&self) -> Vec<Job> {
        self.jobs.iter().map(|j| j.gen.job.clone()).collect()
    }
}

impl Telemetry for Facility {
    fn poll(&mut self, now: Timestamp) -> Vec<Sample> {
        Readings {
            site: &self.site,
            gpus: &self.gpus,
            gpu_readings: GpuReadings::Full,
            rack_power_w: &self.rack_power_w,
            inlet_c: &self.inlet_c,
            cooling_power_w: &self.cooling_power_w,
            prices: &self.prices,
            carbon: &self.carbon,
            capacity_factors: self.capacity_factors(),
            demand: None,
        }
        .samples(now, "sim")
    }
}

impl Actuator for Facility {
    fn apply(&mut self, state: &State, _now: Timestamp) -> Vec<String> {
        self.gpus.apply_caps(state);
        for j in &mut self.jobs {
            let lease = state.holds.get(&j.gen.job.id).map(|h| h.lease_until);
            hold::apply(&mut j.gen.job, &mut j.hold_until, lease);
            let lease = state.suspended.get(&j.gen.job.id).map(|h| h.lease_until);
            hold::suspend(&mut j.gen.job, &mut j.suspended_until, lease);
        }
        Vec::new()
    }
}

#[cfg(test)]
mod tests;
