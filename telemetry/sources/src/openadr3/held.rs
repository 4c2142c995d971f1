//! The events the OpenADR 3 VEN holds (pure): each poll's list taken as the whole
//! truth (an event the VTN no longer lists was cancelled), versions numbered, statuses
//! moved by the clock, and the meter sampled for the reports the events ask for.

use std::collections::BTreeMap;

use telemetry::grid::{EventStatus, GridEvent};
use telemetry::Timestamp;

use super::parse::{ReportKind, WireEvent};
use crate::openadr2b::events::MAX_EVENTS;

/// A cancelled event is shown (as cancelled) this long after the VTN stopped listing
/// it, then forgotten.
pub const CANCELLED_KEPT_S: f64 = 3_600.0;

/// One event held, with what its reports have gathered.
#[derive(Debug, Clone)]
pub struct Held {
    pub wire: WireEvent,
    pub event: GridEvent,
    pub first_seen: Timestamp,
    /// When the VTN stopped listing it.
    pub cancelled_at: Option<Timestamp>,
    pub report: Sampled,
}

/// The meter's samples since the last report of an event.
#[derive(Debug, Clone, Default)]
pub struct Sampled {
    pub since: Option<Timestamp>,
    pub sum_w: f64,
    pub n: u32,
    pub next_sample: Option<Timestamp>,
}

/// What a poll changed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Merged {
    pub fresh: usize,
    pub changed: bool,
    /// Listed but not held: the VEN holds [`MAX_EVENTS`] at most.
    pub refused: usize,
}

/// The events, by id.
#[derive(Debug, Default)]
pub struct Events {
    pub held: BTreeMap<String, Held>,
}

fn status(e: &GridEvent, now: Timestamp) -> EventStatus {
    match (e.start(), e.end()) {
        (Some(s), _) if now < s => EventStatus::Pending,
        (_, Some(end)) if now >= end => EventStatus::Completed,
        (Some(_), Some(_)) => EventStatus::Active,
        _ => EventStatus::Completed,
    }
}

impl Events {
    /// Takes a poll's list (`programs`: id → name). Events that have not ended go
    /// first; beyond [`MAX_EVENTS`] the rest are refused.
    pub fn merge(
        &mut self,
        mut listed: Vec<WireEvent>,
        programs: &BTreeMap<String, String>,
        now: Timestamp,
    ) -> Merged {
        let mut m = Merged::default();
        let ended = |w: &WireEvent| {
            w.intervals
                .iter()
                .map(|i| i.end())
                .max()
                .is_none_or(|e| e <= now)
        };
        listed.sort_by_key(|w| ended(w));
        let mut next: BTreeMap<String, Held> = BTreeMap::new();
        for w in listed {
            if next.len() >= MAX_EVENTS {
                m.refused += 1;
                continue;
            }
            if next.contains_key(&w.id) {
                continue; // listed twice: the first holds
            }
            let program = programs
                .get(&w.program_id)
                .cloned()
                .unwrap_or_else(|| w.program_id.clone());
            let held = match self.held.remove(&w.id) {
                Some(h) if h.cancelled_at.is_none() && same(&h.wire, &w) => h,
                Some(mut h) => {
                    h.event.modification = h.event.modification.saturating_add(1);
                    h.event.intervals = w.intervals.clone();
                    h.event.program = program;
                    h.event.status = status(&h.event, now);
                    h.cancelled_at = None;
                    h.wire = w;
                    m.changed = true;
                    h
                }
                None => {
                    m.fresh += 1;
                    m.changed = true;
                    let mut event = GridEvent {
                        id: w.id.clone(),
                        source: "openadr3".into(),
                        modification: 0,
                        status: EventStatus::Pending,
                        intervals: w.intervals.clone(),
                        program,
                    };
                    event.status = status(&event, now);
                    Held {
                        wire: w,
                        event,
                        first_seen: now,
                        cancelled_at: None,
                        report: Sampled::default(),
                    }
                }
            };
            next.insert(held.event.id.clone(), held);
        }
        self.keep_cancelled(&mut next, &mut m, now);
        self.held = next;
        m
    }

    /// What the VTN no longer lists was cancelled: shown so for
    /// [`CANCELLED_KEPT_S`], within the bound, then forgotten.
    fn keep_cancelled(
        &mut self,
        next: &mut BTreeMap<String, Held>,
        m: &mut Merged,
        now: Timestamp,
    ) {
        for (id, mut h) in std::mem::take(&mut self.held) {
            if next.len() >= MAX_EVENTS {
                break;
            }
            let since = *h.cancelled_at.get_or_insert_with(|| {
                m.changed = true;
                h.event.modification = h.event.modification.saturating_add(1);
                h.event.status = EventStatus::Cancelled;
                now
            });
            if now.secs_since(since) < CANCELLED_KEPT_S {
                next.insert(id, h);
            } else {
                m.changed = true;
            }
        }
    }

    /// When an event first seen at `id` was: for OpenADR 3's "start now".
    pub fn first_seen(&self, id: &str, now: Timestamp) -> Timestamp {
        self.held.get(id).map_or(now, |h| h.first_seen)
    }

