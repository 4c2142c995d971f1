//! Mapping files: how MQTT messages become samples, written by operators, not code.
//!
//! ```toml
//! version = 1
//!
//! [[json]]                              # one reading per message
//! topic = "dc1/{room}/{rack}/inlet"     # {name} captures one topic level
//! entity = "rack/{rack}"
//! metric = "inlet_temp_c"
//! value = "/value"                      # JSON pointer ("" for a bare number)
//! unit = "degF"                         # or unit_pointer = "/unit"
//! timestamp = "/ts"                     # RFC 3339, Unix seconds or milliseconds
//!
//! [[json]]                              # many readings per message
//! topic = "dc1/cdu/{cdu}/state"
//! entity = "cooling/{cdu}"
//! readings = [
//!   { metric = "supply_temp_c", value = "/supply/temp", unit = "degC" },
//!   { metric = "heat_load_kw", value = "/heat", unit = "kW" },
//! ]
//!
//! [[json]]                              # an array of readings, one entity each
//! topic = "dc1/pdu/{pdu}/outlets"
//! each = "/outlets"                     # pointers below are relative to each element
//! entity = "outlet/{pdu}.{/name}"       # {/pointer} takes a value from the element
//! metric = "power_w"
//! value = "/watts"
//! unit = "W"
//! ```

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::Value;

use crate::diag::{Collector, Diagnostics};
use crate::metric;
use crate::units::Unit;
use crate::{EntityId, Metric, Quality, Sample, Timestamp};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMapping {
    version: toml::Spanned<i64>,
    #[serde(default)]
    json: Vec<toml::Spanned<RawJson>>,
    #[serde(default)]
    sparkplug: Vec<toml::Spanned<RawSparkplug>>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSparkplug {
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
    group: Level,
    node: Level,
    /// None: node-level metrics only.
    device: Option<Level>,
    metric: String,
    entity: String,
    to: Metric,
    from: Option<Unit>,
    canonical: Option<Unit>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawJson {
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
    topic: Vec<Level>,
    entity: String,
    each: Option<String>,
    timestamp: Option<String>,
    quality: Option<String>,
    readings: Vec<Reading>,
}

#[derive(Debug, Clone, PartialEq)]
enum Level {
    Exact(String),
    Capture(String),
    AnyOne,
    AnyRest,
}

impl Level {
    /// The capture's name, when this level is one.
    fn capture(&self) -> Option<&str> {
        match self {
            Level::Capture(c) => Some(c),
            _ => None,
        }
    }
}

/// An entity template must name its kind: `rack/{rack}`, not `{rack}`.
fn check_entity_kind(entity: &str, problems: &mut Vec<String>) {
    if entity
        .split_once('/')
        .and_then(|(k, _)| k.parse::<crate::EntityKind>().ok())
        .is_none()
    {
        problems.push(format!("entity {entity:?} must start with a kind (rack/, node/, gpu/, pdu/, outlet/, cooling/, ...)"));
    }
}

/// A validated mapping file.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Mapping {
    rules: Vec<JsonRule>,
    sparkplug: Vec<SparkplugRule>,
}

/// Why a message (or part of one) gave no sample.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reject {
    /// A short label for counters: `no_mapping`, `bad_json`, `missing_value`, ...
    pub reason: &'static str,
    pub detail: String,
}

/// What one message gave.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Decoded {
    pub samples: Vec<Sample>,
    pub rejects: Vec<Reject>,
    /// Entities whose source died (Sparkplug NDEATH/DDEATH): mark their readings bad.
    pub dead: Vec<EntityId>,
    /// A Sparkplug edge node whose state was lost: ask it for a rebirth.
    pub rebirth: Option<Rebirth>,
}

/// A rebirth a Sparkplug message calls for (NCMD `Node Control/Rebirth`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Rebirth {
    pub group: String,
    pub node: String,
    /// Whether the source sent the request (it sends at most one per node per
    /// `rebirth_interval_s`, and none when that is 0).
    pub sent: bool,
}

