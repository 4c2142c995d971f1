//! The billing period's peak demand, as the utility bills it: the facility's energy over
//! each demand interval (the tariff's `demand_interval_min`, else the ledger interval,
//! counted from local midnight in the site's time zone) as an average power, and per
//! billing period (calendar month in the site's time zone) the highest such average,
//! when it was, and whose energy made it (the interval's energy per account and rack).
//!
//! Kept with the energy ledger (collection [`COLLECTION`], one record per billing
//! period, rewritten when a demand interval closes), so a restart resumes the period's
//! peak. It also keeps the IT power's peak (racks without cooling) and the last 24 hours
//! of demand intervals, which the automatic peak target of price pacing reads as the
//! site readings `period_peak_w` and `day_peak_w` (see docs/policy.md "Peak pacing").
//!
//! A tick is counted in the demand interval it starts in; an interval's average is its
//! energy over the seconds it was observed (a controller that was down for part of an
//! interval averages what it saw).

use std::collections::{BTreeMap, VecDeque};

use chrono::Offset;
use chrono_tz::Tz;
use serde::{Deserialize, Serialize};
use store::{Account, LedgerEntry};
use telemetry::metric::names::{DAY_PEAK_W, PERIOD_PEAK_W};
use telemetry::{Sample, Timestamp};

/// The store collection of [`PeriodPeak`] records, keyed by billing period (`YYYY-MM`).
pub const COLLECTION: &str = "demand_peaks";

const DAY_S: f64 = 86_400.0;

/// One billing period's peak so far.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PeriodPeak {
    /// The calendar month in the site's time zone, `YYYY-MM`.
    pub period: String,
    /// The demand interval of the highest facility average (IT and cooling).
    pub start: Timestamp,
    pub end: Timestamp,
    pub kw: f64,
    /// That interval's energy per account and rack (`start`/`end` are the interval's;
    /// cost and carbon are not kept here): what the demand charge is attributed by.
    pub entries: Vec<LedgerEntry>,
    /// The highest IT average (racks, without cooling) of the period.
    pub it_kw: f64,
    /// The last 24 hours of demand intervals as (end, IT kW), for the day's peak.
    #[serde(default)]
    pub recent_it_kw: Vec<(Timestamp, f64)>,
}

/// Follows demand intervals and the billing period's peak.
#[derive(Debug, Clone)]
pub struct DemandTracker {
    interval_s: f64,
    tz: Tz,
    /// The open demand interval: its index and start.
    open: Option<(i64, Timestamp)>,
    covered_s: f64,
    energy: BTreeMap<(Account, Option<String>), f64>,
    it_kwh: f64,
    current: Option<PeriodPeak>,
    recent: VecDeque<(Timestamp, f64)>,
    changed: bool,
}

/// The billing period (calendar month in `tz`) `t` falls in.
pub fn period_of(t: Timestamp, tz: Tz) -> String {
    t.to_datetime()
        .with_timezone(&tz)
        .format("%Y-%m")
        .to_string()
}

impl DemandTracker {
    pub fn new(interval_s: f64, tz: Tz) -> Self {
        DemandTracker {
            interval_s: interval_s.max(1.0),
            tz,
            open: None,
            covered_s: 0.0,
            energy: BTreeMap::new(),
            it_kwh: 0.0,
            current: None,
            recent: VecDeque::new(),
            changed: false,
        }
    }

    /// Resumes from the stored records: the latest period's peak and the last day's
    /// demand intervals.
    pub fn restore(mut self, records: BTreeMap<String, PeriodPeak>) -> Self {
        if let Some((_, p)) = records.into_iter().next_back() {
            self.recent = p.recent_it_kw.iter().copied().collect();
            self.current = Some(p);
        }
        self
    }

    /// Starts over from the stored records (a replica taking over from its leader).
    pub fn reload(&mut self, records: BTreeMap<String, PeriodPeak>) {
        *self = DemandTracker::new(self.interval_s, self.tz).restore(records);
    }

    /// The demand interval `t` falls in: its index and start (from local midnight).
    fn interval_of(&self, t: Timestamp) -> (i64, Timestamp) {
        let offset = t
            .to_datetime()
            .with_timezone(&self.tz)
            .offset()
            .fix()
            .local_minus_utc();
        let local = t.as_secs_f64() + f64::from(offset);
        let k = (local / self.interval_s).floor();
        (k as i64, t + -(local - k * self.interval_s))
    }

