//! `powerplane report`: the energy ledger and the audit log of a period, grouped by
//! job, project, user, rack or day (in the site's time zone), as a table, CSV, JSON or
//! one self-contained HTML page.

use std::collections::BTreeMap;
use std::fmt::Write as _;

#[cfg(test)]
use chrono_tz::Tz;
use integrations::store::Conditions;
#[cfg(test)]
use integrations::store::{Account, LedgerEntry};
#[cfg(test)]
use policies::Decision;
use serde::Serialize;
use telemetry::Timestamp;

use crate::csv_field;

mod build;
mod demand;
mod grid;
mod html;

pub use grid::{GridEventReport, Settlement};

pub use build::build;

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
    /// The grid events of the period, settled (see [`EnergyReport::with_grid_events`]).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub demand_response: Vec<GridEventReport>,
}

fn opt(v: Option<f64>) -> String {
    v.map_or(String::new(), |v| format!("{v:.3}"))
}

impl EnergyReport {
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
        self.grid_table(&mut s);
        s
    }

    pub fn json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_default()
    }
}

#[cfg(test)]
#[path = "energy_report_tests.rs"]
mod tests;