impl Mapping {
    /// Parses and validates a mapping file; every problem at once, with positions.
    pub fn parse(file: &str, src: &str) -> Result<Mapping, Diagnostics> {
        let raw: RawMapping = crate::diag::parse_all(file, src)?;
        let mut c = Collector::new(file, src);
        if *raw.version.get_ref() != 1 {
            c.at(
                raw.version.span(),
                format!(
                    "unsupported mapping version {}, expected 1",
                    raw.version.get_ref()
                ),
            );
        }
        let mut rules = Vec::new();
        for r in &raw.json {
            let span = r.span();
            match build_rule(r.get_ref()) {
                Ok(rule) => rules.push(rule),
                Err(problems) => {
                    for p in problems {
                        c.at(span.clone(), p);
                    }
                }
            }
        }
        let mut sparkplug = Vec::new();
        for r in &raw.sparkplug {
            match build_sparkplug(r.get_ref()) {
                Ok(rule) => sparkplug.push(rule),
                Err(problems) => {
                    for p in problems {
                        c.at(r.span(), p);
                    }
                }
            }
        }
        c.finish()?;
        Ok(Mapping { rules, sparkplug })
    }

    pub fn sparkplug_rules(&self) -> &[SparkplugRule] {
        &self.sparkplug
    }

    /// The MQTT subscription filters the mapping needs (captures become `+`).
    pub fn topic_filters(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .rules
            .iter()
            .map(|r| {
                r.topic
                    .iter()
                    .map(|l| match l {
                        Level::Exact(s) => s.as_str(),
                        Level::Capture(_) | Level::AnyOne => "+",
                        Level::AnyRest => "#",
                    })
                    .collect::<Vec<_>>()
                    .join("/")
            })
            .collect();
        for r in &self.sparkplug {
            out.push(format!(
                "spBv1.0/{}/#",
                match &r.group {
                    Level::Exact(g) => g.as_str(),
                    _ => "+",
                }
            ));
        }
        out.sort();
        out.dedup();
        out
    }

    pub fn is_empty(&self) -> bool {
        self.rules.is_empty() && self.sparkplug.is_empty()
    }

    /// Decodes one message. `received` stamps readings that carry no time of their own.
    pub fn decode(
        &self,
        topic: &str,
        payload: &[u8],
        source: &str,
        received: Timestamp,
    ) -> Decoded {
        let mut out = Decoded::default();
        let Some((rule, captures)) = self
            .rules
            .iter()
            .find_map(|r| r.matches(topic).map(|c| (r, c)))
        else {
            out.rejects.push(Reject {
                reason: "no_mapping",
                detail: format!("no mapping for topic {topic:?}"),
            });
            return out;
        };
        let doc: Value = match serde_json::from_slice(payload) {
            Ok(v) => v,
            Err(e) => {
                out.rejects.push(Reject {
                    reason: "bad_json",
                    detail: format!("{topic}: payload is not JSON: {e}"),
                });
                return out;
            }
        };
        let elements: Vec<&Value> = match &rule.each {
            None => vec![&doc],
            Some(p) => match doc.pointer(p).and_then(Value::as_array) {
                Some(a) => a.iter().collect(),
                None => {
                    out.rejects.push(Reject {
                        reason: "missing_value",
                        detail: format!("{topic}: no array at {p}"),
                    });
                    return out;
                }
            },
        };
        for el in elements {
            rule.decode_element(topic, &captures, &doc, el, source, received, &mut out);
        }
        out
    }
}

fn level(s: &str) -> Level {
    match s {
        "+" => Level::AnyOne,
        "#" => Level::AnyRest,
        _ if s.starts_with('{') && s.ends_with('}') && s.len() > 2 => {
            Level::Capture(s[1..s.len() - 1].to_string())
        }
        _ => Level::Exact(s.to_string()),
    }
}

