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

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::Value;
use thiserror::Error;

use crate::mapping::Reject;
use crate::{EntityId, EntityKind, Sample, Timestamp};
use extract::Found;

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
        let mut w = Walk {
            ep: self,
            out: Polled {
                endpoint: self.cfg.name.clone(),
                ..Polled::default()
            },
            now,
            plan: Vec::new(),
            mains: BTreeMap::new(),
        };
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
                    w = Walk {
                        ep: self,
                        out: Polled {
                            endpoint: self.cfg.name.clone(),
                            ..Polled::default()
                        },
                        now,
                        plan: Vec::new(),
                        mains: BTreeMap::new(),
                    };
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

/// One walk of one endpoint, collecting samples and per-resource rejects.
struct Walk<'a> {
    ep: &'a Endpoint,
    out: Polled,
    now: Timestamp,
    /// What discovery found worth reading again.
    plan: Vec<Read>,
    mains: BTreeMap<EntityId, Vec<Found>>,
}

fn link(v: &Value, key: &str) -> Option<String> {
    v.get(key)?.get("@odata.id")?.as_str().map(str::to_string)
}

fn members(v: &Value) -> Vec<String> {
    v.get("Members")
        .and_then(Value::as_array)
        .map(|m| {
            m.iter()
                .filter_map(|x| x.get("@odata.id")?.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

fn last_segment(path: &str) -> &str {
    path.trim_end_matches('/')
        .rsplit('/')
        .next()
        .unwrap_or(path)
}

impl Walk<'_> {
    fn get(&mut self, path: &str) -> Result<Value, RedfishError> {
        self.out.requests += 1;
        self.ep.get(path)
    }

    /// GET that records a failure as a reject and carries on.
    fn try_get(&mut self, path: &str) -> Option<Value> {
        match self.get(path) {
            Ok(v) => Some(v),
            Err(e) => {
                self.out.rejects.push(Reject {
                    reason: e.reason(),
                    detail: e.to_string(),
                });
                None
            }
        }
    }

    fn collection(&mut self, parent: &Value, key: &str) -> Vec<(String, Value)> {
        let Some(path) = link(parent, key) else {
            return Vec::new();
        };
        let Some(coll) = self.try_get(&path) else {
            return Vec::new();
        };
        members(&coll)
            .into_iter()
            .filter_map(|m| self.try_get(&m).map(|v| (m, v)))
            .collect()
    }

    fn emit(&mut self, entity: &EntityId, found: Vec<Found>) {
        for f in found {
            let unit = crate::metric::spec(f.metric)
                .map(|s| s.unit.to_string())
                .unwrap_or_default();
            self.out.samples.push(Sample {
                entity: entity.clone(),
                metric: crate::Metric::new(f.metric),
                value: f.value,
                unit,
                ts: self.now,
                source: format!("redfish:{}{}", self.ep.cfg.name, f.from),
                quality: f.quality,
            });
        }
    }

    /// Extracts a resource's readings, emits them, and remembers the resource for the
    /// polls that follow discovery when it gave any.
    fn read(&mut self, kind: Kind, entity: &EntityId, path: &str, v: &Value) {
        let found = kind.extract(entity, path, v);
        if found.iter().any(|(_, f)| !f.is_empty()) || kind == Kind::Mains {
            self.plan.push(Read {
                path: path.to_string(),
                kind,
                entity: entity.clone(),
            });
        }
        if kind == Kind::Mains {
            self.mains
                .entry(entity.clone())
                .or_default()
                .extend(found.into_iter().flat_map(|(_, f)| f));
            return;
        }
        for (e, f) in found {
            self.emit(&e, f);
        }
    }

    fn read_link(&mut self, kind: Kind, entity: &EntityId, parent: &Value, key: &str) {
        if let Some(p) = link(parent, key) {
            if let Some(v) = self.try_get(&p) {
                self.read(kind, entity, &p, &v);
            }
        }
    }

    /// Sums each PDU's mains into its own readings.
    fn flush_mains(&mut self) {
        for (e, found) in std::mem::take(&mut self.mains) {
            self.emit(&e, sum_by_metric(found));
        }
    }

    /// The polls after discovery: only the resources that gave readings.
    fn replay(&mut self, plan: &[Read]) -> Result<(), RedfishError> {
        for r in plan {
            match self.get(&r.path) {
                Ok(v) => self.read(r.kind, &r.entity, &r.path, &v),
                Err(e) if e.reason() == "http_status" => return Err(e), // the tree changed: discover again
                Err(e) if matches!(e.reason(), "timeout" | "unreachable" | "tls") => return Err(e),
                Err(e) => self.out.rejects.push(Reject {
                    reason: e.reason(),
                    detail: e.to_string(),
                }),
            }
        }
        self.flush_mains();
        Ok(())
    }

    fn chassis(&mut self, root: &Value) {
        for (path, c) in self.collection(root, "Chassis") {
            let id = last_segment(&path).to_string();
            let entity = self
                .ep
                .entity(&format!("Chassis/{id}"), EntityKind::Node, &id);
            // legacy first: where both exist, the current model's reading is the one kept
            self.read_link(Kind::LegacyPower, &entity, &c, "Power");
            self.read_link(Kind::LegacyThermal, &entity, &c, "Thermal");
            if let Some(ts) = link(&c, "ThermalSubsystem").and_then(|p| self.try_get(&p)) {
                self.read_link(Kind::ThermalMetrics, &entity, &ts, "ThermalMetrics");
            }
            if let Some(ps) = link(&c, "PowerSubsystem").and_then(|p| self.try_get(&p)) {
                for (pp, psu) in self.collection(&ps, "PowerSupplies") {
                    let e = EntityId::new(
                        EntityKind::Node,
                        format!("{}.psu.{}", entity.name, last_segment(&pp)),
                    );
                    self.read_link(Kind::PowerSupply, &e, &psu, "Metrics");
                }
            }
            self.read_link(Kind::Environment, &entity, &c, "EnvironmentMetrics");
            for (sp, s) in self.collection(&c, "Sensors") {
                self.read(Kind::Sensor, &entity, &sp, &s);
            }
        }
    }

    fn power_equipment(&mut self, root: &Value) {
        let Some(pe) = link(root, "PowerEquipment").and_then(|p| self.try_get(&p)) else {
            return;
        };
        for (path, pdu) in self.collection(&pe, "RackPDUs") {
            let id = last_segment(&path).to_string();
            let entity = self
                .ep
                .entity(&format!("RackPDUs/{id}"), EntityKind::Pdu, &id);
            for (mp, m) in self.collection(&pdu, "Mains") {
                self.read(Kind::Mains, &entity, &mp, &m);
            }
            for (bp, b) in self.collection(&pdu, "Branches") {
                let e = EntityId::new(
                    EntityKind::Branch,
                    format!("{}.{}", entity.name, last_segment(&bp)),
                );
                self.read(Kind::Circuit, &e, &bp, &b);
            }
            for (op, o) in self.collection(&pdu, "Outlets") {
                let e = EntityId::new(
                    EntityKind::Outlet,
                    format!("{}.{}", entity.name, last_segment(&op)),
                );
                self.read(Kind::Circuit, &e, &op, &o);
            }
        }
        self.flush_mains();
    }

    fn thermal_equipment(&mut self, root: &Value) {
        let Some(te) = link(root, "ThermalEquipment").and_then(|p| self.try_get(&p)) else {
            return;
        };
        for (path, cdu) in self.collection(&te, "CDUs") {
            let id = last_segment(&path).to_string();
            let entity = self
                .ep
                .entity(&format!("CDUs/{id}"), EntityKind::Cooling, &id);
            self.read_link(Kind::Environment, &entity, &cdu, "EnvironmentMetrics");
            for (loop_key, loop_name) in [
                ("PrimaryCoolantConnectors", "primary"),
                ("SecondaryCoolantConnectors", "secondary"),
            ] {
                let conns = self.collection(&cdu, loop_key);
                let single = conns.len() == 1;
                for (cp, c) in conns {
                    let name = if single {
                        format!("{}.{loop_name}", entity.name)
                    } else {
                        format!("{}.{loop_name}{}", entity.name, last_segment(&cp))
                    };
                    self.read(
                        Kind::Coolant,
                        &EntityId::new(EntityKind::Cooling, name),
                        &cp,
                        &c,
                    );
                }
            }
            for (pp, p) in self.collection(&cdu, "Pumps") {
                let e = EntityId::new(
                    EntityKind::Cooling,
                    format!("{}.pump{}", entity.name, last_segment(&pp)),
                );
                self.read(Kind::Pump, &e, &pp, &p);
            }
            if let Some((lp, ld)) =
                link(&cdu, "LeakDetection").and_then(|p| self.try_get(&p).map(|v| (p, v)))
            {
                // detectors as linked resources, or inline in their groups
                for (dp, d) in self.collection(&ld, "LeakDetectors") {
                    let e = EntityId::new(
                        EntityKind::Cooling,
                        format!("{}.leak.{}", entity.name, last_segment(&dp)),
                    );
                    self.read(Kind::LeakDetector, &e, &dp, &d);
                }
                self.read(Kind::LeakGroups, &entity, &lp, &ld);
            }
        }
    }
}

/// How to read a resource that discovery found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    LegacyPower,
    LegacyThermal,
    ThermalMetrics,
    PowerSupply,
    Environment,
    Sensor,
    /// A PDU's mains: summed over all of them into the PDU's own readings.
    Mains,
    Circuit,
    Coolant,
    Pump,
    LeakDetector,
    /// `LeakDetection` with its detectors inline in groups.
    LeakGroups,
}

impl Kind {
    fn extract(self, entity: &EntityId, path: &str, v: &Value) -> Vec<(EntityId, Vec<Found>)> {
        let one = |f: Vec<Found>| vec![(entity.clone(), f)];
        match self {
            Kind::LegacyPower => one(extract::legacy_power(v, path)),
            Kind::LegacyThermal => one(extract::legacy_thermal(v, path)),
            Kind::Environment => one(extract::environment(v, path)),
            Kind::ThermalMetrics => one(extract::thermal_metrics(v, path)),
            Kind::PowerSupply => one(extract::power_supply(v, path)),
            Kind::Sensor => one(extract::sensor(v, path)),
            Kind::Mains | Kind::Circuit => one(extract::circuit(v, path)),
            Kind::Coolant => one(extract::coolant_connector(v, path)),
            Kind::Pump => one(extract::pump(v, path)),
            Kind::LeakDetector => one(extract::leak_detector(v, path)),
            Kind::LeakGroups => {
                let mut out = Vec::new();
                for (gi, g) in v
                    .get("LeakDetectorGroups")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .enumerate()
                {
                    for (di, d) in g
                        .get("Detectors")
                        .and_then(Value::as_array)
                        .into_iter()
                        .flatten()
                        .enumerate()
                    {
                        let id = d
                            .get("DataSourceUri")
                            .and_then(Value::as_str)
                            .map(last_segment)
                            .map(str::to_string)
                            .unwrap_or_else(|| format!("{gi}-{di}"));
                        let e = EntityId::new(
                            EntityKind::Cooling,
                            format!("{}.leak.{id}", entity.name),
                        );
                        out.push((
                            e,
                            extract::leak_detector(
                                d,
                                &format!("{path}#LeakDetectorGroups/{gi}/Detectors/{di}"),
                            ),
                        ));
                    }
                }
                out
            }
        }
    }
}

/// One resource to GET on every poll, and how to read it.
#[derive(Debug, Clone, PartialEq)]
struct Read {
    path: String,
    kind: Kind,
    entity: EntityId,
}

/// Several mains of one PDU: power, current and energy add up; voltage is the first.
fn sum_by_metric(found: Vec<Found>) -> Vec<Found> {
    let mut out: Vec<Found> = Vec::new();
    for f in found {
        match out.iter_mut().find(|o| o.metric == f.metric) {
            Some(o) if f.metric != crate::metric::names::VOLTAGE_V => {
                o.value += f.value;
                o.quality = o.quality.max(f.quality);
            }
            Some(_) => {}
            None => out.push(f),
        }
    }
    out
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
            log: super::log_limit::LogLimiter::default(),
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
                        match r {
                            Ok(p) => p,
                            Err(e) => Polled {
                                endpoint: ep.cfg.name.clone(),
                                error: Some(e.to_string()),
                                rejects: vec![Reject {
                                    reason: e.reason(),
                                    detail: e.to_string(),
                                }],
                                ..Polled::default()
                            },
                        }
                    } else {
                        match ep.poll(now) {
                            Ok(p) => p,
                            Err(e) => Polled {
                                endpoint: ep.cfg.name.clone(),
                                error: Some(e.to_string()),
                                rejects: vec![Reject {
                                    reason: e.reason(),
                                    detail: e.to_string(),
                                }],
                                ..Polled::default()
                            },
                        }
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
