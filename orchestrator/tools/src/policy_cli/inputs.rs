//! The input files of `policy explain`, `policy diff` and `policy test`: snapshots, jobs,
//! prior state and forecasts, each read with its problems as `file:line:col: message`
//! (TOML) or `file: where: message` (JSON).

mod jobs;
#[cfg(test)]
mod tests;

pub use jobs::{jobs_file, RawJob};

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

use policies::{Forecast, State, StepSeries};
use serde::Deserialize;
use telemetry::diag::line_col;
use telemetry::metric::names::{CARBON_G_PER_KWH, PRICE_PER_KWH};
use telemetry::{EntityId, Quality, Sample, Site, Snapshot, Timestamp};

/// Problems found in input files, one per line.
pub type Problems = Vec<String>;

/// What is wrong with one value of an input (a time, an entity, a reading, a
/// forecast point, a job), as the CLI shows it.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum InputError {
    #[error("{0:?} is not a duration (e.g. +30s, 5m, -1h30m)")]
    NotADuration(String),
    #[error("{0:?}: a number without a unit after another one (e.g. 1h30m)")]
    NoUnit(String),
    #[error("{0:?} is neither RFC 3339 (2026-11-30T12:00:00Z) nor an offset (+30s)")]
    NotATime(String),
    #[error("{0:?} matches no entity of the site")]
    NoMatch(String),
    /// Not an entity id (the id parser's message).
    #[error(transparent)]
    NotAnId(#[from] telemetry::entity::EntityError),
    #[error("{id} is not an entity of the site {site:?}")]
    NotInSite { id: EntityId, site: String },
    #[error("{entity} {metric}: value is missing")]
    NoValue { entity: String, metric: String },
    #[error("unknown metric {metric:?} (known: {known})")]
    UnknownMetric { metric: String, known: String },
    #[error("give age_s or time, not both")]
    AgeAndTime,
    #[error("time {time:?}: {source} (use RFC 3339)")]
    ReadingTime {
        time: String,
        #[source]
        source: chrono::ParseError,
    },
    #[error("age_s must be 0 or more, got {0}")]
    NegativeAge(f64),
    #[error("{series}[{index}]: {source}")]
    PointTime {
        series: &'static str,
        index: usize,
        #[source]
        source: Box<InputError>,
    },
    #[error("{series}[{index}]: value must be a finite number")]
    PointValue { series: &'static str, index: usize },
    #[error("a job needs a non-empty id")]
    NoJobId,
    #[error("job {job}: {field}: {source}")]
    JobTime {
        job: String,
        field: &'static str,
        #[source]
        source: Box<InputError>,
    },
    #[error("job {job}: allocated: {source}")]
    Allocated {
        job: String,
        #[source]
        source: Box<InputError>,
    },
    #[error("job {job}: allocated: {id} is not a GPU")]
    NotAGpu { job: String, id: EntityId },
    #[error("job {0}: est_duration_s must be 0 or more")]
    Duration(String),
}

/// A file that cannot be read: `file: cannot read: why`.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{file}: cannot read: {source}")]
pub struct ReadError {
    pub file: String,
    /// Shared, so that a policy that failed to load can be told to every case naming it.
    #[source]
    pub source: Arc<std::io::Error>,
}

impl From<ReadError> for Problems {
    fn from(e: ReadError) -> Problems {
        vec![e.to_string()]
    }
}

/// Reads a file: its name and its text.
pub fn read(path: &Path) -> Result<(String, String), ReadError> {
    let file = path.display().to_string();
    match std::fs::read_to_string(path) {
        Ok(t) => Ok((file, t)),
        Err(e) => Err(ReadError {
            file,
            source: Arc::new(e),
        }),
    }
}

/// Whether a file is JSON (by its extension); everything else is TOML.
pub fn is_json(name: &str) -> bool {
    name.to_ascii_lowercase().ends_with(".json")
}

/// Where a problem sits: a byte span (TOML) or a path inside the document (JSON).
#[derive(Debug, Clone)]
pub enum Pos {
    Span(Range<usize>),
    Path(String),
}

/// Formats a problem at a position of a file.
pub fn at(file: &str, src: &str, pos: &Pos, msg: &str) -> String {
    match pos {
        Pos::Span(s) => {
            let (l, c) = line_col(src, s.start);
            format!("{file}:{l}:{c}: {msg}")
        }
        Pos::Path(p) if p.is_empty() => format!("{file}: {msg}"),
        Pos::Path(p) => format!("{file}: {p}: {msg}"),
    }
}

/// A TOML or JSON syntax or type error with its position.
pub fn toml_error(file: &str, src: &str, e: &toml::de::Error) -> String {
    telemetry::diag::from_toml_error(file, src, e).to_string()
}

pub fn json_error(file: &str, e: &serde_json::Error) -> String {
    format!("{file}:{}:{}: {e}", e.line(), e.column())
        .replace(&format!(" at line {} column {}", e.line(), e.column()), "")
}

/// Seconds from a duration such as `30s`, `+5m`, `-1h30m`, `2d` or `90` (seconds).
pub fn parse_offset(s: &str) -> Result<f64, InputError> {
    let t = s.trim();
    let (sign, body) = match t.as_bytes().first() {
        Some(b'+') => (1.0, &t[1..]),
        Some(b'-') => (-1.0, &t[1..]),
        _ => (1.0, t),
    };
    if body.is_empty() {
        return Err(InputError::NotADuration(s.to_string()));
    }
    if let Ok(v) = body.parse::<f64>() {
        return Ok(sign * v);
    }
    let mut total = 0.0;
    let mut num = String::new();
    for ch in body.chars() {
        if ch.is_ascii_digit() || ch == '.' {
            num.push(ch);
            continue;
        }
        let unit = match ch {
            's' => 1.0,
            'm' => 60.0,
            'h' => 3600.0,
            'd' => 86_400.0,
            _ => return Err(InputError::NotADuration(s.to_string())),
        };
        let v: f64 = num
            .parse()
            .map_err(|_| InputError::NotADuration(s.to_string()))?;
        total += v * unit;
        num.clear();
    }
    if !num.is_empty() {
        return Err(InputError::NoUnit(s.to_string()));
    }
    Ok(sign * total)
}

/// An instant: RFC 3339, or an offset (`+30s`, `-1h`) from `base`.
pub fn parse_time(s: &str, base: Timestamp) -> Result<Timestamp, InputError> {
    if let Ok(t) = Timestamp::parse_rfc3339(s.trim()) {
        return Ok(t);
    }
    parse_offset(s)
        .map(|d| base.plus_secs(d))
        .map_err(|_| InputError::NotATime(s.to_string()))
}

/// Matches `pattern` (with `*` for any run of characters) against `text`.
pub fn glob(pattern: &str, text: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let t: Vec<char> = text.chars().collect();
    let (mut pi, mut ti) = (0, 0);
    let (mut star, mut mark) = (None, 0);
    while ti < t.len() {
        if pi < p.len() && p[pi] != '*' && p[pi] == t[ti] {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some(pi);
            mark = ti;
            pi += 1;
        } else if let Some(s) = star {
            pi = s + 1;
            mark += 1;
            ti = mark;
        } else {
            return false;
        }
    }
    while pi < p.len() && p[pi] == '*' {
        pi += 1;
    }
    pi == p.len()
}

/// The site's entities, to resolve ids and patterns against (built once per input).
pub struct Names<'a> {
    pub site: &'a Site,
    all: std::collections::BTreeSet<EntityId>,
}

