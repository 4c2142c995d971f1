//! The `[[sparkplug]]` rules: which Sparkplug B metric of which node or device becomes
//! which sample.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::{check_entity_kind, fill, level, template_names, Level, SampleError};
use crate::metric;
use crate::units::Unit;
use crate::{EntityId, Metric, Quality, Sample, Timestamp};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSparkplug {
    #[serde(default = "any_level")]
    group: String,
    #[serde(default = "any_level")]
    node: String,
    device: Option<String>,
    /// The Sparkplug metric name.
    metric: String,
    entity: String,
    /// The powerplane metric it becomes.
    to: String,
    unit: Option<String>,
}

fn any_level() -> String {
    "+".to_string()
}

/// A Sparkplug metric of some node or device, and the sample it becomes.
#[derive(Debug, Clone, PartialEq)]
pub struct SparkplugRule {
    pub(super) group: Level,
    node: Level,
    /// None: node-level metrics only.
    device: Option<Level>,
    metric: String,
    entity: String,
    to: Metric,
    from: Option<Unit>,
    canonical: Option<Unit>,
}

pub(super) fn build_sparkplug(r: &RawSparkplug) -> Result<SparkplugRule, Vec<String>> {
    let mut problems = Vec::new();
    let (group, node) = (level(&r.group), level(&r.node));
    let device = r.device.as_deref().map(level);
    for (what, l) in [
        ("group", Some(&group)),
        ("node", Some(&node)),
        ("device", device.as_ref()),
    ] {
        if l == Some(&Level::AnyRest)
            || l.is_some_and(|l| matches!(l, Level::Exact(s) if s.contains('/') || s.is_empty()))
        {
            problems.push(format!(
                "sparkplug {what} must be one topic level, a {{capture}} or +"
            ));
        }
    }
    let captures: Vec<&str> = [Some(&group), Some(&node), device.as_ref()]
        .into_iter()
        .flatten()
        .filter_map(Level::capture)
        .collect();
    for name in template_names(&r.entity) {
        if !captures.contains(&name.as_str()) {
            problems.push(format!(
                "entity {:?} uses {{{name}}}, which group, node and device do not capture",
                r.entity
            ));
        }
    }
    check_entity_kind(&r.entity, &mut problems);
    let spec = metric::spec(&r.to);
    if spec.is_none() {
        problems.push(format!("unknown metric {:?} in `to`", r.to));
    }
    let canonical = spec.and_then(|s| Unit::parse(s.unit));
    let from = match &r.unit {
        Some(u) => match Unit::parse(u) {
            Some(unit) if canonical.is_some_and(|c| c.dimension != unit.dimension) => {
                problems.push(format!("metric {:?} cannot be converted from {u:?}", r.to));
                None
            }
            Some(unit) => Some(unit),
            None => {
                problems.push(format!("metric {:?}: unknown unit {u:?}", r.to));
                None
            }
        },
        None => None,
    };
    if problems.is_empty() {
        Ok(SparkplugRule {
            group,
            node,
            device,
            metric: r.metric.clone(),
            entity: r.entity.clone(),
            to: Metric::new(&r.to),
            from,
            canonical,
        })
    } else {
        Err(problems)
    }
}

impl SparkplugRule {
    /// The powerplane metric this rule's values become.
    pub fn to(&self) -> &Metric {
        &self.to
    }

    /// The captures when this rule covers `metric` of this node or device.
    pub fn matches(
        &self,
        t: &crate::sparkplug::Topic<'_>,
        metric: &str,
    ) -> Option<BTreeMap<String, String>> {
        if metric != self.metric {
            return None;
        }
        let mut caps = BTreeMap::new();
        let mut one = |l: &Level, v: &str| match l {
            Level::Exact(s) => s == v,
            Level::Capture(c) => {
                caps.insert(c.clone(), v.to_string());
                true
            }
            Level::AnyOne | Level::AnyRest => true,
        };
        let ok = one(&self.group, t.group)
            && one(&self.node, t.node)
            && match (&self.device, t.device) {
                (None, None) => true,
                (Some(l), Some(d)) => one(l, d),
                _ => false,
            };
        ok.then_some(caps)
    }

    /// The sample for a value of this rule's metric.
    pub fn sample(
        &self,
        caps: &BTreeMap<String, String>,
        value: f64,
        ts: Timestamp,
        source: &str,
    ) -> Result<Sample, SampleError> {
        let entity: EntityId = fill(&self.entity, caps).parse()?;
        let value = match (self.from, self.canonical) {
            (Some(f), Some(c)) => f
                .convert(value, &c)
                .ok_or_else(|| SampleError::Unconvertible(self.to.clone()))?,
            _ => value,
        };
        let unit = metric::spec(self.to.as_str())
            .map(|s| s.unit.to_string())
            .unwrap_or_default();
        Ok(Sample {
            entity,
            metric: self.to.clone(),
            value,
            unit: unit.into(),
            ts,
            source: source.to_string().into(),
            quality: Quality::Good,
        })
    }
}
