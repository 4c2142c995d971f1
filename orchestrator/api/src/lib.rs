//! The operator's HTTP side of `serve`: `/metrics` for Prometheus and a JSON API under
//! `/api/v1`, authenticated by bearer tokens with roles (viewer < operator < admin).
//!
//! The control loop publishes a [`Board`] after every tick; requests read it and never
//! touch the loop or the store, so a slow client cannot delay a tick.
//!
//! # Layout
//!
//! - this module: the JSON API's routes and `[http]`.
//! - `board`: the [`Board`] the loop publishes after every tick.
//! - `tokens`: bearer tokens and their roles; `views`: the JSON views; `openapi`: the spec.
//! - [`server`]: the listener, TLS, limits and timeouts, on the runtime.
//! - [`metrics`]: `/metrics` in the Prometheus text format.
//! - [`page`]: the status page.
//! - [`health`]: `/healthz` and `/readyz`.
//! - [`session`], [`stats`], [`tls`]: sessions, request counters, certificates and their reload.
#![forbid(unsafe_code)]

mod board;
mod books;
pub mod health;
pub mod metrics;
mod openapi;
pub mod page;
mod query;
pub mod render_cache;
pub mod server;
mod service;
pub mod session;
mod slots;
pub mod stats;
pub mod tls;
mod tokens;
mod views;

pub use board::{action_kind, Board, RECENT_DECISIONS};
pub use openapi::openapi;
pub use server::serve;
pub use tokens::{load_tokens, Role, Token, TokenConfig, MIN_TOKEN_CHARS};
use views::{decisions, gpus, policy, racks, status};

use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};

use serde::Deserialize;
use serde_json::json;
use sha2::{Digest, Sha256};
use tracing::warn;

use control::fleet::Fleet;

/// `[http]` in `powerplane.toml`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpSection {
    /// `host:port` to listen on.
    pub listen: String,
    /// `/metrics` without a token (Prometheus scrapes); `false` asks for a viewer token.
    #[serde(default = "yes")]
    pub metrics_public: bool,
    /// GPUs whose readings `/metrics` exports one by one at most; a site with more has
    /// them summed up by node (`kind = "node_gpus"`), so that a scrape stays small.
    #[serde(default = "default_gpu_series")]
    pub metrics_gpu_series: usize,
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
    /// `/readyz` fails when no tick completed for this many tick periods (at least
    /// 5 s): the loop is stalled (a hung disk, a store call that does not return).
    #[serde(default = "server::default_ready_stall_ticks")]
    pub ready_stall_ticks: f64,
    /// Serve HTTPS with this certificate chain (PEM) and key (PEM), reread on SIGHUP
    /// and when the files change.
    #[serde(default)]
    pub tls_cert_file: Option<PathBuf>,
    #[serde(default)]
    pub tls_key_file: Option<PathBuf>,
    /// How often to look at the certificate and key for a change (a renewed
    /// certificate, a Kubernetes Secret volume updated by cert-manager); 0: only on
    /// SIGHUP.
    #[serde(default = "default_tls_reload_s")]
    pub tls_reload_s: f64,
}

fn default_tls_reload_s() -> f64 {
    10.0
}

fn default_gpu_series() -> usize {
    metrics::DEFAULT_GPU_SERIES
}

fn five() -> u32 {
    5
}

fn yes() -> bool {
    true
}

/// What the server thread needs.
#[derive(Clone)]
pub struct Api {
    pub board: Arc<RwLock<Board>>,
    pub fleet: Option<Arc<Mutex<Fleet>>>,
    pub tokens: Vec<Token>,
    pub metrics_public: bool,
    /// `[http] metrics_gpu_series`.
    pub metrics_gpu_series: usize,
    pub status_page_public: bool,
    pub refresh_s: u32,
    pub overrides: Arc<Mutex<control::overrides::Book>>,
    /// The operators' grid targets (`/api/v1/grid/targets`).
    pub grid: Arc<Mutex<control::grid::targets::Book>>,
    /// Inbound job events and the Kubernetes hooks of the schedulers open now.
    pub hooks: Hooks,
    /// The HTTP edge's counters (connections, limits, logins, TLS) for `/metrics`.
    pub stats: Arc<stats::HttpStats>,
    /// `/metrics`, `/api/v1/status` and the status page, rendered once per tick.
    pub renders: Arc<Renders>,
}

/// The views rendered once per board version (see [`render_cache`]).
#[derive(Default)]
pub struct Renders {
    metrics: render_cache::RenderCache,
    status: render_cache::RenderCache,
    page: render_cache::RenderCache,
}

