//! The backtest's figures: each run's, the savings between them, the summary that
//! `summary.json` holds, and the end-of-run table.

use std::fmt::Write as _;
use std::path::Path;

use serde::Serialize;

use super::facility::{Facility, Totals};

/// One run's figures.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunSummary {
    /// IT + cooling.
    pub energy_kwh: f64,
    pub it_kwh: f64,
    pub cooling_kwh: f64,
    /// The energy's cost plus the demand charge.
    pub cost: f64,
    pub energy_cost: f64,
    /// The tariff's demand charge: per billing period (calendar month), its peak IT
    /// power × the site's `demand_charge_per_kw` (0 without one).
    pub demand_charge: f64,
    /// The highest IT power of each billing period, kW.
    pub period_peaks_kw: Vec<(String, f64)>,
    /// Null when the run had no carbon series ("not measured").
    pub carbon_kg: Option<f64>,
    /// The energy jobs drew (busy GPUs, the node power that follows load, and their
    /// cooling): the idle floor of the hall left out, the part a policy can move.
    pub job_energy_kwh: f64,
    pub job_energy_cost: f64,
    /// Highest facility IT power, kW.
    pub peak_kw: f64,
    /// Seconds the facility's IT power was above its limit.
    pub budget_violation_s: f64,
    /// Seconds any rack inlet was above its limit.
    pub thermal_violation_s: f64,
    pub deadline_misses: usize,
    /// The first jobs that missed their deadline (at most [`MISSED_LISTED`]), with
    /// their times, so that a miss can be followed (left out when none did).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub missed: Vec<MissedJob>,
    pub jobs_finished: usize,
    pub wait_mean_s: f64,
    pub wait_p95_s: f64,
    /// (end − submit) / run time at full power.
    pub slowdown_mean: f64,
    pub slowdown_p95: f64,
    /// GPU-hours of work delivered (at full-speed equivalent).
    pub gpu_hours: f64,
    pub capped_gpu_hours: f64,
    /// Jobs the policy held at least once.
    pub jobs_deferred: usize,
    pub decisions: u64,
    /// Seconds the price series did not cover (counted at no cost).
    pub price_gap_s: f64,
    /// Node power states: power-downs and power-ups, node-hours off, and the energy
    /// nodes drew booting and shutting down.
    pub power_downs: u64,
    pub power_ups: u64,
    pub node_off_h: f64,
    pub transition_kwh: f64,
    /// Mean wait of the jobs the policy held at least once (0 in the other runs).
    pub deferred_wait_mean_s: f64,
    /// GPU-hours delivered per day from the start (compare runs over the days of a
    /// heat wave).
    pub gpu_hours_per_day: Vec<f64>,
}

/// How many missed jobs a run's summary lists.
pub const MISSED_LISTED: usize = 100;

