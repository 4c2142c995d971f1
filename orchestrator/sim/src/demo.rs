//! `powerplane demo`: the simulated facility run under the control loop, as fast as the
//! machine allows, with no external service and no network.
//!
//! It writes `report.html`, `report.csv` (the facility minute by minute), `jobs.csv`
//! (energy, cost and carbon per job, from the ledger), `audit.jsonl` (every decision,
//! read back from the store) and `state.redb` (the embedded store itself).

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use integrations::store::{LedgerEntry, Store};
use policies::{Action, Decision, Policy, Target};
use telemetry::prices::Series;
use telemetry::{Site, Timestamp};

use crate::events::{dt_s, ReplayEvents, Stop};
use crate::workload::Workload;
use crate::{Facility, SimStats};
use control::{ControlLoop, Telemetry};
use integrations::store::embedded::EmbeddedBackend;

mod output;

pub use control::examples::{DEFAULT_POLICY, DEFAULT_SITE};
pub const DEFAULT_PRICES: &str = include_str!("../../../examples/demo/prices.csv");
/// 06:00 local on the demo's first price day: the morning peak lies ahead.
pub const DEFAULT_START: &str = "2024-06-03T06:00:00+02:00";

/// One input file: its name for messages, and its text.
#[derive(Debug, Clone)]
pub struct Input {
    pub name: String,
    pub text: String,
}

impl Input {
    pub fn builtin(name: &str, text: &str) -> Self {
        Input {
            name: name.to_string(),
            text: text.to_string(),
        }
    }

    pub fn read(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        Ok(Input {
            name: path.display().to_string(),
            text,
        })
    }
}

#[derive(Debug, Clone)]
pub struct DemoConfig {
    pub minutes: u32,
    pub seed: u64,
    pub tick_s: f64,
    pub out: PathBuf,
    pub site: Input,
    pub policy: Input,
    pub prices: Input,
    pub start: Timestamp,
    /// Cooling faults to inject (`--fault`).
    pub faults: Vec<crate::Fault>,
    /// Start from the facility as it was before powerplane acted (inlets and power
    /// settled with no caps): the demo before predictive control. Otherwise the
    /// facility is settled under the first tick's plan.
    pub uncontrolled_start: bool,
    /// Read the facility this often (simulated seconds) between ticks too, and
    /// evaluate crossings as `serve` does (see [`crate::events`]); `None`: at
    /// the ticks only.
    pub sample_s: Option<f64>,
}

/// The facility at one tick.
#[derive(Debug, Clone)]
pub(crate) struct Point {
    pub(crate) t: Timestamp,
    pub(crate) it_kw: f64,
    pub(crate) cooling_kw: f64,
    pub(crate) price: f64,
    pub(crate) carbon: f64,
    pub(crate) inlets: Vec<f64>,
    pub(crate) rack_kw: Vec<f64>,
    pub(crate) capped_gpus: usize,
    pub(crate) held_jobs: usize,
    pub(crate) running_jobs: usize,
    /// Each rack's predicted inlet (the predictive thermal rule): (°C, seconds ahead).
    pub(crate) predicted: Vec<Option<(f64, f64)>>,
}

/// What the demo reports at the end.
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    pub site: String,
    /// The site's time zone, for the times the table shows.
    pub timezone: chrono_tz::Tz,
    pub minutes: u32,
    pub seed: u64,
    pub start: Timestamp,
    pub it_kwh: f64,
    pub cooling_kwh: f64,
    pub cost: f64,
    pub currency: String,
    pub carbon_kg: f64,
    pub budget_kw: f64,
    pub peak_it_kw: f64,
    pub over_budget_s: f64,
    pub hottest_inlet_c: f64,
    pub hottest_rack: String,
    pub hottest_limit_c: f64,
    pub over_inlet_limit_s: f64,
    pub cap_decisions: usize,
    pub peak_capped_gpus: usize,
    pub capped_gpu_hours: f64,
    pub jobs_deferred: usize,
    pub releases_by_price: usize,
    pub releases_by_deadline: usize,
    pub releases_other: usize,
    pub audit_records: u64,
    pub ledger_entries: u64,
    pub samples_rejected: u64,
    pub sim: SimStats,
}

