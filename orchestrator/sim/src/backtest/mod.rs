//! `powerplane backtest`: replays a job trace against the simulated facility, once
//! under the policy (through the same control loop and engine that `serve` runs) and
//! once under a baseline with no policy (jobs start as soon as GPUs are free, no caps),
//! in lockstep on the same ticks, and writes `summary.json` and `report.html`.
//!
//! - [`trace`]: the trace formats (Philly-derived, Pollux, generic CSV).
//! - [`scenario`]: classes and deadlines for jobs that have none, heat wave, contract
//!   limit, price spikes, the feeds' formats, the seed.
//! - [`facility`]: the simulated facility, indexed for long traces.
//!
//! A trace from another year is moved into the price series' year by a whole number of
//! weeks, so that every job keeps its weekday and local hour; the summary states the
//! shift.

pub mod capacity;
pub mod cli;
pub mod facility;
mod report;
pub mod scenario;
pub mod trace;

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use chrono::{Datelike, Duration, NaiveDate, NaiveDateTime, TimeZone};
use chrono_tz::Tz;
use integrations::prices::Series;
use integrations::store::{Backend, Batch, Op, Store, StoreError};
use policies::{Action, Policy, Target};
use serde::Serialize;
use telemetry::{Job, JobState, Site, Timestamp};

use crate::curves;
use crate::events::{dt_s, ReplayEvents, Stop};
use crate::rng::Rng;
use control::{ControlLoop, Telemetry};
use facility::{Facility, Point, SimJob, Totals};
use scenario::Scenario;
use trace::{TraceJob, When};

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
}

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
    pub suspend_time_s: f64,
    /// (baseline − policy) / baseline, in %.
    pub savings_pct: Savings,
    /// (power_save − policy) / power_save, in %.
    pub savings_vs_power_save_pct: Savings,
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

/// A store that keeps nothing: the backtest reads its results from the facility and
/// the tick reports, and a long replay should not grow a database.
struct Discard {
    seq: std::collections::BTreeMap<String, u64>,
}

impl Backend for Discard {
    fn commit(&mut self, batch: &Batch) -> Result<Vec<u64>, StoreError> {
        let mut out = Vec::new();
        for op in &batch.ops {
            if let Op::Append { log, .. } = op {
                let n = self.seq.entry(log.clone()).or_default();
                *n += 1;
                out.push(*n);
            }
        }
        Ok(out)
    }
    fn get(&mut self, _: &str, _: &str) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(None)
    }
    fn list(&mut self, _: &str) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        Ok(Vec::new())
    }
    fn read_log(&mut self, _: &str, _: u64, _: usize) -> Result<Vec<(u64, Vec<u8>)>, StoreError> {
        Ok(Vec::new())
    }
    fn log_len(&mut self, log: &str) -> Result<u64, StoreError> {
        Ok(self.seq.get(log).copied().unwrap_or(0))
    }
    fn name(&self) -> &'static str {
        "discard"
    }
}

/// Reads a price or carbon file as the scenario says it is written.
fn read_series(
    input: &Input,
    format: Option<&control::feeds::FeedFormat>,
    column: &str,
) -> Result<Series> {
    let default = control::feeds::FeedFormat::default();
    format
        .unwrap_or(&default)
        .read(&input.name, &input.text, column)
}

/// The local year most of a series lies in.
fn series_year(s: &Series, tz: Tz) -> Option<i32> {
    let pts = s.points();
    let mid = pts.get(pts.len() / 2)?;
    Some(mid.0.to_datetime().with_timezone(&tz).year())
}

fn localize(tz: Tz, n: NaiveDateTime) -> Timestamp {
    use chrono::LocalResult;
    let pick = |dt: chrono::DateTime<Tz>| Timestamp::from(dt.with_timezone(&chrono::Utc));
    match tz.from_local_datetime(&n) {
        LocalResult::Single(d) => pick(d),
        LocalResult::Ambiguous(a, _) => pick(a),
        // skipped by a DST change: an hour later exists
        LocalResult::None => match tz.from_local_datetime(&(n + Duration::hours(1))) {
            LocalResult::Single(d) | LocalResult::Ambiguous(d, _) => pick(d),
            LocalResult::None => Timestamp::from(chrono::Utc.from_utc_datetime(&n)),
        },
    }
}

