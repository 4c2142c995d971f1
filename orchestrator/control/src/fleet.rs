//! The controller's side of the agent protocol: turns the plan's caps into signed,
//! leased commands per node, tracks acks, retries what is not acknowledged (with
//! backoff), renews leases before they end, and keeps per GPU the desired, the
//! acknowledged and the enforced state. Free of MQTT and clock: `serve` feeds it
//! messages and publishes what it returns.
//!
//! Every GPU of the site always holds a lease from a live controller: a capped GPU a
//! `set_power_limit`, an uncapped one a `reset`. So when the controller dies, every
//! agent applies its fail-safe once the lease ends (safety invariant 2).

use std::collections::BTreeMap;

use policies::State;
use serde::Serialize;
use telemetry::agent_proto::{
    Ack, AckStatus, Action, Channel, Command, GpuSel, Health, Key, NodeReport, Topics, VERSION,
};
use telemetry::log_limit::LogLimiter;
use telemetry::metric::names::{
    ENERGY_J, GPU_TEMP_C, POWER_LIMIT_W, POWER_W, SM_CLOCK_MHZ, UTILIZATION_PCT,
};
use telemetry::{EntityId, Sample, Site, Timestamp};
use tracing::{info, warn};

/// `warn!` at most once per `$key` per interval of `$self.log`, with `left_out`.
macro_rules! warn_limited {
    ($self:expr, $key:expr, $($arg:tt)+) => {
        if let Some(left_out) = $self.log.allow($key, std::time::Instant::now()) {
            warn!(left_out, $($arg)+);
        }
    };
}

/// How the controller leases and retries.
#[derive(Debug, Clone, PartialEq)]
pub struct FleetConfig {
    /// The lease on every command.
    pub lease_s: f64,
    /// Renew this long after sending (well before the lease ends).
    pub renew_s: f64,
    /// First retry of an unacknowledged command; doubles up to `renew_s`.
    pub retry_s: f64,
}

impl Default for FleetConfig {
    fn default() -> Self {
        FleetConfig {
            lease_s: 90.0,
            renew_s: 30.0,
            retry_s: 5.0,
        }
    }
}

/// What the controller wants a GPU at.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(tag = "mode", rename_all = "snake_case")]
pub enum Want {
    Default,
    Limit {
        watts: f64,
    },
    /// SM clock locked at this frequency (a GPU with a power cap gets the cap instead:
    /// an agent holds one target per GPU, and power is what budgets protect).
    Clocks {
        mhz: f64,
    },
}

