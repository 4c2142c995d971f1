//! Webhook glue: inbound job events (the [`Inbox`] the HTTP server fills and the loop
//! takes each tick), and the holds and suspensions of webhook jobs turned into actions
//! in the durable outbox, which the webhook reconciler delivers off the loop.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Result;
use integrations::scheduler::webhook::OutboxDelivery;
use integrations::scheduler::{Counter, Scheduler, SchedulerId, WEBHOOK};
use integrations::store::{Store, Tx};
use integrations::webhook::{
    Action as WebhookAction, Delivery, JobEvent, Outbox, OutboxConfig, Rejected, WebhookKey,
    SIGNATURE_HEADER, TIMESTAMP_HEADER,
};
use integrations::webhook_guard::{PerMinute, ReplayWindow};
use policies::State;
use serde_json::json;
use telemetry::{Job, Timestamp};
use tracing::{info, warn};

use super::config::{read_key, WebhookSection};
use control::registry::{Lifecycle, Transition};

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
    log: telemetry::log_limit::LogLimiter,
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
            log: telemetry::log_limit::LogLimiter::new(Duration::from_secs(30)),
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

    /// The checks between the parser and the registry: the field lengths, a `time`
    /// beyond `tolerance_s` ahead of the controller's clock (or before 2000), a replay of
    /// a signed event (remembered from here on), an event older than the job's last
    /// transition. `Ok(true)`: take the event; `Ok(false)`: it is already recorded
    /// (a repeat of a job's end), answer without taking it.
    fn guard(
        &self,
        event: &JobEvent,
        signed: Option<(&str, &str)>,
        now: Timestamp,
    ) -> std::result::Result<bool, (u16, String)> {
        use integrations::webhook_guard::{check_lengths, check_time};
        if let Err(r) = check_lengths(event) {
            return Err(self.refuse(r.reason(), r.status(), format!("bad event: {r}")));
        }
        if let Err(r) = check_time(event, now, self.tolerance_s) {
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
    pub(super) fn take(&self) -> Vec<Job> {
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

    /// Events refused so far, by reason.
    pub(super) fn rejected(&self) -> BTreeMap<&'static str, u64> {
        self.lock().rejected.clone()
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
        .filter(|j| SchedulerId::of(j) == WEBHOOK)
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
        .filter(|j| SchedulerId::of(j) == WEBHOOK)
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

const WEBHOOK_HOLDS: &str = "webhook_holds";
const WEBHOOK_SUSPENDED: &str = "webhook_suspended";

/// `[schedulers.webhook]` on the loop's side: the inbox, and the actions for webhook
/// jobs put in the outbox (its delivery runs on the webhook reconciler).
pub struct Webhook {
    pub inbox: Arc<Inbox>,
    /// The outbox, shared with its reconciler; never locked across a call.
    outbox: Option<OutboxDelivery>,
    /// Webhook jobs held, with the `until` last sent.
    holds: BTreeMap<String, Timestamp>,
    /// Webhook jobs suspended.
    suspended: BTreeMap<String, Timestamp>,
    /// The dead-letter list, as last read from the store, and the count it was read at.
    dead: Vec<Delivery>,
    dead_seen: u64,
}

impl Webhook {
    /// The inbox, the outbox (with `url`) and what the store keeps of both; the
    /// outbox's delivery is the adapter returned for a reconciler.
    pub fn open(
        w: &WebhookSection,
        base: &std::path::Path,
        store: &mut Store,
    ) -> Result<(Webhook, Option<Box<dyn Scheduler>>)> {
        let key = read_key(&crate::paths::resolve(base, &w.key_file))?;
        let (done, jobs): (Vec<Job>, Vec<Job>) = store
            .jobs()?
            .into_iter()
            .filter(|j| SchedulerId::of(j) == WEBHOOK)
            .partition(|j| j.state.is_done());
        let jobs = jobs.into_iter().map(|j| (j.id.clone(), j)).collect();
        // the most recently finished are remembered, so that no event brings them back
        let mut done = done;
        done.sort_by_key(integrations::webhook_guard::last_transition);
        let done = done.split_off(done.len().saturating_sub(DONE_KEPT));
        let inbox = Arc::new(Inbox {
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
        });
        let mut outbox = None;
        if let Some(url) = &w.url {
            let o = Outbox::restore(
                OutboxConfig {
                    url: url.clone(),
                    client: w.client(base)?,
                    max_attempts: w.max_attempts,
                    backoff_s: w.backoff_s,
                    max_backoff_s: w.max_backoff_s,
                    per_pass: w.per_tick,
                },
                key,
                store,
            )?;
            info!(url = %url, waiting = o.pending().len(), "sending scheduler actions as signed webhooks");
            outbox = Some(OutboxDelivery::new(Arc::new(Mutex::new(o))));
        }
        let dead = Outbox::dead(store)?;
        let hook = Webhook {
            inbox,
            outbox: outbox.clone(),
            holds: store.records::<Timestamp>(WEBHOOK_HOLDS)?,
            suspended: store.records::<Timestamp>(WEBHOOK_SUSPENDED)?,
            dead,
            dead_seen: 0,
        };
        Ok((hook, outbox.map(|o| Box::new(o) as Box<dyn Scheduler>)))
    }

    /// powerplane holds the job through the webhook.
    pub fn holds(&self, id: &str) -> bool {
        self.holds.contains_key(id)
    }

    /// The tick's actions for webhook jobs: holds and releases, suspensions and
    /// resumes, and requeues, into the outbox (durably, with `tx`).
    pub fn actuate(
        &mut self,
        jobs: &[Job],
        actuated: &State,
        requeues: &[(String, String)],
        now: Timestamp,
        tx: &mut Tx,
    ) {
        let Some(o) = &self.outbox else {
            return;
        };
        let mut outbox = o.lock();
        webhook_holds(&mut outbox, &mut self.holds, jobs, actuated, now, tx);
        webhook_suspensions(&mut outbox, &mut self.suspended, jobs, actuated, now, tx);
        for (job, reason) in requeues {
            if let Some(j) = jobs
                .iter()
                .find(|j| &j.id == job && SchedulerId::of(j) == WEBHOOK)
            {
                outbox.enqueue(j, &WebhookAction::Requeue, reason, now, tx);
            }
        }
    }

    /// A cap notice for a webhook job that became capped or uncapped.
    pub fn notice(
        &mut self,
        job: &Job,
        t: &Transition,
        actuated: &State,
        now: Timestamp,
        tx: &mut Tx,
    ) {
        let Some(o) = self
            .outbox
            .as_ref()
            .filter(|_| SchedulerId::of(job) == WEBHOOK)
        else {
            return;
        };
        let capped = |s: &State| {
            job.allocated
                .iter()
                .filter_map(|g| s.caps.get(g).map(|c| c.watts))
                .fold(None, |m: Option<f64>, w| Some(m.map_or(w, |m| m.min(w))))
        };
        match (t.from, t.to) {
            (_, Lifecycle::Capped) => o.lock().enqueue(
                job,
                &WebhookAction::CapNotice {
                    watts: capped(actuated),
                },
                "the job's GPUs are capped",
                now,
                tx,
            ),
            (Some(Lifecycle::Capped), Lifecycle::Running) => o.lock().enqueue(
                job,
                &WebhookAction::CapNotice { watts: None },
                "the job's GPUs are no longer capped",
                now,
                tx,
            ),
            _ => {}
        }
    }

    /// Rereads the dead-letter list when the reconciler dead-lettered more.
    pub fn refresh_dead(&mut self, store: &mut Store) {
        let Some(o) = &self.outbox else {
            return;
        };
        let dead = o.lock().counters.dead;
        if dead == self.dead_seen {
            return;
        }
        match Outbox::dead(store) {
            Ok(d) => {
                self.dead = d;
                self.dead_seen = dead;
            }
            Err(e) => warn!(error = %e, "cannot read the webhook dead-letter list"),
        }
    }

    /// What `/api/v1/schedulers` shows under `webhook`.
    pub fn status(&self) -> serde_json::Value {
        json!({
            "inbound": self.inbox.status(),
            "outbound": self.outbox.as_ref().map(Scheduler::status),
            "holds": self.holds,
            "suspended": self.suspended,
            "dead_letters": self.dead,
        })
    }

    /// The outbox's and the inbox's counters for `/metrics`.
    pub fn counters(&self) -> Vec<Counter> {
        let mut out = self
            .outbox
            .as_ref()
            .map(Scheduler::counters)
            .unwrap_or_default();
        let g = self.inbox.lock();
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
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "8f3c1d2e4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0";

    fn inbox(tolerance_s: f64) -> Arc<Inbox> {
        Arc::new(Inbox {
            key: WebhookKey::from_text(KEY).expect("key"),
            tolerance_s,
            ack_wait: Duration::from_secs(5),
            stored: std::sync::Condvar::new(),
            deferrable_classes: vec![],
            inner: Mutex::new(InboxInner::new(BTreeMap::new(), vec![], 1000, tolerance_s)),
        })
    }

    /// Posts `body` signed at `now`, as the HTTP server hands it over.
    fn post(
        inbox: &Inbox,
        body: &str,
        now: Timestamp,
    ) -> std::result::Result<String, (u16, String)> {
        let ts = (now.as_millis() / 1000).to_string();
        let key = WebhookKey::from_text(KEY).expect("key");
        let sig = key.sign(&ts, body.as_bytes());
        inbox.receive(false, Some(&ts), Some(&sig), body.as_bytes(), now)
    }

    fn rfc3339(t: Timestamp) -> String {
        t.to_datetime().to_rfc3339()
    }

    #[test]
    fn an_event_dated_beyond_the_tolerance_ahead_is_refused_counted_and_wedges_no_job() {
        let inbox = inbox(300.0);
        // the loop: takes the events and stores them, so that each is answered
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let looped = {
            let (inbox, stop) = (inbox.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut last = BTreeMap::new();
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    for j in inbox.take() {
                        last.insert(j.id.clone(), j);
                    }
                    inbox.stored();
                    std::thread::sleep(Duration::from_millis(5));
                }
                last
            })
        };
        let now = Timestamp::from_secs(1_790_000_000);
        let ev = |kind: &str, job: &str, time: Timestamp| {
            format!(
                r#"{{"event":"{kind}","scheduler":"lsf","job":"{job}","time":"{}"}}"#,
                rfc3339(time)
            )
        };
        assert_eq!(
            post(&inbox, &ev("submitted", "j", now), now),
            Ok("lsf:j".into())
        );
        // a signed `started` dated 2999, then 10 minutes ahead: refused with the reason
        let y2999 = Timestamp::parse_rfc3339("2999-01-01T00:00:00Z").expect("time");
        for (at, arrives) in [
            (y2999, now.plus_secs(1.0)),
            (now.plus_secs(601.0), now.plus_secs(1.0)),
        ] {
            let (status, why) = post(&inbox, &ev("started", "j", at), arrives)
                .expect_err("a time beyond the tolerance ahead is refused");
            assert_eq!(status, 400, "{why}");
            assert!(
                why.contains("ahead of the controller's clock, more than the 300 s tolerated"),
                "{why}"
            );
        }
        // within the tolerance, and a clock that was never set
        let (status, why) = post(
            &inbox,
            &ev("submitted", "epoch", Timestamp::from_secs(0)),
            now.plus_secs(2.0),
        )
        .expect_err("1970 is no time");
        assert_eq!(status, 400, "{why}");
        assert!(why.contains("before 2000-01-01"), "{why}");
        assert_eq!(inbox.rejected().get("time_out_of_window"), Some(&3));
        // on /metrics, by reason
        let counters = control::admit::labeled(None, Some(inbox.rejected()));
        assert!(counters.iter().any(|c| c.name == "events_rejected_total"
            && c.value == "time_out_of_window"
            && c.count == 3));

        // the job's later events still work: it starts (a time 2 min ahead is within
        // the tolerance) and finishes
        assert!(post(
            &inbox,
            &ev("started", "j", now.plus_secs(120.0)),
            now.plus_secs(3.0)
        )
        .is_ok());
        assert!(post(
            &inbox,
            &ev("finished", "j", now.plus_secs(125.0)),
            now.plus_secs(8.0)
        )
        .is_ok());
        // a late resend dated a day back is a legitimate past time
        assert!(post(
            &inbox,
            &ev("submitted", "late", now.plus_secs(-86_400.0)),
            now.plus_secs(9.0)
        )
        .is_ok());
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let jobs = looped.join().expect("loop");
        assert_eq!(
            jobs["lsf:j"].state,
            telemetry::JobState::Finished,
            "{jobs:?}"
        );
        assert!(jobs.contains_key("lsf:late"));
        assert!(!jobs.contains_key("lsf:epoch"));
    }
}
