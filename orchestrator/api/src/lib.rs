//! The operator's HTTP side of `serve`: `/metrics` for Prometheus and a JSON API under
//! `/api/v1`, authenticated by bearer tokens with roles (viewer < operator < admin).
//!
//! The control loop publishes a [`Board`] after every tick; requests read it and never
//! touch the loop or the store, so a slow client cannot delay a tick.
//!
//! # Layout
//!
//! - this module: the [`Board`], the JSON API's routes, tokens and roles, `[http]`.
//! - [`server`]: the listener, TLS, limits and timeouts, on the runtime.
//! - [`metrics`]: `/metrics` in the Prometheus text format.
//! - [`page`]: the status page.
//! - [`health`]: `/healthz` and `/readyz`.
//! - [`session`], [`stats`], [`tls`]: sessions, request counters, certificates and their reload.
#![forbid(unsafe_code)]

pub mod health;
pub mod metrics;
pub mod page;
mod query;
pub mod server;
mod service;
pub mod session;
mod slots;
pub mod stats;
pub mod tls;

pub use server::serve;

use std::collections::{BTreeMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};

use anyhow::{Context, Result};
use policies::{Decision, State};
use serde::{Deserialize, Serialize};
use serde_json::json;
use sha2::{Digest, Sha256};
use telemetry::metric::names::{INLET_TEMP_C, POWER_W, PRICE_PER_KWH};
use telemetry::{EntityId, EntityKind, Site, Snapshot, Timestamp};
use tracing::{info, warn};

use control::fleet::Fleet;
use control::Counters;

/// `[http]` in `powerplane.toml`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpSection {
    /// `host:port` to listen on.
    pub listen: String,
    /// `/metrics` without a token (Prometheus scrapes); `false` asks for a viewer token.
    #[serde(default = "yes")]
    pub metrics_public: bool,
    /// The status page at `/` without a token (a control-room screen on a closed
    /// network); otherwise a viewer token in the header, or a login (`POST /login`)
    /// that gives a session cookie.
    #[serde(default)]
    pub status_page_public: bool,
    /// How often the status page reloads itself.
    #[serde(default = "five")]
    pub refresh_s: u32,
    /// Where operators' overrides survive restarts (JSON); without it they live in
    /// memory only.
    #[serde(default)]
    pub overrides_file: Option<PathBuf>,
    /// Who may call the API.
    pub tokens: Vec<TokenConfig>,
    /// Connections open at once at most: beyond, the one idle the longest is closed,
    /// or the new one gets a `503` when every connection is in a request.
    #[serde(default = "server::default_max_connections")]
    pub max_connections: usize,
    /// A client must send a request's headers within this (else it is dropped).
    #[serde(default = "server::default_timeout_s")]
    pub header_timeout_s: f64,
    /// A client must send a request's body within this (else `408`).
    #[serde(default = "server::default_timeout_s")]
    pub body_timeout_s: f64,
    /// Request line and headers at most (beyond, `431`).
    #[serde(default = "server::default_max_header_bytes")]
    pub max_header_bytes: usize,
    /// At shutdown, how long requests in flight may take to finish.
    #[serde(default = "server::default_drain_s")]
    pub drain_s: f64,
    /// How long a status-page login lasts.
    #[serde(default = "server::default_session_s")]
    pub session_s: f64,
    /// `/readyz` fails when no source delivered a sample for this long.
    #[serde(default = "server::default_ready_stale_s")]
    pub ready_stale_s: f64,
    /// Serve HTTPS with this certificate chain (PEM) and key (PEM), reread on SIGHUP.
    #[serde(default)]
    pub tls_cert_file: Option<PathBuf>,
    #[serde(default)]
    pub tls_key_file: Option<PathBuf>,
}

fn five() -> u32 {
    5
}

fn yes() -> bool {
    true
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenConfig {
    /// Shown in logs (never the token).
    pub name: String,
    pub role: Role,
    /// A file holding the token (preferred), or the token itself.
    #[serde(default)]
    pub token_file: Option<PathBuf>,
    #[serde(default)]
    pub token: Option<String>,
}

/// What a token may do; each role may do what the ones below it may.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Read everything.
    Viewer,
    /// And set or remove overrides.
    Operator,
    /// And administer (reserved for policy reloads).
    Admin,
}

/// The shortest token accepted.
pub const MIN_TOKEN_CHARS: usize = 16;

