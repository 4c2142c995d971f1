//! The VEN's task: one loop on tokio that owns the HTTP client and the event set.
//!
//! Registration: `oadrQueryRegistration`, `oadrCreatePartyRegistration`,
//! `oadrRegisterReport` (and `oadrCreatedReport` for what the VTN asks of it), then
//! `oadrRequestEvent`. Then it polls (`oadrPoll`) at the VTN's requested frequency (or
//! `poll_s`), answers each new or modified event with `oadrCreatedEvent`, sends each
//! requested report with `oadrUpdateReport`, and publishes the events whenever they
//! change. A failed call (deadline, refused, HTTP error, a payload it cannot read)
//! is counted and retried after a backoff with jitter; the events stay as they were.
//! After a failed call the VEN first asks for the whole list again (`oadrRequestEvent`,
//! counted in `openadr_resyncs_total`) before it polls: a VTN that answered a poll the
//! VEN had given up on (a deadline) handed out a message nobody read, and a VTN that
//! hands each queued message out once (OpenLEADR) would never send it again.
//! An `oadrRequestReregistration`, an `oadrCancelPartyRegistration` or a VTN that no
//! longer knows the VEN (452, 463) starts registration again.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use telemetry::grid::{EventStatus, GridEvent};
use telemetry::Timestamp;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::call::{check, transport, unexpected, CallError, Counters};
use super::events::{Events, Opt, MAX_EVENTS};
use super::parse::{parse, Distribute, Inbound};
use super::payload::{self, EventReply};
use super::reports::Report;
use super::{VenConfig, VenError};
use crate::source::Stats;

/// Decides, for each new or modified event, whether the site takes part.
pub type OptFn = Arc<dyn Fn(&GridEvent) -> Opt + Send + Sync>;
/// The power at the meter now, W (`None`: not known, nothing reported for the moment).
pub type MeterFn = Arc<dyn Fn() -> Option<f64> + Send + Sync>;

const DEFAULT_POLL_S: f64 = 10.0;
/// Samples held for one report at most (the oldest dropped and counted beyond).
pub(super) const MAX_SAMPLES: usize = 256;

/// The VEN, built from its configuration; [`Ven::run`] is its task.
pub struct Ven {
    cfg: VenConfig,
    base: String,
    client: reqwest::Client,
    opt: OptFn,
    pub(super) meter: MeterFn,
    pub(super) counters: Arc<Counters>,
    pub(super) clock: fn() -> Timestamp,
    /// With `xml_signature`: what signs each payload.
    signer: Option<super::sign::Signer>,
    /// With `vtn_signing_sha256`: the certificate every VTN message must be signed with.
    vtn_pin: Option<[u8; 32]>,
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

/// What the task holds between calls.
struct State {
    held: Events,
    session: Option<Session>,
    /// The venID and registrationID of the last registration (sent when registering
    /// again).
    ids: Option<(String, String)>,
    failures: u32,
    /// A call failed since the last full list: ask for it before the next poll.
    resync: bool,
    /// No call before this (backoff).
    next_call: Timestamp,
    next_poll: Timestamp,
}

impl State {
    /// When the loop next has something to do: a call, a sample, an event's change.
    fn wake(&self, now: Timestamp) -> Timestamp {
        let mut wake = self.next_poll.max(self.next_call);
        if let Some(s) = &self.session {
            for r in &s.reports {
                wake = wake.min(r.next_sample).min(r.next_send.max(self.next_call));
            }
        }
        if let Some(c) = self.held.next_change(now) {
            wake = wake.min(c);
        }
        wake
    }
}

/// A registration and what the VTN asked of it.
pub(super) struct Session {
    pub(super) ven_id: String,
    registration_id: String,
    poll_s: f64,
    pub(super) reports: Vec<Report>,
}

static REQUEST_SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

pub(super) fn request_id() -> String {
    let n = REQUEST_SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("pp-{}-{n}", now().as_millis())
}

/// A signature's nonce: never the same twice from this VEN (its time, its process, a
/// sequence).
fn nonce() -> String {
    let n = REQUEST_SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("{}-{}-{n}", now().as_millis(), std::process::id())
}

impl Ven {
    /// A VEN for `cfg`: `opt` decides on each event, `meter` reads the power the
    /// reports carry.
    pub fn new(cfg: VenConfig, opt: OptFn, meter: MeterFn) -> Result<Ven, VenError> {
        cfg.validate()?;
        let client = crate::http::client(Duration::from_secs_f64(cfg.timeout_s), &cfg.tls)?;
        let signer = match (&cfg.tls.client_cert_file, &cfg.tls.client_key_file) {
            (Some(cert), Some(key)) if cfg.xml_signature => {
                Some(super::sign::Signer::from_files(cert, key)?)
            }
            _ => None,
        };
        let vtn_pin = cfg
            .vtn_signing_sha256
            .as_deref()
            .and_then(crate::tls::parse_fingerprint);
        Ok(Ven {
            signer,
            vtn_pin,
            base: cfg.vtn_url.trim_end_matches('/').to_string(),
            cfg,
            client,
            opt,
            meter,
            counters: Arc::new(Counters::default()),
            clock: now,
        })
    }