impl<'a> Names<'a> {
    pub fn new(site: &'a Site) -> Self {
        Names {
            site,
            all: site.entities(),
        }
    }

    /// The site's entities an id or pattern names (`rack/a01`, `gpu/a01-*`, `gpu/*`).
    pub fn resolve(&self, pattern: &str) -> Result<Vec<EntityId>, InputError> {
        if pattern.contains('*') {
            let found: Vec<EntityId> = self
                .all
                .iter()
                .filter(|e| glob(pattern, &e.to_string()))
                .cloned()
                .collect();
            if found.is_empty() {
                return Err(InputError::NoMatch(pattern.to_string()));
            }
            return Ok(found);
        }
        let id: EntityId = pattern.parse().map_err(InputError::NotAnId)?;
        if !self.all.contains(&id) {
            return Err(InputError::NotInSite {
                id,
                site: self.site.name.clone(),
            });
        }
        Ok(vec![id])
    }
}

/// One reading as written in a snapshot file or a test tick.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawReading {
    /// An entity id or a pattern with `*`.
    pub entity: String,
    pub metric: String,
    #[serde(default)]
    pub value: Option<f64>,
    /// How long before the evaluation time it was read (default 0).
    #[serde(default)]
    pub age_s: Option<f64>,
    /// Or when it was read (RFC 3339).
    #[serde(default)]
    pub time: Option<String>,
    #[serde(default)]
    pub quality: Option<Quality>,
    #[serde(default)]
    pub source: Option<String>,
    /// In tests: the source stops reporting; the last value stays and ages.
    #[serde(default)]
    pub stop: bool,
}

