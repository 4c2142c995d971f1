//! Compiling the `[[rules]]` tables as written into [`Rule`]s: each field checked, in
//! the order written, every problem reported with its position.

use std::collections::BTreeMap;

use serde::Deserialize;
use telemetry::diag::Collector;
use toml::Spanned;

use super::signals::{check_signals, overlap, string_start};
use super::{parse_duration, Glob, OnStale, Rule, RuleAction, ScopeKind, Selector};
use crate::expr::{self, Condition};

#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

impl OneOrMany {
    fn list(self) -> Vec<String> {
        match self {
            OneOrMany::One(s) => vec![s],
            OneOrMany::Many(v) => v,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
enum DurationValue {
    Secs(f64),
    Text(String),
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSelector {
    name: Option<OneOrMany>,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    within: Option<OneOrMany>,
    class: Option<OneOrMany>,
    project: Option<OneOrMany>,
    user: Option<OneOrMany>,
    priority_min: Option<i32>,
    priority_max: Option<i32>,
    deferrable: Option<bool>,
    preemptible: Option<bool>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAction {
    cap_w: Option<f64>,
    cap_pct: Option<f64>,
    lock_clocks_mhz: Option<f64>,
    hold: Option<bool>,
    release: Option<bool>,
    requeue: Option<bool>,
    suspend: Option<bool>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRule {
    name: Spanned<String>,
    #[serde(default)]
    description: String,
    #[serde(default)]
    enabled: Option<bool>,
    scope: Spanned<String>,
    select: Option<Spanned<RawSelector>>,
    when: Option<Spanned<String>>,
    release: Option<Spanned<String>>,
    action: Spanned<RawAction>,
    min_hold: Option<Spanned<DurationValue>>,
    lease: Option<Spanned<DurationValue>>,
    ramp_per_min: Option<Spanned<f64>>,
    on_stale: Option<OnStale>,
    #[serde(default)]
    observe: bool,
}

fn compile_condition(
    src: &str,
    c: &mut Collector<'_>,
    v: &Spanned<String>,
    what: &str,
) -> Option<Condition> {
    match expr::parse(v.get_ref()) {
        Ok(cond) => Some(cond),
        Err(errors) => {
            let base = string_start(src, &v.span());
            for e in errors {
                c.at(base + e.at..base + e.at, format!("{what}: {}", e.message));
            }
            None
        }
    }
}

fn duration(
    c: &mut Collector<'_>,
    v: &Option<Spanned<DurationValue>>,
    default: f64,
    what: &str,
) -> f64 {
    match v {
        None => default,
        Some(s) => {
            let r = match s.get_ref() {
                DurationValue::Secs(n) => Ok(*n),
                DurationValue::Text(t) => parse_duration(t),
            };
            match r {
                Ok(n) if n >= 0.0 && n.is_finite() => n,
                Ok(n) => {
                    c.at(s.span(), format!("{what} must not be negative, got {n}"));
                    default
                }
                Err(e) => {
                    c.at(s.span(), format!("{what}: {e}"));
                    default
                }
            }
        }
    }
}

/// Compiles and validates the rules of a policy file (problems go to `c`, in the
/// order of the rules and, within a rule, of its fields).
pub(crate) fn compile(src: &str, raw: Vec<RawRule>, c: &mut Collector<'_>) -> Vec<Rule> {
    let mut out: Vec<Rule> = Vec::new();
    let mut names: BTreeMap<String, ()> = BTreeMap::new();
    for r in raw {
        if let Some(rule) = compile_rule(src, r, &mut names, c) {
            out.push(rule);
        }
    }
    contradictions(&out, c);
    out
}

/// One rule, checked; `None` where its scope or action is not one (the rest of it is
/// not checked then). `names`: the names of the rules before it.
fn compile_rule(
    src: &str,
    r: RawRule,
    names: &mut BTreeMap<String, ()>,
    c: &mut Collector<'_>,
) -> Option<Rule> {
    let name = r.name.get_ref().clone();
    let at = r.name.span().start;
    check_name(&r.name, names, c);
    let scope = match ScopeKind::parse(r.scope.get_ref()) {
        Some(s) => s,
        None => {
            c.at(
                r.scope.span(),
                format!(
                    "rule `{name}`: unknown scope `{}` (one of {})",
                    r.scope.get_ref(),
                    ScopeKind::NAMES.join(", ")
                ),
            );
            return None;
        }
    };
    let select_at = r.select.as_ref().map_or(at, |s| s.span().start);
    let select = selector(r.select.map(Spanned::into_inner));
    check_selector(&select, scope, &name, select_at, c);
    let action_at = r.action.span().start;
    let action = action(&r.action, scope, &name, c)?;
    let (when, release) = conditions(src, &r.when, &r.release, &name, scope, at, c);
    let ramp = r
        .ramp_per_min
        .as_ref()
        .map(|s| ramp_per_min(s, action, &name, c));
    let lease_s = duration(c, &r.lease, 300.0, &format!("rule `{name}`: lease"));
    if lease_s < 10.0 {
        c.at(
            r.lease.as_ref().map_or(at..at, |s| s.span()),
            format!("rule `{name}`: lease must be at least 10s, got {lease_s}s"),
        );
    }
    let min_hold_s = duration(c, &r.min_hold, 0.0, &format!("rule `{name}`: min_hold"));
    Some(Rule {
        name,
        description: r.description,
        enabled: r.enabled.unwrap_or(true),
        scope,
        select,
        when,
        release,
        action,
        min_hold_s,
        lease_s,
        ramp_per_min: ramp,
        on_stale: r.on_stale.unwrap_or(match action {
            // a stale signal tightens a cap (the protective choice) and releases jobs
            RuleAction::CapW(_) | RuleAction::CapPct(_) | RuleAction::LockClocks(_) => {
                OnStale::AssumeWorst
            }
            _ => OnStale::Ignore,
        }),
        observe: r.observe,
        at,
        select_at,
        action_at,
    })
}

/// A rule's name: letters, digits, `-` or `_`, and not one an earlier rule has.
fn check_name(raw: &Spanned<String>, names: &mut BTreeMap<String, ()>, c: &mut Collector<'_>) {
    let name = raw.get_ref();
    let valid_name = !name.is_empty()
        && name
            .chars()
            .all(|ch| ch.is_ascii_alphanumeric() || ch == '-' || ch == '_');
    if !valid_name {
        c.at(
            raw.span(),
            format!("rule name `{name}` must be letters, digits, `-` or `_`"),
        );
    }
    if names.insert(name.clone(), ()).is_some() {
        c.at(raw.span(), format!("rule `{name}` is defined twice"));
    }
}

/// The rule's selector as written (everything, where it has none).
fn selector(raw: Option<RawSelector>) -> Selector {
    match raw {
        None => Selector::default(),
        Some(s) => {
            let globs = |v: Option<OneOrMany>| {
                v.map(OneOrMany::list)
                    .unwrap_or_default()
                    .into_iter()
                    .map(Glob)
                    .collect::<Vec<_>>()
            };
            Selector {
                names: globs(s.name),
                labels: s.labels,
                within: s.within.map(OneOrMany::list).unwrap_or_default(),
                class: globs(s.class),
                project: globs(s.project),
                user: globs(s.user),
                priority_min: s.priority_min,
                priority_max: s.priority_max,
                deferrable: s.deferrable,
                preemptible: s.preemptible,
            }
        }
    }
}

/// A selector selects what its scope has: jobs by their fields, equipment by labels
/// and `within` (each `kind/name`).
fn check_selector(
    select: &Selector,
    scope: ScopeKind,
    name: &str,
    select_at: usize,
    c: &mut Collector<'_>,
) {
    if scope != ScopeKind::Job && select.is_job_selector() {
        c.at(
            select_at..select_at,
            format!("rule `{name}`: class, project, user, priority, deferrable and preemptible select jobs; use scope = \"job\""),
        );
    }
    if scope == ScopeKind::Job && (!select.labels.is_empty() || !select.within.is_empty()) {
        c.at(
            select_at..select_at,
            format!("rule `{name}`: labels and within select equipment, not jobs"),
        );
    }
    for w in &select.within {
        let ok = w.split_once('/').is_some_and(|(k, v)| {
            ["room", "row", "rack", "cooling", "pdu", "feed", "node"].contains(&k) && !v.is_empty()
        });
        if !ok {
            c.at(
                select_at..select_at,
                format!("rule `{name}`: within `{w}` must be kind/name, e.g. row/row-a"),
            );
        }
    }
}

/// The rule's one action, its value in range and its scope one it acts on; `None`
/// where it names none or more than one.
fn action(
    raw: &Spanned<RawAction>,
    scope: ScopeKind,
    name: &str,
    c: &mut Collector<'_>,
) -> Option<RuleAction> {
    let a = raw.get_ref();
    let mut actions = Vec::new();
    if let Some(w) = a.cap_w {
        actions.push(RuleAction::CapW(w));
    }
    if let Some(p) = a.cap_pct {
        actions.push(RuleAction::CapPct(p));
    }
    if let Some(m) = a.lock_clocks_mhz {
        actions.push(RuleAction::LockClocks(m));
    }
    for (flag, act) in [
        (a.hold, RuleAction::Hold),
        (a.release, RuleAction::Release),
        (a.requeue, RuleAction::Requeue),
        (a.suspend, RuleAction::Suspend),
    ] {
        if flag == Some(true) {
            actions.push(act);
        }
    }
    let action = match actions.as_slice() {
        [one] => *one,
        [] => {
            c.at(
                raw.span(),
                format!("rule `{name}`: the action needs one of cap_w, cap_pct, lock_clocks_mhz, hold, release, requeue, suspend"),
            );
            return None;
        }
        _ => {
            c.at(
                raw.span(),
                format!(
                    "rule `{name}`: one action per rule (found {}); write two rules",
                    actions
                        .iter()
                        .map(|a| a.kind())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            );
            return None;
        }
    };
    check_action(raw, action, scope, name, c);
    Some(action)
}

/// An action's value within its range, and a job action on the job scope.
fn check_action(
    raw: &Spanned<RawAction>,
    action: RuleAction,
    scope: ScopeKind,
    name: &str,
    c: &mut Collector<'_>,
) {
    match action {
        RuleAction::CapW(w) if !(w > 0.0 && w <= 5000.0) => c.at(
            raw.span(),
            format!("rule `{name}`: cap_w must be within 0..=5000 W, got {w}"),
        ),
        RuleAction::CapPct(p) if !(p > 0.0 && p <= 100.0) => c.at(
            raw.span(),
            format!("rule `{name}`: cap_pct must be within 0..=100, got {p}"),
        ),
        RuleAction::LockClocks(m) if !(m > 0.0 && m <= 5000.0) => c.at(
            raw.span(),
            format!("rule `{name}`: lock_clocks_mhz must be within 0..=5000, got {m}"),
        ),
        _ => {}
    }
    if action.is_job_action() && scope != ScopeKind::Job {
        c.at(
            raw.span(),
            format!(
                "rule `{name}`: {} acts on jobs; use scope = \"job\"",
                action.kind()
            ),
        );
    }
}

/// The rule's `when` and `release`, compiled, their signals checked against the scope,
/// and a release that would flap with its `when` reported.
fn conditions(
    src: &str,
    raw_when: &Option<Spanned<String>>,
    raw_release: &Option<Spanned<String>>,
    name: &str,
    scope: ScopeKind,
    at: usize,
    c: &mut Collector<'_>,
) -> (Option<Condition>, Option<Condition>) {
    let when = raw_when
        .as_ref()
        .and_then(|w| compile_condition(src, c, w, &format!("rule `{name}`: when")));
    let release = raw_release
        .as_ref()
        .and_then(|w| compile_condition(src, c, w, &format!("rule `{name}`: release")));
    if raw_release.is_some() && raw_when.is_none() {
        c.at(
            raw_release.as_ref().map_or(at..at, |s| s.span()),
            format!("rule `{name}`: release without when: the rule is always active"),
        );
    }
    for (cond, raw) in [(&when, raw_when), (&release, raw_release)] {
        if let (Some(cond), Some(raw)) = (cond, raw) {
            check_signals(src, c, name, scope, cond, raw);
        }
    }
    if let (Some(w), Some(rel), Some(raw)) = (&when, &release, raw_release) {
        if let Some(msg) = overlap(w, rel) {
            c.at(raw.span(), format!("rule `{name}`: {msg}"));
        }
    }
    (when, release)
}

/// `ramp_per_min`: positive, and on a cap.
fn ramp_per_min(s: &Spanned<f64>, action: RuleAction, name: &str, c: &mut Collector<'_>) -> f64 {
    let v = *s.get_ref();
    if !(v > 0.0 && v.is_finite()) {
        c.at(
            s.span(),
            format!("rule `{name}`: ramp_per_min must be positive, got {v}"),
        );
    }
    if !matches!(action, RuleAction::CapW(_) | RuleAction::CapPct(_)) {
        c.at(
            s.span(),
            format!("rule `{name}`: ramp_per_min applies to caps only"),
        );
    }
    v
}

/// Rules on the same scope and selector under the same condition whose actions cannot
/// both take effect.
fn contradictions(rules: &[Rule], c: &mut Collector<'_>) {
    for (i, a) in rules.iter().enumerate() {
        for b in &rules[i + 1..] {
            if a.scope != b.scope
                || a.select != b.select
                || a.when.as_ref().map(|w| &w.text) != b.when.as_ref().map(|w| &w.text)
                || !a.enabled
                || !b.enabled
            {
                continue;
            }
            let msg = match (a.action, b.action) {
                (RuleAction::Hold, RuleAction::Release) | (RuleAction::Release, RuleAction::Hold) => Some(
                    "holds and releases the same jobs under the same condition (release wins, so the hold never takes effect)".to_string(),
                ),
                (RuleAction::CapW(x), RuleAction::CapW(y)) if x != y => Some(format!(
                    "caps the same GPUs under the same condition at {x} W and {y} W (the lower wins, so one rule never takes effect)"
                )),
                (RuleAction::CapPct(x), RuleAction::CapPct(y)) if x != y => Some(format!(
                    "caps the same GPUs under the same condition at {x}% and {y}% (the lower wins, so one rule never takes effect)"
                )),
                (RuleAction::LockClocks(x), RuleAction::LockClocks(y)) if x != y => Some(format!(
                    "locks the same GPUs under the same condition at {x} MHz and {y} MHz"
                )),
                _ => None,
            };
            if let Some(m) = msg {
                c.at(
                    b.at..b.at,
                    format!("rule `{}` contradicts rule `{}`: {m}", b.name, a.name),
                );
            }
        }
    }
}