    /// Its counters (names without the `powerplane_` prefix): `openadr_polls_total`,
    /// `openadr_events_received_total`, `openadr_opt_outs_total`,
    /// `openadr_reports_sent_total`, `openadr_registrations_total`,
    /// `openadr_reregistrations_total`, `openadr_errors_total{reason}`,
    /// `openadr_payloads_rejected_total{reason}`,
    /// `openadr_signals_skipped_total{reason}`, `openadr_samples_dropped_total`,
    /// `openadr_resyncs_total`, `openadr_events_refused_total`.
    pub fn stats(&self) -> Stats {
        let c = self.counters.clone();
        Stats::new(move || c.read())
    }

    /// [`Ven::run`] as a boxed task, to be spawned and tracked like a source's.
    pub fn task(
        self,
        cancel: CancellationToken,
        events: watch::Sender<Vec<GridEvent>>,
    ) -> crate::source::Task {
        Box::pin(self.run(cancel, events))
    }

    /// Which VTN it talks to, for the log line when it starts.
    pub fn describe(&self) -> String {
        format!("{} as {:?}", self.base, self.cfg.ven_name)
    }

    /// Runs until `cancel` is cancelled, publishing the events through `events` each
    /// time they change.
    pub async fn run(self, cancel: CancellationToken, events: watch::Sender<Vec<GridEvent>>) {
        let mut st = State {
            held: Events::default(),
            session: None,
            ids: None,
            failures: 0,
            resync: false,
            next_call: (self.clock)(),
            next_poll: (self.clock)(),
        };
        info!(vtn = %self.base, ven = %self.cfg.ven_name, "openadr2b VEN starting");
        while !cancel.is_cancelled() {
            let t = (self.clock)();
            if st.held.tick(t) {
                events.send_replace(st.held.list());
            }
            let wake = st.wake(t);
            if wake > t {
                let wait = Duration::from_secs_f64(wake.secs_since(t).clamp(0.0, 86_400.0));
                tokio::select! {
                    _ = cancel.cancelled() => break,
                    _ = tokio::time::sleep(wait) => {}
                }
                continue;
            }
            let outcome = match st.session.as_mut() {
                None => self
                    .register(&cancel, &mut st.ids, &mut st.held, &events)
                    .await
                    .map(|s| {
                        st.session = Some(s);
                        // registering asked for the whole list
                        st.resync = false;
                        false
                    }),
                Some(s) => {
                    self.sample(s, t);
                    if t < st.next_call {
                        continue; // backing off: samples are taken, no call is made
                    }
                    match self.send_reports(&cancel, s, t).await {
                        Ok(()) if st.resync => {
                            let r = self.resync(&cancel, s, &mut st.held, &events).await;
                            if r.is_ok() {
                                st.resync = false;
                            }
                            r
                        }
                        Ok(()) if t >= st.next_poll => {
                            self.poll_once(&cancel, s, &mut st.held, &events).await
                        }
                        Ok(()) => continue,
                        Err(e) => Err(e),
                    }
                }
            };
            if !self.after(&mut st, outcome) {
                break;
            }
        }
        info!(vtn = %self.base, "openadr2b VEN stopped");
    }

    /// What a registration or a poll leaves: when to call again, whether to register
    /// again. `false`: cancelled.
    fn after(&self, st: &mut State, outcome: Result<bool, CallError>) -> bool {
        let now = (self.clock)();
        match outcome {
            Ok(reregister) => {
                st.failures = 0;
                st.next_call = now;
                let poll_s = st.session.as_ref().map_or(DEFAULT_POLL_S, |s| s.poll_s);
                st.next_poll = now.plus_secs(poll_s);
                if reregister {
                    st.session = None;
                }
            }
            Err(CallError::Cancelled) => return false,
            Err(e) => {
                // asked to register again: at once the first time, backed off if the
                // VTN keeps asking
                let again = matches!(e, CallError::Reregister(_));
                if !again {
                    self.counters
                        .add("openadr_errors_total", ("reason", e.reason()), 1);
                }
                st.failures = st.failures.saturating_add(1);
                st.resync = true;
                let wait = if again && st.failures == 1 {
                    0.0
                } else {
                    backoff(st.failures, self.cfg.backoff_max_s)
                };
                if again || e.unknown_ven() {
                    info!(vtn = %self.base, error = %e, "openadr2b VEN registers again");
                    st.session = None;
                } else {
                    warn!(vtn = %self.base, error = %e, retry_s = wait, "openadr2b call failed");
                }
                st.next_call = now.plus_secs(wait);
                st.next_poll = st.next_call;
            }
        }
        true
    }