impl RawReading {
    /// The samples this reading stands for at `now`.
    pub fn samples(
        &self,
        names: &Names<'_>,
        now: Timestamp,
        source: &str,
    ) -> Result<Vec<Sample>, InputError> {
        let value = self.value.ok_or_else(|| InputError::NoValue {
            entity: self.entity.clone(),
            metric: self.metric.clone(),
        })?;
        let spec =
            telemetry::metric::spec(&self.metric).ok_or_else(|| InputError::UnknownMetric {
                metric: self.metric.clone(),
                known: telemetry::metric::all()
                    .iter()
                    .map(|m| m.name)
                    .collect::<Vec<_>>()
                    .join(", "),
            })?;
        let ts = match (&self.time, self.age_s) {
            (Some(_), Some(_)) => return Err(InputError::AgeAndTime),
            (Some(t), None) => {
                Timestamp::parse_rfc3339(t).map_err(|source| InputError::ReadingTime {
                    time: t.clone(),
                    source,
                })?
            }
            (None, Some(a)) if !(a.is_finite() && a >= 0.0) => {
                return Err(InputError::NegativeAge(a))
            }
            (None, a) => now.plus_secs(-a.unwrap_or(0.0)),
        };
        let ids = names.resolve(&self.entity)?;
        let mut out = Vec::with_capacity(ids.len());
        for id in ids {
            let mut s = Sample::new(
                id,
                spec.name,
                value,
                ts,
                self.source.as_deref().unwrap_or(source),
            );
            s.quality = self.quality.unwrap_or(Quality::Good);
            out.push(s);
        }
        Ok(out)
    }
}

/// A forecast point: `{ at = "+1h", value = 0.31 }` (an offset or RFC 3339).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPoint {
    pub at: String,
    pub value: f64,
}

/// Inline forecast series.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawForecast {
    #[serde(default)]
    pub price: Vec<RawPoint>,
    #[serde(default)]
    pub carbon: Vec<RawPoint>,
    /// How long the last point holds (default 3600).
    #[serde(default)]
    pub last_step_s: Option<f64>,
    /// The feed behind it failed to refresh.
    #[serde(default)]
    pub stale: bool,
}

