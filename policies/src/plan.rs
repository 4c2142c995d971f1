//! What the engine decides: the desired state (caps and holds, each with a lease) and
//! the decisions that changed it.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use crate::gpu_map::GpuMap;
use serde::{Deserialize, Serialize};
use telemetry::{EntityId, Job, Timestamp};

/// A power cap on one GPU.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Cap {
    pub watts: f64,
    /// The rule whose cap is in force (the most protective one); shared by the caps of
    /// the rule and from one state to the next.
    pub rule: Arc<str>,
    /// When this cap level was set.
    pub since: Timestamp,
    /// The cap ends here unless renewed: an agent that hears nothing reverts.
    pub lease_until: Timestamp,
}

/// A job held (deferred) by powerplane.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Hold {
    pub rule: String,
    pub since: Timestamp,
    /// The hold ends here unless renewed; never after the job's latest start.
    pub lease_until: Timestamp,
    pub reason: String,
}

/// The thermal rule's memory for one rack.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ThermalLevel {
    /// The rack's GPU cap as a fraction of each GPU's default limit (1.0: uncapped).
    pub fraction: f64,
    pub since: Timestamp,
}

/// What the predictive thermal rule expects of one rack's inlet, under the caps in force
/// after the tick and the planned load (running jobs, the queued jobs and the holds
/// that end within the horizon).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RackPrediction {
    /// The inlet reading the prediction starts from.
    pub inlet_c: f64,
    /// The inlet expected `horizon_s` from now.
    pub predicted_c: f64,
    /// The highest inlet expected within the horizon, and in how many seconds.
    pub peak_c: f64,
    pub peak_in_s: f64,
    pub horizon_s: f64,
    pub limit_c: f64,
    pub margin_c: f64,
}

impl RackPrediction {
    /// Predicted headroom: limit − margin − predicted peak (negative: the rule will cap).
    pub fn headroom_c(&self) -> f64 {
        self.limit_c - self.margin_c - self.peak_c
    }
}

/// A rule's memory for one of its targets (an entity or a job).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RuleMemory {
    pub active: bool,
    /// When it last switched on or off.
    pub since: Timestamp,
    /// Since when each timed comparison (`… for 5m`) of `when` has been true (by
    /// comparison index); an untimed one needs no timer and has none.
    #[serde(default, skip_serializing_if = "Timers::is_empty")]
    pub when_true: Timers,
    #[serde(default, skip_serializing_if = "Timers::is_empty")]
    pub release_true: Timers,
    /// The rule's cap level (W or %) while it ramps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub level: Option<f64>,
    pub level_at: Timestamp,
    /// A one-shot action (requeue) was taken in this activation.
    #[serde(default)]
    pub done: bool,
}

/// Since when each timed comparison of a condition has been true, by the comparison's index
/// in the condition. In JSON a map (`{"0": "2024-06-03T06:00:00Z"}`); in memory the
/// first [`Timers::INLINE`] comparisons sit in place (a duration is most often on the
/// first or second comparison of a condition), so the memory of a rule over every GPU
/// of a site costs no allocation per GPU, and little room where nothing is timed.
#[derive(Debug, Clone)]
pub struct Timers {
    /// `NONE` where the comparison is not true (or not timed).
    first: [Timestamp; Timers::INLINE],
    /// Comparisons from index `INLINE` on (boxed: most conditions have none, and a
    /// memory per GPU of a large site is kept twice, the prior one and the next).
    #[allow(clippy::box_collection)] // 8 bytes in place of a map's 24, in every memory
    more: Option<Box<BTreeMap<usize, Timestamp>>>,
}

impl Timers {
    pub const INLINE: usize = 2;
    const NONE: Timestamp = Timestamp(i64::MIN);

