//! The control loop: tick → snapshot → evaluate → plan → actuate → audit.
//!
//! Each tick ingests the samples its telemetry sources produced, syncs the job
//! registry, evaluates the policy on the snapshot, brings the world to the plan's
//! desired state through the actuator, and commits the decisions, the ledger, the job
//! changes and the new caps and holds to the store in one batch. A store that fails
//! does not stop the loop: the writes wait and are retried on the next tick.
//!
//! The crate holds the loop and its state, and no IO of its own: the edges (sources,
//! actuators, the store's backends, HTTP) live in `powerplane-runtime` and
//! `powerplane-api` and reach the loop through its seams.
//!
//! # Layout
//!
//! - this module: the control loop over the [`Telemetry`] and [`Actuator`] seams.
//! - [`overrides`]: operators' pins and exemptions with an expiry.
//! - [`admit`]: the gate between the edges and the loop: only the site's entities pass.
//! - [`fleet`]: the controller's side of the agent protocol: commands, acks, renewals.
//! - [`grid`]: demand response: operators' load targets, scheduled targets, what the
//!   tick publishes of the grid events in force; the M&V baselines and performance.
//! - [`json_list`]: a list kept in a JSON file (the overrides, the posted grid targets).
//! - [`registry`]: the job registry, kept in the store.
//! - [`accounting`]: the energy ledger: every kWh to a job, to idle or to overhead.
//! - [`demand`]: the demand charge's peaks, per billing period, kept in the store.
//! - [`cadence`]: the control loop's tick delay and duration, for `/metrics`, and the
//!   event-driven evaluations' debounce and rate.
//! - [`feeds`]: how a price or carbon feed file is written (`[prices]`, the backtest).
//! - [`examples`]: the demo hall's site and policy (examples/demo), for the tests and the demo.
#![forbid(unsafe_code)]

pub mod accounting;
pub mod acks;
pub mod admit;
pub mod cadence;
pub mod demand;
pub mod examples;
pub mod feeds;
pub mod fleet;
pub mod grid;
pub mod json_list;
pub mod overrides;
pub mod registry;

use std::collections::BTreeMap;

use policies::{evaluate, Decision, Inputs, Plan, Policy, State};
use store::{LedgerEntry, Store, StoreError, Tx};
use telemetry::{Job, Sample, Site, Snapshot, Timestamp};
use tracing::{debug, error, warn};

use crate::accounting::Accountant;
use crate::registry::JobRegistry;

/// A source of samples (the simulator, MQTT, Redfish...).
pub trait Telemetry {
    fn poll(&mut self, now: Timestamp) -> Vec<Sample>;
}

/// Brings the world to a desired state: caps on GPUs, holds on jobs. Idempotent: it is
/// handed the whole state every tick. Returns what could not be applied.
pub trait Actuator {
    fn apply(&mut self, state: &State, now: Timestamp) -> Vec<String>;
}

/// What the loop counted since it started.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Counters {
    pub ticks: u64,
    pub samples_accepted: u64,
    pub samples_older_ignored: u64,
    /// Energy counters that went backwards (device reset or wrap).
    pub counter_resets: u64,
    /// Rejected samples per reason.
    pub samples_rejected: BTreeMap<&'static str, u64>,
    pub decisions: u64,
    pub actuation_errors: u64,
    pub store_errors: u64,
    /// Records dropped from what waited for a store that took nothing, per log (the
    /// bound on what waits in memory, [`ControlLoop::set_max_waiting_bytes`]).
    pub store_writes_dropped: BTreeMap<String, u64>,
    /// Writes waiting in memory for the store after the last commit, and about how many
    /// bytes they hold (gauges).
    pub store_waiting_writes: u64,
    pub store_waiting_bytes: u64,
}

