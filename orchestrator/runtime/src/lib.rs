//! The runtime of `powerplane serve`: one tokio runtime for every IO edge, one
//! cancellation token for shutdown, one task tracker, and a grace timeout.
//!
//! Each edge (HTTP, the store's connection, scheduler reconcilers, the Redfish poller,
//! feeds) is a task spawned with [`Runtime::spawn`]; it watches [`Runtime::shutdown`]
//! and ends when it is cancelled. The control loop runs on a thread of its own (it
//! never awaits an edge) and hands work to the edges through bounded channels.
//! [`Runtime::stop`] cancels the token, closes the tracker and waits for the tasks up
//! to the grace timeout, warning about those still running when it expires.
//!
//! # Layout
//!
//! - this module: the tokio runtime of `serve`: edge tasks, the shutdown token, the grace timeout.
//! - [`sources`]: every telemetry input as a `Source` in one list, started alike on the
//!   shutdown token, admitted alike (the site's entities only) into the buffer.
//! - [`buffer`]: the bounded buffer the sources put samples into and the loop drains.
//! - [`mqtt`]: `[mqtt]`: the MQTT source (JSON mappings and Sparkplug B).
//! - [`redfish`]: `[redfish]`: the poller as a source of `serve`, its counters for `/metrics`.
//! - [`prices`]: `[prices]`: the price and carbon feeds, read or fetched.
//! - [`grid`]: `[demand_response]`: the grid events (a VTN's, posted, scheduled) and
//!   what each tick gives the engine of the one in force.
//! - [`node_power`]: `[node_power]`: powering nodes down and up (Slurm's power saving,
//!   Redfish) and the worker that does it off the loop.
//! - [`schedulers`]: `[schedulers]`: one reconciler per scheduler adapter (Slurm,
//!   Kubernetes, the outbound webhook) on a thread of its own; jobs in, the plan's holds
//!   out, job lifecycles.
//! - [`ha`]: `[ha]`: several replicas, one leader, elected through Redis.
//! - [`store_open`]: `[store] kind = "redis"`: Redis on the runtime, behind its journal.
//! - [`reload`]: `serve` watches its policy file and swaps in valid edits between ticks.
//! - [`paths`]: paths in `powerplane.toml`, relative to the file.
#![forbid(unsafe_code)]

pub mod buffer;
pub mod feed_fetch;
pub mod grid;
pub mod ha;
pub mod mqtt;
pub mod node_power;
pub mod paths;
pub mod prices;
pub mod redfish;
pub mod reload;
pub mod schedulers;
pub mod sources;
pub mod store_open;

use std::future::Future;
use std::time::Duration;

use anyhow::{Context, Result};
use tokio::runtime::Handle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{info, warn};

/// How long shutdown waits for the edges to finish (well inside systemd's default
/// stop timeout of 90 s, so the ledger is closed before it).
pub const DEFAULT_GRACE: Duration = Duration::from_secs(10);

/// The tokio runtime that owns every IO edge of `serve`.
pub struct Runtime {
    /// `None` only once stopped (see `Drop`).
    rt: Option<tokio::runtime::Runtime>,
    /// Cancelled once, at shutdown: every edge task watches it.
    pub shutdown: CancellationToken,
    /// Every edge task, so that shutdown can wait for them.
    pub tracker: TaskTracker,
}

