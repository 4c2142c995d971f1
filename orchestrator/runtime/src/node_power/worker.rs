//! Node power in `serve`: the decisions of `policies::node_power` carried out on the
//! nodes the `[node_power]` section binds, through one of two backends (see
//! [`crate::node_power`]):
//! - `backend = "slurm"`: Slurm's power saving (`scontrol update nodename=<n>
//!   state=power_down|power_up`, the state read back from `scontrol show node`), each
//!   site node bound to its Slurm node name in `nodes`;
//! - `backend = "redfish"` (the default): Redfish `ComputerSystem.Reset`, each site
//!   node bound to its Redfish system in `systems`.
//!
//! The tick decides and hands commands to a thread of its own, which makes the
//! blocking calls (each with its deadline) and polls the nodes' power states; the tick
//! never waits on a BMC or on Slurm. Only the acting leader decides or commands.
//!
//! Leases: neither a BMC nor Slurm keeps a lease for the controller, so it keeps it:
//! - on take-over (the first tick as leader, a new term), every bound node the backend
//!   reports off is powered up before this controller decides anything: whatever a
//!   controller that died left off comes back;
//! - at step-down and at shutdown, every node this controller powered down is powered
//!   up (at shutdown the thread is given `timeout_s` per node to send it).
//!
//! The limit: a controller killed outright (SIGKILL, a host lost) with no replica to
//! take over leaves its nodes off until a controller starts again; with the Slurm
//! backend, Slurm itself resumes a powered-down node that a job needs.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::Result;
use policies::node_power::{Inputs, Need, NodeAction, NodePowerRule, NodeView, Power};
use serde::Deserialize;
use telemetry::{EntityId, Job, JobState, Sample, Site, Timestamp};
use tracing::{info, warn};

use crate::node_power::{PowerState, RedfishPower, SlurmPower};

/// How node power is actuated.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// Redfish `ComputerSystem.Reset` on the node's BMC.
    #[default]
    Redfish,
    /// Slurm's power saving (`scontrol` power down / up).
    Slurm,
}

/// `[node_power]`: the backend and what each managed node is to it.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodePowerSection {
    #[serde(default)]
    pub backend: Backend,
    /// Redfish: `https://host:port` of the Redfish service.
    #[serde(default)]
    pub url: Option<String>,
    /// Redfish: how to log in, as `[[redfish.endpoints]]`: `{ kind = "basic", username
    /// = "...", password_file = "..." }` (HTTP Basic on every call) or `kind =
    /// "session"` (one Redfish session, logged in again when it expires).
    #[serde(default)]
    pub auth: sources::redfish::Auth,
    /// Redfish: how the BMC's certificate is trusted, as `[[redfish.endpoints]]`:
    /// `{ ca_file = "..." }` (beside the system's roots), `{ pinned_sha256 = "..." }`
    /// or `{ insecure = true }`; `client_cert_file` / `client_key_file` for mutual TLS.
    #[serde(default)]
    pub tls: sources::tls::Tls,
    /// Deadline of every Redfish call, s.
    #[serde(default = "default_timeout")]
    pub timeout_s: f64,
    /// How often the systems' power states are read, s.
    #[serde(default = "default_poll")]
    pub poll_s: f64,
    /// Redfish: node id → the system's `@odata.id` (`/redfish/v1/Systems/...`).
    /// Nodes not listed are never powered down.
    #[serde(default)]
    pub systems: BTreeMap<String, String>,
    /// Slurm: node id → the node's Slurm name. Nodes not listed are never powered
    /// down.
    #[serde(default)]
    pub nodes: BTreeMap<String, String>,
    /// Slurm: `"scontrol"` (the default), or the command that runs it, as a list
    /// (`["chroot", "/srv/slurm", "scontrol"]`).
    #[serde(
        default = "integrations::slurm_api::client::default_scontrol",
        deserialize_with = "integrations::slurm_api::client::one_or_many"
    )]
    pub scontrol: Vec<String>,
}