impl RawForecast {
    pub fn forecast(&self, now: Timestamp) -> Result<Forecast, InputError> {
        let series = |pts: &[RawPoint], what: &'static str| -> Result<StepSeries, InputError> {
            let mut v = Vec::new();
            for (i, p) in pts.iter().enumerate() {
                let t = parse_time(&p.at, now).map_err(|e| InputError::PointTime {
                    series: what,
                    index: i,
                    source: Box::new(e),
                })?;
                if !p.value.is_finite() {
                    return Err(InputError::PointValue {
                        series: what,
                        index: i,
                    });
                }
                v.push((t, p.value));
            }
            Ok(StepSeries::new(v, self.last_step_s.unwrap_or(3600.0)))
        };
        Ok(Forecast {
            price: series(&self.price, "price")?,
            carbon: series(&self.carbon, "carbon")?,
            stale: self.stale,
        })
    }
}

/// Adds the forecast's price and carbon at `now` to the snapshot as the site's
/// readings, as `serve` does with its feed, except the metrics in `own` (the inputs
/// give those themselves).
pub fn signals_from_forecast(
    site: &Site,
    snapshot: &mut Snapshot,
    forecast: &Forecast,
    now: Timestamp,
    own: &[&str],
) {
    let id = site.site_entity();
    for (metric, series) in [
        (PRICE_PER_KWH, &forecast.price),
        (CARBON_G_PER_KWH, &forecast.carbon),
    ] {
        if own.contains(&metric) {
            continue;
        }
        if let Some(v) = series.at(now) {
            let mut s = Sample::new(id.clone(), metric, v, now, "forecast");
            if forecast.stale {
                s.quality = Quality::Uncertain;
            }
            let _ = snapshot.ingest(s, now);
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSnapshotToml {
    #[serde(default)]
    at: Option<toml::Spanned<String>>,
    #[serde(default)]
    readings: Vec<toml::Spanned<RawReading>>,
    #[serde(default)]
    freshness: BTreeMap<String, f64>,
    #[serde(default)]
    forecast: Option<toml::Spanned<RawForecast>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSnapshotJson {
    #[serde(default)]
    at: Option<String>,
    #[serde(default)]
    readings: Vec<RawReading>,
    #[serde(default)]
    freshness: BTreeMap<String, f64>,
    #[serde(default)]
    forecast: Option<RawForecast>,
}

/// A snapshot file, read but not yet placed in time.
pub struct SnapshotFile {
    file: String,
    src: String,
    pub at: Option<(Pos, String)>,
    readings: Vec<(Pos, RawReading)>,
    freshness: BTreeMap<String, f64>,
    forecast: Option<(Pos, RawForecast)>,
}

impl SnapshotFile {
    pub fn parse(file: &str, src: &str) -> Result<Self, Problems> {
        if is_json(file) {
            let raw: RawSnapshotJson =
                serde_json::from_str(src).map_err(|e| vec![json_error(file, &e)])?;
            Ok(SnapshotFile {
                file: file.into(),
                src: src.into(),
                at: raw.at.map(|a| (Pos::Path("at".into()), a)),
                readings: raw
                    .readings
                    .into_iter()
                    .enumerate()
                    .map(|(i, r)| (Pos::Path(format!("readings[{i}]")), r))
                    .collect(),
                freshness: raw.freshness,
                forecast: raw.forecast.map(|f| (Pos::Path("forecast".into()), f)),
            })
        } else {
            let raw: RawSnapshotToml =
                toml::from_str(src).map_err(|e| vec![toml_error(file, src, &e)])?;
            let span = |s: Range<usize>| Pos::Span(s);
            Ok(SnapshotFile {
                file: file.into(),
                src: src.into(),
                at: raw.at.map(|a| (span(a.span()), a.into_inner())),
                readings: raw
                    .readings
                    .into_iter()
                    .map(|r| (span(r.span()), r.into_inner()))
                    .collect(),
                freshness: raw.freshness,
                forecast: raw.forecast.map(|f| (span(f.span()), f.into_inner())),
            })
        }
    }

    /// The time the file names, if any.
    pub fn time(&self) -> Result<Option<Timestamp>, Problems> {
        match &self.at {
            None => Ok(None),
            Some((pos, s)) => Timestamp::parse_rfc3339(s).map(Some).map_err(|e| {
                vec![at(
                    &self.file,
                    &self.src,
                    pos,
                    &format!("at {s:?}: {e} (use RFC 3339)"),
                )]
            }),
        }
    }

    /// The snapshot and forecast as seen at `now`; every problem at once.
    pub fn build(&self, site: &Site, now: Timestamp) -> Result<(Snapshot, Forecast), Problems> {
        let mut problems = Vec::new();
        let mut snap = Snapshot::new();
        for (m, s) in &self.freshness {
            if telemetry::metric::spec(m).is_none() || !(s.is_finite() && *s > 0.0) {
                problems.push(format!(
                    "{}: freshness.{m}: needs a known metric and a positive number of seconds",
                    self.file
                ));
            }
            snap.set_freshness(m, *s);
        }
        // a later reading of the same entity and metric replaces an earlier one (a
        // pattern first, then the exceptions), whatever their ages
        let mut latest: BTreeMap<(EntityId, String), (Sample, &Pos)> = BTreeMap::new();
        let names = Names::new(site);
        for (pos, r) in &self.readings {
            match r.samples(&names, now, &self.file) {
                Ok(samples) => {
                    for s in samples {
                        latest.insert((s.entity.clone(), s.metric.as_str().to_string()), (s, pos));
                    }
                }
                Err(e) => problems.push(at(&self.file, &self.src, pos, &e.to_string())),
            }
        }
        let mut bad: Vec<&Pos> = Vec::new();
        for (s, pos) in latest.into_values() {
            if let Err(e) = snap.ingest(s, now) {
                // one problem per reading, not one per entity its pattern names
                if !bad.iter().any(|b| std::ptr::eq(*b, pos)) {
                    problems.push(at(&self.file, &self.src, pos, &e.to_string()));
                    bad.push(pos);
                }
            }
        }
        let forecast = match &self.forecast {
            Some((pos, f)) => match f.forecast(now) {
                Ok(f) => f,
                Err(e) => {
                    problems.push(at(&self.file, &self.src, pos, &format!("forecast: {e}")));
                    Forecast::default()
                }
            },
            None => Forecast::default(),
        };
        if problems.is_empty() {
            Ok((snap, forecast))
        } else {
            Err(problems)
        }
    }
}

/// Prior state: the engine's state as JSON (`{"caps": ..., "holds": ..., "thermal":
/// ...}`), or the output of `policy explain --format json` (its `state`).
pub fn state_file(file: &str, src: &str) -> Result<State, Problems> {
    let v: serde_json::Value = serde_json::from_str(src).map_err(|e| vec![json_error(file, &e)])?;
    let mut v = match v.get("state") {
        Some(s) if v.get("decisions").is_some() => s.clone(),
        _ => v,
    };
    // a part of it will do (`/api/v1/holds` gives holds and observed_holds)
    if let Some(m) = v.as_object_mut() {
        for k in ["caps", "holds", "thermal"] {
            m.entry(k).or_insert_with(|| serde_json::json!({}));
        }
    }
    serde_json::from_value(v).map_err(|e| vec![format!("{file}: not a state: {e}")])
}

/// A price CSV as `serve` reads it (`start,price_per_kwh[,carbon_g_per_kwh]`).
pub fn prices_file(file: &str, src: &str) -> Result<Forecast, Problems> {
    use telemetry::prices::Series;
    let price = Series::from_csv(file, src, "price_per_kwh").map_err(|e| vec![e.to_string()])?;
    let carbon = Series::from_csv(file, src, "carbon_g_per_kwh").unwrap_or_default();
    let step = |s: &Series| {
        let p = s.points();
        match p.len() {
            n if n >= 2 => p[n - 1].0.secs_since(p[n - 2].0),
            _ => 3600.0,
        }
    };
    Ok(Forecast {
        price: StepSeries::new(price.points().to_vec(), step(&price)),
        carbon: StepSeries::new(carbon.points().to_vec(), step(&carbon)),
        stale: false,
    })
}