    /// Counts energy used over `[from, to)`: (account, rack, kWh) each.
    pub fn add(
        &mut self,
        from: Timestamp,
        to: Timestamp,
        charges: impl IntoIterator<Item = (Account, Option<String>, f64)>,
    ) {
        let (k, start) = self.interval_of(from);
        match self.open {
            Some((open, _)) if open == k => {}
            Some(_) => {
                self.close();
                self.open = Some((k, start));
            }
            None => self.open = Some((k, start)),
        }
        self.covered_s += to.secs_since(from).max(0.0);
        for (account, rack, kwh) in charges {
            if account != Account::Overhead {
                self.it_kwh += kwh;
            }
            *self.energy.entry((account, rack)).or_default() += kwh;
        }
    }

    /// Closes the open demand interval (at shutdown, or when the next one starts).
    pub fn close(&mut self) {
        let Some((_, start)) = self.open.take() else {
            return;
        };
        let energy = std::mem::take(&mut self.energy);
        let it_kwh = std::mem::take(&mut self.it_kwh);
        let covered_h = std::mem::take(&mut self.covered_s) / 3600.0;
        if covered_h <= 0.0 {
            return;
        }
        let end = start + self.interval_s;
        let kw = energy.values().sum::<f64>() / covered_h;
        let it_kw = it_kwh / covered_h;
        let period = period_of(start, self.tz);
        self.recent.push_back((end, it_kw));
        while self
            .recent
            .front()
            .is_some_and(|(e, _)| end.secs_since(*e) >= DAY_S)
        {
            self.recent.pop_front();
        }
        let entries = || {
            energy
                .iter()
                .filter(|(_, kwh)| **kwh != 0.0)
                .map(|((account, rack), kwh)| LedgerEntry {
                    start,
                    end,
                    account: account.clone(),
                    rack: rack.clone(),
                    energy_kwh: *kwh,
                    cost: 0.0,
                    carbon_kg: 0.0,
                    integrated_kwh: 0.0,
                    shared_kwh: 0.0,
                })
                .collect()
        };
        match &mut self.current {
            Some(p) if p.period == period => {
                if kw > p.kw {
                    p.kw = kw;
                    p.start = start;
                    p.end = end;
                    p.entries = entries();
                }
                p.it_kw = p.it_kw.max(it_kw);
            }
            _ => {
                self.current = Some(PeriodPeak {
                    period,
                    start,
                    end,
                    kw,
                    entries: entries(),
                    it_kw,
                    recent_it_kw: Vec::new(),
                })
            }
        }
        if let Some(p) = &mut self.current {
            p.recent_it_kw = self.recent.iter().copied().collect();
        }
        self.changed = true;
    }

    /// The period's record, once after each demand interval closed, for the store.
    pub fn take_changed(&mut self) -> Option<PeriodPeak> {
        if !std::mem::take(&mut self.changed) {
            return None;
        }
        self.current.clone()
    }

    /// The billing period's peak so far, at `now`.
    pub fn current(&self, now: Timestamp) -> Option<&PeriodPeak> {
        self.current
            .as_ref()
            .filter(|p| p.period == period_of(now, self.tz))
    }

    /// The highest IT average over the demand intervals of the last 24 hours.
    pub fn day_peak_kw(&self, now: Timestamp) -> Option<f64> {
        self.recent
            .iter()
            .filter(|(e, _)| now.secs_since(*e) < DAY_S)
            .map(|(_, kw)| *kw)
            .reduce(f64::max)
    }

