//! Event-driven evaluation in the replays (`demo`, `backtest`), on simulated time.
//!
//! `serve` evaluates on its tick and, between ticks, when a sample crosses one of the
//! policy's thresholds ([`policies::triggers`]), after the same debounce and at the
//! same bounded rate ([`control::cadence::Events`]). A replay does the same: with
//! `sample_s` set, the simulated facility is read every `sample_s` simulated seconds
//! between ticks (on a grid of `sample_s` from the epoch), each reading is checked for
//! crossings against the snapshot the last evaluation saw, and a crossing schedules an
//! evaluation `debounce` later (no sooner than `1 / max_per_s` after the last one). The
//! readings wait for the next evaluation, as `serve`'s buffer holds them. Without
//! `sample_s` the facility is read at the ticks only, and nothing can cross between
//! them: the replay is the tick-only one it always was.
//!
//! Everything runs on the simulated clock, so the same facility, policy and seed give
//! the same evaluations at the same times, run after run.

use std::time::Duration;

use policies::triggers::Thresholds;
use policies::Policy;
use telemetry::{Sample, Site, Snapshot, Timestamp};

use control::cadence::Events;

/// What the replay does next, before its next tick.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// Step the facility to this time and read it ([`ReplayEvents::sampled`]).
    Sample(Timestamp),
    /// Step the facility to this time and evaluate what is pending
    /// ([`ReplayEvents::take`], then [`ReplayEvents::evaluated`]).
    Evaluate(Timestamp),
    /// Nothing before the tick: step to it and tick.
    Tick,
}

/// The replay's event trigger: readings between ticks, crossings, and when to evaluate.
#[derive(Debug, Clone)]
pub struct ReplayEvents {
    events: Events<Timestamp>,
    thresholds: Thresholds,
    sample_ms: Option<i64>,
    pending: Vec<Sample>,
}

impl ReplayEvents {
    /// `sample_s`: how often the facility is read between ticks (`None`: at ticks
    /// only); `debounce_ms` and `max_per_s` as `[controller]` `event_debounce_ms` and
    /// `event_max_per_s` (0: ticks only).
    pub fn new(
        policy: &Policy,
        site: &Site,
        sample_s: Option<f64>,
        debounce_ms: f64,
        max_per_s: f64,
    ) -> Self {
        ReplayEvents {
            events: Events::new(debounce_ms, max_per_s),
            thresholds: Thresholds::new(policy, site),
            sample_ms: sample_s
                .filter(|s| s.is_finite() && *s > 0.0)
                .map(|s| ((s * 1000.0).round() as i64).max(1)),
            pending: Vec::new(),
        }
    }

    /// The next stop after `now`, before the tick at `tick_at`. A reading due at the
    /// same time as an evaluation comes first (it arrived before the evaluation began).
    pub fn next(&self, now: Timestamp, tick_at: Timestamp) -> Stop {
        let sample = self
            .sample_ms
            .map(|ms| Timestamp((now.0.div_euclid(ms) + 1) * ms))
            .filter(|t| *t < tick_at);
        let due = self
            .events
            .due()
            .map(|d| d.max(now))
            .filter(|d| *d < tick_at);
        match (sample, due) {
            (Some(s), Some(d)) if s <= d => Stop::Sample(s),
            (_, Some(d)) => Stop::Evaluate(d),
            (Some(s), None) => Stop::Sample(s),
            (None, None) => Stop::Tick,
        }
    }

    /// The facility read at `at`: a crossing against `seen` (the snapshot of the last
    /// evaluation) arms an evaluation; the samples wait for it.
    pub fn sampled(&mut self, seen: &Snapshot, samples: Vec<Sample>, at: Timestamp) {
        if self.events.enabled() && self.thresholds.any_crossed(seen, &samples) {
            self.events.crossed(at);
        }
        self.pending.extend(samples);
    }

