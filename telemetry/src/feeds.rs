//! Price and carbon feeds in the formats sites have: CSV with configurable columns,
//! units and local times (DST-correct, with a zone column to tell the repeated hour
//! apart), JSON (an array of objects, or parallel arrays as Energy-Charts serves), and
//! ENTSO-E day-ahead publication documents (XML). Every parser returns a [`Series`] in
//! the canonical unit (currency per kWh, or g CO2 per kWh) or an error with its line.

use std::str::FromStr;

use crate::Timestamp;
use chrono::{NaiveDateTime, TimeZone};
use chrono_tz::Tz;
use serde::Deserialize;
use thiserror::Error;

use crate::prices::Series;

#[derive(Debug, Error, PartialEq)]
pub enum FeedError {
    #[error("{file}:{line}: {message}")]
    Line {
        file: String,
        line: usize,
        message: String,
    },
    #[error("{file}:{line}: {source}")]
    Time {
        file: String,
        line: usize,
        #[source]
        source: TimeError,
    },
    #[error("{file}: {message}")]
    File { file: String, message: String },
}

/// A feed row's time that cannot be read.
#[derive(Debug, Error, PartialEq)]
pub enum TimeError {
    #[error("{naive} happens twice in {tz} and zone {zone:?} names neither ({first} or {second})")]
    NeitherZone {
        naive: NaiveDateTime,
        tz: Tz,
        zone: String,
        first: String,
        second: String,
    },
    #[error(
        "{naive} happens twice in {tz} (a DST change): give zone_column, or times with offsets"
    )]
    Twice { naive: NaiveDateTime, tz: Tz },
    #[error("{naive} does not exist in {tz} (skipped by a DST change)")]
    Skipped { naive: NaiveDateTime, tz: Tz },
    #[error("time {time:?} does not match {format:?}: {source}")]
    Format {
        time: String,
        format: String,
        #[source]
        source: chrono::ParseError,
    },
    #[error("time {time:?} is not RFC 3339: {source}")]
    Rfc3339 {
        time: String,
        #[source]
        source: chrono::ParseError,
    },
}

/// A unit name powerplane does not know.
#[derive(Debug, Error, PartialEq)]
#[error("unknown unit {0:?} (per_kwh, per_mwh, cents_per_kwh, g_per_kwh, kg_per_mwh, lb_per_mwh)")]
pub struct UnknownUnit(pub String);

/// The unit a feed's values come in; converted to per kWh (prices) or g/kWh (carbon).
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
pub enum Unit {
    /// Currency per kWh (canonical for prices).
    #[serde(rename = "per_kwh")]
    PerKwh,
    /// Currency per MWh (day-ahead markets).
    #[serde(rename = "per_mwh")]
    PerMwh,
    /// Cents per kWh.
    #[serde(rename = "cents_per_kwh")]
    CentsPerKwh,
    /// g CO2 per kWh (canonical for carbon).
    #[serde(rename = "g_per_kwh")]
    GPerKwh,
    /// kg CO2 per MWh (the same number as g/kWh).
    #[serde(rename = "kg_per_mwh")]
    KgPerMwh,
    /// lb CO2 per MWh (WattTime MOER).
    #[serde(rename = "lb_per_mwh")]
    LbPerMwh,
}

impl Unit {
    pub fn factor(self) -> f64 {
        match self {
            Unit::PerKwh | Unit::GPerKwh | Unit::KgPerMwh => 1.0,
            Unit::PerMwh => 0.001,
            Unit::CentsPerKwh => 0.01,
            // 453.59237 g per lb, per MWh = 1000 kWh
            Unit::LbPerMwh => 0.453_592_37,
        }
    }
}

impl FromStr for Unit {
    type Err = UnknownUnit;
    fn from_str(s: &str) -> Result<Self, UnknownUnit> {
        serde_json::from_value(serde_json::Value::String(s.into()))
            .map_err(|_| UnknownUnit(s.to_string()))
    }
}

/// How to read a CSV feed.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CsvFormat {
    pub time_column: String,
    pub value_column: String,
    pub unit: Unit,
    /// chrono format of naive local times (e.g. `%Y-%m-%d %H:%M:%S`); without it, times
    /// are RFC 3339 with their offset.
    #[serde(default)]
    pub time_format: Option<String>,
    /// The time zone of naive times (IANA name).
    #[serde(default)]
    pub timezone: Option<String>,
    /// A column with the zone abbreviation in force (`CET`/`CEST`), which tells the
    /// repeated hour of a DST change apart.
    #[serde(default)]
    pub zone_column: Option<String>,
    /// `,` (default) or `;`.
    #[serde(default = "comma")]
    pub delimiter: char,
    /// Numbers written `1.234,56`.
    #[serde(default)]
    pub decimal_comma: bool,
}

