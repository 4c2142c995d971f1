//! The backtest's facility: the simulator's trace-driven front end, built for long
//! traces.
//!
//! It runs on the parts the demo's generator-driven `sim::Facility` runs on: the GPUs
//! of `sim::gpu` (Zeus's measured power/speed curves per power limit, each GPU on its
//! model's own (`curves::CurveSet`), caps and the
//! leases that revert them, node base power that follows how busy the node is), the
//! rack inlet model of `sim::thermal` with each cooling unit's thermal lag, the holds
//! of `sim::hold` and the readings of `sim::readings`. What it adds: jobs from a trace
//! instead of a generator, with the job bookkeeping indexed so that a tick costs what
//! is waiting and running, not what the trace holds; jobs that finish at their exact
//! end inside a tick, so energy and waits do not depend on the tick; node power states
//! (`nodes`); and the run's energy, cost and carbon (`step`, `totals`).

mod nodes;
mod schedule;
mod step;
mod totals;

pub use nodes::{NodeMode, NodePowerModel};
pub use totals::{Point, Totals};

use policies::node_power::Power;
use policies::State;
use telemetry::fasthash::FnvMap;
use telemetry::prices::Series;
use telemetry::{Job, JobState, Sample, Site, Timestamp};

use crate::curves::{CurveSet, Measured};
use crate::gpu::{self, Gpus};
use crate::hold;
use crate::readings::{GpuReadings, Readings};
use control::{Actuator, Telemetry};
use nodes::Node;

/// A job of the replay: what the scheduler knows, and what only the simulator knows.
#[derive(Debug, Clone)]
pub struct SimJob {
    pub job: Job,
    /// Run time at full power, seconds.
    pub work_s: f64,
    pub done_s: f64,
    pub curve: usize,
    pub gpu_model: Option<String>,
    hold_until: Option<Timestamp>,
    /// While suspended: the lease of the suspension.
    suspended_until: Option<Timestamp>,
    /// When each of its suspensions began.
    pub suspended_at: Vec<Timestamp>,
    gpus: Vec<usize>,
}

impl SimJob {
    pub fn new(job: Job, work_s: f64, curve: usize, gpu_model: Option<String>) -> Self {
        SimJob {
            job,
            work_s,
            done_s: 0.0,
            curve,
            gpu_model,
            hold_until: None,
            suspended_until: None,
            suspended_at: Vec::new(),
            gpus: Vec::new(),
        }
    }
}

/// Per-step working vectors, kept between steps (a step runs three times a tick).
#[derive(Default)]
struct Scratch {
    busy_s: Vec<f64>,
    gpu_j: Vec<f64>,
    rack_j: Vec<f64>,
    node_busy_s: Vec<f64>,
    node_busy: Vec<u32>,
    still: Vec<usize>,
}

/// Where a series stops covering time: its last step, held as long as the step before
/// it (an hour for a single point).
fn series_end(s: &Series) -> Option<Timestamp> {
    let p = s.points();
    let last = p.last()?.0;
    let step = match p.len() {
        0 | 1 => 3600.0,
        n => last.secs_since(p[n - 2].0).max(1.0),
    };
    Some(last + step)
}

pub struct Facility {
    site: Site,
    curves: CurveSet,
    /// Each GPU's set in `curves` (its model's measurements; `None`: a model Zeus did
    /// not measure).
    curve_set: Vec<Option<u8>>,
    gpus: Gpus,
    job_index: FnvMap<String, usize>,
    /// Per job: the lease of the hold the last plan gave it (scratch for `apply`).
    hold_lease: Vec<Option<Timestamp>>,
    nodes: Vec<Node>,
    pub jobs: Vec<SimJob>,
    next_arrival: usize,
    waiting: Vec<usize>,
    /// The jobs that hold GPUs: running, or suspended (`suspended` of them).
    running: Vec<usize>,
    suspended: usize,
    /// Jobs whose scheduler view (state, start, end, GPUs) changed since the controller
    /// last looked, with a flag per job so each is listed once.
    changed: Vec<usize>,
    is_changed: Vec<bool>,
    inlet_c: Vec<f64>,
    rack_power_w: Vec<f64>,
    cooling_power_w: Vec<f64>,
    prices: Series,
    carbon: Series,
    /// Where each series stops covering time (the last step held for as long as the
    /// step before it): past it there is no price, never the last one held.
    price_end: Option<Timestamp>,
    carbon_end: Option<Timestamp>,
    node_mode: NodeMode,
    node_model: NodePowerModel,
    /// Power-downs issued, for the controller's rate limit.
    recent_downs: Vec<Timestamp>,
    /// The facility's limit (the contract, or the feeds' usable capacity).
    budget_kw: f64,
    /// Each cooling unit's share of its capacity at a time.
    cooling_factor: Box<dyn Fn(Timestamp) -> Vec<f64>>,
    now: Timestamp,
    start: Timestamp,
    /// With a demand charge: the billing period's peak as the ledger follows it (IT
    /// power over the tariff's demand interval, else over each tick), which the
    /// controller reads as `period_peak_w` and `day_peak_w`.
    demand: Option<control::demand::DemandTracker>,
    /// With grid events in the scenario: the simulated meter (IT plus cooling) per
    /// step, and the events the facility publishes as site readings.
    pub meter: Option<super::grid::Meter>,
    pub grid: Option<super::grid::Schedule>,
    scratch: Scratch,
    pub totals: Totals,
}

