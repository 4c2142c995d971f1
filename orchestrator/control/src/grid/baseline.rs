//! Measurement and verification (M&V) of a demand-response event: what the meter would
//! have drawn without the event (the baseline), by the rules the grid operators settle
//! with, and what the site delivered against it.
//!
//! Input: the meter's interval averages (kW per interval, each keyed by its start, on
//! one interval length that divides the hour: 5, 15, 60 min), the event (start and end
//! on that interval grid) and a [`Calendar`] (the site's time zone, which days are
//! business days, which days had an event). Three baselines:
//!
//! - [`caiso_10_in_10`]: per interval, the average of the same local-time intervals on
//!   the 10 most recent similar days (same day type, not an event day, every interval
//!   of the window and of the adjustment hours metered) within the 45 days before the
//!   event day; times the **same-day adjustment**, a ratio: the event day's mean over
//!   the 4 hours ending 1 hour before the event's start against the same hours of the
//!   baseline days, capped to 0.8..=1.2 (±20%). Multiplicative, as CAISO's load-point
//!   adjustment; never additive here.
//! - [`ercot_middle_8_of_10`]: of the same 10 most recent similar days (without the
//!   adjustment hours' condition), the days with the highest and the lowest energy over
//!   the event window dropped, the middle 8 averaged per interval; no adjustment.
//! - [`pjm_hour_before`]: the mean of the intervals of the hour ending at the event's
//!   start, flat over the event.
//!
//! [`performance`] then gives, per interval, baseline, metered and delivered kW
//! (baseline − metered), the delivered kWh and the performance factor (mean delivered
//! kW / the committed shed). Too little history, a missing interval the rule cannot do
//! without, or an event off the interval grid is a [`BaselineError`]. Pure: no clock,
//! no IO.

use std::collections::{BTreeMap, BTreeSet};

use chrono::{Datelike, Duration, NaiveDate, NaiveTime, TimeZone, Utc, Weekday};
use chrono_tz::Tz;
use telemetry::Timestamp;

/// How far back similar days are looked for (CAISO's and ERCOT's 45 days).
pub const LOOKBACK_DAYS: i64 = 45;
/// How many similar days the day-matching baselines take.
pub const SIMILAR_DAYS: usize = 10;
/// The same-day adjustment's bounds (±20%).
pub const ADJUSTMENT_CAP: f64 = 0.2;

/// One metered interval: its start and the meter's average over it, kW.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Reading {
    pub start: Timestamp,
    pub kw: f64,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum BaselineError {
    #[error("interval_s must divide the hour (60, 300, 900, 3600...), got {0}")]
    Interval(f64),
    #[error("reading at {at}: kW must be finite, got {kw}")]
    Reading { at: Timestamp, kw: f64 },
    #[error(
        "event {start}..{end}: must end after it starts, both on the {interval_s} s interval grid"
    )]
    Event {
        start: Timestamp,
        end: Timestamp,
        interval_s: f64,
    },
    #[error("{method}: needs {needed} similar days with every interval metered within the {LOOKBACK_DAYS} days before {day}, found {found}")]
    TooFewDays {
        method: Method,
        day: NaiveDate,
        needed: usize,
        found: usize,
    },
    #[error("{method}: no metered interval at {at}")]
    Missing { method: Method, at: Timestamp },
    #[error("performance: the committed shed must be positive, got {0} kW")]
    Committed(f64),
}

/// Which baseline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    Caiso10in10,
    ErcotMiddle8of10,
    PjmHourBefore,
}

impl std::fmt::Display for Method {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Method::Caiso10in10 => "caiso 10-in-10",
            Method::ErcotMiddle8of10 => "ercot middle 8-of-10",
            Method::PjmHourBefore => "pjm hour-before",
        })
    }
}

/// The meter's history: interval averages on one interval length.
#[derive(Debug, Clone)]
pub struct History {
    interval_s: f64,
    kw: BTreeMap<i64, f64>,
}