impl Want {
    fn key(self) -> i64 {
        match self {
            Want::Default => -1,
            // a tenth of a watt is the same cap
            Want::Limit { watts } => (watts * 10.0).round() as i64,
            Want::Clocks { mhz } => -2 - mhz.round() as i64,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Sent {
    pub id: String,
    pub want: Want,
    pub at: Timestamp,
    pub lease_until: Timestamp,
    /// Retries of this want without an ack.
    pub attempts: u32,
    pub acked: bool,
}

/// One GPU as the controller sees it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GpuBook {
    pub gpu: EntityId,
    pub node: String,
    pub index: u32,
    pub desired: Want,
    pub sent: Option<Sent>,
    /// The agent's answer to the last acknowledged command.
    pub ack_status: Option<AckStatus>,
    pub ack_reason: Option<String>,
    pub applied_w: Option<f64>,
    pub agent_lease_until: Option<Timestamp>,
    /// The limit the GPU reported enforcing, and when.
    pub enforced_w: Option<f64>,
    /// The jobs holding it, as its agent last reported (Kubernetes pods, `k8s:ns/name`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub pods: Vec<String>,
    pub reported_at: Option<Timestamp>,
    pub error: Option<String>,
}

impl GpuBook {
    /// The GPU runs as desired: acknowledged and, once reported, enforced.
    pub fn in_sync(&self) -> bool {
        let Some(s) = &self.sent else { return false };
        s.acked
            && s.want.key() == self.desired.key()
            && match (self.desired, self.enforced_w) {
                (Want::Limit { watts }, Some(e)) => (e - watts).abs() <= 2.0,
                _ => true,
            }
    }
}

/// An agent's clock further than this from the controller's (s) is named in a
/// warning: its commands still apply (the agent runs each lease from its arrival),
/// but its samples are dated by its own clock.
pub const CLOCK_SKEW_WARN_S: f64 = 10.0;

/// Agent health per node.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NodeBook {
    pub status: String,
    pub since: Timestamp,
    pub fail_safe_gpus: Vec<u32>,
    pub dry_run: bool,
}

pub struct Fleet {
    key: Key,
    topics: Topics,
    cfg: FleetConfig,
    books: BTreeMap<EntityId, GpuBook>,
    nodes: BTreeMap<String, NodeBook>,
    /// The site's nodes: messages on other nodes' topics are refused and counted
    /// (`unknown_node`), so made-up agents grow no state.
    known_nodes: std::collections::BTreeSet<String>,
    /// One warning per reason per interval, with the count left out.
    log: LogLimiter,
    /// Each agent's clock minus the controller's (s), from its last report: the
    /// report's stamp against its arrival (so it includes the report's transit).
    clock_skew_s: BTreeMap<String, f64>,
    /// One clock warning per node per interval (a node of its own key, so that one
    /// node's warning never drowns another's).
    skew_log: LogLimiter,
    id_prefix: String,
    next_id: u64,
    /// The fencing epoch commands carry (with `[ha]`: the leader's term).
    epoch: Option<u64>,
    pub counters: BTreeMap<&'static str, u64>,
}

fn bump(c: &mut BTreeMap<&'static str, u64>, k: &'static str) {
    *c.entry(k).or_default() += 1;
}

/// The agent action that brings `gpus` to `want`.
fn action(want: Want, gpus: GpuSel) -> Action {
    match want {
        Want::Default => Action::Reset { gpus },
        Want::Clocks { mhz } => Action::LockSmClocks {
            gpus,
            min_mhz: mhz,
            max_mhz: mhz,
        },
        Want::Limit { watts } => Action::SetPowerLimit {
            gpus,
            watts: Some(watts),
            percent: None,
        },
    }
}

impl Fleet {
    /// A fleet of every GPU of the site. `started` makes command ids unique across
    /// controller restarts.
    pub fn new(
        site: &Site,
        key: Key,
        topics: Topics,
        cfg: FleetConfig,
        started: Timestamp,
    ) -> Self {
        let books = site
            .gpus()
            .into_iter()
            .map(|g| {
                (
                    EntityId::clone(&g.id),
                    GpuBook {
                        gpu: EntityId::clone(&g.id),
                        node: g.node.id.clone(),
                        index: g.index,
                        desired: Want::Default,
                        sent: None,
                        ack_status: None,
                        ack_reason: None,
                        applied_w: None,
                        agent_lease_until: None,
                        enforced_w: None,
                        pods: Vec::new(),
                        reported_at: None,
                        error: None,
                    },
                )
            })
            .collect();
        Fleet {
            key,
            topics,
            cfg,
            books,
            nodes: BTreeMap::new(),
            known_nodes: site.nodes.iter().map(|n| n.id.clone()).collect(),
            log: LogLimiter::new(std::time::Duration::from_secs(30)),
            clock_skew_s: BTreeMap::new(),
            skew_log: LogLimiter::new(std::time::Duration::from_secs(600)),
            id_prefix: format!("c{}", started.as_millis()),
            next_id: 0,
            epoch: None,
            counters: BTreeMap::new(),
        }
    }

    pub fn books(&self) -> impl Iterator<Item = &GpuBook> {
        self.books.values()
    }

    pub fn nodes(&self) -> &BTreeMap<String, NodeBook> {
        &self.nodes
    }

    /// Each reporting agent's clock minus the controller's (s).
    pub fn clock_skew_s(&self) -> &BTreeMap<String, f64> {
        &self.clock_skew_s
    }

    /// Commands from now on carry `epoch` (a new leader's term). A new term re-sends
    /// every GPU's desired state at once, so that each agent learns the epoch and
    /// renews its lease from the new leader (take-over: nothing lapses).
    pub fn set_epoch(&mut self, epoch: Option<u64>) {
        if epoch != self.epoch {
            for b in self.books.values_mut() {
                b.sent = None;
            }
            self.epoch = epoch;
        }
    }

