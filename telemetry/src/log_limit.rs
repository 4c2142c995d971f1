//! Rate-limited logging: a source that receives garbage at line rate must not flood
//! the log. One line per key per interval, with how many were left out since.
//!
//! Used by every per-message warning on the edges (MQTT decoding, agent reports and
//! acks, Redfish extraction, inbound webhook events, the agent's command check). Keys
//! should be static reasons; a key taken from a message (a node name, a topic) is
//! still safe: at most [`MAX_KEYS`] keys are tracked, and beyond that every new key
//! shares one slot ([`OVERFLOW_KEY`]), so a publisher of made-up names cannot grow it.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// Keys tracked at most; new keys beyond it share [`OVERFLOW_KEY`].
pub const MAX_KEYS: usize = 256;
/// The slot every key beyond [`MAX_KEYS`] shares.
pub const OVERFLOW_KEY: &str = "(other keys)";

#[derive(Debug, Clone)]
pub struct LogLimiter {
    every: Duration,
    max_keys: usize,
    last: BTreeMap<String, (Instant, u64)>,
}

impl LogLimiter {
    pub fn new(every: Duration) -> Self {
        LogLimiter {
            every,
            max_keys: MAX_KEYS,
            last: BTreeMap::new(),
        }
    }

    /// The same limiter, tracking at most `max_keys` keys (at least 1).
    pub fn with_max_keys(mut self, max_keys: usize) -> Self {
        self.max_keys = max_keys.max(1);
        self
    }

    /// `Some(left_out)` when a line for `key` may be logged now (`left_out`: the lines
    /// suppressed since the last one for this key), `None` to stay quiet.
    pub fn allow(&mut self, key: &str, now: Instant) -> Option<u64> {
        let key = if self.last.contains_key(key) || self.last.len() < self.max_keys {
            key
        } else {
            self.forget_quiet(now);
            if self.last.len() < self.max_keys {
                key
            } else {
                OVERFLOW_KEY
            }
        };
        match self.last.get_mut(key) {
            Some((at, skipped)) if now.duration_since(*at) < self.every => {
                *skipped += 1;
                None
            }
            Some((at, skipped)) => {
                let n = *skipped;
                *at = now;
                *skipped = 0;
                Some(n)
            }
            None => {
                self.last.insert(key.to_string(), (now, 0));
                Some(0)
            }
        }
    }

    /// The keys whose interval has passed with lines suppressed, and how many; each
    /// such key starts a new interval now. Call it now and then (every tick), so that
    /// what was left out is said even when no further line comes.
    pub fn flush(&mut self, now: Instant) -> Vec<(String, u64)> {
        let every = self.every;
        let mut out = Vec::new();
        for (k, (at, skipped)) in self.last.iter_mut() {
            if *skipped > 0 && now.duration_since(*at) >= every {
                out.push((k.clone(), *skipped));
                *at = now;
                *skipped = 0;
            }
        }
        out
    }

    /// [`LogLimiter::flush`], with one warning per key: `what` names the call site.
    pub fn warn_suppressed(&mut self, what: &'static str, now: Instant) {
        for (key, suppressed) in self.flush(now) {
            tracing::warn!(what, key = %key, suppressed, "repeated warnings suppressed");
        }
    }

    /// Keys tracked now (never more than the maximum, plus the overflow slot).
    pub fn keys(&self) -> usize {
        self.last.len()
    }

    /// Drops keys whose interval has passed with nothing suppressed: a new line for
    /// them would be allowed anyway, and nothing is lost.
    fn forget_quiet(&mut self, now: Instant) {
        let every = self.every;
        self.last.retain(|k, (at, skipped)| {
            k == OVERFLOW_KEY || *skipped > 0 || now.duration_since(*at) < every
        });
    }
}

impl Default for LogLimiter {
    fn default() -> Self {
        LogLimiter::new(Duration::from_secs(10))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_key_per_interval_with_the_count_left_out() {
        let mut l = LogLimiter::new(Duration::from_secs(10));
        let t0 = Instant::now();
        assert_eq!(l.allow("bad_json", t0), Some(0));
        assert_eq!(l.allow("bad_json", t0 + Duration::from_secs(1)), None);
        assert_eq!(l.allow("bad_json", t0 + Duration::from_secs(2)), None);
        assert_eq!(
            l.allow("oversize", t0 + Duration::from_secs(2)),
            Some(0),
            "keys are independent"
        );
        assert_eq!(l.allow("bad_json", t0 + Duration::from_secs(11)), Some(2));
        assert_eq!(
            l.allow("bad_json", t0 + Duration::from_secs(22)),
            Some(0),
            "the count starts again after each line"
        );
    }

    #[test]
    fn what_was_left_out_is_said_once_the_interval_passes() {
        let mut l = LogLimiter::new(Duration::from_secs(10));
        let t0 = Instant::now();
        assert_eq!(l.allow("bad_json", t0), Some(0));
        for i in 1..=5 {
            assert_eq!(l.allow("bad_json", t0 + Duration::from_millis(i)), None);
        }
        assert!(l.flush(t0 + Duration::from_secs(5)).is_empty(), "not yet");
        assert_eq!(
            l.flush(t0 + Duration::from_secs(10)),
            vec![("bad_json".to_string(), 5)]
        );
        assert!(
            l.flush(t0 + Duration::from_secs(30)).is_empty(),
            "said once"
        );
        assert_eq!(
            l.allow("bad_json", t0 + Duration::from_secs(15)),
            None,
            "the summary started a new interval"
        );
    }

    #[test]
    fn made_up_keys_share_one_slot_beyond_the_maximum() {
        let mut l = LogLimiter::new(Duration::from_secs(60)).with_max_keys(4);
        let t0 = Instant::now();
        let mut lines = 0;
        for i in 0..10_000 {
            if l.allow(&format!("node-{i}"), t0 + Duration::from_millis(i))
                .is_some()
            {
                lines += 1;
            }
        }
        assert!(l.keys() <= 5, "{} keys tracked", l.keys());
        // four keys of their own, then one line for all the others
        assert_eq!(lines, 5);
        // once the interval has passed, quiet keys are forgotten: a new one gets a line
        assert_eq!(l.allow("node-new", t0 + Duration::from_secs(120)), Some(0));
        assert_eq!(
            l.keys(),
            2,
            "the new key and the shared slot, which still counts"
        );
    }
}
