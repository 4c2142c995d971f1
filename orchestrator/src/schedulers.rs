//! The schedulers `serve` steers: the `[schedulers]` config section, the job view the
//! control loop evaluates, the plan's holds applied to each scheduler, and every job's
//! lifecycle (pending, held, released, running, capped, suspended, requeued, finished)
//! with each transition stored and logged.
//!
//! Each tick: [`Schedulers::jobs`] polls the schedulers when due (a failed poll keeps
//! the last view), the control loop evaluates the policy on them, then
//! [`Schedulers::apply`] brings each scheduler's holds to what is in force (the plan
//! with the operators' overrides). Applying is idempotent and failed calls are retried
//! on the next tick; which holds are powerplane's is kept in the store (see
//! [`integrations::slurm_sync`]), so a restart neither loses nor duplicates a hold.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;
use integrations::kubernetes::{KubeHttp, KubeSync, NodeCondition, PodMapping};
use integrations::slurm::{Client, Endpoint, JobMapping};
use integrations::slurm_sync::SlurmSync;
use integrations::store::{Store, Tx};
use integrations::webhook::{
    Action as WebhookAction, JobEvent, Outbox, OutboxConfig, Rejected, WebhookKey,
    SIGNATURE_HEADER, TIMESTAMP_HEADER,
};
use integrations::webhook_guard::{PerMinute, ReplayWindow};
use policies::State;
use serde::Deserialize;
use serde_json::json;
use telemetry::{Job, Timestamp};
use tracing::{info, warn};

use crate::registry::{Lifecycle, Lifecycles, Seen, Transition, LIFECYCLES, TRANSITIONS};

/// `[schedulers]` in `powerplane.toml`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SchedulersSection {
    #[serde(default)]
    pub slurm: Option<SlurmSection>,
    #[serde(default)]
    pub webhook: Option<WebhookSection>,
    #[serde(default)]
    pub kubernetes: Option<KubernetesSection>,
}

/// `[schedulers.kubernetes]`: scheduling gates and the scheduler extender.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KubernetesSection {
    /// The API server, over plain HTTP (`kubectl proxy`): `http://127.0.0.1:8001`.
    pub api: String,
    /// A bearer token for the API server (a service account's).
    #[serde(default)]
    pub token_file: Option<PathBuf>,
    #[serde(default = "default_poll")]
    pub poll_s: f64,
    #[serde(default = "default_timeout")]
    pub timeout_s: f64,
    /// The gate, the class label, the deferrable classes.
    #[serde(default)]
    pub pods: PodMapping,
    /// Kubernetes node name → the site file's node id, where they differ.
    #[serde(default)]
    pub node_names: BTreeMap<String, String>,
}

/// What the admission and extender endpoints need.
pub struct KubeHooks {
    pub pods: PodMapping,
    pub node_names: BTreeMap<String, String>,
}

impl KubeHooks {
    /// Per Kubernetes node: the share of its GPUs capped, and whether its rack is
    /// being stepped down for heat (a thermal level below 1).
    pub fn conditions(
        &self,
        site: &telemetry::Site,
        state: &State,
    ) -> BTreeMap<String, NodeCondition> {
        let by_site: BTreeMap<&str, &str> = self
            .node_names
            .iter()
            .map(|(k, v)| (v.as_str(), k.as_str()))
            .collect();
        site.nodes
            .iter()
            .map(|n| {
                let capped = (0..n.gpus)
                    .filter(|i| {
                        state
                            .caps
                            .contains_key(&telemetry::EntityId::gpu(&n.id, *i))
                    })
                    .count();
                let hot = state.thermal.get(&n.rack).is_some_and(|t| t.fraction < 1.0);
                let name = by_site.get(n.id.as_str()).copied().unwrap_or(&n.id);
                (
                    name.to_string(),
                    NodeCondition {
                        capped: if n.gpus == 0 {
                            0.0
                        } else {
                            capped as f64 / f64::from(n.gpus)
                        },
                        hot,
                    },
                )
            })
            .collect()
    }
}

/// `[schedulers.webhook]`: any scheduler, through signed webhooks.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebhookSection {
    /// The shared key (hex, `openssl rand -hex 32`): verifies inbound events, signs
    /// outbound actions.
    pub key_file: PathBuf,
    /// Where actions are POSTed (`http://host:port/path`); without it, none are sent.
    #[serde(default)]
    pub url: Option<String>,
    /// Inbound timestamps further than this from the clock are refused.
    #[serde(default = "default_tolerance")]
    pub tolerance_s: f64,
    /// An event is answered 202 once it is stored (on the next tick); if that takes
    /// longer than this, 503 (the event is still taken: resending is harmless).
    #[serde(default = "default_ack_wait")]
    pub ack_wait_s: f64,
    #[serde(default = "default_attempts")]
    pub max_attempts: u32,
    /// The first retry waits about this long; each next one twice as long.
    #[serde(default = "default_backoff")]
    pub backoff_s: f64,
    #[serde(default = "default_max_backoff")]
    pub max_backoff_s: f64,
    #[serde(default = "default_hook_timeout")]
    pub timeout_s: f64,
    /// Deliveries tried per tick at most.
    #[serde(default = "default_per_tick")]
    pub per_tick: usize,
    /// Classes deferrable unless an event says otherwise.
    #[serde(default = "default_deferrable")]
    pub deferrable_classes: Vec<String>,
    /// Events taken per minute at most, signed ones and those with operator tokens
    /// each; beyond it, 429.
    #[serde(default = "default_events_per_minute")]
    pub events_per_minute: u32,
}

