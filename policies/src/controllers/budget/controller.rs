//! The budget as a controller of the engine: its caps (once before the price rule, and
//! again with the jobs whose hold ends this tick reserved: the feed-forward), the
//! facility's headroom for pacing the price rule's releases, and what explains each
//! scope's caps.

use std::borrow::Cow;
use std::collections::BTreeSet;

use telemetry::site::GpuRef;
use telemetry::EntityKind;

use super::Prepared;
use crate::plan::{Cap, UncappedDraw};
use crate::stage::{
    BudgetCap, BudgetTick, CapWants, Context, Controller, Explain, Pacing, ScopeView, Wants, Why,
};

/// The `[budget]` controller.
pub(crate) struct Budget;

impl Controller for Budget {
    fn want<'c>(&self, cx: &'c Context<'_>, wants: &mut Wants<'c>) {
        let rule = &cx.policy.budget;
        if !rule.enabled {
            return;
        }
        let remembered = cx.by_index(&cx.prior.uncapped_draws);
        let prepared = super::prepare(cx.site, &cx.index, cx.jobs, remembered, rule, cx.now);
        let (wanted, views) = prepared.evaluate(cx, &BTreeSet::new());
        wants.pacing = views.last().map(|facility| Pacing {
            // release into half the room per tick: the rest is for what starts meanwhile
            headroom_w: 0.5
                * (facility.budget_kw * (1.0 - rule.margin) - facility.demand_kw)
                * 1000.0,
            watts_per_gpu: typical_gpu_w(cx.gpus()),
            demand_w: facility.demand_kw * 1000.0,
        });
        record(cx, wanted, views, wants);
        wants.budget = Some(Box::new(prepared));
    }

    fn want_starting<'c>(
        &self,
        cx: &'c Context<'_>,
        starting: &BTreeSet<String>,
        wants: &mut Wants<'c>,
    ) {
        let Some(prepared) = wants.budget.as_ref().filter(|_| !starting.is_empty()) else {
            return;
        };
        let (wanted, views) = prepared.evaluate(cx, starting);
        record(cx, wanted, views, wants);
    }
}

impl BudgetTick for Prepared<'_> {
    fn evaluate(
        &self,
        cx: &Context<'_>,
        starting: &BTreeSet<String>,
    ) -> (Vec<Option<BudgetCap>>, Vec<ScopeView>) {
        super::evaluate(
            cx.site,
            &cx.index,
            self,
            cx.snapshot,
            &cx.prior_caps,
            cx.jobs,
            cx.prior,
            &cx.policy.budget,
            starting,
            cx.now,
        )
    }

    fn remember_uncapped(
        &self,
        cx: &Context<'_>,
        caps: &[Option<Cap>],
    ) -> Vec<Option<UncappedDraw>> {
        super::remember_uncapped(&cx.index, self, cx.jobs, &cx.prior_caps, caps, cx.now)
    }
}

/// Keeps a budget evaluation's caps (to the enforced or the observed caps) and what
/// each scope looked like, with the evaluation's number (see [`Explain::Budget`]).
fn record<'c>(
    cx: &'c Context<'_>,
    wanted: Vec<Option<BudgetCap>>,
    views: Vec<ScopeView>,
    wants: &mut Wants<'c>,
) {
    wants.caps.push(CapWants::Budget {
        caps: wanted,
        observe: cx.policy.budget.observe,
    });
    explain(
        &cx.rack_scopes,
        (wants.budget_views.len(), &views),
        &mut wants.why,
    );
    wants.budget_views.push(views);
}

/// Records which scope explains the caps of each budget rule in each rack.
fn explain<'k>(rack_scopes: &'k [String], (set, views): (usize, &[ScopeView]), why: &mut Why<'k>) {
    // the racks each rule grouped by rack has explained in this call, a bit per rule: a
    // rack under many scopes of a kind (its branches, say) keeps the first one's, so
    // the others need no search of `why`
    let mut seen = vec![0u8; rack_scopes.len()];
    // (key, explanation, whether it replaces one already there)
    let mut made = Vec::new();
    for (k, v) in views.iter().enumerate() {
        let (rule, bit) = rule_of(v.scope.kind);
        if rule == "budget.facility" || rule == "budget.rack" {
            // a rack's scope name is made once per evaluation
            let name = match v.racks[..] {
                [r] if rule == "budget.rack"
                    && rack_scopes[r].strip_prefix("rack/") == Some(v.scope.name.as_str()) =>
                {
                    Cow::Borrowed(rack_scopes[r].as_str())
                }
                _ => Cow::Owned(v.scope.to_string()),
            };
            made.push(((rule, name), Explain::Budget(set, k), true));
        } else {
            // cap decisions are grouped by rack: explain each rack by its scope
            for &r in &v.racks {
                if seen[r] & bit != 0 {
                    continue;
                }
                seen[r] |= bit;
                made.push((
                    (rule, Cow::Borrowed(rack_scopes[r].as_str())),
                    Explain::Budget(set, k),
                    false,
                ));
            }
        }
    }
    if why.is_empty() {
        // made in one go (a key made twice keeps the last, as `insert` does; those that
        // do not replace are made once each)
        *why = made.into_iter().map(|(key, e, _)| (key, e)).collect();
    } else {
        for (key, e, replace) in made {
            if replace {
                why.insert(key, e);
            } else {
                why.entry(key).or_insert(e);
            }
        }
    }
}

/// The budget rule that caps for a scope of this kind, and its bit among the kinds
/// grouped by rack.
fn rule_of(kind: EntityKind) -> (&'static str, u8) {
    match kind {
        EntityKind::Site => ("budget.facility", 0),
        EntityKind::Rack => ("budget.rack", 0),
        EntityKind::Branch => ("budget.branch", 1),
        EntityKind::Pdu => ("budget.pdu", 2),
        EntityKind::Row => ("budget.row", 4),
        EntityKind::Room => ("budget.room", 8),
        _ => ("budget.feed", 16),
    }
}

/// What a busy GPU of this site may draw, for pacing releases: its default limit plus
/// its share of its node's base power (the worst case, so releases never overshoot).
pub(crate) fn typical_gpu_w(gpus: &[GpuRef<'_>]) -> f64 {
    gpus.iter()
        .map(|g| g.model.default_w + g.node.base_w / f64::from(g.node.gpus.max(1)))
        .sum::<f64>()
        / gpus.len().max(1) as f64
}