    /// Moves statuses with the clock; whether any changed.
    pub fn tick(&mut self, now: Timestamp) -> bool {
        let mut changed = false;
        for h in self.held.values_mut() {
            if h.cancelled_at.is_some() {
                continue;
            }
            let s = status(&h.event, now);
            if s != h.event.status {
                h.event.status = s;
                changed = true;
            }
        }
        changed
    }

    /// The next time a status changes by the clock alone.
    pub fn next_change(&self, now: Timestamp) -> Option<Timestamp> {
        self.held
            .values()
            .filter(|h| h.cancelled_at.is_none())
            .flat_map(|h| h.event.start().into_iter().chain(h.event.end()))
            .filter(|t| *t > now)
            .min()
    }

    /// The events, by id.
    pub fn list(&self) -> Vec<GridEvent> {
        self.held.values().map(|h| h.event.clone()).collect()
    }

    /// Samples the meter (`meter_w`, when known) for every event in force that asks
    /// for reports and is due a sample; returns the next time one is due.
    pub fn sample(
        &mut self,
        now: Timestamp,
        meter_w: Option<f64>,
        every_s: f64,
    ) -> Option<Timestamp> {
        let mut next: Option<Timestamp> = None;
        for h in self.held.values_mut() {
            if h.wire.reports.is_empty() || h.event.status != EventStatus::Active {
                continue;
            }
            let r = &mut h.report;
            r.since.get_or_insert(now);
            if r.next_sample.is_none_or(|t| t <= now) {
                if let Some(w) = meter_w {
                    r.sum_w += w;
                    r.n += 1;
                }
                r.next_sample = Some(now.plus_secs(every_s));
            }
            next = match (next, r.next_sample) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
        }
        next
    }

    /// The reports due at `now` (every `report_s` while an event is in force, and one
    /// last when it ends or is cancelled): (event, program id, what to report, mean
    /// power W, start, seconds covered). Each event's samples are cleared.
    pub fn due_reports(&mut self, now: Timestamp, report_s: f64) -> Vec<DueReport> {
        let mut out = Vec::new();
        for h in self.held.values_mut() {
            let r = &mut h.report;
            let Some(since) = r.since else {
                continue;
            };
            let over = h.event.status != EventStatus::Active;
            if !over && now.secs_since(since) < report_s {
                continue;
            }
            if r.n > 0 {
                out.push(DueReport {
                    event_id: h.event.id.clone(),
                    program_id: h.wire.program_id.clone(),
                    kinds: h.wire.reports.clone(),
                    mean_w: r.sum_w / f64::from(r.n),
                    start: since,
                    seconds: now.secs_since(since).max(0.0),
                });
            }
            *r = Sampled {
                since: (!over).then_some(now),
                ..Sampled::default()
            };
        }
        out
    }

    /// Whether a report is due at `now`: an event's period is over, or it ended (or
    /// was cancelled) with samples not yet sent.
    pub fn report_due(&self, now: Timestamp, report_s: f64) -> bool {
        self.held.values().any(|h| {
            h.report.since.is_some_and(|s| {
                h.event.status != EventStatus::Active || now.secs_since(s) >= report_s
            })
        })
    }

    /// When the next report falls due.
    pub fn next_report(&self, report_s: f64) -> Option<Timestamp> {
        self.held
            .values()
            .filter_map(|h| h.report.since.map(|s| s.plus_secs(report_s)))
            .min()
    }
}

/// One report to send.
#[derive(Debug, Clone, PartialEq)]
pub struct DueReport {
    pub event_id: String,
    pub program_id: String,
    pub kinds: Vec<ReportKind>,
    pub mean_w: f64,
    pub start: Timestamp,
    pub seconds: f64,
}

/// The most reports waiting to be sent while the VTN does not take them; beyond, the
/// oldest is dropped and counted.
pub const MAX_UNSENT: usize = 256;

/// The reports made and not yet taken by the VTN, oldest first: a report whose POST
/// failed is sent again (first) at the next round, not lost with its samples.
#[derive(Debug, Default)]
pub struct Outbox {
    q: std::collections::VecDeque<DueReport>,
    /// Dropped since the last [`Outbox::take_dropped`].
    dropped: u64,
}

impl Outbox {
    /// Queues `reports` after those waiting, within [`MAX_UNSENT`].
    pub fn push(&mut self, reports: Vec<DueReport>) {
        for r in reports {
            if self.q.len() >= MAX_UNSENT {
                self.q.pop_front();
                self.dropped += 1;
            }
            self.q.push_back(r);
        }
    }

    /// The oldest report waiting.
    pub fn front(&self) -> Option<&DueReport> {
        self.q.front()
    }

    /// The oldest report was taken.
    pub fn sent(&mut self) {
        self.q.pop_front();
    }

    pub fn is_empty(&self) -> bool {
        self.q.is_empty()
    }

    /// How many were dropped since the last call.
    pub fn take_dropped(&mut self) -> u64 {
        std::mem::take(&mut self.dropped)
    }
}

fn same(a: &WireEvent, b: &WireEvent) -> bool {
    a.modified == b.modified && a.intervals == b.intervals && a.program_id == b.program_id
}

#[cfg(test)]
#[path = "held_tests.rs"]
mod tests;
