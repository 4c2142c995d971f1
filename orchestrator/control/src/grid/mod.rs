//! Demand response at the control loop's side: the grid events an operator posts or
//! schedules, which of the events in force the engine is given, and (in `baseline`)
//! how what the site delivered is measured.
//!
//! # Layout
//!
//! - [`targets`]: operators' load targets (`POST /api/v1/grid/targets`, kept in a file)
//!   and the file of scheduled targets; what the tick publishes of the events in force
//!   ([`targets::publish`]).
//! - [`baseline`]: measurement and verification baselines (CAISO 10-in-10, ERCOT
//!   middle 8-of-10, PJM hour-before) and the performance against them.

pub mod baseline;
pub mod targets;