/// Reads and checks the tokens of an `[http]` section.
pub fn load_tokens(sec: &HttpSection, base: &Path) -> Result<Vec<Token>> {
    anyhow::ensure!(
        !sec.tokens.is_empty(),
        "[http] needs at least one [[http.tokens]] (name, role, token_file)"
    );
    let mut out = Vec::new();
    for t in &sec.tokens {
        let secret = match (&t.token_file, &t.token) {
            (Some(f), None) => {
                let p = if f.is_absolute() {
                    f.clone()
                } else {
                    base.join(f)
                };
                std::fs::read_to_string(&p)
                    .with_context(|| {
                        format!("[http] token {:?}: cannot read {}", t.name, p.display())
                    })?
                    .trim()
                    .to_string()
            }
            (None, Some(s)) => s.clone(),
            _ => anyhow::bail!(
                "[http] token {:?}: give exactly one of token_file or token",
                t.name
            ),
        };
        anyhow::ensure!(
            secret.chars().count() >= MIN_TOKEN_CHARS,
            "[http] token {:?} is shorter than {MIN_TOKEN_CHARS} characters (make one with `openssl rand -hex 32`)",
            t.name
        );
        out.push(Token {
            name: t.name.clone(),
            role: t.role,
            digest: Sha256::digest(secret.as_bytes()).into(),
        });
    }
    Ok(out)
}

/// A token as kept in memory: its SHA-256 only.
#[derive(Debug, Clone)]
pub struct Token {
    pub name: String,
    pub role: Role,
    digest: [u8; 32],
}

/// What the API shows, as of the last tick.
#[derive(Debug, Clone)]
pub struct Board {
    pub site: Site,
    pub policy_file: String,
    /// The policy in force, as written.
    pub policy_text: String,
    pub started: Timestamp,
    pub time: Timestamp,
    pub snapshot: Snapshot,
    pub state: State,
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
}

pub const RECENT_DECISIONS: usize = 10_000;

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
            site,
            policy_file,
            policy_text: String::new(),
            started,
            time: started,
            snapshot: Snapshot::new(),
            state: State::default(),
            counters: Counters::default(),
            buffer_dropped: 0,
            decisions_by_rule: BTreeMap::new(),
            recent: VecDeque::new(),
            prices: Vec::new(),
            jobs: Vec::new(),
            price_source: String::new(),
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
        }
    }

    /// This replica's role: with `[ha]` as the election has it now, else the leader.
    pub fn ha_status(&self) -> runtime::ha::HaStatus {
        match &self.ha {
            Some(g) => g.status(),
            None => runtime::ha::HaStatus::single(),
        }
    }

    /// What one tick changed.
    pub fn update(
        &mut self,
        time: Timestamp,
        snapshot: &Snapshot,
        state: &State,
        counters: &Counters,
        decisions: &[Decision],
        buffer_dropped: u64,
    ) {
        self.time = time;
        self.snapshot = snapshot.clone();
        self.state = state.clone();
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
    }
}

/// What the server thread needs.
#[derive(Clone)]
pub struct Api {
    pub board: Arc<RwLock<Board>>,
    pub fleet: Option<Arc<Mutex<Fleet>>>,
    pub tokens: Vec<Token>,
    pub metrics_public: bool,
    pub status_page_public: bool,
    pub refresh_s: u32,
    pub overrides: Arc<Mutex<control::overrides::Book>>,
    /// Inbound job events and the Kubernetes hooks of the schedulers open now.
    pub hooks: Hooks,
    /// The HTTP edge's counters (connections, limits, logins, TLS) for `/metrics`.
    pub stats: Arc<stats::HttpStats>,
}

/// What the schedulers open now take from the HTTP server: inbound job events
/// (`POST /api/v1/events`, with `[schedulers.webhook]`) and the Kubernetes admission
/// webhook and scheduler extender (`[schedulers.kubernetes]`). With `[ha]` they change
/// when this replica takes over or steps down.
#[derive(Clone, Default)]
pub struct Hooks(Arc<RwLock<HookSet>>, Configured);

/// Which hooks the config names (`events`, `kubernetes`), open or not: a replica that
/// is taking over has them configured but not open yet, and answers `503` (resend), not
/// `404`.
#[derive(Clone, Copy, Default)]
struct Configured(bool, bool);

type HookSet = (
    Option<Arc<runtime::schedulers::Inbox>>,
    Option<Arc<runtime::schedulers::KubeHooks>>,
);

impl Hooks {
    pub fn new(
        events: Option<Arc<runtime::schedulers::Inbox>>,
        kubernetes: Option<Arc<runtime::schedulers::KubeHooks>>,
    ) -> Self {
        let configured = Configured(events.is_some(), kubernetes.is_some());
        Hooks(Arc::new(RwLock::new((events, kubernetes))), configured)
    }