/// A job that missed its deadline.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MissedJob {
    pub id: String,
    pub gpus: u32,
    pub submit: String,
    pub deadline: String,
    /// When it started (none: it never did).
    pub start: Option<String>,
    pub end: Option<String>,
    /// The policy held it at least once.
    pub held: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Savings {
    pub cost: f64,
    pub energy: f64,
    /// Null when carbon was not measured.
    pub carbon: Option<f64>,
    /// On the cost of the energy jobs drew (the idle floor left out).
    pub job_energy_cost: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Summary {
    pub site: String,
    pub gpus: usize,
    pub trace: String,
    pub trace_format: String,
    /// The factor the trace's load was scaled by (`--load`; left out at 1).
    #[serde(skip_serializing_if = "is_one")]
    pub load: f64,
    pub jobs: usize,
    pub deferrable_jobs: usize,
    /// Jobs a deadline rule could not be met for (longer than its deadline): replayed
    /// as not deferrable, without a deadline.
    pub jobs_without_feasible_deadline: usize,
    pub alignment: String,
    pub start: String,
    pub end: String,
    pub span_h: f64,
    pub budget_kw: f64,
    pub seed: u64,
    pub tick_s: f64,
    /// With the scenario's `sample_s`: the seconds between readings, and the
    /// evaluations made between ticks for readings that crossed a threshold.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sample_s: Option<f64>,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub event_evaluations: u64,
    pub scenario: Vec<String>,
    /// Seconds of the run the carbon series did not cover (the whole run without one).
    pub carbon_gap_s: f64,
    pub baseline: RunSummary,
    pub policy: RunSummary,
    /// Slurm-style power saving: idle nodes suspended after `suspend_time_s`, resumed
    /// on demand with their boot time, no price awareness.
    pub power_save: RunSummary,
    /// Per `[[grid_events]]` entry, what the policy's facility did (left out without
    /// any).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub demand_response: Vec<super::DemandResponse>,
    pub suspend_time_s: f64,
    /// (baseline − policy) / baseline, in %.
    pub savings_pct: Savings,
    /// (power_save − policy) / power_save, in %.
    pub savings_vs_power_save_pct: Savings,
    /// Where the saving against power saving comes from, and what it cost.
    pub against_power_save: super::decompose::Decomposition,
    /// Mean wait of the jobs the policy deferred.
    pub deferred_wait_mean_s: f64,
    /// The cost saved against no management per hour of wait the policy added (the
    /// sum over jobs of how much longer each waited than in the baseline); 0 when it
    /// added none.
    pub saving_per_wait_hour: f64,
    /// Seconds of wall-clock the replay took (not part of the comparison; left out of
    /// the determinism check).
    #[serde(skip)]
    pub elapsed_s: f64,
}

pub(super) fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

pub(super) fn summarize_run(
    f: &Facility,
    deferred: &std::collections::BTreeSet<String>,
    decisions: u64,
    demand_charge_per_kw: f64,
    carbon_measured: bool,
) -> RunSummary {
    let t: &Totals = &f.totals;
    let mut waits = Vec::new();
    let mut slow = Vec::new();
    let mut misses = 0;
    let mut missed = Vec::new();
    let mut deferred_waits = Vec::new();
    for j in &f.jobs {
        let job = &j.job;
        if let Some(s) = job.start_time {
            waits.push(s.secs_since(job.submit_time).max(0.0));
            if deferred.contains(&job.id) {
                deferred_waits.push(s.secs_since(job.submit_time).max(0.0));
            }
        }
        let missed_it = match (job.end_time, job.deadline) {
            (Some(e), d) => {
                slow.push(e.secs_since(job.submit_time) / j.work_s.max(1.0));
                d.is_some_and(|d| e > d)
            }
            (None, d) => d.is_some(),
        };
        if missed_it {
            misses += 1;
            if missed.len() < MISSED_LISTED {
                missed.push(MissedJob {
                    id: job.id.clone(),
                    gpus: job.gpus,
                    submit: job.submit_time.to_string(),
                    deadline: job.deadline.map(|d| d.to_string()).unwrap_or_default(),
                    start: job.start_time.map(|t| t.to_string()),
                    end: job.end_time.map(|t| t.to_string()),
                    held: deferred.contains(&job.id),
                });
            }
        }
    }
    waits.sort_by(f64::total_cmp);
    slow.sort_by(f64::total_cmp);
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
    let demand_charge: f64 = t
        .period_peaks_kw
        .iter()
        .map(|(_, kw)| kw * demand_charge_per_kw)
        .sum();
    RunSummary {
        energy_kwh: t.it_kwh + t.cooling_kwh,
        it_kwh: t.it_kwh,
        cooling_kwh: t.cooling_kwh,
        cost: t.energy_cost + demand_charge,
        energy_cost: t.energy_cost,
        demand_charge,
        period_peaks_kw: t
            .period_peaks_kw
            .iter()
            .map(|(p, kw)| (p.clone(), (kw * 1000.0).round() / 1000.0))
            .collect(),
        carbon_kg: carbon_measured.then_some(t.carbon_kg),
        job_energy_kwh: t.job_kwh,
        job_energy_cost: t.job_cost,
        peak_kw: t.peak_kw,
        budget_violation_s: t.budget_violation_s,
        thermal_violation_s: t.thermal_violation_s,
        deadline_misses: misses,
        missed,
        jobs_finished: slow.len(),
        wait_mean_s: mean(&waits),
        wait_p95_s: percentile(&waits, 95.0),
        slowdown_mean: mean(&slow),
        slowdown_p95: percentile(&slow, 95.0),
        gpu_hours: t.work_gpu_s / 3600.0,
        capped_gpu_hours: t.capped_gpu_s / 3600.0,
        jobs_deferred: deferred.len(),
        decisions,
        price_gap_s: t.price_gap_s,
        power_downs: t.power_downs,
        power_ups: t.power_ups,
        node_off_h: (t.node_off_h * 1000.0).round() / 1000.0,
        transition_kwh: t.transition_kwh,
        deferred_wait_mean_s: mean(&deferred_waits),
        gpu_hours_per_day: t
            .gpu_hours_per_day
            .iter()
            .map(|h| (h * 1000.0).round() / 1000.0)
            .collect(),
    }
}

fn pct(base: f64, with: f64) -> f64 {
    if base.abs() < 1e-12 {
        0.0
    } else {
        100.0 * (base - with) / base
    }
}

pub(super) fn savings(b: &RunSummary, p: &RunSummary) -> Savings {
    Savings {
        cost: pct(b.cost, p.cost),
        energy: pct(b.energy_kwh, p.energy_kwh),
        carbon: b.carbon_kg.zip(p.carbon_kg).map(|(b, p)| pct(b, p)),
        job_energy_cost: pct(b.job_energy_cost, p.job_energy_cost),
    }
}

impl Summary {
    /// The end-of-run table.
    pub fn table(&self, out: &Path) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "\npowerplane backtest: {} jobs ({} deferrable) on {} ({} GPUs), {:.0} h from {}\n  {}\n",
            self.jobs, self.deferrable_jobs, self.site, self.gpus, self.span_h, self.start, self.alignment
        );
        for l in &self.scenario {
            let _ = writeln!(s, "  scenario: {l}");
        }
        let _ = writeln!(
            s,
            "  {:<24} {:>16} {:>16} {:>16}",
            "", "baseline", "power saving", "policy"
        );
        let runs = [&self.baseline, &self.power_save, &self.policy];
        for (k, f) in rows() {
            let _ = writeln!(
                s,
                "  {k:<24} {:>16} {:>16} {:>16}",
                f(runs[0]),
                f(runs[1]),
                f(runs[2])
            );
        }
        self.notes(&mut s);
        let _ = writeln!(
            s,
            "  replayed in {:.1} s; wrote {}/summary.json and {}/report.html",
            self.elapsed_s,
            out.display(),
            out.display()
        );
        s
    }

    /// The savings, and what the policy's deferrals cost in waiting.
    fn notes(&self, s: &mut String) {
        let carbon = |c: Option<f64>| c.map_or("not measured".to_string(), |c| format!("{c:.1}%"));
        let _ = writeln!(
            s,
            "\n  savings: cost {:.1}%, energy {:.1}%, carbon {}; on the jobs' energy cost {:.1}%",
            self.savings_pct.cost,
            self.savings_pct.energy,
            carbon(self.savings_pct.carbon),
            self.savings_pct.job_energy_cost
        );
        let _ = writeln!(
            s,
            "  against power saving (suspend after {:.0} s): cost {:.1}%, energy {:.1}%",
            self.suspend_time_s,
            self.savings_vs_power_save_pct.cost,
            self.savings_vs_power_save_pct.energy
        );
        let money = |v: f64| format!("{v:+.2}");
        let _ = writeln!(s, "{}", self.against_power_save.lines(money));
        if self.policy.jobs_deferred == 0 {
            let _ = writeln!(s, "  no job was deferred");
        } else {
            let _ = writeln!(
                s,
                "  deferred jobs waited {:.1} h on average; {:.2} saved per hour of added wait",
                self.deferred_wait_mean_s / 3600.0,
                self.saving_per_wait_hour
            );
        }
        if self.policy.price_gap_s > 0.0 {
            let _ = writeln!(
                s,
                "  warning: {:.0} s of the run had no price (counted at no cost)",
                self.policy.price_gap_s
            );
        }
    }
}

