//! The demo hall (examples/demo): its site and policy, built in, for `powerplane demo`
//! and for the tests of every crate.

/// examples/demo/site.toml.
pub const DEFAULT_SITE: &str = include_str!("../../../examples/demo/site.toml");
/// examples/demo/policy.toml.
pub const DEFAULT_POLICY: &str = include_str!("../../../examples/demo/policy.toml");
