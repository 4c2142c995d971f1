//! The report's demand-response section: each grid event the store saw (collection
//! `grid_events`), settled against the utilities' baselines (CAISO 10-in-10 with the
//! same-day adjustment, ERCOT middle 8-of-10, PJM hour-before: see
//! `control::grid::baseline`) on the meter's 15-minute history, which the ledger gives
//! (every kWh of an interval, jobs, idle and overhead: the facility at the meter).

use std::collections::{BTreeMap, BTreeSet};

use chrono_tz::Tz;
use control::grid::baseline::{self, Calendar, Event, History, Method, Reading};
use integrations::store::LedgerEntry;
use serde::Serialize;
use telemetry::grid::{EventStatus, GridEvent, GridTarget};
use telemetry::Timestamp;

use super::EnergyReport;

/// The meter's interval in the settlement: 15 minutes, as most programmes settle.
pub const SETTLEMENT_INTERVAL_S: f64 = 900.0;

/// A baseline's rule.
type BaselineFn =
    fn(&History, &Event, &Calendar<'_>) -> Result<baseline::Baseline, baseline::BaselineError>;

/// One event, settled.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GridEventReport {
    pub id: String,
    pub source: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub program: String,
    pub status: String,
    /// On the settlement grid (the event's own times rounded out to 15 minutes).
    pub start: Timestamp,
    pub end: Timestamp,
    /// What it asked: `shed 25%`, `shed 120 kW`, `cap 800 kW`, `level 2`.
    pub asked: String,
    /// One per baseline the history allowed.
    pub settlements: Vec<Settlement>,
    /// The baselines the history did not allow, with why.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub not_settled: Vec<String>,
}

/// An event against one baseline.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Settlement {
    pub method: String,
    /// Means over the event's intervals.
    pub baseline_kw: f64,
    pub metered_kw: f64,
    pub delivered_kw: f64,
    pub delivered_kwh: f64,
    /// The shed asked against this baseline.
    pub committed_kw: f64,
    pub performance_factor: f64,
    /// The days the baseline was taken from (local dates).
    pub days: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub adjustment: Option<f64>,
}

/// The meter's history on the settlement grid from the ledger: each ledger interval's
/// kWh spread over the 15-minute intervals it overlaps; an interval less than 99%
/// covered is left out (not metered).
pub fn meter_history(ledger: &[LedgerEntry]) -> Vec<Reading> {
    let step_ms = (SETTLEMENT_INTERVAL_S * 1000.0) as i64;
    // kWh and covered ms per settlement interval
    let mut by: BTreeMap<i64, (f64, i64)> = BTreeMap::new();
    let mut spans: BTreeMap<(i64, i64), f64> = BTreeMap::new();
    for e in ledger {
        *spans.entry((e.start.0, e.end.0)).or_default() += e.energy_kwh;
    }
    for ((s, e), kwh) in spans {
        if e <= s {
            continue;
        }
        let mut t = s.div_euclid(step_ms) * step_ms;
        while t < e {
            let a = s.max(t);
            let b = e.min(t + step_ms);
            let share = (b - a) as f64 / (e - s) as f64;
            let slot = by.entry(t).or_default();
            slot.0 += kwh * share;
            slot.1 += b - a;
            t += step_ms;
        }
    }
    by.into_iter()
        .filter(|(_, (_, covered))| *covered as f64 >= 0.99 * step_ms as f64)
        .map(|(t, (kwh, _))| Reading {
            start: Timestamp(t),
            kw: kwh / (SETTLEMENT_INTERVAL_S / 3600.0),
        })
        .collect()
}

fn asked(t: &GridTarget) -> String {
    match *t {
        GridTarget::ShedFraction(f) => format!("shed {:.0}%", f * 100.0),
        GridTarget::ShedW(w) => format!("shed {:.1} kW", w / 1000.0),
        GridTarget::CapW(w) => format!("cap {:.1} kW", w / 1000.0),
        GridTarget::Level(l) => format!("level {l}"),
    }
}

/// The shed asked against a baseline of `baseline_kw` (mean).
fn committed_kw(t: &GridTarget, baseline_kw: f64) -> f64 {
    match *t {
        GridTarget::ShedFraction(f) => baseline_kw * f,
        GridTarget::ShedW(w) => w / 1000.0,
        GridTarget::CapW(w) => baseline_kw - w / 1000.0,
        // the report has no config to say otherwise: the default levels
        GridTarget::Level(l) => telemetry::grid::DEFAULT_LEVELS
            .iter()
            .find(|(k, _)| *k == l)
            .map_or(0.0, |(_, f)| baseline_kw * f),
    }
}

