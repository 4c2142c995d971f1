//! What the API shows: the [`Board`] the control loop publishes after every tick.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use policies::{Decision, State};
use telemetry::{Site, Snapshot, Timestamp};

use super::health;
use control::Counters;

/// What the API shows, as of the last tick. The site, the snapshot and the state are
/// shared (`Arc`): a copy of the board, taken under its lock for a render, costs
/// moments whatever the site's size, and the render runs without the lock.
#[derive(Debug, Clone)]
pub struct Board {
    pub site: Arc<Site>,
    pub policy_file: String,
    /// The policy in force, as written.
    pub policy_text: String,
    pub started: Timestamp,
    pub time: Timestamp,
    /// Counts the ticks published (the renders of `/metrics` and the status are kept
    /// per version).
    pub version: u64,
    pub snapshot: Arc<Snapshot>,
    pub state: Arc<State>,
    pub counters: Counters,
    pub buffer_dropped: u64,
    /// Decisions counted by (rule, action kind).
    pub decisions_by_rule: BTreeMap<(String, String), u64>,
    /// The most recent decisions, oldest first (at most [`RECENT_DECISIONS`]).
    pub recent: VecDeque<Decision>,
    /// The price in force now and its steps over the next 24 hours.
    pub prices: Vec<(Timestamp, f64)>,
    /// The jobs the schedulers report as pending or running.
    pub jobs: Vec<telemetry::Job>,
    /// Where the price comes from now: `feed`, `tariff` or `feed (stale)`.
    pub price_source: String,
    /// Each price and carbon feed's age and fetches.
    pub feeds: Vec<runtime::prices::FeedReport>,
    /// The schedulers powerplane steers: holds in force, counters, job lifecycles.
    pub schedulers: serde_json::Value,
    /// Scheduler counters for `/metrics`: (name, help, value).
    pub scheduler_counters: Vec<(&'static str, &'static str, f64)>,
    /// The edges' reject counters by reason, for `/metrics` (see [`control::admit`]).
    pub labeled_counters: Vec<control::admit::LabeledCounter>,
    /// The policy in force and the outcome of the last reload.
    pub policy_status: runtime::reload::PolicyStatus,
    /// The store's reachability and counters (`None`: the embedded store), for
    /// `/metrics` and readiness.
    pub store_health: Option<std::sync::Arc<integrations::store::health::StoreHealth>>,
    /// What `/readyz` checks besides the policy: the store, the sources' freshness.
    pub ready: health::Readiness,
    /// The control loop's tick delay and duration.
    pub cadence: control::cadence::Cadence,
    /// The Redfish poller's counters per endpoint (empty without `[redfish]`).
    pub redfish: Vec<sources::redfish::EndpointStats>,
    /// The leader election (with `[ha]`), read live by `/metrics`, `/readyz` and the
    /// API.
    pub ha: Option<std::sync::Arc<runtime::ha::Gate>>,
    /// Each rack's predicted inlet after the last tick (the predictive thermal rule).
    pub predictions: BTreeMap<String, policies::RackPrediction>,
    /// The energy ledger's entries since this process started, summed by account and
    /// project (counters for `/metrics`).
    pub ledger: LedgerTotals,
    /// The grid events known (a VTN's, posted, scheduled), with their status now.
    pub grid_events: Vec<telemetry::grid::GridEvent>,
    /// Every running telemetry source's counters (its `Source::stats`) and the VEN's,
    /// for `/metrics`: those no other step renders go out as they are.
    pub source_counters: Vec<sources::source::Counter>,
}

pub const RECENT_DECISIONS: usize = 10_000;

/// Projects with a series of their own on `/metrics`; the energy of any further
/// project is summed under `project="_other"`, so a site that names a project per job
/// does not grow the scrape without bound.
pub const LEDGER_PROJECT_SERIES: usize = 1_000;

/// What the energy ledger charged, summed since the process started.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LedgerSums {
    pub energy_kwh: f64,
    pub cost: f64,
    pub carbon_kg: f64,
}

/// The ledger's sums by account (`job`, `idle`, `overhead`) and project (empty for
/// idle and overhead). They only grow: `/metrics` writes them as counters.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LedgerTotals {
    pub by_account: BTreeMap<(&'static str, String), LedgerSums>,
    projects: usize,
}

