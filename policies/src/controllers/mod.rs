//! The controllers: each turns the same inputs into what it wants (caps, holds, clocks,
//! node power states); the engine merges, settles and explains their wants.
//!
//! # Layout
//!
//! - [`budget`]: facility and rack power budgets, cut by water-filling in priority order.
//! - [`thermal`]: rack inlet temperature against its limit, stepped with hysteresis (the
//!   reactive mode), or kept under it by a fitted model ([`thermal::model`],
//!   [`thermal::predictive`], the default mode).
//! - [`price`]: deferral of deferrable jobs while electricity is expensive, never past
//!   their latest start; [`price::planner`] places them in the cheapest slots.
//! - [`rules`]: the SREs' `[[rules]]`, run by [`crate::rules_eval`].
//! - [`node_power`]: which idle nodes to power down and which to bring back; it runs on
//!   the plan and the nodes' power states at the edge ([`node_power::decide`]), not in
//!   [`crate::evaluate`].
//!
//! [`CONTROLLERS`] lists the controllers [`crate::evaluate`] runs, in order: adding one is
//! a folder here and a line there.

pub mod budget;
pub mod node_power;
pub mod price;
pub mod rules;
pub mod thermal;

use std::collections::BTreeSet;

use crate::engine::{Context, Wants};

/// A controller of the engine: what it wants, from the evaluation's inputs and what
/// the controllers before it wanted. Pure: it reads [`Context`] and writes only its own
/// part of [`Wants`].
pub(crate) trait Controller: Sync {
    /// Adds this controller's wants.
    fn want<'c>(&self, cx: &'c Context<'_>, wants: &mut Wants<'c>);

    /// Adds what it wants once the jobs that may start this tick are known (their holds
    /// end): the feed-forward. Most controllers want nothing more.
    fn want_starting<'c>(
        &self,
        _cx: &'c Context<'_>,
        _starting: &BTreeSet<String>,
        _wants: &mut Wants<'c>,
    ) {
    }
}

/// The controllers, in the order they run: a controller sees the wants of those before
/// it (the price rule paces its releases by the budget's headroom).
pub(crate) const CONTROLLERS: &[&dyn Controller] = &[
    &budget::Budget,
    &thermal::Thermal,
    &rules::Rules,
    &price::Price,
];