impl History {
    /// A history of `readings`, each the average over `interval_s` from its start
    /// (an interval given twice keeps the later one).
    pub fn new(interval_s: f64, readings: &[Reading]) -> Result<History, BaselineError> {
        let whole = interval_s >= 1.0 && interval_s.fract() == 0.0;
        if !(whole && 3600.0 % interval_s == 0.0) {
            return Err(BaselineError::Interval(interval_s));
        }
        let mut kw = BTreeMap::new();
        for r in readings {
            if !r.kw.is_finite() {
                return Err(BaselineError::Reading {
                    at: r.start,
                    kw: r.kw,
                });
            }
            kw.insert(r.start.0, r.kw);
        }
        Ok(History { interval_s, kw })
    }

    pub fn interval_s(&self) -> f64 {
        self.interval_s
    }

    pub fn at(&self, start: Timestamp) -> Option<f64> {
        self.kw.get(&start.0).copied()
    }

    /// `n` consecutive intervals from `start`, if every one is metered.
    fn window(&self, start: Timestamp, n: usize) -> Option<Vec<f64>> {
        (0..n)
            .map(|k| self.at(start.plus_secs(k as f64 * self.interval_s)))
            .collect()
    }

    /// Like `window`, naming the first interval missing.
    fn require(
        &self,
        method: Method,
        start: Timestamp,
        n: usize,
    ) -> Result<Vec<f64>, BaselineError> {
        (0..n)
            .map(|k| {
                let at = start.plus_secs(k as f64 * self.interval_s);
                self.at(at).ok_or(BaselineError::Missing { method, at })
            })
            .collect()
    }
}

/// A demand-response event: `[start, end)`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Event {
    pub start: Timestamp,
    pub end: Timestamp,
}

/// The days: the site's time zone (days are local), which are business days, and
/// which had an event (never baseline days).
pub struct Calendar<'a> {
    pub tz: Tz,
    pub is_business_day: Box<dyn Fn(NaiveDate) -> bool + 'a>,
    pub event_days: BTreeSet<NaiveDate>,
}

impl Calendar<'static> {
    /// Monday to Friday are business days, except `holidays`.
    pub fn weekdays(
        tz: Tz,
        holidays: BTreeSet<NaiveDate>,
        event_days: BTreeSet<NaiveDate>,
    ) -> Calendar<'static> {
        Calendar {
            tz,
            is_business_day: Box::new(move |d| {
                !matches!(d.weekday(), Weekday::Sat | Weekday::Sun) && !holidays.contains(&d)
            }),
            event_days,
        }
    }
}

impl Calendar<'_> {
    fn day_of(&self, t: Timestamp) -> (NaiveDate, NaiveTime) {
        let local = t.to_datetime().with_timezone(&self.tz);
        (local.date_naive(), local.time())
    }

    /// `day` at local `time` (the earlier of two in a DST fall-back; none in a gap).
    fn at(&self, day: NaiveDate, time: NaiveTime) -> Option<Timestamp> {
        let local = self
            .tz
            .from_local_datetime(&day.and_time(time))
            .earliest()?;
        Some(Timestamp::from(local.with_timezone(&Utc)))
    }
}

/// A baseline: per interval of the event, the kW the meter would have drawn, with the
/// days it was taken from (the event day for the hour-before one) and, for CAISO's,
/// the same-day adjustment applied.
#[derive(Debug, Clone, PartialEq)]
pub struct Baseline {
    pub method: Method,
    pub interval_s: f64,
    pub intervals: Vec<Reading>,
    pub days: Vec<NaiveDate>,
    /// Of the 10 days, those dropped (ERCOT's highest and lowest).
    pub dropped: Vec<NaiveDate>,
    /// The same-day adjustment's ratio, after its cap (CAISO).
    pub adjustment: Option<f64>,
}

/// The event's intervals on the history's grid.
fn intervals(h: &History, e: &Event) -> Result<usize, BaselineError> {
    let ms = (h.interval_s * 1000.0) as i64;
    let span = e.end.0 - e.start.0;
    if span <= 0 || span % ms != 0 || e.start.0 % ms != 0 {
        return Err(BaselineError::Event {
            start: e.start,
            end: e.end,
            interval_s: h.interval_s,
        });
    }
    Ok((span / ms) as usize)
}

