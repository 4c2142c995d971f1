//! What an OpenADR 3 VTN sends, read leniently (JSON, names as the 3.0 and 3.1
//! schemas spell them; fields it does not use are passed over) and checked strictly
//! where it matters: a value that is no number, a time that is no RFC 3339 time, a
//! duration that is no ISO 8601 duration each refuse the interval or the event, by
//! name, and never the rest of the list.
//!
//! Pure: the task ([`super::ven`]) hands in bodies and gets values back.

use std::collections::BTreeMap;

use serde_json::Value;
use telemetry::grid::{GridInterval, GridTarget};
use telemetry::Timestamp;
use thiserror::Error;

use crate::openadr2b::iso;

/// The most intervals read of one event; beyond, the event is refused
/// (`too_many_intervals`): two weeks of 10-minute intervals.
pub const MAX_INTERVALS: usize = 2_016;

/// What OpenADR 3 writes for "no end" (`P9999Y`), taken as ten years.
pub const ENDLESS_S: f64 = 10.0 * 365.0 * 86_400.0;

/// Why a body was refused as a whole (`reason` label of
/// `openadr_payloads_rejected_total`).
#[derive(Debug, Clone, PartialEq, Error)]
pub enum ParseError {
    #[error("not JSON: {0}")]
    Json(String),
    #[error("expected {0}")]
    Shape(&'static str),
}

impl ParseError {
    pub fn reason(&self) -> &'static str {
        match self {
            ParseError::Json(_) => "json",
            ParseError::Shape(_) => "shape",
        }
    }
}

fn json(body: &[u8]) -> Result<Value, ParseError> {
    serde_json::from_slice(body).map_err(|e| ParseError::Json(e.to_string()))
}

fn list(body: &[u8], what: &'static str) -> Result<Vec<Value>, ParseError> {
    match json(body)? {
        Value::Array(a) => Ok(a),
        _ => Err(ParseError::Shape(what)),
    }
}

fn text<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v.get(key).and_then(Value::as_str)
}

/// An access token and how long it lasts.
#[derive(Debug, Clone, PartialEq)]
pub struct Token {
    pub access_token: String,
    /// Seconds, as the token endpoint said (`expires_in`).
    pub expires_in_s: Option<f64>,
}

/// The token endpoint's answer (RFC 6749 §5.1).
pub fn token(body: &[u8]) -> Result<Token, ParseError> {
    let v = json(body)?;
    let access_token = text(&v, "access_token")
        .filter(|t| !t.is_empty())
        .ok_or(ParseError::Shape("an object with access_token"))?
        .to_string();
    let expires_in_s = v
        .get("expires_in")
        .and_then(|e| e.as_f64().or_else(|| e.as_str()?.parse().ok()))
        .filter(|s| s.is_finite() && *s > 0.0);
    Ok(Token {
        access_token,
        expires_in_s,
    })
}

/// `GET /auth/server`: the token endpoint the VTN names.
pub fn token_url(body: &[u8]) -> Result<String, ParseError> {
    let v = json(body)?;
    text(&v, "tokenURL")
        .map(str::to_string)
        .ok_or(ParseError::Shape("an object with tokenURL"))
}

/// The id of the VEN object named `ven_name` in a `GET /vens` answer (a list), or of
/// the one object a `POST /vens` answered with.
pub fn ven_id(body: &[u8], ven_name: &str) -> Result<Option<String>, ParseError> {
    let v = json(body)?;
    let named = |o: &Value| text(o, "venName") == Some(ven_name);
    let found = match &v {
        Value::Array(a) => a.iter().find(|o| named(o)),
        Value::Object(_) => Some(&v).filter(|o| named(o)),
        _ => return Err(ParseError::Shape("a VEN object or a list of them")),
    };
    Ok(found.and_then(|o| text(o, "id")).map(str::to_string))
}

/// `GET /programs`: (id, programName) of each program (those without an id passed
/// over).
pub fn programs(list: &[Value]) -> Vec<(String, String)> {
    list.iter()
        .filter_map(|p| {
            let id = text(p, "id")?;
            Some((
                id.to_string(),
                text(p, "programName").unwrap_or(id).to_string(),
            ))
        })
        .collect()
}