fn comma() -> char {
    ','
}

fn number(s: &str, decimal_comma: bool) -> Option<f64> {
    let s = s.trim().trim_matches('"');
    let v: f64 = if decimal_comma {
        s.replace('.', "").replace(',', ".").parse().ok()?
    } else {
        s.parse().ok()?
    };
    v.is_finite().then_some(v)
}

/// A naive local time in `tz`, the repeated hour of a DST change told apart by the zone
/// abbreviation when given.
fn local(tz: Tz, naive: NaiveDateTime, zone: Option<&str>) -> Result<Timestamp, TimeError> {
    use chrono::LocalResult;
    let pick = |dt: chrono::DateTime<Tz>| Timestamp::from(dt.with_timezone(&chrono::Utc));
    match tz.from_local_datetime(&naive) {
        LocalResult::Single(dt) => Ok(pick(dt)),
        LocalResult::Ambiguous(a, b) => match zone {
            Some(z) if a.offset().to_string() == z || a.format("%Z").to_string() == z => {
                Ok(pick(a))
            }
            Some(z) if b.offset().to_string() == z || b.format("%Z").to_string() == z => {
                Ok(pick(b))
            }
            Some(z) => Err(TimeError::NeitherZone {
                naive,
                tz,
                zone: z.to_string(),
                first: a.format("%Z").to_string(),
                second: b.format("%Z").to_string(),
            }),
            None => Err(TimeError::Twice { naive, tz }),
        },
        LocalResult::None => Err(TimeError::Skipped { naive, tz }),
    }
}

fn utc_of_fixed(dt: chrono::DateTime<chrono::FixedOffset>) -> Timestamp {
    Timestamp::from(dt.with_timezone(&chrono::Utc))
}

/// A CSV row's naive local time in `fmt`.
fn naive_time(t: &str, fmt: &str) -> Result<NaiveDateTime, TimeError> {
    NaiveDateTime::parse_from_str(t, fmt).map_err(|source| TimeError::Format {
        time: t.to_string(),
        format: fmt.to_string(),
        source,
    })
}

/// A CSV row's time with its offset.
fn rfc3339_time(t: &str) -> Result<Timestamp, TimeError> {
    chrono::DateTime::parse_from_rfc3339(t)
        .map(utc_of_fixed)
        .map_err(|source| TimeError::Rfc3339 {
            time: t.to_string(),
            source,
        })
}

/// The error of the time on line `line` (0-based) of `file`.
fn time_error(file: &str, line: usize) -> impl Fn(TimeError) -> FeedError + '_ {
    move |source| FeedError::Time {
        file: file.into(),
        line: line + 1,
        source,
    }
}

/// Reads a CSV feed.
pub fn parse_csv(file: &str, text: &str, f: &CsvFormat) -> Result<Series, FeedError> {
    let ferr = |message: String| FeedError::File {
        file: file.into(),
        message,
    };
    let lerr = |line: usize, message: String| FeedError::Line {
        file: file.into(),
        line: line + 1,
        message,
    };
    let tz: Option<Tz> = match &f.timezone {
        Some(z) => Some(
            z.parse()
                .map_err(|_| ferr(format!("unknown time zone {z:?}")))?,
        ),
        None => None,
    };
    if f.time_format.is_some() && tz.is_none() {
        return Err(ferr(
            "time_format gives naive local times: timezone is needed too".into(),
        ));
    }
    let delimiter = u8::try_from(f.delimiter)
        .ok()
        .filter(u8::is_ascii)
        .ok_or_else(|| {
            ferr(format!(
                "delimiter {:?} is not one ASCII character",
                f.delimiter
            ))
        })?;
    let rows = crate::csvtext::rows(text, delimiter).map_err(|e| FeedError::Line {
        file: file.into(),
        line: e.line,
        message: e.message,
    })?;
    // a quote left around a field (one not right after the delimiter) goes too
    let unquote = |c: &String| c.trim_matches('"').to_string();
    let mut rows = rows.into_iter();
    let head = rows.next().ok_or_else(|| ferr("no rows".into()))?;
    let (hl, header) = (head.line - 1, head.text);
    let cols: Vec<String> = head.fields.iter().map(unquote).collect();
    let col = |name: &str| {
        cols.iter()
            .position(|c| c == name)
            .ok_or_else(|| lerr(hl, format!("no column {name:?} in the header {header:?}")))
    };
    let (tc, vc) = (col(&f.time_column)?, col(&f.value_column)?);
    let zc = match &f.zone_column {
        Some(z) => Some(col(z)?),
        None => None,
    };
    let mut points = Vec::new();
    for row in rows {
        let i = row.line - 1;
        let c: Vec<String> = row.fields.iter().map(unquote).collect();
        let get = |k: usize| {
            c.get(k).map(String::as_str).ok_or_else(|| {
                lerr(
                    i,
                    format!("expected {} columns, got {}", cols.len(), c.len()),
                )
            })
        };
        let t = get(tc)?;
        let ts = match (&f.time_format, tz) {
            (Some(fmt), Some(tz)) => {
                let naive = naive_time(t, fmt).map_err(time_error(file, i))?;
                let zone = match zc {
                    Some(k) => Some(get(k)?),
                    None => None,
                };
                local(tz, naive, zone).map_err(time_error(file, i))?
            }
            _ => rfc3339_time(t).map_err(time_error(file, i))?,
        };
        let raw = get(vc)?;
        if raw.is_empty() {
            continue; // a gap in the source: the previous value holds
        }
        let v = number(raw, f.decimal_comma)
            .ok_or_else(|| lerr(i, format!("{:?} is not a number", raw)))?;
        points.push((ts, v * f.unit.factor()));
    }
    if points.is_empty() {
        return Err(ferr("no values".into()));
    }
    Ok(Series::new(points))
}

