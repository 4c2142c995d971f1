//! The policy file's `[node_power]` section (its type is `crate::node_power::NodePowerRule`), checked.

use super::{Section, SectionCheck};
use crate::policy::Policy;

/// The `[node_power]` section in the list of [`super::SECTIONS`].
pub(crate) const SECTION: Section = Section {
    key: "node_power",
    check,
};

/// Its impossible values, each at its key.
fn check(policy: &mut Policy, s: &mut SectionCheck<'_, '_>) {
    let n = &policy.node_power;
    s.check(
        (0.0..1.0).contains(&n.reserve_share) && n.idle_s >= 0.0 && n.min_off_s >= 0.0,
        "reserve_share",
        format!(
            "node_power: reserve_share must be within 0..1 and idle_s, min_off_s not negative (got {}, {}, {})",
            n.reserve_share, n.idle_s, n.min_off_s
        ),
    );
    s.check(
        n.max_downs_per_min >= 1
            && n.boot_s > 0.0
            && n.resume_timeout_s >= n.boot_s
            && n.lease_s >= 10.0,
        "max_downs_per_min",
        format!(
            "node_power: max_downs_per_min must be at least 1, boot_s positive, resume_timeout_s at least boot_s and lease_s at least 10 (got {}, {}, {}, {})",
            n.max_downs_per_min, n.boot_s, n.resume_timeout_s, n.lease_s
        ),
    );
}
