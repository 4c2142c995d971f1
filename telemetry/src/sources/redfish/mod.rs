//! The Redfish source: polls BMCs, PDUs and CDUs, discovering from the service root.
//!
//! Per poll it walks `Chassis` (legacy `Power`/`Thermal`, `EnvironmentMetrics`,
//! `Sensors`), `PowerEquipment/RackPDUs` (`Mains`, `Branches`, `Outlets`) and
//! `ThermalEquipment/CDUs` (coolant connectors, pumps, leak detectors). Each endpoint has
//! its own client (auth, TLS, timeout); endpoints are polled in parallel up to a
//! concurrency limit, and an endpoint that fails is retried with backoff without
//! holding up the others.

pub mod extract;
mod tls;
mod walk;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::Value;
use thiserror::Error;

use crate::mapping::Reject;
use crate::{EntityId, EntityKind, Sample, Timestamp};
use walk::{Read, Walk};

/// How to authenticate.
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "snake_case", tag = "kind")]
pub enum Auth {
    #[default]
    None,
    /// HTTP Basic on every request.
    Basic { username: String, password: String },
    /// A Redfish session: one login, then `X-Auth-Token` (logged in again on 401).
    Session { username: String, password: String },
}

pub use crate::sources::tls::Tls;

/// One BMC, PDU or CDU.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EndpointConfig {
    /// A short name, used in default entity names and in sample sources.
    pub name: String,
    /// Base URL, e.g. `https://10.1.2.3` (the service root is `/redfish/v1`).
    pub url: String,
    #[serde(default)]
    pub auth: Auth,
    #[serde(default)]
    pub tls: Tls,
    #[serde(default = "default_timeout")]
    pub timeout_s: f64,
    /// Entity for a resource, by its path under `/redfish/v1/`: `"Chassis/1U" =
    /// "node/a01-n01"`, `"RackPDUs/1" = "pdu/pdu-a01"`, `"CDUs/1" = "cooling/cdu-1"`.
    /// Unlisted resources are named `{name}.{id}`.
    #[serde(default)]
    pub entities: BTreeMap<String, String>,
}

fn default_timeout() -> f64 {
    5.0
}

impl EndpointConfig {
    pub fn new(name: &str, url: &str) -> Self {
        EndpointConfig {
            name: name.into(),
            url: url.trim_end_matches('/').into(),
            auth: Auth::None,
            tls: Tls::default(),
            timeout_s: default_timeout(),
            entities: BTreeMap::new(),
        }
    }
}

#[derive(Debug, Error)]
pub enum RedfishError {
    #[error("redfish {endpoint}: {message}")]
    Config { endpoint: String, message: String },
    #[error("redfish {endpoint}: GET {path}: {kind}: {message}")]
    Fetch {
        endpoint: String,
        path: String,
        kind: &'static str,
        message: String,
    },
}

impl RedfishError {
    /// A short label for counters: `timeout`, `unreachable`, `http_status`, `bad_json`, `tls`, `auth`.
    pub fn reason(&self) -> &'static str {
        match self {
            RedfishError::Config { .. } => "config",
            RedfishError::Fetch { kind, .. } => kind,
        }
    }
}

/// Polls between two full discoveries of an endpoint's tree (new outlets, a swapped
/// PDU); in between only the resources that gave readings are read.
pub const REDISCOVER_EVERY: u32 = 360;

/// One endpoint with its client and its health.
pub struct Endpoint {
    pub cfg: EndpointConfig,
    client: reqwest::blocking::Client,
    token: Mutex<Option<String>>,
    /// What discovery found to read, and how many polls have used it.
    plan: Mutex<Option<(Vec<Read>, u32)>>,
    /// Where this endpoint's rediscovery cycle starts, spread by its name.
    first_rediscovery_at: u32,
    first_rediscovery_done: std::sync::atomic::AtomicBool,
    failures: u32,
    retry_at: Option<Instant>,
}

