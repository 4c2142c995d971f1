//! The time-of-use tariff: prices, periods and the demand charge.

use super::*;
use crate::tariff::{parse_clock, parse_day, Tariff, TouPeriod};

pub(super) fn build_tariff(t: &RawTariff, c: &mut Collector) -> Tariff {
    let default_per_kwh = price(c, &t.default_per_kwh, "tariff: default_per_kwh");
    let periods = t.periods.iter().map(|p| build_period(p, c)).collect();
    let demand_charge_per_kw = t.demand_charge_per_kw.as_ref().map(|d| {
        let v = *d.get_ref();
        if !(v.is_finite() && (0.0..=10_000.0).contains(&v)) {
            c.at(
                span(d),
                format!("tariff: demand_charge_per_kw must be within 0..=10000, got {v}"),
            );
        }
        v
    });
    let demand_interval_s = t.demand_interval_min.as_ref().map(|d| {
        let v = *d.get_ref();
        if !(v.is_finite() && (1.0..=1440.0).contains(&v) && 1440.0 % v == 0.0) {
            c.at(
                span(d),
                format!(
                    "tariff: demand_interval_min must divide a day into whole intervals (1..=1440 minutes, e.g. 15 or 30), got {v}"
                ),
            );
        }
        v * 60.0
    });
    Tariff {
        default_per_kwh,
        periods,
        demand_charge_per_kw,
        demand_interval_s,
    }
}

/// A price per kWh: it may be negative (day-ahead markets), never absurd.
fn price(c: &mut Collector, v: &S<f64>, what: &str) -> f64 {
    let p = *v.get_ref();
    if !(p.is_finite() && (-10.0..=100.0).contains(&p)) {
        c.at(
            span(v),
            format!("{what} must be within -10..=100 per kWh, got {p}"),
        );
    }
    p
}

fn build_period(p: &RawTouPeriod, c: &mut Collector) -> TouPeriod {
    let owner = format!("tariff period {:?}", p.name.get_ref());
    let days = period_days(p, &owner, c);
    let from_min = clock(c, &owner, &p.from, false);
    let to_min = clock(c, &owner, &p.to, true);
    if from_min == to_min {
        c.at(
            span(&p.to),
            format!("{owner}: from and to are the same: the period would be empty"),
        );
    }
    TouPeriod {
        name: p.name.get_ref().clone(),
        days,
        from_min,
        to_min: to_min.min(1440),
        per_kwh: price(c, &p.per_kwh, &format!("{owner}: per_kwh")),
    }
}

/// The weekdays a period applies on (every day when it names none).
fn period_days(p: &RawTouPeriod, owner: &str, c: &mut Collector) -> [bool; 7] {
    let mut days = [true; 7];
    if let Some(list) = &p.days {
        days = [false; 7];
        for d in list {
            match parse_day(d.get_ref()) {
                Some(i) => days[i] = true,
                None => c.at(
                    span(d),
                    format!(
                        "{owner}: unknown day {:?} (mon, tue, wed, thu, fri, sat, sun)",
                        d.get_ref()
                    ),
                ),
            }
        }
    }
    days
}

/// A time of day in minutes (`24:00` allowed only as an end); 0 when it is not one.
fn clock(c: &mut Collector, owner: &str, v: &S<String>, end: bool) -> u32 {
    match parse_clock(v.get_ref()) {
        Some(m) if end || m < 1440 => m,
        _ => {
            c.at(
                span(v),
                format!(
                    "{owner}: {:?} is not a time of day (HH:MM, 00:00..{})",
                    v.get_ref(),
                    if end { "24:00" } else { "23:59" }
                ),
            );
            0
        }
    }
}
