//! Price deferral: deferrable jobs wait while electricity costs more than the threshold,
//! and are always released by their latest start (deadline − duration − margin).

use std::collections::BTreeMap;

use telemetry::metric::names::PRICE_PER_KWH;
use telemetry::{Job, JobState, Site, Snapshot, Timestamp};

use crate::budget::round3;
use crate::plan::Hold;
use crate::policy::{OnStale, PriceRule};
use crate::State;

/// A hold to place or renew, or a release, for one job.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    Hold(Hold),
    Release { reason: String },
}

/// The last moment a job may still be held.
pub fn release_by(job: &Job, rule: &PriceRule) -> Timestamp {
    match job.latest_start() {
        Some(ls) => ls + -rule.margin_s,
        None => job.submit_time + rule.max_defer_s,
    }
}

/// Power headroom for releasing held jobs: when the price falls, held jobs are released
/// most urgent first, only as many per tick as the facility budget has room for, so
/// that a backlog does not start at once and overshoot the budget. A job that never
/// fits is still released at its latest start.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Pacing {
    /// Room left under the facility budget, in W (may be negative).
    pub headroom_w: f64,
    /// What one GPU of a released job is expected to draw, in W.
    pub watts_per_gpu: f64,
}

/// A verdict for every job the rule is concerned with, and the values it looked at.
pub fn evaluate(
    site: &Site,
    snapshot: &Snapshot,
    jobs: &[Job],
    prior: &State,
    rule: &PriceRule,
    pacing: Option<Pacing>,
    now: Timestamp,
) -> (BTreeMap<String, Verdict>, BTreeMap<String, f64>) {
    let mut values = BTreeMap::new();
    values.insert("defer_above".to_string(), rule.defer_above);
    let obs = snapshot.observe(&site.site_entity(), PRICE_PER_KWH, now);
    let expensive = match obs {
        Some(o) if o.usable() => {
            values.insert("price_per_kwh".to_string(), round3(o.value));
            Some(o.value > rule.defer_above)
        }
        _ => match rule.on_stale {
            OnStale::AssumeWorst => Some(true),
            OnStale::HoldLast => None,
            OnStale::Ignore => Some(false),
        },
    };
    let mut out = BTreeMap::new();
    let mut cheap_again: Vec<(Timestamp, &Job, &Hold)> = Vec::new();
    for job in jobs {
        let eligible =
            job.deferrable && (rule.classes.is_empty() || rule.classes.contains(&job.class));
        let waiting = matches!(job.state, JobState::Pending | JobState::Held);
        let held = prior.holds.get(&job.id);
        if !eligible || !waiting {
            if held.is_some() {
                out.insert(
                    job.id.clone(),
                    Verdict::Release {
                        reason: "job no longer waiting or not deferrable".into(),
                    },
                );
            }
            continue;
        }
        let by = release_by(job, rule);
        if now >= by {
            if held.is_some() {
                out.insert(
                    job.id.clone(),
                    Verdict::Release {
                        reason: format!("latest start {by} reached"),
                    },
                );
            }
            continue;
        }
        let hold = match expensive {
            Some(true) => true,
            Some(false) => false,
            None => held.is_some(),
        };
        if hold {
            let lease_until = (now + rule.lease_s).min(by);
            let reason = match obs {
                Some(o) if o.usable() => {
                    format!("price {:.3} above {:.3} per kWh", o.value, rule.defer_above)
                }
                _ => "price signal stale".to_string(),
            };
            out.insert(
                job.id.clone(),
                Verdict::Hold(Hold {
                    rule: "price.defer".into(),
                    since: held.map_or(now, |h| h.since),
                    lease_until,
                    reason,
                }),
            );
        } else if let Some(h) = held {
            cheap_again.push((by, job, h));
        }
    }
    let reason = match obs {
        Some(o) if o.usable() => format!(
            "price {:.3} at or below {:.3} per kWh",
            o.value, rule.defer_above
        ),
        _ => "price signal stale: not deferring on an unknown price".to_string(),
    };
    cheap_again.sort_by(|a, b| (a.0, &a.1.id).cmp(&(b.0, &b.1.id)));
    // the headroom already counts queued jobs that are free to start
    let mut room = pacing.map_or(f64::INFINITY, |p| p.headroom_w);
    if let Some(p) = pacing {
        values.insert("headroom_kw".to_string(), round3(p.headroom_w / 1000.0));
    }
    for (by, job, h) in cheap_again {
        let need = pacing.map_or(0.0, |p| p.watts_per_gpu * f64::from(job.gpus));
        if need <= room {
            room -= need;
            out.insert(
                job.id.clone(),
                Verdict::Release {
                    reason: reason.clone(),
                },
            );
        } else {
            out.insert(
                job.id.clone(),
                Verdict::Hold(Hold {
                    rule: "price.defer".into(),
                    since: h.since,
                    lease_until: (now + rule.lease_s).min(by),
                    reason: format!("{reason}; waiting for power headroom"),
                }),
            );
        }
    }
    (out, values)
}