    pub fn new() -> Self {
        Timers {
            first: [Self::NONE; Self::INLINE],
            more: None,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.first.iter().all(|t| *t == Self::NONE)
            && self.more.as_ref().is_none_or(|m| m.is_empty())
    }

    pub fn len(&self) -> usize {
        self.first.iter().filter(|t| **t != Self::NONE).count()
            + self.more.as_ref().map_or(0, |m| m.len())
    }

    pub fn get(&self, id: usize) -> Option<Timestamp> {
        match self.first.get(id) {
            Some(t) => (*t != Self::NONE).then_some(*t),
            None => self.more.as_ref().and_then(|m| m.get(&id).copied()),
        }
    }

    /// Since when comparison `id` has been true, starting its timer at `now` if it was
    /// not running.
    #[inline]
    pub fn start(&mut self, id: usize, now: Timestamp) -> Timestamp {
        match self.first.get_mut(id) {
            Some(t) => {
                if *t == Self::NONE {
                    *t = now;
                }
                *t
            }
            None => *self.more.get_or_insert_default().entry(id).or_insert(now),
        }
    }

    pub fn insert(&mut self, id: usize, since: Timestamp) {
        match self.first.get_mut(id) {
            Some(t) => *t = since,
            None => {
                self.more.get_or_insert_default().insert(id, since);
            }
        }
    }

    #[inline]
    pub fn remove(&mut self, id: usize) -> Option<Timestamp> {
        match self.first.get_mut(id) {
            Some(t) => {
                let old = std::mem::replace(t, Self::NONE);
                (old != Self::NONE).then_some(old)
            }
            None => self.more.as_mut().and_then(|m| m.remove(&id)),
        }
    }

    fn more_iter(&self) -> impl Iterator<Item = (&usize, &Timestamp)> + '_ {
        self.more.iter().flat_map(|m| m.iter())
    }

    /// The running timers in index order.
    pub fn iter(&self) -> impl Iterator<Item = (usize, Timestamp)> + '_ {
        self.first
            .iter()
            .enumerate()
            .filter(|(_, t)| **t != Self::NONE)
            .map(|(i, t)| (i, *t))
            .chain(
                self.more
                    .iter()
                    .flat_map(|m| m.iter().map(|(i, t)| (*i, *t))),
            )
    }
}

/// Equal when the same timers run (an emptied overflow map equals none).
impl PartialEq for Timers {
    fn eq(&self, other: &Self) -> bool {
        self.first == other.first && self.more_iter().eq(other.more_iter())
    }
}

impl Eq for Timers {}

impl Default for Timers {
    fn default() -> Self {
        Timers::new()
    }
}

impl FromIterator<(usize, Timestamp)> for Timers {
    fn from_iter<I: IntoIterator<Item = (usize, Timestamp)>>(iter: I) -> Self {
        let mut t = Timers::new();
        for (i, since) in iter {
            t.insert(i, since);
        }
        t
    }
}

impl Serialize for Timers {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(self.iter())
    }
}

impl<'de> Deserialize<'de> for Timers {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let m = BTreeMap::<usize, Timestamp>::deserialize(d)?;
        Ok(m.into_iter().collect())
    }
}

/// One rule's memory per target (an entity's name, or a job's id for a job rule). In
/// JSON a map by target, in name order; in memory a list in the order the rule visits
/// its targets (the site's order, the jobs' order), so the next evaluation finds each
/// target's memory at its position in the list instead of hashing or comparing names
/// through a map, and carries the names on without copying them.
#[derive(Debug, Clone, Default)]
pub struct RuleMemories {
    entries: Vec<(Arc<str>, RuleMemory)>,
    /// For a rule over GPUs, the position of each entry's GPU in the evaluation's list
    /// of GPUs, entry by entry (empty for other rules and for a memory read from the
    /// store): by it the next evaluation finds each GPU's entry without comparing or
    /// hashing names, once it has checked that each position still names its GPU.
    gpus: Vec<u32>,
}

/// Equal when the same targets have the same memory (the GPUs' positions are a hint).
impl PartialEq for RuleMemories {
    fn eq(&self, other: &Self) -> bool {
        self.entries == other.entries
    }
}

impl RuleMemories {
    pub fn new() -> Self {
        RuleMemories::default()
    }

    /// Room for `n` targets' memory (the prior evaluation's count: the list is not
    /// grown by doubling, which would hold it twice while it moves).
    pub fn with_capacity(n: usize) -> Self {
        RuleMemories {
            entries: Vec::with_capacity(n),
            gpus: Vec::new(),
        }
    }

    /// [`RuleMemories::with_capacity`] for a rule over GPUs: room for the GPUs'
    /// positions as well (see [`RuleMemories::push_gpu`]).
    pub(crate) fn with_capacity_gpus(n: usize) -> Self {
        RuleMemories {
            entries: Vec::with_capacity(n),
            gpus: Vec::with_capacity(n),
        }
    }

