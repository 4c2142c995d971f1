//! Synthetic meter histories built here, figures checked against values computed by
//! hand: a weekday shape of 400 kW + 20 kW per hour of the day, weekends at 200 kW, an
//! event on Thursday 2024-06-20 from 14:00 to 17:00 UTC on 15-minute intervals.

use super::*;

const Q: f64 = 900.0;

fn t(s: &str) -> Timestamp {
    Timestamp::parse_rfc3339(s).expect("time")
}

fn day(s: &str) -> NaiveDate {
    s.parse().expect("date")
}

fn event() -> Event {
    Event {
        start: t("2024-06-20T14:00:00Z"),
        end: t("2024-06-20T17:00:00Z"),
    }
}

/// The 10 most recent similar days before the event day, most recent first, each with
/// its offset (kW on top of the shape all day): 06-19 is a holiday, 06-18 had an
/// event, 06-17 misses its 15:00 interval, so none of them counts.
const DAYS: [(&str, f64); 10] = [
    ("2024-06-14", 90.0),
    ("2024-06-13", 10.0),
    ("2024-06-12", 20.0),
    ("2024-06-11", 30.0),
    ("2024-06-10", 40.0),
    ("2024-06-07", 50.0),
    ("2024-06-06", 60.0),
    ("2024-06-05", 70.0),
    ("2024-06-04", 80.0),
    ("2024-06-03", 0.0),
];

fn shape(hour: u32) -> f64 {
    400.0 + 20.0 * f64::from(hour)
}

/// Every 15 minutes from `from` to the end of the event day; the event day's morning
/// (before 13:00) at `morning` × the shape, its hour before the event at 700, 710, 720
/// and 730 kW, the event at 500 kW.
fn history(from: &str, morning: f64) -> History {
    let mut out = Vec::new();
    let mut d = day(from);
    while d <= day("2024-06-20") {
        let midnight = Timestamp::from(d.and_hms_opt(0, 0, 0).expect("midnight").and_utc());
        for q in 0..96u32 {
            let hour = q / 4;
            let ds = d.to_string();
            let weekend = matches!(d.weekday(), Weekday::Sat | Weekday::Sun);
            let kw = match ds.as_str() {
                _ if weekend => 200.0,
                "2024-06-19" | "2024-06-18" => 5000.0,
                "2024-06-17" if q == 60 => continue,
                "2024-05-31" => shape(hour) + 1000.0,
                "2024-06-20" => match hour {
                    0..=12 => morning * shape(hour),
                    13 => 700.0 + 10.0 * f64::from(q % 4),
                    14..=16 => 500.0,
                    _ => shape(hour),
                },
                _ => DAYS
                    .iter()
                    .find(|(k, _)| *k == ds)
                    .map_or(shape(hour), |(_, o)| shape(hour) + o),
            };
            out.push(Reading {
                start: midnight.plus_secs(f64::from(q) * Q),
                kw,
            });
        }
        d = d.succ_opt().expect("next day");
    }
    History::new(Q, &out).expect("history")
}

fn calendar() -> Calendar<'static> {
    Calendar::weekdays(
        chrono_tz::UTC,
        [day("2024-06-19")].into(),
        [day("2024-06-18")].into(),
    )
}