/// How to read a JSON feed: an array of objects, or parallel arrays.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, tag = "shape", rename_all = "snake_case")]
pub enum JsonFormat {
    /// `[{"start": "...", "price": 1.2}, ...]` at `items` (a JSON pointer; "" for the root).
    Objects {
        #[serde(default)]
        items: String,
        time_key: String,
        value_key: String,
        unit: Unit,
    },
    /// `{"unix_seconds": [...], "price": [...]}`: two arrays of the same length.
    Arrays {
        times: String,
        values: String,
        unit: Unit,
    },
}

fn json_time(v: &serde_json::Value) -> Option<Timestamp> {
    match v {
        serde_json::Value::Number(n) => n.as_f64().map(|s| Timestamp((s * 1000.0).round() as i64)),
        serde_json::Value::String(s) => chrono::DateTime::parse_from_rfc3339(s)
            .ok()
            .map(utc_of_fixed),
        _ => None,
    }
}

/// Reads a JSON feed. Times are RFC 3339 strings or Unix seconds.
pub fn parse_json(file: &str, text: &str, f: &JsonFormat) -> Result<Series, FeedError> {
    let ferr = |message: String| FeedError::File {
        file: file.into(),
        message,
    };
    let doc: serde_json::Value = serde_json::from_str(text).map_err(|e| FeedError::Line {
        file: file.into(),
        line: e.line(),
        message: e.to_string(),
    })?;
    let at = |p: &str| {
        doc.pointer(p)
            .ok_or_else(|| ferr(format!("nothing at {p:?}")))
    };
    let mut points = Vec::new();
    match f {
        JsonFormat::Objects {
            items,
            time_key,
            value_key,
            unit,
        } => {
            let arr = at(items)?
                .as_array()
                .ok_or_else(|| ferr(format!("{items:?} is not an array")))?;
            for (i, o) in arr.iter().enumerate() {
                let t = o
                    .get(time_key)
                    .and_then(json_time)
                    .ok_or_else(|| ferr(format!("item {i}: no time at {time_key:?}")))?;
                match o.get(value_key) {
                    Some(serde_json::Value::Null) | None => continue,
                    Some(v) => {
                        let v = v.as_f64().filter(|v| v.is_finite()).ok_or_else(|| {
                            ferr(format!("item {i}: {value_key:?} is not a number"))
                        })?;
                        points.push((t, v * unit.factor()));
                    }
                }
            }
        }
        JsonFormat::Arrays {
            times,
            values,
            unit,
        } => {
            let ts = at(times)?
                .as_array()
                .ok_or_else(|| ferr(format!("{times:?} is not an array")))?;
            let vs = at(values)?
                .as_array()
                .ok_or_else(|| ferr(format!("{values:?} is not an array")))?;
            if ts.len() != vs.len() {
                return Err(ferr(format!("{} times but {} values", ts.len(), vs.len())));
            }
            for (i, (t, v)) in ts.iter().zip(vs).enumerate() {
                let t = json_time(t).ok_or_else(|| {
                    ferr(format!("time {i} is neither RFC 3339 nor Unix seconds"))
                })?;
                if v.is_null() {
                    continue;
                }
                let v = v
                    .as_f64()
                    .filter(|v| v.is_finite())
                    .ok_or_else(|| ferr(format!("value {i} is not a number")))?;
                points.push((t, v * unit.factor()));
            }
        }
    }
    if points.is_empty() {
        return Err(ferr("no values".into()));
    }
    Ok(Series::new(points))
}