    /// Gives back room reserved for many more targets than were kept.
    pub(crate) fn shrink_if_sparse(&mut self) {
        if self.entries.len() < self.entries.capacity() / 2 {
            self.entries.shrink_to_fit();
        }
        if self.gpus.len() < self.gpus.capacity() / 2 {
            self.gpus.shrink_to_fit();
        }
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// A target's memory (a linear search: for tools and tests; the engine walks the
    /// list in order).
    pub fn get(&self, target: &str) -> Option<&RuleMemory> {
        self.entries
            .iter()
            .find(|(k, _)| &**k == target)
            .map(|(_, m)| m)
    }

    pub fn get_mut(&mut self, target: &str) -> Option<&mut RuleMemory> {
        self.entries
            .iter_mut()
            .find(|(k, _)| &**k == target)
            .map(|(_, m)| m)
    }

    /// Sets a target's memory (appended when the target has none).
    pub fn insert(&mut self, target: impl Into<Arc<str>>, memory: RuleMemory) {
        let target: Arc<str> = target.into();
        match self.entries.iter_mut().find(|(k, _)| *k == target) {
            Some((_, m)) => *m = memory,
            None => self.push(target, memory),
        }
    }

    /// Appends a target's memory without looking for it (the engine visits each target
    /// once).
    #[inline]
    pub(crate) fn push(&mut self, target: Arc<str>, memory: RuleMemory) {
        self.entries.push((target, memory));
        // an entry without its GPU's position: the positions no longer say where each
        // entry's GPU is
        self.gpus.clear();
    }

    /// Appends the memory of a GPU target, `gpu` its position in the evaluation's list
    /// of GPUs.
    #[inline]
    pub(crate) fn push_gpu(&mut self, target: Arc<str>, memory: RuleMemory, gpu: usize) {
        if self.gpus.len() == self.entries.len() {
            self.gpus.push(gpu as u32);
        }
        self.entries.push((target, memory));
    }

    /// The position of each entry's GPU (see [`RuleMemories::push_gpu`]), when every
    /// entry was pushed with one.
    pub(crate) fn gpu_positions(&self) -> Option<&[u32]> {
        (self.gpus.len() == self.entries.len()).then_some(&self.gpus)
    }

    /// Every target's memory, in the order they were written.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &RuleMemory)> + '_ {
        self.entries.iter().map(|(k, m)| (&**k, m))
    }

    pub(crate) fn entries(&self) -> &[(Arc<str>, RuleMemory)] {
        &self.entries
    }
}

impl FromIterator<(String, RuleMemory)> for RuleMemories {
    fn from_iter<I: IntoIterator<Item = (String, RuleMemory)>>(iter: I) -> Self {
        // one entry per target: the last one given wins, as in a map
        let m: BTreeMap<String, RuleMemory> = iter.into_iter().collect();
        RuleMemories {
            entries: m.into_iter().map(|(k, v)| (Arc::from(k), v)).collect(),
            gpus: Vec::new(),
        }
    }
}

impl From<BTreeMap<String, RuleMemory>> for RuleMemories {
    fn from(m: BTreeMap<String, RuleMemory>) -> Self {
        m.into_iter().collect()
    }
}

impl Serialize for RuleMemories {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        // by name, as the map it replaces was written
        let mut order: Vec<&(Arc<str>, RuleMemory)> = self.entries.iter().collect();
        order.sort_by(|a, b| a.0.cmp(&b.0));
        s.collect_map(order.into_iter().map(|(k, m)| (&**k, m)))
    }
}

impl<'de> Deserialize<'de> for RuleMemories {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(BTreeMap::<String, RuleMemory>::deserialize(d)?.into())
    }
}

/// A locked SM clock on one GPU.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClockLock {
    pub mhz: f64,
    pub rule: String,
    pub since: Timestamp,
    pub lease_until: Timestamp,
}

/// Everything in force. The engine takes the prior one and returns the next.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct State {
    /// Caps per GPU; a GPU not listed runs at its default limit.
    pub caps: GpuMap<Cap>,
    /// Holds per job id.
    pub holds: BTreeMap<String, Hold>,
    /// Thermal cap level per rack id.
    pub thermal: BTreeMap<String, ThermalLevel>,
    /// What rules in observe mode would have in force (never actuated).
    #[serde(default)]
    pub observed_caps: GpuMap<Cap>,
    #[serde(default)]
    pub observed_holds: BTreeMap<String, Hold>,
    /// Locked SM clocks per GPU.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub clocks: BTreeMap<EntityId, ClockLock>,
    /// Preemptible jobs suspended by a rule, with the lease of the suspension.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub suspended: BTreeMap<String, Hold>,
    /// Each rule's memory per target: `rule name` → `target` → memory.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub rules: BTreeMap<String, RuleMemories>,
    /// The predictive thermal rule's fitted model per rack id.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub thermal_models: BTreeMap<String, RackFit>,
    /// What each capped busy GPU drew just before its cap, for the job it runs: the
    /// budget rule's demand for it while the cap holds it down (see
    /// [`crate::budget::remember_uncapped`]).
    #[serde(default, skip_serializing_if = "GpuMap::is_empty")]
    pub uncapped_draws: GpuMap<UncappedDraw>,
    /// The grid controller's memory of the event in force (or of its rebound limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grid: Option<GridMemory>,
}