    /// Hooks that the config names but that open only when this replica leads.
    pub fn configured(mut self, events: bool, kubernetes: bool) -> Self {
        self.1 = Configured(self.1 .0 || events, self.1 .1 || kubernetes);
        self
    }

    /// The webhook section is configured but its inbox is not open (yet).
    fn events_pending(&self) -> bool {
        self.1 .0 && self.events().is_none()
    }

    /// The Kubernetes section is configured but its hooks are not open (yet).
    fn kubernetes_pending(&self) -> bool {
        self.1 .1 && self.kubernetes().is_none()
    }

    pub fn set(
        &self,
        events: Option<Arc<runtime::schedulers::Inbox>>,
        kubernetes: Option<Arc<runtime::schedulers::KubeHooks>>,
    ) {
        *self.0.write().unwrap_or_else(|p| p.into_inner()) = (events, kubernetes);
    }

    pub fn events(&self) -> Option<Arc<runtime::schedulers::Inbox>> {
        self.0.read().unwrap_or_else(|p| p.into_inner()).0.clone()
    }

    pub fn kubernetes(&self) -> Option<Arc<runtime::schedulers::KubeHooks>> {
        self.0.read().unwrap_or_else(|p| p.into_inner()).1.clone()
    }
}

/// An answer: status, content type, body.
#[derive(Debug, Clone, PartialEq)]
pub struct Reply {
    pub status: u16,
    pub content_type: &'static str,
    pub body: Vec<u8>,
    /// `WWW-Authenticate: Bearer` on 401.
    pub challenge: bool,
}

fn json_reply(status: u16, v: &serde_json::Value) -> Reply {
    Reply {
        status,
        content_type: "application/json",
        body: serde_json::to_vec_pretty(v).unwrap_or_default(),
        challenge: status == 401,
    }
}

fn error(status: u16, msg: &str) -> Reply {
    json_reply(status, &json!({ "error": msg }))
}

/// The largest request body taken.
pub const MAX_BODY: usize = 64 * 1024;

impl Api {
    /// The token's name when its role may do what needs `min`; else the 401 or 403.
    fn authorize(&self, authorization: Option<&str>, min: Role) -> Result<&str, Reply> {
        match self.role(authorization) {
            None if authorization.is_none() => Err(error(
                401,
                "a bearer token is required (Authorization: Bearer ...)",
            )),
            None => Err(error(401, "unknown token")),
            Some((r, _)) if r < min => Err(error(
                403,
                &format!("this token's role may not do this (needs {min:?})").to_lowercase(),
            )),
            Some((_, name)) => Ok(name),
        }
    }

    /// The role a request's `Authorization` header grants, if any.
    fn role(&self, authorization: Option<&str>) -> Option<(Role, &str)> {
        let (scheme, token) = authorization?.trim().split_once(' ')?;
        if !scheme.eq_ignore_ascii_case("bearer") {
            return None;
        }
        self.token_role(token.trim())
    }

    /// The role a token itself grants, if any (compared by digest, in constant time).
    fn token_role(&self, token: &str) -> Option<(Role, &str)> {
        let d: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        // compare digests: no early exit on the secret itself
        self.tokens
            .iter()
            .find(|t| {
                t.digest
                    .iter()
                    .zip(d.iter())
                    .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                    == 0
            })
            .map(|t| (t.role, t.name.as_str()))
    }

