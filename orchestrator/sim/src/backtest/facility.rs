//! The backtest's facility: the demo's simulated facility, built for long traces.
//!
//! The same physics as `sim::Facility` (Zeus's measured A40 power/speed curves per power
//! limit, node base power that follows how busy the node is, the demo's rack inlet
//! model with each cooling unit's thermal lag, leases that revert caps and holds), with
//! the job bookkeeping indexed so that a tick costs what is waiting and running, not
//! what the trace holds. Jobs come from a trace instead of a generator; a run finishes
//! jobs at their exact end inside a tick, so energy and waits do not depend on the tick.

use telemetry::fasthash::FnvMap;

use integrations::prices::Series;
use integrations::store::Account;
use policies::node_power::{NodeAction, NodeView, Power};
use policies::State;
use telemetry::metric::names::*;
use telemetry::{EntityId, GpuModel, Job, JobState, Sample, Site, Timestamp};

use crate::curves::Curve;
use control::{Actuator, Telemetry};

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
            gpus: Vec::new(),
        }
    }
}

struct Gpu {
    id: EntityId,
    node: usize,
    rack: usize,
    model: GpuModel,
    limit_w: f64,
    lease_until: Option<Timestamp>,
    job: Option<usize>,
    power_w: f64,
    /// What the GPU draws (W) and the speed it runs at under its job and limit, for
    /// the (job, limit bits) they were found for: the curve is read again only when
    /// either changes.
    busy: Option<(usize, u64, f64, f64)>,
}

