//! What the policy's facility did in each demand-response event, from its simulated
//! meter (IT plus cooling), against the same scenario's run without the events: the
//! `demand_response` entries of `summary.json`, and the points the report draws.
//!
//! The meter is taken per interval of `tick_s` from the event's start (each interval
//! the mean of the steps in it, weighted by time). The target: the baseline × (1 −
//! shed) for `shed_pct`, `target_kw` for a cap. The meter is at the target in an
//! interval whose mean is at most the target + [`TARGET_TOLERANCE`].

use serde::Serialize;
use telemetry::grid::GridTarget;
use telemetry::Timestamp;

use super::facility::Facility;
use super::grid::{DrEvent, Meter, BASELINE_S};

/// How far over its target the meter may be and still count as at it (1%).
pub const TARGET_TOLERANCE: f64 = 0.01;
/// The time after an event its rebound is looked for in, s.
pub const REBOUND_S: f64 = 3600.0;
/// Deadlines from an event's start to this long after its end count as its misses, s.
pub const DEADLINE_WINDOW_S: f64 = 24.0 * 3600.0;

/// One interval of an event's chart: the meter in both runs, kW.
#[derive(Debug, Clone, PartialEq)]
pub struct ChartPoint {
    pub t: Timestamp,
    pub metered_kw: Option<f64>,
    pub without_event_kw: Option<f64>,
}

/// One event's figures (null where the run did not reach the event).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DemandResponse {
    pub id: String,
    pub start: String,
    pub duration_min: f64,
    /// The shed asked, % of the baseline (null for a cap).
    pub shed_pct: Option<f64>,
    pub target_kw: Option<f64>,
    /// The meter's mean over the hour before the start, as published to the engine.
    pub baseline_kw: Option<f64>,
    /// The meter's mean over the event.
    pub metered_kw: Option<f64>,
    /// Baseline − metered.
    pub delivered_kw: Option<f64>,
    /// From the start to the first interval at the target (tolerance 1%).
    pub time_to_target_s: Option<f64>,
    /// p95, over the intervals from the first at the target to the end, of how far the
    /// meter was over the target, % of the target (0 where under).
    pub tracking_error_p95_pct: Option<f64>,
    /// GPU-hours of work done in the event's window, with and without the events.
    pub gpu_hours: f64,
    pub gpu_hours_without_event: f64,
    /// (without − with) / without, %.
    pub gpu_hours_lost_pct: Option<f64>,
    /// The highest interval in the hour after the end, with and without the events.
    pub rebound_peak_kw: Option<f64>,
    pub rebound_peak_without_event_kw: Option<f64>,
    /// Jobs with a deadline from the start to 24 h after the end that missed it, with
    /// and without the events.
    pub deadline_misses: usize,
    pub deadline_misses_without_event: usize,
    /// From an hour before the start to an hour after the end, for the report.
    #[serde(skip)]
    pub chart: Vec<ChartPoint>,
}

/// The meter's interval means over `[from, to)`, `width_s` each.
fn intervals(
    m: &Meter,
    from: Timestamp,
    to: Timestamp,
    width_s: f64,
) -> Vec<(Timestamp, Option<f64>)> {
    let n = (to.secs_since(from) / width_s).ceil().max(0.0) as usize;
    (0..n)
        .map(|k| {
            let a = from + k as f64 * width_s;
            let b = (a + width_s).min(to);
            (a, m.mean_kw(a, b))
        })
        .collect()
}

fn misses(f: &Facility, from: Timestamp, to: Timestamp) -> usize {
    f.jobs
        .iter()
        .filter(|j| {
            j.job
                .deadline
                .is_some_and(|d| d >= from && d < to && j.job.end_time.is_none_or(|e| e > d))
        })
        .count()
}

/// The figures of every event the policy's facility (`with`) published, against the
/// run without them (`without`); `width_s`: the interval the meter is taken over.
pub(super) fn measure(with: &Facility, without: &Facility, width_s: f64) -> Vec<DemandResponse> {
    let (Some(grid), Some(m), Some(m0)) = (&with.grid, &with.meter, &without.meter) else {
        return Vec::new();
    };
    grid.events
        .iter()
        .zip(&grid.baselines_kw)
        .map(|(e, b)| {
            // an event the run did not read in force: its baseline as it would have been
            let b = b.or_else(|| m.mean_kw(e.start + -BASELINE_S, e.start));
            event(
                e,
                b,
                m,
                m0,
                width_s,
                misses(with, e.start, e.end + DEADLINE_WINDOW_S),
                misses(without, e.start, e.end + DEADLINE_WINDOW_S),
            )
        })
        .collect()
}

fn event(
    e: &DrEvent,
    baseline_kw: Option<f64>,
    m: &Meter,
    m0: &Meter,
    width_s: f64,
    deadline_misses: usize,
    deadline_misses_without_event: usize,
) -> DemandResponse {
    let target_kw = match e.target {
        GridTarget::CapW(w) => Some(w / 1000.0),
        _ => baseline_kw.map(|b| e.target_w(b * 1000.0) / 1000.0),
    };
    let metered_kw = m.mean_kw(e.start, e.end);
    let during = intervals(m, e.start, e.end, width_s);
    let at_target = |kw: f64, t: f64| kw <= t * (1.0 + TARGET_TOLERANCE);
    let first = target_kw.and_then(|t| {
        during
            .iter()
            .position(|(_, kw)| kw.is_some_and(|kw| at_target(kw, t)))
    });
    let tracking = first.zip(target_kw).map(|(k, t)| {
        let mut over: Vec<f64> = during[k..]
            .iter()
            .filter_map(|(_, kw)| *kw)
            .map(|kw| (kw - t).max(0.0) / t.max(1e-9) * 100.0)
            .collect();
        over.sort_by(f64::total_cmp);
        super::summary::percentile(&over, 95.0)
    });
    let (gh, gh0) = (m.gpu_hours(e.start, e.end), m0.gpu_hours(e.start, e.end));
    let peak = |m: &Meter| {
        intervals(m, e.end, e.end + REBOUND_S, width_s)
            .into_iter()
            .filter_map(|(_, kw)| kw)
            .reduce(f64::max)
    };
    let (from, to) = (e.start + -BASELINE_S, e.end + REBOUND_S);
    let chart = intervals(m, from, to, width_s)
        .into_iter()
        .zip(intervals(m0, from, to, width_s))
        .map(|((t, kw), (_, kw0))| ChartPoint {
            t,
            metered_kw: kw,
            without_event_kw: kw0,
        })
        .collect();
    DemandResponse {
        id: e.id.clone(),
        start: e.start.to_string(),
        duration_min: e.duration_min,
        shed_pct: match e.target {
            GridTarget::ShedFraction(f) => Some(f * 100.0),
            _ => None,
        },
        target_kw,
        baseline_kw,
        metered_kw,
        delivered_kw: baseline_kw.zip(metered_kw).map(|(b, m)| b - m),
        time_to_target_s: first.map(|k| k as f64 * width_s),
        tracking_error_p95_pct: tracking,
        gpu_hours: gh,
        gpu_hours_without_event: gh0,
        gpu_hours_lost_pct: (gh0 > 0.0).then(|| (gh0 - gh) / gh0 * 100.0),
        rebound_peak_kw: peak(m),
        rebound_peak_without_event_kw: peak(m0),
        deadline_misses,
        deadline_misses_without_event,
        chart,
    }
}
