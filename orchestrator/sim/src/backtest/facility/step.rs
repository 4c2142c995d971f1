//! One step of the backtest's facility: the scheduler's cycle, the billing period's
//! peak, jobs that run (and end at their exact time), the energy that GPUs, nodes and
//! cooling draw, inlets, cost and carbon.

use integrations::store::Account;
use policies::node_power::Power;
use telemetry::{JobState, Timestamp};

use super::{Facility, Scratch};
use crate::{gpu, thermal};

impl Facility {
    pub(super) fn step_with(&mut self, dt_s: f64, cycle: bool) {
        let t0 = self.now;
        let t1 = t0 + dt_s;
        self.advance_node_power(t0);
        if cycle {
            self.schedule(t0);
            self.resume_on_demand(t0);
        }
        self.update_power();
        let it_w: f64 = self.rack_power_w.iter().sum();
        self.record_peaks(t0, t1, dt_s, it_w);
        if it_w / 1000.0 > self.budget_kw + 1e-9 {
            self.totals.budget_violation_s += dt_s;
        }
        let mut scratch = std::mem::take(&mut self.scratch);
        let (work_before, suspended_before) = (self.totals.work_gpu_s, self.totals.suspended_gpu_s);
        self.run_jobs(t0, dt_s, &mut scratch);
        let job_j = self.draw_energy(dt_s, &mut scratch);
        self.follow_inlets(t0, dt_s, &scratch.rack_j);
        let it_kwh = scratch.rack_j.iter().sum::<f64>() / 3.6e6;
        self.account(t0, dt_s, it_kwh, job_j);
        if let Some(m) = self.meter.as_mut() {
            let cooling_w: f64 = self.cooling_power_w.iter().sum();
            m.push(super::super::grid::MeterStep {
                t0,
                dt_s,
                kw: (it_kwh * 3.6e6 / dt_s.max(1e-9) + cooling_w) / 1000.0,
                work_gpu_s: self.totals.work_gpu_s - work_before,
                suspended_gpu_s: self.totals.suspended_gpu_s - suspended_before,
            });
        }
        self.scratch = scratch;
        self.now = t1;
        self.expire_leases(t1);
        self.arrive(t1);
        self.update_power();
    }

    /// The run's and the billing period's peak IT power: over the tariff's demand
    /// interval with a demand charge that has one (as the ledger follows it), else
    /// over each step.
    fn record_peaks(&mut self, t0: Timestamp, t1: Timestamp, dt_s: f64, it_w: f64) {
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
    }

    /// Progress of the running jobs over the step, each at the pace of its slowest
    /// GPU; a job that ends inside the step frees its GPUs at its end. Leaves each
    /// GPU's busy seconds and busy energy in `scratch`.
    fn run_jobs(&mut self, t0: Timestamp, dt_s: f64, scratch: &mut Scratch) {
        let (busy_s, gpu_j) = (&mut scratch.busy_s, &mut scratch.gpu_j);
        busy_s.clear();
        busy_s.resize(self.gpus.len(), 0.0);
        gpu_j.clear();
        gpu_j.resize(self.gpus.len(), 0.0);
        let mut still = std::mem::take(&mut scratch.still);
        still.clear();
        let running = std::mem::take(&mut self.running);
        let any_suspended = self.suspended > 0;
        for &ji in &running {
            if any_suspended && self.is_suspended(ji) {
                self.totals.suspended_gpu_s += f64::from(self.jobs[ji].job.gpus) * dt_s;
                still.push(ji);
                continue;
            }
            let job = &self.jobs[ji];
            let mut speed: f64 = 1.0;
            for &g in &job.gpus {
                let curve = super::curve_of(&self.curves, &self.curve_set, g, job.curve);
                speed = speed.min(self.gpus[g].busy_on(ji, curve).1);
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
                self.finish(ji, t0 + run_s);
            } else {
                still.push(ji);
            }
        }
        self.running = still;
        scratch.still = running;
    }

