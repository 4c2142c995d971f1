//! The VEN's set of events: what each `oadrDistributeEvent` changes in it, which events
//! need an answer, and what time does to them. Pure: the time is an argument.
//!
//! - an event new to the set, or whose modification number rose, replaces what was
//!   held and is answered again (when the VTN asks for answers);
//! - one with a lower modification number than held is stale and ignored;
//! - an `oadrDistributeEvent` lists every event the VTN holds for the VEN: one held but
//!   left out of it is cancelled (as 2.0b says);
//! - after the VEN registers again, the VTN (perhaps restarted with fresh state) may
//!   number an event's versions anew: the next version it sends of a held event
//!   replaces it whatever its number, and is answered unless it is the very same;
//! - a cancelled or completed event stays (with that status) until its end, then is
//!   dropped; any event is dropped at its end; a pending one turns active at its start.
//!
//! The set holds at most [`MAX_EVENTS`]: beyond it, a cancelled or completed event goes
//! first (the oldest first), then what the VTN no longer lists; what still does not fit
//! is refused (and counted by the caller). A VTN that lists ever new events cannot grow
//! it without bound.
//!
//! An outage changes nothing here: the set is only changed by what the VTN sends and by
//! time, so an active event stays in force through it until its end.

use std::collections::{BTreeMap, HashSet};

use telemetry::grid::{EventStatus, GridEvent};
use telemetry::Timestamp;

use super::parse::Distributed;

/// What the VEN said of an event (or says, once asked).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Opt {
    In,
    Out { reason: String },
}

#[derive(Debug, Clone)]
struct Held {
    event: GridEvent,
    response_required: bool,
    /// The `requestID` of the `oadrDistributeEvent` that brought this version.
    request_id: String,
    /// The modification number last answered, and how.
    answered: Option<(u32, Opt)>,
    /// Held from before the VEN registered again: the VTN (perhaps restarted with
    /// fresh state) may number its versions anew.
    rebased: bool,
}

/// An event to answer: the event, the request it came with, and (for a cancellation)
/// the answer given before.
#[derive(Debug, Clone, PartialEq)]
pub struct Unanswered {
    pub event: GridEvent,
    pub request_id: String,
    pub previous: Option<Opt>,
}

/// The most events the VEN holds at once.
pub const MAX_EVENTS: usize = 1_000;

/// The events, by id.
#[derive(Debug, Clone, Default)]
pub struct Events {
    held: BTreeMap<String, Held>,
}

/// What one `oadrDistributeEvent` did to the set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Merged {
    /// Events new to the set, or modified.
    pub fresh: usize,
    /// Whether the set changed.
    pub changed: bool,
    /// New events not taken: the set was full.
    pub refused: usize,
}

impl Events {
    /// Takes in a whole `oadrDistributeEvent`, in time linear in the set and the list.
    pub fn merge(&mut self, request_id: &str, events: &[Distributed]) -> Merged {
        let mut changed = false;
        let mut fresh = 0;
        let mut refused = 0;
        let listed: HashSet<&str> = events.iter().map(|d| d.event.id.as_str()).collect();
        for d in events {
            let e = &d.event;
            if !self.held.contains_key(&e.id) && self.held.len() >= MAX_EVENTS {
                if !self.make_room(&listed) {
                    refused += 1;
                    continue;
                }
                changed = true;
            }
            match self.held.get_mut(&e.id) {
                Some(h) if h.rebased && same_version(&h.event, e) => {
                    h.rebased = false;
                    if h.event != *e {
                        h.event = e.clone();
                        changed = true;
                    }
                }
                Some(h) if !h.rebased && e.modification < h.event.modification => {}
                Some(h) if !h.rebased && e.modification == h.event.modification => {
                    // the same version: the VTN may still move its status
                    if h.event != *e {
                        h.event = e.clone();
                        changed = true;
                    }
                }
                _ => {
                    fresh += 1;
                    changed = true;
                    // a version from before a new registration counts for nothing
                    let answered = self
                        .held
                        .get(&e.id)
                        .filter(|h| !h.rebased)
                        .and_then(|h| h.answered.clone());
                    self.held.insert(
                        e.id.clone(),
                        Held {
                            event: e.clone(),
                            response_required: d.response_required,
                            request_id: request_id.to_string(),
                            answered,
                            rebased: false,
                        },
                    );
                }
            }
        }
        for (id, h) in &mut self.held {
            if !listed.contains(id.as_str())
                && !matches!(
                    h.event.status,
                    EventStatus::Cancelled | EventStatus::Completed
                )
            {
                // the VTN no longer holds it: there is nothing to answer
                h.event.status = EventStatus::Cancelled;
                h.response_required = false;
                changed = true;
            }
        }
        Merged {
            fresh,
            changed,
            refused,
        }
    }