/// What the grid controller keeps of an event from one tick to the next, and what it
/// saw this tick (for `/metrics`, the status page and the VEN's reports).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GridMemory {
    /// When the controller first saw the event in force.
    pub since: Timestamp,
    /// The meter baseline its shed is taken from, W: the edge's, or the meter when the
    /// event began.
    pub baseline_w: f64,
    /// The meter target in force, W (during the rebound: the baseline).
    pub target_w: f64,
    /// The meter's power this tick, W.
    pub meter_w: f64,
    /// The lowest meter power reachable without touching protected work, W (an
    /// estimate: protected draws, flexible GPUs at their floors, preemptible jobs
    /// suspended where the policy allows).
    pub floor_w: f64,
    /// By how much the target is out of reach this tick, W (0: met or reachable).
    pub shortfall_w: f64,
    /// Set once the event ended: the rebound limit holds until then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rebound_until: Option<Timestamp>,
}

impl GridMemory {
    /// Whether the event itself (not its rebound limit) is in force.
    pub fn event_active(&self) -> bool {
        self.rebound_until.is_none()
    }
}

/// A GPU's draw at its default limit, read for one job before a cap held it down.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UncappedDraw {
    /// The job's id (shared by the job's GPUs, and from one state to the next).
    pub job: Arc<str>,
    pub watts: f64,
    /// When it was read.
    pub at: Timestamp,
}

/// What a decision is about. In JSON its fields sit in the decision itself:
/// `"entity": "rack/a01", "gpus": [...]` or `"job": "slurm:12"`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Target {
    /// A set of GPUs, named by the entity that holds them (a rack) and listed.
    Gpus {
        entity: EntityId,
        gpus: Vec<EntityId>,
    },
    Job {
        job: String,
    },
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Gpus { entity, gpus } => write!(f, "{} GPUs of {entity}", gpus.len()),
            Target::Job { job } => write!(f, "job {job}"),
        }
    }
}

/// What to do.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Action {
    Cap {
        watts: f64,
    },
    Uncap,
    Hold {
        until: Timestamp,
    },
    Release,
    LockClocks {
        mhz: f64,
    },
    UnlockClocks,
    /// Requeue a running preemptible job (it goes back to pending).
    Requeue,
    Suspend {
        until: Timestamp,
    },
    Resume,
    /// A new policy is in force (`serve` reloaded the file): audit only.
    PolicyLoaded {
        sha256: String,
    },
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Action::Cap { watts } => write!(f, "cap at {watts:.0} W"),
            Action::Uncap => f.write_str("uncap"),
            Action::Hold { until } => write!(f, "hold until {until}"),
            Action::Release => f.write_str("release"),
            Action::LockClocks { mhz } => write!(f, "lock clocks at {mhz:.0} MHz"),
            Action::UnlockClocks => f.write_str("unlock clocks"),
            Action::Requeue => f.write_str("requeue"),
            Action::Suspend { until } => write!(f, "suspend until {until}"),
            Action::Resume => f.write_str("resume"),
            Action::PolicyLoaded { sha256 } => {
                write!(f, "policy {} in force", sha256.get(..12).unwrap_or(sha256))
            }
        }
    }
}

/// One change, with why.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Decision {
    pub time: Timestamp,
    pub rule: String,
    #[serde(flatten)]
    pub target: Target,
    pub action: Action,
    /// The values that triggered it (measurements and thresholds).
    pub values: BTreeMap<String, f64>,
    pub reason: String,
    /// What would undo it (the release condition), for `policy explain` and the audit.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub release: String,
    /// Logged and reported only: the rule is in observe mode.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub observe_only: bool,
}

/// The engine's answer for one tick.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    /// The desired state after this tick.
    pub state: State,
    /// What changed, in a deterministic order.
    pub decisions: Vec<Decision>,
    /// The planned start of each job the price plan holds (for node power: nodes are
    /// brought back before the work planned on them starts).
    pub planned_starts: BTreeMap<String, Timestamp>,
    /// Each rack's predicted inlet (the predictive thermal rule only), by rack id.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub predictions: BTreeMap<String, RackPrediction>,
}

