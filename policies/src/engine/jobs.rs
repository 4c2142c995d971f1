//! The jobs' actions: holds, suspensions and requeues, settled and explained in one walk
//! each (whether a job's decision is made depends on whether an earlier rule took the
//! job already). They run after the caps' decisions, in this order: the observed rule
//! holds, the rules' preemptions, the holds in force.

use std::collections::BTreeMap;

use telemetry::{Job, Timestamp};

use crate::plan::{Action, Decision, Hold, State, Target};
use crate::price::{PlannedStarts, Verdict};
use crate::rules::Rule;
use crate::rules_eval;
use crate::stage::Context;

/// What job rules in observe mode would hold: kept in `observed_holds` (never acted
/// on) with observe-only decisions when they start and end.
pub(crate) fn observed_rule_holds(
    prior: &State,
    rules: &[(&Rule, rules_eval::Wants)],
    now: Timestamp,
    next: &mut State,
    out: &mut Vec<Decision>,
) {
    for (rule, w) in rules.iter().filter(|(r, _)| r.observe) {
        for (job, until) in &w.holds {
            if next.observed_holds.contains_key(job) {
                continue;
            }
            let why = w
                .why
                .iter()
                .find(|x| x.target.strip_prefix("job/") == Some(job));
            let reason = why.map_or_else(|| rule.id(), |x| x.reason.to_string());
            let since = match prior.observed_holds.get(job) {
                Some(h) => h.since,
                None => {
                    out.push(Decision {
                        time: now,
                        rule: rule.id(),
                        target: Target::Job { job: job.clone() },
                        action: Action::Hold { until: *until },
                        values: why.map(|x| x.values()).unwrap_or_default(),
                        reason: reason.clone(),
                        release: why.map(|x| x.release.to_string()).unwrap_or_default(),
                        observe_only: true,
                    });
                    now
                }
            };
            next.observed_holds.insert(
                job.clone(),
                Hold {
                    rule: rule.id(),
                    since,
                    lease_until: *until,
                    reason,
                },
            );
        }
    }
    for (job, h) in &prior.observed_holds {
        if h.rule.starts_with("rules.") && !next.observed_holds.contains_key(job) {
            out.push(Decision {
                time: now,
                rule: h.rule.clone(),
                target: Target::Job { job: job.clone() },
                action: Action::Release,
                values: BTreeMap::new(),
                reason: format!("{} no longer holds it", h.rule),
                release: String::new(),
                observe_only: true,
            });
        }
    }
}

/// Requeues and suspensions of preemptible jobs wanted by rules; a suspension ends when
/// no rule wants it (resume) or, for an agentless controller, when its lease runs out.
pub(crate) fn preempt(
    cx: &Context<'_>,
    rules: &[(&Rule, rules_eval::Wants)],
    grid: &[(String, Timestamp)],
    next: &mut State,
    out: &mut Vec<Decision>,
) {
    let (jobs, prior, now) = (cx.jobs, cx.prior, cx.now);
    let why = |rule: &Rule, w: &rules_eval::Wants, job: &str| {
        w.why
            .iter()
            .find(|x| x.target.strip_prefix("job/") == Some(job))
            .map_or_else(
                || (BTreeMap::new(), rule.id(), String::new()),
                |x| (x.values(), x.reason.to_string(), x.release.to_string()),
            )
    };
    for (rule, w) in rules {
        for job in &w.requeues {
            let (values, reason, _) = why(rule, w, job);
            out.push(Decision {
                time: now,
                rule: rule.id(),
                target: Target::Job { job: job.clone() },
                action: Action::Requeue,
                values,
                reason,
                release: String::new(),
                observe_only: rule.observe,
            });
        }
        if rule.observe {
            continue;
        }
        for (job, until) in &w.suspends {
            if next.suspended.contains_key(job) {
                continue;
            }
            let (values, reason, release) = why(rule, w, job);
            let since = prior.suspended.get(job).map_or(now, |h| h.since);
            if !prior.suspended.contains_key(job) {
                out.push(Decision {
                    time: now,
                    rule: rule.id(),
                    target: Target::Job { job: job.clone() },
                    action: Action::Suspend { until: *until },
                    values,
                    reason: reason.clone(),
                    release,
                    observe_only: false,
                });
            }
            next.suspended.insert(
                job.clone(),
                Hold {
                    rule: rule.id(),
                    since,
                    lease_until: *until,
                    reason,
                },
            );
        }
    }
    grid_suspensions(cx, grid, next, out);
    resumes(jobs, prior, next, now, out);
}

