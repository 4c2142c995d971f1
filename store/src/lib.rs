//! The durable store: a small key-value and append-log contract, and the typed layer
//! that every backend shares. No backend lives here (the Redis and embedded ones are in
//! `integrations::store`), so the control loop keeps its state through this crate
//! without carrying an IO library.
//!
//! # Layout
//!
//! - this file: [`Backend`], the contract (atomic [`Batch`]es of [`Op`]s, keys and
//!   append logs); [`Store`], the typed layer on any backend, with its [`Tx`]; the
//!   records (audit [`LedgerEntry`], [`Account`], [`Conditions`]) and [`StoreError`].
//! - [`health`]: what a backend went through, for `/metrics` and readiness.
//!
//! A tick's writes (decisions, ledger entries, job changes, the new caps and holds)
//! go in one [`Batch`] and are committed atomically, so a crash leaves either the old
//! state or the new one, never half of each.

pub mod health;

use std::collections::BTreeMap;
use std::sync::Arc;

use policies::plan::ThermalLevel;
use policies::{Cap, Decision, Hold, State};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use telemetry::{EntityId, Job, Timestamp};
use thiserror::Error;

/// Why the store could not do what was asked.
#[derive(Debug, Error)]
pub enum StoreError {
    #[error("{backend} store: {message}")]
    Backend {
        backend: &'static str,
        message: String,
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
    /// The batch was fenced off: the store's epoch is no longer the writer's.
    #[error("{backend} store: batch of epoch {epoch} refused: a newer leader holds the store")]
    Fenced { backend: &'static str, epoch: u64 },
    #[error("store record {what} could not be decoded")]
    Codec {
        what: String,
        #[source]
        source: serde_json::Error,
    },
}

impl StoreError {
    pub fn backend(
        backend: &'static str,
        message: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        StoreError::Backend {
            backend,
            message: message.into(),
            source: Some(Box::new(source)),
        }
    }
}

/// One write, inside a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    Put {
        collection: String,
        key: String,
        value: Vec<u8>,
    },
    Delete {
        collection: String,
        key: String,
    },
    Append {
        log: String,
        value: Vec<u8>,
    },
    /// The batch applies only while the store's fencing epoch (see `integrations::lease`)
    /// is `epoch`: a deposed leader's writes do not land. Always the batch's first op;
    /// a backend that serves one controller only (embedded) ignores it.
    Fence {
        epoch: u64,
    },
}

/// Writes that commit together or not at all.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Batch {
    pub ops: Vec<Op>,
}

/// What a backend must do. Collections are maps from string keys to bytes, listed in
/// key order; logs are append-only, numbered from 1.
pub trait Backend: Send {
    /// Applies every op atomically. Returns the sequence number of each append, in order.
    fn commit(&mut self, batch: &Batch) -> Result<Vec<u64>, StoreError>;
    fn get(&mut self, collection: &str, key: &str) -> Result<Option<Vec<u8>>, StoreError>;
    fn list(&mut self, collection: &str) -> Result<Vec<(String, Vec<u8>)>, StoreError>;
    /// Up to `limit` records with sequence numbers from `from` on.
    fn read_log(
        &mut self,
        log: &str,
        from: u64,
        limit: usize,
    ) -> Result<Vec<(u64, Vec<u8>)>, StoreError>;
    fn log_len(&mut self, log: &str) -> Result<u64, StoreError>;
    /// A short name for logs and errors (`embedded`, `redis`).
    fn name(&self) -> &'static str;
    /// Applies `batch` as batch `seq` of `writer`, unless that batch (or a later one of
    /// the same writer) was applied already: then nothing is written and the answer is
    /// `false`. A backend that keeps no such record applies it.
    fn commit_once(&mut self, writer: &str, seq: u64, batch: &Batch) -> Result<bool, StoreError> {
        let _ = (writer, seq);
        self.commit(batch).map(|_| true)
    }
    /// The last batch of `writer` applied with [`Backend::commit_once`] (0: none known).
    fn applied(&mut self, writer: &str) -> Result<u64, StoreError> {
        let _ = writer;
        Ok(0)
    }
    /// Counters and reachability, for backends with a server (`None`: always there).
    fn health(&self) -> Option<Arc<health::StoreHealth>> {
        None
    }
}

/// Who an energy ledger entry is charged to.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Account {
    Job {
        job: String,
        project: String,
        user: String,
    },
    /// GPUs and nodes with no job.
    Idle,
    /// Cooling and distribution losses.
    Overhead,
}

