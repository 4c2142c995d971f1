//! The settle: the merged wants made into the state in force. Caps are clamped into
//! each GPU's constraints, fall at once and rise at most `raise_w_per_min`; rises under
//! `deadband_w` are not made. Clock locks take the lowest clock any rule wants.

use std::collections::BTreeMap;
use std::sync::Arc;

use telemetry::site::GpuRef;
use telemetry::{EntityId, Timestamp};

use super::merge::{Merged, Want};
use crate::plan::{Cap, ClockLock, State};
use crate::rules::Rule;
use crate::rules_eval;
use crate::stage::{Context, Wants};
use crate::Policy;

/// The caps in force after the tick, by GPU index, and the observed ones where any
/// controller observes or any observed cap was in force.
pub(crate) struct Settled<'p> {
    pub caps: Vec<Option<Cap>>,
    pub prior_observed: Vec<Option<&'p Cap>>,
    pub observed: Option<Vec<Option<Cap>>>,
}

/// Settles the merged caps; the budget remembers what the GPUs it capped drew before.
pub(crate) fn caps<'p>(
    cx: &'p Context<'_>,
    wants: &Wants<'_>,
    merged: &mut Merged<'_>,
    next: &mut State,
) -> Settled<'p> {
    let (gpus, policy, now) = (cx.gpus(), cx.policy, cx.now);
    let caps = settle(gpus, &cx.prior_caps, &merged.enforce, policy, now);
    if let Some(budget) = &wants.budget {
        let draws = budget.remember_uncapped(cx, &caps);
        next.uncapped_draws = cx.to_map(draws);
    }
    let prior_observed = cx.by_index(&cx.prior.observed_caps);
    // with no observed cap wanted or in force there are none after
    let observed =
        (!merged.observe.is_empty() || prior_observed.iter().any(Option::is_some)).then(|| {
            let n = cx.site.gpu_count();
            let wanted = super::merge::observed_caps(&mut merged.observe, n);
            settle(gpus, &prior_observed, wanted, policy, now)
        });
    Settled {
        caps,
        prior_observed,
        observed,
    }
}

/// Turns wanted caps into caps in force: clamped, rate limited, with leases.
fn settle(
    gpus: &[GpuRef<'_>],
    prior: &[Option<&Cap>],
    wants: &[Option<Want<'_>>],
    policy: &Policy,
    now: Timestamp,
) -> Vec<Option<Cap>> {
    let mut out = Vec::with_capacity(gpus.len());
    let mut names = Names::default();
    for ((g, want), old) in gpus.iter().zip(wants).zip(prior) {
        out.push(settle_one(g, *old, want.as_ref(), policy, now, &mut names));
    }
    out
}

/// One GPU's cap in force.
fn settle_one(
    g: &GpuRef<'_>,
    old: Option<&Cap>,
    want: Option<&Want<'_>>,
    policy: &Policy,
    now: Timestamp,
    names: &mut Names,
) -> Option<Cap> {
    let b = &policy.budget;
    let model = g.model;
    let current = old.map_or(model.default_w, |c| c.watts);
    let target = model.clamp_limit(want.map_or(model.default_w, |w| w.watts));
    let lease_s = want.map_or(b.lease_s, |w| w.lease_s);
    let rule: &str = want
        .map(|w| w.rule)
        .or_else(|| old.map(|c| &*c.rule))
        .unwrap_or_default();
    // the rule's name, shared: the old cap's where it is the same rule's
    let mut name = || match old {
        Some(c) if *c.rule == *rule => c.rule.clone(),
        _ => names.get(rule),
    };
    let keep = |c: &Cap, rule: Arc<str>| Cap {
        watts: c.watts,
        rule,
        since: c.since,
        lease_until: now + lease_s,
    };
    // a cap falls whenever a rule wants it lower (a budget must not be exceeded by
    // a deadband); only rises smaller than the deadband are skipped
    if target < current - 0.5 {
        Some(Cap {
            watts: target,
            rule: name(),
            since: now,
            lease_until: now + lease_s,
        })
    } else if target <= current {
        old.map(|c| keep(c, name()))
    } else {
        // rising: no faster than the rate limit allows since the last change
        let since = old.map_or(now, |c| c.since);
        let allowed = current + b.raise_w_per_min * now.secs_since(since).max(0.0) / 60.0;
        let new = target.min(allowed);
        if new >= model.default_w - 0.5 {
            None
        } else if new - current < b.deadband_w {
            old.map(|c| keep(c, name()))
        } else {
            Some(Cap {
                watts: model.clamp_limit(new),
                rule: name(),
                since: now,
                lease_until: now + lease_s,
            })
        }
    }
}

/// Rule names made once per tick and shared by the caps of each rule.
#[derive(Default)]
struct Names(Vec<Arc<str>>);

impl Names {
    fn get(&mut self, name: &str) -> Arc<str> {
        match self.0.iter().find(|n| ***n == *name) {
            Some(n) => n.clone(),
            None => {
                let n: Arc<str> = Arc::from(name);
                self.0.push(n.clone());
                n
            }
        }
    }
}

/// Clock locks wanted by rules: the lowest clock wins, each with the rule's lease.
pub(crate) fn clocks(
    index: &rules_eval::Index<'_>,
    prior: &State,
    rules: &[(&Rule, rules_eval::Wants)],
    now: Timestamp,
    next: &mut State,
) {
    let mut want: BTreeMap<usize, (f64, &Rule)> = BTreeMap::new();
    for (rule, w) in rules.iter().filter(|(r, _)| !r.observe) {
        for &(g, mhz) in &w.clocks {
            match want.get(&g) {
                Some((m, _)) if *m <= mhz => {}
                _ => {
                    want.insert(g, (mhz, rule));
                }
            }
        }
    }
    for (g, (mhz, rule)) in &want {
        let id = EntityId::clone(&index.gpus[*g].id);
        let since = prior
            .clocks
            .get(&id)
            .filter(|c| c.mhz == *mhz)
            .map_or(now, |c| c.since);
        next.clocks.insert(
            id,
            ClockLock {
                mhz: *mhz,
                rule: rule.id(),
                since,
                lease_until: now + rule.lease_s,
            },
        );
    }
}
