//! Price and carbon forecasts as the engine sees them: step series (each point holds
//! until the next one), with the window statistics that policies use as signals.

use serde::{Deserialize, Serialize};
use telemetry::Timestamp;

/// A step series: `(start, value)` sorted by start; each value holds until the next
/// start, the last one for `last_step_s`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StepSeries {
    pub points: Vec<(Timestamp, f64)>,
    /// How long the last point holds (an hourly day-ahead series: 3600).
    #[serde(default = "hour")]
    pub last_step_s: f64,
}

fn hour() -> f64 {
    3600.0
}

impl StepSeries {
    pub fn new(mut points: Vec<(Timestamp, f64)>, last_step_s: f64) -> Self {
        points.sort_by_key(|p| p.0);
        points.dedup_by_key(|p| p.0);
        StepSeries {
            points,
            last_step_s,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.points.is_empty()
    }

    /// The end of the series (where the last step stops).
    pub fn end(&self) -> Option<Timestamp> {
        self.points.last().map(|p| p.0 + self.last_step_s)
    }

    /// The value in force at `t`; `None` before the first point or after the end.
    pub fn at(&self, t: Timestamp) -> Option<f64> {
        let i = self.points.partition_point(|p| p.0 <= t);
        let i = i.checked_sub(1)?;
        if i + 1 == self.points.len() && t >= self.points[i].0 + self.last_step_s {
            return None;
        }
        Some(self.points[i].1)
    }

    /// The steps overlapping `[from, to)`, each as `(start, end, value)`, clipped to the
    /// window.
    pub fn steps(&self, from: Timestamp, to: Timestamp) -> Vec<(Timestamp, Timestamp, f64)> {
        self.steps_iter(from, to).collect()
    }

    /// [`StepSeries::steps`], without collecting them.
    fn steps_iter(
        &self,
        from: Timestamp,
        to: Timestamp,
    ) -> impl Iterator<Item = (Timestamp, Timestamp, f64)> + '_ {
        let first = if to <= from {
            self.points.len()
        } else {
            self.points
                .partition_point(|p| p.0 <= from)
                .saturating_sub(1)
        };
        (first..self.points.len())
            .map(move |i| {
                let (start, v) = self.points[i];
                let end = match self.points.get(i + 1) {
                    Some(n) => n.0,
                    None => start + self.last_step_s,
                };
                (start, end, v)
            })
            .take_while(move |(start, _, _)| *start < to)
            .filter(move |(_, end, _)| *end > from)
            .map(move |(start, end, v)| (start.max(from), end.min(to), v))
    }

    /// The time-weighted mean of `[from, to)`: [`StepSeries::window`]'s `mean`, the
    /// same figure, without the window's sorted copy (the planner takes one per slot
    /// every tick).
    pub fn mean(&self, from: Timestamp, to: Timestamp) -> Option<f64> {
        self.steps_iter(from, to).next()?;
        let total: f64 = self
            .steps_iter(from, to)
            .map(|(s, e, _)| e.secs_since(s))
            .sum();
        let weighted: f64 = self
            .steps_iter(from, to)
            .map(|(s, e, v)| v * e.secs_since(s))
            .sum();
        Some(weighted / total.max(1e-9))
    }

    /// Time-weighted statistics of the values in `[from, to)`; `None` when the series
    /// does not cover any of it.
    pub fn window(&self, from: Timestamp, to: Timestamp) -> Option<WindowStats> {
        let steps = self.steps(from, to);
        if steps.is_empty() {
            return None;
        }
        let mut weighted: Vec<(f64, f64)> = steps
            .iter()
            .map(|(s, e, v)| (*v, e.secs_since(*s)))
            .collect();
        let total: f64 = weighted.iter().map(|w| w.1).sum();
        let covered_to = steps.last().map(|s| s.1).unwrap_or(from);
        let mean = weighted.iter().map(|(v, w)| v * w).sum::<f64>() / total.max(1e-9);
        weighted.sort_by(|a, b| a.0.total_cmp(&b.0));
        Some(WindowStats {
            min: weighted.first().map(|w| w.0).unwrap_or(f64::NAN),
            max: weighted.last().map(|w| w.0).unwrap_or(f64::NAN),
            mean,
            sorted: weighted,
            covered_s: total,
            complete: covered_to >= to && steps[0].0 <= from,
        })
    }

