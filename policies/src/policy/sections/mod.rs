//! The policy file's sections, each in a module of its own that owns its settings'
//! type (where the policy crate has none elsewhere) and its checks; [`SECTIONS`] lists
//! them in the order they are checked.
//!
//! # Layout
//!
//! - `rules.rs`: the `[[rules]]` tables, compiled (first: the other sections' checks
//!   do not read them).
//! - `budget.rs`: `[budget]`, the facility and rack power budgets.
//! - `thermal.rs`: `[thermal]`, the thermal and predictive controllers.
//! - `price.rs`: `[price]`, the price controller.
//! - `node_power.rs`: `[node_power]`, node power (its type, `NodePowerRule`, with it).
//! - `grid.rs`: `[grid]`, how a grid event's target is met (its type, `GridRule`).
//! - `limits.rs`: `[limits]`, GPU power limits by job class and as jobs ask (`LimitsRule`).
//!
//! A new controller's section: a module here, a field of [`super::Policy`] and one
//! line in [`SECTIONS`].

use std::ops::Range;

use telemetry::diag::Collector;

use super::Policy;

pub(crate) mod budget;
pub(crate) mod grid;
pub(crate) mod limits;
pub(crate) mod node_power;
pub(crate) mod price;
pub(crate) mod rules;
pub(crate) mod thermal;

/// One section of the policy file: its key and the step that checks it (and fills what
/// the policy derives from it).
pub(crate) struct Section {
    pub(crate) key: &'static str,
    pub(crate) check: fn(&mut Policy, &mut SectionCheck<'_, '_>),
}

/// Every section, in the order their checks run.
pub(crate) const SECTIONS: &[Section] = &[
    rules::SECTION,
    budget::SECTION,
    thermal::SECTION,
    price::SECTION,
    node_power::SECTION,
    grid::SECTION,
    limits::SECTION,
];

/// What a section's check sees: the file, where its table sits, and the collector.
pub(crate) struct SectionCheck<'s, 'c> {
    /// The source as written (positions and key lookups).
    pub(crate) src: &'s str,
    /// The source with the lines of its shape problems set aside (same positions).
    pub(crate) text: &'s str,
    /// The byte span of the section's table; None when the file has none.
    pub(crate) table: Option<Range<usize>>,
    pub(crate) c: &'s mut Collector<'c>,
}

impl SectionCheck<'_, '_> {
    /// Records `msg` at `key` of the section's table unless `ok`.
    pub(crate) fn check(&mut self, ok: bool, key: &str, msg: String) {
        if !ok {
            let at = self.key_at(key);
            self.c.at(at..at, msg);
        }
    }

    /// Where `key =` first appears in the section's table (the table's own span starts
    /// at its header; a key's value sits in it): the table's start when not found, 0
    /// without a table.
    fn key_at(&self, key: &str) -> usize {
        let Some(table) = &self.table else { return 0 };
        let start = table.start;
        let text = &self.src[start.min(self.src.len())..];
        text.find(&format!("{key} ="))
            .or_else(|| text.find(&format!("{key}=")))
            .map(|i| start + i)
            .unwrap_or(start)
    }
}