impl LedgerTotals {
    /// Adds the entries of the intervals a tick closed.
    pub fn add(&mut self, entries: &[integrations::store::LedgerEntry]) {
        use integrations::store::Account;
        for e in entries {
            let (account, project) = match &e.account {
                Account::Job { project, .. } => ("job", project.as_str()),
                Account::Idle => ("idle", ""),
                Account::Overhead => ("overhead", ""),
            };
            let mut key = (account, project.to_string());
            if !self.by_account.contains_key(&key) && account == "job" {
                if self.projects >= LEDGER_PROJECT_SERIES {
                    key.1 = "_other".to_string();
                } else {
                    self.projects += 1;
                }
            }
            let s = self.by_account.entry(key).or_default();
            s.energy_kwh += e.energy_kwh;
            s.cost += e.cost;
            s.carbon_kg += e.carbon_kg;
        }
    }
}

/// `cap`, `uncap`, `hold`, `release`, `lock_clocks`, `unlock_clocks`, `requeue`,
/// `suspend`, `resume`.
pub fn action_kind(a: &policies::Action) -> &'static str {
    match a {
        policies::Action::Cap { .. } => "cap",
        policies::Action::Uncap => "uncap",
        policies::Action::Hold { .. } => "hold",
        policies::Action::Release => "release",
        policies::Action::LockClocks { .. } => "lock_clocks",
        policies::Action::UnlockClocks => "unlock_clocks",
        policies::Action::Requeue => "requeue",
        policies::Action::Suspend { .. } => "suspend",
        policies::Action::Resume => "resume",
        policies::Action::PolicyLoaded { .. } => "policy_loaded",
    }
}

impl Board {
    /// Whether the store's server answered its last call (for `/readyz`); the embedded
    /// store is always there.
    pub fn store_reachable(&self) -> bool {
        self.store_health.as_ref().is_none_or(|h| h.is_reachable())
    }

    pub fn new(site: Site, policy_file: String, started: Timestamp) -> Self {
        Board {
            site: Arc::new(site),
            policy_file,
            policy_text: String::new(),
            started,
            time: started,
            version: 0,
            snapshot: Arc::new(Snapshot::new()),
            state: Arc::new(State::default()),
            counters: Counters::default(),
            buffer_dropped: 0,
            decisions_by_rule: BTreeMap::new(),
            recent: VecDeque::new(),
            prices: Vec::new(),
            jobs: Vec::new(),
            price_source: String::new(),
            feeds: Vec::new(),
            schedulers: serde_json::Value::Null,
            scheduler_counters: Vec::new(),
            labeled_counters: Vec::new(),
            policy_status: runtime::reload::PolicyStatus::default(),
            store_health: None,
            ready: health::Readiness::default(),
            cadence: Default::default(),
            redfish: Vec::new(),
            ha: None,
            predictions: BTreeMap::new(),
            ledger: LedgerTotals::default(),
            grid_events: Vec::new(),
            source_counters: Vec::new(),
        }
    }

    /// This replica's role: with `[ha]` as the election has it now, else the leader.
    pub fn ha_status(&self) -> runtime::ha::HaStatus {
        match &self.ha {
            Some(g) => g.status(),
            None => runtime::ha::HaStatus::single(),
        }
    }

    /// What one tick changed (the snapshot and the state copied by the caller, outside
    /// the board's lock). Returns the snapshot and the state it replaced, for the
    /// caller to drop once the lock is released (a large site's take a while to free).
    #[must_use = "drop the replaced snapshot and state outside the board's lock"]
    pub fn update(
        &mut self,
        time: Timestamp,
        snapshot: Arc<Snapshot>,
        state: Arc<State>,
        counters: &Counters,
        decisions: &[Decision],
        buffer_dropped: u64,
    ) -> (Arc<Snapshot>, Arc<State>) {
        self.time = time;
        self.version += 1;
        let replaced = (
            std::mem::replace(&mut self.snapshot, snapshot),
            std::mem::replace(&mut self.state, state),
        );
        self.counters = counters.clone();
        self.buffer_dropped = buffer_dropped;
        for d in decisions {
            *self
                .decisions_by_rule
                .entry((d.rule.clone(), action_kind(&d.action).to_string()))
                .or_default() += 1;
            if self.recent.len() == RECENT_DECISIONS {
                self.recent.pop_front();
            }
            self.recent.push_back(d.clone());
        }
        replaced
    }
}
