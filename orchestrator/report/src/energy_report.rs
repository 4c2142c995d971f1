//! `powerplane report`: the energy ledger and the audit log of a period, grouped by
//! job, project, user, rack or day (in the site's time zone), as a table, CSV, JSON or
//! one self-contained HTML page.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use chrono_tz::Tz;
use integrations::store::{Account, Conditions, LedgerEntry};
use policies::plan::{Action, Target};
use policies::Decision;
use serde::Serialize;
use telemetry::Timestamp;

use crate as report;
use crate::{csv_field, escape, Chart, Line};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupBy {
    Job,
    Project,
    User,
    Rack,
    Day,
}

impl std::str::FromStr for GroupBy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s {
            "job" => GroupBy::Job,
            "project" => GroupBy::Project,
            "user" => GroupBy::User,
            "rack" => GroupBy::Rack,
            "day" => GroupBy::Day,
            o => {
                return Err(format!(
                    "--group-by {o:?}: use job, project, user, rack or day"
                ))
            }
        })
    }
}

/// One group's figures.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Row {
    pub key: String,
    pub energy_kwh: f64,
    /// Of `energy_kwh`, estimated as power × time rather than read from a counter.
    pub estimated_kwh: f64,
    pub cost: f64,
    pub carbon_kg: f64,
    /// The highest average power over one ledger interval.
    pub peak_kw: f64,
    /// GPU-hours under a cap (racks, and the whole period in the total).
    pub capped_gpu_hours: Option<f64>,
    /// Hours held by powerplane (jobs, and summed over their jobs for projects/users).
    pub held_hours: Option<f64>,
    /// Saving against running without a policy: estimated by the backtest, not here.
    pub saving_cost: Option<f64>,
    /// The group's share of the demand charge: its share of the energy of each billing
    /// period's peak demand interval × that period's charge (with a demand charge).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub demand_charge: Option<f64>,
}

/// One billing period's peak and what it costs.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DemandPeriod {
    /// The calendar month in the site's time zone, `YYYY-MM`.
    pub period: String,
    /// The highest average facility power (IT and cooling) over one demand interval.
    pub peak_kw: f64,
    /// The demand interval of the peak.
    pub start: Timestamp,
    pub end: Timestamp,
    /// `peak_kw` × the tariff's `demand_charge_per_kw`.
    pub demand_charge: f64,
    /// Where the peak comes from: `demand intervals` (the ledger's record of the
    /// billing period, over the tariff's demand interval) or `ledger intervals` (the
    /// report's own ledger entries, when no record was kept).
    pub source: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct EnergyReport {
    pub site: String,
    pub from: Timestamp,
    pub to: Timestamp,
    pub group_by: String,
    pub currency: String,
    pub rows: Vec<Row>,
    pub total: Row,
    /// (IT + overhead) / IT over the period, when the ledger holds overhead.
    pub pue: Option<f64>,
    /// Ledger intervals over time: (start, end, kWh, cost) of the whole facility.
    #[serde(skip)]
    pub intervals: Vec<(Timestamp, Timestamp, f64, f64)>,
    /// GPUs capped over time, from the audit log: (time, capped GPUs).
    #[serde(skip)]
    pub capped_over_time: Vec<(Timestamp, usize)>,
    /// The racks' hottest inlet per ledger interval (see [`EnergyReport::with_inlets`]).
    #[serde(skip)]
    pub inlets: Vec<Conditions>,
    /// Hours held of jobs that used no energy in the period (see
    /// [`EnergyReport::with_jobs`]).
    #[serde(skip)]
    pub unplaced_held: BTreeMap<String, f64>,
    /// The tariff's demand charge: the sum over the billing periods the report
    /// overlaps of each period's charge (see [`EnergyReport::with_demand_charge`]);
    /// `cost` is the energy's alone.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub demand_charge: Option<f64>,
    /// Energy cost plus demand charge, with a demand charge.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub total_cost: Option<f64>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub demand_periods: Vec<DemandPeriod>,
}