    /// Answers one request. `query` is the part after `?`.
    pub fn handle(
        &self,
        method: &str,
        path: &str,
        query: &str,
        authorization: Option<&str>,
        body: &[u8],
    ) -> Reply {
        let _ = body;
        let need = |min: Role| self.authorize(authorization, min).map(|_| ());
        if path == "/metrics" && method == "GET" {
            if !self.metrics_public {
                if let Err(r) = need(Role::Viewer) {
                    return r;
                }
            }
            let board = self.board.read().unwrap_or_else(|p| p.into_inner());
            let fleet = self
                .fleet
                .as_ref()
                .map(|f| f.lock().unwrap_or_else(|p| p.into_inner()));
            let status = fleet.as_ref().map(|f| f.status());
            let mut text = metrics::render(&board, status.as_ref());
            self.stats.render_into(&mut text);
            return Reply {
                status: 200,
                content_type: "text/plain; version=0.0.4; charset=utf-8",
                body: text.into_bytes(),
                challenge: false,
            };
        }
        if path == "/healthz" || path == "/readyz" {
            let board = self.board.read().unwrap_or_else(|p| p.into_inner());
            return health::answer(path, &board);
        }
        if path == "/" && method == "GET" {
            if !self.status_page_public && self.role(authorization).is_none() {
                return session::login_page(401, None);
            }
            return self.status_page();
        }
        if path == "/api/v1/openapi.json" && method == "GET" {
            return json_reply(200, &openapi());
        }
        let Some(route) = path.strip_prefix("/api/v1/") else {
            return error(404, "no such path (see /api/v1/openapi.json)");
        };
        if let Some(verb) = route.strip_prefix("k8s/") {
            return self.k8s(method, verb, body);
        }
        if route == "overrides" || route.starts_with("overrides/") {
            return self.overrides(method, route, authorization, body);
        }
        if method != "GET" {
            // every route below reads; writing ones (overrides) need an operator
            return match need(Role::Operator) {
                Err(r) => r,
                Ok(()) => error(405, "method not allowed"),
            };
        }
        if let Err(r) = need(Role::Viewer) {
            return r;
        }
        let board = self.board.read().unwrap_or_else(|p| p.into_inner());
        match route {
            "status" => json_reply(200, &status(&board)),
            "racks" => json_reply(200, &racks(&board)),
            "gpus" => json_reply(200, &gpus(&board, self.fleet.as_ref())),
            "holds" => json_reply(
                200,
                &json!({ "holds": board.state.holds, "observed_holds": board.state.observed_holds }),
            ),
            "jobs" => {
                let list: Vec<_> = board
                    .jobs
                    .iter()
                    .map(|j| json!({ "job": j, "held": board.state.holds.get(&j.id) }))
                    .collect();
                json_reply(200, &json!({ "jobs": list }))
            }
            "policy" => json_reply(200, &policy(&board)),
            "decisions" => match decisions(&board, query) {
                Ok(v) => json_reply(200, &v),
                Err(e) => error(400, &e),
            },
            "schedulers" => json_reply(200, &board.schedulers),
            "agents" => match &self.fleet {
                Some(f) => {
                    let f = f.lock().unwrap_or_else(|p| p.into_inner());
                    json_reply(200, &serde_json::to_value(f.status()).unwrap_or_default())
                }
                None => error(404, "no [agents] section: caps are observe-only"),
            },
            _ => error(404, "no such path (see /api/v1/openapi.json)"),
        }
    }
}

impl Api {
    /// The status page, rendered from the last tick (the caller checked access).
    /// A write (an override, a job event, a Kubernetes hook) sent to a follower: `503`
    /// naming the leader's instance, so that the client (or the load balancer, which
    /// should route to the replica whose `/readyz` says `"role": "leader"`) sends it
    /// there. Nothing is forwarded.
    fn not_on_a_follower(&self) -> Option<Reply> {
        let ha = self
            .board
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .ha_status();
        (!ha.is_leader()).then(|| {
            json_reply(
                503,
                &json!({
                    "error": "this replica is a follower: send writes to the leader",
                    "instance": ha.instance,
                    "leader": ha.leader,
                    "epoch": ha.epoch,
                }),
            )
        })
    }

    pub fn status_page(&self) -> Reply {
        let board = self.board.read().unwrap_or_else(|p| p.into_inner());
        let fleet = self
            .fleet
            .as_ref()
            .map(|f| f.lock().unwrap_or_else(|p| p.into_inner()));
        let status = fleet.as_ref().map(|f| f.status());
        Reply {
            status: 200,
            content_type: "text/html; charset=utf-8",
            body: page::render(&board, status.as_ref(), self.refresh_s).into_bytes(),
            challenge: false,
        }
    }

    /// `POST /api/v1/k8s/{admission,filter,prioritize}`: called by the API server and
    /// kube-scheduler, which send no bearer token.
    fn k8s(&self, method: &str, verb: &str, body: &[u8]) -> Reply {
        if let Some(r) = self.not_on_a_follower() {
            return r;
        }
        let Some(hooks) = &self.hooks.kubernetes() else {
            if self.hooks.kubernetes_pending() {
                return error(503, "this replica is taking over as leader: resend");
            }
            return error(404, "no [schedulers.kubernetes] section");
        };
        if method != "POST" {
            return error(405, "POST an AdmissionReview or ExtenderArgs");
        }
        let v: serde_json::Value = match serde_json::from_slice(body) {
            Ok(v) => v,
            Err(e) => return error(400, &format!("not JSON: {e}")),
        };
        match verb {
            "admission" => match hooks.pods.admit(&v) {
                Ok(answer) => json_reply(200, &answer),
                Err(e) => {
                    warn!(error = %e, "bad AdmissionReview");
                    error(400, &e.to_string())
                }
            },
            "filter" | "prioritize" => {
                let board = self.board.read().unwrap_or_else(|p| p.into_inner());
                let nodes = hooks.conditions(&board.site, &board.state);
                drop(board);
                let answer = if verb == "filter" {
                    integrations::kubernetes::filter(&v, &nodes)
                } else {
                    integrations::kubernetes::prioritize(&v, &nodes)
                };
                json_reply(200, &answer)
            }
            _ => error(404, "no such path: admission, filter or prioritize"),
        }
    }