fn default_events_per_minute() -> u32 {
    6000
}

fn default_tolerance() -> f64 {
    300.0
}
fn default_ack_wait() -> f64 {
    30.0
}
fn default_attempts() -> u32 {
    12
}
fn default_backoff() -> f64 {
    1.0
}
fn default_max_backoff() -> f64 {
    300.0
}
fn default_hook_timeout() -> f64 {
    5.0
}
fn default_per_tick() -> usize {
    50
}
fn default_deferrable() -> Vec<String> {
    vec!["batch".into(), "training".into()]
}

/// `[schedulers.slurm]`: slurmrestd, and how its jobs map to powerplane's.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SlurmSection {
    /// `unix:/path/to/slurmrestd.sock` (rest_auth/local) or `http://host:port`.
    pub endpoint: String,
    /// Sent as `X-SLURM-USER-NAME` (root on the unix socket may act as any user).
    #[serde(default)]
    pub user: Option<String>,
    /// Seconds between polls of the job list (0: every tick).
    #[serde(default = "default_poll")]
    pub poll_s: f64,
    #[serde(default = "default_timeout")]
    pub timeout_s: f64,
    /// The `scontrol` that requeues (slurmrestd v0.0.38 cannot).
    #[serde(default = "default_scontrol")]
    pub scontrol: PathBuf,
    /// `begin_time` (the default: the job's begin time is the lease, so Slurm starts
    /// it if powerplane stops renewing — no job stays held past its lease, even with a
    /// dead controller) or `hold` (JobHeldAdmin until released).
    #[serde(default = "default_hold_with")]
    pub hold_with: integrations::slurm_sync::HoldWith,
    #[serde(default)]
    pub mapping: JobMapping,
}

fn default_poll() -> f64 {
    15.0
}

fn default_hold_with() -> integrations::slurm_sync::HoldWith {
    integrations::slurm_sync::HoldWith::BeginTime
}
fn default_timeout() -> f64 {
    10.0
}
fn default_scontrol() -> PathBuf {
    PathBuf::from("scontrol")
}

/// Checks the section before anything starts (`base`: the config file's folder).
pub fn check(s: &SchedulersSection, file: &str, base: &std::path::Path) -> Result<()> {
    if let Some(k) = &s.kubernetes {
        anyhow::ensure!(
            k.api.starts_with("http://"),
            "{file}: [schedulers.kubernetes] api {:?}: only http:// (kubectl proxy)",
            k.api
        );
        anyhow::ensure!(
            k.poll_s >= 0.0 && k.timeout_s > 0.0 && !k.pods.gate.is_empty(),
            "{file}: [schedulers.kubernetes] needs poll_s >= 0, timeout_s > 0 and a gate name"
        );
        if let Some(t) = &k.token_file {
            std::fs::read_to_string(crate::serve::resolve(base, t))
                .map_err(|e| anyhow::anyhow!("{file}: [schedulers.kubernetes] token_file: {e}"))?;
        }
    }
    if let Some(w) = &s.webhook {
        read_key(&crate::serve::resolve(base, &w.key_file))?;
        if let Some(u) = &w.url {
            anyhow::ensure!(
                u.starts_with("http://"),
                "{file}: [schedulers.webhook] url {u:?}: only http:// (put a TLS proxy in front for https)"
            );
        }
        anyhow::ensure!(
            w.tolerance_s > 0.0
                && w.ack_wait_s > 0.0
                && w.backoff_s > 0.0
                && w.max_backoff_s >= w.backoff_s
                && w.timeout_s > 0.0
                && w.max_attempts >= 1
                && w.per_tick >= 1
                && w.events_per_minute >= 1,
            "{file}: [schedulers.webhook] needs tolerance_s, backoff_s, timeout_s above 0, max_backoff_s >= backoff_s, max_attempts, per_tick and events_per_minute at least 1"
        );
    }
    if let Some(sl) = &s.slurm {
        Endpoint::parse(&sl.endpoint)
            .map_err(|e| anyhow::anyhow!("{file}: [schedulers.slurm] endpoint {e}"))?;
        anyhow::ensure!(
            sl.poll_s >= 0.0 && sl.poll_s.is_finite(),
            "{file}: [schedulers.slurm] poll_s must be 0 or more, got {}",
            sl.poll_s
        );
        anyhow::ensure!(
            sl.timeout_s > 0.0 && sl.timeout_s <= 300.0,
            "{file}: [schedulers.slurm] timeout_s must be within (0, 300], got {}",
            sl.timeout_s
        );
        anyhow::ensure!(
            sl.mapping.default_duration_s > 0.0,
            "{file}: [schedulers.slurm.mapping] default_duration_s must be above 0"
        );
    }
    Ok(())
}

