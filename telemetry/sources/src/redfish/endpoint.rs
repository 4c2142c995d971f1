//! One BMC: its async client (auth, TLS, timeout), its session token, and one GET as
//! JSON under the global and per-endpoint limits; below the walks of [`super::poll`].

use std::sync::{Arc, Mutex};

use serde_json::Value;
use tokio::sync::Semaphore;

use super::stats::Counters;
use super::walk::Read;
use super::{tls, Auth, EndpointConfig, RedfishError};
use crate::http::{chain, classify};
use telemetry::{EntityId, EntityKind};

/// The largest resource read; a bigger body is refused (`oversize`) so that a broken
/// or hostile BMC cannot grow the controller.
pub const MAX_BODY_BYTES: usize = 8 << 20;

/// Every GET of every endpoint (one family without labels: a site has thousands of
/// BMCs; the per-endpoint counters say which one fails).
static GET_SECONDS: std::sync::LazyLock<Arc<telemetry::histogram::Histogram>> =
    std::sync::LazyLock::new(|| {
        telemetry::histogram::registry(
            "redfish_get_seconds",
            "Redfish GETs of all endpoints, from the wait for a slot to the body read, failed ones included",
            &[],
        )
    });

/// What discovery found to read, and how many polls have used it.
#[derive(Debug, Clone)]
pub(super) struct Plan {
    pub(super) reads: Vec<Read>,
    pub(super) polls: u32,
}

/// One endpoint with its client.
pub struct Endpoint {
    pub cfg: EndpointConfig,
    client: reqwest::Client,
    /// The session token; the lock is held across a login, so concurrent GETs of one
    /// endpoint log in once.
    token: tokio::sync::Mutex<Option<String>>,
    /// GETs in flight to this endpoint (`per_endpoint`).
    per: Semaphore,
    /// GETs of a background rediscovery: half of `per_endpoint`, so that the re-reads
    /// of the plan meanwhile wait behind two or so of them, not behind the whole walk.
    pub(super) background: Semaphore,
    /// GETs in flight over all endpoints (`concurrency`), shared by the poller.
    global: Arc<Semaphore>,
    pub(super) plan: Mutex<Option<Plan>>,
    pub(super) counters: Arc<Counters>,
    /// The `$expand` query the service root advertised (`None`: none, or the service
    /// refused it once and is read member by member from then on).
    pub(super) expand: Mutex<Option<&'static str>>,
    /// The service refused `$expand` or ignored it: never asked again.
    expand_off: std::sync::atomic::AtomicBool,
    /// The service answered `$expand` with the members: no more probing.
    expand_ok: std::sync::atomic::AtomicBool,
    /// Held by the one collection GET that finds out whether `$expand` works, so that
    /// a service that refuses it is asked once, not once per collection in flight.
    pub(super) expand_probe: tokio::sync::Mutex<()>,
}

impl Endpoint {
    /// A lone endpoint with its own client and limits (4 GETs at once).
    pub fn new(cfg: EndpointConfig) -> Result<Self, RedfishError> {
        let client = tls::client(&cfg)?;
        Ok(Self::with_client(
            cfg,
            client,
            4,
            Arc::new(Semaphore::new(4)),
        ))
    }

    /// An endpoint that shares a client (and its connection pool) and the global limit
    /// with others.
    pub(super) fn with_client(
        cfg: EndpointConfig,
        client: reqwest::Client,
        per_endpoint: usize,
        global: Arc<Semaphore>,
    ) -> Self {
        Endpoint {
            cfg,
            client,
            token: tokio::sync::Mutex::new(None),
            per: Semaphore::new(per_endpoint.max(1)),
            background: Semaphore::new((per_endpoint / 2).max(1)),
            global,
            plan: Mutex::new(None),
            counters: Arc::new(Counters::new()),
            expand: Mutex::new(None),
            expand_off: std::sync::atomic::AtomicBool::new(false),
            expand_ok: std::sync::atomic::AtomicBool::new(false),
            expand_probe: tokio::sync::Mutex::new(()),
        }
    }

    pub(super) fn fail(
        &self,
        path: &str,
        kind: &'static str,
        status: Option<u16>,
        message: impl Into<String>,
    ) -> RedfishError {
        self.fail_on("GET", path, kind, status, message)
    }

