//! `powerplane backtest`: replays a job trace against the simulated facility, once
//! under the policy (through the same control loop and engine that `serve` runs) and
//! once under a baseline with no policy (jobs start as soon as GPUs are free, no caps),
//! in lockstep on the same ticks, and writes `summary.json` and `report.html`.
//!
//! - [`trace`]: the trace formats (Philly-derived, Pollux, generic CSV).
//! - [`scenario`]: classes and deadlines for jobs that have none, heat wave, contract
//!   limit, price spikes, the feeds' formats, the seed.
//! - [`facility`]: the simulator's trace-driven facility, indexed for long traces.
//! - [`grid`]: demand-response events: the scenario's checked, the simulated meter and
//!   the site readings the policy's facility publishes; `dr`: what each event did.
//! - `inputs`: the files read, the trace's jobs aligned and classed; `replay`: the
//!   three runs stepped together under the control loop; `summary`: the figures.
//!
//! A trace from another year is moved into the price series' year by a whole number of
//! weeks, so that every job keeps its weekday and local hour; the summary states the
//! shift.

pub mod capacity;
pub mod cli;
mod decompose;
mod dr;
pub mod facility;
pub mod grid;
mod inputs;
mod replay;
mod report;
pub mod scenario;
mod summary;
pub mod trace;

use std::path::PathBuf;

use anyhow::{Context, Result};
use telemetry::{Site, Timestamp};

pub use dr::DemandResponse;
use facility::Facility;
use inputs::Inputs;
use replay::{Outcome, Runs};
use scenario::Scenario;
pub use summary::{RunSummary, Savings, Summary};

/// One input file: its name for messages, and its text.
pub use crate::demo::Input;

#[derive(Debug, Clone)]
pub struct BacktestConfig {
    pub site: Input,
    pub policy: Input,
    pub jobs: Input,
    pub prices: Input,
    pub carbon: Option<Input>,
    pub scenario: Option<Input>,
    /// Replay only jobs submitted in `[from, to)` (after alignment).
    pub from: Option<Timestamp>,
    pub to: Option<Timestamp>,
    pub out: PathBuf,
    /// The trace's load scaled by this factor (`--load`; 1: the trace as it is). See
    /// [`trace::scaled`].
    pub load: f64,
}

/// Runs the backtest and writes its files; progress lines go to `progress`.
pub fn run(cfg: &BacktestConfig, progress: &mut dyn std::io::Write) -> Result<Summary> {
    let started = std::time::Instant::now();
    let inputs = Inputs::read(cfg)?;
    let (n_jobs, deferrable) = announce(cfg, &inputs, progress)?;
    let events = inputs.scenario.grid_events();
    let without = without_grid_events(&inputs, events.len(), progress)?;
    let mut runs = Runs::new(&inputs, (!events.is_empty()).then_some(events));
    let Inputs {
        site,
        policy,
        scenario,
        format,
        budget_kw,
        infeasible,
        alignment,
        start,
        ..
    } = inputs;
    let outcome = replay::replay(&mut runs, &site, policy, &scenario, progress)?;
    let end = runs.pol.now();
    let [b, p, ps] = run_summaries(cfg, &site, &runs, &outcome);
    let demand_response = without
        .as_ref()
        .map(|w| dr::measure(&runs.pol, w, scenario.tick_s))
        .unwrap_or_default();
    let against_power_save = decompose::against_power_save(
        &runs.psave,
        &runs.pol,
        (ps.demand_charge, p.demand_charge),
        (p.jobs_deferred, p.deferred_wait_mean_s),
    );
    let added_h = added_wait_h(&runs.base, &runs.pol);
    let saving_per_wait_hour = if added_h > 0.0 {
        (b.cost - p.cost) / added_h
    } else {
        0.0
    };
    let summary = Summary {
        site: site.name.clone(),
        gpus: runs.base.gpu_count(),
        trace: cfg.jobs.name.clone(),
        trace_format: format.name().to_string(),
        load: cfg.load,
        jobs: n_jobs,
        deferrable_jobs: deferrable,
        jobs_without_feasible_deadline: infeasible,
        alignment,
        start: start.to_string(),
        end: end.to_string(),
        span_h: end.secs_since(start) / 3600.0,
        budget_kw,
        seed: scenario.seed,
        tick_s: scenario.tick_s,
        sample_s: scenario.sample_s,
        event_evaluations: outcome.event_evaluations,
        scenario: scenario_lines(&scenario),
        carbon_gap_s: runs.pol.totals.carbon_gap_s,
        savings_pct: summary::savings(&b, &p),
        savings_vs_power_save_pct: summary::savings(&ps, &p),
        against_power_save,
        deferred_wait_mean_s: p.deferred_wait_mean_s,
        saving_per_wait_hour,
        suspend_time_s: scenario.suspend_time_s,
        baseline: b,
        policy: p,
        power_save: ps,
        demand_response,
        elapsed_s: started.elapsed().as_secs_f64(),
    };
    write_files(cfg, &summary, &site, &outcome)?;
    Ok(summary)
}