/// What one poll of one endpoint gave.
#[derive(Debug, Clone, Default)]
pub struct Polled {
    pub endpoint: String,
    pub samples: Vec<Sample>,
    pub rejects: Vec<Reject>,
    /// The endpoint could not be polled at all (and is backing off).
    pub error: Option<String>,
    /// Skipped: still backing off after an earlier failure.
    pub skipped: bool,
    /// Not discovered yet: the poll's discovery budget was spent; next poll.
    pub deferred: bool,
    pub elapsed: Duration,
    pub requests: usize,
}

impl Polled {
    /// An endpoint that could not be polled at all.
    fn failed(ep: &Endpoint, e: &RedfishError) -> Polled {
        Polled {
            endpoint: ep.cfg.name.clone(),
            error: Some(e.to_string()),
            rejects: vec![Reject {
                reason: e.reason(),
                detail: e.to_string(),
            }],
            ..Polled::default()
        }
    }
}

impl Endpoint {
    pub fn new(cfg: EndpointConfig) -> Result<Self, RedfishError> {
        let client = tls::client(&cfg)?;
        Ok(Self::with_client(cfg, client))
    }

    /// An endpoint that shares a client (and its connection pool) with others of the
    /// same TLS settings and timeout.
    fn with_client(cfg: EndpointConfig, client: reqwest::blocking::Client) -> Self {
        // spread rediscovery over the polls instead of doing every endpoint at once
        let offset = cfg
            .name
            .bytes()
            .fold(0u32, |h, b| h.wrapping_mul(31).wrapping_add(u32::from(b)))
            % REDISCOVER_EVERY;
        Endpoint {
            cfg,
            client,
            token: Mutex::new(None),
            plan: Mutex::new(None),
            first_rediscovery_at: offset,
            first_rediscovery_done: std::sync::atomic::AtomicBool::new(false),
            failures: 0,
            retry_at: None,
        }
    }

    fn fail(&self, path: &str, kind: &'static str, message: impl Into<String>) -> RedfishError {
        RedfishError::Fetch {
            endpoint: self.cfg.name.clone(),
            path: path.to_string(),
            kind,
            message: message.into(),
        }
    }

    /// GETs a resource as JSON.
    pub fn get(&self, path: &str) -> Result<Value, RedfishError> {
        for attempt in 0..2 {
            let url = format!("{}{path}", self.cfg.url);
            let mut req = self.client.get(&url).header("Accept", "application/json");
            match &self.cfg.auth {
                Auth::None => {}
                Auth::Basic { username, password } => {
                    req = req.basic_auth(username, Some(password))
                }
                Auth::Session { .. } => req = req.header("X-Auth-Token", self.session_token()?),
            }
            let resp = req
                .send()
                .map_err(|e| self.fail(path, classify(&e), chain(&e)))?;
            let status = resp.status();
            if status.as_u16() == 401
                && attempt == 0
                && matches!(self.cfg.auth, Auth::Session { .. })
            {
                *self.token.lock().unwrap_or_else(|p| p.into_inner()) = None;
                continue;
            }
            if status.as_u16() == 401 || status.as_u16() == 403 {
                return Err(self.fail(path, "auth", format!("HTTP {status}")));
            }
            if !status.is_success() {
                return Err(self.fail(path, "http_status", format!("HTTP {status}")));
            }
            let body = resp
                .bytes()
                .map_err(|e| self.fail(path, classify(&e), chain(&e)))?;
            return serde_json::from_slice(&body)
                .map_err(|e| self.fail(path, "bad_json", e.to_string()));
        }
        Err(self.fail(path, "auth", "session login rejected twice"))
    }

    fn session_token(&self) -> Result<String, RedfishError> {
        let mut guard = self.token.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(t) = guard.as_ref() {
            return Ok(t.clone());
        }
        let Auth::Session { username, password } = &self.cfg.auth else {
            return Err(self.fail("", "auth", "no session credentials"));
        };
        let path = "/redfish/v1/SessionService/Sessions";
        let resp = self
            .client
            .post(format!("{}{path}", self.cfg.url))
            .json(&serde_json::json!({ "UserName": username, "Password": password }))
            .send()
            .map_err(|e| self.fail(path, classify(&e), chain(&e)))?;
        if !resp.status().is_success() {
            return Err(self.fail(
                path,
                "auth",
                format!("session login: HTTP {}", resp.status()),
            ));
        }
        let token = resp
            .headers()
            .get("X-Auth-Token")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
            .ok_or_else(|| self.fail(path, "auth", "session login gave no X-Auth-Token"))?;
        *guard = Some(token.clone());
        Ok(token)
    }