/// Moves trace times into the price year by whole weeks; returns a function from trace
/// times to instants, and the statement of what was done.
fn alignment(
    jobs: &[TraceJob],
    tz: Tz,
    price_year: Option<i32>,
    anchor: Timestamp,
) -> (impl Fn(&When) -> Timestamp, String) {
    let naive = |w: &When| match w {
        When::Local(n) => Some(*n),
        When::Instant(t) => Some(t.to_datetime().with_timezone(&tz).naive_local()),
        When::Offset(_) => None,
    };
    let first = jobs.iter().filter_map(|j| naive(&j.submit)).min();
    let (weeks, statement) = match (first, price_year) {
        (Some(first), Some(year)) if first.year() != year => {
            let d = first.date();
            let target = NaiveDate::from_ymd_opt(year, d.month(), d.day())
                .or_else(|| NaiveDate::from_ymd_opt(year, d.month(), 28))
                .unwrap_or(d);
            let days = (target - d).num_days();
            let weeks = (days as f64 / 7.0).round() as i64;
            let moved = first + Duration::weeks(weeks);
            (
                weeks,
                format!(
                    "trace from another year: every submit time moved by {weeks} weeks ({} days), so that each job keeps its weekday and local hour ({}); its first job, {} ({}), replays at {} ({}), in the prices' year {year}",
                    weeks * 7,
                    tz,
                    first.format("%Y-%m-%d %H:%M"),
                    first.format("%a"),
                    moved.format("%Y-%m-%d %H:%M"),
                    moved.format("%a"),
                ),
            )
        }
        (Some(_), Some(year)) => (
            0,
            format!("trace in the prices' year {year}: replayed at its own times ({tz})"),
        ),
        (Some(_), None) => (0, "no price year: trace replayed at its own times".into()),
        (None, _) => (
            0,
            format!(
                "trace of offsets: replayed from {} ({tz})",
                anchor
                    .to_datetime()
                    .with_timezone(&tz)
                    .format("%Y-%m-%d %H:%M %a")
            ),
        ),
    };
    let shift = Duration::weeks(weeks);
    let f = move |w: &When| match w {
        When::Local(n) => localize(tz, *n + shift),
        When::Instant(t) => localize(tz, t.to_datetime().with_timezone(&tz).naive_local() + shift),
        When::Offset(s) => anchor + *s,
    };
    (f, statement)
}