impl NodePowerSection {
    /// The Redfish service as an endpoint of the Redfish client (named `node-power`):
    /// its URL, auth, TLS and deadline.
    pub fn endpoint(&self) -> sources::redfish::EndpointConfig {
        let mut e = sources::redfish::EndpointConfig::new(
            "node-power",
            self.url
                .as_deref()
                .unwrap_or_default()
                .trim_end_matches('/'),
        );
        e.auth = self.auth.clone();
        e.tls = self.tls.clone();
        e.timeout_s = self.timeout_s;
        e
    }

    /// The bound nodes: site node id → the backend's name of it.
    pub fn targets(&self) -> &BTreeMap<String, String> {
        match self.backend {
            Backend::Redfish => &self.systems,
            Backend::Slurm => &self.nodes,
        }
    }

    /// What is wrong with the section, against the site (`serve --check` reports
    /// them all; `serve` refuses to start on any).
    pub fn problems(&self, site: &Site) -> Vec<String> {
        let mut bad = Vec::new();
        let (list, other, other_name) = match self.backend {
            Backend::Redfish => ("systems", &self.nodes, "nodes"),
            Backend::Slurm => ("nodes", &self.systems, "systems"),
        };
        let backend = match self.backend {
            Backend::Redfish => "redfish",
            Backend::Slurm => "slurm",
        };
        if self.backend == Backend::Slurm
            && (self.auth != sources::redfish::Auth::None
                || self.tls != sources::tls::Tls::default())
        {
            bad.push(
                "[node_power] auth and tls are for backend = \"redfish\"; backend = \"slurm\" runs scontrol"
                    .into(),
            );
        }
        if let Err(e) = sources::tls::client_config(&self.tls) {
            bad.push(format!("[node_power] {e}"));
        }
        match (self.backend, &self.url) {
            (Backend::Redfish, None) => {
                bad.push("[node_power] backend = \"redfish\" needs url".into())
            }
            (Backend::Redfish, Some(u))
                if !(u.starts_with("https://") || u.starts_with("http://")) =>
            {
                bad.push(format!(
                    "[node_power] url {u:?}: an https:// (or http://) URL"
                ))
            }
            (Backend::Slurm, Some(_)) => bad.push(
                "[node_power] url is for backend = \"redfish\"; backend = \"slurm\" runs scontrol"
                    .into(),
            ),
            _ => {}
        }
        if !other.is_empty() {
            bad.push(format!(
                "[node_power] {other_name} is not read with backend = \"{backend}\" (it binds nodes in {list})"
            ));
        }
        if self.targets().is_empty() {
            bad.push(format!(
                "[node_power] {list}: no node bound (backend = \"{backend}\")"
            ));
        }
        for node in self.targets().keys() {
            if !site.nodes.iter().any(|n| &n.id == node) {
                bad.push(format!(
                    "[node_power.{list}]: {node} is not a node of the site"
                ));
            }
        }
        if self.backend == Backend::Redfish && !(0.1..=120.0).contains(&self.timeout_s) {
            bad.push(format!(
                "[node_power] timeout_s must be within 0.1..=120 with backend = \"redfish\" (got {})",
                self.timeout_s
            ));
        }
        if self.backend == Backend::Slurm && self.scontrol.first().is_none_or(|c| c.is_empty()) {
            bad.push("[node_power] scontrol must name a command".into());
        }
        if !(self.timeout_s > 0.0
            && self.timeout_s.is_finite()
            && self.poll_s > 0.0
            && self.poll_s.is_finite())
        {
            bad.push(format!(
                "[node_power] timeout_s and poll_s must be positive (got {} and {})",
                self.timeout_s, self.poll_s
            ));
        }
        bad
    }
}

/// A node power backend, as the thread uses it: `target` is the backend's name of the
/// node (a Redfish system, a Slurm node name).
trait Switch: Send {
    fn state(&self, target: &str) -> Result<PowerState>;
    fn set(&self, target: &str, on: bool) -> Result<()>;
}

impl Switch for RedfishPower {
    fn state(&self, target: &str) -> Result<PowerState> {
        self.power_state(target)
    }
    fn set(&self, target: &str, on: bool) -> Result<()> {
        self.reset(target, if on { "On" } else { "GracefulShutdown" })
    }
}

impl Switch for SlurmPower {
    fn state(&self, target: &str) -> Result<PowerState> {
        self.power_state(target)
    }
    fn set(&self, target: &str, on: bool) -> Result<()> {
        if on {
            self.power_up(target)
        } else {
            self.power_down(target)
        }
    }
}

