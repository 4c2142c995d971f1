//! The control loop's cadence, as `/metrics` shows it: how late each tick started
//! past its due time (the last, and the largest since start) and how long the last
//! tick took. A tick that waits on an edge shows here first.

use std::time::Instant;

/// The loop's timing, copied to the board each tick.
#[derive(Debug, Clone, Default)]
pub struct Cadence {
    /// The last tick's delay past its due time.
    pub delay_s: f64,
    /// The largest delay since start.
    pub delay_max_s: f64,
    /// How long the last complete tick took.
    pub duration_s: f64,
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

    /// The tick is done.
    pub fn end(&mut self) {
        if let Some(t) = self.started.take() {
            self.duration_s = t.elapsed().as_secs_f64();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

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