/// Rounded to three decimals, as values are written in decisions.
pub(crate) fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// The last moment a job may be held by any rule: its latest start minus `margin_s`,
/// or, without a deadline, `max_defer_s` after submission.
pub fn hold_limit(job: &Job, margin_s: f64, max_defer_s: f64) -> Timestamp {
    match job.latest_start() {
        Some(ls) => ls + -margin_s,
        None => job.submit_time + max_defer_s,
    }
}

/// The fitted state of one rack's model, persisted with the engine state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RackFit {
    pub offset_c: f64,
    pub rise_c: f64,
    /// Covariance of (offset, rise): [p00, p01, p11].
    pub cov: [f64; 3],
    /// Running RMS of the fitted model's one-tick prediction error.
    pub rms_c: f64,
    pub samples: u32,
    /// The last usable inlet reading and when it was taken.
    pub last_at: Timestamp,
    pub last_inlet_c: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A state as the maps before dense rule memory wrote it: it loads, and is written
    /// again byte for byte (targets and timers in name and index order).
    #[test]
    fn rule_memory_json_is_the_map_it_was() {
        let json = r#"{"caps":{},"holds":{},"thermal":{},"observed_caps":{},"observed_holds":{},"rules":{"hot-gpus":{"a01-n01:0":{"active":false,"since":"2024-06-03T04:00:00Z","release_true":{"0":"2024-06-03T04:00:00Z"},"level_at":"2024-06-03T04:00:00Z","done":false},"a01-n01:1":{"active":true,"since":"2024-06-03T04:01:00Z","when_true":{"0":"2024-06-03T04:00:00Z","1":"2024-06-03T04:00:15Z","6":"2024-06-03T04:00:30Z"},"level":80.0,"level_at":"2024-06-03T04:01:00Z","done":false}}}}"#;
        let s: State = serde_json::from_str(json).expect("old state loads");
        let m = &s.rules["hot-gpus"];
        assert_eq!(m.len(), 2);
        let on = m.get("a01-n01:1").expect("memory of a01-n01:1");
        assert!(on.active);
        assert_eq!(on.when_true.len(), 3);
        assert_eq!(
            on.when_true.get(6),
            Some(Timestamp::parse_rfc3339("2024-06-03T04:00:30Z").expect("time"))
        );
        assert_eq!(on.when_true.get(2), None);
        assert!(on.release_true.is_empty());
        assert_eq!(serde_json::to_string(&s).expect("writes"), json);
    }

    /// Memory kept in the order the engine visits targets is written in name order.
    #[test]
    fn rule_memory_is_written_in_name_order() {
        let t = Timestamp::from_secs(0);
        let mem = |active| RuleMemory {
            active,
            since: t,
            when_true: Timers::new(),
            release_true: [(0, t)].into_iter().collect(),
            level: None,
            level_at: t,
            done: false,
        };
        let mut m = RuleMemories::new();
        m.push("b".into(), mem(true));
        m.push("a".into(), mem(false));
        let json = serde_json::to_string(&m).expect("writes");
        assert!(json.starts_with(r#"{"a":{"active":false"#), "{json}");
        let back: RuleMemories = serde_json::from_str(&json).expect("loads");
        assert_eq!(back.get("b"), m.get("b"));
        assert_eq!(back.iter().map(|(k, _)| k).collect::<Vec<_>>(), ["a", "b"]);
    }

    /// Timers past the inline ones come and go; emptied, they equal timers that never
    /// had them (the store compares states to know what to write).
    #[test]
    fn timers_beyond_the_inline_ones_compare_by_what_runs() {
        let t0 = Timestamp::from_secs(0);
        let mut x = Timers::new();
        x.start(Timers::INLINE + 2, t0);
        assert_ne!(x, Timers::new());
        assert_eq!(x.get(Timers::INLINE + 2), Some(t0));
        assert_eq!(x.remove(Timers::INLINE + 2), Some(t0));
        assert!(x.is_empty());
        assert_eq!(x, Timers::new());
        assert_eq!(serde_json::to_string(&x).expect("writes"), "{}");
    }

    #[test]
    fn timers_start_keep_and_stop() {
        let (t0, t1) = (Timestamp::from_secs(0), Timestamp::from_secs(15));
        let mut x = Timers::new();
        assert_eq!(x.start(1, t0), t0);
        assert_eq!(x.start(1, t1), t0, "a running timer keeps its start");
        assert_eq!(x.start(9, t1), t1);
        assert_eq!(x.iter().collect::<Vec<_>>(), [(1, t0), (9, t1)]);
        assert_eq!(x.remove(1), Some(t0));
        assert_eq!(x.remove(1), None);
        assert_eq!(x.remove(9), Some(t1));
        assert!(x.is_empty());
    }
}