    /// The commands to publish now, as `(topic, payload)`, so that every GPU heads to
    /// what `state` wants.
    pub fn commands(&mut self, state: &State, now: Timestamp) -> Vec<(String, Vec<u8>)> {
        self.log
            .warn_suppressed("agent messages", std::time::Instant::now());
        let mut out = Vec::new();
        for ((node, _), (want, gpus, attempts)) in self.due(state, now) {
            out.push(self.send(&node, want, gpus, attempts, now));
        }
        out
    }

    /// Sets each GPU's desired state from `state`; returns the GPUs due a command
    /// (new want, retry, renewal) grouped by (node, want), with the retry count to
    /// carry.
    fn due(
        &mut self,
        state: &State,
        now: Timestamp,
    ) -> BTreeMap<(String, i64), (Want, Vec<u32>, u32)> {
        let mut groups: BTreeMap<(String, i64), (Want, Vec<u32>, u32)> = BTreeMap::new();
        let (retry_s, renew_s) = (self.cfg.retry_s, self.cfg.renew_s);
        let retry_after = |a: u32| (retry_s * f64::from(1u32 << a.min(8))).min(renew_s);
        for (id, b) in self.books.iter_mut() {
            b.desired = state
                .caps
                .get(id)
                .map(|c| Want::Limit { watts: c.watts })
                .or_else(|| state.clocks.get(id).map(|c| Want::Clocks { mhz: c.mhz }))
                .unwrap_or(Want::Default);
            let due = match &b.sent {
                None => Some(0),
                Some(s) if s.want.key() != b.desired.key() => Some(0),
                Some(s) if !s.acked && now.secs_since(s.at) >= retry_after(s.attempts) => {
                    Some(s.attempts + 1)
                }
                Some(s) if now.secs_since(s.at) >= self.cfg.renew_s => Some(0),
                _ => None,
            };
            if let Some(attempts) = due {
                let g = groups.entry((b.node.clone(), b.desired.key())).or_insert((
                    b.desired,
                    Vec::new(),
                    0,
                ));
                g.1.push(b.index);
                g.2 = g.2.max(attempts);
            }
        }
        groups
    }

    /// One signed, leased command to `node`'s GPUs, noted in their books, as
    /// `(topic, payload)`.
    fn send(
        &mut self,
        node: &str,
        want: Want,
        gpus: Vec<u32>,
        attempts: u32,
        now: Timestamp,
    ) -> (String, Vec<u8>) {
        self.next_id += 1;
        let id = format!("{}-{}", self.id_prefix, self.next_id);
        let list = GpuSel::List(gpus.clone());
        let cmd = Command {
            v: VERSION,
            id: id.clone(),
            node: node.to_string(),
            issued_at: now,
            lease_s: self.cfg.lease_s,
            epoch: self.epoch,
            action: action(want, list),
        };
        if attempts > 0 {
            bump(&mut self.counters, "commands_retried");
            // once per silent agent at warn; the rest are counted
            if attempts == 1 {
                warn!(node = %node, gpus = ?gpus, "no ack from the agent; sending again with backoff");
            } else {
                tracing::debug!(node = %node, gpus = ?gpus, attempts, "no ack from the agent; sending again");
            }
        }
        bump(&mut self.counters, "commands_sent");
        for i in &gpus {
            if let Some(b) = self.books.get_mut(&EntityId::gpu(node, *i)) {
                b.sent = Some(Sent {
                    id: id.clone(),
                    want,
                    at: now,
                    lease_until: now.plus_secs(self.cfg.lease_s),
                    attempts,
                    acked: false,
                });
            }
        }
        (self.topics.topic(node, Channel::Cmd), cmd.seal(&self.key))
    }

