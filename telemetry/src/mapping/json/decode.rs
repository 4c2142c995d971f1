//! One element of a JSON message read into samples: its entity, time and quality, then
//! each reading's value, unit and conversion. What cannot be read becomes a reject.

use std::collections::BTreeMap;

use serde_json::Value;

use super::super::error::{ElementError, TimeError};
use super::super::{Decoded, Reject};
use super::{JsonRule, Reading, UnitFrom};
use crate::metric;
use crate::units::Unit;
use crate::{EntityId, Quality, Sample, Timestamp};

/// Why part of a message gave no sample: the counter's label and the detail.
type Refused = (&'static str, String);

fn reject(out: &mut Decoded, topic: &str, (reason, detail): Refused) {
    out.rejects.push(Reject {
        reason,
        detail: format!("{topic}: {detail}"),
    })
}

impl JsonRule {
    #[allow(clippy::too_many_arguments)]
    pub(in crate::mapping) fn decode_element(
        &self,
        topic: &str,
        caps: &BTreeMap<String, String>,
        doc: &Value,
        el: &Value,
        source: &str,
        received: Timestamp,
        out: &mut Decoded,
    ) {
        let (entity, ts, quality) = match self.element_head(caps, doc, el, received) {
            Ok(head) => head,
            Err(r) => return reject(out, topic, r),
        };
        for r in &self.readings {
            let value = match r.read(doc, el) {
                Ok(v) => v,
                Err(refused) => {
                    reject(out, topic, refused);
                    continue;
                }
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

    /// What every reading of the element shares: its entity, time and quality.
    fn element_head(
        &self,
        caps: &BTreeMap<String, String>,
        doc: &Value,
        el: &Value,
        received: Timestamp,
    ) -> Result<(EntityId, Timestamp, Quality), Refused> {
        let entity = self
            .entity_for(caps, el)
            .map_err(|e| ("bad_entity", e.to_string()))?;
        let ts = match &self.timestamp {
            None => received,
            Some(p) => match el.pointer(p).or_else(|| doc.pointer(p)).map(parse_time) {
                Some(Ok(t)) => t,
                Some(Err(e)) => return Err(("bad_timestamp", e.to_string())),
                None => return Err(("missing_value", format!("no timestamp at {p}"))),
            },
        };
        let quality = self
            .quality
            .as_ref()
            .and_then(|p| el.pointer(p).or_else(|| doc.pointer(p)))
            .map_or(Quality::Good, quality_of);
        Ok((entity, ts, quality))
    }

    fn entity_for(
        &self,
        caps: &BTreeMap<String, String>,
        el: &Value,
    ) -> Result<EntityId, ElementError> {
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
                    _ => return Err(ElementError::NoValue(name.to_string())),
                }
            } else {
                caps.get(name).cloned().unwrap_or_default()
            };
            s.push_str(&v);
            rest = &rest[(j + 1).min(rest.len())..];
        }
        s.push_str(rest);
        Ok(s.parse()?)
    }
}

impl Reading {
    /// The reading's value in the metric's unit.
    fn read(&self, doc: &Value, el: &Value) -> Result<f64, Refused> {
        let v = self.number(el)?;
        let from = self.unit_from(doc, el)?;
        match (from, self.canonical) {
            (Some(f), Some(c)) => f.convert(v, &c).ok_or_else(|| {
                (
                    "unknown_unit",
                    format!(
                        "{} cannot be converted from {} to {}",
                        self.metric, f.name, c.name
                    ),
                )
            }),
            _ => Ok(v),
        }
    }

    /// The number at the reading's pointer (`""`: the element itself).
    fn number(&self, el: &Value) -> Result<f64, Refused> {
        let raw = if self.value.is_empty() {
            Some(el)
        } else {
            el.pointer(&self.value)
        };
        match raw {
            None | Some(Value::Null) => Err((
                "missing_value",
                format!("{} has no value at {:?}", self.metric, self.value),
            )),
            // a boolean is a reading only of a boolean metric (a leak detector):
            // `true` is not 1 °F
            Some(Value::Bool(b)) if self.metric.spec().is_some_and(|m| m.unit == "bool") => {
                Ok(f64::from(u8::from(*b)))
            }
            Some(Value::Bool(b)) => Err((
                "wrong_type",
                format!("{} value {b} is a boolean, not a number", self.metric),
            )),
            Some(Value::Number(n)) => Ok(n.as_f64().unwrap_or(f64::NAN)),
            // a string is a number only where the mapping says so
            Some(Value::String(s)) if self.parse_strings => s.trim().parse::<f64>().map_err(|_| {
                (
                    "not_a_number",
                    format!("{} value {s:?} is not a number", self.metric),
                )
            }),
            Some(other) => {
                let what = match other {
                    Value::String(_) => "a string (set parse_strings to read numeric strings)",
                    Value::Array(_) => "an array",
                    _ => "an object",
                };
                Err((
                    "wrong_type",
                    format!("{} value {other} is {what}, not a number", self.metric),
                ))
            }
        }
    }

    /// The unit the value is in (None: the metric has no unit to convert to).
    fn unit_from(&self, doc: &Value, el: &Value) -> Result<Option<Unit>, Refused> {
        match &self.unit {
            UnitFrom::Canonical => Ok(self.canonical),
            UnitFrom::Fixed(u) => Ok(Some(*u)),
            UnitFrom::Pointer(p) => match el
                .pointer(p)
                .or_else(|| doc.pointer(p))
                .and_then(Value::as_str)
                .map(|s| (s, Unit::parse(s)))
            {
                Some((_, Some(u))) => Ok(Some(u)),
                Some((s, None)) => Err((
                    "unknown_unit",
                    format!("{} unit {s:?} is not known", self.metric),
                )),
                None => Err((
                    "missing_value",
                    format!("{} has no unit at {p:?}", self.metric),
                )),
            },
        }
    }
}

/// RFC 3339 strings, or Unix time in seconds (or milliseconds, when larger than 1e11).
fn parse_time(v: &Value) -> Result<Timestamp, TimeError> {
    match v {
        Value::String(s) => Timestamp::parse_rfc3339(s).map_err(|source| TimeError::Rfc3339 {
            text: s.clone(),
            source,
        }),
        Value::Number(n) => {
            let x = n.as_f64().unwrap_or(f64::NAN);
            if !x.is_finite() || x < 0.0 {
                return Err(TimeError::NotATime(n.to_string()));
            }
            let ms = if x > 1e11 { x } else { x * 1000.0 };
            Ok(Timestamp(ms.round() as i64))
        }
        other => Err(TimeError::NotATime(other.to_string())),
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