    /// The site readings the automatic peak target reads: `period_peak_w`, `day_peak_w`.
    pub fn samples(&self, site: &telemetry::EntityId, now: Timestamp) -> Vec<Sample> {
        let mut out = Vec::new();
        if let Some(p) = self.current(now) {
            out.push(Sample::new(
                site.clone(),
                PERIOD_PEAK_W,
                p.it_kw * 1000.0,
                now,
                "ledger",
            ));
        }
        if let Some(kw) = self.day_peak_kw(now) {
            out.push(Sample::new(
                site.clone(),
                DAY_PEAK_W,
                kw * 1000.0,
                now,
                "ledger",
            ));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> Timestamp {
        Timestamp::parse_rfc3339(s).expect("t")
    }

    fn job(id: &str) -> Account {
        Account::Job {
            job: id.into(),
            project: "p".into(),
            user: "u".into(),
        }
    }

    /// Feeds `kw` of job `id` (and a fifth of it as cooling) in 60 s ticks over
    /// `[from, from + minutes)`.
    fn run(d: &mut DemandTracker, from: Timestamp, minutes: u32, kw: f64, id: &str) {
        for m in 0..minutes {
            let a = from + f64::from(m) * 60.0;
            let kwh = kw / 60.0;
            d.add(
                a,
                a + 60.0,
                [
                    (job(id), Some("r1".to_string()), kwh),
                    (Account::Overhead, None, kwh / 5.0),
                ],
            );
        }
    }

    #[test]
    fn the_peak_is_the_highest_interval_average_not_the_highest_tick() {
        let tz: Tz = "Europe/Berlin".parse().expect("tz");
        let mut d = DemandTracker::new(900.0, tz);
        let from = t("2026-11-10T10:00:00+01:00");
        // 15 minutes at 100 kW, then 5 minutes at 250 kW and 10 at 10 kW (average 90)
        run(&mut d, from, 15, 100.0, "a");
        run(&mut d, from + 900.0, 5, 250.0, "b");
        run(&mut d, from + 1200.0, 10, 10.0, "c");
        d.close();
        let p = d.take_changed().expect("record");
        assert_eq!(p.period, "2026-11");
        assert!((p.kw - 120.0).abs() < 1e-9, "{}", p.kw);
        assert!((p.it_kw - 100.0).abs() < 1e-9, "{}", p.it_kw);
        assert_eq!((p.start, p.end), (from, from + 900.0));
        // the charge is attributed to who used that interval's energy
        let a: f64 = p
            .entries
            .iter()
            .filter(|e| e.account == job("a"))
            .map(|e| e.energy_kwh)
            .sum();
        assert!((a - 25.0).abs() < 1e-9, "{a}");
        assert!(p.entries.iter().all(|e| e.account != job("b")));
        assert_eq!(d.take_changed(), None, "once per closed interval");
    }

    #[test]
    fn intervals_count_from_local_midnight_and_a_new_month_starts_a_new_period() {
        // Kolkata is UTC+05:30: hourly intervals start on the local hour
        let tz: Tz = "Asia/Kolkata".parse().expect("tz");
        let d = DemandTracker::new(3600.0, tz);
        let (_, start) = d.interval_of(t("2026-11-30T10:10:00Z"));
        assert_eq!(start, t("2026-11-30T09:30:00Z"));
        let mut d = DemandTracker::new(900.0, tz);
        run(&mut d, t("2026-11-30T23:30:00+05:30"), 30, 80.0, "a");
        run(&mut d, t("2026-12-01T00:00:00+05:30"), 30, 40.0, "a");
        d.close();
        let p = d.current(t("2026-12-01T01:00:00+05:30")).expect("december");
        assert_eq!(p.period, "2026-12");
        assert!((p.it_kw - 40.0).abs() < 1e-9);
        // the day's peak still remembers November's last hour
        let day = d.day_peak_kw(t("2026-12-01T01:00:00+05:30"));
        assert!((day.expect("day peak") - 80.0).abs() < 1e-9);
        assert_eq!(d.day_peak_kw(t("2026-12-02T02:00:00+05:30")), None);
    }

    #[test]
    fn a_restart_resumes_the_period_peak_from_its_record() {
        let tz: Tz = "UTC".parse().expect("tz");
        let mut d = DemandTracker::new(900.0, tz);
        let from = t("2026-11-10T10:00:00Z");
        run(&mut d, from, 15, 100.0, "a");
        d.close();
        let rec = d.take_changed().expect("record");
        let json = serde_json::to_string(&rec).expect("json");
        let back: PeriodPeak = serde_json::from_str(&json).expect("decode");
        let mut e = DemandTracker::new(900.0, tz)
            .restore([(back.period.clone(), back)].into_iter().collect());
        // a lower interval after the restart leaves the peak where it was
        run(&mut e, from + 3600.0, 15, 60.0, "b");
        e.close();
        let p = e.take_changed().expect("record");
        assert!((p.kw - 120.0).abs() < 1e-9);
        assert_eq!(p.start, from);
        let s = e.samples(
            &telemetry::EntityId::new(telemetry::EntityKind::Site, "x"),
            from + 4500.0,
        );
        assert_eq!(s.len(), 2);
        assert!((s[0].value - 100_000.0).abs() < 1e-6);
    }
}