/// Runs the demo; progress lines go to `progress`.
pub fn run(cfg: &DemoConfig, progress: &mut dyn Write) -> Result<Summary> {
    let (site, mut control, mut fac) = setup(cfg)?;

    let ticks = (f64::from(cfg.minutes) * 60.0 / cfg.tick_s).round() as u64;
    let mut points = Vec::with_capacity(ticks as usize + 1);
    let mut decisions: Vec<Decision> = Vec::new();
    let mut next_note = 0.0;
    let mut events = ReplayEvents::new(
        control.policy(),
        &site,
        cfg.sample_s,
        control::cadence::DEFAULT_EVENT_DEBOUNCE_MS,
        control::cadence::DEFAULT_EVENT_MAX_PER_S,
    );
    for i in 0..=ticks {
        if i > 0 {
            between_ticks(
                &mut fac,
                &mut control,
                &mut events,
                cfg.tick_s,
                progress,
                &mut decisions,
            )?;
        }
        let now = fac.now();
        let samples = events.take(fac.poll(now));
        let jobs = fac.jobs();
        control.set_forecast(fac.forecast(now));
        let report = control.tick(now, samples, jobs, &mut fac);
        events.ticked();
        if let Some(e) = report.store_error {
            writeln!(progress, "warning: store: {e}")?;
        }
        decisions.extend(report.decisions);
        if i == 0 && !cfg.uncontrolled_start {
            fac.settle();
        }
        let mut p = point(&fac, &control, now);
        p.predicted = site
            .racks
            .iter()
            .map(|r| {
                report
                    .predictions
                    .get(&r.id)
                    .map(|q| (q.predicted_c, q.horizon_s))
            })
            .collect();
        let elapsed_min = now.secs_since(cfg.start) / 60.0;
        if elapsed_min >= next_note || i == ticks {
            writeln!(
                progress,
                "{}",
                progress_line(&site, &p, elapsed_min, cfg.minutes)
            )?;
            next_note += 30.0;
        }
        points.push(p);
    }
    if events.evaluations() > 0 {
        writeln!(
            progress,
            "{} evaluations on events between ticks ({} crossings)",
            events.evaluations(),
            events.crossings()
        )?;
    }
    finish(cfg, &site, &fac, control, &points)
}

/// The site and policy read, the store opened afresh in the output folder, the
/// control loop on it and the simulated facility.
fn setup(cfg: &DemoConfig) -> Result<(Site, ControlLoop, Facility)> {
    let site = Site::parse(&cfg.site.name, &cfg.site.text).map_err(|e| anyhow::anyhow!("{e}"))?;
    let policy =
        Policy::parse(&cfg.policy.name, &cfg.policy.text).map_err(|e| anyhow::anyhow!("{e}"))?;
    let prices = Series::from_csv(&cfg.prices.name, &cfg.prices.text, "price_per_kwh")?;
    let carbon = Series::from_csv(&cfg.prices.name, &cfg.prices.text, "carbon_g_per_kwh")
        .unwrap_or_default();
    std::fs::create_dir_all(&cfg.out)
        .with_context(|| format!("cannot create {}", cfg.out.display()))?;
    let db = cfg.out.join("state.redb");
    if db.exists() {
        std::fs::remove_file(&db).with_context(|| format!("cannot replace {}", db.display()))?;
    }
    let store = Store::new(Box::new(EmbeddedBackend::open(&db)?));
    let control = ControlLoop::restore(site.clone(), policy, store, 60.0)?;
    let fac = Facility::new(
        site.clone(),
        prices,
        carbon,
        Workload::default(),
        cfg.seed,
        cfg.start,
    )
    .with_faults(cfg.faults.clone());
    Ok((site, control, fac))
}