impl Facility {
    /// A facility at `start` with `jobs` to arrive (sorted by submission here).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        site: Site,
        curves: CurveSet,
        prices: Series,
        carbon: Series,
        mut jobs: Vec<SimJob>,
        budget_kw: f64,
        cooling_factor: Box<dyn Fn(Timestamp) -> Vec<f64>>,
        start: Timestamp,
    ) -> Self {
        jobs.sort_by(|a, b| (a.job.submit_time, &a.job.id).cmp(&(b.job.submit_time, &b.job.id)));
        let gpus = Gpus::of(&site);
        let nodes = nodes::of(&site, &gpus, start);
        let racks = site.racks.len();
        let job_index = jobs
            .iter()
            .enumerate()
            .map(|(i, j)| (j.job.id.clone(), i))
            .collect();
        let mut f = Facility {
            job_index,
            hold_lease: vec![None; jobs.len()],
            inlet_c: vec![22.0; racks],
            rack_power_w: vec![0.0; racks],
            cooling_power_w: vec![0.0; site.cooling.len()],
            site,
            curve_set: gpus
                .iter()
                .map(|g| curves.set_of(&g.model.name).map(|s| s as u8))
                .collect(),
            curves,
            gpus,
            nodes,
            jobs,
            next_arrival: 0,
            waiting: Vec::new(),
            running: Vec::new(),
            suspended: 0,
            changed: Vec::new(),
            is_changed: Vec::new(),
            price_end: series_end(&prices),
            carbon_end: series_end(&carbon),
            prices,
            carbon,
            node_mode: NodeMode::AlwaysOn,
            node_model: NodePowerModel::default(),
            recent_downs: Vec::new(),
            budget_kw,
            cooling_factor,
            now: start,
            start,
            demand: None,
            meter: None,
            grid: None,
            scratch: Scratch::default(),
            totals: Totals::default(),
        };
        f.arrive(start);
        f.update_power();
        let (target, cooling) =
            crate::thermal_targets_by_unit(&f.site, &f.rack_power_w, &(f.cooling_factor)(start));
        f.inlet_c = target;
        f.cooling_power_w = cooling;
        f
    }

    pub fn now(&self) -> Timestamp {
        self.now
    }

    /// Sets how nodes are powered (before the first step).
    pub fn with_node_power(mut self, mode: NodeMode, model: NodePowerModel) -> Self {
        self.node_mode = mode;
        self.node_model = model;
        self
    }

    /// Keeps the meter and publishes `events` (none: the meter and the readings that say
    /// no event is in force), before the first step.
    pub fn with_grid(mut self, events: Vec<super::grid::DrEvent>) -> Self {
        self.meter = Some(super::grid::Meter::default());
        self.grid = Some(super::grid::Schedule::new(events));
        self
    }

    /// IT plus cooling power now, W: what the utility's meter reads.
    pub fn meter_w(&self) -> f64 {
        self.it_power_w() + self.cooling_power_w.iter().sum::<f64>()
    }

    /// The price at `t`, or none past the end of the series.
    pub fn price_at(&self, t: Timestamp) -> Option<f64> {
        if self.price_end.is_some_and(|e| t >= e) {
            return None;
        }
        self.prices.at(t)
    }

    fn carbon_at(&self, t: Timestamp) -> Option<f64> {
        if self.carbon_end.is_some_and(|e| t >= e) {
            return None;
        }
        self.carbon.at(t)
    }

    /// Whether every job has arrived and finished.
    pub fn done(&self) -> bool {
        self.next_arrival == self.jobs.len() && self.waiting.is_empty() && self.running.is_empty()
    }

    /// Whether nothing waits and nothing more will arrive (only running jobs are left).
    pub fn draining(&self) -> bool {
        self.next_arrival == self.jobs.len() && self.waiting.is_empty()
    }

    pub fn next_arrival(&self) -> Option<Timestamp> {
        self.jobs.get(self.next_arrival).map(|j| j.job.submit_time)
    }

    fn arrive(&mut self, upto: Timestamp) {
        while let Some(j) = self.jobs.get(self.next_arrival) {
            if j.job.submit_time > upto {
                break;
            }
            self.waiting.push(self.next_arrival);
            self.touch(self.next_arrival);
            self.next_arrival += 1;
        }
    }

    /// Advances the world by `dt_s`: the scheduler starts what may start now, jobs run
    /// (and end at their exact time), power, energy, cost and inlets follow, jobs
    /// submitted meanwhile join the queue (the controller sees them before they start).
    pub fn step(&mut self, dt_s: f64) {
        self.step_with(dt_s, true);
    }

    /// A step without the scheduler's cycle (nor the resumes it asks for): the physics
    /// only, for the readings a replay takes between ticks; the scheduler still cycles
    /// once per tick.
    pub fn advance(&mut self, dt_s: f64) {
        self.step_with(dt_s, false);
    }

    fn expire_leases(&mut self, now: Timestamp) {
        self.gpus.expire_leases(now);
        for k in 0..self.waiting.len() {
            let ji = self.waiting[k];
            let j = &mut self.jobs[ji];
            if hold::expire(&mut j.job, &mut j.hold_until, now) {
                self.touch(ji);
            }
        }
        if self.suspended > 0 {
            for k in 0..self.running.len() {
                let ji = self.running[k];
                let j = &mut self.jobs[ji];
                if hold::expire_suspension(&mut j.job, &mut j.suspended_until, now) {
                    self.suspended -= 1;
                    self.touch(ji);
                }
            }
        }
    }

    /// Suspends the running jobs the plan suspends (until their lease ends unrenewed)
    /// and resumes those it no longer does.
    fn apply_suspensions(&mut self, state: &State, now: Timestamp) {
        for k in 0..self.running.len() {
            let ji = self.running[k];
            let lease = state
                .suspended
                .get(&self.jobs[ji].job.id)
                .map(|h| h.lease_until);
            let j = &mut self.jobs[ji];
            let was = j.suspended_until.is_some();
            if hold::suspend(&mut j.job, &mut j.suspended_until, lease) {
                if was {
                    self.suspended -= 1;
                } else {
                    j.suspended_at.push(now);
                    self.suspended += 1;
                }
                self.touch(ji);
            }
        }
    }

    /// Whether job `ji` is suspended (holds its GPUs, runs nothing on them).
    fn is_suspended(&self, ji: usize) -> bool {
        self.jobs[ji].suspended_until.is_some()
    }

    /// Notes that the scheduler's view of a job changed.
    fn touch(&mut self, ji: usize) {
        if self.is_changed.len() < self.jobs.len() {
            self.is_changed.resize(self.jobs.len(), false);
        }
        if !self.is_changed[ji] {
            self.is_changed[ji] = true;
            self.changed.push(ji);
        }
    }

    fn update_power(&mut self) {
        let mut rack_w = std::mem::take(&mut self.rack_power_w);
        rack_w.clear();
        rack_w.resize(self.site.racks.len(), 0.0);
        let mut node_busy = std::mem::take(&mut self.scratch.node_busy);
        node_busy.clear();
        node_busy.resize(self.nodes.len(), 0);
        let any_suspended = self.suspended > 0;
        for (gi, g) in self.gpus.iter_mut().enumerate() {
            let off = matches!(self.nodes[g.node].power, Power::Off { .. } | Power::Failed);
            let suspended = any_suspended
                && g.job
                    .is_some_and(|j| self.jobs[j].suspended_until.is_some());
            g.power_w = match g.job {
                Some(_) if suspended => g.idle_w(),
                Some(j) => {
                    let m = curve_of(&self.curves, &self.curve_set, gi, self.jobs[j].curve);
                    g.busy_on(j, m).0
                }
                None if off => 0.0,
                None => g.idle_w(),
            };
            rack_w[g.rack] += g.power_w;
            node_busy[g.node] += u32::from(g.job.is_some() && !suspended);
        }
        for (ni, n) in self.nodes.iter().enumerate() {
            rack_w[n.rack] += match n.power {
                Power::On => {
                    let share = f64::from(node_busy[ni]) / n.gpus.len().max(1) as f64;
                    gpu::node_base_w(n.base_w, share)
                }
                Power::Booting { .. } | Power::ShuttingDown { .. } => n.base_w,
                Power::Off { .. } | Power::Failed => self.node_model.off_w,
            };
        }
        self.rack_power_w = rack_w;
        self.scratch.node_busy = node_busy;
    }

    pub fn it_power_w(&self) -> f64 {
        self.rack_power_w.iter().sum()
    }

    pub fn point(&self) -> Point {
        let held = self
            .waiting
            .iter()
            .filter(|&&i| self.jobs[i].job.state == JobState::Held)
            .count();
        Point {
            t: self.now,
            it_kw: self.it_power_w() / 1000.0,
            cooling_kw: self.cooling_power_w.iter().sum::<f64>() / 1000.0,
            budget_kw: self.budget_kw,
            price: self.price_at(self.now).unwrap_or(0.0),
            hottest_inlet_c: self.inlet_c.iter().copied().fold(f64::MIN, f64::max),
            waiting: self.waiting.len(),
            held,
            running: self.running.len(),
            busy_gpus: self.gpus.iter().filter(|g| g.job.is_some()).count(),
        }
    }

    /// The scheduler's view for the controller: the jobs that arrived, started, finished
    /// or were held or let go since the last look (the registry keeps the rest).
    pub fn take_jobs(&mut self) -> Vec<Job> {
        let changed = std::mem::take(&mut self.changed);
        let mut out = Vec::with_capacity(changed.len());
        for i in changed {
            self.is_changed[i] = false;
            out.push(self.jobs[i].job.clone());
        }
        out
    }

    /// Forgets the changes the controller would have been told about (the baseline has
    /// no controller).
    pub fn forget_changes(&mut self) {
        for i in std::mem::take(&mut self.changed) {
            self.is_changed[i] = false;
        }
    }

    pub fn prices(&self) -> &Series {
        &self.prices
    }

    pub fn carbon(&self) -> &Series {
        &self.carbon
    }

    pub fn site(&self) -> &Site {
        &self.site
    }

    pub fn gpu_count(&self) -> usize {
        self.gpus.len()
    }

    pub fn inlet_c(&self) -> &[f64] {
        &self.inlet_c
    }
}