fn build_sparkplug(r: &RawSparkplug) -> Result<SparkplugRule, Vec<String>> {
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
    ) -> Result<Sample, String> {
        let entity: EntityId = fill(&self.entity, caps).parse()?;
        let value = match (self.from, self.canonical) {
            (Some(f), Some(c)) => f
                .convert(value, &c)
                .ok_or_else(|| format!("{} cannot be converted", self.to))?,
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

/// Fills `{name}` from captures.
fn fill(template: &str, caps: &BTreeMap<String, String>) -> String {
    let mut s = template.to_string();
    for (k, v) in caps {
        s = s.replace(&format!("{{{k}}}"), v);
    }
    s
}

fn build_rule(r: &RawJson) -> Result<JsonRule, Vec<String>> {
    let mut problems = Vec::new();
    let topic: Vec<Level> = r.topic.split('/').map(level).collect();
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
    check_entity_kind(&r.entity, &mut problems);
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
    let mut readings = Vec::new();
    for rr in raws {
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
        let unit = match (&rr.unit, &rr.unit_pointer) {
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
        };
        for p in std::iter::once(&rr.value).chain(rr.unit_pointer.iter()) {
            if !p.is_empty() && !p.starts_with('/') {
                problems.push(format!("{p:?} is not a JSON pointer (write it /field/sub)"));
            }
        }
        readings.push(Reading {
            metric: Metric::new(&rr.metric),
            canonical,
            value: rr.value,
            unit,
            parse_strings: rr.parse_strings.unwrap_or(r.parse_strings),
        });
    }
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

/// The `{...}` names in a template.
fn template_names(t: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = t;
    while let Some(i) = rest.find('{') {
        let Some(j) = rest[i..].find('}') else { break };
        out.push(rest[i + 1..i + j].to_string());
        rest = &rest[i + j + 1..];
    }
    out
}

impl JsonRule {
    fn matches(&self, topic: &str) -> Option<BTreeMap<String, String>> {
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

    #[allow(clippy::too_many_arguments)]
    fn decode_element(
        &self,
        topic: &str,
        caps: &BTreeMap<String, String>,
        doc: &Value,
        el: &Value,
        source: &str,
        received: Timestamp,
        out: &mut Decoded,
    ) {
        let mut reject = |reason, detail: String| {
            out.rejects.push(Reject {
                reason,
                detail: format!("{topic}: {detail}"),
            })
        };
        let entity = match self.entity_for(caps, el) {
            Ok(e) => e,
            Err(d) => return reject("bad_entity", d),
        };
        let ts = match &self.timestamp {
            None => received,
            Some(p) => match el.pointer(p).or_else(|| doc.pointer(p)).map(parse_time) {
                Some(Ok(t)) => t,
                Some(Err(d)) => return reject("bad_timestamp", d),
                None => return reject("missing_value", format!("no timestamp at {p}")),
            },
        };
        let quality = self
            .quality
            .as_ref()
            .and_then(|p| el.pointer(p).or_else(|| doc.pointer(p)))
            .map_or(Quality::Good, quality_of);
        for r in &self.readings {
            let raw = if r.value.is_empty() {
                Some(el)
            } else {
                el.pointer(&r.value)
            };
            let v = match raw {
                None | Some(Value::Null) => {
                    reject(
                        "missing_value",
                        format!("{} has no value at {:?}", r.metric, r.value),
                    );
                    continue;
                }
                // a boolean is a reading only of a boolean metric (a leak detector):
                // `true` is not 1 °F
                Some(Value::Bool(b)) if r.metric.spec().is_some_and(|m| m.unit == "bool") => {
                    f64::from(u8::from(*b))
                }
                Some(Value::Bool(b)) => {
                    reject(
                        "wrong_type",
                        format!("{} value {b} is a boolean, not a number", r.metric),
                    );
                    continue;
                }
                Some(Value::Number(n)) => n.as_f64().unwrap_or(f64::NAN),
                // a string is a number only where the mapping says so
                Some(Value::String(s)) if r.parse_strings => match s.trim().parse::<f64>() {
                    Ok(v) => v,
                    Err(_) => {
                        reject(
                            "not_a_number",
                            format!("{} value {s:?} is not a number", r.metric),
                        );
                        continue;
                    }
                },
                Some(other) => {
                    let what = match other {
                        Value::String(_) => "a string (set parse_strings to read numeric strings)",
                        Value::Array(_) => "an array",
                        _ => "an object",
                    };
                    reject(
                        "wrong_type",
                        format!("{} value {other} is {what}, not a number", r.metric),
                    );
                    continue;
                }
            };
            let from = match &r.unit {
                UnitFrom::Canonical => r.canonical,
                UnitFrom::Fixed(u) => Some(*u),
                UnitFrom::Pointer(p) => match el
                    .pointer(p)
                    .or_else(|| doc.pointer(p))
                    .and_then(Value::as_str)
                    .map(|s| (s, Unit::parse(s)))
                {
                    Some((_, Some(u))) => Some(u),
                    Some((s, None)) => {
                        reject(
                            "unknown_unit",
                            format!("{} unit {s:?} is not known", r.metric),
                        );
                        continue;
                    }
                    None => {
                        reject(
                            "missing_value",
                            format!("{} has no unit at {p:?}", r.metric),
                        );
                        continue;
                    }
                },
            };
            let value = match (from, r.canonical) {
                (Some(f), Some(c)) => match f.convert(v, &c) {
                    Some(x) => x,
                    None => {
                        reject(
                            "unknown_unit",
                            format!(
                                "{} cannot be converted from {} to {}",
                                r.metric, f.name, c.name
                            ),
                        );
                        continue;
                    }
                },
                _ => v,
            };
            let unit = metric::spec(r.metric.as_str())
                .map(|s| s.unit.to_string())
                .unwrap_or_default();
            out.samples.push(Sample {
                entity: entity.clone(),
                metric: r.metric.clone(),
                value,
                unit: unit.into(),
                ts,
                source: source.to_string().into(),
                quality,
            });
        }
    }

    fn entity_for(&self, caps: &BTreeMap<String, String>, el: &Value) -> Result<EntityId, String> {
        let mut s = String::new();
        let mut rest = self.entity.as_str();
        while let Some(i) = rest.find('{') {
            s.push_str(&rest[..i]);
            let j = rest[i..].find('}').map(|j| i + j).unwrap_or(rest.len() - 1);
            let name = &rest[i + 1..j];
            let v = if name.starts_with('/') {
                match el.pointer(name) {
                    Some(Value::String(x)) => x.clone(),
                    Some(Value::Number(n)) => n.to_string(),
                    _ => return Err(format!("no value at {name} for the entity")),
                }
            } else {
                caps.get(name).cloned().unwrap_or_default()
            };
            s.push_str(&v);
            rest = &rest[(j + 1).min(rest.len())..];
        }
        s.push_str(rest);
        s.parse()
    }
}

/// RFC 3339 strings, or Unix time in seconds (or milliseconds, when larger than 1e11).
fn parse_time(v: &Value) -> Result<Timestamp, String> {
    match v {
        Value::String(s) => {
            Timestamp::parse_rfc3339(s).map_err(|e| format!("timestamp {s:?}: {e}"))
        }
        Value::Number(n) => {
            let x = n.as_f64().unwrap_or(f64::NAN);
            if !x.is_finite() || x < 0.0 {
                return Err(format!("timestamp {n} is not a time"));
            }
            let ms = if x > 1e11 { x } else { x * 1000.0 };
            Ok(Timestamp(ms.round() as i64))
        }
        other => Err(format!("timestamp {other} is not a time")),
    }
}

fn quality_of(v: &Value) -> Quality {
    match v.as_str().map(str::to_ascii_lowercase).as_deref() {
        Some("ok" | "good" | "normal") => Quality::Good,
        Some("warning" | "uncertain" | "degraded") => Quality::Uncertain,
        Some(_) => Quality::Bad,
        None => match v.as_bool() {
            Some(true) => Quality::Good,
            Some(false) => Quality::Bad,
            None => Quality::Good,
        },
    }
}

#[cfg(test)]
mod tests;
