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

/// A verdict for every job the rule is concerned with, and the values it looked at.
pub fn evaluate(
    site: &Site,
    snapshot: &Snapshot,
    jobs: &[Job],
    prior: &State,
    rule: &PriceRule,
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
        } else if held.is_some() {
            let reason = match obs {
                Some(o) if o.usable() => format!(
                    "price {:.3} at or below {:.3} per kWh",
                    o.value, rule.defer_above
                ),
                _ => "price signal stale: not deferring on an unknown price".to_string(),
            };
            out.insert(job.id.clone(), Verdict::Release { reason });
        }
    }
    (out, values)
}
