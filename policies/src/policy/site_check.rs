//! The policy against a site: what `powerplane policy check --site` adds to the
//! file's own checks (selectors that pick nothing, caps below a GPU's minimum, budget
//! limits naming unknown equipment).

use telemetry::diag::{Collector, Diagnostics};

use super::Policy;
use crate::index::Index;
use crate::rules::{Rule, RuleAction, ScopeKind};

impl Policy {
    /// Checks the policy against a site: selectors that pick nothing, caps below the
    /// minimum limit of a GPU they apply to, budget limits naming unknown equipment.
    /// `src` is the policy file's text (for positions).
    pub fn check_site(
        &self,
        file: &str,
        src: &str,
        site: &telemetry::Site,
    ) -> Result<(), Diagnostics> {
        let mut c = Collector::new(file, src);
        let index = Index::new(site, site.gpus());
        for rule in &self.rules {
            if rule.scope != ScopeKind::Job {
                check_rule_targets(rule, &index, site, &mut c);
            }
        }
        self.check_limits(src, site, &mut c);
        c.finish()
    }

    /// Each budget limit names equipment the site has.
    fn check_limits(&self, src: &str, site: &telemetry::Site, c: &mut Collector<'_>) {
        let entities = site.entities();
        let budget_at = src.find("[budget").unwrap_or(0);
        for l in &self.budget.limits {
            let kind = match l.scope.as_str() {
                "site" => continue,
                "feed" => telemetry::EntityKind::Feed,
                "pdu" => telemetry::EntityKind::Pdu,
                "branch" => telemetry::EntityKind::Branch,
                "row" => telemetry::EntityKind::Row,
                "room" => telemetry::EntityKind::Room,
                _ => telemetry::EntityKind::Rack,
            };
            if !entities.contains(&telemetry::EntityId::new(kind, &l.name)) {
                let at = src[budget_at..]
                    .find(&format!("\"{}\"", l.name))
                    .map_or(budget_at, |i| budget_at + i);
                c.at(
                    at..at,
                    format!(
                        "budget.limits: site {} has no {} `{}`",
                        site.name, l.scope, l.name
                    ),
                );
            }
        }
    }
}

/// A rule selects something of the site, and a cap it sets is one its GPUs accept.
fn check_rule_targets(
    rule: &Rule,
    index: &Index<'_>,
    site: &telemetry::Site,
    c: &mut Collector<'_>,
) {
    let targets = index.targets(rule.scope, &rule.select);
    if targets.is_empty() {
        c.at(
            rule.select_at..rule.select_at,
            format!(
                "rule `{}`: selects no {} of site {}",
                rule.name,
                rule.scope.name(),
                site.name
            ),
        );
        return;
    }
    let below: Vec<String> = match rule.action {
        RuleAction::CapW(w) => below_minimum(&targets, index, |m| w < m.min_w),
        RuleAction::CapPct(p) => {
            below_minimum(&targets, index, |m| m.default_w * p / 100.0 < m.min_w)
        }
        _ => Vec::new(),
    };
    if !below.is_empty() {
        c.at(
            rule.action_at..rule.action_at,
            format!(
                "rule `{}`: cap below the GPUs' minimum ({}); it would be raised to the minimum",
                rule.name,
                below.join(", ")
            ),
        );
    }
}

/// The models among the targets' GPUs whose minimum the cap is `under`, by name, each
/// once, as "H100 accepts no less than 200 W".
fn below_minimum<T>(
    targets: &[(T, std::borrow::Cow<'_, [usize]>)],
    index: &Index<'_>,
    under: impl Fn(&telemetry::GpuModel) -> bool,
) -> Vec<String> {
    let mut models: Vec<(&str, f64)> = targets
        .iter()
        .flat_map(|(_, g)| g.iter().map(|&i| index.gpus[i].model))
        .filter(|m| under(m))
        .map(|m| (m.name.as_str(), m.min_w))
        .collect();
    models.sort_by(|a, b| a.0.cmp(b.0));
    models.dedup();
    models
        .into_iter()
        .map(|(n, min)| format!("{n} accepts no less than {min} W"))
        .collect()
}
