//! `powerplane demo`: the simulated facility run under the control loop, as fast as the
//! machine allows, with no external service and no network.
//!
//! It writes `report.html`, `report.csv` (the facility minute by minute), `jobs.csv`
//! (energy, cost and carbon per job, from the ledger), `audit.jsonl` (every decision,
//! read back from the store) and `state.redb` (the embedded store itself).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use integrations::prices::Series;
use integrations::store::{Account, LedgerEntry, Store};
use policies::{Action, Decision, Policy, Target};
use telemetry::{Site, Timestamp};

use crate::control::{ControlLoop, Telemetry};
use crate::embedded::EmbeddedBackend;
use crate::report::{bars, csv_field, escape, page, Chart, Line, Rule};
use crate::sim::workload::Workload;
use crate::sim::{Facility, SimStats};

pub const DEFAULT_SITE: &str = include_str!("../../examples/demo/site.toml");
pub const DEFAULT_POLICY: &str = include_str!("../../examples/demo/policy.toml");
pub const DEFAULT_PRICES: &str = include_str!("../../examples/demo/prices.csv");
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
}

/// The facility at one tick.
#[derive(Debug, Clone)]
struct Point {
    t: Timestamp,
    it_kw: f64,
    cooling_kw: f64,
    price: f64,
    carbon: f64,
    inlets: Vec<f64>,
    rack_kw: Vec<f64>,
    capped_gpus: usize,
    held_jobs: usize,
    running_jobs: usize,
}

/// What the demo reports at the end.
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    pub site: String,
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
    let mut control = ControlLoop::restore(site.clone(), policy, store, 60.0)?;
    let mut fac = Facility::new(
        site.clone(),
        prices,
        carbon,
        Workload::default(),
        cfg.seed,
        cfg.start,
    );

    let ticks = (f64::from(cfg.minutes) * 60.0 / cfg.tick_s).round() as u64;
    let mut points = Vec::with_capacity(ticks as usize + 1);
    let mut decisions: Vec<Decision> = Vec::new();
    let mut next_note = 0.0;
    for i in 0..=ticks {
        if i > 0 {
            fac.step(cfg.tick_s);
        }
        let now = fac.now();
        let samples = fac.poll(now);
        let jobs = fac.jobs();
        let report = control.tick(now, samples, jobs, &mut fac);
        if let Some(e) = report.store_error {
            writeln!(progress, "warning: store: {e}")?;
        }
        decisions.extend(report.decisions);
        let p = point(&fac, &control, now);
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
        &site,
        &points,
        &audit.iter().map(|a| a.1.clone()).collect::<Vec<_>>(),
        &ledger,
        fac.stats.clone(),
        counters.samples_rejected.values().sum(),
    );
    write_outputs(cfg, &site, &points, &audit, &ledger, &fac, &summary)?;
    Ok(summary)
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
    }
}

