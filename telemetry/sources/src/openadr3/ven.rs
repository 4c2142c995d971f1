//! The OpenADR 3 VEN's task: one loop on tokio that owns the HTTP client, the token
//! and the event set.
//!
//! Each round: a bearer token (client credentials; taken again before it expires, or
//! at once after a 401), the VEN object (`GET /vens?venName=`, created with
//! `POST /vens` where the VTN has none), then every `poll_s` the programs and the events
//! (`GET /programs`, `GET /events`, page by page), published whenever they change; in
//! between, the meter is sampled for the events in force that ask for reports, and a
//! report (`POST /reports`) goes out every `report_s` and when such an event ends.
//! A failed call (deadline, refused, HTTP error, a body it cannot read) is counted and
//! retried after a backoff with jitter; the events stay as they were. After a 401 or
//! 403 a new token is taken (at once the first time); after a 401, 403 or a VTN that
//! could not be reached, the VEN object is looked up (or created) again: a VTN that
//! restarted with new state knows the VEN again.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use telemetry::grid::GridEvent;
use telemetry::Timestamp;
use tokio::sync::{watch, Notify};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::call::{form_escape, problem, CallError, Req};
use super::held::{DueReport, Events, Outbox};
use super::notify;
use super::parse::{self, ParseError};
use super::report::report_body;
use super::{VenConfig, VenError};
use crate::openadr2b::call::Counters;
use crate::openadr2b::ven::backoff;
use crate::openadr2b::MeterFn;
use crate::source::Stats;

/// The largest answer read from the VTN (`too_large` beyond).
pub const MAX_BODY: usize = 16 << 20;
/// Events asked for per page (the most OpenADR 3 lets a VTN be asked for).
const PAGE: usize = 50;
/// A token is taken again this long before it expires.
const TOKEN_MARGIN_S: f64 = 30.0;
/// The meter is sampled this often for reports (or every `report_s`, if shorter).
const SAMPLE_S: f64 = 10.0;

/// The VEN, built from its configuration; [`Ven::run`] is its task.
pub struct Ven {
    cfg: VenConfig,
    base: String,
    client: reqwest::Client,
    meter: MeterFn,
    counters: Arc<Counters>,
    clock: fn() -> Timestamp,
}

impl std::fmt::Debug for Ven {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ven")
            .field("vtn_url", &self.cfg.vtn_url)
            .field("ven_name", &self.cfg.ven_name)
            .finish_non_exhaustive()
    }
}

fn now() -> Timestamp {
    Timestamp::from(chrono::Utc::now())
}

/// What the task holds between rounds.
struct State {
    token: Option<(String, Timestamp)>,
    token_url: Option<String>,
    ven_id: Option<String>,
    /// A VEN object was found or created before (the next is a re-registration).
    registered_before: bool,
    /// The notifier was looked for since the VEN object was found.
    notifier_tried: bool,
    /// The running notifier's stop.
    notifier: Option<CancellationToken>,
    /// The bearer token as the notifier presents it to its broker.
    token_tx: watch::Sender<String>,
    /// The notifier's broker refused the token: a new one is taken.
    renew: Arc<AtomicBool>,
    programs: BTreeMap<String, String>,
    held: Events,
    /// Reports made and not yet taken by the VTN.
    outbox: Outbox,
    failures: u32,
    next_call: Timestamp,
    next_poll: Timestamp,
}

impl Ven {
    /// A VEN for `cfg`; `meter` reads the power its reports carry.
    pub fn new(cfg: VenConfig, meter: MeterFn) -> Result<Ven, VenError> {
        cfg.validate()?;
        let client = crate::http::client(Duration::from_secs_f64(cfg.timeout_s), &cfg.tls)?;
        Ok(Ven {
            base: cfg.vtn_url.trim_end_matches('/').to_string(),
            cfg,
            client,
            meter,
            counters: Arc::new(Counters::default()),
            clock: now,
        })
    }

    /// Its counters (names without the `powerplane_` prefix): `openadr_polls_total`,
    /// `openadr_tokens_total`, `openadr_registrations_total`,
    /// `openadr_reregistrations_total`, `openadr_notifications_total`,
    /// `openadr_reports_dropped_total`,
    /// `openadr_notifier_connections_total`, `openadr_notifier_refusals_total`,
    /// `openadr_events_received_total`, `openadr_events_refused_total`,
    /// `openadr_reports_sent_total`, `openadr_errors_total{reason}`,
    /// `openadr_payloads_rejected_total{reason}`, `openadr_signals_skipped_total{reason}`.
    pub fn stats(&self) -> Stats {
        let c = self.counters.clone();
        Stats::new(move || c.read())
    }