fn default_timeout() -> f64 {
    5.0
}
fn default_poll() -> f64 {
    5.0
}

/// Commands waiting for the thread. Bounded: when full the command is dropped and
/// counted, and the node's state is left as it was, so the next tick decides it again.
const COMMANDS: usize = 64;
/// Reports waiting for the tick. Bounded: when full a report is dropped and counted;
/// the next poll reports the same systems again.
const REPORTS: usize = 1024;

enum Command {
    Power {
        node: String,
        on: bool,
    },
    /// Power up every bound node the backend reports off (take-over).
    TakeOver,
}

enum Report {
    State { node: String, state: PowerState },
    Failed { node: String, error: String },
}

struct NodeState {
    power: Power,
    idle_since: Option<Timestamp>,
    /// Powered down by this controller (its lease covers it).
    ours: bool,
}

/// Counters on `/metrics`.
#[derive(Debug, Default, Clone, Copy)]
struct Counts {
    downs: u64,
    ups: u64,
    failed_resumes: u64,
    errors: u64,
    dropped: u64,
}

/// The counters the thread keeps (shared with the tick for `/metrics`).
#[derive(Debug, Default)]
struct ThreadCounts {
    /// Reports dropped (the queue to the tick was full).
    reports_dropped: std::sync::atomic::AtomicU64,
    /// Power state reads that failed (the node keeps its last state).
    poll_errors: std::sync::atomic::AtomicU64,
    /// Calls the backend refused for their credentials (Redfish 401 / 403).
    auth_failures: std::sync::atomic::AtomicU64,
}

pub struct NodePower {
    commands: SyncSender<Command>,
    reports: Receiver<Report>,
    thread: Option<JoinHandle<()>>,
    /// The nodes the section binds, in the site's order.
    nodes: BTreeMap<String, NodeState>,
    recent_downs: Vec<Timestamp>,
    acting: bool,
    counts: Counts,
    /// What the thread counts.
    thread_counts: Arc<ThreadCounts>,
}

/// What the pending and held jobs need: their GPUs, and when (see
/// `policies::node_power::due_at`).
fn needs(jobs: &[Job], planned: &BTreeMap<String, Timestamp>, now: Timestamp) -> Vec<Need> {
    jobs.iter()
        .filter_map(|j| {
            Some(Need {
                at: policies::node_power::due_at(j, planned.get(&j.id).copied(), now)?,
                gpus: j.gpus,
                model: None,
            })
        })
        .collect()
}

impl NodePower {
    /// Starts the thread; the section's nodes must be the site's.
    pub fn start(cfg: &NodePowerSection, site: &Site, now: Timestamp) -> Result<NodePower> {
        let bad = cfg.problems(site);
        anyhow::ensure!(bad.is_empty(), "{}", bad.join("; "));
        let timeout = Duration::from_secs_f64(cfg.timeout_s);
        let client: Box<dyn Switch> = match cfg.backend {
            Backend::Redfish => Box::new(RedfishPower::new(cfg.endpoint())?),
            Backend::Slurm => Box::new(SlurmPower::new(cfg.scontrol.clone(), timeout)?),
        };
        let (ctx, crx) = sync_channel(COMMANDS);
        let (rtx, rrx) = sync_channel(REPORTS);
        let systems = cfg.targets().clone();
        let poll = Duration::from_secs_f64(cfg.poll_s);
        let thread_counts = Arc::new(ThreadCounts::default());
        let thread = std::thread::Builder::new()
            .name("node-power".into())
            .spawn({
                let counts = thread_counts.clone();
                move || worker(client, systems, poll, crx, rtx, &counts)
            })?;
        let nodes = cfg
            .targets()
            .keys()
            .map(|n| {
                (
                    n.clone(),
                    NodeState {
                        power: Power::On,
                        idle_since: Some(now),
                        ours: false,
                    },
                )
            })
            .collect();
        Ok(NodePower {
            commands: ctx,
            reports: rrx,
            thread: Some(thread),
            nodes,
            recent_downs: Vec::new(),
            acting: false,
            counts: Counts::default(),
            thread_counts,
        })
    }

