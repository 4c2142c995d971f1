//! The engine: runs every rule on the inputs and merges their wishes into one plan.
//!
//! Conflicts: for each GPU the lowest cap any enforcing rule wants is the one in force
//! (the most protective cap wins); it is clamped into the GPU's own constraints. Caps
//! fall at once and rise at most `raise_w_per_min`; changes under `deadband_w` are not
//! made. Rules in observe mode run the same way into a separate, never-actuated state.

use std::collections::BTreeMap;

use telemetry::{EntityId, Job, Site, Snapshot, Timestamp};

use crate::budget::{self, ScopeView};
use crate::plan::{Action, Cap, Decision, Hold, Plan, State, Target};
use crate::price::{self, Verdict};
use crate::thermal;
use crate::Policy;

/// Everything the engine looks at.
#[derive(Debug, Clone, Copy)]
pub struct Inputs<'a> {
    pub site: &'a Site,
    pub snapshot: &'a Snapshot,
    pub jobs: &'a [Job],
    /// What is in force now (the previous plan's state, as applied).
    pub prior: &'a State,
    pub policy: &'a Policy,
    /// Price and carbon forecasts (empty when there is no feed).
    pub forecast: &'a crate::Forecast,
}

/// Per (rule, scope): the values a rule looked at and what it says about them.
type Why = BTreeMap<(String, String), (BTreeMap<String, f64>, String)>;

/// Changed GPUs grouped by (rack, rule, new cap in tenths of a watt).
type Groups = Vec<((String, String, Option<i64>), Vec<EntityId>)>;

/// A rule's wanted cap for one GPU, with what to say about it.
#[derive(Debug, Clone)]
struct Want {
    watts: f64,
    rule: String,
    lease_s: f64,
}

/// Evaluates the policy. Pure: the same inputs and `now` give the same plan.
pub fn evaluate(inputs: &Inputs<'_>, now: Timestamp) -> Plan {
    let Inputs {
        site,
        snapshot,
        jobs,
        prior,
        policy,
        forecast,
    } = *inputs;
    let mut enforce: BTreeMap<EntityId, Want> = BTreeMap::new();
    let mut observe: BTreeMap<EntityId, Want> = BTreeMap::new();
    let mut why: Why = BTreeMap::new();

    let mut next = State::default();
    let mut pacing = None;
    if policy.budget.enabled {
        let (wanted, views) = budget::evaluate(site, snapshot, jobs, prior, &policy.budget, now);
        pacing = views.last().map(|facility| price::Pacing {
            // release into half the room per tick: the rest is for what starts meanwhile
            headroom_w: 0.5
                * (facility.budget_kw * (1.0 - policy.budget.margin) - facility.demand_kw)
                * 1000.0,
            watts_per_gpu: typical_gpu_w(site),
        });
        let target = if policy.budget.observe {
            &mut observe
        } else {
            &mut enforce
        };
        for (gpu, w) in wanted {
            offer(target, gpu, w.watts, w.rule, policy.budget.lease_s);
        }
        for v in &views {
            let rule = if v.scope.kind == telemetry::EntityKind::Site {
                "budget.facility"
            } else {
                "budget.rack"
            };
            why.insert(
                (rule.to_string(), v.scope.to_string()),
                (v.values(), budget_reason(v)),
            );
        }
    }
    if policy.thermal.enabled {
        let (levels, steps) = thermal::evaluate(site, snapshot, prior, &policy.thermal, now);
        let target = if policy.thermal.observe {
            &mut observe
        } else {
            &mut enforce
        };
        for g in site.gpus() {
            if let Some(l) = levels.get(&g.rack.id) {
                offer(
                    target,
                    g.id.clone(),
                    g.model.default_w * l.fraction,
                    "thermal.inlet",
                    policy.thermal.lease_s,
                );
            }
        }
        for s in steps {
            why.insert(
                ("thermal.inlet".into(), EntityId::rack(&s.rack).to_string()),
                (s.values, s.reason),
            );
        }
        next.thermal = levels;
    }

    let mut decisions = Vec::new();
    next.caps = settle(site, &prior.caps, &enforce, policy, now);
    cap_decisions(
        site,
        &prior.caps,
        &next.caps,
        &why,
        false,
        now,
        &mut decisions,
    );
    next.observed_caps = settle(site, &prior.observed_caps, &observe, policy, now);
    cap_decisions(
        site,
        &prior.observed_caps,
        &next.observed_caps,
        &why,
        true,
        now,
        &mut decisions,
    );

    if policy.price.enabled {
        let (verdicts, values) = price::evaluate(
            site,
            snapshot,
            jobs,
            prior,
            &policy.price,
            pacing,
            forecast,
            now,
        );
        let observe_only = policy.price.observe;
        let (prior_holds, holds) = if observe_only {
            (&prior.observed_holds, &mut next.observed_holds)
        } else {
            (&prior.holds, &mut next.holds)
        };
        hold_decisions(
            jobs,
            prior_holds,
            verdicts,
            &values,
            observe_only,
            now,
            holds,
            &mut decisions,
        );
    } else {
        for job in prior.holds.keys() {
            decisions.push(release(
                job,
                "price rule disabled",
                &BTreeMap::new(),
                false,
                now,
            ));
        }
    }
    Plan {
        state: next,
        decisions,
    }
}

