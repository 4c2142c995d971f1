//! `powerplane policy test`: test files of cases, each a sequence of ticks with
//! readings, jobs and forecasts, and expectations after any tick; the engine's state
//! carries from tick to tick, so durations and hysteresis can be tested.
//!
//! ```toml
//! site = "../../demo/site.toml"
//! policy = "../thermal.toml"
//!
//! [[case]]
//! name = "a hot rack is capped one step"
//! [[case.tick]]
//! at = "+0s"
//! readings = [{ entity = "rack/a01", metric = "inlet_temp_c", value = 33.5 }]
//! expect.caps = [{ rack = "a01", max_watts = 270 }]
//! ```

use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::{Path, PathBuf};

use policies::{Action, Decision, Forecast, Policy, State, Target};
use serde::Deserialize;
use telemetry::{EntityId, EntityKind, Job, Sample, Site, Snapshot, Timestamp};
use toml::Spanned;

use super::inputs::{self, parse_time, RawForecast, RawJob, RawReading};

/// Where cases start unless the file or the case says otherwise.
pub const DEFAULT_START: &str = "2026-01-05T12:00:00Z";

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    site: Spanned<String>,
    policy: Spanned<String>,
    #[serde(default)]
    start: Option<Spanned<String>>,
    /// Prior state for every case (JSON, as `--state` takes it).
    #[serde(default)]
    state: Option<Spanned<String>>,
    #[serde(default, rename = "case")]
    cases: Vec<Spanned<RawCase>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCase {
    name: String,
    #[serde(default)]
    policy: Option<String>,
    #[serde(default)]
    start: Option<String>,
    #[serde(default)]
    state: Option<String>,
    #[serde(default, rename = "tick")]
    ticks: Vec<Spanned<RawTick>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTick {
    at: String,
    #[serde(default)]
    readings: Vec<RawReading>,
    #[serde(default)]
    jobs: Vec<RawJob>,
    #[serde(default)]
    remove_jobs: Vec<String>,
    #[serde(default)]
    forecast: Option<RawForecast>,
    #[serde(default)]
    expect: Option<Expect>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Expect {
    #[serde(default)]
    caps: Vec<CapExpect>,
    #[serde(default)]
    uncapped: Vec<String>,
    #[serde(default)]
    holds: Vec<String>,
    #[serde(default)]
    not_held: Vec<String>,
    #[serde(default)]
    observed_holds: Vec<String>,
    #[serde(default)]
    released: Vec<String>,
    #[serde(default)]
    decisions: Vec<DecisionExpect>,
    #[serde(default)]
    no_decisions: bool,
    /// Jobs suspended by a rule.
    #[serde(default)]
    suspended: Vec<String>,
    /// Locked clocks: `{ gpu = "...", mhz = 1200 }` or `{ rack = "a01", mhz = 1200 }`.
    #[serde(default)]
    clocks: Vec<ClockExpect>,
    /// No GPU under these entities has a locked clock.
    #[serde(default)]
    unlocked: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ClockExpect {
    #[serde(default)]
    gpu: Option<String>,
    #[serde(default)]
    rack: Option<String>,
    #[serde(default)]
    mhz: Option<f64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CapExpect {
    #[serde(default)]
    gpu: Option<String>,
    #[serde(default)]
    rack: Option<String>,
    #[serde(default)]
    watts: Option<f64>,
    #[serde(default)]
    max_watts: Option<f64>,
    #[serde(default)]
    min_watts: Option<f64>,
    #[serde(default)]
    rule: Option<String>,
    /// Look at the caps of rules in observe mode.
    #[serde(default)]
    observed: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DecisionExpect {
    #[serde(default)]
    rule: Option<String>,
    /// `cap`, `uncap`, `hold` or `release`.
    #[serde(default)]
    action: Option<String>,
    /// An entity (`rack/a01`, a pattern) or a job id.
    #[serde(default)]
    target: Option<String>,
    #[serde(default)]
    watts: Option<f64>,
    #[serde(default)]
    observe_only: Option<bool>,
    #[serde(default)]
    reason_contains: Option<String>,
}

/// The outcome of one case.
#[derive(Debug, Clone, PartialEq)]
pub struct CaseResult {
    pub name: String,
    /// `None`: passed; else the first difference (or input problem).
    pub failure: Option<String>,
}

/// The outcome of one file: its cases, or the problems that kept it from running.
#[derive(Debug, Clone, PartialEq)]
pub struct FileResult {
    pub file: String,
    pub cases: Vec<CaseResult>,
    pub problems: Vec<String>,
}

/// The test files a path names: the file, or every `*.toml` directly in the folder.
pub fn collect(paths: &[PathBuf]) -> Result<Vec<PathBuf>, Vec<String>> {
    let mut out = Vec::new();
    let mut problems = Vec::new();
    for p in paths {
        if p.is_dir() {
            let mut found = Vec::new();
            walk(p, &mut found, &mut problems);
            found.sort();
            if found.is_empty() {
                problems.push(format!(
                    "{}: no *.toml test files in this folder",
                    p.display()
                ));
            }
            out.extend(found);
        } else if p.exists() {
            out.push(p.clone());
        } else {
            problems.push(format!("{}: no such file or folder", p.display()));
        }
    }
    if problems.is_empty() {
        Ok(out)
    } else {
        Err(problems)
    }
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>, problems: &mut Vec<String>) {
    match std::fs::read_dir(dir) {
        Ok(rd) => {
            for e in rd.flatten() {
                let p = e.path();
                // not below: a subfolder may hold the policies and states the tests name
                if p.is_file() && p.extension().is_some_and(|x| x == "toml") {
                    out.push(p);
                }
            }
        }
        Err(e) => problems.push(format!("{}: cannot read: {e}", dir.display())),
    }
}

/// Runs every case of one test file; `filter` keeps the cases whose name contains it.
pub fn run_file(path: &Path, filter: Option<&str>) -> FileResult {
    let file = path.display().to_string();
    let mut result = FileResult {
        file: file.clone(),
        cases: Vec::new(),
        problems: Vec::new(),
    };
    let src = match std::fs::read_to_string(path) {
        Ok(s) => s,
        Err(e) => {
            result.problems.push(format!("{file}: cannot read: {e}"));
            return result;
        }
    };
    let raw: RawFile = match toml::from_str(&src) {
        Ok(r) => r,
        Err(e) => {
            result.problems.push(inputs::toml_error(&file, &src, &e));
            return result;
        }
    };
    let base = path.parent().unwrap_or(Path::new("."));
    let here = |s: &Spanned<String>| inputs::Pos::Span(s.span());
    let resolve = |p: &str| {
        let p = Path::new(p);
        if p.is_absolute() {
            p.to_path_buf()
        } else {
            base.join(p)
        }
    };
    let site = match inputs::read(&resolve(raw.site.get_ref())) {
        Ok((n, t)) => match Site::parse(&n, &t) {
            Ok(s) => Some(s),
            Err(e) => {
                result.problems.push(e.to_string());
                None
            }
        },
        Err(p) => {
            result.problems.extend(
                p.iter()
                    .map(|m| inputs::at(&file, &src, &here(&raw.site), &format!("site: {m}"))),
            );
            None
        }
    };
    let mut policies: BTreeMap<String, Result<Policy, String>> = BTreeMap::new();
    let mut load_policy = |p: &str| -> Result<Policy, String> {
        policies
            .entry(p.to_string())
            .or_insert_with(|| {
                let site = site
                    .as_ref()
                    .ok_or_else(|| "the site file has problems".to_string())?;
                super::load_policy(&resolve(p), site)
                    .map(|(p, _)| p)
                    .map_err(|e| e.join("\n"))
            })
            .clone()
    };
    let default_policy = load_policy(raw.policy.get_ref());
    if let Err(e) = &default_policy {
        result.problems.push(inputs::at(
            &file,
            &src,
            &here(&raw.policy),
            &format!("policy: {e}"),
        ));
    }
    let start = match &raw.start {
        Some(s) => match Timestamp::parse_rfc3339(s.get_ref()) {
            Ok(t) => t,
            Err(e) => {
                result.problems.push(inputs::at(
                    &file,
                    &src,
                    &here(s),
                    &format!("start: {e} (use RFC 3339)"),
                ));
                return result;
            }
        },
        None => Timestamp::parse_rfc3339(DEFAULT_START).unwrap_or_default(),
    };
    let load_state = |p: &str| -> Result<State, String> {
        inputs::read(&resolve(p))
            .and_then(|(n, t)| inputs::state_file(&n, &t))
            .map_err(|e| e.join("\n"))
    };
    let file_state = match &raw.state {
        Some(s) => match load_state(s.get_ref()) {
            Ok(st) => st,
            Err(e) => {
                result
                    .problems
                    .push(inputs::at(&file, &src, &here(s), &format!("state: {e}")));
                State::default()
            }
        },
        None => State::default(),
    };
    let (Some(site), Ok(default_policy)) = (site.as_ref(), default_policy) else {
        return result;
    };
    if !result.problems.is_empty() {
        return result;
    }
    if raw.cases.is_empty() {
        result
            .problems
            .push(format!("{file}: no [[case]] in this file"));
        return result;
    }
    for c in &raw.cases {
        let case = c.get_ref();
        if filter.is_some_and(|f| !case.name.contains(f)) {
            continue;
        }
        let policy = match &case.policy {
            Some(p) => load_policy(p),
            None => Ok(default_policy.clone()),
        };
        let prior = match &case.state {
            Some(p) => load_state(p),
            None => Ok(file_state.clone()),
        };
        let case_start = match &case.start {
            Some(s) => Timestamp::parse_rfc3339(s).map_err(|e| format!("start {s:?}: {e}")),
            None => Ok(start),
        };
        let failure = match (policy, prior, case_start) {
            (Ok(policy), Ok(prior), Ok(t0)) => {
                run_case(&file, &src, site, &policy, prior, t0, case).err()
            }
            (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => {
                Some(inputs::at(&file, &src, &inputs::Pos::Span(c.span()), &e))
            }
        };
        result.cases.push(CaseResult {
            name: case.name.clone(),
            failure,
        });
    }
    result
}

/// One telemetry signal of a case (one metric of one entity): its value holds,
/// read again at every tick, until it changes or stops.
struct Signal {
    /// Its last sample; re-stamped every tick unless it was given an absolute time.
    sample: Sample,
    age_s: f64,
    fixed_time: bool,
}

fn run_case(
    file: &str,
    src: &str,
    site: &Site,
    policy: &Policy,
    mut prior: State,
    t0: Timestamp,
    case: &RawCase,
) -> Result<(), String> {
    if case.ticks.is_empty() {
        return Err("the case has no [[case.tick]]".into());
    }
    let names = inputs::Names::new(site);
    let mut snapshot = Snapshot::new();
    let mut signals: BTreeMap<(EntityId, String), Signal> = BTreeMap::new();
    let mut jobs: Vec<Job> = Vec::new();
    let mut forecast = Forecast::default();
    let mut last: Option<Timestamp> = None;
    for (i, t) in case.ticks.iter().enumerate() {
        let pos = inputs::Pos::Span(t.span());
        let tick = t.get_ref();
        let problem = |m: String| {
            inputs::at(
                file,
                src,
                &pos,
                &format!("tick {} ({}): {m}", i + 1, tick.at),
            )
        };
        let now = parse_time(&tick.at, t0).map_err(problem)?;
        if last.is_some_and(|l| now <= l) {
            return Err(problem("ticks must go forward in time".into()));
        }
        last = Some(now);
        // in order: a later reading of the same entity and metric replaces an earlier one
        for r in &tick.readings {
            if r.stop {
                let ids = names.resolve(&r.entity).map_err(&problem)?;
                let n = signals.len();
                signals.retain(|(e, m), _| !(m == &r.metric && ids.contains(e)));
                if signals.len() == n {
                    return Err(problem(format!(
                        "{} {}: stop names a reading that was never set",
                        r.entity, r.metric
                    )));
                }
                continue;
            }
            for sample in r.samples(&names, now, "test").map_err(&problem)? {
                signals.insert(
                    (sample.entity.clone(), sample.metric.as_str().to_string()),
                    Signal {
                        sample,
                        age_s: r.age_s.unwrap_or(0.0),
                        fixed_time: r.time.is_some(),
                    },
                );
            }
        }
        // every signal still reporting is read again at this tick (one given with an
        // absolute time is read once, as given)
        let mut latest: Vec<Sample> = Vec::new();
        for s in signals.values_mut() {
            if !s.fixed_time {
                s.sample.ts = now.plus_secs(-s.age_s);
            }
            latest.push(s.sample.clone());
        }
        signals.retain(|_, s| !s.fixed_time);
        for sample in latest {
            snapshot
                .ingest(sample, now)
                .map_err(|e| problem(e.to_string()))?;
        }
        for j in &tick.jobs {
            let job = j.job(&names, now).map_err(problem)?;
            match jobs.iter_mut().find(|o| o.id == job.id) {
                Some(o) => *o = job,
                None => jobs.push(job),
            }
        }
        for id in &tick.remove_jobs {
            let n = jobs.len();
            jobs.retain(|j| &j.id != id);
            if jobs.len() == n {
                return Err(problem(format!("remove_jobs: no job {id:?}")));
            }
        }
        if let Some(f) = &tick.forecast {
            forecast = f
                .forecast(now)
                .map_err(|e| problem(format!("forecast: {e}")))?;
        }
        let site_id = site.site_entity();
        let own: Vec<&str> = [
            telemetry::metric::names::PRICE_PER_KWH,
            telemetry::metric::names::CARBON_G_PER_KWH,
        ]
        .into_iter()
        .filter(|m| signals.contains_key(&(site_id.clone(), m.to_string())))
        .collect();
        inputs::signals_from_forecast(site, &mut snapshot, &forecast, now, &own);
        let plan = policies::evaluate(
            &policies::Inputs {
                site,
                snapshot: &snapshot,
                jobs: &jobs,
                prior: &prior,
                policy,
                forecast: &forecast,
                job_table: None,
            },
            now,
        );
        if let Some(e) = &tick.expect {
            check(&names, e, &plan.state, &plan.decisions).map_err(|m| {
                let (line, _) = telemetry::diag::line_col(src, t.span().start);
                format!("tick {} ({}, {file}:{line}): {m}", i + 1, tick.at)
            })?;
        }
        prior = plan.state;
    }
    Ok(())
}

/// The site's GPUs under an entity or pattern (a GPU, node, rack, row or the site).
fn gpus_under(names: &inputs::Names<'_>, what: &str) -> Result<Vec<EntityId>, String> {
    let site = names.site;
    let ids = names.resolve(what)?;
    let mut out = Vec::new();
    for g in site.gpus() {
        let under = ids.iter().any(|e| match e.kind {
            EntityKind::Gpu => *e == *g.id,
            EntityKind::Node => e.name == g.node.id,
            EntityKind::Rack => e.name == g.rack.id,
            EntityKind::Row => e.name == g.rack.row,
            EntityKind::Site => true,
            _ => false,
        });
        if under {
            out.push(g.id.into_owned());
        }
    }
    if out.is_empty() {
        return Err(format!("{what:?} holds no GPU"));
    }
    Ok(out)
}

fn show(c: Option<&policies::Cap>) -> String {
    super::cap_text(c)
}

fn check(
    names: &inputs::Names<'_>,
    e: &Expect,
    state: &State,
    decisions: &[Decision],
) -> Result<(), String> {
    for (i, c) in e.caps.iter().enumerate() {
        let what = match (&c.gpu, &c.rack) {
            (Some(g), None) => g.clone(),
            (None, Some(r)) => {
                if r.contains('/') {
                    r.clone()
                } else {
                    format!("rack/{r}")
                }
            }
            _ => return Err(format!("expect.caps[{i}]: give one of gpu or rack")),
        };
        let caps = if c.observed {
            &state.observed_caps
        } else {
            &state.caps
        };
        let mut want = Vec::new();
        if let Some(w) = c.watts {
            want.push(format!("{w} W"));
        }
        if let Some(w) = c.max_watts {
            want.push(format!("at most {w} W"));
        }
        if let Some(w) = c.min_watts {
            want.push(format!("at least {w} W"));
        }
        if let Some(r) = &c.rule {
            want.push(format!("by {r}"));
        }
        let want = if want.is_empty() {
            "capped".to_string()
        } else {
            format!("capped {}", want.join(", "))
        };
        for g in gpus_under(names, &what).map_err(|m| format!("expect.caps[{i}]: {m}"))? {
            let got = caps.get(&g);
            let ok = got.is_some_and(|cap| {
                c.watts.is_none_or(|w| (cap.watts - w).abs() < 0.5)
                    && c.max_watts.is_none_or(|w| cap.watts <= w + 0.5)
                    && c.min_watts.is_none_or(|w| cap.watts >= w - 0.5)
                    && c.rule.as_ref().is_none_or(|r| **r == *cap.rule)
            });
            if !ok {
                return Err(format!(
                    "expect.caps[{i}]: {g} expected {want}{}, got {}",
                    if c.observed { " (observed)" } else { "" },
                    show(got)
                ));
            }
        }
    }
    for what in &e.uncapped {
        for g in gpus_under(names, what).map_err(|m| format!("expect.uncapped: {m}"))? {
            if let Some(c) = state.caps.get(&g) {
                return Err(format!(
                    "expect.uncapped: {g} ({what}) expected uncapped, got {}",
                    show(Some(c))
                ));
            }
        }
    }
    for job in &e.holds {
        if !state.holds.contains_key(job) {
            return Err(format!(
                "expect.holds: job {job} expected held, got not held (held: {})",
                list(state.holds.keys())
            ));
        }
    }
    for job in &e.not_held {
        if let Some(h) = state.holds.get(job) {
            return Err(format!(
                "expect.not_held: job {job} expected not held, got held by {} ({})",
                h.rule, h.reason
            ));
        }
    }
    for job in &e.observed_holds {
        if !state.observed_holds.contains_key(job) {
            return Err(format!(
                "expect.observed_holds: job {job} expected held in observe mode, got not held (observed holds: {})",
                list(state.observed_holds.keys())
            ));
        }
    }
    for job in &e.suspended {
        if !state.suspended.contains_key(job) {
            return Err(format!(
                "expect.suspended: job {job} expected suspended, got not suspended (suspended: {})",
                list(state.suspended.keys())
            ));
        }
    }
    for (i, c) in e.clocks.iter().enumerate() {
        let what = match (&c.gpu, &c.rack) {
            (Some(g), None) => g.clone(),
            (None, Some(r)) if r.contains('/') => r.clone(),
            (None, Some(r)) => format!("rack/{r}"),
            _ => return Err(format!("expect.clocks[{i}]: give one of gpu or rack")),
        };
        for g in gpus_under(names, &what).map_err(|m| format!("expect.clocks[{i}]: {m}"))? {
            let got = state.clocks.get(&g);
            if !got.is_some_and(|l| c.mhz.is_none_or(|m| (l.mhz - m).abs() < 0.5)) {
                return Err(format!(
                    "expect.clocks[{i}]: {g} expected locked{}, got {}",
                    c.mhz.map_or(String::new(), |m| format!(" at {m} MHz")),
                    got.map_or("unlocked".to_string(), |l| format!(
                        "{:.0} MHz ({})",
                        l.mhz, l.rule
                    ))
                ));
            }
        }
    }
    for what in &e.unlocked {
        for g in gpus_under(names, what).map_err(|m| format!("expect.unlocked: {m}"))? {
            if let Some(l) = state.clocks.get(&g) {
                return Err(format!(
                    "expect.unlocked: {g} ({what}) expected unlocked, got {:.0} MHz ({})",
                    l.mhz, l.rule
                ));
            }
        }
    }
    for job in &e.released {
        let found = decisions.iter().any(|d| {
            matches!(&d.target, Target::Job { job: j } if j == job) && d.action == Action::Release
        });
        if !found {
            return Err(format!(
                "expect.released: job {job} expected released at this tick, got {}",
                if state.holds.contains_key(job) {
                    "still held".to_string()
                } else {
                    "no release decision".to_string()
                }
            ));
        }
    }
    for (i, x) in e.decisions.iter().enumerate() {
        if !decisions.iter().any(|d| matches_decision(d, x)) {
            return Err(format!(
                "expect.decisions[{i}]: expected a decision {}, got {}",
                describe(x),
                if decisions.is_empty() {
                    "none".to_string()
                } else {
                    decisions.iter().map(summary).collect::<Vec<_>>().join("; ")
                }
            ));
        }
    }
    if e.no_decisions && !decisions.is_empty() {
        return Err(format!(
            "expect.no_decisions: expected none, got {}",
            decisions.iter().map(summary).collect::<Vec<_>>().join("; ")
        ));
    }
    Ok(())
}

fn list<'a>(it: impl Iterator<Item = &'a String>) -> String {
    let v: Vec<&str> = it.map(String::as_str).collect();
    if v.is_empty() {
        "none".into()
    } else {
        v.join(", ")
    }
}

fn matches_decision(d: &Decision, x: &DecisionExpect) -> bool {
    let target_ok = x.target.as_ref().is_none_or(|t| match &d.target {
        Target::Gpus { entity, gpus } => {
            inputs::glob(t, &entity.to_string())
                || gpus.iter().any(|g| inputs::glob(t, &g.to_string()))
        }
        Target::Job { job } => inputs::glob(t, job),
    });
    let watts_ok = x
        .watts
        .is_none_or(|w| matches!(d.action, Action::Cap { watts } if (watts - w).abs() < 0.5));
    x.rule.as_ref().is_none_or(|r| *r == d.rule)
        && x.action
            .as_ref()
            .is_none_or(|a| a == api::action_kind(&d.action))
        && target_ok
        && watts_ok
        && x.observe_only.is_none_or(|o| o == d.observe_only)
        && x.reason_contains
            .as_ref()
            .is_none_or(|r| d.reason.contains(r.as_str()))
}

fn describe(x: &DecisionExpect) -> String {
    let mut v = Vec::new();
    if let Some(r) = &x.rule {
        v.push(format!("rule {r}"));
    }
    if let Some(a) = &x.action {
        v.push(format!("action {a}"));
    }
    if let Some(t) = &x.target {
        v.push(format!("on {t}"));
    }
    if let Some(w) = x.watts {
        v.push(format!("at {w} W"));
    }
    if let Some(o) = x.observe_only {
        v.push(format!("observe_only {o}"));
    }
    if let Some(r) = &x.reason_contains {
        v.push(format!("reason containing {r:?}"));
    }
    if v.is_empty() {
        "of any kind".into()
    } else {
        v.join(", ")
    }
}

fn summary(d: &Decision) -> String {
    format!(
        "{} {} on {}{}",
        d.rule,
        d.action,
        d.target,
        if d.observe_only {
            " (observe only)"
        } else {
            ""
        }
    )
}

/// Runs the files; the report as text and whether everything passed.
pub fn run(paths: &[PathBuf], filter: Option<&str>) -> (String, bool) {
    let mut out = String::new();
    let files = match collect(paths) {
        Ok(f) => f,
        Err(p) => {
            for m in p {
                let _ = writeln!(out, "{m}");
            }
            return (out, false);
        }
    };
    let (mut passed, mut failed, mut broken) = (0, 0, 0);
    for f in &files {
        let r = run_file(f, filter);
        if r.problems.is_empty() && r.cases.is_empty() {
            continue;
        }
        let _ = writeln!(out, "{}", r.file);
        for p in &r.problems {
            let _ = writeln!(out, "  ERROR {}", p.replace('\n', "\n        "));
            broken += 1;
        }
        for c in &r.cases {
            match &c.failure {
                None => {
                    passed += 1;
                    let _ = writeln!(out, "  PASS {}", c.name);
                }
                Some(m) => {
                    failed += 1;
                    let _ = writeln!(out, "  FAIL {}", c.name);
                    let _ = writeln!(out, "       {}", m.replace('\n', "\n       "));
                }
            }
        }
    }
    let _ = writeln!(
        out,
        "{} file{}, {} case{}: {passed} passed, {failed} failed{}",
        files.len(),
        if files.len() == 1 { "" } else { "s" },
        passed + failed,
        if passed + failed == 1 { "" } else { "s" },
        if broken > 0 {
            format!(
                ", {broken} file error{}",
                if broken == 1 { "" } else { "s" }
            )
        } else {
            String::new()
        }
    );
    if passed + failed + broken == 0 {
        let _ = writeln!(
            out,
            "no case ran{}",
            filter.map_or(String::new(), |f| format!(" (none named with {f:?})"))
        );
    }
    (out, failed == 0 && broken == 0 && passed > 0)
}
