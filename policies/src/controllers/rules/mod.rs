//! The SREs' `[[rules]]` as a controller of the engine: an adapter that runs each
//! enabled rule through [`crate::rules_eval::run`] and keeps its wants (caps, holds,
//! releases, clocks, requeues, suspensions), its memory and what explains it per rack.

use std::borrow::Cow;
use std::collections::BTreeSet;

use crate::plan::RuleMemories;
use crate::rules_eval;
use crate::stage::{CapWants, Context, Controller, Explain, Wants};

/// The `[[rules]]` controller.
pub(crate) struct Rules;

impl Controller for Rules {
    fn want<'c>(&self, cx: &'c Context<'_>, wants: &mut Wants<'c>) {
        let empty = RuleMemories::new();
        for (rule, id) in cx.rules.iter().copied().zip(&cx.rule_ids) {
            let memory = cx.prior.rules.get(&rule.name).unwrap_or(&empty);
            let (w, mem) = rules_eval::run(
                rule,
                &cx.index,
                cx.snapshot,
                cx.forecast,
                cx.jobs,
                memory,
                cx.policy.price.margin_s,
                cx.policy.price.max_defer_s,
                cx.now,
            );
            if !mem.is_empty() {
                wants.next.rules.insert(rule.name.clone(), mem);
            }
            let k = wants.rules.len();
            wants.caps.push(CapWants::Rule(k));
            let mut seen_racks: BTreeSet<usize> = BTreeSet::new();
            for (e, x) in w.why.iter().enumerate() {
                for &r in &x.racks {
                    // the first explanation of the rule in a rack is the one kept
                    if !seen_racks.insert(r) {
                        continue;
                    }
                    let key = (id.as_str(), Cow::Borrowed(cx.rack_scopes[r].as_str()));
                    wants.why.entry(key).or_insert(Explain::Rule(k, e));
                }
            }
            wants.rules.push((rule, w));
        }
    }
}
