//! High availability: several `serve` replicas share Redis and one leader, chosen by a
//! lease (see [`integrations::lease`]), actuates.
//!
//! The election runs on a thread of its own ([`spawn`]), renewing or trying to take
//! the lease every `renew_s` with a deadline per call, and publishes what it knows in
//! a [`Gate`]. The control loop consults the gate once per tick: it acts (commands the
//! agents, drives the schedulers, commits to the store) only while the gate gives it an
//! epoch, which it stops doing `margin` before its lease ends, even while the election
//! thread cannot reach Redis. Every effect carries that epoch (agents' commands, the
//! store's commits, scheduler actions, audit entries).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::Result;
use integrations::lease::{Change, Election, Holder, LeaseStore, Role, Timing};
use serde::{Deserialize, Serialize};
use tracing::{info, warn};

/// `[ha]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HaSection {
    #[serde(default)]
    pub enabled: bool,
    /// How long a term lasts unless renewed.
    #[serde(default = "default_lease")]
    pub lease_s: f64,
    /// How often the leader renews (and a follower tries to take the lease).
    #[serde(default = "default_renew")]
    pub renew_s: f64,
    /// This replica's name in the lease, the audit log and the API (default: the
    /// host name).
    #[serde(default)]
    pub instance: Option<String>,
    /// Where the lease lives: `store` (the default: beside the store's records, in
    /// Redis or PostgreSQL) or `kubernetes` (a `coordination.k8s.io/v1` Lease).
    #[serde(default)]
    pub backend: HaBackend,
    /// `kubernetes`: the Lease's namespace (default: the service account's).
    #[serde(default)]
    pub namespace: Option<String>,
    /// `kubernetes`: the Lease's name.
    #[serde(default = "default_lease_name")]
    pub lease_name: String,
}

/// Where the leader lease lives.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum HaBackend {
    /// Beside the store's records (Redis or PostgreSQL).
    #[default]
    #[serde(alias = "redis", alias = "postgres")]
    Store,
    /// A Kubernetes Lease; the store's fencing counter is raised to each term's epoch.
    Kubernetes,
}

fn default_lease_name() -> String {
    "powerplane-leader".into()
}

fn default_lease() -> f64 {
    15.0
}
fn default_renew() -> f64 {
    5.0
}

impl HaSection {
    pub fn instance(&self) -> String {
        self.instance.clone().unwrap_or_else(host_name)
    }

    pub fn timing(&self) -> Timing {
        Timing::from_secs(self.lease_s, self.renew_s)
    }
}

pub use integrations::lease::host_name;

/// What `[ha]` must satisfy, in words (`config check` collects them with the rest).
pub fn problems(
    ha: &HaSection,
    shared_store: bool,
    agents_lease_s: Option<f64>,
    tick_s: f64,
) -> Vec<String> {
    let mut out = Vec::new();
    if !ha.enabled {
        return out;
    }
    if !shared_store {
        out.push("[ha] needs [store] kind = \"redis\" or \"postgres\": the replicas share state and the leader lease there (the embedded store serves one controller)".into());
    }
    if !(ha.lease_s.is_finite() && (1.0..=600.0).contains(&ha.lease_s)) {
        out.push(format!(
            "[ha] lease_s must be within 1..=600, got {}",
            ha.lease_s
        ));
    }
    if !(ha.renew_s.is_finite() && ha.renew_s > 0.0 && ha.renew_s * 3.0 <= ha.lease_s) {
        out.push(format!(
            "[ha] renew_s must be above 0 and at most lease_s / 3 (got renew_s = {}, lease_s = {}): a term must survive two missed renewals",
            ha.renew_s, ha.lease_s
        ));
    }
    if ha.backend == HaBackend::Kubernetes {
        let name = &ha.lease_name;
        let dns = |s: &str| {
            !s.is_empty()
                && s.len() <= 253
                && s.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
                && s.starts_with(|c: char| c.is_ascii_alphanumeric())
                && s.ends_with(|c: char| c.is_ascii_alphanumeric())
        };
        if !dns(name) {
            out.push(format!(
                "[ha] lease_name {name:?}: a Kubernetes object name (lower-case letters, digits, '-' and '.')"
            ));
        }
        if let Some(ns) = ha
            .namespace
            .as_deref()
            .filter(|n| !dns(n) || n.contains('.'))
        {
            out.push(format!(
                "[ha] namespace {ns:?}: a Kubernetes namespace (lower-case letters, digits and '-')"
            ));
        }
    }
    if let Some(inst) = &ha.instance {
        if inst.is_empty()
            || inst.len() > 128
            || inst.chars().any(|c| c.is_whitespace() || c.is_control())
        {
            out.push(format!(
                "[ha] instance {inst:?}: 1-128 characters, no spaces"
            ));
        }
    }
    // a failover takes up to one lease and one tick; the agents' leases must outlast it
    if let Some(agents) = agents_lease_s {
        let need = ha.lease_s + 2.0 * tick_s;
        if agents <= need {
            out.push(format!(
                "[agents] lease_s ({agents}) must be above [ha] lease_s + 2 × controller.tick_s ({need}): else caps lapse into the fail-safe during a failover"
            ));
        }
    }
    out
}