fn key_of(e: &LedgerEntry, by: GroupBy, tz: Tz) -> String {
    let acct = |f: &dyn Fn(&str, &str, &str) -> String| match &e.account {
        Account::Job { job, project, user } => f(job, project, user),
        Account::Idle => "(idle)".to_string(),
        Account::Overhead => "(overhead)".to_string(),
    };
    match by {
        GroupBy::Job => acct(&|j, _, _| j.to_string()),
        GroupBy::Project => acct(&|_, p, _| p.to_string()),
        GroupBy::User => acct(&|_, _, u| u.to_string()),
        GroupBy::Rack => e.rack.clone().unwrap_or_else(|| "(facility)".into()),
        GroupBy::Day => e
            .start
            .to_datetime()
            .with_timezone(&tz)
            .format("%Y-%m-%d")
            .to_string(),
    }
}

/// Seconds between a start and an end decision per target, from the audit log, clipped
/// to the period. `start`/`end` say which actions open and close.
fn spans(
    audit: &[Decision],
    from: Timestamp,
    to: Timestamp,
    open: fn(&Action) -> bool,
    close: fn(&Action) -> bool,
    key: impl Fn(&Target) -> Vec<String>,
) -> BTreeMap<String, f64> {
    let mut since: BTreeMap<String, Timestamp> = BTreeMap::new();
    let mut total: BTreeMap<String, f64> = BTreeMap::new();
    for d in audit.iter().filter(|d| !d.observe_only) {
        for k in key(&d.target) {
            if open(&d.action) {
                since.entry(k).or_insert(d.time);
            } else if close(&d.action) {
                if let Some(s) = since.remove(&k) {
                    let (a, b) = (s.max(from), d.time.min(to));
                    *total.entry(k).or_default() += b.secs_since(a).max(0.0);
                }
            }
        }
    }
    for (k, s) in since {
        let a = s.max(from);
        *total.entry(k).or_default() += to.secs_since(a).max(0.0);
    }
    total
}