    fn send(&mut self, c: Command) -> bool {
        match self.commands.try_send(c) {
            Ok(()) => true,
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                self.counts.dropped += 1;
                false
            }
        }
    }

    /// The BMCs' reports since the last tick.
    fn drain(&mut self, now: Timestamp) {
        while let Ok(r) = self.reports.try_recv() {
            match r {
                Report::State { node, state } => {
                    let Some(n) = self.nodes.get_mut(&node) else {
                        continue;
                    };
                    let was_on = n.power == Power::On;
                    n.power = match (n.power, state) {
                        (Power::Failed, _) => Power::Failed,
                        (Power::Off { since }, PowerState::Off) => Power::Off { since },
                        (_, PowerState::Off) => Power::Off { since: now },
                        (Power::Booting { .. }, PowerState::On) => {
                            // a node brought up: back
                            n.ours = false;
                            Power::On
                        }
                        // a node off that came back without us (Slurm resumes a
                        // powered-down node a job needs): no longer held off by us
                        (Power::Off { .. }, PowerState::On) => {
                            n.ours = false;
                            Power::On
                        }
                        // the shutdown still on its way (a BMC that never carries it
                        // out: the node counts as on after 10 min)
                        (Power::ShuttingDown { since }, PowerState::On)
                            if now.secs_since(since) < 600.0 =>
                        {
                            Power::ShuttingDown { since }
                        }
                        (_, PowerState::On) => Power::On,
                        (p, _) => p,
                    };
                    // a node back on is idle from now (not from before it went off)
                    if n.power == Power::On && (!was_on || n.idle_since.is_none()) {
                        n.idle_since = Some(now);
                    }
                }
                Report::Failed { node, error } => {
                    self.counts.errors += 1;
                    warn!(node = %node, error = %error, "node power command failed");
                    if let Some(n) = self.nodes.get_mut(&node) {
                        // a power-down that failed: the node is as it was
                        if matches!(n.power, Power::ShuttingDown { .. }) {
                            n.power = Power::On;
                            n.ours = false;
                        }
                    }
                }
            }
        }
    }

    /// One tick: reports in, then (acting only) the decision out. `acting` false→true
    /// is a take-over, true→false a step-down.
    #[allow(clippy::too_many_arguments)]
    pub fn tick(
        &mut self,
        site: &Site,
        rule: &NodePowerRule,
        jobs: &[Job],
        planned: &BTreeMap<String, Timestamp>,
        expensive: bool,
        grid_event: bool,
        acting: bool,
        now: Timestamp,
    ) -> Vec<NodeAction> {
        self.drain(now);
        if acting != self.acting {
            self.acting = acting;
            if acting {
                info!("node power: taking over, powering up the nodes left off");
                self.send(Command::TakeOver);
            } else {
                self.release("stepped down", now);
            }
        }
        if !acting {
            return Vec::new();
        }
        let views = self.views(site, jobs, now);
        let needs = needs(jobs, planned, now);
        self.recent_downs.retain(|t| now.secs_since(*t) < 60.0);
        let actions = policies::node_power::decide(
            &views,
            &needs,
            rule,
            Inputs {
                expensive,
                grid_event,
                downs_last_min: self.recent_downs.len() as u32,
                arrivals_gpus_per_s: Some(policies::node_power::arrival_rate(
                    jobs,
                    now,
                    rule.reserve_window_s,
                )),
                // decided every tick, seconds apart: one minute's power-downs at most
                interval_s: 0.0,
            },
            now,
        );
        for a in &actions {
            self.carry_out(a, now);
        }
        actions
    }

    /// The bound nodes as the decision sees them, in the site's order: their free
    /// GPUs (a running job's GPUs are used) and since when they are idle.
    fn views(&mut self, site: &Site, jobs: &[Job], now: Timestamp) -> Vec<NodeView> {
        // which nodes run work (a running job's GPUs)
        let mut busy: BTreeMap<&str, u32> = BTreeMap::new();
        for j in jobs {
            if matches!(j.state, JobState::Running | JobState::Suspended) {
                for g in &j.allocated {
                    let node = g.name.split(':').next().unwrap_or("");
                    *busy.entry(node).or_default() += 1;
                }
            }
        }
        let mut views = Vec::new();
        for node in &site.nodes {
            let Some(n) = self.nodes.get_mut(&node.id) else {
                continue;
            };
            let used = busy.get(node.id.as_str()).copied().unwrap_or(0);
            if used > 0 {
                n.idle_since = None;
            } else if n.idle_since.is_none() {
                n.idle_since = Some(now);
            }
            views.push(NodeView {
                id: node.id.clone(),
                model: node.gpu_model.clone(),
                gpus: node.gpus,
                free: node.gpus.saturating_sub(used),
                power: n.power,
                idle_since: n.idle_since,
            });
        }
        views
    }

    /// Sends what the decision says for one node and notes it in the node's state.
    fn carry_out(&mut self, a: &NodeAction, now: Timestamp) {
        match a {
            NodeAction::Down { node, .. } => {
                if self.send(Command::Power {
                    node: node.clone(),
                    on: false,
                }) {
                    self.counts.downs += 1;
                    self.recent_downs.push(now);
                    if let Some(n) = self.nodes.get_mut(node) {
                        n.power = Power::ShuttingDown { since: now };
                        n.ours = true;
                    }
                }
            }
            NodeAction::Up { node, .. } => {
                if self.send(Command::Power {
                    node: node.clone(),
                    on: true,
                }) {
                    self.counts.ups += 1;
                    if let Some(n) = self.nodes.get_mut(node) {
                        n.power = Power::Booting { since: now };
                    }
                }
            }
            NodeAction::Failed { node, .. } => {
                self.counts.failed_resumes += 1;
                if let Some(n) = self.nodes.get_mut(node) {
                    n.power = Power::Failed;
                    n.ours = false;
                }
            }
        }
    }

    /// Powers up every node this controller holds off (its lease ends).
    fn release(&mut self, why: &str, now: Timestamp) {
        let ours: Vec<String> = self
            .nodes
            .iter()
            .filter(|(_, n)| n.ours)
            .map(|(id, _)| id.clone())
            .collect();
        for node in ours {
            info!(node = %node, "node power: {why}, powering the node up");
            if self.send(Command::Power {
                node: node.clone(),
                on: true,
            }) {
                self.counts.ups += 1;
                if let Some(n) = self.nodes.get_mut(&node) {
                    n.power = Power::Booting { since: now };
                    n.ours = false;
                }
            }
        }
    }

    /// Fresh readings of 0 W for the GPUs of nodes that are off: the engine sees them
    /// off, not stale.
    pub fn off_samples(&self, site: &Site, now: Timestamp) -> Vec<Sample> {
        let mut out = Vec::new();
        for node in &site.nodes {
            if let Some(n) = self.nodes.get(&node.id) {
                if matches!(n.power, Power::Off { .. }) {
                    for i in 0..node.gpus {
                        out.push(Sample::new(
                            EntityId::gpu(&node.id, i),
                            telemetry::metric::names::POWER_W,
                            0.0,
                            now,
                            "node_power",
                        ));
                    }
                }
            }
        }
        out
    }

    /// The counters and the nodes off, for `/metrics`.
    pub fn counters(&self) -> Vec<(&'static str, &'static str, f64)> {
        let off = self
            .nodes
            .values()
            .filter(|n| matches!(n.power, Power::Off { .. } | Power::ShuttingDown { .. }))
            .count();
        let failed = self
            .nodes
            .values()
            .filter(|n| n.power == Power::Failed)
            .count();
        vec![
            (
                "node_power_downs_total",
                "Node power-downs commanded",
                self.counts.downs as f64,
            ),
            (
                "node_power_ups_total",
                "Node power-ups commanded",
                self.counts.ups as f64,
            ),
            (
                "node_power_failed_resumes_total",
                "Nodes not back within their resume timeout",
                self.counts.failed_resumes as f64,
            ),
            (
                "node_power_errors_total",
                "Node power commands the backend (BMC or Slurm) refused or did not answer",
                self.counts.errors as f64,
            ),
            (
                "node_power_commands_dropped_total",
                "Node power commands and reports dropped (queue full); decided or polled again",
                (self.counts.dropped + self.thread_counts.reports_dropped.load(Relaxed)) as f64,
            ),
            (
                "node_power_poll_errors_total",
                "Node power state reads that failed (the node keeps its last state)",
                self.thread_counts.poll_errors.load(Relaxed) as f64,
            ),
            (
                "node_power_auth_failures_total",
                "Node power calls the BMC refused for their credentials (HTTP 401 or 403); nothing was powered",
                self.thread_counts.auth_failures.load(Relaxed) as f64,
            ),
            (
                "nodes_off",
                "Nodes powered down or shutting down",
                off as f64,
            ),
            (
                "nodes_failed",
                "Nodes marked failed (resume timeout)",
                failed as f64,
            ),
        ]
    }

    /// Shutdown: the nodes this controller holds off are powered up, then the thread
    /// finishes what it was given (each call within its deadline) and ends.
    pub fn stop(mut self, now: Timestamp) {
        if self.acting {
            self.release("shutting down", now);
        }
        let thread = self.thread.take();
        drop(self);
        if let Some(t) = thread {
            let _ = t.join();
        }
    }
}

