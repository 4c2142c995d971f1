//! Grid (demand-response) programs on the control side: how an event's delivery is
//! measured and settled.
//!
//! - [`baseline`]: measurement and verification baselines (CAISO 10-in-10, ERCOT
//!   middle 8-of-10, PJM hour-before) and the performance against them.

pub mod baseline;