    /// `POST /api/v1/events` (`body` is `None` when it was too large).
    pub fn event(
        &self,
        method: &str,
        timestamp: Option<&str>,
        signature: Option<&str>,
        authorization: Option<&str>,
        body: Option<&[u8]>,
    ) -> Reply {
        if let Some(r) = self.not_on_a_follower() {
            return r;
        }
        let Some(inbox) = &self.hooks.events() else {
            if self.hooks.events_pending() {
                return error(503, "this replica is taking over as leader: resend");
            }
            return error(
                404,
                "no [schedulers.webhook] section: job events are not taken",
            );
        };
        if method != "POST" {
            return error(405, "POST a job event");
        }
        let Some(body) = body else {
            inbox.reject("too_large");
            return error(413, &format!("events are limited to {MAX_BODY} bytes"));
        };
        // a bearer token, when sent, must be an operator's; else the signature decides
        let bearer = match authorization {
            Some(_) => match self.authorize(authorization, Role::Operator) {
                Ok(_) => true,
                Err(r) => {
                    inbox.reject("bad_token");
                    return r;
                }
            },
            None => false,
        };
        match inbox.receive(bearer, timestamp, signature, body, common::wall_clock()) {
            Ok(id) => json_reply(202, &json!({ "accepted": id })),
            Err((status, why)) => error(status, &why),
        }
    }

    fn overrides(
        &self,
        method: &str,
        route: &str,
        authorization: Option<&str>,
        body: &[u8],
    ) -> Reply {
        let min = if method == "GET" {
            Role::Viewer
        } else {
            if let Some(r) = self.not_on_a_follower() {
                return r;
            }
            Role::Operator
        };
        let who = match self.authorize(authorization, min) {
            Ok(name) => name.to_string(),
            Err(r) => return r,
        };
        let mut book = self.overrides.lock().unwrap_or_else(|p| p.into_inner());
        let now = common::wall_clock();
        match (method, route.strip_prefix("overrides").unwrap_or("")) {
            ("GET", "") => json_reply(
                200,
                &json!({ "overrides": book.list.iter().filter(|o| o.until > now).collect::<Vec<_>>() }),
            ),
            ("POST", "") => {
                let req = match control::overrides::Request::parse(body) {
                    Ok(r) => r,
                    Err(e) => return error(400, &format!("bad override: {e}")),
                };
                let site = self
                    .board
                    .read()
                    .unwrap_or_else(|p| p.into_inner())
                    .site
                    .clone();
                let id = book.next_id();
                match req.accept(&site, now, &who, id) {
                    Ok(o) => {
                        info!(id = %o.id, by = %who, what = ?o.what, until = %o.until, reason = %o.reason, "override set");
                        book.list.push(o.clone());
                        if let Err(e) = book.save() {
                            warn!(error = %e, "cannot save the overrides; they hold until a restart");
                        }
                        json_reply(201, &serde_json::to_value(o).unwrap_or_default())
                    }
                    Err(e) => error(400, &e),
                }
            }
            ("DELETE", id) if id.starts_with('/') => {
                let id = &id[1..];
                let n = book.list.len();
                book.list.retain(|o| o.id != id);
                if book.list.len() == n {
                    return error(404, &format!("no override {id:?}"));
                }
                info!(id, by = %who, "override removed");
                if let Err(e) = book.save() {
                    warn!(error = %e, "cannot save the overrides");
                }
                json_reply(200, &json!({ "removed": id }))
            }
            _ => error(
                405,
                "GET or POST /api/v1/overrides, DELETE /api/v1/overrides/{id}",
            ),
        }
    }
}

/// The policy in force, as written, and the outcome of the last reload.
fn policy(b: &Board) -> serde_json::Value {
    let p = &b.policy_status;
    json!({
        "file": b.policy_file,
        "text": b.policy_text,
        "sha256": p.sha256,
        "loaded_at": p.loaded_at,
        "valid": p.valid,
        "last_error": p.last_error,
        "last_error_at": p.last_error_at,
        "rejected_sha256": p.rejected_sha256,
        "reloads": { "ok": p.reloads_ok, "error": p.reloads_error },
        "reload_error": p.last_error,
    })
}

