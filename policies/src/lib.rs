//! The policy model and the pure engine: `evaluate(inputs, now) -> Plan`.
//!
//! # Layout
//!
//! - [`policy`]: the policy file (`policy.toml`), parsed and validated with positions.
//! - [`plan`]: what the engine decides: desired caps and holds, each with a lease, and
//!   the [`Decision`]s that changed them, with the values that triggered each one.
//! - [`engine`]: [`evaluate`], a pipeline of pure stages, each a module of its own:
//!   1. the [`controllers`] each say what they want from the same context (the policy,
//!      the snapshot, the jobs, the prior state, the time), in the order of
//!      `controllers::CONTROLLERS`: [`budget`], [`thermal`] (reactive, or
//!      [`predictive`] on [`thermal_model`]), the SREs' [`rules`] and [`price`] (with
//!      its [`planner`]); then the feed-forward, what they want once the jobs whose
//!      hold ends this tick are known;
//!   2. `merge`: one wanted cap per GPU (the most protective wins) and one verdict per
//!      job (a hold by any rule holds, a `release` rule wins over every hold);
//!   3. `settle`: the caps and clock locks in force (clamped, rate limited, leased);
//!   4. `explain`: the decisions for what changed, grouped by rack, rule and value,
//!      then the jobs' holds, suspensions and requeues (`jobs`).
//!
//!   Adding a controller is a folder under `controllers/` and a line in
//!   `CONTROLLERS`. What the engine and the controllers share (the inputs, the
//!   `Context`, the `Wants`, the `Controller` trait) is the `stage` module, below both.
//! - [`node_power`]: which idle nodes to power down and which to bring back before
//!   planned work needs them; run at the edge on the plan and the nodes' states.
//! - [`rules_eval`] and [`expr`]: the rules' language, run by the rules controller.
//! - [`index`]: the site seen as scopes, built once per evaluation.
//! - [`forecast`]: price and carbon forecasts and their window statistics.
//! - [`gpu_map`]: per-GPU state laid out by the site's GPU table.
//! - [`triggers`]: the thresholds the policy acts on, for evaluating at once when a
//!   sample crosses one between ticks.
//!
//! The engine does no IO: it takes the site, the snapshot, the jobs, the prior state and
//! the time as arguments, so the same code runs live, in tests, in the demo and in
//! backtests, and gives the same plan for the same inputs.
#![forbid(unsafe_code)]

pub mod controllers;
pub mod engine;
pub mod expr;
pub mod forecast;
pub mod gpu_map;
pub mod index;
pub mod plan;
pub mod policy;
pub mod rules;
pub mod rules_eval;
mod stage;
pub mod triggers;

// the controllers' modules, where they were before they had a folder each
pub use controllers::budget;
pub use controllers::grid;
pub use controllers::node_power;
pub use controllers::price;
pub use controllers::price::planner;
pub use controllers::thermal;
pub use controllers::thermal::model as thermal_model;
pub use controllers::thermal::predictive;

pub use engine::{evaluate, Inputs};
pub use forecast::{Forecast, StepSeries};
pub use gpu_map::GpuMap;
pub use index::JobTable;
pub use plan::{
    Action, Cap, ClockLock, Decision, GridMemory, Hold, Plan, RackPrediction, RuleMemories,
    RuleMemory, State, Target, Timers, UncappedDraw,
};
pub use policy::Policy;