impl Gpu {
    /// Power (W, at least idle) and relative speed of this GPU running job `ji` (of
    /// curve `curve`) at its limit.
    fn busy(&mut self, ji: usize, curve: &Curve) -> (f64, f64) {
        let bits = self.limit_w.to_bits();
        match self.busy {
            Some((j, b, w, speed)) if j == ji && b == bits => (w, speed),
            _ => {
                let (p, speed) = curve.at(self.limit_w / self.model.max_w);
                let w = (p * self.model.max_w).max(self.model.idle_w);
                self.busy = Some((ji, bits, w, speed));
                (w, speed)
            }
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

struct Node {
    id: String,
    model: String,
    gpus: Vec<usize>,
    free: u32,
    base_w: f64,
    rack: usize,
    power: Power,
    /// Since when it has had no work (None: it runs work).
    idle_since: Option<Timestamp>,
    /// Managed mode: the lease of its power-down; the node comes back when it ends.
    off_lease: Option<Timestamp>,
}

/// How the facility's nodes are powered.
#[derive(Debug, Clone, PartialEq)]
pub enum NodeMode {
    /// Every node always on (no management).
    AlwaysOn,
    /// Slurm-style power saving: a node idle for `suspend_s` is suspended, and resumed
    /// when a waiting job needs it (no price awareness, no planning).
    PowerSave { suspend_s: f64 },
    /// Powered down and up by the controller (`apply_node_actions`); like Slurm, a
    /// waiting job that finds no node on resumes the nodes it needs, so a controller
    /// that stops never leaves nodes off that work waits for.
    Managed,
}

/// Node power physics: boot and shutdown times, what an off node draws. A node
/// booting or shutting down draws its full base power and its GPUs' idle power.
#[derive(Debug, Clone, PartialEq)]
pub struct NodePowerModel {
    pub boot_s: f64,
    pub boot_s_by_model: std::collections::BTreeMap<String, f64>,
    pub shutdown_s: f64,
    pub off_w: f64,
}

impl Default for NodePowerModel {
    fn default() -> Self {
        let r = policies::node_power::NodePowerRule::default();
        NodePowerModel {
            boot_s: r.boot_s,
            boot_s_by_model: r.boot_s_by_model,
            shutdown_s: r.shutdown_s,
            off_w: r.off_w,
        }
    }
}

impl NodePowerModel {
    fn boot_s(&self, model: &str) -> f64 {
        self.boot_s_by_model
            .get(model)
            .copied()
            .unwrap_or(self.boot_s)
    }
}

/// What the facility did over a run.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Totals {
    pub it_kwh: f64,
    pub cooling_kwh: f64,
    pub cost: f64,
    pub carbon_kg: f64,
    pub peak_kw: f64,
    pub budget_violation_s: f64,
    pub thermal_violation_s: f64,
    pub capped_gpu_s: f64,
    /// GPU-seconds of work delivered (full-speed equivalent).
    pub work_gpu_s: f64,
    /// Seconds of the run the price series did not cover (counted at 0).
    pub price_gap_s: f64,
    /// Seconds of the run the carbon series did not cover.
    pub carbon_gap_s: f64,
    /// Energy cost alone (without the demand charge).
    pub energy_cost: f64,
    /// Highest IT power per billing period (calendar month in the site's time zone),
    /// in order: (`YYYY-MM`, kW).
    pub period_peaks_kw: Vec<(String, f64)>,
    /// Node power-downs and power-ups, and the energy boots and shutdowns drew.
    pub power_downs: u64,
    /// Nodes brought back because their power-down's lease ended unrenewed.
    pub lease_resumes: u64,
    pub power_ups: u64,
    pub transition_kwh: f64,
    /// Node-hours spent off.
    pub node_off_h: f64,
    /// The part of the energy that jobs drew: busy GPUs, the share of node base power
    /// that follows load, and the cooling of both (the idle floor left out).
    pub job_kwh: f64,
    pub job_cost: f64,
    /// GPU-hours of work delivered per day of the run (from its start).
    pub gpu_hours_per_day: Vec<f64>,
}

/// The facility at one tick, for charts.
#[derive(Debug, Clone, PartialEq)]
pub struct Point {
    pub t: Timestamp,
    pub it_kw: f64,
    pub cooling_kw: f64,
    pub budget_kw: f64,
    pub price: f64,
    pub hottest_inlet_c: f64,
    pub waiting: usize,
    pub held: usize,
    pub running: usize,
    pub busy_gpus: usize,
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
    curves: Vec<Curve>,
    gpus: Vec<Gpu>,
    gpu_index: FnvMap<EntityId, usize>,
    job_index: FnvMap<String, usize>,
    /// Per job: the lease of the hold the last plan gave it (scratch for `apply`).
    hold_lease: Vec<Option<Timestamp>>,
    nodes: Vec<Node>,
    pub jobs: Vec<SimJob>,
    next_arrival: usize,
    waiting: Vec<usize>,
    running: Vec<usize>,
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
    scratch: Scratch,
    pub totals: Totals,
}

impl Facility {
    /// A facility at `start` with `jobs` to arrive (sorted by submission here).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        site: Site,
        curves: Vec<Curve>,
        prices: Series,
        carbon: Series,
        mut jobs: Vec<SimJob>,
        budget_kw: f64,
        cooling_factor: Box<dyn Fn(Timestamp) -> Vec<f64>>,
        start: Timestamp,
    ) -> Self {
        jobs.sort_by(|a, b| (a.job.submit_time, &a.job.id).cmp(&(b.job.submit_time, &b.job.id)));
        let mut gpus = Vec::new();
        let mut nodes: Vec<Node> = site
            .nodes
            .iter()
            .map(|n| Node {
                id: n.id.clone(),
                model: n.gpu_model.clone(),
                gpus: Vec::new(),
                free: 0,
                base_w: n.base_w,
                rack: 0,
                power: Power::On,
                idle_since: Some(start),
                off_lease: None,
            })
            .collect();
        for g in site.gpus() {
            let node = &mut nodes[g.node_index];
            node.gpus.push(gpus.len());
            node.free += 1;
            node.rack = g.rack_index;
            gpus.push(Gpu {
                id: g.id.into_owned(),
                node: g.node_index,
                rack: g.rack_index,
                model: g.model.clone(),
                limit_w: g.model.default_w,
                lease_until: None,
                job: None,
                power_w: g.model.idle_w,
                busy: None,
            });
        }
        let gpu_index = gpus
            .iter()
            .enumerate()
            .map(|(i, g)| (EntityId::clone(&g.id), i))
            .collect();
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
            curves,
            gpus,
            gpu_index,
            nodes,
            jobs,
            next_arrival: 0,
            waiting: Vec::new(),
            running: Vec::new(),
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

    /// Nodes as the node power decision sees them.
    pub fn node_views(&self) -> Vec<NodeView> {
        self.nodes
            .iter()
            .map(|n| NodeView {
                id: n.id.clone(),
                model: n.model.clone(),
                gpus: n.gpus.len() as u32,
                free: n.free,
                power: n.power,
                idle_since: n.idle_since,
            })
            .collect()
    }

    /// The jobs waiting (pending or held).
    pub fn waiting_jobs(&self) -> impl Iterator<Item = &SimJob> {
        self.waiting.iter().map(|&i| &self.jobs[i])
    }

    /// Power-downs in the minute before `now`.
    pub fn downs_last_min(&self, now: Timestamp) -> u32 {
        self.recent_downs
            .iter()
            .filter(|t| now.secs_since(**t) < 60.0)
            .count() as u32
    }

    /// Carries out the controller's node actions (managed mode): a power-down only of
    /// a node that is on and idle, a power-up only of a node that is off.
    /// Every node this controller keeps off gets its lease renewed to `now + lease_s`.
    pub fn apply_node_actions(&mut self, actions: &[NodeAction], now: Timestamp, lease_s: f64) {
        if self.node_mode != NodeMode::Managed {
            return;
        }
        for n in &mut self.nodes {
            if n.off_lease.is_some() {
                n.off_lease = Some(now + lease_s);
            }
        }
        for a in actions {
            let Some(ni) = self.nodes.iter().position(|n| n.id == a.node()) else {
                continue;
            };
            let n = &mut self.nodes[ni];
            match a {
                NodeAction::Down { .. } => {
                    if n.power == Power::On && n.free as usize == n.gpus.len() {
                        n.power = Power::ShuttingDown { since: now };
                        n.off_lease = Some(now + lease_s);
                        self.totals.power_downs += 1;
                        self.recent_downs.push(now);
                    }
                }
                NodeAction::Up { .. } => {
                    if matches!(n.power, Power::Off { .. }) {
                        n.power = Power::Booting { since: now };
                        n.off_lease = None;
                        self.totals.power_ups += 1;
                    }
                }
                NodeAction::Failed { .. } => n.power = Power::Failed,
            }
        }
        self.recent_downs.retain(|t| now.secs_since(*t) < 60.0);
        self.update_power();
    }

    /// Boots and shutdowns that completed by `now`; power saving's suspends.
    fn advance_node_power(&mut self, now: Timestamp) {
        for n in &mut self.nodes {
            match n.power {
                Power::Booting { since }
                    if now.secs_since(since) >= self.node_model.boot_s(&n.model) - 1e-6 =>
                {
                    n.power = Power::On;
                    n.idle_since = Some(now);
                }
                Power::ShuttingDown { since }
                    if now.secs_since(since) >= self.node_model.shutdown_s - 1e-6 =>
                {
                    n.power = Power::Off { since: now };
                }
                // the controller stopped renewing the power-down: the node comes back
                Power::Off { .. } if n.off_lease.is_some_and(|l| l <= now) => {
                    n.power = Power::Booting { since: now };
                    n.off_lease = None;
                    self.totals.power_ups += 1;
                    self.totals.lease_resumes += 1;
                }
                _ => {}
            }
        }
        if let NodeMode::PowerSave { suspend_s } = self.node_mode {
            for n in &mut self.nodes {
                if n.power == Power::On
                    && n.free as usize == n.gpus.len()
                    && n.idle_since.is_some_and(|s| now.secs_since(s) >= suspend_s)
                {
                    n.power = Power::ShuttingDown { since: now };
                    self.totals.power_downs += 1;
                }
            }
        }
    }

    /// Resumes off nodes for waiting jobs that no node on (or booting) can take, in
    /// queue order, as Slurm's power saving resumes the nodes it allocates.
    fn resume_on_demand(&mut self, now: Timestamp) {
        if self.node_mode == NodeMode::AlwaysOn {
            return;
        }
        // GPUs still free per node on or booting, taken by the waiting jobs in turn
        let mut left: Vec<u32> = self
            .nodes
            .iter()
            .map(|n| match n.power {
                Power::On | Power::Booting { .. } => n.free,
                _ => 0,
            })
            .collect();
        for k in 0..self.waiting.len() {
            let j = &self.jobs[self.waiting[k]];
            if j.job.state != JobState::Pending {
                continue;
            }
            let model = j.gpu_model.clone();
            let mut want = j.job.gpus;
            let fits = |n: &Node| model.as_ref().is_none_or(|m| &n.model == m);
            for (ni, n) in self.nodes.iter().enumerate() {
                if want == 0 {
                    break;
                }
                if fits(n) {
                    let take = left[ni].min(want);
                    left[ni] -= take;
                    want -= take;
                }
            }
            for (n, l) in self.nodes.iter_mut().zip(left.iter_mut()) {
                if want == 0 {
                    break;
                }
                if matches!(n.power, Power::Off { .. } | Power::ShuttingDown { .. })
                    && model.as_ref().is_none_or(|m| &n.model == m)
                {
                    // a node shutting down finishes first, then boots
                    n.power = Power::Booting { since: now };
                    n.off_lease = None;
                    self.totals.power_ups += 1;
                    let g = n.gpus.len() as u32;
                    let take = g.min(want);
                    *l = g - take;
                    want -= take;
                }
            }
        }
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

    fn step_with(&mut self, dt_s: f64, cycle: bool) {
        let t0 = self.now;
        let t1 = t0 + dt_s;
        self.advance_node_power(t0);
        if cycle {
            self.schedule(t0);
            self.resume_on_demand(t0);
        }
        self.update_power();
        let it_w: f64 = self.rack_power_w.iter().sum();
        self.totals.peak_kw = self.totals.peak_kw.max(it_w / 1000.0);
        let period = t0
            .to_datetime()
            .with_timezone(&self.site.timezone)
            .format("%Y-%m")
            .to_string();
        let interval_s = self
            .site
            .tariff
            .as_ref()
            .filter(|t| t.demand_charge_per_kw.is_some())
            .map(|t| t.demand_interval_s);
        if let Some(interval_s) = interval_s {
            let tz = self.site.timezone;
            let d = self.demand.get_or_insert_with(|| {
                control::demand::DemandTracker::new(interval_s.unwrap_or(dt_s), tz)
            });
            let kwh = it_w / 1000.0 * dt_s / 3600.0;
            d.add(t0, t1, [(Account::Idle, None, kwh)]);
            let _ = d.take_changed();
        }
        match interval_s {
            // the tariff's demand interval: the highest interval average
            Some(Some(_)) => {
                if let Some(p) = self.demand.as_ref().and_then(|d| d.current(t0)) {
                    match self.totals.period_peaks_kw.last_mut() {
                        Some((per, kw)) if *per == p.period => *kw = kw.max(p.it_kw),
                        _ => self
                            .totals
                            .period_peaks_kw
                            .push((p.period.clone(), p.it_kw)),
                    }
                }
            }
            _ => match self.totals.period_peaks_kw.last_mut() {
                Some((p, kw)) if *p == period => *kw = kw.max(it_w / 1000.0),
                _ => self.totals.period_peaks_kw.push((period, it_w / 1000.0)),
            },
        }
        if it_w / 1000.0 > self.budget_kw + 1e-9 {
            self.totals.budget_violation_s += dt_s;
        }
        // progress; a job that ends inside the step frees its GPUs at its end
        let mut scratch = std::mem::take(&mut self.scratch);
        let (busy_s, gpu_j) = (&mut scratch.busy_s, &mut scratch.gpu_j);
        busy_s.clear();
        busy_s.resize(self.gpus.len(), 0.0);
        gpu_j.clear();
        gpu_j.resize(self.gpus.len(), 0.0);
        let mut still = std::mem::take(&mut scratch.still);
        still.clear();
        let running = std::mem::take(&mut self.running);
        for &ji in &running {
            let job = &self.jobs[ji];
            let curve = &self.curves[job.curve];
            let mut speed: f64 = 1.0;
            for &g in &job.gpus {
                speed = speed.min(self.gpus[g].busy(ji, curve).1);
            }
            let speed = speed.max(1e-3);
            let left = job.work_s - job.done_s;
            let run_s = (left / speed).min(dt_s);
            let job = &mut self.jobs[ji];
            job.done_s = (job.done_s + run_s * speed).min(job.work_s);
            let work = run_s * speed * f64::from(job.job.gpus);
            self.totals.work_gpu_s += work;
            let day = (t0.secs_since(self.start) / 86400.0).max(0.0) as usize;
            if self.totals.gpu_hours_per_day.len() <= day {
                self.totals.gpu_hours_per_day.resize(day + 1, 0.0);
            }
            self.totals.gpu_hours_per_day[day] += work / 3600.0;
            for &g in &job.gpus {
                busy_s[g] = run_s;
                gpu_j[g] = self.gpus[g].power_w * run_s;
            }
            if job.done_s >= job.work_s - 1e-6 {
                job.job.state = JobState::Finished;
                job.job.end_time = Some(t0 + run_s);
                let end = t0 + run_s;
                for &g in &job.gpus {
                    self.gpus[g].job = None;
                    let n = &mut self.nodes[self.gpus[g].node];
                    n.free += 1;
                    if n.free as usize == n.gpus.len() {
                        n.idle_since = Some(end);
                    }
                }
                self.touch(ji);
            } else {
                still.push(ji);
            }
        }
        self.running = still;
        scratch.still = running;
        // energy over the step: busy GPUs for their busy time, idle for the rest
        let (busy_s, gpu_j) = (&scratch.busy_s, &scratch.gpu_j);
        let rack_j = &mut scratch.rack_j;
        rack_j.clear();
        rack_j.resize(self.site.racks.len(), 0.0);
        let node_busy_s = &mut scratch.node_busy_s;
        node_busy_s.clear();
        node_busy_s.resize(self.nodes.len(), 0.0);
        for (gi, g) in self.gpus.iter_mut().enumerate() {
            let idle_w = if matches!(self.nodes[g.node].power, Power::Off { .. } | Power::Failed) {
                0.0
            } else {
                g.model.idle_w.min(g.limit_w)
            };
            let j = gpu_j[gi] + idle_w * (dt_s - busy_s[gi]);
            rack_j[g.rack] += j;
            node_busy_s[g.node] += busy_s[gi];
            if busy_s[gi] > 0.0 && g.limit_w < g.model.default_w - 0.5 {
                self.totals.capped_gpu_s += busy_s[gi];
            }
        }
        let mut job_j: f64 = gpu_j.iter().sum();
        for (ni, n) in self.nodes.iter().enumerate() {
            match n.power {
                Power::On => {
                    let share = node_busy_s[ni] / (dt_s * n.gpus.len().max(1) as f64);
                    rack_j[n.rack] += n.base_w * (0.5 + 0.5 * share) * dt_s;
                    job_j += n.base_w * 0.5 * share * dt_s;
                }
                Power::Booting { .. } | Power::ShuttingDown { .. } => {
                    let idle: f64 = n.gpus.iter().map(|&g| self.gpus[g].model.idle_w).sum();
                    let j = (n.base_w + idle) * dt_s;
                    rack_j[n.rack] += n.base_w * dt_s;
                    self.totals.transition_kwh += j / 3.6e6;
                }
                Power::Off { .. } | Power::Failed => {
                    rack_j[n.rack] += self.node_model.off_w * dt_s;
                    self.totals.node_off_h += dt_s / 3600.0;
                }
            }
        }
        let avg_rack_w: Vec<f64> = rack_j.iter().map(|j| j / dt_s).collect();
        let factors = (self.cooling_factor)(t0);
        let (target, cooling) = crate::thermal_targets_by_unit(&self.site, &avg_rack_w, &factors);
        self.cooling_power_w = cooling;
        // one inlet and one target per rack
        for (ri, (inlet, t)) in self.inlet_c.iter_mut().zip(&target).enumerate() {
            let tau = self
                .site
                .cooling_index_of(ri)
                .map_or(300.0, |c| self.site.cooling[c].time_constant_s);
            let k = 1.0 - (-dt_s / tau).exp();
            *inlet += (t - *inlet) * k;
        }
        if self
            .inlet_c
            .iter()
            .zip(&self.site.racks)
            .any(|(t, r)| *t > r.inlet_limit_c)
        {
            self.totals.thermal_violation_s += dt_s;
        }
        let it_kwh = scratch.rack_j.iter().sum::<f64>() / 3.6e6;
        let cooling_kwh = self.cooling_power_w.iter().sum::<f64>() * dt_s / 3.6e6;
        self.totals.it_kwh += it_kwh;
        self.totals.cooling_kwh += cooling_kwh;
        let job_kwh = job_j / 3.6e6 * (1.0 + cooling_kwh / it_kwh.max(1e-12));
        self.totals.job_kwh += job_kwh;
        match self.price_at(t0) {
            Some(p) => {
                self.totals.cost += p * (it_kwh + cooling_kwh);
                self.totals.energy_cost += p * (it_kwh + cooling_kwh);
                self.totals.job_cost += p * job_kwh;
            }
            None => self.totals.price_gap_s += dt_s,
        }
        match self.carbon_at(t0) {
            Some(c) => self.totals.carbon_kg += c * (it_kwh + cooling_kwh) / 1000.0,
            None => self.totals.carbon_gap_s += dt_s,
        }
        self.scratch = scratch;
        self.now = t1;
        self.expire_leases(t1);
        self.arrive(t1);
        self.update_power();
    }

    fn expire_leases(&mut self, now: Timestamp) {
        for g in &mut self.gpus {
            if g.lease_until.is_some_and(|l| l <= now) {
                g.limit_w = g.model.default_w;
                g.lease_until = None;
            }
        }
        for k in 0..self.waiting.len() {
            let ji = self.waiting[k];
            let j = &mut self.jobs[ji];
            if j.hold_until.is_some_and(|h| h <= now) {
                j.hold_until = None;
                if j.job.state == JobState::Held {
                    j.job.state = JobState::Pending;
                    self.touch(ji);
                }
            }
        }
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

    /// Starts waiting jobs on free GPUs: priority first, then submission order; a job
    /// that does not fit does not block smaller ones behind it (backfill).
    fn schedule(&mut self, now: Timestamp) {
        let jobs = &self.jobs;
        self.waiting
            .sort_by_key(|&i| (-jobs[i].job.priority, jobs[i].job.submit_time, i));
        let mut free: u32 = self
            .nodes
            .iter()
            .filter(|n| n.power == Power::On)
            .map(|n| n.free)
            .sum();
        let mut left = Vec::with_capacity(self.waiting.len());
        let waiting = std::mem::take(&mut self.waiting);
        for ji in waiting {
            let j = &self.jobs[ji];
            if j.job.state != JobState::Pending || j.job.gpus > free || !self.place(ji, now) {
                left.push(ji);
            } else {
                free -= self.jobs[ji].job.gpus;
            }
        }
        self.waiting = left;
    }

    /// Places a job: the node with the fewest free GPUs that fits it, else the nodes
    /// with the most free GPUs first.
    fn place(&mut self, ji: usize, now: Timestamp) -> bool {
        let want = self.jobs[ji].job.gpus;
        let model = self.jobs[ji].gpu_model.clone();
        let ok = |n: &Node| {
            n.free > 0 && n.power == Power::On && model.as_ref().is_none_or(|m| &n.model == m)
        };
        let total: u32 = self.nodes.iter().filter(|n| ok(n)).map(|n| n.free).sum();
        if total < want {
            return false;
        }
        let best = self
            .nodes
            .iter()
            .enumerate()
            .filter(|(_, n)| ok(n) && n.free >= want)
            .min_by_key(|(i, n)| (n.free, *i))
            .map(|(i, _)| i);
        let order: Vec<usize> = match best {
            Some(i) => vec![i],
            None => {
                let mut v: Vec<usize> = (0..self.nodes.len())
                    .filter(|&i| ok(&self.nodes[i]))
                    .collect();
                v.sort_by_key(|&i| (std::cmp::Reverse(self.nodes[i].free), i));
                v
            }
        };
        let mut chosen = Vec::with_capacity(want as usize);
        for ni in order {
            for &g in &self.nodes[ni].gpus {
                if chosen.len() as u32 == want {
                    break;
                }
                if self.gpus[g].job.is_none() {
                    chosen.push(g);
                }
            }
        }
        for &g in &chosen {
            self.gpus[g].job = Some(ji);
            let n = &mut self.nodes[self.gpus[g].node];
            n.free -= 1;
            n.idle_since = None;
        }
        let j = &mut self.jobs[ji];
        j.job.allocated = chosen.iter().map(|&g| self.gpus[g].id.clone()).collect();
        j.gpus = chosen;
        j.job.state = JobState::Running;
        j.job.start_time = Some(now);
        j.hold_until = None;
        self.running.push(ji);
        self.touch(ji);
        true
    }

    fn update_power(&mut self) {
        let mut rack_w = std::mem::take(&mut self.rack_power_w);
        rack_w.clear();
        rack_w.resize(self.site.racks.len(), 0.0);
        let mut node_busy = std::mem::take(&mut self.scratch.node_busy);
        node_busy.clear();
        node_busy.resize(self.nodes.len(), 0);
        for g in &mut self.gpus {
            let off = matches!(self.nodes[g.node].power, Power::Off { .. } | Power::Failed);
            g.power_w = match g.job {
                Some(j) => g.busy(j, &self.curves[self.jobs[j].curve]).0,
                None if off => 0.0,
                None => g.model.idle_w.min(g.limit_w),
            };
            rack_w[g.rack] += g.power_w;
            node_busy[g.node] += u32::from(g.job.is_some());
        }
        for (ni, n) in self.nodes.iter().enumerate() {
            rack_w[n.rack] += match n.power {
                Power::On => {
                    let share = f64::from(node_busy[ni]) / n.gpus.len().max(1) as f64;
                    n.base_w * (0.5 + 0.5 * share)
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
        let src = "backtest";
        // a sample per GPU, two per rack, two per cooling unit, the site's and the
        // demand tracker's: room for all of them at once (no copy on growth)
        let mut out = Vec::with_capacity(
            self.gpus.len() + self.site.racks.len() * 2 + self.site.cooling.len() * 2 + 8,
        );
        // GPU power is what the rules read; the backtest integrates energy itself, so
        // the energy counters and limits (for the ledger and the API) are not sent
        for g in &self.gpus {
            out.push(Sample::from_static(
                EntityId::clone(&g.id),
                POWER_W,
                g.power_w,
                now,
                src,
            ));
        }
        crate::facility_samples(
            &crate::FacilityReadings {
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
        if let Some(d) = &self.demand {
            out.extend(d.samples(&self.site.site_entity(), now));
        }
        // what each cooling unit reports it can remove (its BMC's capacity reading)
        let factors = (self.cooling_factor)(now);
        for (unit, f) in self.site.cooling.iter().zip(factors) {
            out.push(Sample::new(
                telemetry::EntityId::new(telemetry::EntityKind::Cooling, &unit.id),
                telemetry::metric::names::COOLING_CAPACITY_KW,
                unit.capacity_kw * f,
                now,
                src,
            ));
        }
        out
    }
}

impl Actuator for Facility {
    fn apply(&mut self, state: &State, _now: Timestamp) -> Vec<String> {
        let mut capped: Vec<Option<(f64, Timestamp)>> = vec![None; self.gpus.len()];
        for (id, c) in &state.caps {
            if let Some(&i) = self.gpu_index.get(id) {
                capped[i] = Some((c.watts, c.lease_until));
            }
        }
        for (i, g) in self.gpus.iter_mut().enumerate() {
            match capped[i] {
                Some((w, lease)) => {
                    g.limit_w = g.model.clamp_limit(w);
                    g.lease_until = Some(lease);
                }
                None => {
                    g.limit_w = g.model.default_w;
                    g.lease_until = None;
                }
            }
        }
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
            match self.hold_lease[ji] {
                Some(lease) => {
                    j.job.state = JobState::Held;
                    j.hold_until = Some(lease);
                }
                None => {
                    if j.job.state == JobState::Held {
                        j.job.state = JobState::Pending;
                    }
                    j.hold_until = None;
                }
            }
            if self.jobs[ji].job.state != before {
                self.touch(ji);
            }
        }
        for ji in marked {
            self.hold_lease[ji] = None;
        }
        self.update_power();
        Vec::new()
    }
}