    /// Drops one held event to make room for a new one: an ended one (cancelled or
    /// completed) first, then one the VTN no longer lists. `false`: none may go.
    fn make_room(&mut self, listed: &HashSet<&str>) -> bool {
        let over = |h: &Held| {
            matches!(
                h.event.status,
                EventStatus::Cancelled | EventStatus::Completed
            )
        };
        let victim = self
            .held
            .iter()
            .filter(|(id, h)| over(h) && !listed.contains(id.as_str()))
            .min_by_key(|(_, h)| h.event.start())
            .or_else(|| {
                self.held
                    .iter()
                    .filter(|(id, _)| !listed.contains(id.as_str()))
                    .min_by_key(|(_, h)| h.event.start())
            })
            .map(|(id, _)| id.clone());
        match victim {
            Some(id) => {
                self.held.remove(&id);
                true
            }
            None => false,
        }
    }

    /// After registering again: whatever version of a held event the VTN sends next
    /// replaces it (answered again unless it is the very same), even with a lower
    /// modification number.
    pub fn rebase(&mut self) {
        for h in self.held.values_mut() {
            h.rebased = true;
        }
    }

    /// The events whose current version the VTN wants an answer to and has none yet.
    pub fn unanswered(&self) -> Vec<Unanswered> {
        self.held
            .values()
            .filter(|h| h.response_required)
            .filter(|h| {
                h.answered
                    .as_ref()
                    .is_none_or(|(m, _)| *m < h.event.modification)
            })
            .map(|h| Unanswered {
                event: h.event.clone(),
                request_id: h.request_id.clone(),
                previous: h.answered.as_ref().map(|(_, o)| o.clone()),
            })
            .collect()
    }

    /// Records the answer the VTN took for `id` at `modification`.
    pub fn answered(&mut self, id: &str, modification: u32, opt: Opt) {
        if let Some(h) = self.held.get_mut(id) {
            h.answered = Some((modification, opt));
        }
    }

    /// What time does: pending events that started turn active, events that ended are
    /// dropped (cancelled ones with no intervals at once). Returns whether anything
    /// changed.
    pub fn tick(&mut self, now: Timestamp) -> bool {
        let before = self.held.len();
        self.held.retain(|_, h| match h.event.end() {
            Some(end) => now < end,
            None => !matches!(
                h.event.status,
                EventStatus::Cancelled | EventStatus::Completed
            ),
        });
        let mut changed = self.held.len() != before;
        for h in self.held.values_mut() {
            if h.event.status == EventStatus::Pending && h.event.start().is_some_and(|s| s <= now) {
                h.event.status = EventStatus::Active;
                changed = true;
            }
        }
        changed
    }

    /// When [`Events::tick`] next has something to do.
    pub fn next_change(&self, now: Timestamp) -> Option<Timestamp> {
        self.held
            .values()
            .flat_map(|h| {
                let start = (h.event.status == EventStatus::Pending)
                    .then(|| h.event.start())
                    .flatten();
                start.into_iter().chain(h.event.end())
            })
            .filter(|t| *t > now)
            .min()
    }

    /// The events, by id.
    pub fn list(&self) -> Vec<GridEvent> {
        self.held.values().map(|h| h.event.clone()).collect()
    }
}

/// The same modification of the same event (its status aside, which time moves).
fn same_version(a: &GridEvent, b: &GridEvent) -> bool {
    a.modification == b.modification && a.intervals == b.intervals && a.program == b.program
}

#[cfg(test)]
mod tests {
    use super::*;
    use telemetry::grid::{GridInterval, GridTarget};

    fn fc(m: Merged) -> (usize, bool) {
        (m.fresh, m.changed)
    }

    fn ev(id: &str, modification: u32, status: EventStatus, level: u8) -> Distributed {
        Distributed {
            event: GridEvent {
                id: id.into(),
                source: "openadr2b".into(),
                modification,
                status,
                intervals: vec![GridInterval {
                    start: Timestamp::from_secs(100),
                    duration_s: 100.0,
                    target: GridTarget::Level(level),
                }],
                program: String::new(),
            },
            response_required: true,
        }
    }

