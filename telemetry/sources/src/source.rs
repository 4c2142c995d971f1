//! The [`Source`] trait: one shape for every telemetry input (MQTT with its JSON and
//! Sparkplug B mappings, Redfish, and whatever comes next), so that `serve` can hold
//! its sources in one list and start, stop and count them alike.
//!
//! A source owns its client and runs as one task on the serve runtime until its
//! cancellation token is cancelled. What it reads goes into an [`Output`]: bounded and
//! never blocking (it keeps the newest and counts what it drops), so a flood of
//! messages grows no queue and a stalled consumer never stalls the source. Its counters
//! are read through [`Stats`], a handle taken before the source starts and readable
//! while it runs (for `/metrics`, labelled with the source's [`Source::kind`]).
//!
//! # How serve is meant to hold them
//!
//! ```text
//! let mut sources: Vec<Box<dyn Source>> = Vec::new();
//! if let Some(m) = &cfg.mqtt { sources.push(Box::new(MqttSource::new(..)?)); }
//! if let Some(r) = &cfg.redfish { sources.push(Box::new(RedfishSource::new(..)?)); }
//! let out: Arc<dyn Output> = buffer;          // the tick's bounded buffer
//! for s in sources {
//!     info!(source = s.kind(), what = %s.describe(), "source starting");
//!     stats.push((s.kind(), s.stats()));      // for /metrics
//!     runtime.spawn(s.run(Run { cancel: runtime.shutdown.clone(), out: out.clone(), clock }));
//! }
//! ```
//!
//! Each source's config section builds it; serve needs nothing else of it.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

pub use tokio_util::sync::CancellationToken;

use telemetry::mapping::{Rebirth, Reject};
use telemetry::{EntityId, Sample, Timestamp};

/// What a source hands its output at once: the samples read, the entities whose
/// source died (Sparkplug deaths), and the rejects the source does not count itself.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Batch {
    pub samples: Vec<Sample>,
    pub dead: Vec<EntityId>,
    pub rejects: Vec<Reject>,
    /// A Sparkplug rebirth the batch called for (sent, or held back).
    pub rebirth: Option<Rebirth>,
}

/// Where a source's batches go. `push` never blocks and holds a bounded number of
/// samples (the newest kept, the dropped ones counted): a source may call it from a
/// runtime worker or from a thread of its own.
pub trait Output: Send + Sync + 'static {
    /// `kind` is the source's [`Source::kind`], for the admission counters and logs.
    fn push(&self, kind: &'static str, batch: Batch);
}

/// One counter of a source: a name (without the `powerplane_` prefix), its labels and
/// its value.
#[derive(Debug, Clone, PartialEq)]
pub struct Counter {
    pub name: &'static str,
    pub labels: Vec<(&'static str, String)>,
    pub value: u64,
}

/// A source's counters, readable while it runs.
#[derive(Clone)]
pub struct Stats(Arc<dyn Fn() -> Vec<Counter> + Send + Sync>);

impl Stats {
    pub fn new(read: impl Fn() -> Vec<Counter> + Send + Sync + 'static) -> Self {
        Stats(Arc::new(read))
    }

    /// The counters as they are now.
    pub fn read(&self) -> Vec<Counter> {
        (self.0)()
    }
}

impl std::fmt::Debug for Stats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stats").finish_non_exhaustive()
    }
}

/// What a source runs with: the shutdown token, its output and the clock that stamps
/// what it receives.
#[derive(Clone)]
pub struct Run {
    /// Cancelled once, at shutdown: the source stops reading and its task ends.
    pub cancel: CancellationToken,
    pub out: Arc<dyn Output>,
    pub clock: fn() -> Timestamp,
}

/// The task of a running source, to be spawned on the serve runtime (and tracked for
/// shutdown).
pub type Task = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// A telemetry input.
pub trait Source: Send + 'static {
    /// What kind of source it is (`mqtt`, `redfish`): the `source` label of its
    /// metrics and the field of its log lines.
    fn kind(&self) -> &'static str;

    /// Which one it is, for the log line when it starts (a broker's URL, a number of
    /// endpoints).
    fn describe(&self) -> String;

    /// Its counters, readable while it runs.
    fn stats(&self) -> Stats;

    /// The source's task: reads until `run.cancel` is cancelled, pushing into
    /// `run.out`. A source with a blocking client runs it on the runtime's blocking
    /// pool inside the task.
    fn run(self: Box<Self>, run: Run) -> Task;
}