/// The run ended at the facility's now: the control loop finishes, its audit log and
/// ledger are read back, summarized and written out with the points.
fn finish(
    cfg: &DemoConfig,
    site: &Site,
    fac: &Facility,
    mut control: ControlLoop,
    points: &[Point],
) -> Result<Summary> {
    let end = fac.now();
    control.finish(end)?;
    let counters = control.counters.clone();
    let store = control.store();
    let audit = store.audit(1, usize::MAX)?;
    let ledger: Vec<LedgerEntry> = store
        .ledger(1, usize::MAX)?
        .into_iter()
        .map(|(_, e)| e)
        .collect();
    let summary = summarize(
        cfg,
        site,
        points,
        &audit.iter().map(|a| a.1.clone()).collect::<Vec<_>>(),
        &ledger,
        fac.stats.clone(),
        counters.samples_rejected.values().sum(),
    );
    output::write_outputs(cfg, site, points, &audit, &ledger, fac, &summary)?;
    Ok(summary)
}

/// A step of a tick interval: the first with the scheduler's cycle, the others without.
fn step(fac: &mut Facility, first: bool, dt_s: f64) {
    if first {
        fac.step(dt_s);
    } else {
        fac.advance(dt_s);
    }
}

/// From one tick to the next (`tick_s` on): with `sample_s`, the facility read
/// between them and the crossings evaluated at once, as `serve` does; else one step.
fn between_ticks(
    fac: &mut Facility,
    control: &mut ControlLoop,
    events: &mut ReplayEvents,
    tick_s: f64,
    progress: &mut dyn Write,
    decisions: &mut Vec<Decision>,
) -> Result<()> {
    let tick_at = fac.now() + tick_s;
    let mut first = true;
    loop {
        let now = fac.now();
        match events.next(now, tick_at) {
            // read at the ticks only: one step, as the demo always took it
            Stop::Tick if first => {
                fac.step(tick_s);
                return Ok(());
            }
            Stop::Tick => {
                fac.advance(dt_s(now, tick_at));
                return Ok(());
            }
            // the scheduler cycles once per tick, in the interval's first step
            Stop::Sample(t) => {
                step(fac, first, dt_s(now, t));
                first = false;
                let samples = fac.poll(t);
                events.sampled(control.snapshot(), samples, t);
            }
            Stop::Evaluate(t) => {
                step(fac, first, dt_s(now, t));
                first = false;
                let jobs = fac.jobs();
                control.set_forecast(fac.forecast(t));
                let report = control.tick(t, events.take(Vec::new()), jobs, fac);
                events.evaluated(t);
                if let Some(e) = report.store_error {
                    writeln!(progress, "warning: store: {e}")?;
                }
                decisions.extend(report.decisions);
            }
        }
    }
}

fn point(fac: &Facility, control: &ControlLoop, now: Timestamp) -> Point {
    let jobs = control.registry().active();
    Point {
        t: now,
        it_kw: fac.it_power_w() / 1000.0,
        cooling_kw: fac.cooling_power_w() / 1000.0,
        price: fac.price_at(now).unwrap_or(0.0),
        carbon: fac.carbon_at(now).unwrap_or(0.0),
        inlets: fac.inlet_c().to_vec(),
        rack_kw: fac.rack_power_w().iter().map(|w| w / 1000.0).collect(),
        capped_gpus: fac.capped_gpus(),
        held_jobs: control.state().holds.len(),
        running_jobs: jobs
            .iter()
            .filter(|j| j.state == telemetry::JobState::Running)
            .count(),
        predicted: Vec::new(),
    }
}

pub(crate) fn local(site: &Site, t: Timestamp, fmt: &str) -> String {
    t.to_datetime()
        .with_timezone(&site.timezone)
        .format(fmt)
        .to_string()
}

