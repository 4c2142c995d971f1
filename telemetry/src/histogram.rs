//! Latency histograms for `/metrics`: fixed buckets (seconds), lock-free to observe.
//! The loop keeps its own ([`Histogram::new`]); the edges (scheduler calls, Redfish
//! GETs, store commits) take theirs from the process's [`registry`] by family and
//! labels, so that `/metrics` renders every registered family without knowing the
//! edges. Label values must be bounded (a scheduler's id, a call's kind), never taken
//! from what a peer sends. The exposition (`_bucket{le}`, `_sum`, `_count`) is the API
//! crate's.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The upper bounds of the buckets, s: half a millisecond to half a minute, which
/// covers an HTTP request, a store commit, a Redfish GET and a control tick alike.
pub const BOUNDS: [f64; 15] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// Counts of observations by bucket (not cumulative; the last one is `+Inf`), their
/// sum in nanoseconds, and their number.
#[derive(Debug)]
pub struct Histogram {
    buckets: [AtomicU64; BOUNDS.len() + 1],
    sum_ns: AtomicU64,
    count: AtomicU64,
}

/// What a histogram holds at one moment.
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    /// `(upper bound, observations at or below it)`, cumulative, in order, ending
    /// with `+Inf` (which equals `count`).
    pub cumulative: Vec<(f64, u64)>,
    /// Sum of the observations, s.
    pub sum_s: f64,
    pub count: u64,
}

impl Histogram {
    pub const fn new() -> Histogram {
        Histogram {
            buckets: [const { AtomicU64::new(0) }; BOUNDS.len() + 1],
            sum_ns: AtomicU64::new(0),
            count: AtomicU64::new(0),
        }
    }

    pub fn observe(&self, d: Duration) {
        let s = d.as_secs_f64();
        let i = BOUNDS.iter().position(|b| s <= *b).unwrap_or(BOUNDS.len());
        self.buckets[i].fetch_add(1, Relaxed);
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.sum_ns.fetch_add(ns, Relaxed);
        self.count.fetch_add(1, Relaxed);
    }

    /// [`Histogram::observe`] of a duration in seconds (a negative or not finite one
    /// counts as 0).
    pub fn observe_secs(&self, s: f64) {
        let s = if s.is_finite() && s > 0.0 { s } else { 0.0 };
        self.observe(Duration::from_secs_f64(s.min(1e9)));
    }

    /// The buckets made cumulative. Taken bucket by bucket while others observe, so a
    /// snapshot may lag an observation by one in `sum` or `count`; `+Inf` is the
    /// buckets' own total, so the buckets never exceed it.
    pub fn snapshot(&self) -> Snapshot {
        let mut total = 0;
        let mut cumulative = Vec::with_capacity(BOUNDS.len() + 1);
        for (i, b) in self.buckets.iter().enumerate() {
            total += b.load(Relaxed);
            cumulative.push((BOUNDS.get(i).copied().unwrap_or(f64::INFINITY), total));
        }
        Snapshot {
            cumulative,
            sum_s: self.sum_ns.load(Relaxed) as f64 / 1e9,
            count: total,
        }
    }
}

/// A family of histograms that differ by their labels.
struct Family {
    help: &'static str,
    members: BTreeMap<Vec<(&'static str, String)>, Arc<Histogram>>,
}

/// The process's histograms by family name.
static REGISTRY: Mutex<BTreeMap<&'static str, Family>> = Mutex::new(BTreeMap::new());

/// A registered family as `/metrics` renders it.
#[derive(Debug, Clone)]
pub struct Registered {
    pub name: &'static str,
    pub help: &'static str,
    /// Each label set and what its histogram holds now.
    pub members: Vec<(Vec<(&'static str, String)>, Snapshot)>,
}

/// The histogram of family `name` with `labels`, registered on first use (the help
/// of the first registration stays).
pub fn registry(
    name: &'static str,
    help: &'static str,
    labels: &[(&'static str, &str)],
) -> Arc<Histogram> {
    let key: Vec<(&'static str, String)> =
        labels.iter().map(|(k, v)| (*k, v.to_string())).collect();
    let mut r = REGISTRY.lock().unwrap_or_else(|p| p.into_inner());
    r.entry(name)
        .or_insert_with(|| Family {
            help,
            members: BTreeMap::new(),
        })
        .members
        .entry(key)
        .or_default()
        .clone()
}

/// Every registered family, by name, each member by its labels.
pub fn registered() -> Vec<Registered> {
    let r = REGISTRY.lock().unwrap_or_else(|p| p.into_inner());
    r.iter()
        .map(|(name, f)| Registered {
            name,
            help: f.help,
            members: f
                .members
                .iter()
                .map(|(k, h)| (k.clone(), h.snapshot()))
                .collect(),
        })
        .collect()
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_registry_gives_one_histogram_per_family_and_labels() {
        let a = registry("test_calls_seconds", "calls", &[("call", "poll")]);
        let b = registry("test_calls_seconds", "other help", &[("call", "poll")]);
        let c = registry("test_calls_seconds", "calls", &[("call", "apply")]);
        a.observe(Duration::from_millis(3));
        b.observe(Duration::from_millis(3));
        c.observe(Duration::from_millis(3));
        let f = registered()
            .into_iter()
            .find(|f| f.name == "test_calls_seconds")
            .expect("registered");
        assert_eq!(f.help, "calls");
        let counts: Vec<(String, u64)> = f
            .members
            .iter()
            .map(|(l, s)| (l[0].1.clone(), s.count))
            .collect();
        assert_eq!(counts, vec![("apply".into(), 1), ("poll".into(), 2)]);
    }

    #[test]
    fn observations_fall_in_their_buckets_cumulatively() {
        let h = Histogram::new();
        for ms in [0, 1, 3, 40, 40, 700, 60_000] {
            h.observe(Duration::from_millis(ms));
        }
        h.observe_secs(f64::NAN);
        let s = h.snapshot();
        assert_eq!(s.count, 8);
        let at = |le: f64| {
            s.cumulative
                .iter()
                .find(|(b, _)| *b == le)
                .map(|(_, n)| *n)
                .expect("bound")
        };
        // 0 ms and NaN (as 0) at or below 0.5 ms; 1 ms on its bound
        assert_eq!(at(0.0005), 2);
        assert_eq!(at(0.001), 3);
        assert_eq!(at(0.005), 4);
        assert_eq!(at(0.05), 6);
        assert_eq!(at(1.0), 7);
        assert_eq!(at(30.0), 7);
        assert_eq!(s.cumulative.last(), Some(&(f64::INFINITY, 8)));
        assert!((s.sum_s - 60.784).abs() < 1e-9, "{}", s.sum_s);
        assert!(s.cumulative.windows(2).all(|w| w[0].1 <= w[1].1));
    }
}