/// Builds the report of `[from, to)` from the ledger and the audit log. `gpu_racks`
/// names the rack of each GPU (`gpu/a01-n01:0` → `a01`).
#[allow(clippy::too_many_arguments)]
pub fn build(
    gpu_racks: &BTreeMap<String, String>,
    ledger: &[LedgerEntry],
    audit: &[Decision],
    by: GroupBy,
    tz: Tz,
    currency: &str,
    from: Timestamp,
    to: Timestamp,
) -> EnergyReport {
    let entries: Vec<&LedgerEntry> = ledger
        .iter()
        .filter(|e| e.start >= from && e.start < to)
        .collect();
    // per group, per interval: kWh (for the peak)
    let mut rows: BTreeMap<String, Row> = BTreeMap::new();
    let mut per_interval: BTreeMap<(String, Timestamp, Timestamp), f64> = BTreeMap::new();
    let mut facility: BTreeMap<(Timestamp, Timestamp), (f64, f64)> = BTreeMap::new();
    let mut job_groups: BTreeMap<String, String> = BTreeMap::new();
    for e in &entries {
        let k = key_of(e, by, tz);
        let r = rows.entry(k.clone()).or_insert_with(|| Row {
            key: k.clone(),
            ..Row::default()
        });
        r.energy_kwh += e.energy_kwh;
        r.estimated_kwh += e.integrated_kwh;
        r.cost += e.cost;
        r.carbon_kg += e.carbon_kg;
        *per_interval.entry((k.clone(), e.start, e.end)).or_default() += e.energy_kwh;
        let f = facility.entry((e.start, e.end)).or_default();
        f.0 += e.energy_kwh;
        f.1 += e.cost;
        if let Account::Job { job, .. } = &e.account {
            job_groups.insert(job.clone(), k);
        }
    }
    for ((k, s, e), kwh) in per_interval {
        let h = e.secs_since(s) / 3600.0;
        if h > 0.0 {
            if let Some(r) = rows.get_mut(&k) {
                r.peak_kw = r.peak_kw.max(kwh / h);
            }
        }
    }
    let mut unplaced_held: BTreeMap<String, f64> = BTreeMap::new();
    // held time per job, from hold/release decisions
    let held = spans(
        audit,
        from,
        to,
        |a| matches!(a, Action::Hold { .. }),
        |a| matches!(a, Action::Release),
        |t| match t {
            Target::Job { job } => vec![job.clone()],
            _ => Vec::new(),
        },
    );
    // capped time per GPU, from cap/uncap decisions
    let capped = spans(
        audit,
        from,
        to,
        |a| matches!(a, Action::Cap { .. }),
        |a| matches!(a, Action::Uncap),
        |t| match t {
            Target::Gpus { gpus, .. } => gpus.iter().map(|g| g.to_string()).collect(),
            _ => Vec::new(),
        },
    );
    let rack_of = |gpu: &str| gpu_racks.get(gpu).cloned();
    match by {
        GroupBy::Job | GroupBy::Project | GroupBy::User => {
            for (job, s) in &held {
                let k = match by {
                    GroupBy::Job => Some(job.clone()),
                    _ => job_groups.get(job).cloned(),
                };
                match k.and_then(|k| rows.get_mut(&k)) {
                    Some(r) => *r.held_hours.get_or_insert(0.0) += s / 3600.0,
                    // held and never run in the period: placed by `with_jobs`
                    None => {
                        unplaced_held.insert(job.clone(), s / 3600.0);
                    }
                }
            }
        }
        GroupBy::Rack => {
            for (gpu, s) in &capped {
                if let Some(r) = rack_of(gpu).and_then(|k| rows.get_mut(&k)) {
                    *r.capped_gpu_hours.get_or_insert(0.0) += s / 3600.0;
                }
            }
        }
        GroupBy::Day => {}
    }
    let mut total = Row {
        key: "total".into(),
        ..Row::default()
    };
    for r in rows.values() {
        total.energy_kwh += r.energy_kwh;
        total.estimated_kwh += r.estimated_kwh;
        total.cost += r.cost;
        total.carbon_kg += r.carbon_kg;
    }
    for ((s, e), (kwh, _)) in &facility {
        let h = e.secs_since(*s) / 3600.0;
        if h > 0.0 {
            total.peak_kw = total.peak_kw.max(kwh / h);
        }
    }
    total.capped_gpu_hours = Some(capped.values().sum::<f64>() / 3600.0);
    total.held_hours = Some(held.values().sum::<f64>() / 3600.0);
    // GPUs capped over time, replaying the audit log
    let mut now_capped: std::collections::BTreeSet<String> = Default::default();
    let mut capped_over_time = Vec::new();
    for d in audit.iter().filter(|d| !d.observe_only && d.time < to) {
        if let Target::Gpus { gpus, .. } = &d.target {
            match d.action {
                Action::Cap { .. } => now_capped.extend(gpus.iter().map(|g| g.to_string())),
                Action::Uncap => {
                    for g in gpus {
                        now_capped.remove(&g.to_string());
                    }
                }
                _ => continue,
            }
            if d.time >= from {
                capped_over_time.push((d.time, now_capped.len()));
            }
        }
    }
    let mut rows: Vec<Row> = rows.into_values().collect();
    rows.sort_by(|a, b| {
        b.energy_kwh
            .total_cmp(&a.energy_kwh)
            .then(a.key.cmp(&b.key))
    });
    if by == GroupBy::Day {
        rows.sort_by(|a, b| a.key.cmp(&b.key));
    }
    let overhead: f64 = entries
        .iter()
        .filter(|e| e.account == Account::Overhead)
        .map(|e| e.energy_kwh)
        .sum();
    let it = total.energy_kwh - overhead;
    let pue = (overhead > 0.0 && it > 0.0).then(|| total.energy_kwh / it);
    EnergyReport {
        site: String::new(),
        pue,
        from,
        to,
        group_by: format!("{by:?}").to_lowercase(),
        currency: currency.to_string(),
        rows,
        total,
        intervals: facility
            .into_iter()
            .map(|((s, e), (k, c))| (s, e, k, c))
            .collect(),
        capped_over_time,
        inlets: Vec::new(),
        unplaced_held,
        demand_charge: None,
        total_cost: None,
        demand_periods: Vec::new(),
    }
}

