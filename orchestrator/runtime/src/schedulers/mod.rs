//! The schedulers `serve` steers: the `[schedulers]` config ([`config`]), one
//! reconciler per adapter ([`reconciler`]), the job view the control loop evaluates,
//! and every job's lifecycle (pending, held, released, running, capped, suspended,
//! requeued, finished) with each transition stored and logged.
//!
//! Data flow, each tick: [`Schedulers::jobs`] copies the jobs each reconciler last
//! polled (and the inbound webhook events) — it never calls a scheduler; the control
//! loop evaluates the policy on them; [`Schedulers::apply`] hands every reconciler the
//! holds, suspensions and requeues in force (a watch slot: the newest state wins),
//! puts the webhook jobs' actions in the outbox and records the lifecycles. The
//! reconcilers call their schedulers on threads of their own, with a deadline per call
//! and a backoff on failure, so a scheduler that hangs delays no tick. Their store
//! writes come back to the loop ([`store_link`]), which owns the store. Which holds
//! are powerplane's is kept in the store (see [`integrations::slurm_sync`]), so a
//! restart neither loses nor duplicates a hold.
//!
//! Adding a scheduler adapter: a type implementing [`integrations::scheduler::Scheduler`]
//! (which declares how its jobs' requeues go and whether it reports under its name),
//! its ids (an `ADAPTER` constant, one line in `integrations::scheduler::REGISTERED`),
//! a config section in [`config`], a glue file here whose `open` builds it from the
//! section, and one registration line in [`ADAPTERS`].

pub mod config;
mod kubernetes;
mod limits;
pub mod reconciler;
mod slurm;
pub mod store_link;
mod webhook;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use integrations::scheduler::{
    Counter, Desired, Hints, JobId, Requeue, Requeues, Scheduler, SchedulerId, WEBHOOK,
};
use integrations::store::{Store, Tx};
use policies::State;
use serde_json::json;
use telemetry::{Job, Timestamp};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

pub use config::{check, KubernetesSection, SchedulersSection, SlurmSection, WebhookSection};
pub use kubernetes::{hooks as kube_hooks, KubeHooks};
pub use limits::job_limits;
pub use webhook::Inbox;

use control::registry::{Lifecycle, Lifecycles, Seen, Transition, LIFECYCLES, TRANSITIONS};
use reconciler::{Ack, Reconciler, Settings};
use store_link::StoreWrites;
use webhook::Webhook;

/// Transitions and acks kept for the API.
const RECENT: usize = 1000;

/// The store log of what the reconcilers applied.
pub const ACKS: &str = "scheduler_acks";

/// An adapter opened from its section, and its poll interval (None: it does not poll).
pub struct Opened {
    pub adapter: Box<dyn Scheduler>,
    pub poll_s: Option<f64>,
}

/// Opens one adapter from `[schedulers]` (None: its section is absent); `base` is the
/// config file's folder.
pub type Open = fn(&SchedulersSection, &std::path::Path, &mut Store) -> Result<Option<Opened>>;

/// The polled adapters, one registration line each, in the order their reconcilers
/// start (the webhook, with its inbound events, starts after them).
pub const ADAPTERS: &[Open] = &[slurm::open, kubernetes::open];

/// The schedulers of one `serve`.
pub struct Schedulers {
    reconcilers: Vec<Reconciler>,
    writes: StoreWrites,
    webhook: Option<Webhook>,
    /// The jobs of the last tick, and the poll of each reconciler they came from.
    jobs: Vec<Job>,
    polls: BTreeMap<SchedulerId, u64>,
    lifecycles: Lifecycles,
    /// Transitions stored since start.
    pub transitions: u64,
    /// The most recent transitions, oldest first, for the API.
    recent: VecDeque<Transition>,
    /// Requeues handed to the reconcilers and not yet acknowledged, by job.
    requeues: BTreeMap<String, Requeue>,
    next_requeue: u64,
    /// What the reconcilers applied, most recent last, and how many since start.
    acks: VecDeque<Ack>,
    acks_total: u64,
}