fn is_one(f: &f64) -> bool {
    *f == 1.0
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

type Cell = fn(&RunSummary) -> String;

/// The table's rows: a label, and the cell of each run.
fn rows() -> Vec<(&'static str, Cell)> {
    vec![
        ("energy kWh", |r| format!("{:.0}", r.energy_kwh)),
        ("cost", |r| format!("{:.2}", r.cost)),
        ("  demand charge", |r| format!("{:.2}", r.demand_charge)),
        ("carbon kg", |r| {
            r.carbon_kg
                .map_or("not measured".into(), |c| format!("{c:.0}"))
        }),
        ("job energy kWh", |r| format!("{:.0}", r.job_energy_kwh)),
        ("job energy cost", |r| format!("{:.2}", r.job_energy_cost)),
        ("peak kW", |r| format!("{:.1}", r.peak_kw)),
        ("over budget s", |r| format!("{:.0}", r.budget_violation_s)),
        ("over inlet limit s", |r| {
            format!("{:.0}", r.thermal_violation_s)
        }),
        ("deadline misses", |r| r.deadline_misses.to_string()),
        ("wait mean / p95 s", |r| {
            format!("{:.0} / {:.0}", r.wait_mean_s, r.wait_p95_s)
        }),
        ("slowdown mean / p95", |r| {
            format!("{:.2} / {:.2}", r.slowdown_mean, r.slowdown_p95)
        }),
        ("GPU-hours delivered", |r| format!("{:.0}", r.gpu_hours)),
        ("node power-downs", |r| r.power_downs.to_string()),
        ("node-hours off", |r| format!("{:.0}", r.node_off_h)),
        ("jobs deferred", |r| r.jobs_deferred.to_string()),
        ("price gap s", |r| format!("{:.0}", r.price_gap_s)),
    ]
}