fn kw(b: &Baseline) -> Vec<f64> {
    b.intervals.iter().map(|r| r.kw).collect()
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

#[test]
fn caiso_takes_the_ten_most_recent_similar_metered_days_and_the_morning_ratio() {
    let h = history("2024-05-01", 1.1);
    let b = caiso_10_in_10(&h, &event(), &calendar()).expect("baseline");
    let expected_days: Vec<NaiveDate> = DAYS.iter().map(|(d, _)| day(d)).collect();
    assert_eq!(b.days, expected_days, "no holiday, event day, gap or 05-31");
    // the 10 days' offsets average 45 kW; their 09:00-13:00 mean is 400 + 20 × 10.5 +
    // 45 = 655 kW, the event day's 1.1 × 610 = 671 kW
    let ratio = 671.0 / 655.0;
    assert!(close(b.adjustment.expect("adjusted"), ratio), "{b:?}");
    assert_eq!(b.intervals.len(), 12);
    assert_eq!(b.intervals[0].start, t("2024-06-20T14:00:00Z"));
    assert_eq!(b.intervals[11].start, t("2024-06-20T16:45:00Z"));
    for (k, v) in kw(&b).into_iter().enumerate() {
        let hour = 14 + k as u32 / 4;
        assert!(close(v, (shape(hour) + 45.0) * ratio), "interval {k}: {v}");
    }
}

#[test]
fn caiso_caps_the_same_day_adjustment_at_twenty_percent() {
    let up = caiso_10_in_10(&history("2024-05-01", 1.5), &event(), &calendar()).expect("up");
    assert_eq!(up.adjustment, Some(1.2), "915 / 655 capped");
    assert!(close(up.intervals[0].kw, 725.0 * 1.2));
    let down = caiso_10_in_10(&history("2024-05-01", 0.5), &event(), &calendar()).expect("down");
    assert_eq!(down.adjustment, Some(0.8), "305 / 655 capped");
    assert!(close(down.intervals[4].kw, 745.0 * 0.8));
}

#[test]
fn ercot_drops_the_highest_and_lowest_day_and_averages_the_middle_eight() {
    let b =
        ercot_middle_8_of_10(&history("2024-05-01", 1.1), &event(), &calendar()).expect("baseline");
    assert_eq!(b.dropped, vec![day("2024-06-14"), day("2024-06-03")]);
    assert_eq!(b.days.len(), 8);
    assert!(!b.days.contains(&day("2024-06-14")) && !b.days.contains(&day("2024-06-03")));
    assert_eq!(b.adjustment, None, "the morning offset is not applied");
    // offsets 10..=80: a mean of 45 kW on the shape
    let v = kw(&b);
    assert!(
        close(v[0], 725.0) && close(v[4], 745.0) && close(v[11], 765.0),
        "{v:?}"
    );
}

#[test]
fn pjm_is_the_hour_before_flat_over_the_event_and_settles_against_the_meter() {
    let h = history("2024-06-10", 1.1);
    let b = pjm_hour_before(&h, &event(), &calendar()).expect("baseline");
    assert_eq!(b.days, vec![day("2024-06-20")]);
    assert!(kw(&b).iter().all(|v| close(*v, 715.0)), "{:?}", kw(&b));
    let p = performance(&b, &h, 200.0).expect("performance");
    assert_eq!(p.intervals.len(), 12);
    assert!(p.intervals.iter().all(|s| close(s.metered_kw, 500.0)));
    assert!(p.intervals.iter().all(|s| close(s.delivered_kw, 215.0)));
    assert!(close(p.delivered_kwh, 645.0), "215 kW for 3 h");
    assert!(close(p.delivered_kw, 215.0));
    assert!(
        close(p.performance_factor, 1.075),
        "{}",
        p.performance_factor
    );
}

#[test]
fn too_little_history_or_a_gap_the_rule_needs_is_an_error_that_says_so() {
    // from 06-05: only 8 similar days
    let short = history("2024-06-05", 1.1);
    let e = caiso_10_in_10(&short, &event(), &calendar()).expect_err("too few");
    assert_eq!(
        e,
        BaselineError::TooFewDays {
            method: Method::Caiso10in10,
            day: day("2024-06-20"),
            needed: 10,
            found: 8
        }
    );
    assert!(e.to_string().contains("found 8"), "{e}");
    assert!(matches!(
        ercot_middle_8_of_10(&short, &event(), &calendar()),
        Err(BaselineError::TooFewDays { found: 8, .. })
    ));
    // the hour before with a gap
    let mut readings: Vec<Reading> = Vec::new();
    for q in 0..3 {
        readings.push(Reading {
            start: t("2024-06-20T13:00:00Z").plus_secs(f64::from(q) * Q),
            kw: 700.0,
        });
    }
    let gap = History::new(Q, &readings).expect("history");
    assert_eq!(
        pjm_hour_before(&gap, &event(), &calendar()),
        Err(BaselineError::Missing {
            method: Method::PjmHourBefore,
            at: t("2024-06-20T13:45:00Z")
        })
    );
}

#[test]
fn events_off_the_grid_bad_intervals_and_no_commitment_are_refused() {
    let h = history("2024-06-10", 1.1);
    let off = Event {
        start: t("2024-06-20T14:05:00Z"),
        end: t("2024-06-20T17:00:00Z"),
    };
    assert!(matches!(
        pjm_hour_before(&h, &off, &calendar()),
        Err(BaselineError::Event { .. })
    ));
    let backwards = Event {
        start: event().end,
        end: event().start,
    };
    assert!(matches!(
        pjm_hour_before(&h, &backwards, &calendar()),
        Err(BaselineError::Event { .. })
    ));
    assert_eq!(
        History::new(420.0, &[]).map(|_| ()),
        Err(BaselineError::Interval(420.0))
    );
    let b = pjm_hour_before(&h, &event(), &calendar()).expect("baseline");
    assert_eq!(
        performance(&b, &h, 0.0).map(|_| ()),
        Err(BaselineError::Committed(0.0))
    );
}

#[test]
fn a_weekend_event_is_matched_with_weekend_days_through_the_callers_calendar() {
    let h = history("2024-04-01", 1.0);
    let sat = Event {
        start: t("2024-06-15T14:00:00Z"),
        end: t("2024-06-15T15:00:00Z"),
    };
    let cal = Calendar {
        tz: chrono_tz::UTC,
        is_business_day: Box::new(|d: NaiveDate| {
            !matches!(d.weekday(), Weekday::Sat | Weekday::Sun)
        }),
        event_days: BTreeSet::new(),
    };
    let b = ercot_middle_8_of_10(&h, &sat, &cal).expect("baseline");
    assert!(b
        .days
        .iter()
        .chain(&b.dropped)
        .all(|d| matches!(d.weekday(), Weekday::Sat | Weekday::Sun)));
    assert_eq!(b.days.len() + b.dropped.len(), 10);
    assert!(
        b.dropped.iter().all(|d| b.days.iter().all(|k| d < k)),
        "of equal days the older are dropped: {b:?}"
    );
    assert!(kw(&b).iter().all(|v| close(*v, 200.0)));
}