/// A similar day: its date, its event window, and its adjustment hours where asked.
struct Day {
    date: NaiveDate,
    window: Vec<f64>,
    morning: Vec<f64>,
}

/// The 10 most recent similar days before the event day within the lookback, each
/// with every interval of the window (and of the `morning` intervals ending 1 h
/// before the window, where `morning` > 0) metered.
fn similar_days(
    h: &History,
    e: &Event,
    cal: &Calendar<'_>,
    method: Method,
    morning: usize,
) -> Result<(NaiveDate, Vec<Day>), BaselineError> {
    let n = intervals(h, e)?;
    let (event_day, time) = cal.day_of(e.start);
    let business = (cal.is_business_day)(event_day);
    let mut days = Vec::new();
    for back in 1..=LOOKBACK_DAYS {
        if days.len() == SIMILAR_DAYS {
            break;
        }
        let date = event_day - Duration::days(back);
        if (cal.is_business_day)(date) != business || cal.event_days.contains(&date) {
            continue;
        }
        let Some(start) = cal.at(date, time) else {
            continue;
        };
        let Some(window) = h.window(start, n) else {
            continue;
        };
        let morning = match morning {
            0 => Vec::new(),
            m => match h.window(morning_start(h, start, m), m) {
                Some(v) => v,
                None => continue,
            },
        };
        days.push(Day {
            date,
            window,
            morning,
        });
    }
    if days.len() < SIMILAR_DAYS {
        return Err(BaselineError::TooFewDays {
            method,
            day: event_day,
            needed: SIMILAR_DAYS,
            found: days.len(),
        });
    }
    Ok((event_day, days))
}

/// The first of the `m` intervals ending 1 h before `start`.
fn morning_start(h: &History, start: Timestamp, m: usize) -> Timestamp {
    start.plus_secs(-3600.0 - m as f64 * h.interval_s)
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len().max(1) as f64
}

/// Per interval, the mean over `days`.
fn average(days: &[&Day], n: usize) -> Vec<f64> {
    (0..n)
        .map(|k| days.iter().map(|d| d.window[k]).sum::<f64>() / days.len().max(1) as f64)
        .collect()
}

fn readings(h: &History, e: &Event, kw: Vec<f64>) -> Vec<Reading> {
    kw.into_iter()
        .enumerate()
        .map(|(k, kw)| Reading {
            start: e.start.plus_secs(k as f64 * h.interval_s),
            kw,
        })
        .collect()
}

/// CAISO 10-in-10 with the same-day adjustment (a ratio over the 4 hours ending 1 hour
/// before the event, capped to ±20%).
pub fn caiso_10_in_10(
    h: &History,
    e: &Event,
    cal: &Calendar<'_>,
) -> Result<Baseline, BaselineError> {
    let method = Method::Caiso10in10;
    let m = (4.0 * 3600.0 / h.interval_s) as usize;
    let (_, days) = similar_days(h, e, cal, method, m)?;
    let n = intervals(h, e)?;
    let today = h.require(method, morning_start(h, e.start, m), m)?;
    let theirs = mean(
        &days
            .iter()
            .flat_map(|d| d.morning.clone())
            .collect::<Vec<_>>(),
    );
    let ratio = if theirs > 0.0 {
        (mean(&today) / theirs).clamp(1.0 - ADJUSTMENT_CAP, 1.0 + ADJUSTMENT_CAP)
    } else {
        1.0
    };
    let all: Vec<&Day> = days.iter().collect();
    let kw = average(&all, n).into_iter().map(|v| v * ratio).collect();
    Ok(Baseline {
        method,
        interval_s: h.interval_s,
        intervals: readings(h, e, kw),
        days: days.iter().map(|d| d.date).collect(),
        dropped: Vec::new(),
        adjustment: Some(ratio),
    })
}