fn read_key(path: &std::path::Path) -> Result<WebhookKey> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| anyhow::anyhow!("cannot read the webhook key {}: {e}", path.display()))?;
    WebhookKey::from_text(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
}

/// Inbound job events, shared with the HTTP server.
pub struct Inbox {
    key: WebhookKey,
    tolerance_s: f64,
    ack_wait: Duration,
    stored: std::sync::Condvar,
    deferrable_classes: Vec<String>,
    inner: std::sync::Mutex<InboxInner>,
}

struct InboxInner {
    jobs: BTreeMap<String, Job>,
    /// Finished and cancelled jobs, most recent last (at most [`DONE_KEPT`]): an event
    /// for one of them does not bring it back.
    done: BTreeMap<String, Job>,
    done_order: std::collections::VecDeque<String>,
    /// Signatures of the events taken while their timestamps are accepted.
    window: ReplayWindow,
    per_minute: PerMinute,
    log: telemetry::sources::log_limit::LogLimiter,
    /// Events taken so far, handed to the loop so far, stored so far.
    seq: u64,
    taken: u64,
    committed: u64,
    accepted: u64,
    rejected: BTreeMap<&'static str, u64>,
}

/// A signed event's id in the replay window: its signature, as verified.
fn replay_id(signature: &str) -> String {
    signature
        .trim()
        .trim_start_matches("sha256=")
        .to_ascii_lowercase()
}

/// Finished jobs the inbox remembers at most (the oldest are forgotten first).
const DONE_KEPT: usize = 50_000;

impl InboxInner {
    fn new(
        jobs: BTreeMap<String, Job>,
        done: Vec<Job>,
        events_per_minute: u32,
        tolerance_s: f64,
    ) -> Self {
        // every event taken within twice the tolerance is remembered: the rate
        // limit bounds how many that are (two credentials' worth, with room)
        let minutes = (2.0 * tolerance_s / 60.0).ceil().max(1.0) as usize;
        let cap = (events_per_minute as usize)
            .saturating_mul(minutes)
            .saturating_mul(2)
            .max(1024);
        let mut inner = InboxInner {
            jobs,
            done: BTreeMap::new(),
            done_order: Default::default(),
            window: ReplayWindow::new(cap),
            per_minute: PerMinute::new(events_per_minute),
            log: telemetry::sources::log_limit::LogLimiter::new(Duration::from_secs(30)),
            seq: 0,
            taken: 0,
            committed: 0,
            accepted: 0,
            rejected: BTreeMap::new(),
        };
        for j in done {
            inner.remember_done(j);
        }
        inner
    }

    fn remember_done(&mut self, job: Job) {
        if self.done.insert(job.id.clone(), job.clone()).is_none() {
            self.done_order.push_back(job.id);
        }
        while self.done_order.len() > DONE_KEPT {
            if let Some(old) = self.done_order.pop_front() {
                self.done.remove(&old);
            }
        }
    }
}

impl Inbox {
    fn lock(&self) -> std::sync::MutexGuard<'_, InboxInner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Counts a request refused before it reached [`Inbox::receive`].
    pub fn reject(&self, reason: &'static str) {
        *self.lock().rejected.entry(reason).or_default() += 1;
    }

    /// Counts and logs (rate-limited) a refused event; the sender's answer.
    fn refuse(&self, reason: &'static str, status: u16, why: String) -> (u16, String) {
        let mut g = self.lock();
        *g.rejected.entry(reason).or_default() += 1;
        if let Some(left_out) = g.log.allow(reason, std::time::Instant::now()) {
            warn!(reason, status, left_out, "job event refused: {why}");
        }
        (status, why)
    }

    /// The checks between the parser and the registry: the field lengths, a replay of
    /// a signed event (remembered from here on), an event older than the job's last
    /// transition. `Ok(true)`: take the event; `Ok(false)`: it is already recorded
    /// (a repeat of a job's end), answer without taking it.
    fn guard(
        &self,
        event: &JobEvent,
        signed: Option<(&str, &str)>,
        now: Timestamp,
    ) -> std::result::Result<bool, (u16, String)> {
        use integrations::webhook_guard::check_lengths;
        if let Err(r) = check_lengths(event) {
            return Err(self.refuse(r.reason(), r.status(), format!("bad event: {r}")));
        }
        let mut g = self.lock();
        if let Some((ts, sig)) = signed {
            let secs: i64 = ts.trim().parse().unwrap_or(0);
            let forget_at = Timestamp::from_secs(secs).plus_secs(self.tolerance_s + 1.0);
            if let Err(r) = g.window.remember(&replay_id(sig), forget_at, now) {
                drop(g);
                return Err(self.refuse(r.reason(), r.status(), r.to_string()));
            }
        }
        let id = event.id();
        let at = event
            .time
            .as_deref()
            .and_then(|t| Timestamp::parse_rfc3339(t).ok())
            .unwrap_or(now);
        let Some(prior) = g.jobs.get(&id).or_else(|| g.done.get(&id)) else {
            return Ok(true);
        };
        if integrations::webhook_guard::is_stale(event, at, prior) {
            let why = format!(
                "job {id} is {:?} since {}: a {:?} event at {} does not change it",
                prior.state,
                integrations::webhook_guard::last_transition(prior),
                event.event,
                at
            );
            drop(g);
            return Err(self.refuse("stale", 409, why));
        }
        Ok(!prior.state.is_done())
    }

