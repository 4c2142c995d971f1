//! The price rule as a controller of the engine: its verdict on each job (hold or
//! release), paced by the budget's headroom, with the values it looked at and the
//! planned start of each job it holds; when it is off, its holds are released.

use std::collections::BTreeMap;

use super::Verdict;
use crate::budget;
use crate::stage::{Context, Controller, Wants};

/// The `[price]` controller.
pub(crate) struct Price;

impl Controller for Price {
    fn want<'c>(&self, cx: &'c Context<'_>, wants: &mut Wants<'c>) {
        let rule = &cx.policy.price;
        if !rule.enabled {
            let mut verdicts = BTreeMap::new();
            // the grid controller's holds are its own to release
            for (job, _) in cx
                .prior
                .holds
                .iter()
                .filter(|(_, h)| h.rule != crate::grid::RULE)
            {
                verdicts.insert(
                    job.clone(),
                    Verdict::Release {
                        reason: "price rule disabled".into(),
                    },
                );
            }
            wants.verdicts = verdicts;
            return;
        }
        let (verdicts, values, starts) = super::evaluate_with_starts(
            cx.site,
            budget::facility_budget_kw(cx.site, &cx.policy.budget),
            cx.snapshot,
            cx.jobs,
            &cx.index.allocations(cx.jobs),
            cx.prior,
            rule,
            wants.pacing,
            cx.forecast,
            cx.now,
        );
        wants.verdicts = verdicts;
        wants.price = Some((values, starts));
    }
}