fn opt(v: Option<f64>) -> String {
    v.map_or(String::new(), |v| format!("{v:.3}"))
}

impl EnergyReport {
    /// Adds the demand charge of the site's tariff (nothing without one). Every billing
    /// period (calendar month in the site's time zone) the report overlaps is charged
    /// whole, as a bill charges it: its peak from the ledger's record (`peaks`, the
    /// highest average over the tariff's demand interval, which may lie outside the
    /// report's range), else the highest average over one of the report's ledger
    /// intervals in that period. Each group's share of a period's charge is its share of
    /// the peak interval's energy (`ledger` holds the entries of the ledger intervals).
    pub fn with_demand_charge(
        mut self,
        per_kw: Option<f64>,
        tz: Tz,
        peaks: &[control::demand::PeriodPeak],
        ledger: &[LedgerEntry],
    ) -> Self {
        let Some(rate) = per_kw else {
            return self;
        };
        let by: GroupBy = self.group_by.parse().unwrap_or(GroupBy::Job);
        let first = control::demand::period_of(self.from, tz);
        let last = control::demand::period_of(self.to + -0.001, tz);
        // the periods the report overlaps, with the entries of their peak interval
        let mut periods: Vec<(DemandPeriod, Vec<&LedgerEntry>)> = Vec::new();
        for p in peaks
            .iter()
            .filter(|p| p.period >= first && p.period <= last)
        {
            periods.push((
                DemandPeriod {
                    period: p.period.clone(),
                    peak_kw: p.kw,
                    start: p.start,
                    end: p.end,
                    demand_charge: p.kw * rate,
                    source: "demand intervals".into(),
                },
                p.entries.iter().collect(),
            ));
        }
        let mut fallback: BTreeMap<String, (f64, Timestamp, Timestamp)> = BTreeMap::new();
        for (s, e, kwh, _) in &self.intervals {
            let h = e.secs_since(*s) / 3600.0;
            let period = control::demand::period_of(*s, tz);
            if h <= 0.0 || periods.iter().any(|(p, _)| p.period == period) {
                continue;
            }
            let kw = kwh / h;
            let best = fallback.entry(period).or_insert((kw, *s, *e));
            if kw > best.0 {
                *best = (kw, *s, *e);
            }
        }
        for (period, (kw, s, e)) in fallback {
            let entries = ledger
                .iter()
                .filter(|x| x.start == s && x.end == e)
                .collect();
            periods.push((
                DemandPeriod {
                    period,
                    peak_kw: kw,
                    start: s,
                    end: e,
                    demand_charge: kw * rate,
                    source: "ledger intervals".into(),
                },
                entries,
            ));
        }
        periods.sort_by(|a, b| a.0.period.cmp(&b.0.period));
        // each group's share of each period's peak interval
        let mut shares: BTreeMap<String, f64> = BTreeMap::new();
        for (p, entries) in &periods {
            let sum: f64 = entries.iter().map(|e| e.energy_kwh).sum();
            if sum <= 0.0 {
                continue;
            }
            for e in entries {
                *shares.entry(key_of(e, by, tz)).or_default() +=
                    p.demand_charge * e.energy_kwh / sum;
            }
        }
        for (key, charge) in shares {
            let pos = match self.rows.iter().position(|r| r.key == key) {
                Some(p) => p,
                None => {
                    // a group of the peak interval that used no energy in the range
                    self.rows.push(Row {
                        key,
                        ..Row::default()
                    });
                    self.rows.len() - 1
                }
            };
            *self.rows[pos].demand_charge.get_or_insert(0.0) += charge;
        }
        let total: f64 = periods.iter().map(|(p, _)| p.demand_charge).sum();
        self.total.demand_charge = Some(total);
        self.demand_charge = Some(total);
        self.total_cost = Some(self.total.cost + total);
        self.demand_periods = periods.into_iter().map(|(p, _)| p).collect();
        self
    }

