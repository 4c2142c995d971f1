//! The explain: the decisions that say what changed between the state in force and
//! the settled one, grouped by rack, rule and new value, each with the values that
//! triggered it, its reason and what would release it.

use std::borrow::Cow;
use std::collections::BTreeMap;

use telemetry::site::GpuRef;
use telemetry::{EntityId, Timestamp};

use super::settle::Settled;
use crate::budget::ScopeView;
use crate::plan::{Action, Cap, Decision, State, Target};
use crate::rules::Rule;
use crate::rules_eval;
use crate::stage::{Context, Explain, Explained, Wants};

/// Changed GPUs grouped by (rack, rule, new cap in tenths of a watt), with the rack's
/// index.
type Groups<'c> = Vec<((&'c str, &'c str, Option<i64>), usize, Vec<EntityId>)>;

/// The decisions for the caps that changed, enforced then observed.
pub(crate) fn caps(
    cx: &Context<'_>,
    wants: &Wants<'_>,
    settled: &Settled<'_>,
    out: &mut Vec<Decision>,
) {
    let explain = Explainer { cx, wants };
    let gpus = cx.gpus();
    cap_decisions(
        gpus,
        &cx.prior_caps,
        &settled.caps,
        &explain,
        false,
        cx.now,
        out,
    );
    if let Some(observed) = &settled.observed {
        let prior = &settled.prior_observed;
        cap_decisions(gpus, prior, observed, &explain, true, cx.now, out);
    }
}

/// Makes the explanation of a cap decision from what the evaluation recorded.
struct Explainer<'a, 'c> {
    cx: &'a Context<'c>,
    wants: &'a Wants<'a>,
}

impl Explainer<'_, '_> {
    /// Why `rule` caps in rack `rack` (for the facility budget: at the site).
    fn get(&self, rule: &str, rack: usize) -> Option<Explained> {
        let scope = if rule == "budget.facility" || rule == crate::grid::RULE {
            self.cx.site_scope.as_str()
        } else {
            self.cx.rack_scopes[rack].as_str()
        };
        Some(match self.wants.why.get(&(rule, Cow::Borrowed(scope)))? {
            Explain::Made(e) => e.clone(),
            Explain::Rule(r, k) => {
                let w = &self.wants.rules[*r].1.why[*k];
                (
                    w.values(),
                    format!("{}: {}", w.target, w.reason),
                    w.release.to_string(),
                )
            }
            Explain::Budget(set, k) => {
                let v = &self.wants.budget_views[*set][*k];
                (
                    v.values(),
                    budget_reason(v),
                    budget_release(v, &self.cx.policy.budget),
                )
            }
        })
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

/// What would lift a budget cap.
fn budget_release(v: &ScopeView, rule: &crate::policy::BudgetRule) -> String {
    format!(
        "demand under {:.1} kW ({}% of the budget)",
        v.budget_kw * rule.release_ratio,
        (rule.release_ratio * 100.0).round()
    )
}

fn cap_decisions(
    all: &[GpuRef<'_>],
    prior: &[Option<&Cap>],
    next: &[Option<Cap>],
    why: &Explainer<'_, '_>,
    observe_only: bool,
    now: Timestamp,
    out: &mut Vec<Decision>,
) {
    if prior.iter().all(Option::is_none) && next.iter().all(Option::is_none) {
        return;
    }
    for ((rack, rule, watts), rack_index, gpus) in changed_groups(all, prior, next) {
        let (values, reason, release_text) = why
            .get(rule, rack_index)
            .unwrap_or_else(|| (BTreeMap::new(), String::new(), String::new()));
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
            rule: rule.to_string(),
            target: Target::Gpus {
                entity: EntityId::rack(rack),
                gpus,
            },
            release: if matches!(action, Action::Uncap) {
                String::new()
            } else {
                release_text
            },
            action,
            values,
            reason,
            observe_only,
        });
    }
}

/// The GPUs whose cap changed, grouped by rack, rule and new value, in site order.
fn changed_groups<'c>(
    all: &'c [GpuRef<'_>],
    prior: &[Option<&'c Cap>],
    next: &'c [Option<Cap>],
) -> Groups<'c> {
    let mut groups: Groups = Vec::new();
    let mut at: std::collections::HashMap<(&str, &str, Option<i64>), usize> =
        std::collections::HashMap::new();
    // the group of the GPU before (a rack's GPUs come together and mostly share one)
    let mut last: Option<usize> = None;
    for ((g, old), new) in all.iter().zip(prior).zip(next) {
        let (old, new) = (*old, new.as_ref());
        let changed = match (old, new) {
            (None, None) => false,
            (Some(a), Some(b)) => (a.watts - b.watts).abs() >= 0.5,
            _ => true,
        };
        if !changed {
            continue;
        }
        let rule = new.or(old).map_or("", |c| &*c.rule);
        let key = (
            g.rack.id.as_str(),
            rule,
            new.map(|c| (c.watts * 10.0).round() as i64),
        );
        // the same rack (by index: no id compared), rule and value as the GPU before
        let same = |&i: &usize| {
            let ((_, r, w), rack, _) = &groups[i];
            *rack == g.rack_index && *r == rule && *w == key.2
        };
        if let Some(i) = last.filter(same) {
            groups[i].2.push(EntityId::clone(&g.id));
            continue;
        }
        let i = match at.get(&key) {
            Some(&i) => {
                groups[i].2.push(EntityId::clone(&g.id));
                i
            }
            None => {
                at.insert(key, groups.len());
                groups.push((key, g.rack_index, vec![EntityId::clone(&g.id)]));
                groups.len() - 1
            }
        };
        last = Some(i);
    }
    groups
}

/// The decisions for the clock locks that changed, per rack and new value.
pub(crate) fn clocks(
    index: &rules_eval::Index<'_>,
    prior: &State,
    next: &State,
    rules: &[(&Rule, rules_eval::Wants)],
    now: Timestamp,
    out: &mut Vec<Decision>,
) {
    if prior.clocks.is_empty() && next.clocks.is_empty() {
        return;
    }
    // decisions grouped by rack and new value
    let mut groups: BTreeMap<(usize, String, Option<i64>), Vec<EntityId>> = BTreeMap::new();
    for g in &index.gpus {
        let (old, new) = (prior.clocks.get(&g.id), next.clocks.get(&g.id));
        let changed = match (old, new) {
            (None, None) => false,
            (Some(a), Some(b)) => a.mhz != b.mhz,
            _ => true,
        };
        if changed {
            let rule = new.or(old).map(|c| c.rule.clone()).unwrap_or_default();
            groups
                .entry((g.rack_index, rule, new.map(|c| c.mhz.round() as i64)))
                .or_default()
                .push(EntityId::clone(&g.id));
        }
    }
    for ((rack, rule, mhz), gpus) in groups {
        let w = rules
            .iter()
            .find(|(r, _)| r.id() == rule)
            .and_then(|(_, w)| w.why.iter().find(|x| x.racks.contains(&rack)));
        out.push(Decision {
            time: now,
            rule,
            target: Target::Gpus {
                entity: EntityId::rack(&index.site.racks[rack].id),
                gpus,
            },
            action: match mhz {
                Some(m) => Action::LockClocks { mhz: m as f64 },
                None => Action::UnlockClocks,
            },
            values: w.map(|w| w.values()).unwrap_or_default(),
            reason: w.map_or_else(
                || "no rule wants the clocks locked any more".to_string(),
                |w| w.reason.to_string(),
            ),
            release: w.map(|w| w.release.to_string()).unwrap_or_default(),
            observe_only: false,
        });
    }
}
