//! The limits controller as a controller of the engine.

use std::borrow::Cow;
use std::collections::BTreeMap;

use telemetry::JobState;

use super::RULE;
use crate::stage::{CapWants, Context, Controller, Explain, Wants};

/// The `[limits]` controller.
pub(crate) struct Limits;

impl Controller for Limits {
    fn want<'c>(&self, cx: &'c Context<'_>, wants: &mut Wants<'c>) {
        let rule = &cx.policy.limits;
        if !rule.enabled {
            return;
        }
        let asks = |j: &telemetry::Job| {
            (rule.jobs && j.gpu_power_limit.is_some()) || rule.classes.contains_key(&j.class)
        };
        if !cx
            .jobs
            .iter()
            .any(|j| j.state == JobState::Running && asks(j))
        {
            // nobody asks: the common case, at no cost
            return;
        }
        let table = cx.index.allocations(cx.jobs);
        let gpus = cx.gpus();
        let mut caps: Vec<Option<f64>> = vec![None; gpus.len()];
        let mut racks: BTreeMap<usize, usize> = BTreeMap::new();
        for (p, j) in cx.jobs.iter().enumerate() {
            if j.state != JobState::Running || !asks(j) {
                continue;
            }
            for g in table.of(p) {
                let model = gpus[g].model;
                let Some(w) = rule.limit_w(&j.class, j.gpu_power_limit, model.default_w) else {
                    continue;
                };
                let w = model.clamp_limit(w);
                if caps[g].is_none_or(|c| w < c) {
                    caps[g] = Some(w);
                }
                *racks.entry(gpus[g].rack_index).or_default() += 1;
            }
        }
        for (rack, n) in racks {
            wants.why.insert(
                (RULE, Cow::Borrowed(cx.rack_scopes[rack].as_str())),
                Explain::Made((
                    BTreeMap::from([("gpus".to_string(), n as f64)]),
                    "a running job's GPU power limit (its own, or its class's in [limits])"
                        .to_string(),
                    "the job ends or its limit is lifted".to_string(),
                )),
            );
        }
        wants.caps.push(CapWants::Limits { caps });
    }
}
