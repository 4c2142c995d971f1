//! The store's backends: [`redis`] (reconnecting, a deadline per call), [`journal`]
//! (the local journal that keeps what Redis cannot take and replays it) and
//! [`embedded`] (redb, the default). The contract they implement, the typed layer on
//! top and the records are the `store` crate's, re-exported here.

pub mod embedded;
pub mod journal;
pub mod postgres;
pub mod redis;
mod rt;

pub use ::store::*;
