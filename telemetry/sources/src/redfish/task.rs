//! The walk of one endpoint as a task of a poll: the re-reads of its plan, or a
//! discovery of its whole tree (which first waits for one of the poller's discovery
//! slots); both end in a [`Polled`] for the poll (or a later one).

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;

use super::discover::Fetch;
use super::endpoint::{Endpoint, Plan};
use super::polled::Polled;
use super::walk::Walk;
use telemetry::mapping::Reject;
use telemetry::Timestamp;

/// The re-reads of what discovery found.
pub(super) async fn replay(ep: Arc<Endpoint>, now: Timestamp) -> Polled {
    let t = Instant::now();
    let reads = {
        let mut g = ep.plan.lock().unwrap_or_else(|p| p.into_inner());
        g.as_mut().map(|p| {
            p.polls += 1;
            p.reads.clone()
        })
    };
    let Some(reads) = reads else {
        return Polled::named(&ep.cfg.name);
    };
    let fetch = Fetch::new(&ep, false);
    let got = fetch.replay(&reads).await;
    let (requests, rejects) = fetch.into_parts();
    let mut p = match got {
        Ok(items) => {
            let mut w = Walk::new(&ep.cfg.name, now);
            w.read_all(items, &ep.cfg.bind);
            w.out.rejects = rejects;
            w.out
        }
        Err(e) if e.is_gone() => {
            // the tree changed: not a failure; the next poll discovers it again
            *ep.plan.lock().unwrap_or_else(|p| p.into_inner()) = None;
            Polled {
                rejects: vec![Reject {
                    reason: e.reason(),
                    detail: e.to_string(),
                }],
                ..Polled::named(&ep.cfg.name)
            }
        }
        Err(e) => Polled::failed(&ep.cfg.name, &e),
    };
    p.requests = requests;
    p.elapsed = t.elapsed();
    ep.counters.polled(p.elapsed);
    p
}

/// A discovery: waits for a slot, then has `deadline` to walk the tree. On success
/// the plan is replaced (its poll count starting at `first_polls`); a failed
/// rediscovery (`again`) keeps the old plan and tries again after a full cycle.
pub(super) async fn discover(
    ep: Arc<Endpoint>,
    now: Timestamp,
    slots: Arc<Semaphore>,
    deadline: Duration,
    first_polls: u32,
    again: bool,
) -> Polled {
    let Ok(_slot) = slots.acquire_owned().await else {
        return Polled::failed(&ep.cfg.name, &ep.fail("", "config", None, "poller closed"));
    };
    let t = Instant::now();
    let fetch = Fetch::new(&ep, again);
    let got = match tokio::time::timeout(deadline, fetch.discover()).await {
        Ok(r) => r,
        Err(_) => Err(ep.fail(
            "/redfish/v1",
            "deadline",
            None,
            format!("discovery not done within {:.0} s", deadline.as_secs_f64()),
        )),
    };
    let (requests, rejects) = fetch.into_parts();
    let mut p = match got {
        Ok(items) => {
            let mut w = Walk::new(&ep.cfg.name, now);
            w.read_all(items, &ep.cfg.bind);
            ep.counters.not_understood(w.out.not_understood);
            ep.counters.bindings_unfilled(
                w.out
                    .bindings
                    .iter()
                    .filter(|b| !matches!(b.outcome, super::bind::Outcome::Value { .. }))
                    .count(),
            );
            *ep.plan.lock().unwrap_or_else(|p| p.into_inner()) = Some(Plan {
                reads: std::mem::take(&mut w.plan),
                polls: first_polls,
            });
            w.out.rejects = rejects;
            w.out
        }
        Err(e) => {
            if e.reason() == "deadline" {
                ep.counters.failure(e.failure());
            }
            if again {
                if let Some(plan) = ep.plan.lock().unwrap_or_else(|p| p.into_inner()).as_mut() {
                    plan.polls = 0;
                }
            }
            Polled::failed(&ep.cfg.name, &e)
        }
    };
    p.discovery = true;
    p.requests = requests;
    p.elapsed = t.elapsed();
    if !again {
        ep.counters.polled(p.elapsed);
    }
    p
}
