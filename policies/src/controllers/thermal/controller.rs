//! The thermal rule as a controller of the engine: each rack's level (a fraction of its
//! GPUs' default limit) from the reactive steps or the predictive model, the fitted
//! models and predictions it keeps, and what explains each rack's step.

use std::borrow::Cow;

use telemetry::EntityId;

use crate::policy::ThermalMode;
use crate::stage::{CapWants, Context, Controller, Explain, Wants};

/// The `[thermal]` controller.
pub(crate) struct Thermal;

impl Controller for Thermal {
    fn want<'c>(&self, cx: &'c Context<'_>, wants: &mut Wants<'c>) {
        let rule = &cx.policy.thermal;
        if !rule.enabled {
            return;
        }
        let (levels, steps) = match rule.mode {
            ThermalMode::Reactive => super::evaluate(cx.site, cx.snapshot, cx.prior, rule, cx.now),
            ThermalMode::Predictive => {
                let o = super::predictive::evaluate(
                    cx.site,
                    &cx.index,
                    cx.snapshot,
                    cx.jobs,
                    cx.prior,
                    &cx.prior_caps,
                    rule,
                    cx.policy.price.margin_s,
                    cx.now,
                );
                wants.next.thermal_models = o.fits;
                wants.predictions = o.predictions;
                (o.levels, o.steps)
            }
        };
        // each rack's level looked up once, not once per GPU
        let fractions = (!levels.is_empty()).then(|| {
            cx.site
                .racks
                .iter()
                .map(|r| levels.get(&r.id).map(|l| l.fraction))
                .collect()
        });
        wants.caps.push(CapWants::Thermal {
            fractions,
            observe: rule.observe,
        });
        for s in steps {
            let scope = match cx.site.rack_index(&s.rack) {
                Some(r) => Cow::Borrowed(cx.rack_scopes[r].as_str()),
                None => Cow::Owned(EntityId::rack(&s.rack).to_string()),
            };
            wants.why.insert(
                ("thermal.inlet", scope),
                Explain::Made((s.values, s.reason, s.release)),
            );
        }
        wants.next.thermal = levels;
    }
}
