//! The policy model and the pure engine: `evaluate(inputs, now) -> Plan`.
//!
//! # Layout
//!
//! - [`policy`]: the policy file (`policy.toml`), parsed and validated with positions.
//! - [`plan`]: what the engine decides: desired caps and holds, each with a lease, and
//!   the [`Decision`]s that changed them, with the values that triggered each one.
//! - [`engine`]: [`evaluate`], which runs the rules below in order and merges them, the
//!   most protective cap winning.
//! - [`budget`]: facility and rack power budgets, cut by water-filling in priority order.
//! - [`thermal`]: rack inlet temperature against its limit, stepped with hysteresis
//!   (the reactive mode).
//! - [`thermal_model`] and [`predictive`]: a fitted first-order model of each rack's
//!   inlet, and caps that keep its predicted peak under the limit (the default mode).
//! - [`index`]: the site seen as scopes, built once per evaluation.
//! - [`forecast`]: price and carbon forecasts and their window statistics.
//! - [`planner`]: when deferrable jobs should start, in the cheapest forecast slots
//!   that have room.
//! - [`node_power`]: which idle nodes to power down and which to bring back before
//!   planned work needs them.
//! - [`triggers`]: the thresholds the policy acts on, for evaluating at once when a
//!   sample crosses one between ticks.
//! - [`price`]: deferral of deferrable jobs while electricity is expensive, never past
//!   their latest start.
//!
//! The engine does no IO: it takes the site, the snapshot, the jobs, the prior state and
//! the time as arguments, so the same code runs live, in tests, in the demo and in
//! backtests, and gives the same plan for the same inputs.
#![forbid(unsafe_code)]

pub mod budget;
pub mod engine;
pub mod expr;
pub mod forecast;
pub mod gpu_map;
pub mod index;
pub mod node_power;
pub mod plan;
pub mod planner;
pub mod policy;
pub mod predictive;
pub mod price;
pub mod rules;
pub mod rules_eval;
pub mod thermal;
pub mod thermal_model;
pub mod triggers;

pub use engine::{evaluate, Inputs};
pub use forecast::{Forecast, StepSeries};
pub use gpu_map::GpuMap;
pub use index::JobTable;
pub use plan::{
    Action, Cap, ClockLock, Decision, Hold, Plan, RackPrediction, RuleMemories, RuleMemory, State,
    Target, Timers, UncappedDraw,
};
pub use policy::Policy;
