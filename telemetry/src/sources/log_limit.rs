//! Rate-limited logging: a source that receives garbage at line rate must not flood
//! the log. One line per key per interval, with how many were left out since.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

#[derive(Debug, Clone)]
pub struct LogLimiter {
    every: Duration,
    last: BTreeMap<String, (Instant, u64)>,
}

impl LogLimiter {
    pub fn new(every: Duration) -> Self {
        LogLimiter {
            every,
            last: BTreeMap::new(),
        }
    }

    /// `Some(left_out)` when a line for `key` may be logged now, `None` to stay quiet.
    pub fn allow(&mut self, key: &str, now: Instant) -> Option<u64> {
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
    }
}