    /// Takes one event: authenticated by `bearer` (an operator token the caller
    /// checked) or by its signature headers. Returns the job id, or the status and
    /// why.
    pub fn receive(
        &self,
        bearer: bool,
        timestamp: Option<&str>,
        signature: Option<&str>,
        body: &[u8],
        now: Timestamp,
    ) -> std::result::Result<String, (u16, String)> {
        if !bearer {
            if let Err(r) = self
                .key
                .verify(timestamp, signature, body, now, self.tolerance_s)
            {
                let why = match r {
                    Rejected::Unsigned => format!("sign the event ({TIMESTAMP_HEADER}, {SIGNATURE_HEADER}) or send an operator bearer token"),
                    Rejected::Stale => format!("{TIMESTAMP_HEADER} is more than {} s from the controller's clock", self.tolerance_s),
                    Rejected::BadTimestamp => format!("{TIMESTAMP_HEADER} must be Unix seconds"),
                    _ => "bad signature".to_string(),
                };
                return Err(self.refuse(r.reason(), 401, why));
            }
        }
        // a replay is refused first, so that it costs the credential nothing
        let signed = timestamp.zip(signature).filter(|_| !bearer);
        if let Some(id) = signed.map(|(_, sig)| replay_id(sig)) {
            let seen = self.lock().window.seen(&id, now);
            if let Err(r) = seen {
                return Err(self.refuse(r.reason(), r.status(), r.to_string()));
            }
        }
        // authenticated: the credential's rate, before anything is parsed
        let taken = self
            .lock()
            .per_minute
            .take(if bearer { "bearer" } else { "signed" }, now);
        if let Err(r) = taken {
            return Err(self.refuse(r.reason(), r.status(), r.to_string()));
        }
        let event = match JobEvent::parse(body) {
            Ok(e) => e,
            Err(e) => {
                return Err(self.refuse(
                    Rejected::BadEvent.reason(),
                    400,
                    format!("bad event: {e}"),
                ))
            }
        };
        if !self.guard(&event, signed, now)? {
            return Ok(event.id());
        }
        let id = event.id();
        let mut g = self.lock();
        let job = event.apply(g.jobs.get(&id), &self.deferrable_classes, now);
        info!(job = %id, event = ?event.event, "job event");
        g.jobs.insert(id.clone(), job);
        g.accepted += 1;
        g.seq += 1;
        let mine = g.seq;
        // answer once the tick that takes the event has stored it
        let (g, timeout) = self
            .stored
            .wait_timeout_while(g, self.ack_wait, |g| g.committed < mine)
            .unwrap_or_else(|p| p.into_inner());
        let mut g = g;
        if timeout.timed_out() {
            if let Some(left_out) = g.log.allow("not_stored", std::time::Instant::now()) {
                warn!(job = %id, left_out, "job event taken but not yet stored");
            }
            return Err((
                503,
                "taken but not yet stored (the store may be down); resend it".into(),
            ));
        }
        drop(g);
        Ok(id)
    }

    /// The events handed to the loop are stored: their senders get their answer.
    pub fn stored(&self) {
        let mut g = self.lock();
        g.committed = g.taken;
        drop(g);
        self.stored.notify_all();
    }

    /// The jobs the events describe; finished ones are handed out once, then dropped.
    fn take(&self) -> Vec<Job> {
        let mut g = self.lock();
        g.log
            .warn_suppressed("job events", std::time::Instant::now());
        let out: Vec<Job> = g.jobs.values().cloned().collect();
        for j in out.iter().filter(|j| j.state.is_done()) {
            g.remember_done(j.clone());
        }
        g.jobs.retain(|_, j| !j.state.is_done());
        g.taken = g.seq;
        out
    }

    fn status(&self) -> serde_json::Value {
        let g = self.lock();
        json!({ "accepted": g.accepted, "rejected": g.rejected })
    }
}

const WEBHOOK_HOLDS: &str = "webhook_holds";
const WEBHOOK_SUSPENDED: &str = "webhook_suspended";

/// The schedulers of one `serve`.
pub struct Schedulers {
    slurm: Option<SlurmSync>,
    poll_s: f64,
    last_poll: Option<Timestamp>,
    /// The schedulers' last view of their jobs.
    jobs: Vec<Job>,
    lifecycles: Lifecycles,
    /// Transitions stored since start.
    pub transitions: u64,
    /// The most recent transitions, oldest first, for the API.
    recent: std::collections::VecDeque<Transition>,
    inbox: Option<std::sync::Arc<Inbox>>,
    outbox: Option<Outbox>,
    /// Webhook jobs held, with the `until` last sent.
    webhook_holds: BTreeMap<String, Timestamp>,
    /// Webhook jobs suspended.
    webhook_suspended: BTreeMap<String, Timestamp>,
    /// The dead-letter list, as last read from the store.
    dead: Vec<integrations::webhook::Delivery>,
    kube: Option<KubeSync<KubeHttp>>,
    kube_hooks: Option<std::sync::Arc<KubeHooks>>,
    kube_poll_s: f64,
    kube_last_poll: Option<Timestamp>,
    /// Each scheduler's last view of its jobs.
    slurm_jobs: Vec<Job>,
    kube_jobs: Vec<Job>,
}

