//! The policy file: thresholds and behaviours of the first rules, as SREs write them.
//!
//! ```toml
//! version = 1
//! [budget]
//! margin = 0.03
//! [thermal]
//! step_pct = 10
//! on_stale = "hold_last"
//! [price]
//! defer_above = 0.20
//! classes = ["batch", "training"]
//! ```
//!
//! # Layout
//!
//! - `mod.rs`: [`Policy`] and [`Policy::parse`], which reads the file's shape and runs
//!   each section's checks.
//! - `sections/`: one module per section of the file (`[budget]`, `[thermal]`,
//!   `[price]`, `[node_power]`, `[[rules]]`), each owning its checks, registered in
//!   `sections::SECTIONS`.
//! - `site_check.rs`: [`Policy::check_site`], the policy against a site.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use telemetry::diag::{Collector, Diagnostics};
use toml::Spanned;

pub use crate::rules::OnStale;
pub use sections::budget::{BudgetRule, Limit};
pub use sections::grid::GridRule;
pub use sections::limits::LimitsRule;
pub use sections::node_power::{NodePowerRule, ReserveMode};
pub use sections::price::{PriceMode, PriceRule};
pub use sections::thermal::{ThermalMode, ThermalRule};

mod sections;
mod site_check;

/// A whole policy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Policy {
    pub version: i64,
    #[serde(default)]
    pub budget: BudgetRule,
    #[serde(default)]
    pub thermal: ThermalRule,
    #[serde(default)]
    pub price: PriceRule,
    /// Off unless the policy turns it on; left out of the serialized policy while it
    /// is the default (so `policy explain` does not list it as disabled).
    #[serde(default, skip_serializing_if = "NodePowerRule::is_default")]
    pub node_power: NodePowerRule,
    /// How grid events are met; left out of the serialized policy while it is the
    /// default.
    #[serde(default, skip_serializing_if = "GridRule::is_default")]
    pub grid: GridRule,
    /// GPU power limits by job class and as jobs ask; left out of the serialized
    /// policy while it is the default.
    #[serde(default, skip_serializing_if = "LimitsRule::is_default")]
    pub limits: LimitsRule,
    /// The `[[rules]]` tables, validated (filled by [`Policy::parse`]).
    #[serde(skip)]
    pub rules: Vec<crate::rules::Rule>,
    /// The `[[rules]]` tables as read; compiled into `rules` by [`Policy::parse`].
    #[serde(default, rename = "rules", skip_serializing)]
    raw_rules: Vec<toml::Value>,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            version: 1,
            budget: BudgetRule::default(),
            thermal: ThermalRule::default(),
            price: PriceRule::default(),
            node_power: Default::default(),
            grid: Default::default(),
            limits: Default::default(),
            rules: Vec::new(),
            raw_rules: Vec::new(),
        }
    }
}

impl Policy {
    /// Parses and validates a policy file; every problem at once, with positions.
    ///
    /// The shape problems (unknown keys, wrong types) are set aside, and every
    /// section's checks (unknown metrics, impossible values) still run on what reads;
    /// all are reported together in the order of the file.
    pub fn parse(file: &str, src: &str) -> Result<Policy, Diagnostics> {
        let read = telemetry::diag::read_all::<Policy>(src);
        let mut c = Collector::new(file, src);
        c.extend(read.problems);
        let policy = read.value.map(|mut policy| {
            policy.check_sections(src, &read.text, &mut c);
            policy
        });
        c.finish_with(policy)
    }

    /// The version and each section of [`sections::SECTIONS`], checked in turn.
    fn check_sections(&mut self, src: &str, text: &str, c: &mut Collector<'_>) {
        let tables: BTreeMap<String, Spanned<toml::Value>> =
            toml::from_str(text).unwrap_or_default();
        let mut sections = sections::SECTIONS.iter();
        // the rules first, then the version, as the file has always been checked
        if let Some(rules) = sections.next() {
            self.check_section(rules, &tables, src, text, c);
        }
        if self.version != 1 {
            let at = tables.get("version").map_or(0..0, |v| v.span());
            c.at(
                at,
                format!("unsupported policy version {}, expected 1", self.version),
            );
        }
        for section in sections {
            self.check_section(section, &tables, src, text, c);
        }
    }