/// The role as the API, `/metrics` and the status page show it.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct HaStatus {
    /// `leader` or `follower` (a controller without `[ha]` is the leader).
    pub role: &'static str,
    /// Whether `[ha]` is enabled (several replicas, one leader).
    pub enabled: bool,
    pub instance: String,
    /// The leader's instance, as last seen (this one when leading).
    pub leader: Option<String>,
    /// The epoch of the current term (this one's when leading; the leader's as seen).
    pub epoch: u64,
    /// Terms this replica started or lost.
    pub transitions: u64,
    /// Whether the lease could be read on the last round.
    pub lease_readable: bool,
}

impl HaStatus {
    /// One controller, no `[ha]`: it leads, with no epoch.
    pub fn single() -> Self {
        HaStatus {
            role: "leader",
            enabled: false,
            instance: host_name(),
            leader: None,
            epoch: 0,
            transitions: 0,
            lease_readable: true,
        }
    }

    pub fn is_leader(&self) -> bool {
        self.role == "leader"
    }
}

/// What the gate allows the loop now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GateState {
    /// Lead and actuate under this epoch.
    Acting(u64),
    /// The term is not over but the lease could not be read on the last round: hold
    /// everything (no command, no scheduler action) without giving the term up.
    Suspended(u64),
    Following,
}

/// What the election thread knows, for the loop and the API.
#[derive(Debug)]
pub struct Gate {
    inner: Mutex<GateInner>,
    t0: Instant,
}

#[derive(Debug)]
struct GateInner {
    election: Election,
    readable: bool,
    /// The newest term known (a leader seen, or this replica's own): what the status
    /// shows when no leader is known now, so `leader_epoch` never moves backwards.
    last_seen: Option<Holder>,
}

