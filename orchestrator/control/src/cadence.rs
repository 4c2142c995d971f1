//! The control loop's cadence, as `/metrics` shows it: how late each tick started
//! past its due time (the last, and the largest since start) and how long the last
//! tick took. A tick that waits on an edge shows here first.
//!
//! Besides the tick, [`Events`] decides when a sample that crossed one of the policy's
//! thresholds (see [`policies::triggers`]) is evaluated: `debounce` after the first
//! crossing (so that a burst of readings is one evaluation), and never more often than
//! `max_per_s`. It runs on any clock ([`Moment`]): `serve`'s `Instant`, and the
//! simulated time (`Timestamp`) of the replays (`demo`, `backtest`; see
//! `powerplane-sim`'s `events`), so a replay debounces and rate-limits as `serve` does.

use std::sync::Arc;
use std::time::{Duration, Instant};

use telemetry::histogram::Histogram;

/// The loop's latency histograms (`/metrics`), shared by every copy of its [`Cadence`].
#[derive(Debug, Default)]
pub struct LoopHistograms {
    /// Each complete tick's duration.
    pub tick: Histogram,
    /// Each evaluation made for a crossing, from start to end (the store's commit
    /// included).
    pub event_evaluation: Histogram,
    /// Each crossing evaluated: from the crossing seen to its commands handed to the
    /// agents' link.
    pub event_to_command: Histogram,
}

/// `[controller] event_debounce_ms` when not set (the replays use it too).
pub const DEFAULT_EVENT_DEBOUNCE_MS: f64 = 20.0;
/// `[controller] event_max_per_s` when not set (the replays use it too).
pub const DEFAULT_EVENT_MAX_PER_S: f64 = 4.0;

/// A point in time that [`Events`] can schedule on.
pub trait Moment: Copy + Ord {
    fn after(self, d: Duration) -> Self;
}

impl Moment for Instant {
    fn after(self, d: Duration) -> Self {
        self + d
    }
}

impl Moment for telemetry::Timestamp {
    fn after(self, d: Duration) -> Self {
        telemetry::Timestamp(self.0 + d.as_millis() as i64)
    }
}

/// The loop's timing, copied to the board each tick.
#[derive(Debug, Clone, Default)]
pub struct Cadence {
    /// The last tick's delay past its due time.
    pub delay_s: f64,
    /// The largest delay since start.
    pub delay_max_s: f64,
    /// How long the last complete tick took.
    pub duration_s: f64,
    /// [`Events`]' counters, copied for `/metrics`.
    pub event_crossings: u64,
    pub event_evaluations: u64,
    /// The last evaluation made for a crossing: from the first crossing the loop saw
    /// to its commands handed to the agents' link, and how long the whole evaluation
    /// took (with the store's commit, after the commands); the largest latency since
    /// start.
    pub event_latency_s: f64,
    pub event_latency_max_s: f64,
    pub event_duration_s: f64,
    /// Every tick's and every evaluation's timing, not only the last.
    pub histograms: Arc<LoopHistograms>,
    started: Option<Instant>,
}

impl Cadence {
    /// A tick due at `due` starts now.
    pub fn start(&mut self, due: Instant) {
        let now = Instant::now();
        self.delay_s = now.saturating_duration_since(due).as_secs_f64();
        self.delay_max_s = self.delay_max_s.max(self.delay_s);
        self.started = Some(now);
    }

    /// An evaluation for a crossing seen at `crossed` began at `began`, handed its
    /// desired state to the actuators at `actuated`, and is done.
    pub fn event_done(
        &mut self,
        crossed: Option<Instant>,
        actuated: Option<Instant>,
        began: Instant,
    ) {
        let now = Instant::now();
        let took = now.saturating_duration_since(began);
        self.event_duration_s = took.as_secs_f64();
        self.histograms.event_evaluation.observe(took);
        if let Some(c) = crossed {
            let at = actuated.unwrap_or(now);
            let latency = at.saturating_duration_since(c);
            self.histograms.event_to_command.observe(latency);
            self.event_latency_s = latency.as_secs_f64();
            self.event_latency_max_s = self.event_latency_max_s.max(self.event_latency_s);
        }
    }