    fn fail_on(
        &self,
        method: &'static str,
        path: &str,
        kind: &'static str,
        status: Option<u16>,
        message: impl Into<String>,
    ) -> RedfishError {
        RedfishError::Fetch {
            endpoint: self.cfg.name.clone(),
            method,
            path: path.to_string(),
            kind,
            status,
            message: message.into(),
        }
    }

    /// GETs a resource as JSON, within both limits; a failure is counted by reason.
    pub async fn get(&self, path: &str) -> Result<Value, RedfishError> {
        let started = std::time::Instant::now();
        let r = self.get_uncounted(path).await;
        GET_SECONDS.observe(started.elapsed());
        if let Err(e) = &r {
            self.counters.failure(e.failure());
        }
        r
    }

    pub(super) async fn get_uncounted(&self, path: &str) -> Result<Value, RedfishError> {
        // this endpoint's limit first, so that no global permit waits on it
        let closed = |_| self.fail(path, "config", None, "poller closed");
        let _mine = self.per.acquire().await.map_err(closed)?;
        let _global = self.global.acquire().await.map_err(closed)?;
        let resp = self.authorized(path, None).await?;
        if !resp.status().is_success() {
            return Err(self.fail(
                path,
                "http_status",
                Some(resp.status().as_u16()),
                format!("HTTP {}", resp.status()),
            ));
        }
        let body = self.body(path, resp).await?;
        serde_json::from_slice(&body).map_err(|e| self.fail(path, "bad_json", None, e.to_string()))
    }

    /// POSTs `body` to an action's `target` (`ComputerSystem.Reset`, ...), within both
    /// limits and with the endpoint's auth; anything but 2xx is an error, counted by
    /// reason.
    pub async fn post_action(&self, target: &str, body: &Value) -> Result<(), RedfishError> {
        let r = async {
            let closed = |_| self.fail_on("POST", target, "config", None, "poller closed");
            let _mine = self.per.acquire().await.map_err(closed)?;
            let _global = self.global.acquire().await.map_err(closed)?;
            let resp = self.authorized(target, Some(body)).await?;
            let status = resp.status();
            if !status.is_success() {
                // the service's own message (a Redfish error body) says why
                let text = resp.text().await.unwrap_or_default();
                let why = serde_json::from_str::<Value>(&text)
                    .ok()
                    .and_then(|v| v["error"]["message"].as_str().map(str::to_string))
                    .unwrap_or_default();
                return Err(self.fail_on(
                    "POST",
                    target,
                    "http_status",
                    Some(status.as_u16()),
                    format!("HTTP {status} {why}").trim_end().to_string(),
                ));
            }
            Ok(())
        }
        .await;
        if let Err(e) = &r {
            self.counters.failure(e.failure());
        }
        r
    }

    /// One request with the endpoint's auth: a GET, or with `body` a POST of it as
    /// JSON. A session is logged in first and again (twice at most) when the service
    /// answers 401 to its token; a 401 or 403 otherwise is an `auth` error. Any other
    /// status is the caller's to judge.
    async fn authorized(
        &self,
        path: &str,
        body: Option<&Value>,
    ) -> Result<reqwest::Response, RedfishError> {
        let method = if body.is_some() { "POST" } else { "GET" };
        for attempt in 0..3 {
            let url = format!("{}{path}", self.cfg.url);
            let mut req = match body {
                None => self.client.get(&url),
                Some(b) => self.client.post(&url).json(b),
            }
            .header("Accept", "application/json");
            let mut used = None;
            match &self.cfg.auth {
                Auth::None => {}
                Auth::Basic {
                    username, password, ..
                } => req = req.basic_auth(username, Some(password)),
                Auth::Session { .. } => {
                    let t = self.session_token().await?;
                    req = req.header("X-Auth-Token", t.as_str());
                    used = Some(t);
                }
            }
            self.counters.request();
            let resp = req
                .send()
                .await
                .map_err(|e| self.fail_on(method, path, classify(&e), None, chain(&e)))?;
            let status = resp.status().as_u16();
            if status == 401 && attempt < 2 && used.is_some() {
                // expired: log in again, unless a concurrent GET already did
                let mut g = self.token.lock().await;
                if g.as_ref() == used.as_ref() {
                    *g = None;
                }
                continue;
            }
            if status == 401 || status == 403 {
                return Err(self.fail_on(
                    method,
                    path,
                    "auth",
                    Some(status),
                    format!("HTTP {status}: the credentials were refused"),
                ));
            }
            return Ok(resp);
        }
        Err(self.fail_on(
            method,
            path,
            "auth",
            Some(401),
            "session login rejected twice",
        ))
    }

