//! `serve` with `[ha]`: the leader gate the tick consults (see [`runtime::ha`]), the
//! take-over (restore from the store under the new epoch, open the schedulers,
//! command every agent anew) and the step-down; a follower evaluates but never
//! actuates.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Result;
use integrations::lease::LeaseStore;
use tracing::{info, warn};

use super::Serve;
use crate::config::{Config, StoreConfig};
use runtime::schedulers::Schedulers;

/// The leader election, with `[ha]` enabled (the lease lives in the store: Redis or
/// PostgreSQL).
pub(super) fn start_ha(cfg: &Config, base: &Path) -> Result<Option<runtime::ha::Ha>> {
    let lease = lease_store(cfg, base)?;
    let Some(h) = cfg.ha.as_ref().filter(|h| h.enabled) else {
        if let Some((lease, place)) = lease {
            refuse_beside_replicas(lease, &place)?;
        }
        return Ok(None);
    };
    let Some((lease, _)) = lease else {
        anyhow::bail!(
            "[ha] needs [store] kind = \"redis\" or \"postgres\": the embedded store serves one controller"
        )
    };
    let lease = match h.backend {
        runtime::ha::HaBackend::Store => lease,
        runtime::ha::HaBackend::Kubernetes => kubernetes_lease(cfg, h, base)?,
    };
    Ok(Some(runtime::ha::spawn(h, lease)?))
}

/// `[ha] backend = "kubernetes"`: the Lease, reached as `[schedulers.kubernetes]` says
/// (in the cluster without it), fencing the store: each term's epoch is raised in the
/// store's counter before the term counts, so the store refuses an older leader's
/// batches as it does with its own lease.
fn kubernetes_lease(
    cfg: &Config,
    h: &runtime::ha::HaSection,
    base: &Path,
) -> Result<Box<dyn LeaseStore + Send>> {
    use integrations::kubernetes::{Access, Kube, KubeLease};
    use integrations::lease::FencedLease;
    let (access, timeout) = match cfg.schedulers.as_ref().and_then(|s| s.kubernetes.as_ref()) {
        Some(k) => (k.access(base), k.timeout_s),
        None => (Access::default(), 10.0),
    };
    // each call ends well inside a renewal interval
    let deadline = Duration::from_secs_f64(timeout.min(h.renew_s / 2.0).max(0.1));
    let kube = Kube::new(&access, deadline)?;
    info!(api = %kube.url, lease = %h.lease_name, "leader election on a Kubernetes Lease");
    let lease = KubeLease::new(kube, h.namespace.as_deref(), &h.lease_name);
    let deadline = |s: f64| Duration::from_secs_f64(s.max(0.1));
    Ok(match &cfg.store {
        StoreConfig::Redis(r) => Box::new(FencedLease {
            lease,
            fence: integrations::lease::redis::RedisLease::new(
                &r.url(base)?,
                &r.prefix,
                deadline(r.timeout_s),
            )?,
        }),
        StoreConfig::Postgres(p) => Box::new(FencedLease {
            lease,
            fence: integrations::lease::postgres::PostgresLease::to(
                &p.target(base)?,
                &p.schema,
                deadline(p.timeout_s),
            )?,
        }),
        _ => anyhow::bail!(
            "[ha] needs [store] kind = \"redis\" or \"postgres\": the embedded store serves one controller"
        ),
    })
}

/// The leader lease beside the store's records, with a deadline per call, and where
/// it is (for messages); `None` for the embedded store.
fn lease_store(cfg: &Config, base: &Path) -> Result<Option<(Box<dyn LeaseStore + Send>, String)>> {
    let deadline = |s: f64| Duration::from_secs_f64(s.max(0.1));
    Ok(Some(match &cfg.store {
        StoreConfig::Redis(r) => (
            Box::new(integrations::lease::redis::RedisLease::new(
                &r.url(base)?,
                &r.prefix,
                deadline(r.timeout_s),
            )?),
            format!("Redis prefix {:?}", r.prefix),
        ),
        StoreConfig::Postgres(p) => (
            Box::new(integrations::lease::postgres::PostgresLease::to(
                &p.target(base)?,
                &p.schema,
                deadline(p.timeout_s),
            )?),
            format!("PostgreSQL schema {:?}", p.schema),
        ),
        _ => return Ok(None),
    }))
}

/// Without `[ha]`, on a store that replicas with `[ha]` have used (a fencing epoch is
/// kept there): refuses to start, since this controller's effects would carry no
/// epoch and go unfenced beside the leader's. A store that cannot be read now is let
/// go with a warning (the agents refuse epoch-less commands once they have seen an
/// epoch).
fn refuse_beside_replicas(mut lease: Box<dyn LeaseStore + Send>, place: &str) -> Result<()> {
    let epoch = match lease.epoch() {
        Ok(e) => e,
        Err(e) => {
            warn!(error = %e, "cannot read the store's leader lease: starting without [ha] unchecked");
            return Ok(());
        }
    };
    if epoch == 0 {
        return Ok(());
    }
    let holder = match lease.holder() {
        Ok(Some(h)) => format!(", held now by {:?}", h.instance),
        _ => String::new(),
    };
    anyhow::bail!(
        "the store ({place}) holds a leader lease (epoch {epoch}{holder}): replicas with [ha] use it, \
         and a controller without [ha] beside them would command unfenced. Enable [ha] in this \
         configuration (one replica alone leads, under an epoch), or give the store a prefix or \
         schema of its own"
    )
}

