//! The `[[json]]` rules: a topic template, the entity it names and the readings to take
//! from each message (or each element of an array in it).
//!
//! # Layout
//! - `mod.rs`: the rules, checked and built from the file
//! - `decode.rs`: one element of a message read into samples and rejects

use serde::Deserialize;
use std::collections::BTreeMap;

use super::{check_entity_kind, level, template_names, Level};
use crate::metric;
use crate::units::Unit;
use crate::Metric;

mod decode;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawJson {
    topic: String,
    entity: String,
    each: Option<String>,
    timestamp: Option<String>,
    quality: Option<String>,
    metric: Option<String>,
    value: Option<String>,
    unit: Option<String>,
    unit_pointer: Option<String>,
    /// A numeric string (`"80.6"`) is a number; without it a string is `wrong_type`.
    #[serde(default)]
    parse_strings: bool,
    #[serde(default)]
    readings: Vec<RawReading>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawReading {
    metric: String,
    value: String,
    unit: Option<String>,
    unit_pointer: Option<String>,
    #[serde(default)]
    parse_strings: Option<bool>,
}

/// Where a reading's unit comes from.
#[derive(Debug, Clone, PartialEq)]
enum UnitFrom {
    /// The metric's own canonical unit.
    Canonical,
    Fixed(Unit),
    Pointer(String),
}

#[derive(Debug, Clone, PartialEq)]
struct Reading {
    metric: Metric,
    canonical: Option<Unit>,
    value: String,
    unit: UnitFrom,
    /// A numeric string is read as its number (the mapping says so explicitly).
    parse_strings: bool,
}

/// One topic template and what to take from its messages.
#[derive(Debug, Clone, PartialEq)]
pub struct JsonRule {
    pub(super) topic: Vec<Level>,
    entity: String,
    pub(super) each: Option<String>,
    timestamp: Option<String>,
    quality: Option<String>,
    readings: Vec<Reading>,
}

pub(super) fn build_rule(r: &RawJson) -> Result<JsonRule, Vec<String>> {
    let mut problems = Vec::new();
    let topic: Vec<Level> = r.topic.split('/').map(level).collect();
    check_templates(r, &topic, &mut problems);
    let readings = raw_readings(r, &mut problems)
        .into_iter()
        .map(|rr| build_reading(rr, r.parse_strings, &mut problems))
        .collect();
    if problems.is_empty() {
        Ok(JsonRule {
            topic,
            entity: r.entity.clone(),
            each: r.each.clone(),
            timestamp: r.timestamp.clone(),
            quality: r.quality.clone(),
            readings,
        })
    } else {
        Err(problems)
    }
}

/// The topic's `#` comes last; the entity template takes only what the topic captures
/// (or, with `each`, what the element holds) and names its kind.
fn check_templates(r: &RawJson, topic: &[Level], problems: &mut Vec<String>) {
    if let Some(i) = topic.iter().position(|l| *l == Level::AnyRest) {
        if i + 1 != topic.len() {
            problems.push(format!("topic {:?}: '#' must be the last level", r.topic));
        }
    }
    let captures: Vec<&str> = topic.iter().filter_map(Level::capture).collect();
    for name in template_names(&r.entity) {
        if !name.starts_with('/') && !captures.contains(&name.as_str()) {
            problems.push(format!(
                "entity {:?} uses {{{name}}}, which topic {:?} does not capture",
                r.entity, r.topic
            ));
        }
        if name.starts_with('/') && r.each.is_none() {
            problems.push(format!(
                "entity {:?} uses {{{name}}}, which needs `each`",
                r.entity
            ));
        }
    }
    check_entity_kind(&r.entity, problems);
}

/// The rule's `readings`, then its own `metric` and `value` as one more.
fn raw_readings(r: &RawJson, problems: &mut Vec<String>) -> Vec<RawReading> {
    let mut raws: Vec<RawReading> = r.readings.clone();
    match (&r.metric, &r.value) {
        (Some(m), Some(v)) => raws.push(RawReading {
            metric: m.clone(),
            value: v.clone(),
            unit: r.unit.clone(),
            unit_pointer: r.unit_pointer.clone(),
            parse_strings: None,
        }),
        (None, None) if !raws.is_empty() => {}
        (None, None) => problems.push(format!(
            "mapping for {:?} has no readings: give metric and value, or readings",
            r.topic
        )),
        _ => problems.push(format!(
            "mapping for {:?}: metric and value go together",
            r.topic
        )),
    }
    raws
}

/// One reading: a known metric, its unit, and JSON pointers.
fn build_reading(rr: RawReading, parse_strings: bool, problems: &mut Vec<String>) -> Reading {
    let spec = metric::spec(&rr.metric);
    if spec.is_none() {
        let known: Vec<&str> = metric::all().iter().map(|s| s.name).collect();
        problems.push(format!(
            "unknown metric {:?} (known: {})",
            rr.metric,
            known.join(", ")
        ));
    }
    let canonical = spec.and_then(|s| Unit::parse(s.unit));
    let unit = reading_unit(&rr, canonical, problems);
    for p in std::iter::once(&rr.value).chain(rr.unit_pointer.iter()) {
        if !p.is_empty() && !p.starts_with('/') {
            problems.push(format!("{p:?} is not a JSON pointer (write it /field/sub)"));
        }
    }
    Reading {
        metric: Metric::new(&rr.metric),
        canonical,
        value: rr.value,
        unit,
        parse_strings: rr.parse_strings.unwrap_or(parse_strings),
    }
}

/// Where the reading's unit comes from: a fixed unit that converts to the metric's, a
/// pointer, or the metric's own.
fn reading_unit(rr: &RawReading, canonical: Option<Unit>, problems: &mut Vec<String>) -> UnitFrom {
    match (&rr.unit, &rr.unit_pointer) {
        (Some(_), Some(_)) => {
            problems.push(format!(
                "metric {:?}: give unit or unit_pointer, not both",
                rr.metric
            ));
            UnitFrom::Canonical
        }
        (Some(u), None) => match Unit::parse(u) {
            Some(unit) => {
                if let Some(c) = canonical {
                    if c.dimension != unit.dimension {
                        problems.push(format!(
                            "metric {:?} is in {}, which unit {u:?} cannot be converted to",
                            rr.metric, c.name
                        ));
                    }
                }
                UnitFrom::Fixed(unit)
            }
            None => {
                problems.push(format!("metric {:?}: unknown unit {u:?}", rr.metric));
                UnitFrom::Canonical
            }
        },
        (None, Some(p)) => UnitFrom::Pointer(p.clone()),
        (None, None) => UnitFrom::Canonical,
    }
}

impl JsonRule {
    pub(super) fn matches(&self, topic: &str) -> Option<BTreeMap<String, String>> {
        let levels: Vec<&str> = topic.split('/').collect();
        let mut caps = BTreeMap::new();
        for (i, l) in self.topic.iter().enumerate() {
            match l {
                Level::AnyRest => return Some(caps),
                _ if i >= levels.len() => return None,
                Level::Exact(s) if s != levels[i] => return None,
                Level::Exact(_) | Level::AnyOne => {}
                Level::Capture(name) => {
                    caps.insert(name.clone(), levels[i].to_string());
                }
            }
        }
        (levels.len() == self.topic.len()).then_some(caps)
    }
}