/// What the racks went through over one ledger interval, for reports.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Conditions {
    pub start: Timestamp,
    pub end: Timestamp,
    /// Per rack: the hottest fresh inlet reading of the interval and the rack's limit.
    pub inlets: BTreeMap<String, InletCondition>,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct InletCondition {
    pub max_c: f64,
    pub limit_c: f64,
}

/// Energy used over an interval, with its cost and carbon.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LedgerEntry {
    pub start: Timestamp,
    pub end: Timestamp,
    pub account: Account,
    /// The rack the energy was used in, when it was used in one.
    pub rack: Option<String>,
    pub energy_kwh: f64,
    pub cost: f64,
    pub carbon_kg: f64,
    /// The part of `energy_kwh` estimated as power × time (a GPU without an energy
    /// counter, or across a counter reset) rather than read from a counter or meter.
    #[serde(default)]
    pub integrated_kwh: f64,
    /// The part of `energy_kwh` from GPUs several jobs held at once, split evenly: an
    /// estimate whose error can reach this whole amount.
    #[serde(default)]
    pub shared_kwh: f64,
}

const AUDIT: &str = "audit";
const LEDGER: &str = "ledger";
const CONDITIONS: &str = "conditions";
const JOBS: &str = "jobs";
const CAPS: &str = "caps";
const HOLDS: &str = "holds";
const THERMAL: &str = "thermal";
const OBSERVED_CAPS: &str = "observed_caps";
const OBSERVED_HOLDS: &str = "observed_holds";
const CLOCKS: &str = "clocks";
const SUSPENDED: &str = "suspended";
const RULES: &str = "rules";
const THERMAL_MODELS: &str = "thermal_models";
const UNCAPPED_DRAWS: &str = "uncapped_draws";
/// The grid controller's memory of the event in force: one record, [`GRID_KEY`].
const GRID: &str = "grid";
const GRID_KEY: &str = "event";

/// About how much memory one write holds: its names, key and value, and the op itself.
fn op_bytes(op: &Op) -> usize {
    const OP: usize = 48;
    OP + match op {
        Op::Put {
            collection,
            key,
            value,
        } => collection.len() + key.len() + value.len(),
        Op::Delete { collection, key } => collection.len() + key.len(),
        Op::Append { log, value } => log.len() + value.len(),
        Op::Fence { .. } => 0,
    }
}

/// A batch under construction, with typed helpers.
#[derive(Debug, Clone, Default)]
pub struct Tx {
    batch: Batch,
}

impl Tx {
    pub fn new() -> Self {
        Tx::default()
    }

    pub fn audit(&mut self, d: &Decision) -> &mut Self {
        self.append(AUDIT, d)
    }

    /// An audit entry that also names the replica and the leader's epoch that took
    /// the decision (with `[ha]`); it reads back as the same [`Decision`].
    pub fn audit_by(&mut self, d: &Decision, instance: &str, epoch: u64) -> &mut Self {
        let mut v = serde_json::to_value(d).unwrap_or(serde_json::Value::Null);
        if let Some(m) = v.as_object_mut() {
            m.insert("instance".into(), instance.into());
            m.insert("epoch".into(), epoch.into());
        }
        self.append(AUDIT, &v)
    }

    pub fn ledger(&mut self, e: &LedgerEntry) -> &mut Self {
        self.append(LEDGER, e)
    }

    pub fn conditions(&mut self, c: &Conditions) -> &mut Self {
        self.append(CONDITIONS, c)
    }

    pub fn put_job(&mut self, job: &Job) -> &mut Self {
        self.put(JOBS, &job.id, job)
    }

    pub fn delete_job(&mut self, id: &str) -> &mut Self {
        self.batch.ops.push(Op::Delete {
            collection: JOBS.into(),
            key: id.into(),
        });
        self
    }

    /// Writes what changed from `prior` to `next`: only the caps, holds and thermal
    /// levels that differ are put or deleted.
    pub fn state(&mut self, prior: &State, next: &State) -> &mut Self {
        self.diff(CAPS, &prior.caps, &next.caps);
        self.diff(HOLDS, &prior.holds, &next.holds);
        self.diff(THERMAL, &prior.thermal, &next.thermal);
        self.diff(OBSERVED_CAPS, &prior.observed_caps, &next.observed_caps);
        self.diff(OBSERVED_HOLDS, &prior.observed_holds, &next.observed_holds);
        self.diff(CLOCKS, &prior.clocks, &next.clocks);
        self.diff(SUSPENDED, &prior.suspended, &next.suspended);
        self.diff(RULES, &prior.rules, &next.rules);
        self.diff(THERMAL_MODELS, &prior.thermal_models, &next.thermal_models);
        self.diff(UNCAPPED_DRAWS, &prior.uncapped_draws, &next.uncapped_draws);
        match (&prior.grid, &next.grid) {
            (p, Some(g)) if p.as_ref() != Some(g) => {
                self.put(GRID, GRID_KEY, g);
            }
            (Some(_), None) => {
                self.delete_record(GRID, GRID_KEY);
            }
            _ => {}
        }
        self
    }