    /// The tick is done.
    pub fn end(&mut self) {
        if let Some(t) = self.started.take() {
            let took = t.elapsed();
            self.histograms.tick.observe(took);
            self.duration_s = took.as_secs_f64();
        }
    }
}

/// When the next event-driven evaluation is due.
#[derive(Debug, Clone)]
pub struct Events<T: Moment = Instant> {
    debounce: Duration,
    /// Least time between two event-driven evaluations (`None`: events off).
    min_gap: Option<Duration>,
    /// The first crossing not yet evaluated.
    armed: Option<T>,
    last: Option<T>,
    /// Evaluations made for events since start.
    pub evaluations: u64,
    /// Crossings seen since start (several may share one evaluation).
    pub crossings: u64,
}

impl<T: Moment> Events<T> {
    /// `max_per_s` 0 turns events off.
    pub fn new(debounce_ms: f64, max_per_s: f64) -> Self {
        Events {
            debounce: Duration::from_secs_f64(debounce_ms.max(0.0) / 1000.0),
            min_gap: (max_per_s > 0.0).then(|| Duration::from_secs_f64(1.0 / max_per_s)),
            armed: None,
            last: None,
            evaluations: 0,
            crossings: 0,
        }
    }

    pub fn enabled(&self) -> bool {
        self.min_gap.is_some()
    }

    /// A sample crossed a threshold at `at`.
    pub fn crossed(&mut self, at: T) {
        if self.enabled() {
            self.crossings += 1;
            self.armed.get_or_insert(at);
        }
    }

    /// The first crossing not yet evaluated.
    pub fn armed(&self) -> Option<T> {
        self.armed
    }

    /// When the evaluation of what crossed is due, if anything did.
    pub fn due(&self) -> Option<T> {
        let armed = self.armed?.after(self.debounce);
        Some(match (self.last, self.min_gap) {
            (Some(last), Some(gap)) => armed.max(last.after(gap)),
            _ => armed,
        })
    }

    /// An evaluation for events ran at `at`.
    pub fn evaluated(&mut self, at: T) {
        self.armed = None;
        self.last = Some(at);
        self.evaluations += 1;
    }

    /// A tick ran: it evaluated whatever had crossed.
    pub fn ticked(&mut self) {
        self.armed = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_crossing_is_evaluated_after_the_debounce_and_at_a_bounded_rate() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut e = Events::new(20.0, 4.0);
        assert_eq!(e.due(), None);
        e.crossed(t0);
        e.crossed(t0 + ms(5));
        assert_eq!(
            e.due(),
            Some(t0 + ms(20)),
            "the first crossing starts the debounce"
        );
        e.evaluated(t0 + ms(20));
        assert_eq!(e.due(), None);
        // the next one waits for the rate limit (4 per second: 250 ms apart)
        e.crossed(t0 + ms(30));
        assert_eq!(e.due(), Some(t0 + ms(270)));
        e.ticked();
        assert_eq!(e.due(), None, "a tick evaluates what crossed");
        assert_eq!((e.crossings, e.evaluations), (3, 1));
        let mut off = Events::new(20.0, 0.0);
        off.crossed(t0);
        assert_eq!(off.due(), None);
    }

    #[test]
    fn a_late_tick_raises_the_delay_and_the_maximum_stays() {
        let mut c = Cadence::default();
        c.start(Instant::now() - Duration::from_millis(300));
        c.end();
        assert!(c.delay_s >= 0.3 && c.delay_max_s >= 0.3, "{c:?}");
        c.start(Instant::now() + Duration::from_secs(1));
        assert_eq!(c.delay_s, 0.0, "an early start is no delay");
        assert!(c.delay_max_s >= 0.3);
        c.end();
        assert!(c.duration_s < 0.3, "{c:?}");
    }
}