    /// The body, refused beyond [`MAX_BODY_BYTES`].
    async fn body(&self, path: &str, mut resp: reqwest::Response) -> Result<Vec<u8>, RedfishError> {
        if resp
            .content_length()
            .is_some_and(|n| n > MAX_BODY_BYTES as u64)
        {
            return Err(self.fail(path, "oversize", None, "body over 8 MiB"));
        }
        let mut body = Vec::new();
        while let Some(chunk) = resp
            .chunk()
            .await
            .map_err(|e| self.fail(path, classify(&e), None, chain(&e)))?
        {
            if body.len() + chunk.len() > MAX_BODY_BYTES {
                return Err(self.fail(path, "oversize", None, "body over 8 MiB"));
            }
            body.extend_from_slice(&chunk);
        }
        Ok(body)
    }

    async fn session_token(&self) -> Result<String, RedfishError> {
        let mut guard = self.token.lock().await;
        if let Some(t) = guard.as_ref() {
            return Ok(t.clone());
        }
        let Auth::Session {
            username, password, ..
        } = &self.cfg.auth
        else {
            return Err(self.fail("", "auth", None, "no session credentials"));
        };
        let path = "/redfish/v1/SessionService/Sessions";
        self.counters.request();
        let resp = self
            .client
            .post(format!("{}{path}", self.cfg.url))
            .json(&serde_json::json!({ "UserName": username, "Password": password }))
            .send()
            .await
            .map_err(|e| self.fail(path, classify(&e), None, chain(&e)))?;
        let status = resp.status();
        if !status.is_success() {
            return Err(self.fail(
                path,
                "auth",
                Some(status.as_u16()),
                format!("session login: HTTP {status}"),
            ));
        }
        let token = resp
            .headers()
            .get("X-Auth-Token")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
            .ok_or_else(|| self.fail(path, "auth", None, "session login gave no X-Auth-Token"))?;
        *guard = Some(token.clone());
        Ok(token)
    }

    /// Reads `ProtocolFeaturesSupported.ExpandQuery` of the service root: the query
    /// that expands a collection's members one level down, if the service has one.
    pub(super) fn learn_expand(&self, root: &Value) {
        let q = root
            .get("ProtocolFeaturesSupported")
            .and_then(|p| p.get("ExpandQuery"));
        let yes = |k: &str| q.and_then(|q| q.get(k)).and_then(Value::as_bool) == Some(true);
        let off = self.expand_off.load(std::sync::atomic::Ordering::Relaxed);
        let query = match (yes("NoLinks"), yes("ExpandAll"), yes("Levels")) {
            _ if !self.cfg.expand || off => None,
            (true, _, true) => Some("?$expand=.($levels=1)"),
            (true, _, false) => Some("?$expand=."),
            (false, true, true) => Some("?$expand=*($levels=1)"),
            (false, true, false) => Some("?$expand=*"),
            _ => None,
        };
        *self.expand.lock().unwrap_or_else(|p| p.into_inner()) = query;
    }

    /// Whether a collection was read with `$expand` already.
    pub(super) fn expand_confirmed(&self) -> bool {
        self.expand_ok.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub(super) fn expand_works(&self) {
        self.expand_ok
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// The `$expand` query to use now, if any.
    pub(super) fn expand_query(&self) -> Option<&'static str> {
        *self.expand.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The service refused `$expand` or ignored it: read member by member from now on.
    pub(super) fn expand_refused(&self) {
        self.expand_off
            .store(true, std::sync::atomic::Ordering::Relaxed);
        *self.expand.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }

    pub(super) fn entity(&self, key: &str, kind: EntityKind, id: &str) -> EntityId {
        self.cfg
            .entities
            .get(key)
            .and_then(|e| e.parse().ok())
            .unwrap_or_else(|| EntityId::new(kind, format!("{}.{id}", self.cfg.name)))
    }

    /// Whether the next poll walks the whole tree (never discovered, or due again).
    pub fn needs_discovery(&self, rediscover_every: u32) -> bool {
        self.plan
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .is_none_or(|p| p.polls >= rediscover_every)
    }
}
