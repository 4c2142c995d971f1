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
//! - [`grid`]: a grid event's target at the meter, met by value (holds, caps to each
//!   class's floor, suspensions of preemptible jobs), then a rebound limit.
//! - [`limits`]: GPU power limits of running jobs, their own or their class's.
//! - [`node_power`]: which idle nodes to power down and which to bring back; it runs on
//!   the plan and the nodes' power states at the edge ([`node_power::decide`]), not in
//!   [`crate::evaluate`].
//!
//! Each controller is an adapter (`controller.rs` in its folder) from the `Context` the
//! engine makes to its pure model, writing `Wants`; both types and the `Controller`
//! trait live in `crate::stage`, below the engine and the controllers. [`CONTROLLERS`]
//! lists the controllers [`crate::evaluate`] runs, in order: adding one is a folder here
//! and a line there.

pub mod budget;
pub mod grid;
pub mod limits;
pub mod node_power;
pub mod price;
pub mod rules;
pub mod thermal;

use crate::stage::Controller;

/// The controllers, in the order they run: a controller sees the wants of those before
/// it (the price rule paces its releases by the budget's headroom).
pub(crate) const CONTROLLERS: &[&dyn Controller] = &[
    &budget::controller::Budget,
    &thermal::controller::Thermal,
    &rules::Rules,
    &price::controller::Price,
    &grid::controller::Grid,
    &limits::controller::Limits,
];