    fn entity(&self, key: &str, kind: EntityKind, id: &str) -> EntityId {
        self.cfg
            .entities
            .get(key)
            .and_then(|e| e.parse().ok())
            .unwrap_or_else(|| EntityId::new(kind, format!("{}.{id}", self.cfg.name)))
    }

    /// Whether the next poll walks the whole tree (never discovered, or due again).
    pub fn needs_discovery(&self) -> bool {
        self.plan
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .is_none_or(|(_, polls)| *polls >= REDISCOVER_EVERY)
    }

    /// One full walk of the endpoint.
    pub fn poll(&self, now: Timestamp) -> Result<Polled, RedfishError> {
        let started = Instant::now();
        let mut w = Walk::new(self, now);
        let cached = {
            let mut g = self.plan.lock().unwrap_or_else(|p| p.into_inner());
            match g.as_mut() {
                Some((plan, polls)) if *polls < REDISCOVER_EVERY => {
                    *polls += 1;
                    Some(plan.clone())
                }
                _ => None,
            }
        };
        if let Some(plan) = cached {
            match w.replay(&plan) {
                Ok(()) => {
                    w.out.elapsed = started.elapsed();
                    return Ok(w.out);
                }
                Err(e) => {
                    *self.plan.lock().unwrap_or_else(|p| p.into_inner()) = None;
                    if e.reason() != "http_status" {
                        return Err(e);
                    }
                    // a resource went away: discover the tree again right now
                    w = Walk::new(self, now);
                }
            }
        }
        let root = w.get("/redfish/v1")?;
        w.chassis(&root);
        w.power_equipment(&root);
        w.thermal_equipment(&root);
        let polls = if self.first_rediscovery_done.swap(true, Ordering::Relaxed) {
            0
        } else {
            self.first_rediscovery_at
        };
        *self.plan.lock().unwrap_or_else(|p| p.into_inner()) =
            Some((std::mem::take(&mut w.plan), polls));
        w.out.elapsed = started.elapsed();
        Ok(w.out)
    }
}

fn classify(e: &reqwest::Error) -> &'static str {
    let text = chain(e).to_ascii_lowercase();
    if e.is_timeout() || text.contains("timed out") {
        "timeout"
    } else if text.contains("certificate") || text.contains("tls") || text.contains("handshake") {
        "tls"
    } else {
        // refused, reset, DNS: the endpoint cannot be reached
        "unreachable"
    }
}

/// An error and its causes on one line.
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

/// Polls many endpoints in parallel, with backoff for the ones that fail.
pub struct Poller {
    pub endpoints: Vec<Endpoint>,
    pub concurrency: usize,
    /// The poll interval. Endpoints that only re-read what discovery found go first;
    /// a discovery (a full walk of a tree) then starts only when it is expected to end
    /// inside the interval, judged by how long recent discoveries took. The others wait
    /// for the next poll (`deferred`), so that every poll stays inside its interval
    /// while hundreds of endpoints are discovered at start-up.
    pub interval: Option<Duration>,
    /// Recent discovery duration (moving average), in seconds.
    discovery_s: Mutex<f64>,
    log: super::log_limit::LogLimiter,
}

/// 1 s, 2 s, 4 s ... up to 5 min between tries of a dead endpoint.
pub fn backoff(failures: u32) -> Duration {
    Duration::from_secs((1u64 << failures.saturating_sub(1).min(9)).min(300))
}