    /// One call: POST the payload to the service, read the answer, by the deadline
    /// (and at once on cancellation).
    pub(super) async fn call(
        &self,
        cancel: &CancellationToken,
        service: &'static str,
        body: String,
    ) -> Result<Inbound, CallError> {
        let url = format!("{}/{service}", self.base);
        let deadline = Duration::from_secs_f64(self.cfg.timeout_s);
        let body = match &self.signer {
            Some(s) => s
                .sign(&body, (self.clock)(), &nonce())
                .map_err(|e| CallError::Sign(e, service))?,
            None => body,
        };
        let exchange = async {
            let resp = self
                .client
                .post(&url)
                .header("content-type", "application/xml")
                .body(body)
                .send()
                .await
                .map_err(|e| transport(service, &e))?;
            let status = resp.status().as_u16();
            if status != 200 {
                return Err(CallError::Status { service, status });
            }
            let text = read_body(resp, service).await?;
            if let Some(pin) = &self.vtn_pin {
                if !text.trim().is_empty() {
                    super::sign::verify(&text, pin).map_err(|e| {
                        self.counters.add(
                            "openadr_payloads_rejected_total",
                            ("reason", "signature"),
                            1,
                        );
                        CallError::Unverified(e, service)
                    })?;
                }
            }
            parse(&text).map_err(|e| {
                self.counters
                    .add("openadr_payloads_rejected_total", ("reason", e.reason()), 1);
                CallError::Payload(e, service)
            })
        };
        tokio::select! {
            _ = cancel.cancelled() => Err(CallError::Cancelled),
            r = tokio::time::timeout(deadline, exchange) => match r {
                Ok(r) => r,
                Err(_) => Err(CallError::Transport { service, reason: "timeout", detail: format!("no answer within {} s", self.cfg.timeout_s) }),
            },
        }
    }

    async fn register(
        &self,
        cancel: &CancellationToken,
        previous: &mut Option<(String, String)>,
        held: &mut Events,
        events: &watch::Sender<Vec<GridEvent>>,
    ) -> Result<Session, CallError> {
        const S: &str = "EiRegisterParty";
        let mut ids = previous.clone();
        let mut poll_s = None;
        if let Inbound::CreatedPartyRegistration(r) = self
            .call(cancel, S, payload::query_registration(&request_id()))
            .await?
        {
            poll_s = r.poll_s;
            if let (Some(v), Some(r)) = (r.ven_id, r.registration_id) {
                ids = Some((v, r));
            }
        }
        let body = payload::create_party_registration(
            &request_id(),
            ids.as_ref().map(|i| i.1.as_str()),
            ids.as_ref().map(|i| i.0.as_str()),
            &self.cfg.ven_name,
            self.signer.is_some(),
        );
        let reg = match self.call(cancel, S, body).await? {
            Inbound::CreatedPartyRegistration(r) => r,
            other => return Err(unexpected(S, &other)),
        };
        let (Some(ven_id), Some(registration_id)) =
            (reg.ven_id.clone(), reg.registration_id.clone())
        else {
            return Err(CallError::Refused {
                service: S,
                code: reg.status.code,
                description: if reg.status.ok() {
                    "no venID or registrationID".into()
                } else {
                    reg.status.description
                },
            });
        };
        if !reg.status.ok() {
            return Err(CallError::Refused {
                service: S,
                code: reg.status.code,
                description: reg.status.description,
            });
        }
        // the ids hold from here on, whatever becomes of the calls that follow
        if previous.is_some() {
            self.counters.inc("openadr_reregistrations_total");
            held.rebase();
        }
        *previous = Some((ven_id.clone(), registration_id.clone()));
        self.counters.inc("openadr_registrations_total");
        let poll_s = self
            .cfg
            .poll_s
            .or(reg.poll_s)
            .or(poll_s)
            .unwrap_or(DEFAULT_POLL_S);
        info!(vtn = %self.base, ven_id, registration_id, poll_s, "openadr2b VEN registered");
        let mut s = Session {
            ven_id,
            registration_id,
            poll_s,
            reports: Vec::new(),
        };
        // the report the VEN offers; OpenLEADR asks for it in its answer
        let t = (self.clock)();
        let body = payload::register_report(&request_id(), &s.ven_id, t, 1.0, 3600.0);
        match self.call(cancel, "EiReport", body).await? {
            Inbound::RegisteredReport { requests, status } if status.ok() => {
                self.create_reports(cancel, &mut s, &requests, &request_id())
                    .await?;
            }
            other => check("EiReport", &other)?,
        }
        // the events the VTN already holds for this VEN
        let body = payload::request_event(&request_id(), &s.ven_id);
        let answer = self.call(cancel, "EiEvent", body).await?;
        self.handle(cancel, &mut s, ("EiEvent", answer), held, events)
            .await?;
        Ok(s)
    }

