//! The vocabulary the engine and its controllers share: the [`Inputs`] of an
//! evaluation, the [`Context`] every controller reads, the [`Wants`] they fill in and
//! the [`Controller`] trait itself. Imports go one way: the engine uses the controllers,
//! both use this module, and this module uses neither (only the data types the
//! controllers' wants are made of).

mod context;
mod wants;

use std::collections::BTreeSet;

pub(crate) use context::Context;
pub use context::Inputs;
pub use wants::{BudgetCap, Pacing, ScopeView, Verdict};
pub(crate) use wants::{BudgetTick, CapWants, Explain, Explained, Wants, Why};

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