impl Telemetry for Facility {
    fn poll(&mut self, now: Timestamp) -> Vec<Sample> {
        let mut samples = self.readings(now);
        let meter_w = self.meter_w();
        if let (Some(grid), Some(meter)) = (self.grid.as_mut(), self.meter.as_ref()) {
            samples.extend(grid.samples(&self.site, meter, meter_w, now));
        }
        samples
    }
}

impl Facility {
    fn readings(&self, now: Timestamp) -> Vec<Sample> {
        Readings {
            site: &self.site,
            gpus: &self.gpus,
            gpu_readings: GpuReadings::Power,
            rack_power_w: &self.rack_power_w,
            inlet_c: &self.inlet_c,
            cooling_power_w: &self.cooling_power_w,
            prices: &self.prices,
            carbon: &self.carbon,
            capacity_factors: (self.cooling_factor)(now),
            demand: self.demand.as_ref(),
        }
        .samples(now, "backtest")
    }
}

impl Actuator for Facility {
    fn apply(&mut self, state: &State, now: Timestamp) -> Vec<String> {
        self.gpus.apply_caps(state);
        let mut marked = Vec::with_capacity(state.holds.len());
        for (id, h) in &state.holds {
            if let Some(&ji) = self.job_index.get(id) {
                self.hold_lease[ji] = Some(h.lease_until);
                marked.push(ji);
            }
        }
        for k in 0..self.waiting.len() {
            let ji = self.waiting[k];
            let j = &mut self.jobs[ji];
            let before = j.job.state;
            hold::apply(&mut j.job, &mut j.hold_until, self.hold_lease[ji]);
            if self.jobs[ji].job.state != before {
                self.touch(ji);
            }
        }
        for ji in marked {
            self.hold_lease[ji] = None;
        }
        if !state.suspended.is_empty() || self.suspended > 0 {
            self.apply_suspensions(state, now);
        }
        self.update_power();
        Vec::new()
    }
}

/// Workload `w` as GPU `g`'s model measured it.
#[inline]
fn curve_of<'c>(curves: &'c CurveSet, sets: &[Option<u8>], g: usize, w: usize) -> Measured<'c> {
    curves.curve(sets[g].map(usize::from), w)
}