    /// Places the held hours of jobs that never ran in the period (no energy, so not in
    /// the ledger) under their job, project or user, from the job records.
    pub fn with_jobs(mut self, jobs: &[telemetry::Job]) -> Self {
        let by = self.group_by.clone();
        for (id, h) in std::mem::take(&mut self.unplaced_held) {
            let job = jobs.iter().find(|j| j.id == id);
            let key = match (by.as_str(), job) {
                ("job", _) => id.clone(),
                ("project", Some(j)) => j.project.clone(),
                ("user", Some(j)) => j.user.clone(),
                _ => continue,
            };
            let pos = match self.rows.iter().position(|r| r.key == key) {
                Some(p) => p,
                None => {
                    self.rows.push(Row {
                        key,
                        ..Row::default()
                    });
                    self.rows.len() - 1
                }
            };
            *self.rows[pos].held_hours.get_or_insert(0.0) += h;
        }
        self
    }

    /// Adds the racks' inlet conditions of the period, for the HTML chart.
    pub fn with_inlets(mut self, conditions: &[Conditions]) -> Self {
        self.inlets = conditions
            .iter()
            .filter(|c| c.start >= self.from && c.start < self.to)
            .cloned()
            .collect();
        self
    }

    pub const CSV_HEADER: &'static str =
        "group,energy_kwh,estimated_kwh,cost,carbon_kg,peak_kw,capped_gpu_hours,held_hours,saving_cost";

    /// With a demand charge, two more columns: `demand_charge` (the group's share) and
    /// `total_cost` (its energy cost plus that share).
    pub const CSV_DEMAND_COLUMNS: &'static str = ",demand_charge,total_cost";

    pub fn csv(&self) -> String {
        let demand = self.demand_charge.is_some();
        let mut s = format!(
            "{}{}\n",
            Self::CSV_HEADER,
            if demand { Self::CSV_DEMAND_COLUMNS } else { "" }
        );
        for r in self.rows.iter().chain(std::iter::once(&self.total)) {
            let _ = write!(
                s,
                "{},{:.6},{:.6},{:.6},{:.6},{:.3},{},{},{}",
                csv_field(&r.key),
                r.energy_kwh,
                r.estimated_kwh,
                r.cost,
                r.carbon_kg,
                r.peak_kw,
                opt(r.capped_gpu_hours),
                opt(r.held_hours),
                opt(r.saving_cost)
            );
            if demand {
                let d = r.demand_charge.unwrap_or(0.0);
                let _ = write!(s, ",{d:.6},{:.6}", r.cost + d);
            }
            s.push('\n');
        }
        s
    }

    pub fn table(&self) -> String {
        let mut s = format!(
            "{:<28} {:>12} {:>12} {:>12} {:>9} {:>10} {:>9}\n",
            self.group_by.to_uppercase(),
            "kWh",
            self.currency,
            "kg CO2",
            "peak kW",
            "capped GPUh",
            "held h"
        );
        for r in self.rows.iter().chain(std::iter::once(&self.total)) {
            let _ = writeln!(
                s,
                "{:<28} {:>12.3} {:>12.2} {:>12.2} {:>9.2} {:>11} {:>9}",
                r.key,
                r.energy_kwh,
                r.cost,
                r.carbon_kg,
                r.peak_kw,
                r.capped_gpu_hours.map_or("-".into(), |v| format!("{v:.1}")),
                r.held_hours.map_or("-".into(), |v| format!("{v:.1}"))
            );
        }
        if let Some(p) = self.pue {
            let _ = writeln!(s, "PUE {p:.2} (IT and cooling over the period)");
        }
        if let Some(d) = self.demand_charge {
            let _ = writeln!(
                s,
                "demand charge {d:.2} {}; total cost (energy + demand) {:.2} {}",
                self.currency,
                self.total.cost + d,
                self.currency
            );
            for p in &self.demand_periods {
                let _ = writeln!(
                    s,
                    "  {}: peak {:.1} kW at {} to {} ({}): {:.2} {}",
                    p.period, p.peak_kw, p.start, p.end, p.source, p.demand_charge, self.currency
                );
            }
            let mut shares: Vec<&Row> = self
                .rows
                .iter()
                .filter(|r| r.demand_charge.is_some())
                .collect();
            shares.sort_by(|a, b| {
                b.demand_charge
                    .unwrap_or(0.0)
                    .total_cmp(&a.demand_charge.unwrap_or(0.0))
                    .then(a.key.cmp(&b.key))
            });
            if !shares.is_empty() {
                let top: Vec<String> = shares
                    .iter()
                    .take(8)
                    .map(|r| format!("{} {:.2}", r.key, r.demand_charge.unwrap_or(0.0)))
                    .collect();
                let more = if shares.len() > 8 {
                    format!(", and {} more", shares.len() - 8)
                } else {
                    String::new()
                };
                let _ = writeln!(
                    s,
                    "  by share of the peak intervals' energy: {}{more}",
                    top.join(", ")
                );
            }
        }
        s
    }