    /// Takes one message from an agent topic; returns the samples a report carries.
    pub fn on_message(&mut self, topic: &str, payload: &[u8], now: Timestamp) -> Vec<Sample> {
        let Some((node, ch)) = self.topics.parse(topic) else {
            return Vec::new();
        };
        if !self.known_nodes.contains(node) {
            bump(&mut self.counters, "unknown_node");
            warn_limited!(self, "unknown_node", node = %node, "agent message refused: the site file has no such node");
            return Vec::new();
        }
        let node = node.to_string();
        match ch {
            Channel::Ack => {
                self.on_ack(&node, payload);
                Vec::new()
            }
            Channel::Gpus => self.on_report(&node, payload, now),
            Channel::Health => {
                match serde_json::from_slice::<Health>(payload) {
                    Ok(h) => {
                        let live = |s: &str| s == "online" || s == "degraded";
                        let came_back = live(&h.status)
                            && self.nodes.get(&node).is_none_or(|n| !live(&n.status));
                        let changed = self.nodes.get(&node).is_none_or(|n| n.status != h.status);
                        if changed {
                            if h.status == "online" {
                                info!(node = %node, dry_run = h.dry_run, "agent {}", h.status);
                            } else {
                                warn!(node = %node, status = %h.status, detail = ?h.detail, fail_safe_gpus = ?h.fail_safe_gpus, "agent {}", h.status);
                            }
                        }
                        // an agent that comes back (online, or degraded under its
                        // fail-safe) gets its desired state at once
                        if came_back {
                            for b in self.books.values_mut().filter(|b| b.node == node) {
                                if let Some(s) = &mut b.sent {
                                    s.at = Timestamp(i64::MIN / 2);
                                }
                            }
                        }
                        self.nodes.insert(
                            node,
                            NodeBook {
                                status: h.status,
                                since: h.time.unwrap_or(now),
                                fail_safe_gpus: h.fail_safe_gpus,
                                dry_run: h.dry_run,
                            },
                        );
                    }
                    Err(e) => {
                        bump(&mut self.counters, "health_malformed");
                        warn_limited!(self, "health_malformed", node = %node, error = %e, "malformed agent health");
                    }
                }
                Vec::new()
            }
            Channel::Cmd => Vec::new(),
        }
    }

    fn on_ack(&mut self, node: &str, payload: &[u8]) {
        let ack = match Ack::open(&self.key, payload) {
            Ok(a) => a,
            Err(e) => {
                *self
                    .counters
                    .entry(match e.reason() {
                        "bad_signature" => "acks_bad_signature",
                        "unsigned" => "acks_unsigned",
                        _ => "acks_malformed",
                    })
                    .or_default() += 1;
                warn_limited!(self, e.reason(), node = %node, reason = e.reason(), "ack refused: {e}");
                return;
            }
        };
        if ack.node != node {
            bump(&mut self.counters, "acks_wrong_node");
            warn_limited!(self, "acks_wrong_node", node = %node, claims = %ack.node, "ack refused: it names another node");
            return;
        }
        bump(&mut self.counters, "acks");
        let Some(id) = &ack.id else {
            warn_limited!(self, "acks_unread", node = %node, reason = ?ack.reason, detail = ?ack.detail, "the agent rejected a command it could not read");
            return;
        };
        if ack.status == AckStatus::Rejected {
            bump(&mut self.counters, "acks_rejected");
            warn_limited!(self, "acks_rejected", node = %node, id = %id, reason = ?ack.reason, detail = ?ack.detail, "the agent rejected a command");
        }
        for b in self
            .books
            .values_mut()
            .filter(|b| b.node == node && b.sent.as_ref().is_some_and(|s| &s.id == id))
        {
            let Some(s) = &mut b.sent else { continue };
            // a duplicate delivery of an applied command says `replayed`: not news
            if s.acked && ack.reason.as_deref() == Some("replayed") {
                continue;
            }
            let outcome = ack.gpus.iter().find(|o| o.index == b.index);
            let superseded = ack.reason.as_deref() == Some("superseded");
            // a rejection for a transient reason is retried; one that will not change is not
            // (`from_future`: older agents refused a command stamped ahead of their
            // clock; agents accept it now, with its lease from its arrival)
            let retry = matches!(
                ack.reason.as_deref(),
                Some("expired" | "from_future" | "replayed")
            );
            s.acked = !retry && !superseded;
            b.ack_status = Some(ack.status);
            b.ack_reason = ack.reason.clone();
            b.agent_lease_until = ack.lease_until;
            b.applied_w = outcome.and_then(|o| o.applied_w);
            b.error = outcome
                .and_then(|o| o.error.clone())
                .or_else(|| ack.detail.clone());
        }
    }