impl Schedulers {
    /// Opens the configured schedulers, restores what the store knows of them
    /// (powerplane's holds, each job's lifecycle, the webhook outbox) and starts a
    /// reconciler per adapter; `tick_s` is the poll interval of `poll_s = 0`.
    pub fn open(
        section: Option<&SchedulersSection>,
        base: &std::path::Path,
        store: &mut Store,
        tick_s: f64,
        handle: tokio::runtime::Handle,
        shutdown: CancellationToken,
    ) -> Result<Self> {
        let lifecycles = Lifecycles {
            jobs: store.records::<Lifecycle>(LIFECYCLES)?,
        };
        let none = SchedulersSection::default();
        let s = section.unwrap_or(&none);
        let mut adapters: Vec<Opened> = Vec::new();
        for open in ADAPTERS {
            adapters.extend(open(s, base, store)?);
        }
        let mut hook = None;
        if let Some(c) = &s.webhook {
            let (w, delivery) = Webhook::open(c, base, store)?;
            adapters.extend(delivery.map(|adapter| Opened {
                adapter,
                poll_s: None,
            }));
            hook = Some(w);
        }
        let (link, writes) = store_link::link();
        let mut reconcilers = Vec::new();
        for Opened { adapter, poll_s } in adapters {
            let every = poll_s.map(|p| Duration::from_secs_f64(if p > 0.0 { p } else { tick_s }));
            reconcilers.push(Reconciler::start(
                adapter,
                Settings {
                    poll_every: every,
                    handle: handle.clone(),
                    shutdown: shutdown.clone(),
                    store: link.clone(),
                },
            )?);
        }
        Ok(Schedulers {
            reconcilers,
            writes,
            webhook: hook,
            jobs: Vec::new(),
            polls: BTreeMap::new(),
            lifecycles,
            transitions: 0,
            recent: VecDeque::new(),
            requeues: BTreeMap::new(),
            next_requeue: 1,
            acks: VecDeque::new(),
            acks_total: 0,
        })
    }

    /// No scheduler: what a follower holds (with `[ha]`); reads nothing.
    pub fn idle() -> Self {
        let (_, writes) = store_link::link();
        Schedulers {
            reconcilers: Vec::new(),
            writes,
            webhook: None,
            jobs: Vec::new(),
            polls: BTreeMap::new(),
            lifecycles: Lifecycles {
                jobs: BTreeMap::new(),
            },
            transitions: 0,
            recent: VecDeque::new(),
            requeues: BTreeMap::new(),
            next_requeue: 1,
            acks: VecDeque::new(),
            acks_total: 0,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.reconcilers.is_empty() && self.webhook.is_none()
    }

    /// The tick that took the jobs has been stored: answer the events' senders.
    pub fn stored(&self) {
        if let Some(w) = &self.webhook {
            w.inbox.stored();
        }
    }

    /// Where the HTTP server puts inbound job events (with `[schedulers.webhook]`).
    /// Job events refused, by reason (with `[schedulers.webhook]`).
    pub fn events_rejected(&self) -> Option<std::collections::BTreeMap<&'static str, u64>> {
        self.webhook.as_ref().map(|w| w.inbox.rejected())
    }

    pub fn inbox(&self) -> Option<Arc<Inbox>> {
        self.webhook.as_ref().map(|w| w.inbox.clone())
    }

    /// The jobs to evaluate: what each reconciler last polled, and the events taken.
    /// Never calls a scheduler.
    pub fn jobs(&mut self) -> Vec<Job> {
        self.jobs = Vec::new();
        for r in &self.reconcilers {
            let c = r.reported();
            self.jobs.extend(c.jobs.iter().cloned());
            self.polls.insert(r.id, c.poll_seq);
        }
        if let Some(w) = &self.webhook {
            self.jobs.extend(w.inbox.take());
        }
        self.jobs.clone()
    }

    /// Commits the reconcilers' store writes that wait, waiting up to `wait` for one:
    /// the loop calls it while it sleeps between ticks.
    pub fn commit_writes(&mut self, store: &mut Store, wait: Duration) {
        self.writes.commit_waiting(store, wait);
    }