/// Reads an ENTSO-E day-ahead publication document (`Publication_MarketDocument`,
/// A44): every `TimeSeries/Period` with its start, resolution (`PT15M`, `PT30M`,
/// `PT60M`) and `Point`s (`position`, `price.amount` in currency per MWh). A point left
/// out (curve type A03) holds the previous price. Prices come out per kWh. The document
/// is read as XML: elements by their local name in any namespace (prefixed or not),
/// attributes, comments, CDATA and whitespace anywhere XML allows them.
pub fn parse_entsoe(file: &str, text: &str) -> Result<Series, FeedError> {
    let ferr = |message: String| FeedError::File {
        file: file.into(),
        message,
    };
    let not_a44 = || ferr("not an ENTSO-E Publication_MarketDocument".into());
    let doc = match roxmltree::Document::parse(text) {
        Ok(doc) => doc,
        Err(_) if !text.contains("Publication_MarketDocument") => return Err(not_a44()),
        Err(e) => {
            return Err(FeedError::Line {
                file: file.into(),
                line: e.pos().row as usize,
                message: format!("not well-formed XML: {e}"),
            })
        }
    };
    if doc.root_element().tag_name().name() != "Publication_MarketDocument" {
        return Err(not_a44());
    }
    let mut points = Vec::new();
    let mut periods = 0;
    for period in doc.descendants().filter(|n| is(n, "Period")) {
        periods += 1;
        let start = tag(period, "start")
            .ok_or_else(|| ferr(format!("period {periods}: no timeInterval start")))?;
        let end = tag(period, "end");
        let start = parse_entsoe_time(&start)
            .ok_or_else(|| ferr(format!("period {periods}: bad start {start:?}")))?;
        let end = end.as_deref().and_then(parse_entsoe_time);
        let res = tag(period, "resolution")
            .ok_or_else(|| ferr(format!("period {periods}: no resolution")))?;
        let step_s = match res.as_str() {
            "PT15M" => 900.0,
            "PT30M" => 1800.0,
            "PT60M" | "PT1H" => 3600.0,
            other => {
                return Err(ferr(format!(
                    "period {periods}: unsupported resolution {other:?}"
                )))
            }
        };
        let mut pts: Vec<(u32, f64)> = Vec::new();
        for point in period.descendants().filter(|n| is(n, "Point")) {
            let pos: u32 = tag(point, "position")
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| ferr(format!("period {periods}: a point without a position")))?;
            let amount = tag(point, "price.amount")
                .and_then(|s| s.parse::<f64>().ok())
                .filter(|v| v.is_finite())
                .ok_or_else(|| {
                    ferr(format!(
                        "period {periods}: point {pos} without a price.amount"
                    ))
                })?;
            if pos == 0 {
                return Err(ferr(format!("period {periods}: positions start at 1")));
            }
            pts.push((pos, amount));
        }
        pts.sort_by_key(|p| p.0);
        // positions left out repeat the previous price (A03): a step series holds it
        // by itself; only the last one before `end` needs nothing either
        for (pos, amount) in &pts {
            let t = start.plus_secs(step_s * f64::from(pos - 1));
            if end.is_some_and(|e| t >= e) {
                return Err(ferr(format!(
                    "period {periods}: position {pos} lies after the period's end"
                )));
            }
            points.push((t, amount * Unit::PerMwh.factor()));
        }
    }
    if points.is_empty() {
        return Err(ferr("no <Period> with points".into()));
    }
    Ok(Series::new(points))
}

/// An element of local name `name`, in whichever namespace.
fn is(n: &roxmltree::Node<'_, '_>, name: &str) -> bool {
    n.is_element() && n.tag_name().name() == name
}

/// The trimmed text of the first element `name` within `node` (as ENTSO-E nests it:
/// `timeInterval/start` of a period, `position` of a point).
fn tag(node: roxmltree::Node<'_, '_>, name: &str) -> Option<String> {
    let e = node.descendants().skip(1).find(|n| is(n, name))?;
    let text: String = e
        .children()
        .filter(|c| c.is_text())
        .filter_map(|c| c.text())
        .collect();
    Some(text.trim().to_string())
}

/// `2024-10-26T22:00Z` (ENTSO-E leaves out the seconds) or RFC 3339.
fn parse_entsoe_time(s: &str) -> Option<Timestamp> {
    chrono::DateTime::parse_from_rfc3339(s)
        .ok()
        .map(utc_of_fixed)
        .or_else(|| {
            NaiveDateTime::parse_from_str(s, "%Y-%m-%dT%H:%MZ")
                .ok()
                .map(|n| Timestamp::from(n.and_utc()))
        })
}

#[cfg(test)]
#[path = "feeds_tests.rs"]
mod tests;