    fn on_report(&mut self, node: &str, payload: &[u8], now: Timestamp) -> Vec<Sample> {
        let r: NodeReport = match serde_json::from_slice(payload) {
            Ok(r) => r,
            Err(e) => {
                bump(&mut self.counters, "reports_malformed");
                warn_limited!(self, "reports_malformed", node = %node, error = %e, "malformed agent report");
                return Vec::new();
            }
        };
        bump(&mut self.counters, "reports");
        self.measure_skew(node, r.time, now);
        let src = format!("agent:{node}");
        let mut out = Vec::new();
        for report in &r.gpus {
            let g = &report.reading;
            let id = EntityId::gpu(node, g.index);
            if let Some(b) = self.books.get_mut(&id) {
                b.enforced_w = Some(g.power_limit_w);
                b.reported_at = Some(r.time);
                if b.pods.len() != report.pods.len()
                    || b.pods
                        .iter()
                        .zip(&report.pods)
                        .any(|(a, p)| a.get(4..) != Some(p.as_str()))
                {
                    b.pods = report.pods.iter().map(|p| format!("k8s:{p}")).collect();
                }
            }
            for (m, v) in [
                (POWER_W, Some(g.power_w)),
                (ENERGY_J, g.energy_j),
                (GPU_TEMP_C, Some(g.temp_c)),
                (UTILIZATION_PCT, Some(g.utilization_pct)),
                (SM_CLOCK_MHZ, Some(g.sm_clock_mhz)),
                (POWER_LIMIT_W, Some(g.power_limit_w)),
            ] {
                if let Some(v) = v {
                    out.push(Sample::new(id.clone(), m, v, r.time, &src));
                }
            }
        }
        out
    }

    /// Keeps the agent's clock skew from a report stamped `stamp` that arrived `now`;
    /// beyond [`CLOCK_SKEW_WARN_S`] counts the report (`reports_clock_skewed`) and names
    /// the node in a warning, once per node per 10 minutes (whether it did: `true`).
    fn measure_skew(&mut self, node: &str, stamp: Timestamp, now: Timestamp) -> bool {
        let skew_s = stamp.secs_since(now);
        self.clock_skew_s.insert(node.to_string(), skew_s);
        if skew_s.abs() <= CLOCK_SKEW_WARN_S {
            return false;
        }
        bump(&mut self.counters, "reports_clock_skewed");
        let Some(left_out) = self.skew_log.allow(node, std::time::Instant::now()) else {
            return false;
        };
        warn!(node = %node, skew_s, left_out,
            "agent clock is {:.1} s {} the controller's: its commands still apply (leases run from their arrival) but its samples carry its clock; check NTP on the node",
            skew_s.abs(), if skew_s < 0.0 { "behind" } else { "ahead of" });
        true
    }

    /// The GPUs each job holds, as the agents last reported (Kubernetes pods, by job
    /// id `k8s:namespace/name`).
    pub fn holders(&self) -> BTreeMap<String, Vec<EntityId>> {
        let mut out: BTreeMap<String, Vec<EntityId>> = BTreeMap::new();
        for b in self.books.values() {
            for p in &b.pods {
                out.entry(p.clone()).or_default().push(b.gpu.clone());
            }
        }
        out
    }

    /// Per GPU: desired, acknowledged and enforced, for the status file and logs.
    pub fn status(&self) -> FleetStatus<'_> {
        FleetStatus {
            gpus: self.books.values().collect(),
            nodes: &self.nodes,
            clock_skew_s: &self.clock_skew_s,
            in_sync: self.books.values().filter(|b| b.in_sync()).count(),
            counters: &self.counters,
        }
    }
}

#[derive(Debug, Serialize)]
pub struct FleetStatus<'a> {
    pub in_sync: usize,
    pub nodes: &'a BTreeMap<String, NodeBook>,
    /// Each reporting agent's clock minus the controller's (s).
    pub clock_skew_s: &'a BTreeMap<String, f64>,
    pub counters: &'a BTreeMap<&'static str, u64>,
    pub gpus: Vec<&'a GpuBook>,
}

#[cfg(test)]
mod tests;