    /// A job that ended at `end`: its GPUs are free, a node left without work is idle
    /// from then on.
    fn finish(&mut self, ji: usize, end: Timestamp) {
        let job = &mut self.jobs[ji];
        job.job.state = JobState::Finished;
        job.job.end_time = Some(end);
        for &g in &job.gpus {
            self.gpus[g].job = None;
            let n = &mut self.nodes[self.gpus[g].node];
            n.free += 1;
            if n.free as usize == n.gpus.len() {
                n.idle_since = Some(end);
            }
        }
        self.touch(ji);
    }

    /// The energy each rack drew over the step (into `scratch.rack_j`): busy GPUs for
    /// their busy time, idle for the rest, nodes by their power state. Returns the part
    /// jobs drew (J): busy GPUs and the share of node base power that follows load.
    fn draw_energy(&mut self, dt_s: f64, scratch: &mut Scratch) -> f64 {
        let (busy_s, gpu_j) = (&scratch.busy_s, &scratch.gpu_j);
        let rack_j = &mut scratch.rack_j;
        rack_j.clear();
        rack_j.resize(self.site.racks.len(), 0.0);
        let node_busy_s = &mut scratch.node_busy_s;
        node_busy_s.clear();
        node_busy_s.resize(self.nodes.len(), 0.0);
        for (gi, g) in self.gpus.iter().enumerate() {
            let idle_w = if matches!(self.nodes[g.node].power, Power::Off { .. } | Power::Failed) {
                0.0
            } else {
                g.idle_w()
            };
            let j = gpu_j[gi] + idle_w * (dt_s - busy_s[gi]);
            rack_j[g.rack] += j;
            node_busy_s[g.node] += busy_s[gi];
            if busy_s[gi] > 0.0 && g.capped() {
                self.totals.capped_gpu_s += busy_s[gi];
            }
        }
        let mut job_j: f64 = gpu_j.iter().sum();
        for (ni, n) in self.nodes.iter().enumerate() {
            match n.power {
                Power::On => {
                    let share = node_busy_s[ni] / (dt_s * n.gpus.len().max(1) as f64);
                    rack_j[n.rack] += gpu::node_base_w(n.base_w, share) * dt_s;
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
        job_j
    }

    /// Inlets and cooling power over the step for the racks' average draw (energy
    /// `rack_j` over `dt_s`), and the time any inlet spent above its limit.
    fn follow_inlets(&mut self, t0: Timestamp, dt_s: f64, rack_j: &[f64]) {
        let avg_rack_w: Vec<f64> = rack_j.iter().map(|j| j / dt_s).collect();
        let factors = (self.cooling_factor)(t0);
        let (target, cooling) = crate::thermal_targets_by_unit(&self.site, &avg_rack_w, &factors);
        self.cooling_power_w = cooling;
        thermal::follow(&self.site, &mut self.inlet_c, &target, dt_s);
        if self
            .inlet_c
            .iter()
            .zip(&self.site.racks)
            .any(|(t, r)| *t > r.inlet_limit_c)
        {
            self.totals.thermal_violation_s += dt_s;
        }
    }

    /// The step's energy, its jobs' share (with their share of cooling), cost and
    /// carbon, into the totals.
    fn account(&mut self, t0: Timestamp, dt_s: f64, it_kwh: f64, job_j: f64) {
        let cooling_kwh = self.cooling_power_w.iter().sum::<f64>() * dt_s / 3.6e6;
        self.totals.it_kwh += it_kwh;
        self.totals.cooling_kwh += cooling_kwh;
        let job_kwh = job_j / 3.6e6 * (1.0 + cooling_kwh / it_kwh.max(1e-12));
        self.totals.job_kwh += job_kwh;
        self.totals.job_it_kwh += job_j / 3.6e6;
        match self.price_at(t0) {
            Some(p) => {
                self.totals.cost += p * (it_kwh + cooling_kwh);
                self.totals.energy_cost += p * (it_kwh + cooling_kwh);
                self.totals.job_cost += p * job_kwh;
                self.totals.job_it_cost += p * job_j / 3.6e6;
                self.totals.cooling_cost += p * cooling_kwh;
            }
            None => self.totals.price_gap_s += dt_s,
        }
        match self.carbon_at(t0) {
            Some(c) => self.totals.carbon_kg += c * (it_kwh + cooling_kwh) / 1000.0,
            None => self.totals.carbon_gap_s += dt_s,
        }
    }
}
