//! What a tick of a case expects (`expect.caps`, `holds`, `clocks`, `decisions`...)
//! and the check of the engine's state and decisions against it.

use policies::{Action, Decision, State, Target};
use serde::Deserialize;
use telemetry::{EntityId, EntityKind};

use super::super::inputs::{self, InputError};

/// How the state or decisions after a tick differ from what the tick expects, or why
/// an expectation cannot be checked; `field` is the expectation (`caps[0]`, `holds`).
#[derive(Debug, Clone, thiserror::Error)]
pub enum Mismatch {
    /// A `caps` or `clocks` entry names neither a GPU nor a rack, or both.
    #[error("expect.{field}: give one of gpu or rack")]
    NoTarget { field: String },
    /// What an entry names is no set of GPUs of the site.
    #[error("expect.{field}: {source}")]
    Target {
        field: String,
        #[source]
        source: TargetError,
    },
    /// What (a GPU, a job) is not as expected: what was wanted, what there is.
    #[error("expect.{field}: {what} expected {wanted}, got {got}")]
    Differs {
        field: String,
        what: String,
        wanted: String,
        got: String,
    },
    /// None of the tick's decisions is the one expected.
    #[error("expect.decisions[{index}]: expected a decision {wanted}, got {got}")]
    NoDecision {
        index: usize,
        wanted: String,
        got: String,
    },
    /// `no_decisions`, but the tick decided.
    #[error("expect.no_decisions: expected none, got {got}")]
    Decided { got: String },
}

