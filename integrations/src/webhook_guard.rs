//! Guards on inbound job events, between the signature check and the job registry:
//! a replayed event is refused ([`ReplayWindow`]), a sender over its events per
//! minute is refused ([`PerMinute`]), fields longer than their limit are refused
//! ([`check_lengths`]), an event dated beyond the tolerance ahead of its arrival (or
//! before 2000) is refused ([`check_time`]), and an event older than the job's last
//! recorded transition does not change the job ([`is_stale`]). Pure: the caller
//! passes the time.
//!
//! A signed event is identified by its signature (HMAC-SHA256 over the timestamp and
//! the body): a replay carries the same one, and nobody without the key can make
//! another. The window remembers each for as long as its timestamp is accepted
//! (timestamp + tolerance), so every replay the timestamp check lets through is
//! caught; it is bounded, and when it is full an event is refused rather than taken
//! unremembered.

use std::collections::{BTreeMap, HashMap, VecDeque};

use telemetry::{Job, JobState, Timestamp};

use crate::webhook::{EventKind, JobEvent};

/// Field limits, in characters (bytes for the ASCII names).
pub const MAX_JOB: usize = 128;
pub const MAX_NAME: usize = 256;
pub const MAX_TEXT: usize = 128;
pub const MAX_TIME: usize = 64;
pub const MAX_ALLOCATED: usize = 4096;
pub const MAX_ENTITY: usize = 128;

/// Why a guard refused an event.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("event {0} was already received (a replay)")]
    Replay(String),
    #[error("too many events in the replay window ({0} remembered); retry later")]
    WindowFull(usize),
    #[error("more than {limit} events per minute from {key}; retry later")]
    RateLimited { key: String, limit: u32 },
    #[error("{field}: at most {max} characters, got {got}")]
    TooLong {
        field: &'static str,
        max: usize,
        got: usize,
    },
    #[error("time {time}: {why}")]
    TimeOutOfWindow { time: String, why: String },
}

impl Refused {
    /// The reason label, for counters.
    pub fn reason(&self) -> &'static str {
        match self {
            Refused::Replay(_) => "replay",
            Refused::WindowFull(_) | Refused::RateLimited { .. } => "rate_limited",
            Refused::TooLong { .. } => "field_too_long",
            Refused::TimeOutOfWindow { .. } => "time_out_of_window",
        }
    }

    /// The HTTP status a sender gets.
    pub fn status(&self) -> u16 {
        match self {
            Refused::Replay(_) => 409,
            Refused::WindowFull(_) | Refused::RateLimited { .. } => 429,
            Refused::TooLong { .. } | Refused::TimeOutOfWindow { .. } => 400,
        }
    }
}

/// The signed events seen while their timestamps are accepted.
#[derive(Debug, Clone)]
pub struct ReplayWindow {
    cap: usize,
    /// id → when it may be forgotten.
    seen: HashMap<String, Timestamp>,
    /// (forget at, id), oldest first.
    order: VecDeque<(Timestamp, String)>,
}

impl ReplayWindow {
    /// A window of at most `cap` ids (at least 1).
    pub fn new(cap: usize) -> Self {
        ReplayWindow {
            cap: cap.max(1),
            seen: HashMap::new(),
            order: VecDeque::new(),
        }
    }

    /// [`ReplayWindow::seen`], then [`ReplayWindow::remember`].
    pub fn check(&mut self, id: &str, forget_at: Timestamp, now: Timestamp) -> Result<(), Refused> {
        self.seen(id, now)?;
        self.remember(id, forget_at, now)
    }

    /// Refuses `id` when it is remembered: a replay. (Checked before anything else, so
    /// that a replay costs the sender's credential nothing.)
    pub fn seen(&mut self, id: &str, now: Timestamp) -> Result<(), Refused> {
        self.expire(now);
        if self.seen.contains_key(id) {
            return Err(Refused::Replay(short(id)));
        }
        Ok(())
    }

    /// Remembers `id` until `forget_at` (once the event is taken); refuses it when it is
    /// remembered already, or when the window is full of ids still to be remembered.
    pub fn remember(
        &mut self,
        id: &str,
        forget_at: Timestamp,
        now: Timestamp,
    ) -> Result<(), Refused> {
        self.seen(id, now)?;
        if self.seen.len() >= self.cap {
            return Err(Refused::WindowFull(self.seen.len()));
        }
        self.seen.insert(id.to_string(), forget_at);
        // ids arrive with forget_at = timestamp + tolerance, nearly in order; one out of
        // order is forgotten late (never early)
        let at = self
            .order
            .back()
            .map_or(forget_at, |(t, _)| forget_at.max(*t));
        self.order.push_back((at, id.to_string()));
        Ok(())
    }

    fn expire(&mut self, now: Timestamp) {
        while let Some((at, _)) = self.order.front() {
            if *at > now {
                break;
            }
            if let Some((_, id)) = self.order.pop_front() {
                self.seen.remove(&id);
            }
        }
    }