    /// The samples read since the last evaluation, then `more`.
    pub fn take(&mut self, more: Vec<Sample>) -> Vec<Sample> {
        // without readings between ticks, a tick's poll as it is (no copy of its
        // thousands of samples)
        if self.pending.is_empty() {
            return more;
        }
        let mut all = std::mem::take(&mut self.pending);
        all.extend(more);
        all
    }

    /// An event-driven evaluation ran at `at`.
    pub fn evaluated(&mut self, at: Timestamp) {
        self.events.evaluated(at);
    }

    /// A tick ran: it evaluated whatever had crossed.
    pub fn ticked(&mut self) {
        self.events.ticked();
    }

    /// Event-driven evaluations so far.
    pub fn evaluations(&self) -> u64 {
        self.events.evaluations
    }

    /// Crossings seen so far.
    pub fn crossings(&self) -> u64 {
        self.events.crossings
    }
}

/// Seconds from `a` to `b` on the simulated clock.
pub fn dt_s(a: Timestamp, b: Timestamp) -> f64 {
    Duration::from_millis((b.0 - a.0).max(0) as u64).as_secs_f64()
}

#[cfg(test)]
mod tests {
    use super::*;
    use telemetry::metric::names::INLET_TEMP_C;
    use telemetry::EntityId;

    fn site() -> Site {
        Site::parse(
            "site.toml",
            "version = 1\n[site]\nname = \"h\"\n[[feeds]]\nid = \"u\"\nrating_kw = 100\n[[pdus]]\nid = \"p1\"\nfeed = \"u\"\nrating_kw = 20\n[[cooling]]\nid = \"c1\"\ncapacity_kw = 50\nracks = [\"a01\"]\n[[rooms]]\nid = \"hall\"\n[[rows]]\nid = \"row-a\"\nroom = \"hall\"\n[[racks]]\nid = \"a01\"\nrow = \"row-a\"\npdus = [\"p1\"]\ninlet_limit_c = 32\nnodes = 1\ngpus_per_node = 4\ngpu_model = \"A40\"\n",
        )
        .expect("site")
    }

    fn inlet(c: f64, at: Timestamp) -> Sample {
        Sample::new(EntityId::rack("a01"), INLET_TEMP_C, c, at, "sim")
    }

    #[test]
    fn a_crossing_between_ticks_is_evaluated_after_the_debounce_on_simulated_time() {
        let policy = Policy::parse("policy.toml", "version = 1\n").expect("policy");
        let mut ev = ReplayEvents::new(&policy, &site(), Some(1.0), 20.0, 4.0);
        let t0 = Timestamp::from_secs(1_000);
        let tick = t0 + 15.0;
        let seen = Snapshot::new();
        assert_eq!(ev.next(t0, tick), Stop::Sample(t0 + 1.0));
        ev.sampled(&seen, vec![inlet(25.0, t0 + 1.0)], t0 + 1.0);
        assert_eq!(
            ev.next(t0 + 1.0, tick),
            Stop::Sample(t0 + 2.0),
            "no crossing"
        );
        ev.sampled(&seen, vec![inlet(36.0, t0 + 2.0)], t0 + 2.0);
        let at = t0 + 2.02;
        assert_eq!(ev.next(t0 + 2.0, tick), Stop::Evaluate(at));
        assert_eq!(ev.take(Vec::new()).len(), 2, "both readings wait for it");
        ev.evaluated(at);
        // the next crossing waits for the rate limit: 250 ms after the last
        ev.sampled(&seen, vec![inlet(36.5, at)], at);
        assert_eq!(ev.next(at, tick), Stop::Evaluate(t0 + 2.27));
        ev.ticked();
        assert_eq!(
            ev.next(t0 + 14.0, tick),
            Stop::Tick,
            "the tick is no sample"
        );
        assert_eq!((ev.crossings(), ev.evaluations()), (2, 1));
        let off = ReplayEvents::new(&policy, &site(), None, 20.0, 4.0);
        assert_eq!(off.next(t0, tick), Stop::Tick);
    }
}