fn status(b: &Board) -> serde_json::Value {
    let site = b.site.site_entity();
    let obs = |m: &str| b.snapshot.observe(&site, m, b.time);
    json!({
        "site": b.site.name,
        "time": b.time,
        "started": b.started,
        "policy_file": b.policy_file,
        "policy_reload_error": b.policy_status.last_error,
        "facility": {
            "budget_w": b.site.facility_budget_kw() * 1000.0,
            "power_w": obs(POWER_W).map(|o| o.value),
            "power_stale": obs(POWER_W).map(|o| o.stale),
        },
        "price_per_kwh": obs(PRICE_PER_KWH).map(|o| o.value),
        "price_source": b.price_source,
        "tariff_period": b.site.tariff.as_ref().map(|t| t.at(b.time, b.site.timezone).1.to_string()),
        "demand_charge_per_kw": b.site.tariff.as_ref().and_then(|t| t.demand_charge_per_kw),
        "currency": b.site.currency,
        "caps_in_force": b.state.caps.len(),
        "holds_in_force": b.state.holds.len(),
        "gpus": b.site.gpu_count(),
        "ticks": b.counters.ticks,
        "stale_readings": b.snapshot.stale(b.time).len(),
        "ha": b.ha_status(),
        "predicted_headroom": b
            .predictions
            .iter()
            .map(|(rack, p)| (rack.clone(), predicted_json(p)))
            .collect::<serde_json::Map<_, _>>(),
    })
}