    /// Puts a record in a collection of its own (adapters keep their state this way).
    pub fn put_record<T: Serialize>(&mut self, collection: &str, key: &str, v: &T) -> &mut Self {
        self.put(collection, key, v)
    }

    pub fn delete_record(&mut self, collection: &str, key: &str) -> &mut Self {
        self.batch.ops.push(Op::Delete {
            collection: collection.into(),
            key: key.into(),
        });
        self
    }

    /// Appends a record to a log of its own.
    pub fn append_record<T: Serialize>(&mut self, log: &str, v: &T) -> &mut Self {
        self.append(log, v)
    }

    /// Appends another transaction's writes after this one's.
    pub fn extend(&mut self, other: Tx) {
        self.batch.ops.extend(other.batch.ops);
    }

    pub fn is_empty(&self) -> bool {
        self.batch.ops.is_empty()
    }

    /// The writes as one batch, for a backend.
    pub fn batch(&self) -> &Batch {
        &self.batch
    }

    pub fn len(&self) -> usize {
        self.batch.ops.len()
    }

    /// What the writes are, for a message that says what was not kept: the number of
    /// writes per collection or log (`ledger: 12, audit: 3, jobs: 2`).
    pub fn summary(&self) -> String {
        let mut by: BTreeMap<&str, usize> = BTreeMap::new();
        for op in &self.batch.ops {
            match op {
                Op::Put { collection, .. } | Op::Delete { collection, .. } => {
                    *by.entry(collection).or_default() += 1;
                }
                Op::Append { log, .. } => *by.entry(log).or_default() += 1,
                Op::Fence { .. } => {}
            }
        }
        by.iter()
            .map(|(k, n)| format!("{k}: {n}"))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// About how much memory the writes hold: keys, values and names, in bytes.
    pub fn bytes(&self) -> usize {
        self.batch.ops.iter().map(op_bytes).sum()
    }

    /// Keeps the last put or delete of each key (what a commit would leave) and every
    /// append, in their order: what waits for a store that is down stops growing with
    /// the number of ticks for everything but the logs.
    pub fn compact(&mut self) {
        let mut last: BTreeMap<(&str, &str), usize> = BTreeMap::new();
        for (i, op) in self.batch.ops.iter().enumerate() {
            if let Op::Put {
                collection, key, ..
            }
            | Op::Delete { collection, key } = op
            {
                last.insert((collection.as_str(), key.as_str()), i);
            }
        }
        let keep: Vec<bool> = self
            .batch
            .ops
            .iter()
            .enumerate()
            .map(|(i, op)| match op {
                Op::Put {
                    collection, key, ..
                }
                | Op::Delete { collection, key } => {
                    last.get(&(collection.as_str(), key.as_str())) == Some(&i)
                }
                Op::Append { .. } | Op::Fence { .. } => true,
            })
            .collect();
        let mut keep = keep.into_iter();
        self.batch.ops.retain(|_| keep.next().unwrap_or(true));
    }

    /// Drops the oldest appends until the writes hold at most `max_bytes`: rack
    /// conditions first, then the audit log and the other logs, the energy ledger
    /// last. Puts and deletes are kept (after [`Tx::compact`] they are bounded by the
    /// number of keys). Returns how many records were dropped, per log.
    pub fn shed(&mut self, max_bytes: usize) -> BTreeMap<String, u64> {
        let mut dropped: BTreeMap<String, u64> = BTreeMap::new();
        let mut bytes = self.bytes();
        if bytes <= max_bytes {
            return dropped;
        }
        let rank = |log: &str| match log {
            CONDITIONS => 0,
            LEDGER => 2,
            _ => 1,
        };
        for pass in 0..3 {
            let mut drop = vec![false; self.batch.ops.len()];
            for (i, op) in self.batch.ops.iter().enumerate() {
                if bytes <= max_bytes {
                    break;
                }
                if let Op::Append { log, .. } = op {
                    if rank(log) == pass {
                        drop[i] = true;
                        bytes = bytes.saturating_sub(op_bytes(op));
                        *dropped.entry(log.clone()).or_default() += 1;
                    }
                }
            }
            let mut d = drop.into_iter();
            self.batch.ops.retain(|_| !d.next().unwrap_or(false));
            if bytes <= max_bytes {
                break;
            }
        }
        dropped
    }

    /// Puts what is new or changed in `next` and deletes what is gone from `prior`,
    /// walking both in key order (both are maps ordered by key) once.
    fn diff<'a, K: ToString + Ord + 'a, V: Serialize + PartialEq + 'a>(
        &mut self,
        collection: &str,
        prior: impl IntoIterator<Item = (&'a K, &'a V)>,
        next: impl IntoIterator<Item = (&'a K, &'a V)>,
    ) {
        let mut prior = prior.into_iter().peekable();
        for (k, v) in next {
            // the prior keys before this one are gone
            while let Some((old, _)) = prior.next_if(|(old, _)| *old < k) {
                self.delete_record(collection, &old.to_string());
            }
            match prior.next_if(|(old, _)| *old == k) {
                Some((_, old)) if old == v => {}
                _ => {
                    self.put(collection, &k.to_string(), v);
                }
            }
        }
        for (old, _) in prior {
            self.delete_record(collection, &old.to_string());
        }
    }