/// Whether a backend's error is its BMC refusing the credentials.
fn is_auth(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<sources::redfish::RedfishError>()
            .is_some_and(|r| r.reason() == "auth")
    })
}

/// A new leader's take-over: every node found off (or powering off) is powered up.
fn take_over(
    client: &dyn Switch,
    systems: &BTreeMap<String, String>,
    fail: &dyn Fn(String, &str, &anyhow::Error),
) {
    for (node, system) in systems {
        match client.state(system) {
            Ok(PowerState::Off | PowerState::PoweringOff) => {
                if let Err(e) = client.set(system, true) {
                    fail(node.clone(), "On (take-over)", &e);
                }
            }
            Ok(_) => {}
            Err(e) => fail(node.clone(), "power state (take-over)", &e),
        }
    }
}

/// The thread: commands as they come, the nodes' power states every `poll`. Failures
/// are counted (credentials refused apart) and logged, rate-limited per node and call.
fn worker(
    client: Box<dyn Switch>,
    systems: BTreeMap<String, String>,
    poll: Duration,
    commands: Receiver<Command>,
    reports: SyncSender<Report>,
    counts: &ThreadCounts,
) {
    let report = |r: Report| {
        if reports.try_send(r).is_err() {
            counts.reports_dropped.fetch_add(1, Relaxed);
        }
    };
    // a refused command is logged by the tick; a failed read here, once a minute a node
    let mut log = telemetry::log_limit::LogLimiter::new(Duration::from_secs(60));
    let auth = |e: &anyhow::Error| {
        if is_auth(e) {
            counts.auth_failures.fetch_add(1, Relaxed);
        }
    };
    let fail = |node: String, what: &str, e: &anyhow::Error| {
        auth(e);
        report(Report::Failed {
            node,
            error: format!("{what}: {e:#}"),
        });
    };
    let mut next_poll = std::time::Instant::now();
    loop {
        let wait = next_poll.saturating_duration_since(std::time::Instant::now());
        match commands.recv_timeout(wait) {
            Ok(Command::Power { node, on }) => {
                let Some(system) = systems.get(&node) else {
                    continue;
                };
                if let Err(e) = client.set(system, on) {
                    fail(node, if on { "power up" } else { "power down" }, &e);
                }
            }
            Ok(Command::TakeOver) => take_over(&*client, &systems, &fail),
            Err(RecvTimeoutError::Timeout) => {
                for (node, system) in &systems {
                    match client.state(system) {
                        Ok(state) => report(Report::State {
                            node: node.clone(),
                            state,
                        }),
                        Err(e) => {
                            counts.poll_errors.fetch_add(1, Relaxed);
                            auth(&e);
                            if let Some(suppressed) = log.allow(node, std::time::Instant::now()) {
                                warn!(node = %node, suppressed, error = %format!("{e:#}"), "cannot read the node's power state");
                            }
                        }
                    }
                }
                log.warn_suppressed("node power", std::time::Instant::now());
                next_poll = std::time::Instant::now() + poll;
            }
            Err(RecvTimeoutError::Disconnected) => return,
        }
    }
}