/// The first progress line: the jobs (and how many may be deferred), the trace, the
/// site's GPUs and the alignment; the jobs and the deferrable ones.
fn announce(
    cfg: &BacktestConfig,
    inputs: &Inputs,
    progress: &mut dyn std::io::Write,
) -> Result<(usize, usize)> {
    let n_jobs = inputs.jobs.len();
    let deferrable = inputs.jobs.iter().filter(|j| j.job.deferrable).count();
    let scaled = match cfg.load {
        1.0 => String::new(),
        f => format!(" (its load x{f})"),
    };
    writeln!(
        progress,
        "backtest: {n_jobs} jobs ({deferrable} deferrable) of {}{scaled} on {} GPUs; {}",
        cfg.jobs.name,
        inputs.site.gpus().len(),
        inputs.alignment
    )?;
    Ok((n_jobs, deferrable))
}

/// With `events` grid events: the policy's run without them first, to measure them
/// against.
fn without_grid_events(
    inputs: &Inputs,
    events: usize,
    progress: &mut dyn std::io::Write,
) -> Result<Option<Facility>> {
    if events == 0 {
        return Ok(None);
    }
    writeln!(
        progress,
        "backtest: {events} grid events; first the run without them"
    )?;
    let mut r = Runs::new(inputs, Some(Vec::new()));
    let policy = inputs.policy.clone();
    replay::replay(&mut r, &inputs.site, policy, &inputs.scenario, progress)?;
    writeln!(progress, "backtest: the run with the grid events")?;
    Ok(Some(r.pol))
}

/// The baseline's, the policy's and the power-saving run's figures.
fn run_summaries(
    cfg: &BacktestConfig,
    site: &Site,
    runs: &Runs,
    outcome: &Outcome,
) -> [RunSummary; 3] {
    let charge = site
        .tariff
        .as_ref()
        .and_then(|t| t.demand_charge_per_kw)
        .unwrap_or(0.0);
    let measured = cfg.carbon.is_some();
    let none = std::collections::BTreeSet::new();
    let (deferred, decisions) = (&outcome.deferred, outcome.decisions);
    [
        summary::summarize_run(&runs.base, &none, 0, charge, measured),
        summary::summarize_run(&runs.pol, deferred, decisions, charge, measured),
        summary::summarize_run(&runs.psave, &none, 0, charge, measured),
    ]
}

/// The wait the policy added, hours: per job, how much longer it waited than in the
/// baseline.
fn added_wait_h(base: &Facility, pol: &Facility) -> f64 {
    fn wait(f: &Facility) -> std::collections::BTreeMap<&str, f64> {
        f.jobs
            .iter()
            .filter_map(|j| {
                j.job
                    .start_time
                    .map(|s| (j.job.id.as_str(), s.secs_since(j.job.submit_time)))
            })
            .collect()
    }
    let (wb, wp) = (wait(base), wait(pol));
    wp.iter()
        .map(|(id, w)| (w - wb.get(id).copied().unwrap_or(0.0)).max(0.0))
        .sum::<f64>()
        / 3600.0
}

/// The scenario's events, in words, for the summary.
fn scenario_lines(scenario: &Scenario) -> Vec<String> {
    let mut lines = Vec::new();
    if let Some(h) = &scenario.heat_wave {
        lines.push(format!(
            "heat wave: cooling capacity −{:.0}% for {} days from {}",
            h.cooling_drop * 100.0,
            h.days,
            h.start
        ));
    }
    for f in &scenario.cooling_fault {
        lines.push(format!(
            "cooling fault: {} at {:.0}% of its capacity for {} h from {}",
            f.unit,
            f.capacity.unwrap_or(crate::Fault::PUMP_FAILURE_FACTOR) * 100.0,
            f.hours,
            f.start
        ));
    }
    if let Some(c) = &scenario.contract {
        lines.push(format!(
            "contract limit lowered to {} kW (the policy's site budget; the feeds keep their ratings)",
            c.limit_kw
        ));
    }
    for s in &scenario.price_spike {
        lines.push(format!(
            "price spike: ×{} + {} per kWh for {} h from {}",
            s.factor, s.add_per_kwh, s.hours, s.start
        ));
    }
    for e in scenario.grid_events() {
        let asked = match e.target {
            telemetry::grid::GridTarget::CapW(w) => {
                format!("at most {} kW at the meter", w / 1000.0)
            }
            telemetry::grid::GridTarget::ShedFraction(f) => {
                format!("shed {}% of the hour-before baseline", f * 100.0)
            }
            _ => String::new(),
        };
        lines.push(format!(
            "grid event {}: {asked} for {} min from {}",
            e.id, e.duration_min, e.start
        ));
    }
    lines
}

/// `summary.json` and `report.html` in the output folder.
fn write_files(
    cfg: &BacktestConfig,
    summary: &Summary,
    site: &Site,
    outcome: &Outcome,
) -> Result<()> {
    std::fs::create_dir_all(&cfg.out)
        .with_context(|| format!("cannot create {}", cfg.out.display()))?;
    std::fs::write(
        cfg.out.join("summary.json"),
        serde_json::to_string_pretty(summary)? + "\n",
    )?;
    std::fs::write(
        cfg.out.join("report.html"),
        report::html(summary, site, &outcome.series),
    )?;
    Ok(())
}

#[cfg(test)]
mod tests;