    /// Hands every reconciler the holds and suspensions of `actuated` and the tick's
    /// requeue decisions, puts the webhook jobs' actions in the outbox, and records each
    /// job's lifecycle. Never calls a scheduler.
    pub fn apply(
        &mut self,
        actuated: &State,
        decisions: &[policies::Decision],
        limits: BTreeMap<String, integrations::scheduler::JobLimit>,
        now: Timestamp,
        store: &mut Store,
    ) {
        let acks = self.take_acks();
        let webhook_requeues = self.route_requeues(decisions);
        let mut requeues: Vec<Requeue> = self.requeues.values().cloned().collect();
        requeues.sort_by_key(|r| r.seq);
        let desired = Arc::new(Desired {
            holds: actuated.holds.clone(),
            suspended: actuated.suspended.clone(),
            requeues,
            polls: self.polls.clone(),
            limits,
        });
        for r in &self.reconcilers {
            r.want(desired.clone());
        }
        let mut tx = Tx::new();
        for a in &acks {
            tx.append_record(ACKS, a);
        }
        if let Some(w) = self.webhook.as_mut() {
            w.actuate(&self.jobs, actuated, &webhook_requeues, now, &mut tx);
        }
        self.observe(actuated, now, &mut tx);
        if let Err(e) = store.commit(tx) {
            warn!(error = %e, "cannot store job transitions");
        }
        if let Some(w) = self.webhook.as_mut() {
            w.refresh_dead(store);
        }
    }

    /// The tick's requeue decisions, each the way its adapter declared
    /// ([`Requeues`]): to its reconciler (kept until it acks), returned for the
    /// outbox (a job id without a scheduler prefix too), or dropped with the
    /// adapter's warning; a job whose adapter does not run is dropped.
    fn route_requeues(&mut self, decisions: &[policies::Decision]) -> Vec<(String, String)> {
        let mut outbox = Vec::new();
        for d in decisions {
            let (policies::Action::Requeue, policies::Target::Job { job }, false) =
                (&d.action, &d.target, d.observe_only)
            else {
                continue;
            };
            let Some(id) = JobId::parse(job) else {
                outbox.push((job.clone(), d.reason.clone()));
                continue;
            };
            match self.reconciler(id.scheduler()).map(|r| r.requeues) {
                // a job's requeue waiting for its ack is the same command
                Some(Requeues::Reconciler) if !self.requeues.contains_key(job) => {
                    let seq = self.next_requeue;
                    self.next_requeue += 1;
                    let reason = d.reason.clone();
                    self.requeues.insert(
                        job.clone(),
                        Requeue {
                            seq,
                            job: id,
                            reason,
                        },
                    );
                }
                Some(Requeues::Reconciler) => {}
                Some(Requeues::Outbox) => outbox.push((job.clone(), d.reason.clone())),
                Some(Requeues::Never(why)) => warn!(job = %job, "{why}"),
                None => {}
            }
        }
        outbox
    }

    fn reconciler(&self, id: SchedulerId) -> Option<&Reconciler> {
        self.reconcilers.iter().find(|r| r.id == id)
    }

    /// Takes what the reconcilers applied since the last tick (returned, and the most
    /// recent kept), and drops the requeues their reconciler has carried out.
    fn take_acks(&mut self) -> Vec<Ack> {
        let mut done: BTreeMap<SchedulerId, u64> = BTreeMap::new();
        let mut taken = Vec::new();
        for r in &self.reconcilers {
            let mut c = r.reported();
            done.insert(r.id, c.requeued_up_to);
            taken.extend(c.acks.drain(..));
        }
        for a in &taken {
            self.acks_total += 1;
            if self.acks.len() == RECENT {
                self.acks.pop_front();
            }
            self.acks.push_back(a.clone());
        }
        self.requeues.retain(|_, r| {
            done.get(&r.job.scheduler())
                .is_none_or(|up_to| r.seq > *up_to)
        });
        taken
    }

    /// Moves every job's lifecycle to what its scheduler and the plan show, with each
    /// transition stored (in `tx`) and logged.
    fn observe(&mut self, actuated: &State, now: Timestamp, tx: &mut Tx) {
        // held by powerplane: its Slurm holds and the pods its gate holds
        let mut ours: BTreeSet<String> = BTreeSet::new();
        let mut hints: BTreeMap<String, Hints> = BTreeMap::new();
        for r in &self.reconcilers {
            let c = r.reported();
            ours.extend(c.view.held_by_us.iter().cloned());
            hints.extend(c.view.hints.iter().map(|(k, v)| (k.clone(), *v)));
        }
        for job in &self.jobs {
            if job.state.is_done()
                && self.lifecycles.jobs.get(&job.id) == Some(&Lifecycle::Finished)
            {
                continue;
            }
            let h = hints.get(&job.id).copied().unwrap_or_default();
            let by_webhook = self.webhook.as_ref().is_some_and(|w| w.holds(&job.id));
            let seen = Seen {
                held_by_us: ours.contains(&job.id) || by_webhook,
                capped: job.allocated.iter().any(|g| actuated.caps.contains_key(g)),
                suspended: h.suspended,
                requeued: h.requeued,
            };
            let Some(t) = self.lifecycles.observe(job, seen, now) else {
                continue;
            };
            info!(job = %t.job, from = ?t.from, to = %t.to, "{}", t.reason);
            if let Some(w) = self.webhook.as_mut() {
                w.notice(job, &t, actuated, now, tx);
            }
            tx.put_record(LIFECYCLES, &t.job, &t.to);
            tx.append_record(TRANSITIONS, &t);
            self.transitions += 1;
            if self.recent.len() == RECENT {
                self.recent.pop_front();
            }
            self.recent.push_back(t);
        }
    }