    /// Which VTN it talks to, for the log line when it starts.
    pub fn describe(&self) -> String {
        format!("{} as {:?}", self.base, self.cfg.ven_name)
    }

    /// Runs until `cancel` is cancelled, publishing the events through `events` each
    /// time they change.
    pub async fn run(self, cancel: CancellationToken, events: watch::Sender<Vec<GridEvent>>) {
        let t0 = (self.clock)();
        let mut st = State {
            token: None,
            token_url: self.cfg.token_url.clone(),
            ven_id: None,
            registered_before: false,
            notifier_tried: false,
            notifier: None,
            token_tx: watch::channel(String::new()).0,
            renew: Arc::new(AtomicBool::new(false)),
            programs: BTreeMap::new(),
            held: Events::default(),
            outbox: Outbox::default(),
            failures: 0,
            next_call: t0,
            next_poll: t0,
        };
        let sample_s = SAMPLE_S.min(self.cfg.report_s);
        let wake = Arc::new(Notify::new());
        info!(vtn = %self.base, ven = %self.cfg.ven_name, "openadr3 VEN starting");
        while !cancel.is_cancelled() {
            let t = (self.clock)();
            if st.held.tick(t) {
                events.send_replace(st.held.list());
            }
            let next_sample = st.held.sample(t, (self.meter)(), sample_s);
            let report_s = self.cfg.report_s;
            let reports = !st.outbox.is_empty() || st.held.report_due(t, report_s);
            if t >= st.next_call && (t >= st.next_poll || reports) {
                let outcome = self.round(&cancel, &mut st, &events, &wake, t).await;
                if !self.after(&mut st, outcome) {
                    break;
                }
                continue;
            }
            // the next call (not before the backoff ends), sample or change of status
            let next_report = if st.outbox.is_empty() {
                st.held.next_report(report_s).unwrap_or(st.next_poll)
            } else {
                t // reports wait: as soon as the backoff allows
            };
            let mut at = st.next_call.max(st.next_poll.min(next_report));
            for w in [next_sample, st.held.next_change(t)].into_iter().flatten() {
                at = at.min(w);
            }
            let wait = Duration::from_secs_f64(at.secs_since(t).clamp(0.001, 86_400.0));
            tokio::select! {
                _ = cancel.cancelled() => break,
                _ = tokio::time::sleep(wait) => {}
                // a notification: poll at once (after any backoff)
                _ = wake.notified() => st.next_poll = (self.clock)(),
            }
        }
        info!(vtn = %self.base, "openadr3 VEN stopped");
    }

    /// One round of calls: the token and the VEN object where missing, the poll when
    /// due, the reports due.
    async fn round(
        &self,
        cancel: &CancellationToken,
        st: &mut State,
        events: &watch::Sender<Vec<GridEvent>>,
        wake: &Arc<Notify>,
        t: Timestamp,
    ) -> Result<(), CallError> {
        if st.renew.swap(false, Ordering::Relaxed) {
            st.token = None;
        }
        if st.token.as_ref().is_none_or(|(_, exp)| *exp <= t) {
            self.take_token(cancel, st).await?;
        }
        if st.ven_id.is_none() {
            self.find_ven(cancel, st).await?;
        }
        if self.cfg.notifications && !st.notifier_tried {
            st.notifier_tried = true;
            self.subscribe(cancel, st, wake).await;
        }
        if t >= st.next_poll {
            self.poll(cancel, st, events).await?;
            st.next_poll = (self.clock)().plus_secs(self.cfg.poll_s);
        }
        let due = st.held.due_reports((self.clock)(), self.cfg.report_s);
        st.outbox.push(due);
        let dropped = st.outbox.take_dropped();
        if dropped > 0 {
            self.counters
                .add("openadr_reports_dropped_total", ("", ""), dropped);
            warn!(vtn = %self.base, dropped, "openadr3 reports the VTN did not take were dropped (the oldest first)");
        }
        // oldest first; one that fails stays at the front for the next round
        while let Some(r) = st.outbox.front().cloned() {
            self.send_report(cancel, st, &r).await?;
            st.outbox.sent();
        }
        Ok(())
    }