    /// Asks for every event the VTN holds for the VEN (`oadrRequestEvent`) and takes
    /// the answer as a whole list; `Ok(true)`: register again.
    async fn resync(
        &self,
        cancel: &CancellationToken,
        s: &mut Session,
        held: &mut Events,
        events: &watch::Sender<Vec<GridEvent>>,
    ) -> Result<bool, CallError> {
        let body = payload::request_event(&request_id(), &s.ven_id);
        let answer = self.call(cancel, "EiEvent", body).await?;
        self.counters.inc("openadr_resyncs_total");
        info!(vtn = %self.base, "openadr2b VEN asked for the whole event list after a failed call");
        self.take(cancel, s, ("EiEvent", answer), held, events)
            .await
    }

    /// One poll; `Ok(true)`: register again.
    async fn poll_once(
        &self,
        cancel: &CancellationToken,
        s: &mut Session,
        held: &mut Events,
        events: &watch::Sender<Vec<GridEvent>>,
    ) -> Result<bool, CallError> {
        let answer = self
            .call(cancel, "OadrPoll", payload::poll(&s.ven_id))
            .await?;
        self.counters.inc("openadr_polls_total");
        self.take(cancel, s, ("OadrPoll", answer), held, events)
            .await
    }

    /// Acts on an answer, then sends the event answers still owed (those that failed
    /// before too); `Ok(true)`: register again.
    async fn take(
        &self,
        cancel: &CancellationToken,
        s: &mut Session,
        answer: (&'static str, Inbound),
        held: &mut Events,
        events: &watch::Sender<Vec<GridEvent>>,
    ) -> Result<bool, CallError> {
        let again = self.handle(cancel, s, answer, held, events).await?;
        self.answer(cancel, s, held).await?;
        Ok(again)
    }

    /// Acts on what the VTN sent (to a call of `service`); `Ok(true)`: register again.
    async fn handle(
        &self,
        cancel: &CancellationToken,
        s: &mut Session,
        (service, answer): (&'static str, Inbound),
        held: &mut Events,
        events: &watch::Sender<Vec<GridEvent>>,
    ) -> Result<bool, CallError> {
        match answer {
            Inbound::Empty => {}
            Inbound::Response(st) if st.ok() => {}
            Inbound::Response(st) => {
                return Err(CallError::Refused {
                    service,
                    code: st.code,
                    description: st.description,
                })
            }
            Inbound::DistributeEvent(d) => {
                self.distributed(&d, held, events);
                self.answer(cancel, s, held).await?;
            }
            Inbound::CreateReport {
                request_id,
                requests,
            } => {
                self.create_reports(cancel, s, &requests, &request_id)
                    .await?
            }
            Inbound::RegisterReport { request_id } => {
                let body = payload::registered_report(&request_id, &s.ven_id);
                let answer = self.call(cancel, "EiReport", body).await?;
                check("EiReport", &answer)?;
            }
            Inbound::RequestReregistration => {
                info!(vtn = %self.base, "openadr2b VTN asks the VEN to register again");
                let body = payload::response(&request_id(), &s.ven_id);
                // the answer is a courtesy: registering again matters, not its fate
                if let Err(e) = self.call(cancel, "EiRegisterParty", body).await {
                    debug!(error = %e, "openadr2b: the oadrResponse to a re-registration request failed");
                }
                return Ok(true);
            }
            Inbound::CancelPartyRegistration {
                request_id,
                registration_id,
            } => {
                info!(vtn = %self.base, "openadr2b VTN cancelled the registration");
                let r = if registration_id.is_empty() {
                    s.registration_id.clone()
                } else {
                    registration_id
                };
                let body = payload::canceled_party_registration(&request_id, &r, &s.ven_id);
                if let Err(e) = self.call(cancel, "EiRegisterParty", body).await {
                    debug!(error = %e, "openadr2b: the oadrCanceledPartyRegistration failed");
                }
                return Ok(true);
            }
            other => check(service, &other)?,
        }
        Ok(false)
    }

    fn distributed(
        &self,
        d: &Distribute,
        held: &mut Events,
        events: &watch::Sender<Vec<GridEvent>>,
    ) {
        for why in &d.skipped {
            self.counters
                .add("openadr_signals_skipped_total", ("reason", why), 1);
        }
        let m = held.merge(&d.request_id, &d.events);
        let (fresh, changed) = (m.fresh, m.changed);
        self.counters
            .add("openadr_events_received_total", ("", ""), fresh as u64);
        if m.refused > 0 {
            self.counters
                .add("openadr_events_refused_total", ("", ""), m.refused as u64);
            warn!(vtn = %self.base, refused = m.refused, held = MAX_EVENTS, "openadr2b VEN holds as many events as it may: the VTN's newest were refused");
        }
        let ticked = held.tick((self.clock)());
        if changed || ticked {
            events.send_replace(held.list());
        }
    }

    /// Sends `oadrCreatedEvent` for every event that needs an answer, one per request.
    async fn answer(
        &self,
        cancel: &CancellationToken,
        s: &Session,
        held: &mut Events,
    ) -> Result<(), CallError> {
        let todo = held.unanswered();
        let mut by_request: BTreeMap<String, Vec<(EventReply, Opt)>> = BTreeMap::new();
        for u in todo {
            let opt = match (u.event.status, u.previous) {
                (EventStatus::Cancelled, Some(prev)) => prev,
                (EventStatus::Cancelled, None) => Opt::In,
                _ => (self.opt)(&u.event),
            };
            let (opt_in, reason) = match &opt {
                Opt::In => (true, None),
                Opt::Out { reason } => (false, Some(reason.clone())),
            };
            by_request.entry(u.request_id).or_default().push((
                EventReply {
                    event_id: u.event.id.clone(),
                    modification: u.event.modification,
                    opt_in,
                    reason,
                },
                opt,
            ));
        }
        for (request, replies) in by_request {
            let list: Vec<EventReply> = replies.iter().map(|r| r.0.clone()).collect();
            let body = payload::created_event(&request, &s.ven_id, &list);
            let answer = self.call(cancel, "EiEvent", body).await?;
            if let Err(e) = check("EiEvent", &answer) {
                if !matches!(e, CallError::Refused { .. }) {
                    return Err(e);
                }
                // the VTN knows the event no longer: sending it again would not help
                self.counters
                    .add("openadr_errors_total", ("reason", e.reason()), 1);
                warn!(vtn = %self.base, error = %e, "openadr2b VTN refused an event answer");
            }
            for (reply, opt) in replies {
                if !reply.opt_in {
                    self.counters.inc("openadr_opt_outs_total");
                }
                info!(event = %reply.event_id, modification = reply.modification, opt_in = reply.opt_in, "openadr2b event answered");
                held.answered(&reply.event_id, reply.modification, opt);
            }
        }
        Ok(())
    }
}

/// The largest answer the VEN reads from a VTN: beyond it the call fails
/// (`too_large`) and nothing of it is kept.
pub const MAX_BODY: usize = 16 << 20;

/// The answer's body as text, read up to [`MAX_BODY`].
async fn read_body(resp: reqwest::Response, service: &'static str) -> Result<String, CallError> {
    let body = crate::http::read_capped(resp, MAX_BODY)
        .await
        .map_err(|e| match e {
            crate::http::BodyError::Transport(e) => transport(service, &e),
            e @ crate::http::BodyError::TooLarge(_) => CallError::Transport {
                service,
                reason: "too_large",
                detail: e.to_string(),
            },
        })?;
    String::from_utf8(body).map_err(|_| CallError::Transport {
        service,
        reason: "not_utf8",
        detail: "the answer is not UTF-8".into(),
    })
}

/// 1, 2, 4 … s up to `max_s`, each between half and all of it.
pub(crate) fn backoff(failures: u32, max_s: f64) -> f64 {
    let full = 2f64
        .powi(failures.saturating_sub(1).min(16) as i32)
        .min(max_s);
    full * (0.5 + 0.5 * crate::jitter::unit())
}

#[cfg(test)]
mod tests {
    #[test]
    fn backoff_grows_to_its_bound_with_jitter() {
        for n in 1..40 {
            let b = super::backoff(n, 60.0);
            let full = 2f64.powi((n - 1).min(16) as i32).min(60.0);
            assert!(b >= full / 2.0 && b <= full, "{n}: {b}");
        }
    }
}