    pub fn len(&self) -> usize {
        self.seen.len()
    }

    pub fn is_empty(&self) -> bool {
        self.seen.is_empty()
    }
}

fn short(id: &str) -> String {
    id.chars().take(16).collect()
}

/// Events per minute per sender key: a token bucket that holds a minute's worth and
/// refills continuously.
#[derive(Debug, Clone)]
pub struct PerMinute {
    limit: u32,
    /// key → (tokens, last refill). Keys are the caller's (one per credential), so
    /// they are few.
    buckets: BTreeMap<String, (f64, Timestamp)>,
}

impl PerMinute {
    pub fn new(limit: u32) -> Self {
        PerMinute {
            limit: limit.max(1),
            buckets: BTreeMap::new(),
        }
    }

    /// Takes one event for `key` now, or refuses it.
    pub fn take(&mut self, key: &str, now: Timestamp) -> Result<(), Refused> {
        let full = f64::from(self.limit);
        let (tokens, last) = self.buckets.entry(key.to_string()).or_insert((full, now));
        let elapsed = now.secs_since(*last).max(0.0);
        *tokens = (*tokens + elapsed * full / 60.0).min(full);
        *last = now;
        if *tokens < 1.0 {
            return Err(Refused::RateLimited {
                key: key.to_string(),
                limit: self.limit,
            });
        }
        *tokens -= 1.0;
        Ok(())
    }
}