    /// After a round: when to call again. `false`: cancelled.
    fn after(&self, st: &mut State, outcome: Result<(), CallError>) -> bool {
        let now = (self.clock)();
        match outcome {
            Ok(()) => {
                st.failures = 0;
                st.next_call = now;
            }
            Err(CallError::Cancelled) => return false,
            Err(e) => {
                self.counters
                    .add("openadr_errors_total", ("reason", e.reason()), 1);
                st.failures = st.failures.saturating_add(1);
                let unauthorized = e.reason() == "unauthorized";
                if unauthorized {
                    // the token was refused: take a new one, at once the first time
                    st.token = None;
                }
                if unauthorized || matches!(e, CallError::Transport { .. }) {
                    // a VTN that was away or no longer knows the client may have lost
                    // the VEN object too: it is looked up (or created) again
                    st.registered_before |= st.ven_id.take().is_some();
                    // and the notifier is looked for again once it is
                    st.notifier_tried = false;
                    if let Some(n) = st.notifier.take() {
                        n.cancel();
                    }
                }
                let wait = if unauthorized && st.failures == 1 {
                    0.0
                } else {
                    backoff(st.failures, self.cfg.backoff_max_s)
                };
                warn!(vtn = %self.base, error = %e, retry_s = wait, "openadr3 call failed");
                st.next_call = now.plus_secs(wait);
                st.next_poll = st.next_poll.min(st.next_call);
            }
        }
        true
    }

    /// One call by its deadline (and at once on cancellation): the body of a 2xx
    /// answer.
    async fn call(
        &self,
        cancel: &CancellationToken,
        what: &'static str,
        url: &str,
        token: Option<&str>,
        req: Req<'_>,
    ) -> Result<Vec<u8>, CallError> {
        let mut rb = match req {
            Req::Get => self.client.get(url),
            Req::Json(v) => self
                .client
                .post(url)
                .header("content-type", "application/json")
                .body(v.to_string()),
            Req::Form(f) => self
                .client
                .post(url)
                .header("content-type", "application/x-www-form-urlencoded")
                .body(f),
        };
        rb = rb.header("accept", "application/json");
        if let Some(t) = token {
            rb = rb.bearer_auth(t);
        }
        let exchange = async {
            let resp = rb.send().await.map_err(|e| CallError::Transport {
                what,
                reason: crate::http::classify(&e),
                detail: crate::http::chain(&e),
            })?;
            let status = resp.status().as_u16();
            let body = crate::http::read_capped(resp, MAX_BODY)
                .await
                .map_err(|e| CallError::Transport {
                    what,
                    reason: match e {
                        crate::http::BodyError::TooLarge(_) => "too_large",
                        crate::http::BodyError::Transport(ref e) => crate::http::classify(e),
                    },
                    detail: e.to_string(),
                })?;
            if !(200..300).contains(&status) {
                return Err(CallError::Status {
                    what,
                    status,
                    detail: problem(&body),
                });
            }
            Ok(body)
        };
        let deadline = Duration::from_secs_f64(self.cfg.timeout_s);
        tokio::select! {
            _ = cancel.cancelled() => Err(CallError::Cancelled),
            r = tokio::time::timeout(deadline, exchange) => r.unwrap_or_else(|_| Err(CallError::Transport {
                what,
                reason: "timeout",
                detail: format!("no answer within {} s", self.cfg.timeout_s),
            })),
        }
    }

    fn read<T>(&self, what: &'static str, r: Result<T, ParseError>) -> Result<T, CallError> {
        r.map_err(|e| self.rejected(what, e))
    }

    /// A body refused: counted by reason.
    fn rejected(&self, what: &'static str, e: ParseError) -> CallError {
        self.counters
            .add("openadr_payloads_rejected_total", ("reason", e.reason()), 1);
        CallError::Payload(e, what)
    }