/// With `[ha]`: what this replica holds as leader, and what it needs to take over.
pub(super) struct Leader {
    pub(super) ha: Option<runtime::ha::Ha>,
    /// The epoch the last tick acted under (`None`: a follower).
    pub(super) epoch: Option<u64>,
    pub(super) fleet: Option<Arc<Mutex<control::fleet::Fleet>>>,
    pub(super) hooks: api::Hooks,
    pub(super) base: std::path::PathBuf,
    pub(super) handle: tokio::runtime::Handle,
    pub(super) shutdown: tokio_util::sync::CancellationToken,
}

impl Leader {
    /// Before the first tick: no epoch acted under yet.
    pub(super) fn new(
        ha: Option<runtime::ha::Ha>,
        fleet: Option<Arc<Mutex<control::fleet::Fleet>>>,
        hooks: api::Hooks,
        base: std::path::PathBuf,
        runtime: &runtime::Runtime,
    ) -> Leader {
        Leader {
            ha,
            epoch: None,
            fleet,
            hooks,
            base,
            handle: runtime.handle(),
            shutdown: runtime.shutdown.clone(),
        }
    }
}

/// What a follower hands its actuator: nothing is commanded.
pub(super) struct Standby;

impl control::Actuator for Standby {
    fn apply(&mut self, _: &policies::State, _: telemetry::Timestamp) -> Vec<String> {
        Vec::new()
    }
}

impl Serve {
    /// With `[ha]`: follows the election (taking over, stepping down) and says whether
    /// this tick may actuate; a follower mirrors the leader's committed state.
    pub(super) fn follow_election(&mut self) -> bool {
        let Some(ha) = &self.leader.ha else {
            return true;
        };
        match ha.gate.state() {
            runtime::ha::GateState::Acting(epoch) => {
                if self.leader.epoch != Some(epoch) {
                    self.take_over(epoch);
                }
            }
            // this term's lease cannot be read: no effect this tick, the term kept
            runtime::ha::GateState::Suspended(epoch) if self.leader.epoch == Some(epoch) => {
                return false;
            }
            runtime::ha::GateState::Suspended(_) | runtime::ha::GateState::Following => {
                if self.leader.epoch.is_some() {
                    self.step_down();
                }
            }
        }
        if self.leader.epoch.is_none() {
            match self.control.resume_from_store() {
                Ok(()) => {
                    self.overrides_from_store();
                    self.grid_targets_from_store();
                }
                Err(e) => tracing::debug!(error = %e, "follower: cannot read the leader's state"),
            }
        }
        self.leader.epoch.is_some()
    }

    /// Elected: restore from the store under the new epoch, open the schedulers (their
    /// holds and outbox as the last leader left them), and command every agent anew.
    fn take_over(&mut self, epoch: u64) {
        let started = std::time::Instant::now();
        // a term that ended and a new one begun between two ticks
        if self.leader.epoch.is_some() {
            self.step_down();
        }
        let store = self.control.store();
        store.set_fence(Some(epoch));
        let opened = self
            .control
            .resume_from_store()
            .map_err(anyhow::Error::from)
            .and_then(|()| {
                Schedulers::open(
                    self.cfg.schedulers.as_ref(),
                    &self.leader.base,
                    self.control.store(),
                    self.cfg.controller.tick_s,
                    self.leader.handle.clone(),
                    self.leader.shutdown.clone(),
                )
            });
        let schedulers = match opened {
            Ok(s) => s,
            Err(e) => {
                // not restored: act next tick, if still the leader
                warn!(epoch, error = %e, "elected, but cannot restore from the store; not acting yet");
                self.control.store().set_fence(Some(0));
                return;
            }
        };
        self.schedulers = schedulers;
        // the overrides the last leader stored (none stored yet: this replica's own
        // book seeds the store with the first tick)
        self.overrides_from_store();
        self.grid_targets_from_store();
        self.leader.hooks.set_events(self.schedulers.inbox());
        if let Some(f) = &self.leader.fleet {
            f.lock()
                .unwrap_or_else(|p| p.into_inner())
                .set_epoch(Some(epoch));
        }
        let instance = self
            .cfg
            .ha
            .as_ref()
            .map(|h| h.instance())
            .unwrap_or_default();
        self.control.set_records(true);
        self.control.set_origin(Some((instance.clone(), epoch)));
        self.leader.epoch = Some(epoch);
        info!(
            instance = %instance,
            epoch,
            caps = self.control.state().caps.len(),
            holds = self.control.state().holds.len(),
            jobs = self.control.registry().len(),
            took_ms = started.elapsed().as_millis() as u64,
            "leader: restored from the store; actuating"
        );
    }

    /// Deposed (or the lease cannot be read): stop actuating at once; the schedulers
    /// finish their pass (fenced: nothing of it lands once another leads) and close.
    fn step_down(&mut self) {
        let was = self.leader.epoch.take();
        let mut old = std::mem::replace(&mut self.schedulers, Schedulers::idle());
        old.stop(self.control.store(), Duration::from_secs(2));
        self.leader.hooks.set_events(None);
        self.control.store().set_fence(Some(0));
        self.control.set_records(false);
        self.control.set_origin(None);
        warn!(epoch = ?was, "not the leader (deposed, or the lease cannot be read): actuation stopped");
    }
}