    fn put<T: Serialize>(&mut self, collection: &str, key: &str, v: &T) -> &mut Self {
        self.batch.ops.push(Op::Put {
            collection: collection.into(),
            key: key.into(),
            value: encode(v),
        });
        self
    }

    fn append<T: Serialize>(&mut self, log: &str, v: &T) -> &mut Self {
        self.batch.ops.push(Op::Append {
            log: log.into(),
            value: encode(v),
        });
        self
    }
}

fn encode<T: Serialize>(v: &T) -> Vec<u8> {
    // our own types always serialize: no maps with non-string keys, no failing impls
    serde_json::to_vec(v).unwrap_or_default()
}

fn decode<T: DeserializeOwned>(what: &str, bytes: &[u8]) -> Result<T, StoreError> {
    serde_json::from_slice(bytes).map_err(|source| StoreError::Codec {
        what: what.to_string(),
        source,
    })
}

/// The typed store every part of powerplane uses, over any backend.
pub struct Store {
    backend: Box<dyn Backend>,
    /// The fencing epoch every commit carries (with `[ha]`: the leader's term).
    fence: Option<u64>,
    /// `powerplane_store_commit_seconds{backend}`, taken from the registry once.
    commit_seconds: std::sync::Arc<telemetry::histogram::Histogram>,
}

impl Store {
    pub fn new(backend: Box<dyn Backend>) -> Self {
        let commit_seconds = telemetry::histogram::registry(
            "store_commit_seconds",
            "Store commits (one transaction each), by backend, failed ones included",
            &[("backend", backend.name())],
        );
        Store {
            commit_seconds,
            backend,
            fence: None,
        }
    }

    /// Commits from now on apply only while the store's fencing epoch is `epoch`
    /// (`None`: unconditionally, a single controller).
    pub fn set_fence(&mut self, epoch: Option<u64>) {
        self.fence = epoch;
    }

    pub fn fence(&self) -> Option<u64> {
        self.fence
    }

