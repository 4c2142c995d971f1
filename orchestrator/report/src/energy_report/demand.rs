//! The tariff's demand charge in the energy report: each billing period's peak, and
//! each group's share of its charge.

use std::collections::BTreeMap;

use chrono_tz::Tz;
use integrations::store::LedgerEntry;
use telemetry::Timestamp;

use super::build::key_of;
use super::{DemandPeriod, EnergyReport, GroupBy, Row};
use control::demand::PeriodPeak;

/// A billing period with the ledger entries of its peak interval.
type Period<'a> = (DemandPeriod, Vec<&'a LedgerEntry>);

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
        peaks: &[PeriodPeak],
        ledger: &[LedgerEntry],
    ) -> Self {
        let Some(rate) = per_kw else {
            return self;
        };
        let by: GroupBy = self.group_by.parse().unwrap_or(GroupBy::Job);
        let first = control::demand::period_of(self.from, tz);
        let last = control::demand::period_of(self.to + -0.001, tz);
        // the periods the report overlaps, with the entries of their peak interval
        let mut periods: Vec<Period> = peaks
            .iter()
            .filter(|p| p.period >= first && p.period <= last)
            .map(|p| {
                (
                    DemandPeriod {
                        period: p.period.clone(),
                        peak_kw: p.kw,
                        start: p.start,
                        end: p.end,
                        demand_charge: p.kw * rate,
                        source: "demand intervals".into(),
                    },
                    p.entries.iter().collect(),
                )
            })
            .collect();
        let fallback = self.ledger_peaks(&periods, tz, rate, ledger);
        periods.extend(fallback);
        periods.sort_by(|a, b| a.0.period.cmp(&b.0.period));
        self.add_shares(&periods, by, tz);
        let total: f64 = periods.iter().map(|(p, _)| p.demand_charge).sum();
        self.total.demand_charge = Some(total);
        self.demand_charge = Some(total);
        self.total_cost = Some(self.total.cost + total);
        self.demand_periods = periods.into_iter().map(|(p, _)| p).collect();
        self
    }

    /// The periods without a record of their peak (none in `known`): the highest
    /// average over one of the report's ledger intervals in each.
    fn ledger_peaks<'a>(
        &self,
        known: &[Period],
        tz: Tz,
        rate: f64,
        ledger: &'a [LedgerEntry],
    ) -> Vec<Period<'a>> {
        let mut fallback: BTreeMap<String, (f64, Timestamp, Timestamp)> = BTreeMap::new();
        for (s, e, kwh, _) in &self.intervals {
            let h = e.secs_since(*s) / 3600.0;
            let period = control::demand::period_of(*s, tz);
            if h <= 0.0 || known.iter().any(|(p, _)| p.period == period) {
                continue;
            }
            let kw = kwh / h;
            let best = fallback.entry(period).or_insert((kw, *s, *e));
            if kw > best.0 {
                *best = (kw, *s, *e);
            }
        }
        fallback
            .into_iter()
            .map(|(period, (kw, s, e))| {
                let entries = ledger
                    .iter()
                    .filter(|x| x.start == s && x.end == e)
                    .collect();
                (
                    DemandPeriod {
                        period,
                        peak_kw: kw,
                        start: s,
                        end: e,
                        demand_charge: kw * rate,
                        source: "ledger intervals".into(),
                    },
                    entries,
                )
            })
            .collect()
    }

    /// Each group's share of each period's peak interval, onto its row (a group of a
    /// peak interval that used no energy in the range gets a row of its own).
    fn add_shares(&mut self, periods: &[Period], by: GroupBy, tz: Tz) {
        let mut shares: BTreeMap<String, f64> = BTreeMap::new();
        for (p, entries) in periods {
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
                    self.rows.push(Row {
                        key,
                        ..Row::default()
                    });
                    self.rows.len() - 1
                }
            };
            *self.rows[pos].demand_charge.get_or_insert(0.0) += charge;
        }
    }
}
