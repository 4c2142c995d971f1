//! What the store went through, for `/metrics` and `/readyz`: counters and gauges the
//! backends update as they commit, lose or regain their server, and journal.
//!
//! One [`StoreHealth`] is shared (an `Arc`) between the backend, which writes it from
//! the control loop's thread, and the HTTP side, which only reads it.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Counters and gauges of one store; every field only goes up except the gauges
/// (`reachable`, `journal_depth`, `journal_bytes`).
#[derive(Debug)]
pub struct StoreHealth {
    reachable: AtomicBool,
    pub commits_ok: AtomicU64,
    pub commits_failed: AtomicU64,
    pub reconnects: AtomicU64,
    pub journal_depth: AtomicU64,
    pub journal_bytes: AtomicU64,
    pub journaled: AtomicU64,
    pub replayed: AtomicU64,
    pub duplicates_skipped: AtomicU64,
    pub journal_full: AtomicU64,
    /// Batches refused because a newer leader holds the store (journaled ones dropped).
    pub fenced: AtomicU64,
}

impl Default for StoreHealth {
    fn default() -> Self {
        StoreHealth {
            reachable: AtomicBool::new(true),
            commits_ok: AtomicU64::new(0),
            commits_failed: AtomicU64::new(0),
            reconnects: AtomicU64::new(0),
            journal_depth: AtomicU64::new(0),
            journal_bytes: AtomicU64::new(0),
            journaled: AtomicU64::new(0),
            replayed: AtomicU64::new(0),
            duplicates_skipped: AtomicU64::new(0),
            journal_full: AtomicU64::new(0),
            fenced: AtomicU64::new(0),
        }
    }
}

/// One line of `/metrics`: name (without the `powerplane_` prefix), kind, help, value.
pub type Sample = (&'static str, &'static str, &'static str, f64);

impl StoreHealth {
    /// Whether the store's server answered the last call (always true for a store
    /// without a server).
    pub fn is_reachable(&self) -> bool {
        self.reachable.load(Ordering::Relaxed)
    }

    /// Records whether the server answered; returns the previous value.
    pub fn set_reachable(&self, up: bool) -> bool {
        self.reachable.swap(up, Ordering::Relaxed)
    }

    pub fn count(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Everything, as `/metrics` shows it.
    pub fn samples(&self) -> Vec<Sample> {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed) as f64;
        vec![
            (
                "store_reachable",
                "gauge",
                "1 when the store's server answered the last call",
                if self.is_reachable() { 1.0 } else { 0.0 },
            ),
            (
                "store_commits_ok_total",
                "counter",
                "Batches the store's server took (journal replays included)",
                get(&self.commits_ok),
            ),
            (
                "store_commits_failed_total",
                "counter",
                "Batches the store's server did not take (journaled, or kept for the next tick)",
                get(&self.commits_failed),
            ),
            (
                "store_reconnects_total",
                "counter",
                "Times the store's server answered again after it had failed",
                get(&self.reconnects),
            ),
            (
                "store_journal_depth",
                "gauge",
                "Batches in the local journal, waiting for the store's server",
                get(&self.journal_depth),
            ),
            (
                "store_journal_bytes",
                "gauge",
                "Encoded size of the batches in the local journal",
                get(&self.journal_bytes),
            ),
            (
                "store_journaled_total",
                "counter",
                "Batches written to the local journal because the server did not take them",
                get(&self.journaled),
            ),
            (
                "store_replayed_total",
                "counter",
                "Journaled batches replayed into the store's server",
                get(&self.replayed),
            ),
            (
                "store_duplicates_skipped_total",
                "counter",
                "Replayed batches the server had already applied (skipped, not applied twice)",
                get(&self.duplicates_skipped),
            ),
            (
                "store_journal_full_total",
                "counter",
                "Batches refused because the server was down and the journal was full",
                get(&self.journal_full),
            ),
            (
                "store_fenced_total",
                "counter",
                "Batches refused because a newer leader holds the store (a deposed leader's writes)",
                get(&self.fenced),
            ),
        ]
    }
}