/// What the schedulers open now take from the HTTP server: inbound job events
/// (`POST /api/v1/events`, with `[schedulers.webhook]`), which with `[ha]` open when
/// this replica takes over and close when it steps down; and the Kubernetes admission
/// webhook and scheduler extender (`[schedulers.kubernetes]`), which every replica
/// answers, follower or leader (the API server and kube-scheduler reach any replica
/// behind the Service: the gate needs no state, the extender reads this replica's
/// view of the caps and racks).
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

    /// Opens (taking over) or closes (stepping down) the inbound job events; the
    /// Kubernetes hooks stay as configured.
    pub fn set_events(&self, events: Option<Arc<runtime::schedulers::Inbox>>) {
        self.0.write().unwrap_or_else(|p| p.into_inner()).0 = events;
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
    /// Shared, not copied: a render kept for the tick goes out to every request as is.
    pub body: hyper::body::Bytes,
    /// `WWW-Authenticate: Bearer` on 401.
    pub challenge: bool,
}

fn json_reply(status: u16, v: &serde_json::Value) -> Reply {
    Reply {
        status,
        content_type: "application/json",
        body: serde_json::to_vec_pretty(v).unwrap_or_default().into(),
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
            return self.metrics();
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
        if route == "grid" || route.starts_with("grid/") {
            return self.grid(method, route, authorization, body);
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
        self.read(route, query)
    }

    /// A copy of the board (its large parts shared) and its version, taken in moments
    /// under its lock.
    fn board_copy(&self) -> (u64, Board) {
        let board = self.board.read().unwrap_or_else(|p| p.into_inner());
        (board.version, board.clone())
    }

    /// The board's version now.
    fn version(&self) -> u64 {
        self.board.read().unwrap_or_else(|p| p.into_inner()).version
    }

    /// `GET /metrics` (the caller checked access): the tick's render, with what is read
    /// live (the tick's age, the leader, the store's reachability) and the HTTP edge's
    /// counters as they are now. The agents' figures are as of the render (at
    /// most 5 s old), read under the fleet's lock apart from the rest.
    fn metrics(&self) -> Reply {
        let body = self.renders.metrics.get(self.version(), || {
            let (_, board) = self.board_copy();
            // the agents' lock only while their families are written (the loop's
            // actuation takes it too)
            let fleet = self.fleet.as_ref().map(|f| {
                let f = f.lock().unwrap_or_else(|p| p.into_inner());
                metrics::render_fleet(&f.status())
            });
            let mut text = metrics::render_tick(&board, None, self.metrics_gpu_series);
            text.push_str(&fleet.unwrap_or_default());
            text.into_bytes()
        });
        let mut text = {
            let board = self.board.read().unwrap_or_else(|p| p.into_inner());
            metrics::render_live(&board)
        };
        self.stats.render_into(&mut text);
        let mut out = Vec::with_capacity(body.len() + text.len());
        out.extend_from_slice(&body);
        out.extend_from_slice(text.as_bytes());
        Reply {
            status: 200,
            content_type: "text/plain; version=0.0.4; charset=utf-8",
            body: out.into(),
            challenge: false,
        }
    }

    /// `GET /api/v1/{route}` of the read routes (the caller checked access).
    fn read(&self, route: &str, query: &str) -> Reply {
        if route == "status" {
            let body = self.renders.status.get(self.version(), || {
                let (_, board) = self.board_copy();
                json_reply(200, &status(&board)).body.to_vec()
            });
            return Reply {
                status: 200,
                content_type: "application/json",
                body,
                challenge: false,
            };
        }
        let board = self.board.read().unwrap_or_else(|p| p.into_inner());
        match route {
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
                Err(e) => error(400, &e.to_string()),
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
        let body = self.renders.page.get(self.version(), || {
            let (_, board) = self.board_copy();
            let fleet = self
                .fleet
                .as_ref()
                .map(|f| f.lock().unwrap_or_else(|p| p.into_inner()));
            let status = fleet.as_ref().map(|f| f.status());
            page::render(&board, status.as_ref(), self.refresh_s).into_bytes()
        });
        Reply {
            status: 200,
            content_type: "text/html; charset=utf-8",
            body,
            challenge: false,
        }
    }

    /// `POST /api/v1/k8s/{admission,filter,prioritize}`: called by the API server and
    /// kube-scheduler, which send no bearer token.
    fn k8s(&self, method: &str, verb: &str, body: &[u8]) -> Reply {
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
}