/// A rack's predicted inlet for the API: the prediction and its headroom.
fn predicted_json(p: &policies::RackPrediction) -> serde_json::Value {
    json!({
        "inlet_c": p.inlet_c,
        "predicted_c": p.predicted_c,
        "peak_c": p.peak_c,
        "peak_in_s": p.peak_in_s,
        "horizon_s": p.horizon_s,
        "limit_c": p.limit_c,
        "margin_c": p.margin_c,
        "headroom_c": round3(p.headroom_c()),
    })
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

fn racks(b: &Board) -> serde_json::Value {
    let gpus = b.site.gpus();
    let list: Vec<_> = b
        .site
        .racks
        .iter()
        .map(|r| {
            let id = EntityId::new(EntityKind::Rack, r.id.clone());
            let p = b.snapshot.observe(&id, POWER_W, b.time);
            let t = b.snapshot.observe(&id, INLET_TEMP_C, b.time);
            let caps: Vec<f64> = gpus
                .iter()
                .filter(|g| g.rack.id == r.id)
                .filter_map(|g| b.state.caps.get(&g.id).map(|c| c.watts))
                .collect();
            json!({
                "id": r.id,
                "row": r.row,
                "budget_w": r.power_budget_kw * 1000.0,
                "power_w": p.map(|o| o.value),
                "power_stale": p.map(|o| o.stale),
                "headroom_w": p.map(|o| r.power_budget_kw * 1000.0 - o.value),
                "inlet_c": t.map(|o| o.value),
                "inlet_stale": t.map(|o| o.stale),
                "inlet_limit_c": r.inlet_limit_c,
                "capped_gpus": caps.len(),
                "lowest_cap_w": caps.iter().copied().reduce(f64::min),
                "thermal_level": b.state.thermal.get(&r.id),
                "predicted": b.predictions.get(&r.id).map(predicted_json),
            })
        })
        .collect();
    json!({ "racks": list })
}

fn gpus(b: &Board, fleet: Option<&Arc<Mutex<Fleet>>>) -> serde_json::Value {
    let fleet = fleet.map(|f| f.lock().unwrap_or_else(|p| p.into_inner()));
    let books: BTreeMap<EntityId, serde_json::Value> = fleet
        .as_ref()
        .map(|f| {
            f.books()
                .map(|bk| (bk.gpu.clone(), serde_json::to_value(bk).unwrap_or_default()))
                .collect()
        })
        .unwrap_or_default();
    let list: Vec<_> = b
        .site
        .gpus()
        .iter()
        .map(|g| {
            let o = |m: &str| b.snapshot.observe(&g.id, m, b.time).map(|o| o.value);
            json!({
                "id": g.id.to_string(),
                "node": g.node.id,
                "rack": g.rack.id,
                "model": g.model.name,
                "power_w": o(POWER_W),
                "temp_c": o(telemetry::metric::names::GPU_TEMP_C),
                "cap": b.state.caps.get(&g.id),
                "agent": books.get(&g.id),
            })
        })
        .collect();
    json!({ "gpus": list })
}

fn decisions(b: &Board, query: &str) -> Result<serde_json::Value, String> {
    let mut rule = None;
    let mut action = None;
    let mut target = None;
    let mut since = None;
    let mut limit = 100usize;
    for (k, v) in query::pairs(query)? {
        match k.as_str() {
            "rule" => rule = Some(v),
            "action" => action = Some(v),
            "target" => target = Some(v),
            "since" => {
                since = Some(Timestamp::parse_rfc3339(&query::offset_plus(&v)).map_err(|e| {
                    format!("since: {e} (use RFC 3339, e.g. 2026-11-30T08:00:00Z or ...T09:00:00%2B01:00)")
                })?)
            }
            "limit" => {
                limit = v
                    .parse()
                    .map_err(|_| format!("limit: {v:?} is not a number"))?;
                if limit == 0 || limit > RECENT_DECISIONS {
                    return Err(format!("limit must be within 1..={RECENT_DECISIONS}"));
                }
            }
            other => {
                return Err(format!(
                    "unknown filter {other:?} (rule, action, target, since, limit)"
                ))
            }
        }
    }
    let list: Vec<&Decision> = b
        .recent
        .iter()
        .rev()
        .filter(|d| {
            rule.as_ref()
                .is_none_or(|r| d.rule == *r || d.rule.starts_with(&format!("{r}.")))
        })
        .filter(|d| {
            action
                .as_deref()
                .is_none_or(|a| action_kind(&d.action) == a)
        })
        .filter(|d| {
            target
                .as_ref()
                .is_none_or(|t| d.target.to_string().contains(t.as_str()))
        })
        .filter(|d| since.is_none_or(|s| d.time >= s))
        .take(limit)
        .collect();
    Ok(json!({ "decisions": list, "newest_first": true }))
}

/// The OpenAPI 3 description of the API.
pub fn openapi() -> serde_json::Value {
    let get = |summary: &str, role: &str| {
        json!({ "get": {
            "summary": summary,
            "description": format!("Needs a {role} token."),
            "security": [{ "bearer": [] }],
            "responses": {
                "200": { "description": "OK", "content": { "application/json": {} } },
                "401": { "description": "no token, or an unknown one" },
                "403": { "description": "the token's role may not do this" }
            }
        }})
    };
    let mut decisions = get("Recent decisions, newest first", "viewer");
    decisions["get"]["parameters"] = json!([
        { "name": "rule", "in": "query", "schema": { "type": "string" }, "description": "a rule or a rule family (`thermal` matches `thermal.inlet`)" },
        { "name": "action", "in": "query", "schema": { "type": "string", "enum": ["cap", "uncap", "hold", "release"] } },
        { "name": "target", "in": "query", "schema": { "type": "string" }, "description": "substring of the target (`rack/a01`, `slurm:12`)" },
        { "name": "since", "in": "query", "schema": { "type": "string", "format": "date-time" } },
        { "name": "limit", "in": "query", "schema": { "type": "integer", "minimum": 1, "maximum": RECENT_DECISIONS, "default": 100 } }
    ]);
    json!({
        "openapi": "3.0.3",
        "info": { "title": "powerplane", "version": "1", "description": "The controller's status, decisions and agents. Roles: viewer < operator < admin." },
        "components": { "securitySchemes": { "bearer": { "type": "http", "scheme": "bearer" } } },
        "paths": {
            "/": { "get": { "summary": "The status page (HTML; a bearer token or the session cookie of POST /login, unless status_page_public)", "responses": { "200": { "description": "text/html" }, "401": { "description": "the login form" } } } },
            "/login": { "post": { "summary": "Log in to the status page: a form field token=...; sets an HttpOnly, SameSite=Strict session cookie and redirects to /", "requestBody": { "required": true, "content": { "application/x-www-form-urlencoded": {} } }, "responses": { "303": { "description": "logged in" }, "401": { "description": "unknown token; the login form again" } } } },
            "/logout": { "post": { "summary": "End the session of the cookie sent", "responses": { "303": { "description": "logged out" } } } },
            "/healthz": { "get": { "summary": "Alive: 200 while the process serves", "responses": { "200": { "description": "alive" } } } },
            "/readyz": { "get": { "summary": "Ready: the store reachable, the policy valid, the sources fresh; the HA role", "responses": { "200": { "description": "ready, with each check" }, "503": { "description": "not ready, naming each failing check" } } } },
            "/metrics": { "get": { "summary": "Prometheus metrics (public unless metrics_public = false)", "responses": { "200": { "description": "text exposition format 0.0.4" } } } },
            "/api/v1/status": get("The site at a glance: facility power against budget, price, caps and holds in force, each rack's predicted inlet headroom (limit − margin − predicted peak, and when)", "viewer"),
            "/api/v1/racks": get("Per rack: power, budget, headroom, inlet against its limit, caps, the predicted inlet (predictive thermal rule)", "viewer"),
            "/api/v1/gpus": get("Per GPU: power, temperature, cap in force, and what its agent acknowledged and enforces", "viewer"),
            "/api/v1/schedulers": get("The schedulers powerplane steers: Slurm's holds that are powerplane's, call counters and the last error, every job's lifecycle and the recent transitions", "viewer"),
            "/api/v1/holds": get("Jobs held by powerplane, with their leases", "viewer"),
            "/api/v1/jobs": get("Pending and running jobs, each with its hold if powerplane holds it", "viewer"),
            "/api/v1/policy": get("The policy in force, as written (file, text, sha256, loaded_at), and the outcome of the last reload (valid, last_error as file:line:col lines, reloads)", "viewer"),
            "/api/v1/decisions": decisions,
            "/api/v1/overrides": {
                "get": { "summary": "Overrides in force", "description": "Needs a viewer token.", "security": [{ "bearer": [] }], "responses": { "200": { "description": "OK" } } },
                "post": {
                    "summary": "Set an override with an expiry: pin a rack's GPUs at a cap, or exempt a job from holds",
                    "description": "Needs an operator token. Body: {\"kind\": \"pin_rack_cap\", \"rack\": \"a01\", \"watts_per_gpu\": 200, \"for_s\": 3600, \"reason\": \"...\"} or {\"kind\": \"exempt_job\", \"job\": \"slurm:1234\", \"for_s\": 3600}. A pin never raises a lower cap of the policy.",
                    "security": [{ "bearer": [] }],
                    "requestBody": { "required": true, "content": { "application/json": {} } },
                    "responses": { "201": { "description": "set" }, "400": { "description": "invalid, with the reason" }, "403": { "description": "not an operator" } }
                }
            },
            "/api/v1/events": {
                "post": {
                    "summary": "A scheduler's job event: submitted, started, finished or cancelled",
                    "description": "Signed (X-Powerplane-Timestamp: Unix seconds; X-Powerplane-Signature: sha256=HMAC-SHA256(key, timestamp + '.' + body) in hex) or with an operator bearer token. Body: {\"event\": \"submitted\", \"scheduler\": \"lsf\", \"job\": \"1234\", \"class\": \"batch\", \"project\": \"p\", \"user\": \"u\", \"gpus\": 2, \"deadline\": \"2030-01-01T00:00:00Z\", \"est_duration_s\": 3600}; see docs/schedulers.md. At most 64 KiB.",
                    "requestBody": { "required": true, "content": { "application/json": {} } },
                    "responses": { "202": { "description": "stored: the job is in the registry" }, "503": { "description": "taken but not stored within ack_wait_s, or too many events waiting; resend" }, "400": { "description": "bad event, with the reason" }, "401": { "description": "unsigned, bad signature, stale timestamp or unknown token" }, "404": { "description": "no [schedulers.webhook] section" }, "413": { "description": "too large" } }
                }
            },
            "/api/v1/k8s/admission": {
                "post": { "summary": "Mutating admission webhook: an AdmissionReview (admission.k8s.io/v1) in, the review with a JSONPatch adding powerplane's scheduling gate to pods of deferrable classes out", "description": "No token (the API server calls it). With [schedulers.kubernetes].", "requestBody": { "required": true, "content": { "application/json": {} } }, "responses": { "200": { "description": "the AdmissionReview response" }, "400": { "description": "not an AdmissionReview" } } }
            },
            "/api/v1/k8s/filter": {
                "post": { "summary": "Scheduler extender filter: ExtenderArgs in, ExtenderFilterResult out; drops nodes in racks over their inlet limit while cooler ones remain", "description": "No token (kube-scheduler calls it).", "requestBody": { "required": true, "content": { "application/json": {} } }, "responses": { "200": { "description": "ExtenderFilterResult" } } }
            },
            "/api/v1/k8s/prioritize": {
                "post": { "summary": "Scheduler extender prioritize: ExtenderArgs in, HostPriorityList (0-10) out; capped and hot nodes score lower", "description": "No token (kube-scheduler calls it).", "requestBody": { "required": true, "content": { "application/json": {} } }, "responses": { "200": { "description": "HostPriorityList" } } }
            },
            "/api/v1/overrides/{id}": {
                "delete": {
                    "summary": "Remove an override", "description": "Needs an operator token.", "security": [{ "bearer": [] }],
                    "parameters": [{ "name": "id", "in": "path", "required": true, "schema": { "type": "string" } }],
                    "responses": { "200": { "description": "removed" }, "404": { "description": "no such override" } }
                }
            },
            "/api/v1/agents": get("The agents: desired, sent, acknowledged and enforced state per GPU; agent health per node", "viewer"),
            "/api/v1/openapi.json": { "get": { "summary": "This document", "responses": { "200": { "description": "OK" } } } }
        }
    })
}