/// The grid controller's suspensions (see [`crate::grid`]), explained by the event.
fn grid_suspensions(
    cx: &Context<'_>,
    grid: &[(String, Timestamp)],
    next: &mut State,
    out: &mut Vec<Decision>,
) {
    let rule = crate::grid::RULE;
    let (values, reason) = match next.grid.as_ref() {
        Some(m) => {
            let mut v = BTreeMap::new();
            v.insert(
                "target_kw".to_string(),
                crate::plan::round3(m.target_w / 1000.0),
            );
            v.insert(
                "meter_kw".to_string(),
                crate::plan::round3(m.meter_w / 1000.0),
            );
            v.insert(
                "floor_kw".to_string(),
                crate::plan::round3(m.floor_w / 1000.0),
            );
            (
                v,
                format!(
                    "grid event: caps at every flexible job's floor leave the meter over its target {:.1} kW",
                    m.target_w / 1000.0
                ),
            )
        }
        None => (BTreeMap::new(), "grid event".to_string()),
    };
    for (job, until) in grid {
        if next.suspended.contains_key(job) {
            continue;
        }
        let since = cx.prior.suspended.get(job).map_or(cx.now, |h| h.since);
        if !cx.prior.suspended.contains_key(job) {
            out.push(Decision {
                time: cx.now,
                rule: rule.into(),
                target: Target::Job { job: job.clone() },
                action: Action::Suspend { until: *until },
                values: values.clone(),
                reason: reason.clone(),
                release: "the event's end".into(),
                observe_only: false,
            });
        }
        next.suspended.insert(
            job.clone(),
            Hold {
                rule: rule.into(),
                since,
                lease_until: *until,
                reason: reason.clone(),
            },
        );
    }
}

/// The suspensions no rule wants any more: resumed.
fn resumes(jobs: &[Job], prior: &State, next: &State, now: Timestamp, out: &mut Vec<Decision>) {
    // the jobs not done, listed once if a suspension ends
    let mut live: Option<telemetry::fasthash::FnvSet<&str>> = None;
    for (job, h) in &prior.suspended {
        if next.suspended.contains_key(job) {
            continue;
        }
        let known = live
            .get_or_insert_with(|| {
                jobs.iter()
                    .filter(|j| !j.state.is_done())
                    .map(|j| j.id.as_str())
                    .collect()
            })
            .contains(job.as_str());
        out.push(Decision {
            time: now,
            rule: h.rule.clone(),
            target: Target::Job { job: job.clone() },
            action: Action::Resume,
            values: BTreeMap::new(),
            reason: if known {
                format!("{} no longer wants it suspended", h.rule)
            } else {
                "job is no longer known".into()
            },
            release: String::new(),
            observe_only: false,
        });
    }
}
#[allow(clippy::too_many_arguments)]
pub(crate) fn hold_decisions(
    index: &rules_eval::Index<'_>,
    prior: &BTreeMap<String, Hold>,
    verdicts: BTreeMap<String, Verdict>,
    values: &BTreeMap<String, f64>,
    observe_only: bool,
    now: Timestamp,
    holds: &mut BTreeMap<String, Hold>,
    out: &mut Vec<Decision>,
) {
    // the verdicts and the prior holds are both in job id order: walked side by side
    let mut prior_iter = prior.iter().peekable();
    let mut prior_hold = |job: &str| {
        while prior_iter.next_if(|(k, _)| k.as_str() < job).is_some() {}
        prior_iter
            .peek()
            .filter(|(k, _)| k.as_str() == job)
            .map(|&(_, h)| h)
    };
    // the holds kept, in id order (the map is made from them without a search per job)
    let mut kept: Vec<(String, Hold)> = Vec::new();
    for (job, v) in verdicts {
        let was = prior_hold(&job);
        match v {
            Verdict::Hold(h) => {
                if was.is_none() {
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
                        release: format!(
                            "when {} no longer wants it held; never past the job's latest start (deadline − estimated duration − margin)",
                            h.rule
                        ),
                    });
                }
                kept.push((job, h));
            }
            Verdict::Release { reason } => {
                let mut d = release(&job, &reason, values, observe_only, now);
                if let Some(h) = was {
                    d.rule = h.rule.clone();
                }
                out.push(d)
            }
        }
    }
    let mut kept: BTreeMap<String, Hold> = kept.into_iter().collect();
    holds.append(&mut kept);
    // prior holds of jobs no longer listed (each held id found in the jobs' table)
    for job in prior.keys() {
        if index.job_position(job).is_none() {
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

/// The holds in force after the price rule's and the rules' verdicts, with their
/// decisions; the planned starts of the jobs the plan holds (observe mode holds
/// nothing).
pub(crate) fn holds(
    cx: &Context<'_>,
    price: Option<(BTreeMap<String, f64>, PlannedStarts)>,
    verdicts: BTreeMap<String, Verdict>,
    next: &mut State,
    out: &mut Vec<Decision>,
) -> PlannedStarts {
    let (index, prior, now) = (&cx.index, cx.prior, cx.now);
    let mut planned_starts = PlannedStarts::new();
    if let Some((values, starts)) = price {
        planned_starts = starts;
        let observe_only = cx.policy.price.observe;
        let (prior_holds, holds) = if observe_only {
            (&prior.observed_holds, &mut next.observed_holds)
        } else {
            (&prior.holds, &mut next.holds)
        };
        hold_decisions(
            index,
            prior_holds,
            verdicts,
            &values,
            observe_only,
            now,
            holds,
            out,
        );
    } else {
        hold_decisions(
            index,
            &prior.holds,
            verdicts,
            &BTreeMap::new(),
            false,
            now,
            &mut next.holds,
            out,
        );
    }
    if cx.policy.price.observe {
        planned_starts.clear();
    }
    planned_starts.retain(|job: &String, _| next.holds.contains_key(job));
    planned_starts
}