fn local(site: &Site, t: Timestamp, fmt: &str) -> String {
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

fn hottest(inlets: &[f64]) -> (usize, f64) {
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
    pub fn table(&self, site: &Site, out: &Path) -> String {
        let mut s = String::new();
        let start = self.start.to_datetime().with_timezone(&site.timezone);
        let _ = writeln!(
            s,
            "\npowerplane demo: {}, {} min from {} (seed {})\n",
            self.site,
            self.minutes,
            start.format("%Y-%m-%d %H:%M %Z"),
            self.seed
        );
        let row = |s: &mut String, k: &str, v: String| {
            let _ = writeln!(s, "  {k:<18} {v}");
        };
        row(
            &mut s,
            "energy",
            format!(
                "{:.1} kWh IT + {:.1} kWh cooling = {:.1} kWh",
                self.it_kwh,
                self.cooling_kwh,
                self.it_kwh + self.cooling_kwh
            ),
        );
        row(
            &mut s,
            "cost",
            format!(
                "{:.2} {} ({:.3} {}/kWh on average)",
                self.cost,
                self.currency,
                self.cost / (self.it_kwh + self.cooling_kwh).max(1e-9),
                self.currency
            ),
        );
        row(&mut s, "carbon", format!("{:.1} kg CO2", self.carbon_kg));
        row(
            &mut s,
            "peak IT power",
            format!(
                "{:.1} kW against a {:.1} kW budget ({:.1}%)",
                self.peak_it_kw,
                self.budget_kw,
                100.0 * self.peak_it_kw / self.budget_kw
            ),
        );
        row(
            &mut s,
            "over budget",
            format!("{:.0} s", self.over_budget_s),
        );
        row(
            &mut s,
            "hottest inlet",
            format!(
                "{:.1} °C at rack {} against its {:.1} °C limit",
                self.hottest_inlet_c, self.hottest_rack, self.hottest_limit_c
            ),
        );
        row(
            &mut s,
            "over inlet limit",
            format!("{:.0} s (any rack)", self.over_inlet_limit_s),
        );
        row(
            &mut s,
            "caps",
            format!(
                "{} cap decisions, at most {} GPUs capped at once, {:.1} GPU-hours capped",
                self.cap_decisions, self.peak_capped_gpus, self.capped_gpu_hours
            ),
        );
        row(
            &mut s,
            "deferred jobs",
            format!(
                "{} held; released: {} when the price fell, {} at their latest start, {} otherwise",
                self.jobs_deferred,
                self.releases_by_price,
                self.releases_by_deadline,
                self.releases_other
            ),
        );
        row(
            &mut s,
            "jobs",
            format!(
                "{} submitted, {} started, {} finished, {} deadline misses",
                self.sim.jobs_submitted,
                self.sim.jobs_started,
                self.sim.jobs_finished,
                self.sim.deadline_misses
            ),
        );
        row(
            &mut s,
            "records",
            format!(
                "{} decisions in the audit log, {} ledger entries, {} samples rejected",
                self.audit_records, self.ledger_entries, self.samples_rejected
            ),
        );
        let _ = writeln!(s, "\n  wrote {0}/report.html, {0}/report.csv, {0}/jobs.csv, {0}/audit.jsonl, {0}/state.redb", out.display());
        s
    }
}

fn write_outputs(
    cfg: &DemoConfig,
    site: &Site,
    points: &[Point],
    audit: &[(u64, Decision)],
    ledger: &[LedgerEntry],
    fac: &Facility,
    summary: &Summary,
) -> Result<()> {
    let out = &cfg.out;
    let mut jsonl = String::new();
    for (_, d) in audit {
        jsonl.push_str(&serde_json::to_string(d)?);
        jsonl.push('\n');
    }
    std::fs::write(out.join("audit.jsonl"), jsonl)?;
    std::fs::write(out.join("report.csv"), timeseries_csv(site, points))?;
    std::fs::write(out.join("jobs.csv"), jobs_csv(fac, ledger))?;
    std::fs::write(
        out.join("report.html"),
        html(site, points, ledger, audit, summary),
    )?;
    Ok(())
}

fn timeseries_csv(site: &Site, points: &[Point]) -> String {
    let mut s = String::from("time,it_kw,cooling_kw,budget_kw,price_per_kwh,carbon_g_per_kwh,hottest_inlet_c,hottest_rack,capped_gpus,held_jobs,running_jobs");
    for r in &site.racks {
        let _ = write!(s, ",{0}_kw,{0}_inlet_c", csv_field(&r.id));
    }
    s.push('\n');
    for p in points {
        let (ri, hot) = hottest(&p.inlets);
        let _ = write!(
            s,
            "{},{:.3},{:.3},{:.3},{:.4},{:.1},{:.2},{},{},{},{}",
            p.t,
            p.it_kw,
            p.cooling_kw,
            site.facility_budget_kw(),
            p.price,
            p.carbon,
            hot,
            csv_field(&site.racks[ri].id),
            p.capped_gpus,
            p.held_jobs,
            p.running_jobs
        );
        for (kw, t) in p.rack_kw.iter().zip(&p.inlets) {
            let _ = write!(s, ",{kw:.3},{t:.2}");
        }
        s.push('\n');
    }
    s
}

fn jobs_csv(fac: &Facility, ledger: &[LedgerEntry]) -> String {
    let mut per_job: BTreeMap<&str, (f64, f64, f64)> = BTreeMap::new();
    for e in ledger {
        if let Account::Job { job, .. } = &e.account {
            let v = per_job.entry(job.as_str()).or_default();
            v.0 += e.energy_kwh;
            v.1 += e.cost;
            v.2 += e.carbon_kg;
        }
    }
    let mut s = String::from("job,project,user,class,gpus,state,submitted,started,finished,wait_s,energy_kwh,cost,carbon_kg\n");
    for j in fac.jobs() {
        let (kwh, cost, co2) = per_job.get(j.id.as_str()).copied().unwrap_or_default();
        let wait = j.start_time.map(|st| st.secs_since(j.submit_time).max(0.0));
        let opt = |t: Option<Timestamp>| t.map(|t| t.to_string()).unwrap_or_default();
        let _ = writeln!(
            s,
            "{},{},{},{},{},{:?},{},{},{},{},{:.4},{:.4},{:.4}",
            csv_field(&j.id),
            csv_field(&j.project),
            csv_field(&j.user),
            csv_field(&j.class),
            j.gpus,
            j.state,
            j.submit_time,
            opt(j.start_time),
            opt(j.end_time),
            wait.map(|w| format!("{w:.0}")).unwrap_or_default(),
            kwh,
            cost,
            co2
        );
    }
    s
}

const COLORS: [&str; 8] = [
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf",
];

fn html(
    site: &Site,
    points: &[Point],
    ledger: &[LedgerEntry],
    audit: &[(u64, Decision)],
    s: &Summary,
) -> String {
    let x = |p: &Point| p.t.secs_since(s.start) / 60.0;
    let ticks: Vec<(f64, String)> = points
        .iter()
        .filter(|p| (p.t.secs_since(s.start) / 60.0).rem_euclid(30.0) < 1e-6)
        .map(|p| (x(p), local(site, p.t, "%H:%M")))
        .collect();
    let price_unit = format!("{}/kWh", s.currency);
    let power = Chart {
        title: "Facility IT power against its budget, and the price",
        y_label: "kW",
        right_label: Some(&price_unit),
        lines: vec![
            Line {
                name: "IT power (kW)",
                color: COLORS[0],
                points: points.iter().map(|p| (x(p), p.it_kw)).collect(),
                steps: false,
                right_axis: false,
            },
            Line {
                name: "price",
                color: COLORS[3],
                points: points.iter().map(|p| (x(p), p.price)).collect(),
                steps: true,
                right_axis: true,
            },
        ],
        rules: vec![Rule {
            name: "budget",
            color: "#000",
            y: s.budget_kw,
        }],
        x_ticks: ticks.clone(),
    };
    let inlets = Chart {
        title: "Rack inlet temperatures",
        y_label: "°C",
        right_label: None,
        lines: site
            .racks
            .iter()
            .enumerate()
            .map(|(i, r)| Line {
                name: &r.id,
                color: COLORS[i % COLORS.len()],
                points: points.iter().map(|p| (x(p), p.inlets[i])).collect(),
                steps: false,
                right_axis: false,
            })
            .collect(),
        rules: vec![Rule {
            name: "limit",
            color: "#d62728",
            y: site
                .racks
                .iter()
                .map(|r| r.inlet_limit_c)
                .fold(f64::INFINITY, f64::min),
        }],
        x_ticks: ticks.clone(),
    };
    let actions = Chart {
        title: "Caps and holds in force",
        y_label: "count",
        right_label: None,
        lines: vec![
            Line {
                name: "GPUs capped",
                color: COLORS[1],
                points: points
                    .iter()
                    .map(|p| (x(p), p.capped_gpus as f64))
                    .collect(),
                steps: true,
                right_axis: false,
            },
            Line {
                name: "jobs held",
                color: COLORS[4],
                points: points.iter().map(|p| (x(p), p.held_jobs as f64)).collect(),
                steps: true,
                right_axis: false,
            },
            Line {
                name: "jobs running",
                color: COLORS[2],
                points: points
                    .iter()
                    .map(|p| (x(p), p.running_jobs as f64))
                    .collect(),
                steps: true,
                right_axis: false,
            },
        ],
        rules: vec![],
        x_ticks: ticks,
    };
    let mut by_project: BTreeMap<String, (f64, f64)> = BTreeMap::new();
    for e in ledger {
        let key = match &e.account {
            Account::Job { project, .. } => project.clone(),
            Account::Idle => "(idle)".into(),
            Account::Overhead => "(cooling)".into(),
        };
        let v = by_project.entry(key).or_default();
        v.0 += e.energy_kwh;
        v.1 += e.cost;
    }
    let energy_rows: Vec<(String, f64)> =
        by_project.iter().map(|(k, v)| (k.clone(), v.0)).collect();
    let cost_rows: Vec<(String, f64)> = by_project.iter().map(|(k, v)| (k.clone(), v.1)).collect();

    let mut body = String::new();
    let _ = write!(body, "<h1>powerplane demo report</h1><p class=\"muted\">Site {} · {} minutes from {} · seed {} · simulated facility</p>", escape(&s.site), s.minutes, escape(&local(site, s.start, "%Y-%m-%d %H:%M %Z")), s.seed);
    body.push_str("<h2>Summary</h2><table>");
    let rows = [
        (
            "Energy",
            format!("{:.1} kWh IT + {:.1} kWh cooling", s.it_kwh, s.cooling_kwh),
        ),
        ("Cost", format!("{:.2} {}", s.cost, escape(&s.currency))),
        ("Carbon", format!("{:.1} kg CO2", s.carbon_kg)),
        (
            "Peak IT power",
            format!(
                "{:.1} kW against a {:.1} kW budget",
                s.peak_it_kw, s.budget_kw
            ),
        ),
        ("Time over budget", format!("{:.0} s", s.over_budget_s)),
        (
            "Hottest inlet",
            format!(
                "{:.1} °C at rack {} (limit {:.1} °C)",
                s.hottest_inlet_c,
                escape(&s.hottest_rack),
                s.hottest_limit_c
            ),
        ),
        (
            "Caps",
            format!(
                "{} decisions; at most {} GPUs capped; {:.1} GPU-hours capped",
                s.cap_decisions, s.peak_capped_gpus, s.capped_gpu_hours
            ),
        ),
        (
            "Deferred jobs",
            format!(
                "{} held; {} released on price, {} at latest start",
                s.jobs_deferred, s.releases_by_price, s.releases_by_deadline
            ),
        ),
        (
            "Jobs",
            format!(
                "{} submitted, {} finished, {} deadline misses",
                s.sim.jobs_submitted, s.sim.jobs_finished, s.sim.deadline_misses
            ),
        ),
    ];
    for (k, v) in rows {
        let _ = write!(body, "<tr><th>{k}</th><td>{v}</td></tr>");
    }
    body.push_str("</table>");
    let _ = write!(body, "<h2>Power and price</h2>{}", power.svg());
    let _ = write!(body, "<h2>Inlet temperatures</h2>{}", inlets.svg());
    let _ = write!(body, "<h2>Caps and holds</h2>{}", actions.svg());
    let _ = write!(
        body,
        "<h2>Energy and cost per project</h2>{}{}",
        bars("Energy per project", "kWh", &energy_rows, COLORS[0]),
        bars("Cost per project", &s.currency, &cost_rows, COLORS[1])
    );
    body.push_str("<h2>First decisions</h2><table><tr><th>time</th><th>rule</th><th>target</th><th>action</th><th>reason</th></tr>");
    for (_, d) in audit.iter().take(25) {
        let _ = write!(
            body,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            escape(&local(site, d.time, "%H:%M:%S")),
            escape(&d.rule),
            escape(&d.target.to_string()),
            escape(&d.action.to_string()),
            escape(&d.reason)
        );
    }
    let _ = write!(
        body,
        "</table><p class=\"muted\">{} decisions in all: see audit.jsonl.</p>",
        audit.len()
    );
    page("powerplane demo report", &body)
}