impl Runtime {
    /// A multi-threaded runtime with `workers` worker threads (at least 2).
    pub fn new(workers: usize) -> Result<Self> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(workers.max(2))
            .thread_name("powerplane-io")
            .enable_all()
            .build()
            .context("cannot start the tokio runtime")?;
        Ok(Runtime {
            rt: Some(rt),
            shutdown: CancellationToken::new(),
            tracker: TaskTracker::new(),
        })
    }

    fn rt(&self) -> &tokio::runtime::Runtime {
        self.rt.as_ref().expect("the runtime runs until stopped")
    }

    /// The runtime's handle, for edges that block on a future from a thread of
    /// their own (`handle.block_on(...)` outside the runtime's workers).
    pub fn handle(&self) -> Handle {
        self.rt().handle().clone()
    }

    /// Spawns an edge task, tracked for shutdown.
    pub fn spawn<F>(&self, fut: F) -> tokio::task::JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.tracker.spawn_on(fut, self.rt().handle())
    }

    /// Runs a blocking closure on the runtime's blocking pool, tracked for shutdown.
    pub fn spawn_blocking<F, T>(&self, f: F) -> tokio::task::JoinHandle<T>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        self.tracker.spawn_blocking_on(f, self.rt().handle())
    }

    /// SIGTERM and SIGINT cancel [`Runtime::shutdown`]: the one shutdown path of every
    /// edge, task or thread (each watches the token), and of the control loop.
    pub fn cancel_on_signals(&self) -> Result<()> {
        use tokio::signal::unix::{signal, SignalKind};
        let _entered = self.rt().enter();
        let mut term = signal(SignalKind::terminate()).context("cannot install signal handlers")?;
        let mut int = signal(SignalKind::interrupt()).context("cannot install signal handlers")?;
        let token = self.shutdown.clone();
        self.spawn(async move {
            let which = tokio::select! {
                _ = term.recv() => "SIGTERM",
                _ = int.recv() => "SIGINT",
                _ = token.cancelled() => return,
            };
            info!(signal = which, "stopping");
            token.cancel();
        });
        Ok(())
    }

    /// Cancels every edge and waits for them up to `grace`; returns whether they all
    /// finished in time.
    pub fn stop(mut self, grace: Duration) -> bool {
        self.shutdown.cancel();
        self.tracker.close();
        let tracker = self.tracker.clone();
        let done = self
            .rt()
            .block_on(async move { tokio::time::timeout(grace, tracker.wait()).await.is_ok() });
        if done {
            info!("every edge stopped");
        } else {
            warn!(
                grace_s = grace.as_secs_f64(),
                still_running = self.tracker.len(),
                "edges still running after the grace timeout; stopping anyway"
            );
        }
        if let Some(rt) = self.rt.take() {
            rt.shutdown_timeout(Duration::from_millis(500));
        }
        done
    }
}

/// A runtime dropped without [`Runtime::stop`] (serve returning an error after its
/// edges started) still cancels every edge and gives them a moment, rather than
/// waiting on a source's blocking read for ever.
impl Drop for Runtime {
    fn drop(&mut self) {
        self.shutdown.cancel();
        if let Some(rt) = self.rt.take() {
            rt.shutdown_timeout(Duration::from_secs(1));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    #[test]
    fn a_runtime_dropped_without_stop_cancels_its_edges_and_returns() {
        let rt = Runtime::new(2).expect("runtime");
        let token = rt.shutdown.clone();
        // a source's blocking read, watching the token (as the MQTT source does)
        rt.spawn_blocking(move || {
            while !token.is_cancelled() {
                std::thread::sleep(Duration::from_millis(10));
            }
        });
        let started = std::time::Instant::now();
        drop(rt);
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
    }

    #[test]
    fn stop_cancels_every_edge_and_waits_for_it() {
        let rt = Runtime::new(2).expect("runtime");
        let finished = Arc::new(AtomicBool::new(false));
        let (token, flag) = (rt.shutdown.clone(), finished.clone());
        rt.spawn(async move {
            token.cancelled().await;
            tokio::time::sleep(Duration::from_millis(50)).await;
            flag.store(true, Ordering::SeqCst);
        });
        assert!(rt.stop(Duration::from_secs(5)));
        assert!(finished.load(Ordering::SeqCst));
    }

    #[test]
    fn stop_gives_up_after_the_grace_timeout() {
        let rt = Runtime::new(2).expect("runtime");
        // an edge that ignores the token
        rt.spawn(async { tokio::time::sleep(Duration::from_secs(3600)).await });
        let t = std::time::Instant::now();
        assert!(!rt.stop(Duration::from_millis(200)));
        assert!(t.elapsed() < Duration::from_secs(3));
    }
}