    pub fn backend_name(&self) -> &'static str {
        self.backend.name()
    }

    /// The backend's counters and reachability (`None` for the embedded store).
    pub fn health(&self) -> Option<Arc<health::StoreHealth>> {
        self.backend.health()
    }

    /// Commits a transaction atomically; its duration counts in
    /// `powerplane_store_commit_seconds{backend}`.
    pub fn commit(&mut self, tx: Tx) -> Result<(), StoreError> {
        if tx.is_empty() {
            return Ok(());
        }
        let started = std::time::Instant::now();
        let r = self.commit_batch(tx);
        self.commit_seconds.observe(started.elapsed());
        r
    }

    fn commit_batch(&mut self, tx: Tx) -> Result<(), StoreError> {
        match self.fence {
            None => self.backend.commit(&tx.batch).map(|_| ()),
            Some(epoch) => {
                let mut batch = Batch {
                    ops: Vec::with_capacity(tx.batch.ops.len() + 1),
                };
                batch.ops.push(Op::Fence { epoch });
                batch.ops.extend(tx.batch.ops);
                self.backend.commit(&batch).map(|_| ())
            }
        }
    }

    /// Audit records from sequence number `from` (1-based) on.
    pub fn audit(&mut self, from: u64, limit: usize) -> Result<Vec<(u64, Decision)>, StoreError> {
        self.read(AUDIT, from, limit)
    }

    pub fn audit_len(&mut self) -> Result<u64, StoreError> {
        self.backend.log_len(AUDIT)
    }

    pub fn ledger(
        &mut self,
        from: u64,
        limit: usize,
    ) -> Result<Vec<(u64, LedgerEntry)>, StoreError> {
        self.read(LEDGER, from, limit)
    }

    /// Rack conditions per ledger interval, from sequence number `from` on.
    pub fn conditions(
        &mut self,
        from: u64,
        limit: usize,
    ) -> Result<Vec<(u64, Conditions)>, StoreError> {
        self.read(CONDITIONS, from, limit)
    }

    pub fn ledger_len(&mut self) -> Result<u64, StoreError> {
        self.backend.log_len(LEDGER)
    }

    pub fn job(&mut self, id: &str) -> Result<Option<Job>, StoreError> {
        match self.backend.get(JOBS, id)? {
            Some(b) => decode(&format!("job {id}"), &b).map(Some),
            None => Ok(None),
        }
    }

    /// Every job in the registry, in id order.
    pub fn jobs(&mut self) -> Result<Vec<Job>, StoreError> {
        self.backend
            .list(JOBS)?
            .into_iter()
            .map(|(k, v)| decode(&format!("job {k}"), &v))
            .collect()
    }

    /// The caps, holds and thermal levels in force, as last committed.
    pub fn state(&mut self) -> Result<State, StoreError> {
        Ok(State {
            caps: self.entities::<Cap>(CAPS)?.into(),
            holds: self.keyed::<Hold>(HOLDS)?,
            thermal: self.keyed::<ThermalLevel>(THERMAL)?,
            observed_caps: self.entities::<Cap>(OBSERVED_CAPS)?.into(),
            observed_holds: self.keyed::<Hold>(OBSERVED_HOLDS)?,
            clocks: self.entities::<policies::ClockLock>(CLOCKS)?,
            suspended: self.keyed::<Hold>(SUSPENDED)?,
            rules: self.keyed(RULES)?,
            thermal_models: self.keyed(THERMAL_MODELS)?,
            uncapped_draws: self.entities(UNCAPPED_DRAWS)?.into(),
            grid: self.keyed::<policies::GridMemory>(GRID)?.remove(GRID_KEY),
        })
    }

    /// Every record of a collection written with [`Tx::put_record`], in key order.
    pub fn records<T: DeserializeOwned>(
        &mut self,
        collection: &str,
    ) -> Result<BTreeMap<String, T>, StoreError> {
        self.keyed(collection)
    }

    /// Records of a log written with [`Tx::append_record`], from `from` (1-based) on.
    pub fn log_records<T: DeserializeOwned>(
        &mut self,
        log: &str,
        from: u64,
        limit: usize,
    ) -> Result<Vec<(u64, T)>, StoreError> {
        self.read(log, from, limit)
    }

    pub fn log_len(&mut self, log: &str) -> Result<u64, StoreError> {
        self.backend.log_len(log)
    }

    fn read<T: DeserializeOwned>(
        &mut self,
        log: &str,
        from: u64,
        limit: usize,
    ) -> Result<Vec<(u64, T)>, StoreError> {
        self.backend
            .read_log(log, from.max(1), limit)?
            .into_iter()
            .map(|(seq, v)| Ok((seq, decode(&format!("{log} #{seq}"), &v)?)))
            .collect()
    }

    fn keyed<T: DeserializeOwned>(&mut self, c: &str) -> Result<BTreeMap<String, T>, StoreError> {
        self.backend
            .list(c)?
            .into_iter()
            .map(|(k, v)| Ok((k.clone(), decode(&format!("{c} {k}"), &v)?)))
            .collect()
    }

    fn entities<T: DeserializeOwned>(
        &mut self,
        c: &str,
    ) -> Result<BTreeMap<EntityId, T>, StoreError> {
        self.backend
            .list(c)?
            .into_iter()
            .map(|(k, v)| {
                let id: EntityId = k.parse().map_err(|e| StoreError::Backend {
                    backend: "store",
                    message: format!("{c} key {k:?}: {e}"),
                    source: None,
                })?;
                Ok((id, decode(&format!("{c} {k}"), &v)?))
            })
            .collect()
    }
}

#[cfg(test)]
#[path = "waiting_tests.rs"]
mod tests;