impl Gate {
    fn new(election: Election) -> Self {
        Gate {
            inner: Mutex::new(GateInner {
                election,
                readable: false,
                last_seen: None,
            }),
            t0: Instant::now(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, GateInner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn now_ms(&self) -> u64 {
        self.t0.elapsed().as_millis() as u64
    }

    /// The epoch this replica may act under now (`None`: it must not actuate): it
    /// leads, its lease is not within the margin of its end, and the last round read
    /// the lease (no replica actuates while the lease cannot be read).
    pub fn acting(&self) -> Option<u64> {
        match self.state() {
            GateState::Acting(e) => Some(e),
            _ => None,
        }
    }

    /// What the loop may do now.
    pub fn state(&self) -> GateState {
        let now = self.now_ms();
        let g = self.lock();
        match (g.election.acting(now), g.readable) {
            (Some(e), true) => GateState::Acting(e),
            (Some(e), false) => GateState::Suspended(e),
            (None, _) => GateState::Following,
        }
    }

    pub fn status(&self) -> HaStatus {
        let acting = self.acting();
        let g = self.lock();
        let (leader, epoch) = match (acting, g.election.role(), &g.last_seen) {
            (Some(e), _, _) => (Some(g.election.instance.clone()), e),
            (None, Role::Follower { leader: Some(h) }, last)
                if last.as_ref().is_none_or(|l| h.epoch >= l.epoch) =>
            {
                (Some(h.instance.clone()), h.epoch)
            }
            (None, _, Some(h)) => (Some(h.instance.clone()), h.epoch),
            (None, _, None) => (None, 0),
        };
        HaStatus {
            role: if acting.is_some() {
                "leader"
            } else {
                "follower"
            },
            enabled: true,
            instance: g.election.instance.clone(),
            leader,
            epoch,
            transitions: g.election.transitions,
            lease_readable: g.readable,
        }
    }

    /// One round of the election against `store`.
    fn round(&self, store: &mut dyn LeaseStore) -> Change {
        let sent = self.now_ms();
        // the lock is not held over the call: the loop's gate check never waits on Redis
        let mut election = self.lock().election.clone();
        let change = election.step(store, sent);
        let readable = store.holder().is_ok();
        let mut g = self.lock();
        let seen = match election.role() {
            Role::Follower { leader: Some(h) } => Some(h.clone()),
            Role::Leader { epoch, .. } => Some(Holder {
                instance: election.instance.clone(),
                epoch: *epoch,
            }),
            Role::Follower { leader: None } => None,
        };
        if let Some(h) = seen.filter(|h| g.last_seen.as_ref().is_none_or(|l| h.epoch >= l.epoch)) {
            g.last_seen = Some(h);
        }
        g.election = election;
        g.readable = readable;
        change
    }

    fn resign(&self, store: &mut dyn LeaseStore) {
        let mut g = self.lock();
        g.election.resign(Some(store));
    }
}

/// The election thread and its gate.
pub struct Ha {
    pub gate: Arc<Gate>,
    thread: Option<JoinHandle<()>>,
    stop: Arc<AtomicBool>,
}

/// Starts the election on a thread of its own, against `store` (the lease in Redis or
/// PostgreSQL, beside the store's records).
pub fn spawn(ha: &HaSection, mut store: Box<dyn LeaseStore + Send>) -> Result<Ha> {
    let timing = ha.timing();
    let instance = ha.instance();
    let gate = Arc::new(Gate::new(Election::new(&instance, timing)));
    let stop = Arc::new(AtomicBool::new(false));
    let (g, s) = (gate.clone(), stop.clone());
    info!(instance = %instance, lease_s = ha.lease_s, renew_s = ha.renew_s, "leader election starting");
    let thread = std::thread::Builder::new()
        .name("election".into())
        .spawn(move || {
            let every = Duration::from_millis(timing.renew_ms);
            while !s.load(Ordering::Relaxed) {
                let started = Instant::now();
                match g.round(store.as_mut()) {
                    Change::Elected { epoch } => {
                        info!(instance = %g.lock().election.instance, epoch, "elected leader")
                    }
                    Change::Deposed { epoch, why } => {
                        warn!(epoch, why, "no longer the leader; following")
                    }
                    Change::None => {}
                }
                // a follower sleeps in steps so that shutdown is prompt
                while !s.load(Ordering::Relaxed) && started.elapsed() < every {
                    std::thread::sleep(Duration::from_millis(20).min(every));
                }
            }
            g.resign(store.as_mut());
        })?;
    Ok(Ha {
        gate,
        thread: Some(thread),
        stop,
    })
}

impl Ha {
    /// Stops the election and gives the lease back, so that a follower takes over
    /// at once instead of after the lease.
    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use integrations::lease::FakeLeaseStore;

    #[test]
    fn a_deposed_replica_never_shows_an_epoch_below_the_one_it_led_under() {
        let timing = Timing {
            lease_ms: 300,
            renew_ms: 100,
            margin_ms: 60,
        };
        let mut store = FakeLeaseStore::default();
        // b leads epoch 1; a follows and sees it
        assert!(store.acquire("b", 300).expect("fake").is_some());
        let gate = Gate::new(Election::new("a", timing));
        gate.round(&mut store);
        assert_eq!(gate.status().epoch, 1);
        // b's lease ends; a takes epoch 2
        store.now_ms = 1_000;
        assert_eq!(gate.round(&mut store), Change::Elected { epoch: 2 });
        assert_eq!((gate.status().role, gate.status().epoch), ("leader", 2));
        // the store stops answering: a's term runs out and nobody is known to lead
        store.down = true;
        std::thread::sleep(Duration::from_millis(350));
        assert!(matches!(
            gate.round(&mut store),
            Change::Deposed { epoch: 2, .. }
        ));
        let s = gate.status();
        assert_eq!(s.role, "follower");
        assert_eq!(s.epoch, 2, "{s:?}");
    }
}
