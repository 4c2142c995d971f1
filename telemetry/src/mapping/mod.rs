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
//!
//! # Layout
//! - `mod.rs`: the file ([`Mapping`]), its topic levels and templates, what a message
//!   gave ([`Decoded`], [`Reject`], [`Rebirth`])
//! - `json/`: the `[[json]]` rules (`mod.rs`: checking and building them; `decode.rs`:
//!   reading a message's elements into samples)
//! - `sparkplug.rs`: the `[[sparkplug]]` rules and the samples their metrics become
//! - `error.rs`: why a value gave no sample

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::Value;

use crate::diag::{Collector, Diagnostics};
use crate::{EntityId, Sample, Timestamp};

mod error;
mod json;
mod sparkplug;

pub use error::SampleError;
pub use json::JsonRule;
use json::{build_rule, RawJson};
pub use sparkplug::SparkplugRule;
use sparkplug::{build_sparkplug, RawSparkplug};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMapping {
    version: toml::Spanned<i64>,
    #[serde(default)]
    json: Vec<toml::Spanned<RawJson>>,
    #[serde(default)]
    sparkplug: Vec<toml::Spanned<RawSparkplug>>,
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
/// Fills `{name}` from captures.
fn fill(template: &str, caps: &BTreeMap<String, String>) -> String {
    let mut s = template.to_string();
    for (k, v) in caps {
        s = s.replace(&format!("{{{k}}}"), v);
    }
    s
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

#[cfg(test)]
mod tests;
