//! The policy file's `[[rules]]` tables: read with their positions and compiled into
//! `Policy::rules` (the checks live in `crate::rules`).

use serde::Deserialize;

use super::{Section, SectionCheck};
use crate::policy::Policy;

/// The `[[rules]]` tables in the list of [`super::SECTIONS`].
pub(crate) const SECTION: Section = Section {
    key: "rules",
    check,
};

/// The rules tables with the positions of their keys (the rest of the file ignored).
#[derive(Deserialize)]
struct RuleTables {
    #[serde(default)]
    rules: Vec<crate::rules::RawRule>,
}

/// Reads the rules' own shape (each problem set aside, as for the file) and compiles
/// what reads.
fn check(policy: &mut Policy, s: &mut SectionCheck<'_, '_>) {
    policy.raw_rules.clear();
    let read = telemetry::diag::read_all::<RuleTables>(s.text);
    s.c.extend(read.problems);
    if let Some(tables) = read.value {
        policy.rules = crate::rules::compile(s.src, tables.rules, s.c);
    }
}