fn progress_line(site: &Site, p: &Point, elapsed: f64, total: u32) -> String {
    let (ri, hot) = hottest(&p.inlets);
    format!(
        "[{:>4.0}/{total} min] {}  IT {:5.1} kW of {:.1} kW budget  price {:.3} {}/kWh  hottest inlet {:.1} °C ({})  {:>3} GPUs capped  {:>2} jobs held  {:>3} running",
        elapsed,
        local(site, p.t, "%H:%M"),
        p.it_kw,
        site.facility_budget_kw(),
        p.price,
        site.currency,
        hot,
        site.racks.get(ri).map_or("-", |r| r.id.as_str()),
        p.capped_gpus,
        p.held_jobs,
        p.running_jobs
    )
}

pub(crate) fn hottest(inlets: &[f64]) -> (usize, f64) {
    inlets
        .iter()
        .copied()
        .enumerate()
        .fold(
            (0, f64::NEG_INFINITY),
            |a, (i, t)| if t > a.1 { (i, t) } else { a },
        )
}

fn summarize(
    cfg: &DemoConfig,
    site: &Site,
    points: &[Point],
    audit: &[Decision],
    ledger: &[LedgerEntry],
    sim: SimStats,
    rejected: u64,
) -> Summary {
    let dt = cfg.tick_s / 3600.0;
    let budget = site.facility_budget_kw();
    let (mut hot_c, mut hot_rack, mut hot_limit) = (f64::NEG_INFINITY, String::new(), 0.0);
    let mut over_inlet = 0.0;
    for p in points {
        for (i, t) in p.inlets.iter().enumerate() {
            if *t > hot_c {
                hot_c = *t;
                hot_rack = site.racks[i].id.clone();
                hot_limit = site.racks[i].inlet_limit_c;
            }
        }
        if p.inlets
            .iter()
            .zip(&site.racks)
            .any(|(t, r)| *t > r.inlet_limit_c)
        {
            over_inlet += cfg.tick_s;
        }
    }
    let mut deferred = BTreeSet::new();
    let (mut by_price, mut by_deadline, mut other) = (0, 0, 0);
    for d in audit {
        match (&d.action, &d.target) {
            (Action::Hold { .. }, Target::Job { job }) => {
                deferred.insert(job.clone());
            }
            (Action::Release, _) if d.reason.contains("latest start") => by_deadline += 1,
            (Action::Release, _) if d.reason.contains("price") => by_price += 1,
            (Action::Release, _) => other += 1,
            _ => {}
        }
    }
    let sum = |f: &dyn Fn(&LedgerEntry) -> f64| ledger.iter().map(f).sum::<f64>();
    Summary {
        site: site.name.clone(),
        timezone: site.timezone,
        minutes: cfg.minutes,
        seed: cfg.seed,
        start: cfg.start,
        it_kwh: points.iter().skip(1).map(|p| p.it_kw * dt).sum(),
        cooling_kwh: points.iter().skip(1).map(|p| p.cooling_kw * dt).sum(),
        cost: sum(&|e| e.cost),
        currency: site.currency.clone(),
        carbon_kg: sum(&|e| e.carbon_kg),
        budget_kw: budget,
        peak_it_kw: points.iter().map(|p| p.it_kw).fold(0.0, f64::max),
        over_budget_s: points.iter().filter(|p| p.it_kw > budget + 1e-9).count() as f64
            * cfg.tick_s,
        hottest_inlet_c: hot_c,
        hottest_rack: hot_rack,
        hottest_limit_c: hot_limit,
        over_inlet_limit_s: over_inlet,
        cap_decisions: audit
            .iter()
            .filter(|d| matches!(d.action, Action::Cap { .. } | Action::Uncap))
            .count(),
        peak_capped_gpus: points.iter().map(|p| p.capped_gpus).max().unwrap_or(0),
        capped_gpu_hours: sim.capped_gpu_s / 3600.0,
        jobs_deferred: deferred.len(),
        releases_by_price: by_price,
        releases_by_deadline: by_deadline,
        releases_other: other,
        audit_records: audit.len() as u64,
        ledger_entries: ledger.len() as u64,
        samples_rejected: rejected,
        sim,
    }
}