    /// The highest price among the cheapest `hours` of `[from, to)`: a job that needs
    /// `hours` of running before `to` pays no more than this if it runs only at or
    /// below it. `None` when the series does not cover the window.
    pub fn cheapest_threshold(&self, hours: f64, from: Timestamp, to: Timestamp) -> Option<f64> {
        let w = self.window(from, to)?;
        Some(w.percentile_by_time(hours * 3600.0))
    }
}

/// Time-weighted statistics of a window of a step series.
#[derive(Debug, Clone, PartialEq)]
pub struct WindowStats {
    pub min: f64,
    pub max: f64,
    pub mean: f64,
    /// `(value, seconds)` sorted by value.
    sorted: Vec<(f64, f64)>,
    /// Seconds of the window the series covers.
    pub covered_s: f64,
    /// Whether the series covers the whole window.
    pub complete: bool,
}

impl WindowStats {
    /// The value below which `p` percent of the covered time lies (0..=100).
    pub fn percentile(&self, p: f64) -> f64 {
        self.percentile_by_time(self.covered_s * (p / 100.0).clamp(0.0, 1.0))
    }

    /// The smallest value v such that the time at or below v is at least `secs`
    /// (the whole window's maximum when `secs` exceeds the covered time).
    fn percentile_by_time(&self, secs: f64) -> f64 {
        let mut acc = 0.0;
        for (v, w) in &self.sorted {
            acc += w;
            if acc + 1e-6 >= secs {
                return *v;
            }
        }
        self.max
    }
}

/// What the engine knows of the future: price and carbon series, and whether the feed
/// behind them is stale.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Forecast {
    /// Price per kWh, in the site's currency.
    #[serde(default)]
    pub price: StepSeries,
    /// Carbon intensity, g CO₂e per kWh.
    #[serde(default)]
    pub carbon: StepSeries,
    /// The feed failed to refresh in time: rules treat forecast signals as stale.
    #[serde(default)]
    pub stale: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(h: f64) -> Timestamp {
        Timestamp::from_secs(1_700_000_000) + h * 3600.0
    }

    fn series() -> StepSeries {
        StepSeries::new(
            vec![
                (t(0.0), 0.30),
                (t(1.0), 0.10),
                (t(2.0), 0.20),
                (t(3.0), 0.05),
            ],
            3600.0,
        )
    }

    #[test]
    fn at_follows_steps_and_ends() {
        let s = series();
        assert_eq!(s.at(t(-0.5)), None);
        assert_eq!(s.at(t(0.5)), Some(0.30));
        assert_eq!(s.at(t(1.0)), Some(0.10));
        assert_eq!(s.at(t(3.9)), Some(0.05));
        assert_eq!(s.at(t(4.0)), None);
    }

    #[test]
    fn window_statistics_are_time_weighted() {
        let s = series();
        let w = s.window(t(0.5), t(2.5)).expect("covered");
        assert_eq!((w.min, w.max), (0.10, 0.30));
        // 0.5 h at 0.30, 1 h at 0.10, 0.5 h at 0.20
        assert!((w.mean - (0.15 + 0.10 + 0.10) / 2.0).abs() < 1e-9);
        assert!(w.complete);
        assert_eq!(w.percentile(50.0), 0.10);
        assert_eq!(w.percentile(100.0), 0.30);
        let open = s.window(t(3.0), t(6.0)).expect("partly covered");
        assert!(!open.complete);
        assert_eq!(s.window(t(5.0), t(6.0)), None);
    }

    #[test]
    fn mean_is_the_windows_mean() {
        let s = series();
        for (a, b) in [
            (0.5, 2.5),
            (-1.0, 0.5),
            (3.0, 6.0),
            (5.0, 6.0),
            (1.0, 1.0),
            (0.25, 3.75),
        ] {
            assert_eq!(
                s.mean(t(a), t(b)),
                s.window(t(a), t(b)).map(|w| w.mean),
                "[{a}, {b}) h"
            );
        }
        assert_eq!(s.mean(t(5.0), t(6.0)), None);
    }

    #[test]
    fn cheapest_threshold_picks_the_nth_cheapest_hour() {
        let s = series();
        assert_eq!(s.cheapest_threshold(1.0, t(0.0), t(4.0)), Some(0.05));
        assert_eq!(s.cheapest_threshold(2.0, t(0.0), t(4.0)), Some(0.10));
        assert_eq!(s.cheapest_threshold(3.0, t(0.0), t(4.0)), Some(0.20));
        // more hours than the window holds: every hour is needed
        assert_eq!(s.cheapest_threshold(9.0, t(0.0), t(4.0)), Some(0.30));
    }
}
