//! The merge: the controllers' wants made into one want per GPU and one verdict per
//! job. For each GPU the lowest cap any controller wants is the one wanted (the most
//! protective cap wins; of equal caps the first offered); a hold by any rule keeps a
//! job held, a `release` rule wins over every hold.

use std::collections::{BTreeMap, BTreeSet};

use telemetry::fasthash::FnvMap;
use telemetry::Timestamp;

use crate::plan::{Hold, State};
use crate::price::Verdict;
use crate::rules::Rule;
use crate::rules_eval;
use crate::stage::{CapWants, Context, Wants};

/// A controller's wanted cap for one GPU, with what to say about it.
#[derive(Debug, Clone)]
pub(crate) struct Want<'r> {
    pub watts: f64,
    pub rule: &'r str,
    pub lease_s: f64,
}

/// The wanted caps by GPU index: those enforced, and those of the controllers in
/// observe mode (empty when none ran).
pub(crate) struct Merged<'r> {
    pub enforce: Vec<Option<Want<'r>>>,
    pub observe: Vec<Option<Want<'r>>>,
}

/// Each GPU's lowest wanted cap, in force and observed.
pub(crate) fn caps<'r>(cx: &'r Context<'_>, wants: &'r Wants<'_>) -> Merged<'r> {
    let n = cx.site.gpu_count();
    let mut enforce: Vec<Option<Want>> = vec![None; n];
    // made on the first controller in observe mode (most policies have none)
    let mut observe: Vec<Option<Want>> = Vec::new();
    for source in &wants.caps {
        let observed = match source {
            CapWants::Budget { observe, .. } | CapWants::Thermal { observe, .. } => *observe,
            CapWants::Rule(k) => wants.rules[*k].0.observe,
            CapWants::Grid { .. } | CapWants::Limits { .. } => false,
        };
        let target = if observed {
            observed_caps(&mut observe, n)
        } else {
            &mut enforce
        };
        offer_all(cx, wants, source, target);
    }
    Merged { enforce, observe }
}

/// Offers one controller's caps.
fn offer_all<'r>(
    cx: &'r Context<'_>,
    wants: &'r Wants<'_>,
    source: &CapWants,
    target: &mut [Option<Want<'r>>],
) {
    let policy = cx.policy;
    match source {
        CapWants::Budget { caps, .. } => {
            for (i, w) in caps.iter().enumerate() {
                if let Some(w) = w {
                    offer(target, i, w.watts, w.rule, policy.budget.lease_s);
                }
            }
        }
        CapWants::Thermal { fractions, .. } => {
            let Some(fraction) = fractions else { return };
            for (i, g) in cx.gpus().iter().enumerate() {
                if let Some(f) = fraction[g.rack_index] {
                    offer(
                        target,
                        i,
                        g.model.default_w * f,
                        "thermal.inlet",
                        policy.thermal.lease_s,
                    );
                }
            }
        }
        CapWants::Rule(k) => {
            let (rule, w) = &wants.rules[*k];
            let id = cx.rule_ids[*k].as_str();
            for &(g, watts) in &w.caps {
                offer(target, g, watts, id, rule.lease_s);
            }
        }
        CapWants::Grid { caps } => {
            for (i, w) in caps.iter().enumerate() {
                if let Some(w) = w {
                    offer(target, i, *w, crate::grid::RULE, policy.grid.lease_s);
                }
            }
        }
        CapWants::Limits { caps } => {
            for (i, w) in caps.iter().enumerate() {
                if let Some(w) = w {
                    offer(
                        target,
                        i,
                        *w,
                        crate::controllers::limits::RULE,
                        policy.limits.lease_s,
                    );
                }
            }
        }
    }
}

/// The wanted caps of the controllers in observe mode, made for `n` GPUs on first use.
pub(crate) fn observed_caps<'a, 'r>(
    v: &'a mut Vec<Option<Want<'r>>>,
    n: usize,
) -> &'a mut [Option<Want<'r>>] {
    if v.len() != n {
        v.resize(n, None);
    }
    v
}

fn offer<'r>(map: &mut [Option<Want<'r>>], gpu: usize, watts: f64, rule: &'r str, lease_s: f64) {
    let slot = &mut map[gpu];
    match slot {
        Some(w) if w.watts <= watts => {}
        _ => {
            *slot = Some(Want {
                watts,
                rule,
                lease_s,
            })
        }
    }
}