/// Jobs as the replay runs them: aligned, classed, with deadlines and curves; a job
/// larger than the site is refused with its file and line.
#[allow(clippy::too_many_arguments)]
fn build_jobs(
    trace: &[TraceJob],
    scenario: &Scenario,
    align: &dyn Fn(&When) -> Timestamp,
    curves: &[curves::Curve],
    from: Option<Timestamp>,
    to: Option<Timestamp>,
    file: &str,
    site: &Site,
) -> Result<(Vec<SimJob>, usize)> {
    let mut rng = Rng::new(scenario.seed);
    let mut out = Vec::with_capacity(trace.len());
    let mut infeasible = 0;
    for t in trace {
        // two draws per job whatever it has, so one job's columns never move another's
        let u_class = rng.f64();
        let u_curve = rng.f64();
        let submit = align(&t.submit);
        if from.is_some_and(|f| submit < f) || to.is_some_and(|e| submit >= e) {
            continue;
        }
        // a job the site can never run is bad input, not a job to replay forever
        let have: u32 = site
            .nodes
            .iter()
            .filter(|n| t.gpu_model.as_ref().is_none_or(|m| &n.gpu_model == m))
            .map(|n| n.gpus)
            .sum();
        if t.gpus > have {
            anyhow::bail!(
                "{file}:{}: job {} needs {} GPUs{}, the site has {have}",
                t.line,
                t.id,
                t.gpus,
                t.gpu_model
                    .as_ref()
                    .map_or(String::new(), |m| format!(" of model {m}"))
            );
        }
        let rule = match &t.class {
            Some(c) => scenario.classes.iter().find(|r| &r.class == c),
            None => {
                let mut acc = 0.0;
                scenario.classes.iter().find(|r| {
                    acc += r.share;
                    u_class < acc
                })
            }
        };
        let class = t
            .class
            .clone()
            .or_else(|| rule.map(|r| r.class.clone()))
            .unwrap_or_else(|| scenario.default_class.clone());
        let mut deadline = t.deadline.as_ref().map(align);
        let mut deferrable = match rule {
            Some(r) => r.deferrable,
            None => deadline.is_some(),
        };
        if deadline.is_none() {
            if let Some(r) = rule {
                deadline = match (r.deadline_h, r.slack_h) {
                    (Some(h), _) => Some(submit + h * 3600.0),
                    (None, Some(s)) => Some(submit + t.duration_s + s * 3600.0),
                    _ => None,
                };
                if deadline.is_some_and(|d| d < submit + t.duration_s) {
                    // the rule's deadline cannot be met even at once: not a deadline job
                    infeasible += 1;
                    deadline = None;
                    deferrable = false;
                }
            }
        }
        let curve = t
            .workload
            .as_ref()
            .and_then(|w| curves.iter().position(|c| &c.name == w))
            .unwrap_or(((u_curve * curves.len() as f64) as usize).min(curves.len() - 1));
        let job = Job {
            id: t.id.clone(),
            scheduler: "trace".into(),
            name: t.id.clone(),
            user: "trace".into(),
            project: class.clone(),
            class,
            priority: rule.map_or(0, |r| r.priority),
            gpus: t.gpus,
            allocated: Vec::new(),
            state: JobState::Pending,
            submit_time: submit,
            start_time: None,
            end_time: None,
            deadline,
            est_duration_s: t.duration_s,
            deferrable,
            preemptible: false,
        };
        out.push(SimJob::new(job, t.duration_s, curve, t.gpu_model.clone()));
    }
    Ok((out, infeasible))
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn summarize_run(
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
    let mut deferred_waits = Vec::new();
    for j in &f.jobs {
        let job = &j.job;
        if let Some(s) = job.start_time {
            waits.push(s.secs_since(job.submit_time).max(0.0));
            if deferred.contains(&job.id) {
                deferred_waits.push(s.secs_since(job.submit_time).max(0.0));
            }
        }
        if let Some(e) = job.end_time {
            slow.push(e.secs_since(job.submit_time) / j.work_s.max(1.0));
            if job.deadline.is_some_and(|d| e > d) {
                misses += 1;
            }
        } else if job.deadline.is_some() {
            misses += 1;
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

fn savings(b: &RunSummary, p: &RunSummary) -> Savings {
    Savings {
        cost: pct(b.cost, p.cost),
        energy: pct(b.energy_kwh, p.energy_kwh),
        carbon: b.carbon_kg.zip(p.carbon_kg).map(|(b, p)| pct(b, p)),
        job_energy_cost: pct(b.job_energy_cost, p.job_energy_cost),
    }
}

/// The runs' charts.
pub(crate) struct Series2 {
    pub baseline: Vec<Point>,
    pub policy: Vec<Point>,
    pub power_save: Vec<Point>,
}

/// Where the node power decision's inputs come from in the policy's replay: the nodes,
/// and the GPUs the work needs and when (waiting jobs now, held jobs at their planned
/// start, other holds at their lease's end).
fn node_needs(
    f: &Facility,
    planned: &std::collections::BTreeMap<String, Timestamp>,
    now: Timestamp,
) -> Vec<policies::node_power::Need> {
    f.waiting_jobs()
        .map(|j| {
            let at = match j.job.state {
                JobState::Held => planned.get(&j.job.id).copied().unwrap_or(now),
                _ => now,
            };
            policies::node_power::Need {
                at,
                gpus: j.job.gpus,
                model: j.gpu_model.clone(),
            }
        })
        .collect()
}

/// Runs the backtest and writes its files; progress lines go to `progress`.
pub fn run(cfg: &BacktestConfig, progress: &mut dyn std::io::Write) -> Result<Summary> {
    let started = std::time::Instant::now();
    let site = Site::parse(&cfg.site.name, &cfg.site.text).map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut policy =
        Policy::parse(&cfg.policy.name, &cfg.policy.text).map_err(|e| anyhow::anyhow!("{e}"))?;
    let scenario = match &cfg.scenario {
        Some(s) => Scenario::parse(&s.name, &s.text)?,
        None => Scenario::default(),
    };
    let (format, trace) = trace::parse(&cfg.jobs.name, &cfg.jobs.text)?;
    let mut prices = read_series(&cfg.prices, scenario.prices.as_ref(), "price_per_kwh")?;
    let mut carbon = match &cfg.carbon {
        Some(c) => read_series(c, scenario.carbon.as_ref(), "carbon_g_per_kwh")?,
        None => Series::default(),
    };
    let mut carbon_note = None;
    if let (Some(py), Some(cy)) = (
        series_year(&prices, site.timezone),
        series_year(&carbon, site.timezone),
    ) {
        if py != cy {
            // the same alignment as the trace's: whole weeks, weekday and hour kept
            let weeks = ((f64::from(py - cy) * 365.2425) / 7.0).round();
            let shift = weeks * 7.0 * 86400.0;
            carbon = Series::new(
                carbon
                    .points()
                    .iter()
                    .map(|(t, v)| (*t + shift, *v))
                    .collect(),
            );
            carbon_note = Some(format!(
                "carbon series from {cy} moved by {weeks} weeks into {py}"
            ));
        }
    }
    if !scenario.price_spike.is_empty() {
        let mut pts = prices.points().to_vec();
        scenario.spike(&mut pts);
        prices = Series::new(pts);
    }
    let mut budget_kw = site.facility_budget_kw();
    if let Some(c) = &scenario.contract {
        // a contract limits what the whole facility draws, not each feed: the feeds keep
        // their ratings, and the policy is told the limit as its `site` budget (as an
        // operator would write it), unless it already has a lower one
        budget_kw = c.limit_kw;
        let limits = &mut policy.budget.limits;
        match limits.iter_mut().find(|l| l.scope == "site") {
            Some(l) if l.limit_kw * l.derate <= c.limit_kw => {}
            Some(l) => {
                l.limit_kw = c.limit_kw;
                l.derate = 1.0;
            }
            None => limits.push(policies::policy::Limit {
                scope: "site".into(),
                name: site.name.clone(),
                limit_kw: c.limit_kw,
                derate: 1.0,
            }),
        }
    }
    let tz = site.timezone;
    let anchor = scenario
        .trace_start
        .or(cfg.from)
        .or_else(|| prices.points().first().map(|p| p.0))
        .unwrap_or(Timestamp::from_secs(0));
    let (align, mut alignment) = alignment(&trace, tz, series_year(&prices, tz), anchor);
    if let Some(n) = carbon_note {
        alignment = format!("{alignment}; {n}");
    }
    let curves = curves::a40();
    anyhow::ensure!(!curves.is_empty(), "no measured GPU curves");
    let (jobs, infeasible) = build_jobs(
        &trace,
        &scenario,
        &align,
        &curves,
        cfg.from,
        cfg.to,
        &cfg.jobs.name,
        &site,
    )?;
    anyhow::ensure!(
        !jobs.is_empty(),
        "{}: no jobs submitted in the window given by --from/--to (after alignment: {alignment})",
        cfg.jobs.name
    );
    let n_jobs = jobs.len();
    let deferrable = jobs.iter().filter(|j| j.job.deferrable).count();
    let tick = scenario.tick_s;
    let first = jobs
        .iter()
        .map(|j| j.job.submit_time)
        .min()
        .unwrap_or(anchor);
    // start on the tick grid, so ticks meet the price steps
    let grid = (tick * 1000.0) as i64;
    let start = Timestamp(first.0.div_euclid(grid) * grid);
    writeln!(
        progress,
        "backtest: {n_jobs} jobs ({deferrable} deferrable) of {} on {} GPUs; {alignment}",
        cfg.jobs.name,
        site.gpus().len()
    )?;

    let units: Vec<String> = site.cooling.iter().map(|u| u.id.clone()).collect();
    let (sc, units2) = (scenario.clone(), units.clone());
    let cool = move |t: Timestamp| sc.unit_factors(&units, t);
    let sc2 = scenario.clone();
    let units3 = units2.clone();
    let cool2 = move |t: Timestamp| sc2.unit_factors(&units2, t);
    let sc3 = scenario.clone();
    let cool3 = move |t: Timestamp| sc3.unit_factors(&units3, t);
    let np = policy.node_power.clone();
    let node_model = facility::NodePowerModel {
        boot_s: np.boot_s,
        boot_s_by_model: np.boot_s_by_model.clone(),
        shutdown_s: np.shutdown_s,
        off_w: np.off_w,
    };
    let mut psave = Facility::new(
        site.clone(),
        curves.clone(),
        prices.clone(),
        carbon.clone(),
        jobs.clone(),
        budget_kw,
        Box::new(cool3),
        start,
    )
    .with_node_power(
        facility::NodeMode::PowerSave {
            suspend_s: scenario.suspend_time_s,
        },
        node_model.clone(),
    );
    let mut base = Facility::new(
        site.clone(),
        curves.clone(),
        prices.clone(),
        carbon.clone(),
        jobs.clone(),
        budget_kw,
        Box::new(cool),
        start,
    );
    let mut pol = Facility::new(
        site.clone(),
        curves,
        prices.clone(),
        carbon.clone(),
        jobs,
        budget_kw,
        Box::new(cool2),
        start,
    )
    .with_node_power(
        if np.enabled {
            facility::NodeMode::Managed
        } else {
            facility::NodeMode::AlwaysOn
        },
        node_model,
    );
    let store = Store::new(Box::new(Discard {
        seq: Default::default(),
    }));
    let mut control = ControlLoop::restore(site.clone(), policy, store, 3600.0)?.without_records();
    let mut deferred = std::collections::BTreeSet::new();
    let mut series = Series2 {
        baseline: Vec::new(),
        policy: Vec::new(),
        power_save: Vec::new(),
    };
    let mut next_note = start + 7.0 * 86400.0;
    let mut ticks = 0u64;
    let mut events = ReplayEvents::new(
        control.policy(),
        &site,
        scenario.sample_s,
        control::cadence::DEFAULT_EVENT_DEBOUNCE_MS,
        control::cadence::DEFAULT_EVENT_MAX_PER_S,
    );
    loop {
        let now = pol.now();
        // the controller's tick, as serve runs it: forecast, telemetry, jobs → plan
        let fc = crate::forecast(pol.prices(), pol.carbon(), now, 48.0 * 3600.0);
        // for node power: the price now above the mean of the next 24 h
        let expensive = pol.price_at(now).is_some_and(|p| {
            fc.price
                .window(now, now + 24.0 * 3600.0)
                .is_some_and(|w| p > w.mean)
        });
        control.set_forecast(fc);
        let samples = events.take(pol.poll(now));
        let jobs = pol.take_jobs();
        let report = control.tick(now, samples, jobs, &mut pol);
        events.ticked();
        ticks += 1;
        if np.enabled {
            // node power, as an actuation beside caps and holds: nodes with no work
            // and none planned within their boot time go down, come back before
            let actions = policies::node_power::decide(
                &pol.node_views(),
                &node_needs(&pol, &report.planned_starts, now),
                &np,
                policies::node_power::Inputs {
                    expensive,
                    downs_last_min: pol.downs_last_min(now),
                },
                now,
            );
            pol.apply_node_actions(&actions, now, np.lease_s);
        }
        for d in &report.decisions {
            if let (Action::Hold { .. }, Target::Job { job }) = (&d.action, &d.target) {
                deferred.insert(job.clone());
            }
        }
        base.forget_changes();
        psave.forget_changes();
        let all_done = base.done() && pol.done() && psave.done();
        if ticks % 12 == 1 || all_done {
            series.baseline.push(base.point());
            series.policy.push(pol.point());
            series.power_save.push(psave.point());
        }
        if all_done {
            break;
        }
        if now >= next_note {
            writeln!(
                progress,
                "  {}: {} waiting, {} running under the policy",
                now.to_datetime().with_timezone(&tz).format("%Y-%m-%d"),
                series.policy.last().map_or(0, |p| p.waiting),
                series.policy.last().map_or(0, |p| p.running)
            )?;
            next_note = next_note + 7.0 * 86400.0;
        }
        // nothing waits and nothing more arrives: hourly ticks until the last job ends
        let dt = if base.draining() && pol.draining() && psave.draining() {
            let hour = 3_600_000;
            let next = (now.0.div_euclid(hour) + 1) * hour;
            (next - now.0) as f64 / 1000.0
        } else {
            tick
        };
        let mut runs = Runs {
            base: &mut base,
            pol: &mut pol,
            psave: &mut psave,
        };
        runs.between_ticks(dt, &mut control, &mut events, &mut deferred);
    }
    let end = pol.now();
    let decisions = control.counters.decisions;
    let charge = site
        .tariff
        .as_ref()
        .and_then(|t| t.demand_charge_per_kw)
        .unwrap_or(0.0);
    let measured = cfg.carbon.is_some();
    let none = std::collections::BTreeSet::new();
    let b = summarize_run(&base, &none, 0, charge, measured);
    let p = summarize_run(&pol, &deferred, decisions, charge, measured);
    let ps = summarize_run(&psave, &none, 0, charge, measured);
    // the wait the policy added: per job, how much longer it waited than in the baseline
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
    let (wb, wp) = (wait(&base), wait(&pol));
    let added_h: f64 = wp
        .iter()
        .map(|(id, w)| (w - wb.get(id).copied().unwrap_or(0.0)).max(0.0))
        .sum::<f64>()
        / 3600.0;
    let saving_per_wait_hour = if added_h > 0.0 {
        (b.cost - p.cost) / added_h
    } else {
        0.0
    };
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
    let summary = Summary {
        site: site.name.clone(),
        gpus: base.gpu_count(),
        trace: cfg.jobs.name.clone(),
        trace_format: format.name().to_string(),
        jobs: n_jobs,
        deferrable_jobs: deferrable,
        jobs_without_feasible_deadline: infeasible,
        alignment,
        start: start.to_string(),
        end: end.to_string(),
        span_h: end.secs_since(start) / 3600.0,
        budget_kw,
        seed: scenario.seed,
        tick_s: tick,
        sample_s: scenario.sample_s,
        event_evaluations: events.evaluations(),
        scenario: lines,
        carbon_gap_s: pol.totals.carbon_gap_s,
        savings_pct: savings(&b, &p),
        savings_vs_power_save_pct: savings(&ps, &p),
        deferred_wait_mean_s: p.deferred_wait_mean_s,
        saving_per_wait_hour,
        suspend_time_s: scenario.suspend_time_s,
        baseline: b,
        policy: p,
        power_save: ps,
        elapsed_s: started.elapsed().as_secs_f64(),
    };
    std::fs::create_dir_all(&cfg.out)
        .with_context(|| format!("cannot create {}", cfg.out.display()))?;
    std::fs::write(
        cfg.out.join("summary.json"),
        serde_json::to_string_pretty(&summary)? + "\n",
    )?;
    std::fs::write(
        cfg.out.join("report.html"),
        report::html(&summary, &site, &series),
    )?;
    Ok(summary)
}

impl Summary {
    /// The end-of-run table.
    pub fn table(&self, out: &Path) -> String {
        use std::fmt::Write as _;
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
        type Cell = fn(&RunSummary) -> String;
        let rows: Vec<(&str, Cell)> = vec![
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
        ];
        for (k, f) in rows {
            let _ = writeln!(
                s,
                "  {k:<24} {:>16} {:>16} {:>16}",
                f(runs[0]),
                f(runs[1]),
                f(runs[2])
            );
        }
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
        let _ = writeln!(
            s,
            "  replayed in {:.1} s; wrote {}/summary.json and {}/report.html",
            self.elapsed_s,
            out.display(),
            out.display()
        );
        s
    }
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// The three replays stepped together: the baseline, the policy's and the power-saving
/// one (only the policy's is evaluated).
struct Runs<'a> {
    base: &'a mut Facility,
    pol: &'a mut Facility,
    psave: &'a mut Facility,
}

impl Runs<'_> {
    /// One step of all three; `cycle`: with the scheduler's cycle (the first step of a
    /// tick interval), else the physics only.
    fn step(&mut self, dt_s: f64, cycle: bool) {
        for f in [&mut *self.base, &mut *self.pol, &mut *self.psave] {
            if cycle {
                f.step(dt_s);
            } else {
                f.advance(dt_s);
            }
        }
    }

    /// From one tick to the next (`dt` on): with the scenario's `sample_s`, the policy's
    /// facility read between them and its crossings evaluated at once, as `serve`
    /// does; else one step.
    fn between_ticks(
        &mut self,
        dt: f64,
        control: &mut ControlLoop,
        events: &mut ReplayEvents,
        deferred: &mut std::collections::BTreeSet<String>,
    ) {
        let tick_at = self.pol.now() + dt;
        let mut first = true;
        loop {
            let now = self.pol.now();
            match events.next(now, tick_at) {
                // read at the ticks only: one step, as the backtest always took it
                Stop::Tick if first => return self.step(dt, true),
                Stop::Tick => return self.step(dt_s(now, tick_at), false),
                Stop::Sample(t) => {
                    self.step(dt_s(now, t), first);
                    first = false;
                    let samples = self.pol.poll(t);
                    events.sampled(control.snapshot(), samples, t);
                }
                Stop::Evaluate(t) => {
                    self.step(dt_s(now, t), first);
                    first = false;
                    let fc =
                        crate::forecast(self.pol.prices(), self.pol.carbon(), t, 48.0 * 3600.0);
                    control.set_forecast(fc);
                    let jobs = self.pol.take_jobs();
                    let report = control.tick(t, events.take(Vec::new()), jobs, &mut *self.pol);
                    events.evaluated(t);
                    for d in &report.decisions {
                        if let (Action::Hold { .. }, Target::Job { job }) = (&d.action, &d.target) {
                            deferred.insert(job.clone());
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trace_from_another_year_keeps_its_weekday_and_local_hour() {
        let text = "timestamp,duration,num_gpus,gpu_time,cluster\n\
                    2017-10-09 07:01:55,66.0,1,66.0,a\n\
                    2017-10-29 02:30:00,60.0,1,60.0,a\n\
                    2017-12-24 23:00:00,60.0,1,60.0,a\n";
        let (_, jobs) = trace::parse("p.csv", text).expect("trace");
        let tz: Tz = "Europe/Berlin".parse().expect("tz");
        let (align, statement) = alignment(&jobs, tz, Some(2024), Timestamp(0));
        assert!(statement.contains("365 weeks"), "{statement}");
        for j in &jobs {
            let When::Local(orig) = j.submit else {
                panic!("local times")
            };
            let moved = align(&j.submit)
                .to_datetime()
                .with_timezone(&tz)
                .naive_local();
            assert_eq!(moved.year(), 2024);
            assert_eq!(moved.weekday(), orig.weekday());
            assert_eq!(moved.time(), orig.time(), "{orig} -> {moved}");
        }
    }

    fn managed(jobs: Vec<SimJob>) -> Facility {
        let site = Site::parse(
            "site.toml",
            include_str!("../../../tests/fixtures/backtest/site.toml"),
        )
        .expect("site");
        let start = Timestamp::from_secs(1_717_372_800);
        Facility::new(
            site,
            curves::a40(),
            Series::default(),
            Series::default(),
            jobs,
            1e9,
            Box::new(|_| vec![1.0]),
            start,
        )
        .with_node_power(facility::NodeMode::Managed, Default::default())
    }

    fn down(node: &str) -> policies::node_power::NodeAction {
        policies::node_power::NodeAction::Down {
            node: node.into(),
            reason: "test".into(),
        }
    }

    fn power_of(f: &Facility, node: &str) -> policies::node_power::Power {
        f.node_views()
            .into_iter()
            .find(|n| n.id == node)
            .expect("node")
            .power
    }

    /// Safety invariant 9: a powered-down node comes back when the controller stops
    /// renewing its lease.
    #[test]
    fn a_node_the_controller_stops_renewing_comes_back_after_its_lease() {
        use policies::node_power::Power;
        let mut f = managed(Vec::new());
        let node = f.node_views()[0].id.clone();
        let t0 = f.now();
        f.apply_node_actions(&[down(&node)], t0, 900.0);
        // the controller renews every tick for an hour: the node stays off
        for _ in 0..12 {
            f.step(300.0);
            let now = f.now();
            f.apply_node_actions(&[], now, 900.0);
            assert!(
                matches!(
                    power_of(&f, &node),
                    Power::Off { .. } | Power::ShuttingDown { .. }
                ),
                "{:?}",
                power_of(&f, &node)
            );
        }
        assert!(matches!(power_of(&f, &node), Power::Off { .. }));
        // the controller dies: within the lease and a boot time the node is on again
        let died = f.now();
        while f.now().secs_since(died) < 900.0 + 300.0 + 300.0 {
            f.step(300.0);
        }
        assert_eq!(power_of(&f, &node), Power::On);
        assert_eq!(f.totals.lease_resumes, 1);
    }

    /// A job that arrives while the nodes it needs are off resumes them and starts
    /// after their boot time, with no controller.
    #[test]
    fn waiting_work_resumes_the_nodes_it_needs_without_a_controller() {
        let start = Timestamp::from_secs(1_717_372_800);
        let job = Job {
            id: "big".into(),
            scheduler: "trace".into(),
            name: "big".into(),
            user: "u".into(),
            project: "p".into(),
            class: "training".into(),
            priority: 0,
            gpus: 128,
            allocated: Vec::new(),
            state: JobState::Pending,
            submit_time: start + 1800.0,
            start_time: None,
            end_time: None,
            deadline: None,
            est_duration_s: 600.0,
            deferrable: false,
            preemptible: false,
        };
        let mut f = managed(vec![SimJob::new(job, 600.0, 0, None)]);
        let t0 = f.now();
        let all: Vec<_> = f.node_views().iter().map(|n| down(&n.id)).collect();
        f.apply_node_actions(&all, t0, 1e6);
        while !f.done() && f.now().secs_since(t0) < 6.0 * 3600.0 {
            f.step(300.0);
        }
        assert!(f.done(), "the job ran");
        let j = &f.jobs[0].job;
        let waited = j.start_time.expect("started").secs_since(j.submit_time);
        assert!(waited >= 300.0, "it waited for the boot: {waited} s");
        assert!(f.totals.power_ups >= 16, "{}", f.totals.power_ups);
    }
}
