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

use policies::{Policy, State};
use serde::Deserialize;
use telemetry::{Site, Timestamp};
use toml::Spanned;

use super::inputs::{self, Problems, RawForecast, RawJob, RawReading};
use super::PolicyFileError;
use expect::Expect;

pub use expect::{Mismatch, TargetError};
pub use replay::TickError;

mod expect;
mod replay;

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

/// The outcome of one case.
#[derive(Debug, Clone)]
pub struct CaseResult {
    pub name: String,
    /// `None`: passed; else the first difference (or input problem).
    pub failure: Option<CaseFailure>,
}

/// Why a case failed: the first difference, or a problem with its inputs.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CaseFailure {
    /// What the case runs with cannot be had; at the case in the test file.
    #[error("{file}:{line}:{col}: {source}")]
    Setup {
        file: String,
        line: usize,
        col: usize,
        #[source]
        source: SetupError,
    },
    #[error("the case has no [[case.tick]]")]
    NoTicks,
    /// A tick's inputs cannot be taken in; at the tick in the test file.
    #[error("{file}:{line}:{col}: tick {tick} ({time}): {source}")]
    Tick {
        file: String,
        line: usize,
        col: usize,
        /// From 1.
        tick: usize,
        /// The tick's `at`, as written.
        time: String,
        #[source]
        source: Box<TickError>,
    },
    /// After a tick, the engine's state or decisions are not what the tick expects.
    #[error("tick {tick} ({time}, {file}:{line}): {source}")]
    Expectation {
        tick: usize,
        time: String,
        file: String,
        line: usize,
        #[source]
        source: Box<Mismatch>,
    },
}

/// Why the policy, prior state or start that a file or a case names cannot be had.
#[derive(Debug, Clone, thiserror::Error)]
pub enum SetupError {
    /// A policy is checked against the site, which did not load.
    #[error("the site file has problems")]
    NoSite,
    #[error("{0}")]
    Policy(#[source] PolicyFileError),
    /// The prior state file's problems, one per line.
    #[error("{}", .0.join("\n"))]
    State(Problems),
    #[error("start {start:?}: {source}")]
    Start {
        start: String,
        #[source]
        source: chrono::ParseError,
    },
}

/// The outcome of one file: its cases, or the problems that kept it from running.
#[derive(Debug, Clone)]
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
    let t = TestFile {
        file: &file,
        src: &src,
        base: path.parent().unwrap_or(Path::new(".")),
    };
    let problems = &mut result.problems;
    let site = t.site(&raw.site, problems);
    let mut policies = Policies {
        site: site.as_ref(),
        loaded: BTreeMap::new(),
    };
    let default_policy = policies.load(&t, raw.policy.get_ref());
    if let Err(e) = &default_policy {
        problems.push(t.at(&raw.policy, &format!("policy: {e}")));
    }
    let Some(start) = t.start(raw.start.as_ref(), problems) else {
        return result;
    };
    let file_state = match &raw.state {
        Some(s) => t.state(s.get_ref()).unwrap_or_else(|e| {
            problems.push(t.at(s, &format!("state: {e}")));
            State::default()
        }),
        None => State::default(),
    };
    let (Some(site), Ok(policy)) = (site.as_ref(), default_policy) else {
        return result;
    };
    if !problems.is_empty() {
        return result;
    }
    if raw.cases.is_empty() {
        problems.push(format!("{file}: no [[case]] in this file"));
        return result;
    }
    let defaults = Defaults {
        policy,
        state: file_state,
        start,
    };
    for c in &raw.cases {
        let case = c.get_ref();
        if filter.is_some_and(|f| !case.name.contains(f)) {
            continue;
        }
        let failure = t.run_case(site, &mut policies, &defaults, c);
        result.cases.push(CaseResult {
            name: case.name.clone(),
            failure,
        });
    }
    result
}

/// A test file being run: its name, its text, the folder its paths are relative to.
struct TestFile<'a> {
    file: &'a str,
    src: &'a str,
    base: &'a Path,
}

/// What a case runs with unless it says otherwise: the file's policy, prior state
/// and start.
struct Defaults {
    policy: Policy,
    state: State,
    start: Timestamp,
}