/// `audit: 3, conditions: 12`.
fn summary(by_log: &BTreeMap<String, u64>) -> String {
    by_log
        .iter()
        .map(|(k, n)| format!("{k}: {n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The default bound on what waits in memory for the store: 64 MiB.
pub const DEFAULT_MAX_WAITING_BYTES: usize = 64 << 20;

/// What one tick did.
#[derive(Debug, Clone, Default)]
pub struct TickReport {
    pub decisions: Vec<Decision>,
    pub ledger: Vec<LedgerEntry>,
    pub rejected: Vec<String>,
    pub actuation_errors: Vec<String>,
    pub store_error: Option<String>,
    /// The planned start of each job the price plan holds.
    pub planned_starts: BTreeMap<String, Timestamp>,
    /// Each rack's predicted inlet (the predictive thermal rule), by rack id.
    pub predictions: BTreeMap<String, policies::RackPrediction>,
}

pub struct ControlLoop {
    site: Site,
    policy: Policy,
    snapshot: Snapshot,
    state: State,
    committed: State,
    registry: JobRegistry,
    accountant: Accountant,
    store: Store,
    /// Writes not yet committed (the store was down), oldest first.
    unsaved: Tx,
    /// The bound on `unsaved`, in bytes: compacted beyond half of it, the oldest log
    /// records dropped beyond it.
    max_waiting_bytes: usize,
    /// One error line a minute about dropped records.
    drop_log: telemetry::log_limit::LogLimiter,
    pub counters: Counters,
    /// Operators' overrides, applied to what is actuated (not to the engine's state).
    overrides: Vec<crate::overrides::Override>,
    /// What the actuator was last handed: the plan with the overrides applied (`None`:
    /// no override is set, the plan itself).
    actuated: Option<State>,
    /// Price and carbon forecasts the engine plans with.
    forecast: policies::Forecast,
    /// Entries for the audit log from outside the engine (a policy reload), written
    /// with the next tick's decisions.
    noted: Vec<Decision>,
    /// Whether ticks write the store (jobs, audit log, state) and the energy ledger;
    /// off for replays, which account energy themselves.
    records: bool,
    /// With `[ha]`: the replica and the epoch its decisions are audited under.
    origin: Option<(String, u64)>,
    /// The grid events as last written to the store, by key (see [`grid::record_key`]),
    /// and those changed since, written with the next tick.
    grid_saved: BTreeMap<String, telemetry::grid::GridEvent>,
    grid_changed: Vec<telemetry::grid::GridEvent>,
    /// With `[ha]`: the operators' overrides as last read from or written to the store
    /// (`None`: the store holds none), so the next leader applies the same ones.
    overrides_stored: Option<Vec<crate::overrides::Override>>,
    /// The operators' posted grid targets in force, and (with `[ha]`) as last read
    /// from or written to the store.
    posted: Vec<telemetry::grid::GridEvent>,
    posted_stored: Option<Vec<telemetry::grid::GridEvent>>,
}

impl ControlLoop {
    /// A loop that resumes from what the store holds: caps, holds, thermal levels and
    /// jobs come back as they were last committed.
    pub fn restore(
        site: Site,
        policy: Policy,
        mut store: Store,
        ledger_interval_s: f64,
    ) -> Result<Self, StoreError> {
        let state = store.state()?;
        let registry = JobRegistry::from_jobs(store.jobs()?);
        let mut accountant = Accountant::new(ledger_interval_s);
        // with a demand charge, the ledger follows the billing period's peak (resumed)
        if let Some(t) = site
            .tariff
            .as_ref()
            .filter(|t| t.demand_charge_per_kw.is_some())
        {
            let interval_s = t.demand_interval_s.unwrap_or(ledger_interval_s);
            let records = store.records::<crate::demand::PeriodPeak>(crate::demand::COLLECTION)?;
            accountant = accountant.with_demand(
                crate::demand::DemandTracker::new(interval_s, site.timezone).restore(records),
            );
        }
        // the site's GPUs take the snapshot's first slots: the engine reads them by index
        let mut snapshot = Snapshot::new();
        snapshot.register(&site.snapshot_order());
        Ok(ControlLoop {
            site,
            policy,
            snapshot,
            committed: state.clone(),
            state,
            registry,
            accountant,
            store,
            unsaved: Tx::new(),
            max_waiting_bytes: DEFAULT_MAX_WAITING_BYTES,
            drop_log: telemetry::log_limit::LogLimiter::new(std::time::Duration::from_secs(60)),
            counters: Counters::default(),
            overrides: Vec::new(),
            actuated: None,
            forecast: policies::Forecast::default(),
            noted: Vec::new(),
            records: true,
            origin: None,
            grid_saved: BTreeMap::new(),
            grid_changed: Vec::new(),
            overrides_stored: None,
            posted: Vec::new(),
            posted_stored: None,
        })
    }

    /// The bound on what waits in memory for a store that takes nothing (`[store]
    /// max_waiting_mib`). Note that a retried commit holds a copy: count it twice.
    pub fn set_max_waiting_bytes(&mut self, bytes: usize) {
        self.max_waiting_bytes = bytes;
    }

    /// Writes waiting for the store, and about how many bytes they hold.
    pub fn waiting(&self) -> (usize, usize) {
        (self.unsaved.len(), self.unsaved.bytes())
    }

    /// Whether ticks write the store; off on a follower (with `[ha]`), which
    /// evaluates the same inputs but leaves the store to the leader.
    pub fn set_records(&mut self, on: bool) {
        self.records = on;
    }

    /// The replica and the leader's epoch the audit log records with each decision.
    pub fn set_origin(&mut self, origin: Option<(String, u64)>) {
        self.origin = origin;
    }

    /// Reloads caps, holds, thermal levels and jobs from the store as last committed
    /// (a follower mirroring its leader; a new leader taking over), keeping the
    /// snapshot and the ledger's interval; writes not yet committed are dropped.
    pub fn resume_from_store(&mut self) -> Result<(), StoreError> {
        let state = self.store.state()?;
        let jobs = self.store.jobs()?;
        if self.accountant.demand().is_some() {
            let records = self.store.records(crate::demand::COLLECTION)?;
            if let Some(d) = self.accountant.demand_mut() {
                d.reload(records);
            }
        }
        self.overrides_stored =
            crate::acks::read_list(&mut self.store, crate::overrides::COLLECTION)?;
        self.posted_stored = crate::acks::read_list(&mut self.store, grid::targets::COLLECTION)?;
        self.registry = JobRegistry::from_jobs(jobs);
        self.committed = state.clone();
        self.state = state;
        self.unsaved = Tx::new();
        self.counters.store_waiting_writes = 0;
        self.counters.store_waiting_bytes = 0;
        Ok(())
    }

    /// The same loop for a replay (`powerplane backtest`): the same decisions and
    /// actuation, but nothing written to the store and no energy ledger kept (the
    /// replay integrates energy itself); the counters still count.
    pub fn without_records(mut self) -> Self {
        self.records = false;
        self
    }

    /// The price and carbon forecasts for the next ticks.
    pub fn set_forecast(&mut self, forecast: policies::Forecast) {
        self.forecast = forecast;
    }

    /// Replaces the policy; the next tick evaluates the new one from the same state.
    pub fn set_policy(&mut self, policy: Policy) {
        self.policy = policy;
    }

    /// Adds an entry to the next tick's decisions (audited, logged, on the API).
    pub fn note(&mut self, d: Decision) {
        self.noted.push(d);
    }

    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    pub fn state(&self) -> &State {
        &self.state
    }

    /// What is in force: the plan with the operators' overrides applied.
    pub fn actuated(&self) -> &State {
        self.actuated.as_ref().unwrap_or(&self.state)
    }

    /// Replaces the overrides; the next tick applies them and audits those that start
    /// or end.
    pub fn set_overrides(&mut self, overrides: Vec<crate::overrides::Override>) {
        self.overrides = overrides;
    }

    /// The overrides the store holds, as the last [`ControlLoop::resume_from_store`]
    /// read them (`None`: none were ever stored, i.e. no leader with `[ha]` set any).
    pub fn stored_overrides(&self) -> Option<&[crate::overrides::Override]> {
        self.overrides_stored.as_deref()
    }

    /// The operators' posted grid targets in force (with `[ha]`, stored for the next
    /// leader).
    pub fn set_posted_targets(&mut self, posted: Vec<telemetry::grid::GridEvent>) {
        self.posted = posted;
    }

    /// The posted grid targets the store holds, as the last
    /// [`ControlLoop::resume_from_store`] read them (`None`: none were ever stored).
    pub fn stored_posted_targets(&self) -> Option<&[telemetry::grid::GridEvent]> {
        self.posted_stored.as_deref()
    }

    /// The grid events known now (a VTN's, posted, scheduled): those new or changed
    /// since they were last written go to the store with the next tick (collection
    /// [`grid::EVENTS`]), for the reports' measurement and verification.
    pub fn note_grid_events(&mut self, events: &[telemetry::grid::GridEvent]) {
        for e in events {
            let key = grid::record_key(e);
            if self.grid_saved.get(&key) != Some(e) {
                self.grid_saved.insert(key, e.clone());
                self.grid_changed.push(e.clone());
            }
        }
    }

    pub fn snapshot(&self) -> &Snapshot {
        &self.snapshot
    }

    /// The GPUs the agents report each job holding (see [`JobRegistry::set_holders`]).
    pub fn set_holders(
        &mut self,
        holders: std::collections::BTreeMap<String, Vec<telemetry::EntityId>>,
    ) {
        self.registry.set_holders(holders);
    }

    pub fn registry(&self) -> &JobRegistry {
        &self.registry
    }

    pub fn store(&mut self) -> &mut Store {
        &mut self.store
    }

    pub fn site(&self) -> &Site {
        &self.site
    }

    /// Counts samples an edge refused before they reached the loop (see
    /// [`crate::admit`]), under the same counter as the loop's own rejects.
    pub fn count_rejected(&mut self, reason: &'static str, n: u64) {
        if n > 0 {
            *self.counters.samples_rejected.entry(reason).or_default() += n;
        }
    }

    /// Marks every reading of an entity bad (its source said it died).
    pub fn mark_bad(&mut self, entity: &telemetry::EntityId) {
        self.snapshot.mark_bad(entity);
    }

    /// Takes samples into the snapshot at `now`, counting what is accepted and what is
    /// refused (and why); returns the refusals. [`ControlLoop::tick`] ingests what it is
    /// given; `serve` also ingests between evaluations, so that an evaluation made for
    /// a crossing does not first take in every reading since the last one.
    pub fn ingest(
        &mut self,
        samples: impl IntoIterator<Item = Sample>,
        now: Timestamp,
    ) -> Vec<String> {
        let mut rejected = Vec::new();
        for sample in samples {
            match self.snapshot.ingest(sample, now) {
                Ok(telemetry::snapshot::Ingested::Updated) => self.counters.samples_accepted += 1,
                Ok(telemetry::snapshot::Ingested::CounterReset) => {
                    self.counters.samples_accepted += 1;
                    self.counters.counter_resets += 1;
                }
                Ok(telemetry::snapshot::Ingested::OlderIgnored) => {
                    self.counters.samples_older_ignored += 1
                }
                Err(e) => {
                    *self
                        .counters
                        .samples_rejected
                        .entry(e.reason())
                        .or_default() += 1;
                    debug!(reason = e.reason(), "sample rejected: {e}");
                    rejected.push(e.to_string());
                }
            }
        }
        rejected
    }

    /// One pass of the loop at `now`.
    /// `samples` are what the telemetry sources produced since the last tick; `jobs` is
    /// the schedulers' current view.
    pub fn tick(
        &mut self,
        now: Timestamp,
        samples: Vec<Sample>,
        jobs: Vec<Job>,
        actuator: &mut dyn Actuator,
    ) -> TickReport {
        self.counters.ticks += 1;
        let mut report = TickReport::default();
        // the billing period's peak so far, for the automatic peak target
        let demand = self
            .accountant
            .demand()
            .map(|d| d.samples(&self.site.site_entity(), now))
            .unwrap_or_default();
        report.rejected = self.ingest(samples.into_iter().chain(demand), now);
        let mut tx = Tx::new();
        let changed = self.registry.sync(jobs);
        if self.records {
            for job in changed {
                tx.put_job(&job);
            }
        }
        let Plan {
            state,
            decisions,
            planned_starts,
            predictions,
        } = self.plan(now);
        report.planned_starts = planned_starts;
        report.predictions = predictions;
        let mut decisions = {
            let mut noted = std::mem::take(&mut self.noted);
            noted.extend(decisions);
            noted
        };
        let actuated = self.with_overrides(&state, &mut decisions, now);
        report.actuation_errors = self.actuate(actuator, actuated, &state, now);
        self.counters.decisions += decisions.len() as u64;
        if !self.records {
            self.state = state;
            report.decisions = decisions;
            return report;
        }
        report.ledger = self.record(&mut tx, &decisions, now);
        self.state = state;
        report.decisions = decisions;
        self.unsaved.extend(tx);
        report.store_error = self.save().err().map(|e| e.to_string());
        report
    }

    /// Evaluates the policy on the snapshot and the active jobs.
    fn plan(&mut self, now: Timestamp) -> Plan {
        // the jobs are resolved once (their GPUs, their ids), when they change, not by
        // every evaluation
        let (active, job_table) = self.registry.active_on(&self.site);
        evaluate(
            &Inputs {
                site: &self.site,
                snapshot: &self.snapshot,
                jobs: active,
                prior: &self.state,
                policy: &self.policy,
                forecast: &self.forecast,
                job_table: Some(job_table),
            },
            now,
        )
    }

    /// The plan with the operators' overrides applied, adding the decisions of those
    /// that start or end; `None` with no override set now or before (what is actuated
    /// is the plan itself).
    fn with_overrides(
        &self,
        state: &State,
        decisions: &mut Vec<Decision>,
        now: Timestamp,
    ) -> Option<State> {
        if self.overrides.is_empty() && self.actuated.is_none() {
            return None;
        }
        let actuated = crate::overrides::apply(state, &self.overrides, &self.site, now);
        decisions.extend(crate::overrides::decisions(
            self.actuated.as_ref().unwrap_or(&self.state),
            &actuated,
            &self.overrides,
            now,
        ));
        Some(actuated)
    }

    /// Hands the actuator what is in force (`actuated`, else the plan); returns and
    /// counts what could not be applied.
    fn actuate(
        &mut self,
        actuator: &mut dyn Actuator,
        actuated: Option<State>,
        plan: &State,
        now: Timestamp,
    ) -> Vec<String> {
        let errors = actuator.apply(actuated.as_ref().unwrap_or(plan), now);
        self.actuated = actuated.filter(|_| !self.overrides.is_empty());
        self.counters.actuation_errors += errors.len() as u64;
        for e in &errors {
            warn!(error = %e, "actuation failed");
        }
        errors
    }

    /// Adds the tick's audit entries, energy ledger, closed conditions and changed
    /// demand peak to `tx`, in that order; returns the ledger entries.
    fn record(&mut self, tx: &mut Tx, decisions: &[Decision], now: Timestamp) -> Vec<LedgerEntry> {
        for d in decisions {
            match &self.origin {
                Some((instance, epoch)) => tx.audit_by(d, instance, *epoch),
                None => tx.audit(d),
            };
        }
        let ledger =
            self.accountant
                .record(&self.site, &self.snapshot, self.registry.active(), now);
        for e in &ledger {
            tx.ledger(e);
        }
        if let Some(c) = self.accountant.take_conditions() {
            tx.conditions(&c);
        }
        if let Some(p) = self.accountant.demand_mut().and_then(|d| d.take_changed()) {
            tx.put_record(crate::demand::COLLECTION, &p.period, &p);
        }
        for e in self.grid_changed.drain(..) {
            tx.put_record(grid::EVENTS, &grid::record_key(&e), &e);
        }
        // with [ha], the overrides go where the next leader reads them
        if self.origin.is_some() && self.overrides_stored.as_ref() != Some(&self.overrides) {
            crate::acks::write_list(tx, crate::overrides::COLLECTION, &self.overrides);
            self.overrides_stored = Some(self.overrides.clone());
        }
        if self.origin.is_some() && self.posted_stored.as_ref() != Some(&self.posted) {
            crate::acks::write_list(tx, grid::targets::COLLECTION, &self.posted);
            self.posted_stored = Some(self.posted.clone());
        }
        ledger
    }

    /// Closes the open ledger interval and saves everything (at shutdown). When records
    /// were dropped during an outage (the bound on what waits), it says so even if
    /// this last commit succeeds.
    pub fn finish(&mut self, now: Timestamp) -> Result<Vec<LedgerEntry>, StoreError> {
        let entries = self.accountant.flush(now);
        let mut tx = Tx::new();
        if let Some(d) = self.accountant.demand_mut() {
            d.close();
            if let Some(p) = d.take_changed() {
                tx.put_record(crate::demand::COLLECTION, &p.period, &p);
            }
        }
        for e in &entries {
            tx.ledger(e);
        }
        if let Some(c) = self.accountant.take_conditions() {
            tx.conditions(&c);
        }
        self.unsaved.extend(tx);
        if let Err(e) = self.save() {
            // say exactly what is lost: the writes that never reached the store
            let mut lost = self.unsaved.summary();
            if !self.counters.store_writes_dropped.is_empty() {
                let n: u64 = self.counters.store_writes_dropped.values().sum();
                lost = format!(
                    "{lost}; and {n} records ({}) dropped earlier",
                    summary(&self.counters.store_writes_dropped)
                );
            }
            error!(
                backend = self.store.backend_name(),
                error = %e,
                ops = self.unsaved.len(),
                lost = %lost,
                "shutdown: the store took none of the waiting writes; they are lost (writes per collection or log in `lost`)"
            );
            return Err(StoreError::Backend {
                backend: self.store.backend_name(),
                message: format!(
                    "shutdown: {} writes not kept ({lost}): {e}",
                    self.unsaved.len()
                ),
                source: Some(Box::new(e)),
            });
        }
        if !self.counters.store_writes_dropped.is_empty() {
            let n: u64 = self.counters.store_writes_dropped.values().sum();
            error!(
                backend = self.store.backend_name(),
                "shutdown: {n} records ({}) were dropped during the store's outage (the bound on what waits in memory); everything else is kept",
                summary(&self.counters.store_writes_dropped)
            );
        }
        Ok(entries)
    }

    /// Keeps what waits for the store within its bound: beyond half of it, the last
    /// write of each key and every log record; beyond all of it, the oldest log records
    /// go (rack conditions first, the energy ledger last), counted per log and named
    /// in an error line once a minute.
    fn bound_waiting(&mut self) {
        if self.unsaved.bytes() <= self.max_waiting_bytes / 2 {
            return;
        }
        self.unsaved.compact();
        let dropped = self.unsaved.shed(self.max_waiting_bytes);
        if dropped.is_empty() {
            return;
        }
        for (log, n) in &dropped {
            *self
                .counters
                .store_writes_dropped
                .entry(log.clone())
                .or_default() += n;
        }
        if let Some(left_out) = self.drop_log.allow("dropped", std::time::Instant::now()) {
            error!(
                backend = self.store.backend_name(),
                max_waiting_bytes = self.max_waiting_bytes,
                dropped = %summary(&self.counters.store_writes_dropped),
                left_out,
                "the store has taken nothing for so long that what waits for it passed its bound: the oldest records were dropped (totals per log since start)"
            );
        }
    }

    /// Commits the waiting writes and the state as it is now, in one batch.
    fn save(&mut self) -> Result<(), StoreError> {
        let pending = std::mem::take(&mut self.unsaved);
        let mut tx = pending.clone();
        tx.state(&self.committed, &self.state);
        match self.store.commit(tx) {
            Ok(()) => {
                self.committed = self.state.clone();
                self.counters.store_waiting_writes = 0;
                self.counters.store_waiting_bytes = 0;
                Ok(())
            }
            // a newer leader holds the store: these writes are not ours to make
            Err(e @ StoreError::Fenced { .. }) => {
                self.counters.store_errors += 1;
                warn!(error = %e, dropped_ops = pending.len(), "store commit fenced off; writes dropped");
                Err(e)
            }
            Err(e) => {
                self.counters.store_errors += 1;
                warn!(backend = self.store.backend_name(), error = %e, waiting_ops = pending.len(), "store commit failed; will retry next tick");
                self.unsaved = pending;
                self.bound_waiting();
                self.counters.store_waiting_writes = self.unsaved.len() as u64;
                self.counters.store_waiting_bytes = self.unsaved.bytes() as u64;
                Err(e)
            }
        }
    }
}
