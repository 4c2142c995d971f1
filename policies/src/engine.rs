//! The engine: runs every controller on the inputs and makes their wants one plan.
//!
//! A pipeline of pure stages: the [controllers](crate::controllers) each want caps,
//! holds and clocks from the same [`Context`]; [`merge`] makes them one want per GPU and
//! one verdict per job (the most protective cap wins); [`settle`] turns the wants into
//! the state in force (clamped, rate limited, with leases); [`explain`] says what
//! changed as decisions; [`jobs`] settles and explains the jobs' holds, suspensions and
//! requeues. Controllers in observe mode run the same way into a separate,
//! never-actuated state.

mod explain;
mod jobs;
mod merge;
mod settle;

use telemetry::Timestamp;

pub use crate::stage::Inputs;

use crate::controllers::CONTROLLERS;
use crate::plan::Plan;
use crate::stage::{Context, Wants};

#[cfg(test)]
use crate::plan::{Action, Cap, Decision, Hold, State};
#[cfg(test)]
use crate::price;
#[cfg(test)]
use crate::Policy;
#[cfg(test)]
use telemetry::EntityId;
#[cfg(test)]
use telemetry::{Job, Site, Snapshot};

/// Evaluates the policy. Pure: the same inputs and `now` give the same plan.
pub fn evaluate(inputs: &Inputs<'_>, now: Timestamp) -> Plan {
    let cx = Context::new(inputs, now);
    let mut wants = Wants::new();
    for controller in CONTROLLERS {
        controller.want(&cx, &mut wants);
    }
    // the jobs' verdicts merged; the jobs whose hold ends may start before the next
    // tick, and what they will draw is wanted now
    let mut verdicts = std::mem::take(&mut wants.verdicts);
    merge::rule_holds(&mut verdicts, &cx.index, cx.prior, &wants.rules, now);
    let starting = merge::starting(&cx, &verdicts);
    for controller in CONTROLLERS {
        controller.want_starting(&cx, &starting, &mut wants);
    }

    let mut next = std::mem::take(&mut wants.next);
    let mut merged = merge::caps(&cx, &wants);
    let settled = settle::caps(&cx, &wants, &mut merged, &mut next);
    settle::clocks(&cx.index, cx.prior, &wants.rules, now, &mut next);

    let mut decisions = Vec::new();
    explain::caps(&cx, &wants, &settled, &mut decisions);
    explain::clocks(
        &cx.index,
        cx.prior,
        &next,
        &wants.rules,
        now,
        &mut decisions,
    );
    next.caps = cx.to_map(settled.caps);
    if let Some(observed) = settled.observed {
        next.observed_caps = cx.to_map(observed);
    }

    jobs::observed_rule_holds(cx.prior, &wants.rules, now, &mut next, &mut decisions);
    jobs::preempt(
        &cx,
        &wants.rules,
        &wants.grid_suspends,
        &mut next,
        &mut decisions,
    );
    let price = wants.price.take();
    let planned_starts = jobs::holds(&cx, price, verdicts, &mut next, &mut decisions);
    Plan {
        state: next,
        decisions,
        planned_starts,
        predictions: std::mem::take(&mut wants.predictions),
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod rules_tests;