/// What a busy GPU of this site may draw, for pacing releases: its default limit plus
/// its share of its node's base power (the worst case, so releases never overshoot).
fn typical_gpu_w(site: &Site) -> f64 {
    let gpus = site.gpus();
    gpus.iter()
        .map(|g| g.model.default_w + g.node.base_w / f64::from(g.node.gpus.max(1)))
        .sum::<f64>()
        / gpus.len().max(1) as f64
}

fn offer(map: &mut BTreeMap<EntityId, Want>, gpu: EntityId, watts: f64, rule: &str, lease_s: f64) {
    match map.get(&gpu) {
        Some(w) if w.watts <= watts => {}
        _ => {
            map.insert(
                gpu,
                Want {
                    watts,
                    rule: rule.to_string(),
                    lease_s,
                },
            );
        }
    }
}

fn budget_reason(v: &ScopeView) -> String {
    let what = if v.scope.kind == telemetry::EntityKind::Site {
        "facility".to_string()
    } else {
        v.scope.to_string()
    };
    let mut s = format!(
        "{what} demand {:.1} kW against budget {:.1} kW",
        v.demand_kw, v.budget_kw
    );
    if !v.feasible {
        s.push_str(" (not reachable even with every GPU at its minimum)");
    }
    if v.stale_inputs > 0 {
        s.push_str(&format!(
            " ({} stale GPU readings counted as their maximum)",
            v.stale_inputs
        ));
    }
    s
}

/// Turns wanted caps into caps in force: clamped, rate limited, with leases.
fn settle(
    site: &Site,
    prior: &BTreeMap<EntityId, Cap>,
    wants: &BTreeMap<EntityId, Want>,
    policy: &Policy,
    now: Timestamp,
) -> BTreeMap<EntityId, Cap> {
    let b = &policy.budget;
    let mut out = BTreeMap::new();
    for g in site.gpus() {
        let model = g.model;
        let old = prior.get(&g.id);
        let want = wants.get(&g.id);
        let current = old.map_or(model.default_w, |c| c.watts);
        let target = model.clamp_limit(want.map_or(model.default_w, |w| w.watts));
        let lease_s = want.map_or(b.lease_s, |w| w.lease_s);
        let rule = want
            .map(|w| w.rule.clone())
            .or_else(|| old.map(|c| c.rule.clone()))
            .unwrap_or_default();
        let keep = |c: &Cap| Cap {
            rule: rule.clone(),
            lease_until: now + lease_s,
            ..c.clone()
        };
        let cap = if target < current - b.deadband_w {
            Some(Cap {
                watts: target,
                rule,
                since: now,
                lease_until: now + lease_s,
            })
        } else if target <= current {
            old.map(keep)
        } else {
            // rising: no faster than the rate limit allows since the last change
            let since = old.map_or(now, |c| c.since);
            let allowed = current + b.raise_w_per_min * now.secs_since(since).max(0.0) / 60.0;
            let new = target.min(allowed);
            if new >= model.default_w - 0.5 {
                None
            } else if new - current < b.deadband_w {
                old.map(keep)
            } else {
                Some(Cap {
                    watts: model.clamp_limit(new),
                    rule,
                    since: now,
                    lease_until: now + lease_s,
                })
            }
        };
        if let Some(c) = cap {
            out.insert(g.id, c);
        }
    }
    out
}

