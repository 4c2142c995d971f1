//! The agent's state machine, free of MQTT and of the clock: it checks and applies
//! commands, holds every GPU to its desired state, ends leases with the fail-safe,
//! re-applies after drift, and persists what it must remember across a restart.
//!
//! Every setter call goes through `Core::set`, which clamps into the GPU's own
//! constraints first (safety invariant 1) and, in dry-run mode, only logs.
//!
//! Plain functions over plain data, tested with plain `#[test]`s: the loop in
//! [`crate::run`] owns MQTT and the clock and hands the core every `now`.
//!
//! # Layout
//!
//! - this file: the rules, the [`Core`] and its start from the state file;
//! - [`state`]: what survives a restart ([`Persisted`], the state file);
//! - `commands`: a command's checks, its application and its ack;
//! - `apply`: the only path to a setter, clamped into the GPU's constraints;
//! - `lease`: leases that end, the fail-safe, and what a clean stop leaves;
//! - `drift`: re-applying a desired limit that does not hold, with backoff;
//! - `report`: the read cycle, the node report and the health.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::Instant;

use telemetry::agent_proto::{Desired, Key};
use telemetry::gpu_backend::{GpuBackend, GpuError, GpuReading};
use telemetry::Timestamp;
use tracing::{error, info};

mod apply;
mod commands;
mod drift;
mod lease;
mod report;
pub mod state;

pub use commands::STALE_EPOCH;
pub use state::{load_state, save_state, Persisted};

use apply::target_of;
use lease::lease_of;

/// What the agent does to a GPU whose lease ended unrenewed.
#[derive(Debug, Clone, PartialEq)]
pub enum FailSafe {
    /// Default power limit, clocks unlocked.
    RestoreDefault,
    /// A safe cap: watts, or percent of the default limit.
    Cap {
        watts: Option<f64>,
        percent: Option<f64>,
    },
    /// Leave the GPU as it is.
    Keep,
}

impl FailSafe {
    pub fn name(&self) -> &'static str {
        match self {
            FailSafe::RestoreDefault => "restore_default",
            FailSafe::Cap { .. } => "cap",
            FailSafe::Keep => "keep",
        }
    }
}

/// The rules the agent checks commands against.
#[derive(Debug, Clone)]
pub struct Rules {
    pub node: String,
    pub key: Key,
    /// Longest lease accepted; longer ones are shortened to it.
    pub max_lease_s: f64,
    /// A command issued longer ago than this, by the controller's clock as its stamps
    /// tell, is refused as expired.
    pub max_age_s: f64,
    /// A command stamped further than this from the agent's clock is applied all the
    /// same (its lease runs from its arrival), but counted and logged: a clock is off.
    pub max_skew_s: f64,
    pub fail_safe: FailSafe,
    pub dry_run: bool,
    /// An enforced limit this far from the desired one is drift, and is re-applied.
    pub drift_tolerance_w: f64,
    /// Where processes are looked up (`/proc`).
    pub proc_root: PathBuf,
}

impl Rules {
    pub fn new(node: &str, key: Key) -> Self {
        Rules {
            node: node.to_string(),
            key,
            max_lease_s: 900.0,
            max_age_s: 60.0,
            max_skew_s: 30.0,
            fail_safe: FailSafe::RestoreDefault,
            dry_run: false,
            drift_tolerance_w: 2.0,
            proc_root: PathBuf::from("/proc"),
        }
    }
}

/// What the agent does when told to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnExit {
    RestoreDefault,
    Keep,
    FailSafe,
}

/// The monotonic clock the core rate-limits its log lines by (a seam: tests drive it).
pub type Monotonic = Box<dyn Fn() -> Instant + Send>;

pub struct Core {
    rules: Rules,
    backend: Box<dyn GpuBackend>,
    state_file: Option<PathBuf>,
    p: Persisted,
    /// The last good reading of each GPU (for constraints).
    last: BTreeMap<u32, GpuReading>,
    /// GPUs whose desired limit does not hold (degraded).
    failing: BTreeSet<u32>,
    /// Re-applies after drift per GPU: attempts so far and when to try again.
    drift: BTreeMap<u32, (u32, Timestamp)>,
    log_limit: telemetry::log_limit::LogLimiter,
    monotonic: Monotonic,
    pub counters: BTreeMap<&'static str, u64>,
    seq: u64,
    /// Which pods hold which GPUs (`[kubernetes]`), and the last answer whose
    /// unmatched device ids were counted.
    pods: Option<crate::pods::PodResources>,
    pods_counted: u64,
}

fn bump(c: &mut BTreeMap<&'static str, u64>, k: &'static str) {
    *c.entry(k).or_default() += 1;
}

impl Core {
    /// Loads the state file (when given), reads the GPUs and brings each one to what it
    /// should be: the desired state while its lease lasts (after a reboot or a driver
    /// reload the limits are back at default), the fail-safe once it has ended.
    pub fn start(
        rules: Rules,
        backend: Box<dyn GpuBackend>,
        state_file: Option<PathBuf>,
        now: Timestamp,
    ) -> Core {
        let p = state_file.as_deref().map(load_state).unwrap_or_default();
        let mut core = Core {
            rules,
            backend,
            state_file,
            p,
            last: BTreeMap::new(),
            failing: BTreeSet::new(),
            drift: BTreeMap::new(),
            log_limit: telemetry::log_limit::LogLimiter::new(std::time::Duration::from_secs(60)),
            monotonic: Box::new(Instant::now),
            counters: BTreeMap::new(),
            seq: 0,
            pods: None,
            pods_counted: 0,
        };
        core.read();
        let restored: Vec<(u32, Desired)> = core
            .p
            .desired
            .iter()
            .map(|(i, d)| (*i, d.clone()))
            .collect();
        for (i, d) in restored {
            if let Some(t) = target_of(&d) {
                if lease_of(&d).is_none_or(|l| l > now) {
                    info!(gpu = i, desired = ?d, "restoring the desired state from the state file");
                    let _ = core.set(i, t);
                }
            }
        }
        core.expire(now);
        core
    }

    /// The core with another monotonic clock for its log rate limits (the system's
    /// by default).
    pub fn with_monotonic(mut self, monotonic: Monotonic) -> Core {
        self.monotonic = monotonic;
        self
    }

    /// The core that reports which pods hold each GPU, from this mapping.
    pub fn with_pods(mut self, pods: crate::pods::PodResources) -> Core {
        self.pods = Some(pods);
        self
    }

    pub fn rules(&self) -> &Rules {
        &self.rules
    }

    pub fn desired(&self) -> &BTreeMap<u32, Desired> {
        &self.p.desired
    }

    /// Reads every GPU; keeps the good readings.
    fn read(&mut self) -> Vec<Result<GpuReading, GpuError>> {
        let all = match self.backend.read_all() {
            Ok(a) => a,
            Err(e) => {
                bump(&mut self.counters, "read_errors");
                return vec![Err(e)];
            }
        };
        for r in all.iter().flatten() {
            self.last.insert(r.index, r.clone());
        }
        all
    }

    fn save(&mut self) {
        // a dry run must not leave a desired state that a later real run would apply
        if self.rules.dry_run {
            return;
        }
        let Some(path) = &self.state_file else { return };
        if let Err(e) = save_state(path, &self.p) {
            bump(&mut self.counters, "state_file_errors");
            error!(path = %path.display(), error = %e, "cannot write the agent's state file; a restart would forget the desired state");
        }
    }
}

#[cfg(test)]
mod tests;