    fn check_section(
        &mut self,
        section: &sections::Section,
        tables: &BTreeMap<String, Spanned<toml::Value>>,
        src: &str,
        text: &str,
        c: &mut Collector<'_>,
    ) {
        let mut check = sections::SectionCheck {
            src,
            text,
            table: tables.get(section.key).map(|t| t.span()),
            c,
        };
        (section.check)(self, &mut check);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_fill_what_the_file_leaves_out() {
        let p =
            Policy::parse("p.toml", "version = 1\n[price]\ndefer_above = 0.3\n").expect("valid");
        assert_eq!(p.price.defer_above, 0.3);
        assert_eq!(p.budget, BudgetRule::default());
    }

    #[test]
    fn every_problem_is_reported_with_its_position() {
        let src = "version = 1\n[budget]\nmargin = 0.9\n[thermal]\nstep_pct = 80\nlease_s = 1\n";
        let err = Policy::parse("p.toml", src).expect_err("invalid");
        assert_eq!(
            err.to_string(),
            "p.toml:3:1: budget: margin must be within 0..0.5, got 0.9\n\
             p.toml:5:1: thermal: step_pct must be within 0..=50, got 80\n\
             p.toml:6:1: thermal: lease_s must be at least 10, got 1"
        );
    }

    #[test]
    fn unknown_keys_and_bad_values_are_errors() {
        let err = Policy::parse("p.toml", "version = 1\n[thermal]\non_stale = \"panic\"\n")
            .expect_err("bad enum");
        assert!(
            err.to_string()
                .starts_with("p.toml:3:12: unknown variant `panic`"),
            "{err}"
        );
        let err =
            Policy::parse("p.toml", "version = 1\n[price]\ndefer_abov = 1\n").expect_err("typo");
        assert!(
            err.to_string()
                .starts_with("p.toml:3:1: unknown field `defer_abov`"),
            "{err}"
        );
    }

    #[test]
    fn value_and_node_power_keys_are_checked() {
        let p = Policy::parse(
            "p.toml",
            "version = 1\n[price]\nmode = \"plan\"\ndelay_cost_per_gpu_hour = 0.03\nmax_slowdown = 4\npeak_target_kw = 500\n[node_power]\nenabled = true\nreserve_gpus = 16\nboot_s_by_model = { H100 = 600 }\n",
        )
        .expect("valid");
        assert_eq!(p.price.delay_cost_per_gpu_hour, 0.03);
        assert_eq!(p.price.max_slowdown, Some(4.0));
        assert!(p.node_power.enabled);
        assert_eq!(p.node_power.boot_s_of("H100"), 600.0);
        assert_eq!(p.node_power.boot_s_of("A40"), 300.0);
        let err = Policy::parse(
            "p.toml",
            "version = 1\n[price]\ndelay_cost_per_gpu_hour = -1\nmax_slowdown = 0.5\n[node_power]\nreserve_share = 2\nmax_downs_per_min = 0\n",
        )
        .expect_err("bad values");
        let e = err.to_string();
        for want in [
            "delay_cost_per_gpu_hour must not be negative",
            "max_slowdown must be at least 1",
            "node_power: reserve_share must be within 0..1",
            "node_power: max_downs_per_min must be at least 1",
        ] {
            assert!(e.contains(want), "{want}: {e}");
        }
    }

    #[test]
    fn shape_and_meaning_problems_are_reported_together() {
        let src = "version = 1\nbogus = 3\n[budget]\nmargin = 0.9\n[price]\ndefer_abov = 1\n\n[[rules]]\nname = \"typo\"\nscope = \"rack\"\nwhen = \"inlet_temp > 30\"\naction = { cap_w = 250 }\n";
        let err = Policy::parse("p.toml", src).expect_err("invalid");
        let text = err.to_string();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 4, "{text}");
        // the shape problems first, then the meaning ones, each in the file's order
        assert!(
            lines[0].starts_with("p.toml:2:1: unknown field `bogus`"),
            "{text}"
        );
        assert!(
            lines[1].starts_with("p.toml:6:1: unknown field `defer_abov`"),
            "{text}"
        );
        assert_eq!(
            lines[2],
            "p.toml:4:1: budget: margin must be within 0..0.5, got 0.9"
        );
        assert!(
            lines[3].starts_with("p.toml:11:") && lines[3].contains("inlet_temp"),
            "{text}"
        );
    }
}