    async fn take_token(
        &self,
        cancel: &CancellationToken,
        st: &mut State,
    ) -> Result<(), CallError> {
        let url = match &st.token_url {
            Some(u) => u.clone(),
            None => {
                let body = self
                    .call(
                        cancel,
                        "auth_server",
                        &format!("{}/auth/server", self.base),
                        None,
                        Req::Get,
                    )
                    .await?;
                let u = self.read("auth_server", parse::token_url(&body))?;
                st.token_url = Some(u.clone());
                u
            }
        };
        let form = format!(
            "grant_type=client_credentials&client_id={}&client_secret={}",
            form_escape(&self.cfg.client_id),
            form_escape(&self.cfg.client_secret)
        );
        let body = self
            .call(cancel, "token", &url, None, Req::Form(form))
            .await?;
        let tok = self.read("token", parse::token(&body))?;
        let life = tok.expires_in_s.unwrap_or(3_600.0);
        let expires = (self.clock)().plus_secs((life - TOKEN_MARGIN_S).max(life / 2.0));
        st.token_tx.send_replace(tok.access_token.clone());
        st.token = Some((tok.access_token, expires));
        self.counters.inc("openadr_tokens_total");
        Ok(())
    }

    fn bearer<'a>(&self, st: &'a State) -> Option<&'a str> {
        st.token.as_ref().map(|(t, _)| t.as_str())
    }

    /// Finds the VEN object by name, or creates it.
    async fn find_ven(&self, cancel: &CancellationToken, st: &mut State) -> Result<(), CallError> {
        let name = &self.cfg.ven_name;
        let url = format!("{}/vens?venName={}", self.base, form_escape(name));
        let body = self
            .call(cancel, "vens", &url, self.bearer(st), Req::Get)
            .await?;
        let mut id = self.read("vens", parse::ven_id(&body, name))?;
        if id.is_none() {
            let req = json!({ "objectType": "VEN_VEN_REQUEST", "venName": name });
            let body = self
                .call(
                    cancel,
                    "vens",
                    &format!("{}/vens", self.base),
                    self.bearer(st),
                    Req::Json(&req),
                )
                .await?;
            id = self.read("vens", parse::ven_id(&body, name))?;
            if id.is_some() {
                info!(vtn = %self.base, ven = %name, "openadr3 VEN object created");
            }
        }
        let Some(id) = id else {
            return Err(CallError::Payload(
                ParseError::Shape("the VEN object the VTN created"),
                "vens",
            ));
        };
        info!(vtn = %self.base, ven = %name, ven_id = %id, "openadr3 VEN registered");
        self.counters.inc("openadr_registrations_total");
        if st.registered_before {
            self.counters.inc("openadr_reregistrations_total");
        }
        st.ven_id = Some(id);
        Ok(())
    }

    /// Starts the MQTT notifier where the VTN offers one (`GET /notifiers`); without
    /// one, or when it cannot be set up, the VEN polls every `poll_s` (logged).
    async fn subscribe(&self, cancel: &CancellationToken, st: &mut State, wake: &Arc<Notify>) {
        let Some(ven_id) = st.ven_id.clone() else {
            return;
        };
        let get = |path: String| {
            let url = format!("{}/{path}", self.base);
            let token = self.bearer(st).map(str::to_string);
            async move {
                self.call(cancel, "notifiers", &url, token.as_deref(), Req::Get)
                    .await
            }
        };
        let broker = match get("notifiers".into()).await {
            Ok(b) => notify::broker(&b),
            Err(e) => {
                info!(vtn = %self.base, error = %e, "openadr3 VTN names no notifiers: the VEN polls every poll_s");
                return;
            }
        };
        let Some(broker) = broker else {
            info!(vtn = %self.base, "openadr3 VTN offers no MQTT notifier: the VEN polls every poll_s");
            return;
        };
        let mut topics = Vec::new();
        for path in [
            format!("notifiers/mqtt/topics/vens/{ven_id}/events"),
            "notifiers/mqtt/topics/events".to_string(),
        ] {
            if let Ok(b) = get(path).await {
                topics.extend(notify::topics(&b));
            }
        }
        topics.sort();
        topics.dedup();
        if topics.is_empty() {
            warn!(vtn = %self.base, "openadr3 VTN names no event topics: the VEN polls every poll_s");
            return;
        }
        let stop = cancel.child_token();
        let sub = notify::Subscription {
            broker,
            topics,
            client_id: self.cfg.client_id.clone(),
            token: st.token_tx.subscribe(),
            renew: st.renew.clone(),
            tls: self.cfg.tls.clone(),
        };
        match notify::spawn(sub, wake.clone(), self.counters.clone(), stop.clone()) {
            Ok(()) => st.notifier = Some(stop),
            Err(e) => {
                warn!(vtn = %self.base, error = %e, "openadr3 notifier cannot start: the VEN polls every poll_s")
            }
        }
    }

    /// Every page of a list, up to [`super::held`]'s bound and a page more.
    async fn pages(
        &self,
        cancel: &CancellationToken,
        st: &State,
        what: &'static str,
        path: &str,
    ) -> Result<Vec<serde_json::Value>, CallError> {
        let mut all = Vec::new();
        loop {
            let url = format!("{}/{path}?skip={}&limit={PAGE}", self.base, all.len());
            let body = self
                .call(cancel, what, &url, self.bearer(st), Req::Get)
                .await?;
            let page: Vec<serde_json::Value> = match serde_json::from_slice(&body) {
                Ok(serde_json::Value::Array(a)) => a,
                Ok(_) => return Err(self.rejected(what, ParseError::Shape("a list"))),
                Err(e) => return Err(self.rejected(what, ParseError::Json(e.to_string()))),
            };
            let n = page.len();
            all.extend(page);
            if n < PAGE || all.len() > crate::openadr2b::events::MAX_EVENTS + PAGE {
                return Ok(all);
            }
        }
    }

    async fn poll(
        &self,
        cancel: &CancellationToken,
        st: &mut State,
        events: &watch::Sender<Vec<GridEvent>>,
    ) -> Result<(), CallError> {
        let programs = self.pages(cancel, st, "programs", "programs").await?;
        st.programs = parse::programs(&programs).into_iter().collect();
        let listed = self.pages(cancel, st, "events", "events").await?;
        self.counters.inc("openadr_polls_total");
        let t = (self.clock)();
        let mut read = Vec::new();
        let mut refused_ids = Vec::new();
        for e in &listed {
            match parse::event(e, &|id| st.held.first_seen(id, t)) {
                Ok(w) => {
                    for why in &w.skipped {
                        self.counters
                            .add("openadr_signals_skipped_total", ("reason", why), 1);
                    }
                    read.push(w)
                }
                Err(r) => {
                    self.counters
                        .add("openadr_payloads_rejected_total", ("reason", r.reason), 1);
                    warn!(vtn = %self.base, event = ?r.id, reason = r.reason, "openadr3 event refused");
                    refused_ids.extend(r.id);
                }
            }
        }
        // an event that cannot be read now stays as it was (it was not cancelled)
        for id in refused_ids {
            if let Some(h) = st.held.held.get(&id) {
                if h.cancelled_at.is_none() {
                    read.push(h.wire.clone());
                }
            }
        }
        let wanted = &self.cfg.programs;
        if !wanted.is_empty() {
            read.retain(|w| {
                let name = st.programs.get(&w.program_id).unwrap_or(&w.program_id);
                wanted.iter().any(|p| p == name)
            });
        }
        let m = st.held.merge(read, &st.programs, t);
        self.counters
            .add("openadr_events_received_total", ("", ""), m.fresh as u64);
        if m.refused > 0 {
            self.counters
                .add("openadr_events_refused_total", ("", ""), m.refused as u64);
            warn!(vtn = %self.base, refused = m.refused, "openadr3 VEN holds as many events as it may: the rest were refused");
        }
        if m.changed {
            info!(vtn = %self.base, events = st.held.held.len(), "openadr3 events changed");
            events.send_replace(st.held.list());
        }
        Ok(())
    }

    async fn send_report(
        &self,
        cancel: &CancellationToken,
        st: &State,
        r: &DueReport,
    ) -> Result<(), CallError> {
        let body = report_body(&self.cfg.ven_name, r);
        let url = format!("{}/reports", self.base);
        match self
            .call(cancel, "reports", &url, self.bearer(st), Req::Json(&body))
            .await
        {
            Ok(_) => {
                self.counters.inc("openadr_reports_sent_total");
                Ok(())
            }
            // the event is gone (cancelled): its report has nowhere to go
            Err(CallError::Status {
                status: 400 | 404 | 409,
                detail,
                ..
            }) => {
                self.counters
                    .add("openadr_errors_total", ("reason", "report_refused"), 1);
                warn!(vtn = %self.base, event = %r.event_id, %detail, "openadr3 VTN refused a report");
                Ok(())
            }
            Err(e) => Err(e),
        }
    }
}