impl Poller {
    pub fn new(configs: Vec<EndpointConfig>, concurrency: usize) -> Result<Self, RedfishError> {
        // one client (one pool, one runtime thread) per distinct TLS setting and timeout
        let mut clients: BTreeMap<String, reqwest::blocking::Client> = BTreeMap::new();
        let mut endpoints = Vec::with_capacity(configs.len());
        for cfg in configs {
            let key = format!("{:?}/{}", cfg.tls, cfg.timeout_s);
            let client = match clients.get(&key) {
                Some(c) => c.clone(),
                None => {
                    let c = tls::client(&cfg)?;
                    clients.insert(key, c.clone());
                    c
                }
            };
            endpoints.push(Endpoint::with_client(cfg, client));
        }
        Ok(Poller {
            endpoints,
            concurrency: concurrency.max(1),
            interval: None,
            discovery_s: Mutex::new(0.0),
            // keys are endpoint × reason: bounded by the config, not by what BMCs send
            log: super::log_limit::LogLimiter::default().with_max_keys(16_384),
        })
    }

    /// Polls every endpoint that is not backing off; one result per endpoint, in order.
    pub fn poll(&mut self, now: Timestamp) -> Vec<Polled> {
        let started = Instant::now();
        let next = AtomicUsize::new(0);
        let results: Mutex<Vec<(usize, Polled)>> = Mutex::new(Vec::new());
        let eps = &self.endpoints;
        // re-reads first, discoveries after
        let mut order: Vec<usize> = (0..eps.len()).collect();
        order.sort_by_key(|&i| eps[i].needs_discovery());
        let order = &order;
        let interval = self.interval;
        let estimate = &self.discovery_s;
        let concurrency = self.concurrency;
        let discoveries = AtomicUsize::new(0);
        let discoveries = &discoveries;
        std::thread::scope(|s| {
            for _ in 0..self.concurrency.min(eps.len()) {
                s.spawn(|| loop {
                    let k = next.fetch_add(1, Ordering::SeqCst);
                    let Some(&i) = order.get(k) else { break };
                    let ep = &eps[i];
                    let discovering = ep.needs_discovery();
                    let expected = *estimate.lock().unwrap_or_else(|p| p.into_inner());
                    // a few discoveries per poll always start, so that none waits forever
                    let guaranteed = discoveries.load(Ordering::SeqCst) < (concurrency / 4).max(1);
                    let late = !guaranteed
                        && interval.is_some_and(|iv| {
                            started.elapsed().as_secs_f64() + expected > iv.as_secs_f64() * 0.9
                        });
                    let r = if ep.retry_at.is_some_and(|t| t > started) {
                        Polled {
                            endpoint: ep.cfg.name.clone(),
                            skipped: true,
                            ..Polled::default()
                        }
                    } else if late && discovering {
                        Polled {
                            endpoint: ep.cfg.name.clone(),
                            deferred: true,
                            ..Polled::default()
                        }
                    } else if discovering {
                        discoveries.fetch_add(1, Ordering::SeqCst);
                        let t = Instant::now();
                        let r = ep.poll(now);
                        let mut e = estimate.lock().unwrap_or_else(|p| p.into_inner());
                        *e = if *e == 0.0 {
                            t.elapsed().as_secs_f64()
                        } else {
                            0.8 * *e + 0.2 * t.elapsed().as_secs_f64()
                        };
                        r.unwrap_or_else(|e| Polled::failed(ep, &e))
                    } else {
                        ep.poll(now).unwrap_or_else(|e| Polled::failed(ep, &e))
                    };
                    results
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push((i, r));
                });
            }
        });
        let mut results = results.into_inner().unwrap_or_else(|p| p.into_inner());
        results.sort_by_key(|r| r.0);
        self.log.warn_suppressed("redfish", Instant::now());
        for (i, r) in &results {
            let ep = &mut self.endpoints[*i];
            if r.skipped || r.deferred {
                continue;
            }
            for rej in &r.rejects {
                if let Some(left_out) = self
                    .log
                    .allow(&format!("{}:{}", ep.cfg.name, rej.reason), Instant::now())
                {
                    tracing::warn!(endpoint = %ep.cfg.name, reason = rej.reason, left_out, "redfish: {}", rej.detail);
                }
            }
            if let Some(e) = &r.error {
                ep.failures += 1;
                ep.retry_at = Some(Instant::now() + backoff(ep.failures));
                tracing::debug!(endpoint = %ep.cfg.name, failures = ep.failures, error = %e, "redfish endpoint backing off");
            } else {
                ep.failures = 0;
                ep.retry_at = None;
            }
        }
        results.into_iter().map(|r| r.1).collect()
    }
}