/// The jobs whose hold ends this tick (an observe-only price rule keeps none): they may
/// start before the next one, so their power is reserved now (the feed-forward).
pub(crate) fn starting(cx: &Context<'_>, verdicts: &BTreeMap<String, Verdict>) -> BTreeSet<String> {
    let price = &cx.policy.price;
    let keeps_holds = !(price.enabled && price.observe);
    cx.prior
        .holds
        .keys()
        .filter(|j| !(keeps_holds && matches!(verdicts.get(*j), Some(Verdict::Hold(_)))))
        .cloned()
        .collect()
}

/// Holds and releases wanted by rules, merged into the price rule's verdicts: a hold by
/// any rule keeps a job held; a `release` rule wins over every hold (it protects
/// something the SREs chose: a deadline, a class); holds placed by a rule that no
/// longer wants them are released.
pub(crate) fn rule_holds(
    verdicts: &mut BTreeMap<String, Verdict>,
    index: &rules_eval::Index<'_>,
    prior: &State,
    rules: &[(&Rule, rules_eval::Wants)],
    now: Timestamp,
) {
    // each job's first holding and first releasing rule (every job is merged on its
    // own: the order the jobs are visited in makes no difference)
    let mut held: FnvMap<&str, (&Rule, Timestamp)> = FnvMap::default();
    let mut exempt: FnvMap<&str, &Rule> = FnvMap::default();
    for (rule, w) in rules.iter().filter(|(r, _)| !r.observe) {
        for (job, until) in &w.holds {
            held.entry(job.as_str()).or_insert((rule, *until));
        }
        for job in &w.releases {
            exempt.entry(job.as_str()).or_insert(rule);
        }
    }
    hold_held(verdicts, prior, rules, held, &exempt, now);
    release_exempt(verdicts, prior, exempt);
    release_unwanted(verdicts, index, prior);
}

/// The jobs rules hold, where no rule releases them and the price rule does not hold
/// them already.
fn hold_held(
    verdicts: &mut BTreeMap<String, Verdict>,
    prior: &State,
    rules: &[(&Rule, rules_eval::Wants)],
    held: FnvMap<&str, (&Rule, Timestamp)>,
    exempt: &FnvMap<&str, &Rule>,
    now: Timestamp,
) {
    // the rules' reasons, made when a rule's hold is the one kept
    let mut reasons: Option<FnvMap<(&str, &str), &str>> = None;
    for (job, (rule, until)) in held {
        if exempt.contains_key(job) {
            continue;
        }
        if let Some(Verdict::Hold(_)) = verdicts.get(job) {
            continue;
        }
        let since = prior.holds.get(job).map_or(now, |h| h.since);
        let reasons = reasons.get_or_insert_with(|| {
            rules
                .iter()
                .flat_map(|(r, w)| {
                    w.why.iter().filter_map(move |x| {
                        x.target
                            .strip_prefix("job/")
                            .map(|j| ((r.name.as_str(), j), &*x.reason))
                    })
                })
                .collect()
        });
        let reason = reasons
            .get(&(rule.name.as_str(), job))
            .map_or_else(|| rule.id(), |r| r.to_string());
        verdicts.insert(
            job.to_string(),
            Verdict::Hold(Hold {
                rule: rule.id(),
                since,
                lease_until: until,
                reason,
            }),
        );
    }
}

/// The jobs a `release` rule exempts: released where held before, else not held.
fn release_exempt(
    verdicts: &mut BTreeMap<String, Verdict>,
    prior: &State,
    exempt: FnvMap<&str, &Rule>,
) {
    for (job, rule) in exempt {
        let was_held = prior.holds.contains_key(job);
        match verdicts.get(job) {
            Some(Verdict::Hold(_)) | None if was_held => {
                verdicts.insert(
                    job.to_string(),
                    Verdict::Release {
                        reason: format!("released by rule {}", rule.name),
                    },
                );
            }
            Some(Verdict::Hold(_)) => {
                verdicts.remove(job);
            }
            _ => {}
        }
    }
}

/// The holds of rules that no longer want them.
fn release_unwanted(
    verdicts: &mut BTreeMap<String, Verdict>,
    index: &rules_eval::Index<'_>,
    prior: &State,
) {
    for (job, h) in &prior.holds {
        if h.rule.starts_with("rules.") && !verdicts.contains_key(job) {
            let still = index.job_position(job).is_some();
            verdicts.insert(
                job.clone(),
                Verdict::Release {
                    reason: if still {
                        format!("{} no longer holds it", h.rule)
                    } else {
                        "job is no longer known".into()
                    },
                },
            );
        }
    }
}
