//! What the Redfish poller counts per endpoint, read by `serve` into `/metrics`
//! (`powerplane_redfish_*`). Labels are the endpoint names of the config (bounded),
//! never anything a BMC sends.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

/// The live counters of one endpoint, shared by its walks and the exporter.
#[derive(Debug, Default)]
pub(super) struct Counters {
    requests: AtomicU64,
    failures: Mutex<BTreeMap<&'static str, u64>>,
    overruns: AtomicU64,
    skipped: AtomicU64,
    not_understood: AtomicU64,
    /// The site's bindings of this endpoint that its last discovery could not fill.
    bindings_unfilled: AtomicU64,
    /// The last finished poll's duration, in microseconds (`u64::MAX`: none yet).
    last_poll_us: AtomicU64,
    backing_off: AtomicBool,
}

impl Counters {
    pub(super) fn new() -> Self {
        Counters {
            last_poll_us: AtomicU64::new(u64::MAX),
            ..Counters::default()
        }
    }

    pub(super) fn request(&self) {
        self.requests.fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn failure(&self, reason: &'static str) {
        *self
            .failures
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(reason)
            .or_default() += 1;
    }

    pub(super) fn overrun(&self) {
        self.overruns.fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn skipped(&self) {
        self.skipped.fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn not_understood(&self, n: usize) {
        let n = u64::try_from(n).unwrap_or(u64::MAX);
        self.not_understood.fetch_add(n, Ordering::Relaxed);
    }

    pub(super) fn bindings_unfilled(&self, n: usize) {
        let n = u64::try_from(n).unwrap_or(u64::MAX);
        self.bindings_unfilled.store(n, Ordering::Relaxed);
    }

    pub(super) fn polled(&self, took: Duration) {
        let us = u64::try_from(took.as_micros()).unwrap_or(u64::MAX - 1);
        self.last_poll_us.store(us, Ordering::Relaxed);
    }

    pub(super) fn backing_off(&self, yes: bool) {
        self.backing_off.store(yes, Ordering::Relaxed);
    }

    pub(super) fn snapshot(&self, endpoint: &str) -> EndpointStats {
        let us = self.last_poll_us.load(Ordering::Relaxed);
        EndpointStats {
            endpoint: endpoint.to_string(),
            requests: self.requests.load(Ordering::Relaxed),
            failures: self
                .failures
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
            overruns: self.overruns.load(Ordering::Relaxed),
            skipped: self.skipped.load(Ordering::Relaxed),
            not_understood: self.not_understood.load(Ordering::Relaxed),
            bindings_unfilled: self.bindings_unfilled.load(Ordering::Relaxed),
            last_poll_s: (us != u64::MAX).then(|| us as f64 / 1e6),
            backing_off: self.backing_off.load(Ordering::Relaxed),
        }
    }
}

/// One endpoint's counters at one moment.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct EndpointStats {
    /// The endpoint's name in the config.
    pub endpoint: String,
    /// GETs (and session logins) sent.
    pub requests: u64,
    /// Failed requests by reason ([`super::RedfishError::failure`]).
    pub failures: BTreeMap<&'static str, u64>,
    /// Polls cut off at the poll deadline (the interval).
    pub overruns: u64,
    /// Polls skipped while the endpoint backs off after failing.
    pub skipped: u64,
    /// Numeric readings with a unit powerplane does not know, summed over the
    /// resources each discovery read.
    pub not_understood: u64,
    /// The site's `[[redfish]]` bindings of this endpoint that its last discovery could
    /// not fill (no reading, or several without `combine`).
    pub bindings_unfilled: u64,
    /// How long its last finished poll took.
    pub last_poll_s: Option<f64>,
    /// Failing now: its polls are skipped until its backoff ends.
    pub backing_off: bool,
}