/// The policies the file and its cases name, each loaded once.
struct Policies<'a> {
    /// `None`: the site file has problems.
    site: Option<&'a Site>,
    loaded: BTreeMap<String, Result<Policy, SetupError>>,
}

impl Policies<'_> {
    fn load(&mut self, t: &TestFile<'_>, p: &str) -> Result<Policy, SetupError> {
        let site = self.site;
        self.loaded
            .entry(p.to_string())
            .or_insert_with(|| {
                let site = site.ok_or(SetupError::NoSite)?;
                super::load_policy(&t.resolve(p), site)
                    .map(|(p, _)| p)
                    .map_err(SetupError::Policy)
            })
            .clone()
    }
}

impl TestFile<'_> {
    /// A path the file names, relative to the file's folder.
    fn resolve(&self, p: &str) -> PathBuf {
        let p = Path::new(p);
        if p.is_absolute() {
            p.to_path_buf()
        } else {
            self.base.join(p)
        }
    }

    /// A problem at the place of a value in the file.
    fn at(&self, s: &Spanned<String>, msg: &str) -> String {
        inputs::at(self.file, self.src, &inputs::Pos::Span(s.span()), msg)
    }

    /// The site the file names; its problems added to `problems`.
    fn site(&self, raw: &Spanned<String>, problems: &mut Vec<String>) -> Option<Site> {
        match inputs::read(&self.resolve(raw.get_ref())) {
            Ok((n, t)) => match Site::parse(&n, &t) {
                Ok(s) => Some(s),
                Err(e) => {
                    problems.push(e.to_string());
                    None
                }
            },
            Err(e) => {
                problems.push(self.at(raw, &format!("site: {e}")));
                None
            }
        }
    }

    /// The file's start (else [`DEFAULT_START`]); `None` when it is not RFC 3339.
    fn start(
        &self,
        raw: Option<&Spanned<String>>,
        problems: &mut Vec<String>,
    ) -> Option<Timestamp> {
        match raw {
            Some(s) => match Timestamp::parse_rfc3339(s.get_ref()) {
                Ok(t) => Some(t),
                Err(e) => {
                    problems.push(self.at(s, &format!("start: {e} (use RFC 3339)")));
                    None
                }
            },
            None => Some(Timestamp::parse_rfc3339(DEFAULT_START).unwrap_or_default()),
        }
    }

    /// A prior state file (JSON, as `--state` takes it).
    fn state(&self, p: &str) -> Result<State, SetupError> {
        inputs::read(&self.resolve(p))
            .map_err(Problems::from)
            .and_then(|(n, t)| inputs::state_file(&n, &t))
            .map_err(SetupError::State)
    }

    /// Runs one case with its own policy, state and start, else the file's; the
    /// failure, if any.
    fn run_case(
        &self,
        site: &Site,
        policies: &mut Policies<'_>,
        defaults: &Defaults,
        c: &Spanned<RawCase>,
    ) -> Option<CaseFailure> {
        let case = c.get_ref();
        let policy = match &case.policy {
            Some(p) => policies.load(self, p),
            None => Ok(defaults.policy.clone()),
        };
        let prior = match &case.state {
            Some(p) => self.state(p),
            None => Ok(defaults.state.clone()),
        };
        let case_start = match &case.start {
            Some(s) => Timestamp::parse_rfc3339(s).map_err(|source| SetupError::Start {
                start: s.clone(),
                source,
            }),
            None => Ok(defaults.start),
        };
        match (policy, prior, case_start) {
            (Ok(policy), Ok(prior), Ok(t0)) => {
                replay::run_case(self.file, self.src, site, &policy, prior, t0, case).err()
            }
            (Err(source), _, _) | (_, Err(source), _) | (_, _, Err(source)) => {
                let (line, col) = telemetry::diag::line_col(self.src, c.span().start);
                Some(CaseFailure::Setup {
                    file: self.file.to_string(),
                    line,
                    col,
                    source,
                })
            }
        }
    }
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
                    let m = m.to_string();
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