    pub fn json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_default()
    }

    /// One self-contained page: inline SVG, no script, no external fetch.
    pub fn html(&self, site: &str) -> String {
        let mut body = format!(
            "<h1>Energy report — {}</h1><p class=\"muted\">{} to {}, by {}. Saving against a no-policy baseline: see <code>powerplane backtest</code>.</p>",
            escape(site),
            self.from,
            self.to,
            escape(&self.group_by)
        );
        let _ = write!(
            body,
            "<table><tr><th>total</th><td class=\"n\">{:.1} kWh</td><td class=\"n\">{:.2} {}</td><td class=\"n\">{:.1} kg CO2</td><td class=\"n\">peak {:.1} kW</td><td class=\"n\">PUE {}</td></tr></table>",
            self.total.energy_kwh,
            self.total.cost,
            escape(&self.currency),
            self.total.carbon_kg,
            self.total.peak_kw,
            self.pue.map_or("–".into(), |p| format!("{p:.2}"))
        );
        if let Some(d) = self.demand_charge {
            let periods: Vec<String> = self
                .demand_periods
                .iter()
                .map(|p| {
                    format!(
                        "{}: peak {:.1} kW at {}, {:.2}",
                        escape(&p.period),
                        p.peak_kw,
                        p.start,
                        p.demand_charge
                    )
                })
                .collect();
            let _ = write!(
                body,
                "<p>Demand charge {d:.2} {cur} ({}); total cost (energy + demand) {:.2} {cur}.</p>",
                periods.join("; "),
                self.total.cost + d,
                cur = escape(&self.currency)
            );
        }
        let t0 = self.from.as_secs_f64();
        let hours = |t: Timestamp| (t.as_secs_f64() - t0) / 3600.0;
        let span_h = hours(self.to).max(1e-9);
        let ticks: Vec<(f64, String)> = (0..=6)
            .map(|i| {
                let h = span_h * f64::from(i) / 6.0;
                (
                    h,
                    if span_h < 6.0 {
                        format!("+{h:.1} h")
                    } else {
                        format!("+{h:.0} h")
                    },
                )
            })
            .collect();
        let power: Vec<(f64, f64)> = self
            .intervals
            .iter()
            .filter(|(s, e, ..)| e.secs_since(*s) > 0.0)
            .map(|(s, e, kwh, _)| (hours(*s), kwh / (e.secs_since(*s) / 3600.0)))
            .collect();
        let price: Vec<(f64, f64)> = self
            .intervals
            .iter()
            .filter(|(.., kwh, _)| *kwh > 0.0)
            .map(|(s, _, kwh, cost)| (hours(*s), cost / kwh))
            .collect();
        body.push_str("<h2>Power and price over time</h2>");
        let price_label = format!("{}/kWh", self.currency);
        body.push_str(
            &Chart {
                title: "Facility power (ledger) and the price paid",
                y_label: "kW",
                right_label: Some(&price_label),
                lines: vec![
                    Line {
                        name: "power",
                        color: "#1a73e8",
                        points: power,
                        steps: true,
                        right_axis: false,
                    },
                    Line {
                        name: "price",
                        color: "#e37400",
                        points: price,
                        steps: true,
                        right_axis: true,
                    },
                ],
                rules: Vec::new(),
                x_ticks: ticks.clone(),
            }
            .svg(),
        );
        body.push_str("<h2>Caps in force</h2>");
        if self.capped_over_time.is_empty() {
            body.push_str("<p class=\"muted\">No cap decisions in the period.</p>");
        } else {
            let pts = self
                .capped_over_time
                .iter()
                .map(|(t, n)| (hours(*t), *n as f64))
                .collect();
            body.push_str(
                &Chart {
                    title: "GPUs capped",
                    y_label: "GPUs",
                    right_label: None,
                    lines: vec![Line {
                        name: "capped GPUs",
                        color: "#c5221f",
                        points: pts,
                        steps: true,
                        right_axis: false,
                    }],
                    rules: Vec::new(),
                    x_ticks: ticks.clone(),
                }
                .svg(),
            );
        }
        body.push_str("<h2>Rack inlet temperatures</h2>");
        if self.inlets.is_empty() {
            body.push_str("<p class=\"muted\">No inlet readings in the period.</p>");
        } else {
            const COLORS: [&str; 8] = [
                "#1a73e8", "#e37400", "#188038", "#c5221f", "#9334e6", "#12b5cb", "#f439a0",
                "#5f6368",
            ];
            let racks: std::collections::BTreeSet<&String> =
                self.inlets.iter().flat_map(|c| c.inlets.keys()).collect();
            let names: Vec<String> = racks.iter().map(|r| r.to_string()).collect();
            let lines = names
                .iter()
                .enumerate()
                .map(|(i, r)| Line {
                    name: r.as_str(),
                    color: COLORS[i % COLORS.len()],
                    points: self
                        .inlets
                        .iter()
                        .filter_map(|c| c.inlets.get(r).map(|x| (hours(c.start), x.max_c)))
                        .collect(),
                    steps: true,
                    right_axis: false,
                })
                .collect();
            let limit = self
                .inlets
                .iter()
                .flat_map(|c| c.inlets.values().map(|x| x.limit_c))
                .fold(f64::INFINITY, f64::min);
            body.push_str(
                &Chart {
                    title: "Hottest inlet per rack (per ledger interval)",
                    y_label: "°C",
                    right_label: None,
                    lines,
                    rules: vec![crate::Rule {
                        name: "lowest limit",
                        color: "#c5221f",
                        y: limit,
                    }],
                    x_ticks: ticks.clone(),
                }
                .svg(),
            );
        }
        let _ = write!(
            body,
            "<h2>Energy and cost by {}</h2>",
            escape(&self.group_by)
        );
        let top: Vec<&Row> = self.rows.iter().take(20).collect();
        body.push_str(&report::bars(
            "Energy",
            "kWh",
            &top.iter()
                .map(|r| (r.key.clone(), r.energy_kwh))
                .collect::<Vec<_>>(),
            "#1a73e8",
        ));
        body.push_str(&report::bars(
            "Cost",
            &self.currency,
            &top.iter()
                .map(|r| (r.key.clone(), r.cost))
                .collect::<Vec<_>>(),
            "#188038",
        ));
        body.push_str("<table><tr><th>group</th><th>kWh</th><th>cost</th><th>kg CO2</th><th>peak kW</th><th>capped GPUh</th><th>held h</th></tr>");
        for r in self.rows.iter().chain(std::iter::once(&self.total)) {
            let _ = write!(
                body,
                r#"<tr><td>{}</td><td class="n">{:.2}</td><td class="n">{:.2}</td><td class="n">{:.2}</td><td class="n">{:.2}</td><td class="n">{}</td><td class="n">{}</td></tr>"#,
                escape(&r.key),
                r.energy_kwh,
                r.cost,
                r.carbon_kg,
                r.peak_kw,
                r.capped_gpu_hours.map_or("–".into(), |v| format!("{v:.1}")),
                r.held_hours.map_or("–".into(), |v| format!("{v:.1}"))
            );
        }
        body.push_str("</table>");
        report::page(&format!("Energy report — {site}"), &body)
    }
}

#[cfg(test)]
#[path = "energy_report_tests.rs"]
mod tests;