impl Summary {
    /// The end-of-run table.
    pub fn table(&self, out: &Path) -> String {
        let mut s = String::new();
        let start = self.start.to_datetime().with_timezone(&self.timezone);
        let _ = writeln!(
            s,
            "\npowerplane demo: {}, {} min from {} (seed {})\n",
            self.site,
            self.minutes,
            start.format("%Y-%m-%d %H:%M %Z"),
            self.seed
        );
        for (k, v) in self.energy_rows().into_iter().chain(self.control_rows()) {
            let _ = writeln!(s, "  {k:<18} {v}");
        }
        let _ = writeln!(s, "\n  wrote {0}/report.html, {0}/report.csv, {0}/jobs.csv, {0}/audit.jsonl, {0}/state.redb", out.display());
        s
    }

    /// The table's rows on energy, cost, power and heat.
    fn energy_rows(&self) -> Vec<(&'static str, String)> {
        vec![
            (
                "energy",
                format!(
                    "{:.1} kWh IT + {:.1} kWh cooling = {:.1} kWh",
                    self.it_kwh,
                    self.cooling_kwh,
                    self.it_kwh + self.cooling_kwh
                ),
            ),
            (
                "cost",
                format!(
                    "{:.2} {} ({:.3} {}/kWh on average)",
                    self.cost,
                    self.currency,
                    self.cost / (self.it_kwh + self.cooling_kwh).max(1e-9),
                    self.currency
                ),
            ),
            ("carbon", format!("{:.1} kg CO2", self.carbon_kg)),
            (
                "peak IT power",
                format!(
                    "{:.1} kW against a {:.1} kW budget ({:.1}%)",
                    self.peak_it_kw,
                    self.budget_kw,
                    100.0 * self.peak_it_kw / self.budget_kw
                ),
            ),
            ("over budget", format!("{:.0} s", self.over_budget_s)),
            (
                "hottest inlet",
                format!(
                    "{:.1} °C at rack {} against its {:.1} °C limit",
                    self.hottest_inlet_c, self.hottest_rack, self.hottest_limit_c
                ),
            ),
            (
                "over inlet limit",
                format!("{:.0} s (any rack)", self.over_inlet_limit_s),
            ),
        ]
    }

    /// The table's rows on what the controller did, the jobs and the records.
    fn control_rows(&self) -> Vec<(&'static str, String)> {
        vec![
            (
                "caps",
                format!(
                    "{} cap decisions, at most {} GPUs capped at once, {:.1} GPU-hours capped",
                    self.cap_decisions, self.peak_capped_gpus, self.capped_gpu_hours
                ),
            ),
            (
                "deferred jobs",
                format!(
                "{} held; released: {} when the price fell, {} at their latest start, {} otherwise",
                self.jobs_deferred,
                self.releases_by_price,
                self.releases_by_deadline,
                self.releases_other
            ),
            ),
            (
                "jobs",
                format!(
                    "{} submitted, {} started, {} finished, {} deadline misses",
                    self.sim.jobs_submitted,
                    self.sim.jobs_started,
                    self.sim.jobs_finished,
                    self.sim.deadline_misses
                ),
            ),
            (
                "work delivered",
                format!("{:.2} GPU-hours", self.sim.work_gpu_s / 3600.0),
            ),
            (
                "records",
                format!(
                    "{} decisions in the audit log, {} ledger entries, {} samples rejected",
                    self.audit_records, self.ledger_entries, self.samples_rejected
                ),
            ),
        ]
    }
}