    #[test]
    fn new_and_modified_events_are_answered_once_each() {
        let mut s = Events::default();
        assert_eq!(
            fc(s.merge("r1", &[ev("a", 0, EventStatus::Pending, 1)])),
            (1, true)
        );
        let u = s.unanswered();
        assert_eq!(u.len(), 1);
        assert_eq!(u[0].request_id, "r1");
        s.answered("a", 0, Opt::In);
        assert!(s.unanswered().is_empty());
        // the same again: nothing to answer, nothing changed
        assert_eq!(
            fc(s.merge("r2", &[ev("a", 0, EventStatus::Pending, 1)])),
            (0, false)
        );
        assert!(s.unanswered().is_empty());
        // stale
        assert_eq!(
            fc(s.merge("r3", &[ev("a", 1, EventStatus::Pending, 2)])),
            (1, true)
        );
        s.answered("a", 1, Opt::In);
        assert_eq!(
            fc(s.merge("r4", &[ev("a", 0, EventStatus::Pending, 3)])),
            (0, false)
        );
        assert_eq!(s.list()[0].intervals[0].target, GridTarget::Level(2));
        // cancelled: answered again, with the earlier answer at hand
        s.merge("r5", &[ev("a", 2, EventStatus::Cancelled, 2)]);
        let u = s.unanswered();
        assert_eq!(u[0].previous, Some(Opt::In));
    }

    #[test]
    fn an_event_left_out_is_cancelled_and_dropped_at_its_end() {
        let mut s = Events::default();
        s.merge("r1", &[ev("a", 0, EventStatus::Active, 1)]);
        s.merge("r2", &[ev("b", 0, EventStatus::Pending, 1)]);
        let l = s.list();
        assert_eq!(l[0].status, EventStatus::Cancelled);
        assert_eq!(s.unanswered().len(), 1, "only b");
        assert_eq!(l[1].status, EventStatus::Pending);
        assert!(!s.tick(Timestamp::from_secs(50)));
        assert_eq!(
            s.next_change(Timestamp::from_secs(50)),
            Some(Timestamp::from_secs(100))
        );
        assert!(s.tick(Timestamp::from_secs(150)));
        assert_eq!(s.list()[1].status, EventStatus::Active);
        assert!(s.tick(Timestamp::from_secs(200)));
        assert!(s.list().is_empty());
    }

    #[test]
    fn after_registering_again_a_renumbered_event_replaces_the_held_one() {
        let mut s = Events::default();
        s.merge(
            "r1",
            &[
                ev("a", 4, EventStatus::Active, 1),
                ev("b", 2, EventStatus::Active, 1),
            ],
        );
        s.answered("a", 4, Opt::In);
        s.answered("b", 2, Opt::In);
        s.rebase();
        // a: the very same, nothing to answer; b: numbered anew from 0, taken and answered
        let (fresh, changed) = fc(s.merge(
            "r2",
            &[
                ev("a", 4, EventStatus::Active, 1),
                ev("b", 0, EventStatus::Active, 3),
            ],
        ));
        assert_eq!((fresh, changed), (1, true));
        let u = s.unanswered();
        assert_eq!(u.len(), 1);
        assert_eq!((u[0].event.id.as_str(), u[0].event.modification), ("b", 0));
        assert_eq!(s.list()[1].intervals[0].target, GridTarget::Level(3));
        // once taken, the usual rule again: a lower number is stale
        s.answered("b", 0, Opt::In);
        assert_eq!(
            fc(s.merge(
                "r3",
                &[
                    ev("a", 3, EventStatus::Active, 2),
                    ev("b", 0, EventStatus::Active, 3)
                ]
            )),
            (0, false)
        );
    }

    #[test]
    fn events_needing_no_answer_are_not_answered() {
        let mut s = Events::default();
        let mut d = ev("a", 0, EventStatus::Pending, 1);
        d.response_required = false;
        s.merge("r1", &[d]);
        assert!(s.unanswered().is_empty());
    }

    #[test]
    fn the_set_is_bounded_dropping_what_the_vtn_no_longer_lists_first() {
        let mut s = Events::default();
        let first: Vec<Distributed> = (0..MAX_EVENTS)
            .map(|i| ev(&format!("a{i}"), 0, EventStatus::Active, 1))
            .collect();
        let m = s.merge("r1", &first);
        assert_eq!((m.fresh, m.refused), (MAX_EVENTS, 0));
        // a list of new events only: the old ones are no longer listed and make room
        let second: Vec<Distributed> = (0..10)
            .map(|i| ev(&format!("b{i}"), 0, EventStatus::Active, 1))
            .collect();
        let m = s.merge("r2", &second);
        assert_eq!((m.fresh, m.refused, m.changed), (10, 0, true));
        assert_eq!(s.list().len(), MAX_EVENTS);
        assert!(s.list().iter().filter(|e| e.id.starts_with('b')).count() == 10);
        // a list longer than the bound, all listed: what does not fit is refused
        let third: Vec<Distributed> = (0..MAX_EVENTS + 5)
            .map(|i| ev(&format!("c{i}"), 0, EventStatus::Active, 1))
            .collect();
        let m = s.merge("r3", &third);
        assert_eq!((m.fresh, m.refused), (MAX_EVENTS, 5));
        assert_eq!(s.list().len(), MAX_EVENTS);
        assert!(s.list().iter().all(|e| e.id.starts_with('c')));
    }
}
