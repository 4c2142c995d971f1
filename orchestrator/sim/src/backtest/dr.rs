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
    /// Jobs suspended during the event (a suspension that began in its window), and
    /// the GPU-hours suspended jobs held without running in the window.
    pub jobs_suspended: usize,
    pub suspended_gpu_hours: f64,
    /// The highest interval in the hour after the end, with and without the events.
    pub rebound_peak_kw: Option<f64>,
    pub rebound_peak_without_event_kw: Option<f64>,
    /// Jobs with a deadline from the start to 24 h after the end that missed it, with
    /// and without the events.
    pub deadline_misses: usize,
    pub deadline_misses_without_event: usize,
    /// The engine's grid controller's own view at the event's ticks: the lowest meter
    /// it estimated reachable without protected work (its lowest such estimate), and
    /// the most the target was out of its reach; null where it kept no memory.
    pub controller_floor_kw: Option<f64>,
    pub controller_shortfall_kw: Option<f64>,
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

fn suspensions(f: &Facility, from: Timestamp, to: Timestamp) -> usize {
    f.jobs
        .iter()
        .filter(|j| j.suspended_at.iter().any(|&t| t >= from && t < to))
        .count()
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
            let b = b.or_else(|| m.mean_kw(e.start.plus_secs(-BASELINE_S), e.start));
            let views: Vec<_> = grid
                .controller
                .iter()
                .filter(|v| v.t >= e.start && v.t < e.end)
                .copied()
                .collect();
            let mut d = event(
                e,
                b,
                m,
                m0,
                width_s,
                misses(with, e.start, e.end + DEADLINE_WINDOW_S),
                misses(without, e.start, e.end + DEADLINE_WINDOW_S),
            );
            d.jobs_suspended = suspensions(with, e.start, e.end);
            d.controller_floor_kw = views.iter().map(|v| v.floor_kw).reduce(f64::min);
            d.controller_shortfall_kw = views.iter().map(|v| v.shortfall_kw).reduce(f64::max);
            d
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
    let (from, to) = (e.start.plus_secs(-BASELINE_S), e.end + REBOUND_S);
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
        jobs_suspended: 0,
        suspended_gpu_hours: m.suspended_gpu_hours(e.start, e.end),
        rebound_peak_kw: peak(m),
        rebound_peak_without_event_kw: peak(m0),
        deadline_misses,
        deadline_misses_without_event,
        controller_floor_kw: None,
        controller_shortfall_kw: None,
        chart,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backtest::grid::MeterStep;

    fn at(s: &str) -> Timestamp {
        Timestamp::parse_rfc3339(s).expect("time")
    }

    /// 300 s steps from 09:00: `kw` each, `work` GPU-seconds each.
    fn meter(kw: &[f64], work: f64) -> Meter {
        let t0 = at("2024-06-03T09:00:00Z");
        Meter {
            steps: kw
                .iter()
                .enumerate()
                .map(|(k, &kw)| MeterStep {
                    t0: t0 + k as f64 * 300.0,
                    dt_s: 300.0,
                    kw,
                    work_gpu_s: work,
                    suspended_gpu_s: 0.0,
                })
                .collect(),
        }
    }

    const DURING: [f64; 12] = [
        380.0, 350.0, 310.0, 302.0, 300.0, 306.0, 300.0, 300.0, 300.0, 300.0, 300.0, 330.0,
    ];

    #[test]
    fn an_event_is_measured_from_the_meter_per_interval_against_the_run_without_it() {
        // an hour at 400 kW, the event's hour, then a rebound
        let mut with = vec![400.0; 12];
        with.extend(DURING);
        with.extend([420.0, 450.0, 410.0]);
        let e = DrEvent {
            id: "e".into(),
            start: at("2024-06-03T10:00:00Z"),
            end: at("2024-06-03T11:00:00Z"),
            duration_min: 60.0,
            target: GridTarget::ShedFraction(0.25),
        };
        let (m, m0) = (meter(&with, 1800.0), meter(&[400.0; 27], 3600.0));
        let baseline = m.mean_kw(e.start.plus_secs(-BASELINE_S), e.start);
        let d = event(&e, baseline, &m, &m0, 300.0, 1, 0);
        assert_eq!(d.baseline_kw, Some(400.0));
        assert_eq!(d.target_kw, Some(300.0));
        assert_eq!(d.shed_pct, Some(25.0));
        let mean = DURING.iter().sum::<f64>() / 12.0;
        assert!((d.metered_kw.expect("metered") - mean).abs() < 1e-9);
        assert!((d.delivered_kw.expect("delivered") - (400.0 - mean)).abs() < 1e-9);
        // 310 kW is over 303 (the target + 1%), 302 kW is not: the fourth interval
        assert_eq!(d.time_to_target_s, Some(900.0));
        // from there: 0.67%, 0, 2%, 0 ×5 and 10% over: the p95 of 9 is the highest
        let p95 = d.tracking_error_p95_pct.expect("tracking");
        assert!((p95 - 10.0).abs() < 1e-9, "{p95}");
        // 12 steps of half a GPU-hour against 12 of one
        assert!(
            (d.gpu_hours - 6.0).abs() < 1e-9 && (d.gpu_hours_without_event - 12.0).abs() < 1e-9
        );
        assert!((d.gpu_hours_lost_pct.expect("lost") - 50.0).abs() < 1e-9);
        assert_eq!(
            d.rebound_peak_kw,
            Some(450.0),
            "the hour after, as far as metered"
        );
        assert_eq!(d.rebound_peak_without_event_kw, Some(400.0));
        assert_eq!((d.deadline_misses, d.deadline_misses_without_event), (1, 0));
        assert_eq!(d.chart.len(), 36, "an hour either side, 5 min each");
        assert_eq!(d.chart[12].metered_kw, Some(380.0));
        assert_eq!(d.chart[30].metered_kw, None, "past the run");
    }

    #[test]
    fn a_cap_never_met_has_no_time_to_target_nor_tracking_error() {
        let mut with = vec![400.0; 12];
        with.extend(DURING);
        let e = DrEvent {
            id: "cap".into(),
            start: at("2024-06-03T10:00:00Z"),
            end: at("2024-06-03T11:00:00Z"),
            duration_min: 60.0,
            target: GridTarget::CapW(250_000.0),
        };
        let m = meter(&with, 3600.0);
        let d = event(&e, Some(400.0), &m, &m, 300.0, 0, 0);
        assert_eq!((d.target_kw, d.shed_pct), (Some(250.0), None));
        assert_eq!(d.time_to_target_s, None);
        assert_eq!(d.tracking_error_p95_pct, None);
        assert_eq!(d.gpu_hours_lost_pct, Some(0.0));
        assert_eq!(d.rebound_peak_kw, None, "nothing metered after the event");
    }
}