/// Why an entity or pattern an expectation names gives no GPU.
#[derive(Debug, Clone, thiserror::Error)]
pub enum TargetError {
    #[error("{0}")]
    Name(#[from] InputError),
    #[error("{0:?} holds no GPU")]
    NoGpu(String),
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Expect {
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

/// Compares the state and decisions after a tick with what the tick expects; the
/// first difference.
pub(super) fn check(
    names: &inputs::Names<'_>,
    e: &Expect,
    state: &State,
    decisions: &[Decision],
) -> Result<(), Mismatch> {
    check_caps(names, e, state)?;
    check_holds(e, state)?;
    check_clocks(names, e, state)?;
    check_decisions(e, state, decisions)
}

/// `expect.caps` and `expect.uncapped`.
fn check_caps(names: &inputs::Names<'_>, e: &Expect, state: &State) -> Result<(), Mismatch> {
    for (i, c) in e.caps.iter().enumerate() {
        let field = format!("caps[{i}]");
        let what = match (&c.gpu, &c.rack) {
            (Some(g), None) => g.clone(),
            (None, Some(r)) => {
                if r.contains('/') {
                    r.clone()
                } else {
                    format!("rack/{r}")
                }
            }
            _ => return Err(Mismatch::NoTarget { field }),
        };
        let caps = if c.observed {
            &state.observed_caps
        } else {
            &state.caps
        };
        let want = c.wanted();
        for g in gpus_under(names, &what, &field)? {
            let got = caps.get(&g);
            if !got.is_some_and(|cap| c.fits(cap)) {
                return Err(Mismatch::Differs {
                    field,
                    what: g.to_string(),
                    wanted: format!("{want}{}", if c.observed { " (observed)" } else { "" }),
                    got: show(got),
                });
            }
        }
    }
    for what in &e.uncapped {
        for g in gpus_under(names, what, "uncapped")? {
            if let Some(c) = state.caps.get(&g) {
                return Err(Mismatch::Differs {
                    field: "uncapped".into(),
                    what: format!("{g} ({what})"),
                    wanted: "uncapped".into(),
                    got: show(Some(c)),
                });
            }
        }
    }
    Ok(())
}

impl CapExpect {
    /// What the expectation asks, in words: `capped at most 270 W, by thermal`.
    fn wanted(&self) -> String {
        let mut want = Vec::new();
        if let Some(w) = self.watts {
            want.push(format!("{w} W"));
        }
        if let Some(w) = self.max_watts {
            want.push(format!("at most {w} W"));
        }
        if let Some(w) = self.min_watts {
            want.push(format!("at least {w} W"));
        }
        if let Some(r) = &self.rule {
            want.push(format!("by {r}"));
        }
        if want.is_empty() {
            "capped".to_string()
        } else {
            format!("capped {}", want.join(", "))
        }
    }

    /// Whether a cap is what the expectation asks (within half a watt).
    fn fits(&self, cap: &policies::Cap) -> bool {
        self.watts.is_none_or(|w| (cap.watts - w).abs() < 0.5)
            && self.max_watts.is_none_or(|w| cap.watts <= w + 0.5)
            && self.min_watts.is_none_or(|w| cap.watts >= w - 0.5)
            && self.rule.as_ref().is_none_or(|r| **r == *cap.rule)
    }
}

/// `expect.holds`, `not_held`, `observed_holds` and `suspended`.
fn check_holds(e: &Expect, state: &State) -> Result<(), Mismatch> {
    let differs = |field: &str, job: &str, wanted: &str, got: String| Mismatch::Differs {
        field: field.into(),
        what: format!("job {job}"),
        wanted: wanted.into(),
        got,
    };
    for job in &e.holds {
        if !state.holds.contains_key(job) {
            let got = format!("not held (held: {})", list(state.holds.keys()));
            return Err(differs("holds", job, "held", got));
        }
    }
    for job in &e.not_held {
        if let Some(h) = state.holds.get(job) {
            let got = format!("held by {} ({})", h.rule, h.reason);
            return Err(differs("not_held", job, "not held", got));
        }
    }
    for job in &e.observed_holds {
        if !state.observed_holds.contains_key(job) {
            let got = format!(
                "not held (observed holds: {})",
                list(state.observed_holds.keys())
            );
            return Err(differs("observed_holds", job, "held in observe mode", got));
        }
    }
    for job in &e.suspended {
        if !state.suspended.contains_key(job) {
            let got = format!(
                "not suspended (suspended: {})",
                list(state.suspended.keys())
            );
            return Err(differs("suspended", job, "suspended", got));
        }
    }
    Ok(())
}

/// `expect.clocks` and `expect.unlocked`.
fn check_clocks(names: &inputs::Names<'_>, e: &Expect, state: &State) -> Result<(), Mismatch> {
    let locked = |l: &policies::ClockLock| format!("{:.0} MHz ({})", l.mhz, l.rule);
    for (i, c) in e.clocks.iter().enumerate() {
        let field = format!("clocks[{i}]");
        let what = match (&c.gpu, &c.rack) {
            (Some(g), None) => g.clone(),
            (None, Some(r)) if r.contains('/') => r.clone(),
            (None, Some(r)) => format!("rack/{r}"),
            _ => return Err(Mismatch::NoTarget { field }),
        };
        for g in gpus_under(names, &what, &field)? {
            let got = state.clocks.get(&g);
            if !got.is_some_and(|l| c.mhz.is_none_or(|m| (l.mhz - m).abs() < 0.5)) {
                return Err(Mismatch::Differs {
                    field,
                    what: g.to_string(),
                    wanted: format!(
                        "locked{}",
                        c.mhz.map_or(String::new(), |m| format!(" at {m} MHz"))
                    ),
                    got: got.map_or("unlocked".to_string(), locked),
                });
            }
        }
    }
    for what in &e.unlocked {
        for g in gpus_under(names, what, "unlocked")? {
            if let Some(l) = state.clocks.get(&g) {
                return Err(Mismatch::Differs {
                    field: "unlocked".into(),
                    what: format!("{g} ({what})"),
                    wanted: "unlocked".into(),
                    got: locked(l),
                });
            }
        }
    }
    Ok(())
}

/// `expect.released`, `expect.decisions` and `expect.no_decisions`.
fn check_decisions(e: &Expect, state: &State, decisions: &[Decision]) -> Result<(), Mismatch> {
    for job in &e.released {
        let found = decisions.iter().any(|d| {
            matches!(&d.target, Target::Job { job: j } if j == job) && d.action == Action::Release
        });
        if !found {
            return Err(Mismatch::Differs {
                field: "released".into(),
                what: format!("job {job}"),
                wanted: "released at this tick".into(),
                got: if state.holds.contains_key(job) {
                    "still held".to_string()
                } else {
                    "no release decision".to_string()
                },
            });
        }
    }
    for (i, x) in e.decisions.iter().enumerate() {
        if !decisions.iter().any(|d| matches_decision(d, x)) {
            return Err(Mismatch::NoDecision {
                index: i,
                wanted: describe(x),
                got: if decisions.is_empty() {
                    "none".to_string()
                } else {
                    decisions.iter().map(summary).collect::<Vec<_>>().join("; ")
                },
            });
        }
    }
    if e.no_decisions && !decisions.is_empty() {
        return Err(Mismatch::Decided {
            got: decisions.iter().map(summary).collect::<Vec<_>>().join("; "),
        });
    }
    Ok(())
}

/// The site's GPUs under an entity or pattern (a GPU, node, rack, row or the site)
/// that the expectation `field` names.
fn gpus_under(
    names: &inputs::Names<'_>,
    what: &str,
    field: &str,
) -> Result<Vec<EntityId>, Mismatch> {
    let target = |source| Mismatch::Target {
        field: field.into(),
        source,
    };
    let site = names.site;
    let ids = names
        .resolve(what)
        .map_err(|e| target(TargetError::Name(e)))?;
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
        return Err(target(TargetError::NoGpu(what.into())));
    }
    Ok(out)
}

fn show(c: Option<&policies::Cap>) -> String {
    super::super::cap_text(c)
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