const RECENT: usize = 1000;

impl Schedulers {
    /// Opens the configured schedulers and restores what the store knows of them
    /// (powerplane's holds, each job's lifecycle, the webhook outbox).
    pub fn open(
        section: Option<&SchedulersSection>,
        base: &std::path::Path,
        store: &mut Store,
    ) -> Result<Self> {
        let lifecycles = Lifecycles {
            jobs: store.records::<Lifecycle>(LIFECYCLES)?,
        };
        let mut poll_s = f64::INFINITY;
        let slurm = match section.and_then(|s| s.slurm.as_ref()) {
            Some(s) => {
                let endpoint = Endpoint::parse(&s.endpoint).map_err(anyhow::Error::msg)?;
                let mut client = Client::new(endpoint);
                client.user = s.user.clone();
                client.timeout = Duration::from_secs_f64(s.timeout_s);
                client.scontrol = s.scontrol.clone();
                let mut sync = SlurmSync::restore(client, s.mapping.clone(), store)?;
                sync.hold_with = s.hold_with;
                info!(endpoint = %s.endpoint, poll_s = s.poll_s, holds = sync.ours().len(), "steering Slurm through slurmrestd");
                poll_s = s.poll_s;
                Some(sync)
            }
            None => None,
        };
        let (mut inbox, mut outbox) = (None, None);
        if let Some(w) = section.and_then(|s| s.webhook.as_ref()) {
            let key = read_key(&crate::serve::resolve(base, &w.key_file))?;
            let (done, jobs): (Vec<Job>, Vec<Job>) = store
                .jobs()?
                .into_iter()
                .filter(|j| j.scheduler != "slurm")
                .partition(|j| j.state.is_done());
            let jobs = jobs.into_iter().map(|j| (j.id.clone(), j)).collect();
            // the most recently finished are remembered, so that no event brings them back
            let mut done: Vec<Job> = done
                .into_iter()
                .filter(|j| j.scheduler != "kubernetes")
                .collect();
            done.sort_by_key(integrations::webhook_guard::last_transition);
            let done = done.split_off(done.len().saturating_sub(DONE_KEPT));
            inbox = Some(std::sync::Arc::new(Inbox {
                key: key.clone(),
                tolerance_s: w.tolerance_s,
                ack_wait: Duration::from_secs_f64(w.ack_wait_s),
                stored: std::sync::Condvar::new(),
                deferrable_classes: w.deferrable_classes.clone(),
                inner: std::sync::Mutex::new(InboxInner::new(
                    jobs,
                    done,
                    w.events_per_minute,
                    w.tolerance_s,
                )),
            }));
            if let Some(url) = &w.url {
                let o = Outbox::restore(
                    OutboxConfig {
                        url: url.clone(),
                        timeout: Duration::from_secs_f64(w.timeout_s),
                        max_attempts: w.max_attempts,
                        backoff_s: w.backoff_s,
                        max_backoff_s: w.max_backoff_s,
                        per_pass: w.per_tick,
                    },
                    key,
                    store,
                )?;
                info!(url = %url, waiting = o.pending().len(), "sending scheduler actions as signed webhooks");
                outbox = Some(o);
            }
        }
        let (mut kube, mut kube_hooks, mut kube_poll_s) = (None, None, f64::INFINITY);
        if let Some(k) = section.and_then(|s| s.kubernetes.as_ref()) {
            let token = match &k.token_file {
                Some(t) => Some(
                    std::fs::read_to_string(crate::serve::resolve(base, t))?
                        .trim()
                        .to_string(),
                ),
                None => None,
            };
            let api = KubeHttp {
                base: k.api.clone(),
                token,
                timeout: Duration::from_secs_f64(k.timeout_s),
            };
            info!(api = %k.api, gate = %k.pods.gate, "steering Kubernetes pods through scheduling gates");
            kube = Some(KubeSync::new(api, k.pods.clone()));
            kube_hooks = Some(std::sync::Arc::new(KubeHooks {
                pods: k.pods.clone(),
                node_names: k.node_names.clone(),
            }));
            kube_poll_s = k.poll_s;
        }
        let webhook_holds = store.records::<Timestamp>(WEBHOOK_HOLDS)?;
        let webhook_suspended = store.records::<Timestamp>(WEBHOOK_SUSPENDED)?;
        let dead = Outbox::dead(store)?;
        Ok(Schedulers {
            webhook_suspended,
            kube,
            kube_hooks,
            kube_poll_s,
            kube_last_poll: None,
            slurm_jobs: Vec::new(),
            kube_jobs: Vec::new(),
            inbox,
            outbox,
            webhook_holds,
            dead,
            slurm,
            poll_s,
            last_poll: None,
            jobs: Vec::new(),
            lifecycles,
            transitions: 0,
            recent: Default::default(),
        })
    }