/// One event settled by each baseline method: the settlements, and why a method could
/// not settle it.
fn settle_event(
    history: &History,
    ev: &Event,
    cal: &Calendar,
    target: &GridTarget,
) -> (Vec<Settlement>, Vec<String>) {
    let mut settlements = Vec::new();
    let mut not_settled = Vec::new();
    let methods: [(Method, BaselineFn); 3] = [
        (Method::Caiso10in10, baseline::caiso_10_in_10),
        (Method::ErcotMiddle8of10, baseline::ercot_middle_8_of_10),
        (Method::PjmHourBefore, baseline::pjm_hour_before),
    ];
    for (method, f) in methods {
        let b = match f(history, ev, cal) {
            Ok(b) => b,
            Err(err) => {
                not_settled.push(format!("{method}: {err}"));
                continue;
            }
        };
        let mean_baseline =
            b.intervals.iter().map(|r| r.kw).sum::<f64>() / b.intervals.len().max(1) as f64;
        let committed = committed_kw(target, mean_baseline);
        match baseline::performance(&b, history, committed) {
            Ok(p) => {
                let n = p.intervals.len().max(1) as f64;
                settlements.push(Settlement {
                    method: method.to_string(),
                    baseline_kw: mean_baseline,
                    metered_kw: p.intervals.iter().map(|i| i.metered_kw).sum::<f64>() / n,
                    delivered_kw: p.delivered_kw,
                    delivered_kwh: p.delivered_kwh,
                    committed_kw: p.committed_kw,
                    performance_factor: p.performance_factor,
                    days: b.days.iter().map(|d| d.to_string()).collect(),
                    adjustment: b.adjustment,
                });
            }
            Err(err) => not_settled.push(format!("{method}: {err}")),
        }
    }
    (settlements, not_settled)
}

/// Each event that was in force within `from..to`, settled on the ledger's meter.
pub fn settle(
    events: &[GridEvent],
    ledger: &[LedgerEntry],
    tz: Tz,
    from: Timestamp,
    to: Timestamp,
) -> Vec<GridEventReport> {
    let step_ms = (SETTLEMENT_INTERVAL_S * 1000.0) as i64;
    let history = match History::new(SETTLEMENT_INTERVAL_S, &meter_history(ledger)) {
        Ok(h) => h,
        Err(_) => return Vec::new(),
    };
    let date = |t: Timestamp| t.to_datetime().with_timezone(&tz).date_naive();
    let event_days: BTreeSet<_> = events
        .iter()
        .filter(|e| e.status != EventStatus::Cancelled)
        .filter_map(|e| e.start().map(date))
        .collect();
    let mut out = Vec::new();
    for e in events {
        let (Some(s), Some(end)) = (e.start(), e.end()) else {
            continue;
        };
        if end <= from || s >= to || e.status == EventStatus::Pending {
            continue;
        }
        let Some(first) = e.intervals.first() else {
            continue;
        };
        let start = Timestamp(s.0.div_euclid(step_ms) * step_ms);
        let stop = Timestamp((end.0 + step_ms - 1).div_euclid(step_ms) * step_ms);
        let ev = Event { start, end: stop };
        let cal = Calendar::weekdays(tz, BTreeSet::new(), event_days.clone());
        let (settlements, not_settled) = settle_event(&history, &ev, &cal, &first.target);
        out.push(GridEventReport {
            id: e.id.clone(),
            source: e.source.clone(),
            program: e.program.clone(),
            status: format!("{:?}", e.status).to_lowercase(),
            start,
            end: stop,
            asked: asked(&first.target),
            settlements,
            not_settled,
        });
    }
    out.sort_by(|a, b| a.start.cmp(&b.start).then(a.id.cmp(&b.id)));
    out
}

impl EnergyReport {
    /// Adds the demand-response section: every event in the report's period, settled.
    pub fn with_grid_events(
        mut self,
        events: &[GridEvent],
        ledger: &[LedgerEntry],
        tz: Tz,
    ) -> Self {
        self.demand_response = settle(events, ledger, tz, self.from, self.to);
        self
    }