/// What an event asks to be reported, of what the VEN can measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReportKind {
    /// `READING` or `DEMAND`: the power at the meter, kW.
    Power(&'static str),
    /// `USAGE`: the energy at the meter over the reporting interval, kWh.
    Usage,
}

impl ReportKind {
    pub fn payload_type(&self) -> &'static str {
        match self {
            ReportKind::Power(t) => t,
            ReportKind::Usage => "USAGE",
        }
    }
}

/// One event as the VEN reads it.
#[derive(Debug, Clone, PartialEq)]
pub struct WireEvent {
    pub id: String,
    pub program_id: String,
    pub name: String,
    /// `modificationDateTime` (empty where the VTN gives none): a new one is a new
    /// version of the event.
    pub modified: String,
    pub intervals: Vec<GridInterval>,
    /// What it asks to be reported (those the VEN can measure).
    pub reports: Vec<ReportKind>,
    /// Why parts of it were passed over (payloads, intervals, report descriptors).
    pub skipped: Vec<&'static str>,
}

/// An event of the list that could not be read, and why (`reason` label).
#[derive(Debug, Clone, PartialEq)]
pub struct Refused {
    pub id: Option<String>,
    pub reason: &'static str,
}

/// `GET /events`: each event read or refused. `first_seen(id)` is when the VEN first
/// saw an event: OpenADR 3's start `0001-01-01T00:00:00Z` means "now", held from then.
pub fn events(
    body: &[u8],
    first_seen: &dyn Fn(&str) -> Timestamp,
) -> Result<Vec<Result<WireEvent, Refused>>, ParseError> {
    Ok(list(body, "a list of events")?
        .iter()
        .map(|e| event(e, first_seen))
        .collect())
}

/// One event.
pub fn event(e: &Value, first_seen: &dyn Fn(&str) -> Timestamp) -> Result<WireEvent, Refused> {
    let id = text(e, "id").filter(|s| !s.is_empty());
    let refuse = |reason| Refused {
        id: id.map(str::to_string),
        reason,
    };
    let id = id.ok_or_else(|| refuse("no_id"))?;
    let program_id = text(e, "programID").ok_or_else(|| refuse("no_program"))?;
    let mut skipped = Vec::new();
    let units: BTreeMap<&str, &str> = e
        .get("payloadDescriptors")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|d| Some((text(d, "payloadType")?, text(d, "units")?)))
        .collect();
    let default = match e.get("intervalPeriod") {
        None | Some(Value::Null) => Period::default(),
        Some(p) => period(p, first_seen(id)).map_err(refuse)?,
    };
    let mut raw: Vec<&Value> = match e.get("intervals") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(a)) => a.iter().collect(),
        Some(_) => return Err(refuse("intervals")),
    };
    if raw.len() > MAX_INTERVALS {
        return Err(refuse("too_many_intervals"));
    }
    // intervals follow one another in the order of their ids
    raw.sort_by_key(|i| i.get("id").and_then(Value::as_i64).unwrap_or(i64::MAX));
    let event_duration = text(e, "duration").map(duration_s);
    let mut cursor = default.start;
    let mut intervals = Vec::new();
    for iv in raw {
        let own = match iv.get("intervalPeriod") {
            None | Some(Value::Null) => Period::default(),
            Some(p) => period(p, first_seen(id)).map_err(refuse)?,
        };
        let Some(start) = own.start.or(cursor) else {
            skipped.push("no_start");
            continue;
        };
        let duration = own
            .duration
            .or(default.duration)
            .or(event_duration.flatten());
        let Some(duration_s) = duration else {
            skipped.push("no_duration");
            continue;
        };
        cursor = Some(start.plus_secs(duration_s));
        match target(iv, &units) {
            Ok(target) => intervals.push(GridInterval {
                start,
                duration_s,
                target,
            }),
            Err(why) => skipped.push(why),
        }
    }
    let reports = report_kinds(e, &mut skipped);
    Ok(WireEvent {
        id: id.to_string(),
        program_id: program_id.to_string(),
        name: text(e, "eventName").unwrap_or_default().to_string(),
        modified: text(e, "modificationDateTime")
            .unwrap_or_default()
            .to_string(),
        intervals,
        reports,
        skipped,
    })
}

#[derive(Debug, Default, Clone, Copy)]
struct Period {
    start: Option<Timestamp>,
    duration: Option<f64>,
}