fn cap_decisions(
    site: &Site,
    prior: &BTreeMap<EntityId, Cap>,
    next: &BTreeMap<EntityId, Cap>,
    why: &Why,
    observe_only: bool,
    now: Timestamp,
    out: &mut Vec<Decision>,
) {
    // group changed GPUs by rack, rule and new value, in site order
    let mut groups: Groups = Vec::new();
    for g in site.gpus() {
        let (old, new) = (prior.get(&g.id), next.get(&g.id));
        let changed = match (old, new) {
            (None, None) => false,
            (Some(a), Some(b)) => (a.watts - b.watts).abs() >= 0.5,
            _ => true,
        };
        if !changed {
            continue;
        }
        let rule = new.or(old).map(|c| c.rule.clone()).unwrap_or_default();
        let key = (
            g.rack.id.clone(),
            rule,
            new.map(|c| (c.watts * 10.0).round() as i64),
        );
        match groups.iter_mut().find(|(k, _)| *k == key) {
            Some((_, v)) => v.push(g.id),
            None => groups.push((key, vec![g.id])),
        }
    }
    for ((rack, rule, watts), gpus) in groups {
        let scope = if rule == "budget.facility" {
            site.site_entity()
        } else {
            EntityId::rack(&rack)
        };
        let (values, reason) = why
            .get(&(rule.clone(), scope.to_string()))
            .cloned()
            .unwrap_or_else(|| (BTreeMap::new(), String::new()));
        let (action, reason) = match watts {
            Some(w) => (
                Action::Cap {
                    watts: w as f64 / 10.0,
                },
                reason,
            ),
            None => (
                Action::Uncap,
                if reason.is_empty() {
                    "no rule wants a cap any more".to_string()
                } else {
                    reason
                },
            ),
        };
        out.push(Decision {
            time: now,
            rule,
            target: Target::Gpus {
                entity: EntityId::rack(&rack),
                gpus,
            },
            action,
            values,
            reason,
            observe_only,
            release: String::new(),
        });
    }
}

#[allow(clippy::too_many_arguments)]
fn hold_decisions(
    jobs: &[Job],
    prior: &BTreeMap<String, Hold>,
    verdicts: BTreeMap<String, Verdict>,
    values: &BTreeMap<String, f64>,
    observe_only: bool,
    now: Timestamp,
    holds: &mut BTreeMap<String, Hold>,
    out: &mut Vec<Decision>,
) {
    for (job, v) in verdicts {
        match v {
            Verdict::Hold(h) => {
                if !prior.contains_key(&job) {
                    out.push(Decision {
                        time: now,
                        rule: h.rule.clone(),
                        target: Target::Job { job: job.clone() },
                        action: Action::Hold {
                            until: h.lease_until,
                        },
                        values: values.clone(),
                        reason: h.reason.clone(),
                        observe_only,
                        release: String::new(),
                    });
                }
                holds.insert(job, h);
            }
            Verdict::Release { reason } => {
                out.push(release(&job, &reason, values, observe_only, now))
            }
        }
    }
    for job in prior.keys() {
        if !jobs.iter().any(|j| &j.id == job) {
            out.push(release(
                job,
                "job is no longer known",
                values,
                observe_only,
                now,
            ));
        }
    }
}

fn release(
    job: &str,
    reason: &str,
    values: &BTreeMap<String, f64>,
    observe_only: bool,
    now: Timestamp,
) -> Decision {
    Decision {
        time: now,
        rule: "price.defer".into(),
        target: Target::Job {
            job: job.to_string(),
        },
        action: Action::Release,
        values: values.clone(),
        reason: reason.to_string(),
        observe_only,
        release: String::new(),
    }
}

#[cfg(test)]
mod tests;