    /// The section as table lines.
    pub(super) fn grid_table(&self, s: &mut String) {
        use std::fmt::Write as _;
        if self.demand_response.is_empty() {
            return;
        }
        let _ = writeln!(
            s,
            "demand response ({} events):",
            self.demand_response.len()
        );
        for e in &self.demand_response {
            let _ = writeln!(
                s,
                "  {} ({}, {}) {} to {}: {}",
                e.id, e.source, e.status, e.start, e.end, e.asked
            );
            for p in &e.settlements {
                let _ = writeln!(
                    s,
                    "    {:<22} baseline {:>9.1} kW  metered {:>9.1} kW  delivered {:>8.1} kW ({:.1} kWh) of {:.1} kW: performance {:.2}",
                    p.method, p.baseline_kw, p.metered_kw, p.delivered_kw, p.delivered_kwh, p.committed_kw, p.performance_factor
                );
            }
            for n in &e.not_settled {
                let _ = writeln!(s, "    not settled: {n}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use integrations::store::Account;

    fn entry(start_s: i64, len_s: i64, kwh: f64) -> LedgerEntry {
        LedgerEntry {
            start: Timestamp::from_secs(start_s),
            end: Timestamp::from_secs(start_s + len_s),
            account: Account::Idle,
            rack: None,
            energy_kwh: kwh,
            cost: 0.0,
            carbon_kg: 0.0,
            integrated_kwh: 0.0,
            shared_kwh: 0.0,
        }
    }

    #[test]
    fn the_ledger_becomes_the_meters_quarter_hours() {
        // 60 s intervals at 100 kW (1/60 of 100 kWh each), split over two accounts
        let t0: i64 = 1_789_999_200; // on the quarter hour
        let mut ledger = Vec::new();
        for k in 0..30 {
            ledger.push(entry(t0 + k * 60, 60, 100.0 / 60.0 * 0.75));
            ledger.push(entry(t0 + k * 60, 60, 100.0 / 60.0 * 0.25));
        }
        let h = meter_history(&ledger);
        assert_eq!(h.len(), 2);
        for r in &h {
            assert!((r.kw - 100.0).abs() < 1e-9, "{r:?}");
        }
        // a quarter hour half covered is not metered
        let h = meter_history(&ledger[..30]);
        assert_eq!(h.len(), 1);
    }

    #[test]
    fn an_event_is_settled_against_each_baseline_the_history_allows() {
        // two days of 100 kW, then an event day: 100 kW until 14:00 UTC, 70 kW for 2 h
        let tz: Tz = "UTC".parse().expect("tz");
        let day0: i64 = 1_790_035_200; // a midnight UTC
        let mut ledger = Vec::new();
        let event_start = day0 + 2 * 86_400 + 14 * 3600;
        for k in 0..(2 * 96 + 64) {
            let t = day0 + k * 900;
            let kw = if t >= event_start && t < event_start + 7200 {
                70.0
            } else {
                100.0
            };
            ledger.push(entry(t, 900, kw * 0.25));
        }
        let e = GridEvent {
            id: "peak".into(),
            source: "api".into(),
            modification: 0,
            status: EventStatus::Completed,
            intervals: vec![telemetry::grid::GridInterval {
                start: Timestamp::from_secs(event_start),
                duration_s: 7200.0,
                target: GridTarget::ShedFraction(0.25),
            }],
            program: String::new(),
        };
        let from = Timestamp::from_secs(day0);
        let to = Timestamp::from_secs(day0 + 3 * 86_400);
        let r = settle(&[e], &ledger, tz, from, to);
        assert_eq!(r.len(), 1);
        let pjm = r[0]
            .settlements
            .iter()
            .find(|s| s.method == "pjm hour-before")
            .expect("hour-before settles");
        assert!((pjm.baseline_kw - 100.0).abs() < 1e-9);
        assert!((pjm.delivered_kw - 30.0).abs() < 1e-9);
        assert!((pjm.delivered_kwh - 60.0).abs() < 1e-9);
        assert!((pjm.committed_kw - 25.0).abs() < 1e-9);
        assert!((pjm.performance_factor - 1.2).abs() < 1e-9);
        // two days of history are too few for 10 similar days: said, not guessed
        assert_eq!(r[0].not_settled.len(), 2, "{:?}", r[0].not_settled);
        assert!(
            r[0].not_settled[0].contains("similar days"),
            "{:?}",
            r[0].not_settled
        );
        let mut text = String::new();
        let mut rep = crate::energy_report::build(
            &Default::default(),
            &ledger,
            &[],
            crate::energy_report::GroupBy::Day,
            tz,
            "EUR",
            from,
            to,
        );
        rep.demand_response = r;
        rep.grid_table(&mut text);
        assert!(text.contains("demand response (1 events)"), "{text}");
        assert!(text.contains("performance 1.20"), "{text}");
    }
}