/// An `intervalPeriod`: `start` (RFC 3339; the year 1 means "now", `now`) and
/// `duration` (ISO 8601; `P9999Y`: no end).
fn period(p: &Value, now: Timestamp) -> Result<Period, &'static str> {
    let start = match text(p, "start") {
        None => None,
        Some(s) if s.starts_with("0001-01-01") => Some(now),
        Some(s) => Some(iso::parse_datetime(s).ok_or("bad_start")?),
    };
    let duration = match text(p, "duration") {
        None => None,
        Some(d) => Some(duration_s(d).ok_or("bad_duration")?),
    };
    Ok(Period { start, duration })
}

/// An ISO 8601 duration in seconds, as OpenADR 3 VTNs write them (`PT10M`, and the
/// full `P0Y0M0DT0H10M0S`); `P9999Y` (no end) is [`ENDLESS_S`]. A year is taken as
/// 365 days and a month as 30 (a VTN that means calendar months in an event's
/// duration is rare; the interval ends by then either way). Negative durations are
/// refused.
pub fn duration_s(d: &str) -> Option<f64> {
    if d.trim() == "P9999Y" {
        return Some(ENDLESS_S);
    }
    iso::parse_duration_calendar(d)
        .filter(|s| *s >= 0.0 && s.is_finite())
        .map(|s| s.min(ENDLESS_S))
}

/// What one interval asks: the first payload the VEN understands, or why none was.
fn target(iv: &Value, units: &BTreeMap<&str, &str>) -> Result<GridTarget, &'static str> {
    let payloads = iv.get("payloads").and_then(Value::as_array);
    let mut why = "no_payload";
    for p in payloads.into_iter().flatten() {
        let Some(kind) = text(p, "type") else {
            continue;
        };
        if !matches!(
            kind,
            "SIMPLE" | "IMPORT_CAPACITY_LIMIT" | "DISPATCH_SETPOINT" | "DISPATCH_SETPOINT_RELATIVE"
        ) {
            why = "payload_type";
            continue;
        }
        let value = p
            .get("values")
            .and_then(Value::as_array)
            .and_then(|v| v.first());
        let number = value.and_then(Value::as_f64).filter(|v| v.is_finite());
        let scale = match units.get(kind).copied() {
            None | Some("KW") => Some(1000.0),
            Some("W") => Some(1.0),
            Some("MW") => Some(1.0e6),
            Some("PERCENT") => None,
            Some(_) => {
                why = "units";
                continue;
            }
        };
        let t = match (kind, number, scale) {
            (_, None, _) => {
                why = "value";
                continue;
            }
            ("SIMPLE", Some(v), _) => {
                if v.fract() != 0.0 || !(0.0..=3.0).contains(&v) {
                    why = "simple_level";
                    continue;
                }
                GridTarget::Level(v as u8)
            }
            ("IMPORT_CAPACITY_LIMIT" | "DISPATCH_SETPOINT", Some(v), Some(k)) if v >= 0.0 => {
                GridTarget::CapW(v * k)
            }
            ("DISPATCH_SETPOINT_RELATIVE", Some(v), scale) => {
                if v >= 0.0 {
                    // a request to draw as much or more asks nothing of a shed
                    why = "increase";
                    continue;
                }
                match scale {
                    Some(k) => GridTarget::ShedW(-v * k),
                    None => GridTarget::ShedFraction((-v / 100.0).min(1.0)),
                }
            }
            _ => {
                why = "value";
                continue;
            }
        };
        return Ok(t);
    }
    Err(why)
}

/// The report descriptors the VEN can answer; the others are named in `skipped`.
fn report_kinds(e: &Value, skipped: &mut Vec<&'static str>) -> Vec<ReportKind> {
    let mut out = Vec::new();
    for d in e
        .get("reportDescriptors")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let kind = match text(d, "payloadType") {
            Some("READING") => ReportKind::Power("READING"),
            Some("DEMAND") => ReportKind::Power("DEMAND"),
            Some("USAGE") => ReportKind::Usage,
            _ => {
                skipped.push("report_type");
                continue;
            }
        };
        if !out.contains(&kind) {
            out.push(kind);
        }
    }
    out
}

#[cfg(test)]
#[path = "parse_tests.rs"]
mod tests;