    /// Stops the reconcilers (the shutdown token is cancelled by the caller): waits up
    /// to `grace` for each to finish its call, committing their writes meanwhile.
    pub fn stop(&mut self, store: &mut Store, grace: Duration) {
        let end = Instant::now() + grace;
        while Instant::now() < end && self.reconcilers.iter().any(|r| !r.is_finished()) {
            self.writes.commit_waiting(store, Duration::from_millis(20));
        }
        for r in &mut self.reconcilers {
            if !r.join() {
                warn!(scheduler = %r.id, grace_s = grace.as_secs_f64(), "scheduler reconciler still in a call after the grace timeout; left to end");
            }
        }
        self.writes.commit_waiting(store, Duration::ZERO);
    }

    /// What `/api/v1/schedulers` shows.
    pub fn status(&self) -> serde_json::Value {
        let mut by: BTreeMap<SchedulerId, serde_json::Value> = BTreeMap::new();
        let mut reconcilers = serde_json::Map::new();
        for r in &self.reconcilers {
            let c = r.reported();
            if r.reports {
                by.insert(r.id, c.status.clone());
            }
            reconcilers.insert(
                r.id.to_string(),
                json!({
                    "polls": c.polls,
                    "passes": c.passes,
                    "last_pass": c.last_pass,
                    "in_call_s": c.busy_since.map(|t| t.elapsed().as_secs_f64()),
                    "acks_dropped": c.acks_dropped,
                }),
            );
        }
        let lifecycle: BTreeMap<&String, &Lifecycle> = self
            .lifecycles
            .jobs
            .iter()
            .filter(|(_, l)| **l != Lifecycle::Finished)
            .collect();
        // every adapter's status under its name (null: not configured); the
        // webhook's own section shows its deliveries
        let mut out = serde_json::Map::new();
        for id in SchedulerId::all() {
            out.insert(id.to_string(), json!(by.get(&id)));
        }
        out.insert(
            WEBHOOK.to_string(),
            json!(self.webhook.as_ref().map(Webhook::status)),
        );
        let rest = json!({
            "lifecycle": lifecycle,
            "transitions": self.recent,
            "reconcilers": reconcilers,
            "applied": self.acks,
            "requeues_waiting": self.requeues.keys().collect::<Vec<_>>(),
        });
        if let serde_json::Value::Object(rest) = rest {
            out.extend(rest);
        }
        serde_json::Value::Object(out)
    }

    /// Counters for `/metrics`: (name, help, value).
    pub fn counters(&self) -> Vec<Counter> {
        let mut out = Vec::new();
        let (mut passes, mut in_call) = (0u64, 0f64);
        for r in &self.reconcilers {
            let c = r.reported();
            if r.reports {
                out.extend(c.counters.iter().copied());
            }
            passes += c.passes;
            in_call = in_call.max(c.busy_since.map_or(0.0, |t| t.elapsed().as_secs_f64()));
        }
        if let Some(w) = &self.webhook {
            out.extend(w.counters());
        }
        if !self.reconcilers.is_empty() {
            out.extend([
                (
                    "scheduler_reconcile_passes_total",
                    "Passes of the scheduler reconcilers (desired state applied)",
                    passes as f64,
                ),
                (
                    "scheduler_acks_total",
                    "Scheduler actions the reconcilers reported applied",
                    self.acks_total as f64,
                ),
                (
                    "scheduler_call_in_progress_seconds",
                    "How long the longest scheduler call now in progress has run (0: none)",
                    in_call,
                ),
                (
                    "scheduler_store_write_errors_total",
                    "Reconciler store writes the store refused (not acted on, retried)",
                    self.writes.failed as f64,
                ),
            ]);
        }
        out
    }
}