/// Refuses a field longer than its limit, naming it.
pub fn check_lengths(e: &JobEvent) -> Result<(), Refused> {
    let len = |s: &str| s.chars().count();
    let mut fields: Vec<(&'static str, usize, usize)> = vec![("job", MAX_JOB, len(&e.job))];
    for (field, max, v) in [
        ("name", MAX_NAME, &e.name),
        ("class", MAX_TEXT, &e.class),
        ("project", MAX_TEXT, &e.project),
        ("user", MAX_TEXT, &e.user),
        ("time", MAX_TIME, &e.time),
        ("deadline", MAX_TIME, &e.deadline),
    ] {
        if let Some(v) = v {
            fields.push((field, max, len(v)));
        }
    }
    if let Some(a) = &e.allocated {
        fields.push(("allocated", MAX_ALLOCATED, a.len()));
        if let Some(longest) = a.iter().map(|g| len(g)).max() {
            fields.push(("allocated[]", MAX_ENTITY, longest));
        }
    }
    match fields.into_iter().find(|(_, max, got)| got > max) {
        Some((field, max, got)) => Err(Refused::TooLong { field, max, got }),
        None => Ok(()),
    }
}

/// The earliest `time` an event may carry (2000-01-01T00:00:00Z): anything before is a
/// clock that was never set, not a late resend.
pub const EARLIEST_EVENT_S: i64 = 946_684_800;

/// Refuses an event whose `time` is more than `tolerance_s` ahead of its arrival
/// (`now`): a job dated in the future would refuse every later event as older than
/// its last transition, and never finish. A past `time` is taken (a late resend keeps
/// the time the job changed), unless it is before [`EARLIEST_EVENT_S`]. An event
/// without a `time` happened at its arrival.
pub fn check_time(e: &JobEvent, now: Timestamp, tolerance_s: f64) -> Result<(), Refused> {
    let Some(text) = &e.time else { return Ok(()) };
    // the parser has checked the syntax; an unreadable time here is no time
    let Ok(at) = Timestamp::parse_rfc3339(text) else {
        return Ok(());
    };
    let ahead_s = at.secs_since(now);
    if ahead_s > tolerance_s {
        return Err(Refused::TimeOutOfWindow {
            time: text.clone(),
            why: format!("{ahead_s:.0} s ahead of the controller's clock, more than the {tolerance_s} s tolerated (tolerance_s)"),
        });
    }
    if at < Timestamp::from_secs(EARLIEST_EVENT_S) {
        return Err(Refused::TimeOutOfWindow {
            time: text.clone(),
            why: "before 2000-01-01: the sender's clock is not set".into(),
        });
    }
    Ok(())
}

/// When the job last changed state, as recorded: its end, its start or its submission.
pub fn last_transition(job: &Job) -> Timestamp {
    [Some(job.submit_time), job.start_time, job.end_time]
        .into_iter()
        .flatten()
        .max()
        .unwrap_or(job.submit_time)
}

/// Whether `event`, which happened at `at`, must not change `job`: it is older than
/// the job's last recorded transition, or the job is finished or cancelled and the
/// event would take it elsewhere (a finished job stays finished).
pub fn is_stale(event: &JobEvent, at: Timestamp, job: &Job) -> bool {
    let same_end = matches!(
        (event.event, job.state),
        (EventKind::Finished, JobState::Finished) | (EventKind::Cancelled, JobState::Cancelled)
    );
    if job.state.is_done() && !same_end {
        return true;
    }
    at < last_transition(job)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: f64) -> Timestamp {
        Timestamp::from_secs(1_790_000_000).plus_secs(s)
    }

    #[test]
    fn a_replay_inside_the_window_is_refused_and_forgotten_after_it() {
        let mut w = ReplayWindow::new(100);
        assert_eq!(w.check("sig-a", at(300.0), at(0.0)), Ok(()));
        assert_eq!(w.check("sig-b", at(301.0), at(1.0)), Ok(()));
        let again = w.check("sig-a", at(300.0), at(299.0));
        assert_eq!(again.as_ref().map_err(Refused::reason), Err("replay"));
        assert_eq!(again.map_err(|e| e.status()), Err(409));
        // the timestamp check refuses it from here on; the window may forget it
        assert_eq!(w.check("sig-c", at(700.0), at(300.5)), Ok(()));
        assert_eq!(w.len(), 2, "sig-a forgotten, sig-b and sig-c remembered");
    }

    #[test]
    fn an_id_only_looked_at_is_not_remembered() {
        let mut w = ReplayWindow::new(10);
        assert_eq!(w.seen("sig-a", at(0.0)), Ok(()));
        assert_eq!(w.seen("sig-a", at(1.0)), Ok(()), "not taken: not a replay");
        assert_eq!(w.remember("sig-a", at(300.0), at(2.0)), Ok(()));
        assert!(w.seen("sig-a", at(3.0)).is_err());
        assert!(
            w.remember("sig-a", at(300.0), at(3.0)).is_err(),
            "taken twice at once"
        );
    }

    #[test]
    fn a_full_window_refuses_rather_than_forgets_early() {
        let mut w = ReplayWindow::new(3);
        for i in 0..3 {
            w.check(&format!("s{i}"), at(300.0), at(0.0)).expect("room");
        }
        let full = w.check("s3", at(300.0), at(1.0));
        assert_eq!(
            full.map_err(|e| (e.reason(), e.status())),
            Err(("rate_limited", 429))
        );
        assert!(
            w.check("s0", at(300.0), at(2.0)).is_err(),
            "still remembered"
        );
        assert_eq!(w.check("s3", at(600.0), at(300.0)), Ok(()), "room again");
        assert_eq!(w.len(), 1);
    }

    #[test]
    fn events_per_minute_are_limited_per_key_and_refill() {
        let mut r = PerMinute::new(10);
        for _ in 0..10 {
            r.take("signed", at(0.0)).expect("within the limit");
        }
        let over = r.take("signed", at(0.0));
        assert_eq!(over.map_err(|e| e.status()), Err(429));
        r.take("bearer:ops", at(0.0))
            .expect("another key has its own");
        // a sixth of a minute refills a sixth of the bucket
        assert!(r.take("signed", at(6.0)).is_ok());
        assert!(r.take("signed", at(6.0)).is_err());
        for _ in 0..10 {
            r.take("signed", at(120.0)).expect("refilled");
        }
    }

    fn event(json: &str) -> JobEvent {
        JobEvent::parse(json.as_bytes()).expect("event")
    }

    #[test]
    fn an_over_long_field_is_named() {
        let long = "p".repeat(MAX_TEXT + 1);
        let e = event(&format!(
            r#"{{"event":"submitted","scheduler":"lsf","job":"1","project":"{long}"}}"#
        ));
        let err = check_lengths(&e).expect_err("too long");
        assert_eq!(err.to_string(), "project: at most 128 characters, got 129");
        assert_eq!((err.reason(), err.status()), ("field_too_long", 400));
        let ok = event(r#"{"event":"submitted","scheduler":"lsf","job":"1","user":"u"}"#);
        assert_eq!(check_lengths(&ok), Ok(()));
    }

    #[test]
    fn a_finished_job_stays_finished_and_older_events_change_nothing() {
        let submitted = event(r#"{"event":"submitted","scheduler":"lsf","job":"1"}"#);
        let started = event(r#"{"event":"started","scheduler":"lsf","job":"1"}"#);
        let finished = event(r#"{"event":"finished","scheduler":"lsf","job":"1"}"#);
        let job = submitted.apply(None, &[], at(0.0));
        let running = started.apply(Some(&job), &[], at(10.0));
        let done = finished.apply(Some(&running), &[], at(20.0));
        assert_eq!(last_transition(&done), at(20.0));
        assert!(is_stale(&submitted, at(25.0), &done), "no resurrection");
        assert!(is_stale(&started, at(25.0), &done));
        assert!(!is_stale(&finished, at(25.0), &done), "a repeat of the end");
        assert!(
            is_stale(&submitted, at(5.0), &running),
            "older than its start"
        );
        assert!(!is_stale(&finished, at(30.0), &running));
    }
}