/// ERCOT middle 8-of-10: the 10 most recent similar days, the highest and the lowest
/// by energy over the event window dropped (of equal days, the older), the other 8
/// averaged; unadjusted.
pub fn ercot_middle_8_of_10(
    h: &History,
    e: &Event,
    cal: &Calendar<'_>,
) -> Result<Baseline, BaselineError> {
    let method = Method::ErcotMiddle8of10;
    let (event_day, days) = similar_days(h, e, cal, method, 0)?;
    let n = intervals(h, e)?;
    // of equal days, the older one is dropped
    let energy = |d: &Day| d.window.iter().sum::<f64>();
    let low = days
        .iter()
        .min_by(|a, b| energy(a).total_cmp(&energy(b)).then(a.date.cmp(&b.date)))
        .map(|d| d.date);
    let high = days
        .iter()
        .filter(|d| Some(d.date) != low)
        .max_by(|a, b| energy(a).total_cmp(&energy(b)).then(b.date.cmp(&a.date)))
        .map(|d| d.date);
    let (Some(low), Some(high)) = (low, high) else {
        return Err(BaselineError::TooFewDays {
            method,
            day: event_day,
            needed: SIMILAR_DAYS,
            found: days.len(),
        });
    };
    let middle: Vec<&Day> = days
        .iter()
        .filter(|d| d.date != low && d.date != high)
        .collect();
    let kw = average(&middle, n);
    Ok(Baseline {
        method,
        interval_s: h.interval_s,
        intervals: readings(h, e, kw),
        days: middle.iter().map(|d| d.date).collect(),
        dropped: vec![high, low],
        adjustment: None,
    })
}

/// PJM hour-before: the mean of the hour ending at the event's start, every interval of
/// it metered, flat over the event.
pub fn pjm_hour_before(
    h: &History,
    e: &Event,
    cal: &Calendar<'_>,
) -> Result<Baseline, BaselineError> {
    let method = Method::PjmHourBefore;
    let n = intervals(h, e)?;
    let m = (3600.0 / h.interval_s) as usize;
    let hour = h.require(method, e.start.plus_secs(-3600.0), m)?;
    let flat = mean(&hour);
    Ok(Baseline {
        method,
        interval_s: h.interval_s,
        intervals: readings(h, e, vec![flat; n]),
        days: vec![cal.day_of(e.start).0],
        dropped: Vec::new(),
        adjustment: None,
    })
}

/// One interval of an event's settlement.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Settled {
    pub start: Timestamp,
    pub baseline_kw: f64,
    pub metered_kw: f64,
    /// Baseline − metered (negative where the meter drew more than the baseline).
    pub delivered_kw: f64,
}

/// What an event delivered against its baseline.
#[derive(Debug, Clone, PartialEq)]
pub struct Performance {
    pub method: Method,
    pub intervals: Vec<Settled>,
    pub delivered_kwh: f64,
    /// Delivered kWh over the event's hours.
    pub delivered_kw: f64,
    pub committed_kw: f64,
    /// Delivered kW / committed kW (1: the shed asked, exactly).
    pub performance_factor: f64,
}

/// The event settled against `baseline`, with the meter's intervals from `metered`
/// (every interval of the event metered) and `committed_kw` the shed asked.
pub fn performance(
    baseline: &Baseline,
    metered: &History,
    committed_kw: f64,
) -> Result<Performance, BaselineError> {
    if !(committed_kw > 0.0 && committed_kw.is_finite()) {
        return Err(BaselineError::Committed(committed_kw));
    }
    let mut intervals = Vec::with_capacity(baseline.intervals.len());
    for b in &baseline.intervals {
        let metered_kw = metered.at(b.start).ok_or(BaselineError::Missing {
            method: baseline.method,
            at: b.start,
        })?;
        intervals.push(Settled {
            start: b.start,
            baseline_kw: b.kw,
            metered_kw,
            delivered_kw: b.kw - metered_kw,
        });
    }
    let hours = intervals.len() as f64 * baseline.interval_s / 3600.0;
    let delivered_kwh: f64 = intervals
        .iter()
        .map(|s| s.delivered_kw * baseline.interval_s / 3600.0)
        .sum();
    let delivered_kw = if hours > 0.0 {
        delivered_kwh / hours
    } else {
        0.0
    };
    Ok(Performance {
        method: baseline.method,
        intervals,
        delivered_kwh,
        delivered_kw,
        committed_kw,
        performance_factor: delivered_kw / committed_kw,
    })
}

#[cfg(test)]
mod tests;