    pub fn is_empty(&self) -> bool {
        self.slurm.is_none() && self.inbox.is_none() && self.kube.is_none()
    }

    /// What the Kubernetes admission and extender endpoints need.
    pub fn kube_hooks(&self) -> Option<std::sync::Arc<KubeHooks>> {
        self.kube_hooks.clone()
    }

    /// The tick that took the jobs has been stored: answer the events' senders.
    pub fn stored(&self) {
        if let Some(i) = &self.inbox {
            i.stored();
        }
    }

    /// Job events refused, by reason (with `[schedulers.webhook]`).
    pub fn events_rejected(&self) -> Option<BTreeMap<&'static str, u64>> {
        self.inbox.as_ref().map(|i| i.lock().rejected.clone())
    }

    /// Where the HTTP server puts inbound job events (with `[schedulers.webhook]`).
    pub fn inbox(&self) -> Option<std::sync::Arc<Inbox>> {
        self.inbox.clone()
    }

    /// The jobs to evaluate: polled from the schedulers when due, else the last view.
    pub fn jobs(&mut self, now: Timestamp, store: &mut Store) -> Vec<Job> {
        let due = self
            .last_poll
            .is_none_or(|t| now.secs_since(t) >= self.poll_s);
        if let (true, Some(s)) = (due, self.slurm.as_mut()) {
            self.last_poll = Some(now);
            match s.poll(now, store) {
                Ok(jobs) => self.slurm_jobs = jobs,
                Err(e) => {
                    warn!(error = %e, "Slurm poll failed; evaluating the last view of its jobs")
                }
            }
        }
        let due = self
            .kube_last_poll
            .is_none_or(|t| now.secs_since(t) >= self.kube_poll_s);
        if let (true, Some(k)) = (due, self.kube.as_mut()) {
            self.kube_last_poll = Some(now);
            match k.poll(now) {
                Ok(jobs) => self.kube_jobs = jobs,
                Err(e) => {
                    warn!(error = %e, "Kubernetes poll failed; evaluating the last view of its pods")
                }
            }
        }
        self.jobs = self.slurm_jobs.clone();
        self.jobs.extend(self.kube_jobs.iter().cloned());
        if let Some(inbox) = &self.inbox {
            self.jobs.extend(inbox.take());
        }
        self.jobs.clone()
    }

    /// Brings the schedulers' holds and suspensions to `actuated`, carries out the
    /// tick's requeue decisions, and records each job's lifecycle.
    pub fn apply(
        &mut self,
        actuated: &State,
        decisions: &[policies::Decision],
        now: Timestamp,
        store: &mut Store,
    ) {
        if let Some(s) = self.slurm.as_mut() {
            for a in s.apply(&actuated.holds, now, store) {
                info!(job = %a.job, action = a.action, "{}", a.detail);
            }
            for a in s.apply_suspensions(&actuated.suspended, now, store) {
                info!(job = %a.job, action = a.action, "{}", a.detail);
            }
        }
        let mut requeues = Vec::new();
        for d in decisions {
            if let (policies::Action::Requeue, policies::Target::Job { job }, false) =
                (&d.action, &d.target, d.observe_only)
            {
                requeues.push((job.clone(), d.reason.clone()));
            }
        }
        for (job, _) in &requeues {
            if job.starts_with("slurm:") {
                if let Some(s) = self.slurm.as_mut() {
                    match s.requeue(job) {
                        Ok(()) => info!(job = %job, "requeued in Slurm"),
                        Err(e) => warn!(job = %job, error = %e, "Slurm requeue failed"),
                    }
                }
            } else if job.starts_with("k8s:") {
                warn!(job = %job, "a Kubernetes pod cannot be requeued by powerplane; ignored");
            }
        }
        if let Some(k) = self.kube.as_mut() {
            for id in k.apply(&actuated.holds, now) {
                info!(job = %id, "scheduling gate removed: Kubernetes may schedule the pod");
            }
        }
        // held by powerplane: its Slurm holds and the pods its gate holds
        let mut ours: std::collections::BTreeSet<String> = self
            .slurm
            .as_ref()
            .map(|s| s.ours().into_keys().collect())
            .unwrap_or_default();
        if let Some(k) = &self.kube {
            ours.extend(k.gated());
        }
        let mut tx = Tx::new();
        if let Some(outbox) = self.outbox.as_mut() {
            webhook_holds(
                outbox,
                &mut self.webhook_holds,
                &self.jobs,
                actuated,
                now,
                &mut tx,
            );
            webhook_suspensions(
                outbox,
                &mut self.webhook_suspended,
                &self.jobs,
                actuated,
                now,
                &mut tx,
            );
            for (job, reason) in &requeues {
                if let Some(j) = self
                    .jobs
                    .iter()
                    .find(|j| &j.id == job && j.scheduler != "slurm" && j.scheduler != "kubernetes")
                {
                    outbox.enqueue(j, &WebhookAction::Requeue, reason, now, &mut tx);
                }
            }
        }
        for job in &self.jobs {
            if job.state.is_done()
                && self.lifecycles.jobs.get(&job.id) == Some(&Lifecycle::Finished)
            {
                continue;
            }
            let hints = self
                .slurm
                .as_ref()
                .map(|s| s.hints(&job.id))
                .unwrap_or_default();
            let seen = Seen {
                held_by_us: ours.contains(&job.id),
                capped: job.allocated.iter().any(|g| actuated.caps.contains_key(g)),
                suspended: hints.suspended,
                requeued: hints.requeued,
            };
            let held_by_us = seen.held_by_us || self.webhook_holds.contains_key(&job.id);
            let seen = Seen { held_by_us, ..seen };
            if let Some(t) = self.lifecycles.observe(job, seen, now) {
                info!(job = %t.job, from = ?t.from, to = %t.to, "{}", t.reason);
                if let (Some(outbox), true) = (
                    self.outbox.as_mut(),
                    job.scheduler != "slurm" && job.scheduler != "kubernetes",
                ) {
                    let capped = |s: &State| {
                        job.allocated
                            .iter()
                            .filter_map(|g| s.caps.get(g).map(|c| c.watts))
                            .fold(None, |m: Option<f64>, w| Some(m.map_or(w, |m| m.min(w))))
                    };
                    match (t.from, t.to) {
                        (_, Lifecycle::Capped) => outbox.enqueue(
                            job,
                            &WebhookAction::CapNotice {
                                watts: capped(actuated),
                            },
                            "the job's GPUs are capped",
                            now,
                            &mut tx,
                        ),
                        (Some(Lifecycle::Capped), Lifecycle::Running) => outbox.enqueue(
                            job,
                            &WebhookAction::CapNotice { watts: None },
                            "the job's GPUs are no longer capped",
                            now,
                            &mut tx,
                        ),
                        _ => {}
                    }
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
        if let Err(e) = store.commit(tx) {
            warn!(error = %e, "cannot store job transitions");
        }
        if let Some(outbox) = self.outbox.as_mut() {
            let dead = outbox.counters.dead;
            outbox.deliver(now, store);
            if outbox.counters.dead != dead {
                match Outbox::dead(store) {
                    Ok(d) => self.dead = d,
                    Err(e) => warn!(error = %e, "cannot read the webhook dead-letter list"),
                }
            }
        }
    }

    /// What `/api/v1/schedulers` shows.
    pub fn status(&self) -> serde_json::Value {
        let slurm = self.slurm.as_ref().map(|s| {
            json!({
                "endpoint": s.client.endpoint.to_string(),
                "counters": s.counters,
                "holds": s.ours(),
                "suspended": s.suspended(),
            })
        });
        let lifecycle: BTreeMap<&String, &Lifecycle> = self
            .lifecycles
            .jobs
            .iter()
            .filter(|(_, l)| **l != Lifecycle::Finished)
            .collect();
        let webhook = self.inbox.as_ref().map(|i| {
            json!({
                "inbound": i.status(),
                "outbound": self.outbox.as_ref().map(|o| json!({
                    "url": o.config.url,
                    "counters": o.counters,
                    "waiting": o.pending(),
                })),
                "holds": self.webhook_holds,
                "suspended": self.webhook_suspended,
                "dead_letters": self.dead,
            })
        });
        let kubernetes = self.kube.as_ref().map(|k| {
            json!({
                "api": k.api.base,
                "gate": k.mapping.gate,
                "gated": k.gated(),
                "counters": k.counters,
            })
        });
        json!({
            "slurm": slurm,
            "kubernetes": kubernetes,
            "webhook": webhook,
            "lifecycle": lifecycle,
            "transitions": self.recent,
        })
    }

    /// Counters for `/metrics`: (name, help, value).
    pub fn counters(&self) -> Vec<(&'static str, &'static str, f64)> {
        let mut out = Vec::new();
        if let Some(k) = &self.kube {
            let c = &k.counters;
            out.extend([
                (
                    "kubernetes_polls_total",
                    "Polls of the Kubernetes API for pods",
                    c.polls as f64,
                ),
                (
                    "kubernetes_poll_errors_total",
                    "Polls of the Kubernetes API that failed",
                    c.poll_errors as f64,
                ),
                (
                    "kubernetes_gates_removed_total",
                    "Scheduling gates powerplane removed",
                    c.gates_removed as f64,
                ),
                (
                    "kubernetes_errors_total",
                    "Gate removals that failed (retried)",
                    c.errors as f64,
                ),
                (
                    "kubernetes_pods_gated",
                    "Pods powerplane's gate holds now",
                    k.gated().len() as f64,
                ),
            ]);
        }
        if let Some(o) = &self.outbox {
            let c = &o.counters;
            out.extend([
                (
                    "webhook_actions_enqueued_total",
                    "Scheduler actions queued for the webhook",
                    c.enqueued as f64,
                ),
                (
                    "webhook_actions_delivered_total",
                    "Scheduler actions the webhook receiver took",
                    c.delivered as f64,
                ),
                (
                    "webhook_delivery_failures_total",
                    "Webhook delivery attempts that failed (retried with backoff)",
                    c.failed_attempts as f64,
                ),
                (
                    "webhook_actions_dead_total",
                    "Scheduler actions dead-lettered",
                    c.dead as f64,
                ),
                (
                    "webhook_actions_waiting",
                    "Scheduler actions in the outbox",
                    o.pending().len() as f64,
                ),
            ]);
        }
        if let Some(i) = &self.inbox {
            let g = i.lock();
            out.push((
                "webhook_events_accepted_total",
                "Job events accepted",
                g.accepted as f64,
            ));
            out.push((
                "webhook_events_rejected_total",
                "Job events refused (bad signature, stale timestamp, bad token, bad event, too large)",
                g.rejected.values().sum::<u64>() as f64,
            ));
        }
        let Some(s) = &self.slurm else {
            return out;
        };
        let c = &s.counters;
        out.extend(vec![
            (
                "slurm_polls_total",
                "Polls of slurmrestd's job list",
                c.polls as f64,
            ),
            (
                "slurm_poll_errors_total",
                "Polls of slurmrestd that failed",
                c.poll_errors as f64,
            ),
            (
                "slurm_holds_total",
                "Holds powerplane placed in Slurm",
                c.holds as f64,
            ),
            (
                "slurm_releases_total",
                "Holds powerplane released in Slurm",
                c.releases as f64,
            ),
            (
                "slurm_action_errors_total",
                "Slurm hold, release and requeue calls that failed (retried)",
                c.action_errors as f64,
            ),
            (
                "slurm_released_externally_total",
                "Holds of powerplane's someone else released",
                c.released_externally as f64,
            ),
            (
                "slurm_holds_in_force",
                "Slurm jobs powerplane holds now",
                s.ours().len() as f64,
            ),
        ]);
        out
    }
}

/// Holds and releases for the jobs of webhook schedulers: a hold when the plan holds
/// a job, again (with the later `until`) once half of the last one has passed, and a
/// release when the plan lets go.
fn webhook_holds(
    outbox: &mut Outbox,
    sent: &mut BTreeMap<String, Timestamp>,
    jobs: &[Job],
    actuated: &State,
    now: Timestamp,
    tx: &mut Tx,
) {
    let by_id: BTreeMap<&str, &Job> = jobs
        .iter()
        .filter(|j| j.scheduler != "slurm" && j.scheduler != "kubernetes")
        .map(|j| (j.id.as_str(), j))
        .collect();
    for (id, h) in &actuated.holds {
        let Some(job) = by_id.get(id.as_str()) else {
            continue;
        };
        if h.lease_until <= now {
            continue;
        }
        let due = match sent.get(id) {
            None => true,
            Some(until) => until.secs_since(now) < h.lease_until.secs_since(now) / 2.0,
        };
        if due {
            outbox.enqueue(
                job,
                &WebhookAction::Hold {
                    until: h.lease_until.to_datetime().to_rfc3339(),
                },
                &h.reason,
                now,
                tx,
            );
            sent.insert(id.clone(), h.lease_until);
            tx.put_record(WEBHOOK_HOLDS, id, &h.lease_until);
        }
    }
    let released: Vec<String> = sent
        .keys()
        .filter(|id| actuated.holds.get(*id).is_none_or(|h| h.lease_until <= now))
        .cloned()
        .collect();
    for id in released {
        sent.remove(&id);
        tx.delete_record(WEBHOOK_HOLDS, &id);
        match by_id.get(id.as_str()) {
            Some(job) if !job.state.is_done() => outbox.enqueue(
                job,
                &WebhookAction::Release,
                "the plan no longer holds the job",
                now,
                tx,
            ),
            _ => {}
        }
    }
}

/// Suspend and resume actions for the jobs of webhook schedulers, from the plan's
/// suspensions.
fn webhook_suspensions(
    outbox: &mut Outbox,
    sent: &mut BTreeMap<String, Timestamp>,
    jobs: &[Job],
    actuated: &State,
    now: Timestamp,
    tx: &mut Tx,
) {
    let by_id: BTreeMap<&str, &Job> = jobs
        .iter()
        .filter(|j| j.scheduler != "slurm" && j.scheduler != "kubernetes")
        .map(|j| (j.id.as_str(), j))
        .collect();
    for (id, h) in &actuated.suspended {
        let Some(job) = by_id.get(id.as_str()) else {
            continue;
        };
        if h.lease_until <= now || sent.contains_key(id) {
            continue;
        }
        outbox.enqueue(job, &WebhookAction::Suspend, &h.reason, now, tx);
        sent.insert(id.clone(), h.lease_until);
        tx.put_record(WEBHOOK_SUSPENDED, id, &h.lease_until);
    }
    let resumed: Vec<String> = sent
        .keys()
        .filter(|id| {
            actuated
                .suspended
                .get(*id)
                .is_none_or(|h| h.lease_until <= now)
        })
        .cloned()
        .collect();
    for id in resumed {
        sent.remove(&id);
        tx.delete_record(WEBHOOK_SUSPENDED, &id);
        if let Some(job) = by_id.get(id.as_str()).filter(|j| !j.state.is_done()) {
            outbox.enqueue(
                job,
                &WebhookAction::Resume,
                "the plan resumes the job",
                now,
                tx,
            );
        }
    }
}
