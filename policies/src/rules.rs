//! Policy rules: `[[rules]]` tables that SREs write, each a scope and selector, a
//! condition with durations and a release condition, and one action with a lease.
//!
//! ```toml
//! [[rules]]
//! name = "hot-aisle-b"
//! scope = "rack"
//! select = { name = "b*" }
//! when = "inlet_temp_c > 32 for 30s"
//! release = "inlet_temp_c < 30 for 2m"
//! action = { cap_pct = 80 }
//! min_hold = "5m"
//! ramp_per_min = 10
//! on_stale = "assume_worst"
//! ```

use std::collections::BTreeMap;
use std::ops::Range;

use serde::{Deserialize, Serialize};
use telemetry::diag::Collector;
use toml::Spanned;

use crate::expr::{self, Condition, Signal};

/// What a rule does when its signal is stale or missing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnStale {
    /// Act as if the signal were past its threshold (the protective choice).
    AssumeWorst,
    /// Keep what is in force; neither tighten nor release.
    HoldLast,
    /// Act as if the rule's condition were false: release what it holds.
    Ignore,
}

/// What a rule is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum ScopeKind {
    Site,
    Room,
    Row,
    Rack,
    Node,
    Gpu,
    Cooling,
    Pdu,
    Feed,
    Job,
}

impl ScopeKind {
    pub const NAMES: [&'static str; 10] = [
        "site", "room", "row", "rack", "node", "gpu", "cooling", "pdu", "feed", "job",
    ];

    fn parse(s: &str) -> Option<ScopeKind> {
        Some(match s {
            "site" => ScopeKind::Site,
            "room" => ScopeKind::Room,
            "row" => ScopeKind::Row,
            "rack" => ScopeKind::Rack,
            "node" => ScopeKind::Node,
            "gpu" => ScopeKind::Gpu,
            "cooling" => ScopeKind::Cooling,
            "pdu" => ScopeKind::Pdu,
            "feed" => ScopeKind::Feed,
            "job" => ScopeKind::Job,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        Self::NAMES[self as usize]
    }
}

/// A glob over names: `*` any run of characters, `?` one character.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Glob(pub String);

impl Glob {
    pub fn matches(&self, s: &str) -> bool {
        fn go(p: &[u8], s: &[u8]) -> bool {
            match (p.first(), s.first()) {
                (None, None) => true,
                (Some(b'*'), _) => go(&p[1..], s) || (!s.is_empty() && go(p, &s[1..])),
                (Some(b'?'), Some(_)) => go(&p[1..], &s[1..]),
                (Some(a), Some(b)) if a == b => go(&p[1..], &s[1..]),
                _ => false,
            }
        }
        go(self.0.as_bytes(), s.as_bytes())
    }
}

/// Which entities or jobs of the scope a rule applies to. Empty lists match all.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Selector {
    /// Entity names (rack `a01`, node `n1`, GPU `n1/0`, …) by glob.
    pub names: Vec<Glob>,
    /// Labels every selected rack must carry (racks' labels; nodes and GPUs inherit).
    pub labels: BTreeMap<String, String>,
    /// Only entities inside one of these: `room/…`, `row/…`, `rack/…`, `cooling/…`.
    pub within: Vec<String>,
    pub class: Vec<Glob>,
    pub project: Vec<Glob>,
    pub user: Vec<Glob>,
    pub priority_min: Option<i32>,
    pub priority_max: Option<i32>,
    pub deferrable: Option<bool>,
    pub preemptible: Option<bool>,
}

impl Selector {
    pub fn matches_job(&self, j: &telemetry::Job) -> bool {
        let any = |globs: &[Glob], s: &str| globs.is_empty() || globs.iter().any(|g| g.matches(s));
        any(&self.names, &j.id)
            && any(&self.class, &j.class)
            && any(&self.project, &j.project)
            && any(&self.user, &j.user)
            && self.priority_min.is_none_or(|p| j.priority >= p)
            && self.priority_max.is_none_or(|p| j.priority <= p)
            && self.deferrable.is_none_or(|d| j.deferrable == d)
            && self.preemptible.is_none_or(|d| j.preemptible == d)
    }

    fn is_job_selector(&self) -> bool {
        !self.class.is_empty()
            || !self.project.is_empty()
            || !self.user.is_empty()
            || self.priority_min.is_some()
            || self.priority_max.is_some()
            || self.deferrable.is_some()
            || self.preemptible.is_some()
    }
}

/// What a rule does while it is active.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RuleAction {
    /// Cap every GPU of the scope at this many watts.
    CapW(f64),
    /// Cap every GPU at this share of its default limit, in %.
    CapPct(f64),
    /// Lock the SM clock of every GPU of the scope at this frequency.
    LockClocks(f64),
    /// Hold (defer) waiting jobs, never past their latest start.
    Hold,
    /// Release jobs: no rule holds them while this one is active.
    Release,
    /// Requeue running preemptible jobs (once per activation).
    Requeue,
    /// Suspend running preemptible jobs while active (resumed on release or lease end).
    Suspend,
}

impl RuleAction {
    pub fn kind(&self) -> &'static str {
        match self {
            RuleAction::CapW(_) => "cap_w",
            RuleAction::CapPct(_) => "cap_pct",
            RuleAction::LockClocks(_) => "lock_clocks_mhz",
            RuleAction::Hold => "hold",
            RuleAction::Release => "release",
            RuleAction::Requeue => "requeue",
            RuleAction::Suspend => "suspend",
        }
    }
    fn is_job_action(&self) -> bool {
        matches!(
            self,
            RuleAction::Hold | RuleAction::Release | RuleAction::Requeue | RuleAction::Suspend
        )
    }
}

/// A validated rule.
#[derive(Debug, Clone, PartialEq)]
pub struct Rule {
    pub name: String,
    pub description: String,
    pub enabled: bool,
    pub scope: ScopeKind,
    pub select: Selector,
    /// When it activates; `None`: always.
    pub when: Option<Condition>,
    /// When it releases; `None`: as soon as `when` no longer holds.
    pub release: Option<Condition>,
    pub action: RuleAction,
    /// Once active it stays at least this long.
    pub min_hold_s: f64,
    pub lease_s: f64,
    /// How fast the rule's cap moves, in the action's unit (W or %) per minute;
    /// `None`: at once.
    pub ramp_per_min: Option<f64>,
    pub on_stale: OnStale,
    pub observe: bool,
    /// Where the rule starts in the file (byte offset), for diagnostics.
    pub at: usize,
    /// Where its selector and action are, for diagnostics.
    pub select_at: usize,
    pub action_at: usize,
}

impl Rule {
    /// The audit name of the rule: `rules.NAME`.
    pub fn id(&self) -> String {
        format!("rules.{}", self.name)
    }
}

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

/// Why a duration's text is not one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    #[error("empty duration")]
    Empty,
    #[error("`{0}` is not a duration (e.g. 30s, 5m, 1h30m)")]
    NotANumber(String),
    #[error("`{text}`: unknown unit `{unit}` (ms, s, m, h, d)")]
    UnknownUnit { text: String, unit: String },
    #[error("`{0}`: a number without a unit at the end")]
    NoUnitAtEnd(String),
    #[error("`{0}` is not a duration")]
    NotADuration(String),
}

/// Parses `30s`, `2m`, `1h`, `1d`, `1h30m`, or a number of seconds.
pub fn parse_duration(text: &str) -> Result<f64, DurationError> {
    let t = text.trim();
    if t.is_empty() {
        return Err(DurationError::Empty);
    }
    let mut total = 0.0;
    let mut num = String::new();
    let mut chars = t.chars().peekable();
    let mut any = false;
    while let Some(c) = chars.next() {
        if c.is_ascii_digit() || c == '.' {
            num.push(c);
            continue;
        }
        let mut unit = c.to_string();
        if c == 'm' && chars.peek() == Some(&'s') {
            unit.push('s');
            chars.next();
        }
        let n: f64 = num
            .parse()
            .map_err(|_| DurationError::NotANumber(text.to_string()))?;
        total += n * match unit.as_str() {
            "ms" => 0.001,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            "d" => 86400.0,
            _ => {
                return Err(DurationError::UnknownUnit {
                    text: text.to_string(),
                    unit,
                })
            }
        };
        num.clear();
        any = true;
    }
    if !num.is_empty() {
        if any {
            return Err(DurationError::NoUnitAtEnd(text.to_string()));
        }
        total = num
            .parse()
            .map_err(|_| DurationError::NotADuration(text.to_string()))?;
    }
    Ok(total)
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

/// The byte offset of the text of a TOML string value whose span is `span`: past the
/// opening quote(s). Multi-line strings open with three.
fn string_start(src: &str, span: &Range<usize>) -> usize {
    let s = &src[span.start.min(src.len())..span.end.min(src.len())];
    if s.starts_with("\"\"\"") || s.starts_with("'''") {
        span.start + 3
    } else {
        span.start + 1
    }
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

/// Compiles and validates the rules of a policy file (problems go to `c`).
pub(crate) fn compile(src: &str, raw: Vec<RawRule>, c: &mut Collector<'_>) -> Vec<Rule> {
    let mut out: Vec<Rule> = Vec::new();
    let mut names: BTreeMap<String, ()> = BTreeMap::new();
    for r in raw {
        let name = r.name.get_ref().clone();
        let at = r.name.span().start;
        let valid_name = !name.is_empty()
            && name
                .chars()
                .all(|ch| ch.is_ascii_alphanumeric() || ch == '-' || ch == '_');
        if !valid_name {
            c.at(
                r.name.span(),
                format!("rule name `{name}` must be letters, digits, `-` or `_`"),
            );
        }
        if names.insert(name.clone(), ()).is_some() {
            c.at(r.name.span(), format!("rule `{name}` is defined twice"));
        }
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
                continue;
            }
        };
        let select_at = r.select.as_ref().map_or(at, |s| s.span().start);
        let select = match r.select.map(Spanned::into_inner) {
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
        };
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
                ["room", "row", "rack", "cooling", "pdu", "feed", "node"].contains(&k)
                    && !v.is_empty()
            });
            if !ok {
                c.at(
                    select_at..select_at,
                    format!("rule `{name}`: within `{w}` must be kind/name, e.g. row/row-a"),
                );
            }
        }
        let action_at = r.action.span().start;
        let a = r.action.get_ref();
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
                    r.action.span(),
                    format!("rule `{name}`: the action needs one of cap_w, cap_pct, lock_clocks_mhz, hold, release, requeue, suspend"),
                );
                continue;
            }
            _ => {
                c.at(
                    r.action.span(),
                    format!(
                        "rule `{name}`: one action per rule (found {}); write two rules",
                        actions
                            .iter()
                            .map(|a| a.kind())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                );
                continue;
            }
        };
        match action {
            RuleAction::CapW(w) if !(w > 0.0 && w <= 5000.0) => c.at(
                r.action.span(),
                format!("rule `{name}`: cap_w must be within 0..=5000 W, got {w}"),
            ),
            RuleAction::CapPct(p) if !(p > 0.0 && p <= 100.0) => c.at(
                r.action.span(),
                format!("rule `{name}`: cap_pct must be within 0..=100, got {p}"),
            ),
            RuleAction::LockClocks(m) if !(m > 0.0 && m <= 5000.0) => c.at(
                r.action.span(),
                format!("rule `{name}`: lock_clocks_mhz must be within 0..=5000, got {m}"),
            ),
            _ => {}
        }
        if action.is_job_action() && scope != ScopeKind::Job {
            c.at(
                r.action.span(),
                format!(
                    "rule `{name}`: {} acts on jobs; use scope = \"job\"",
                    action.kind()
                ),
            );
        }
        let when = r
            .when
            .as_ref()
            .and_then(|w| compile_condition(src, c, w, &format!("rule `{name}`: when")));
        let release = r
            .release
            .as_ref()
            .and_then(|w| compile_condition(src, c, w, &format!("rule `{name}`: release")));
        if r.release.is_some() && r.when.is_none() {
            c.at(
                r.release.as_ref().map_or(at..at, |s| s.span()),
                format!("rule `{name}`: release without when: the rule is always active"),
            );
        }
        for (cond, raw) in [(&when, &r.when), (&release, &r.release)] {
            if let (Some(cond), Some(raw)) = (cond, raw) {
                check_signals(src, c, &name, scope, cond, raw);
            }
        }
        if let (Some(w), Some(rel), Some(raw)) = (&when, &release, &r.release) {
            if let Some(msg) = overlap(w, rel) {
                c.at(raw.span(), format!("rule `{name}`: {msg}"));
            }
        }
        let ramp = r.ramp_per_min.as_ref().map(|s| {
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
        });
        let lease_s = duration(c, &r.lease, 300.0, &format!("rule `{name}`: lease"));
        if lease_s < 10.0 {
            c.at(
                r.lease.as_ref().map_or(at..at, |s| s.span()),
                format!("rule `{name}`: lease must be at least 10s, got {lease_s}s"),
            );
        }
        let min_hold_s = duration(c, &r.min_hold, 0.0, &format!("rule `{name}`: min_hold"));
        out.push(Rule {
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
        });
    }
    contradictions(&out, c);
    out
}

/// Metrics that have a limit in the site file for `headroom(...)`, by scope.
pub fn headroom_limit_known(scope: ScopeKind, metric: &str) -> bool {
    matches!(
        (scope, metric),
        (
            ScopeKind::Site | ScopeKind::Feed | ScopeKind::Pdu | ScopeKind::Rack,
            "power_w"
        ) | (ScopeKind::Rack, "inlet_temp_c")
            | (ScopeKind::Cooling, "heat_load_kw")
    )
}

fn check_signals(
    src: &str,
    c: &mut Collector<'_>,
    name: &str,
    scope: ScopeKind,
    cond: &Condition,
    raw: &Spanned<String>,
) {
    let base = string_start(src, &raw.span());
    for (sig, span) in cond.signals() {
        let at = base + span.start..base + span.start;
        let metric = match sig {
            Signal::Metric(m) | Signal::Gpus(_, m) | Signal::Headroom(m) => Some(m),
            _ => None,
        };
        if let Some(m) = metric {
            if telemetry::metric::spec(m).is_none() {
                c.at(
                    at.clone(),
                    format!("rule `{name}`: unknown metric `{m}`{}", suggest(m)),
                );
                continue;
            }
        }
        match sig {
            Signal::Gpus(..) if matches!(scope, ScopeKind::Gpu) => c.at(
                at,
                format!("rule `{name}`: sum/max/min/avg combine the GPUs of a scope; a gpu scope has one, use the metric itself"),
            ),
            Signal::Headroom(m) if !headroom_limit_known(scope, m) => c.at(
                at,
                format!("rule `{name}`: no limit for `{m}` on a {} (headroom knows power_w of site, feed, pdu and rack, inlet_temp_c of rack, heat_load_kw of cooling)", scope.name()),
            ),
            s if s.needs_job() && scope != ScopeKind::Job => c.at(
                at,
                format!("rule `{name}`: job signals need scope = \"job\""),
            ),
            Signal::Metric(_) if scope == ScopeKind::Job => c.at(
                at,
                format!("rule `{name}`: a job has no metrics of its own; use sum(...)/max(...) over its GPUs"),
            ),
            _ => {}
        }
    }
    // a comparison of a metric with a constant outside its physical range never changes
    for cmp in cond.compares() {
        let (sig, k, flipped) = match (&cmp.lhs, &cmp.rhs) {
            (
                expr::Expr::Signal(
                    Signal::Metric(m)
                    | Signal::Gpus(expr::Agg::Max | expr::Agg::Min | expr::Agg::Avg, m),
                    _,
                ),
                expr::Expr::Num(k),
            ) => (m, *k, false),
            (
                expr::Expr::Num(k),
                expr::Expr::Signal(
                    Signal::Metric(m)
                    | Signal::Gpus(expr::Agg::Max | expr::Agg::Min | expr::Agg::Avg, m),
                    _,
                ),
            ) => (m, *k, true),
            _ => continue,
        };
        let Some(spec) = telemetry::metric::spec(sig) else {
            continue;
        };
        let op = if flipped { flip(cmp.op) } else { cmp.op };
        let never = match op {
            expr::CmpOp::Gt => k >= spec.max,
            expr::CmpOp::Ge => k > spec.max,
            expr::CmpOp::Lt => k <= spec.min,
            expr::CmpOp::Le => k < spec.min,
            _ => false,
        };
        let always = match op {
            expr::CmpOp::Gt => k < spec.min,
            expr::CmpOp::Ge => k <= spec.min,
            expr::CmpOp::Lt => k > spec.max,
            expr::CmpOp::Le => k >= spec.max,
            _ => false,
        };
        if never || always {
            c.at(
                base + cmp.span.start..base + cmp.span.start,
                format!(
                    "rule `{name}`: impossible threshold: {sig} {op} {k} is {} ({sig} lies within {}..={} {})",
                    if never { "never true" } else { "always true" },
                    spec.min,
                    spec.max,
                    spec.unit
                ),
            );
        }
    }
}

fn flip(op: expr::CmpOp) -> expr::CmpOp {
    use expr::CmpOp::*;
    match op {
        Gt => Lt,
        Ge => Le,
        Lt => Gt,
        Le => Ge,
        o => o,
    }
}

fn suggest(m: &str) -> String {
    let known: Vec<&str> = telemetry::metric::all().iter().map(|s| s.name).collect();
    let close = known
        .iter()
        .filter(|k| {
            let a = m.split('_').next().unwrap_or(m);
            k.starts_with(a) || k.contains(m) || m.contains(*k)
        })
        .copied()
        .collect::<Vec<_>>();
    if close.is_empty() {
        String::new()
    } else {
        format!(" (did you mean {}?)", close.join(", "))
    }
}

/// A simple comparison of one signal with a constant: (signal, op, constant).
fn simple(c: &Condition) -> Option<(&Signal, expr::CmpOp, f64)> {
    match &c.cond {
        expr::Cond::Cmp(x) => match (&x.lhs, &x.rhs) {
            (expr::Expr::Signal(s, _), expr::Expr::Num(k)) => Some((s, x.op, *k)),
            (expr::Expr::Num(k), expr::Expr::Signal(s, _)) => Some((s, flip(x.op), *k)),
            _ => None,
        },
        _ => None,
    }
}

/// Whether `when` and `release` can hold at once for the same value (the rule would
/// flap): only decided for one comparison each on the same signal.
fn overlap(when: &Condition, release: &Condition) -> Option<String> {
    use expr::CmpOp::*;
    let (s1, o1, k1) = simple(when)?;
    let (s2, o2, k2) = simple(release)?;
    if s1 != s2 {
        return None;
    }
    let up = |o| matches!(o, Gt | Ge);
    let down = |o| matches!(o, Lt | Le);
    let clash = (up(o1) && down(o2) && k2 > k1)
        || (down(o1) && up(o2) && k2 < k1)
        || (up(o1) && up(o2))
        || (down(o1) && down(o2));
    clash.then(|| {
        format!(
            "release `{}` can hold together with when `{}`: values between them would switch the rule on and off (put the release threshold on the other side of the when threshold)",
            release.text, when.text
        )
    })
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs() {
        assert!(Glob("a*".into()).matches("a01"));
        assert!(Glob("*-gpu?".into()).matches("rack-gpu1"));
        assert!(!Glob("b*".into()).matches("a01"));
        assert!(Glob("*".into()).matches(""));
    }

    #[test]
    fn policy_check_reports_every_problem_with_its_position() {
        let src = r#"version = 1

[[rules]]
name = "flap"
scope = "rack"
when = "inlet_temp_c > 32 for 30s"
release = "inlet_temp_c < 34"
action = { cap_pct = 80 }

[[rules]]
name = "typo"
scope = "rack"
when = "inlet_temp > 30"
action = { cap_w = 250 }

[[rules]]
name = "hot"
scope = "racks"
action = { cap_pct = 80 }

[[rules]]
name = "boil"
scope = "rack"
when = "inlet_temp_c > 500"
action = { cap_w = 250 }

[[rules]]
name = "defer"
scope = "job"
select = { class = "batch" }
when = "price > 0.3"
action = { hold = true }

[[rules]]
name = "undefer"
scope = "job"
select = { class = "batch" }
when = "price > 0.3"
action = { release = true }

[[rules]]
name = "two"
scope = "rack"
action = { cap_w = 200, hold = true }

[[rules]]
name = "bad-syntax"
scope = "rack"
when = "inlet_temp_c >> 3"
action = { cap_w = 200 }

[[rules]]
name = "wrong-scope"
scope = "rack"
select = { class = "batch" }
when = "job.wait_s > 60"
action = { hold = true }
"#;
        let err = crate::Policy::parse("p.toml", src).expect_err("invalid");
        let text = err.to_string();
        for want in [
            "p.toml:7:11: rule `flap`: release `inlet_temp_c < 34` can hold together with when",
            "p.toml:13:9: rule `typo`: unknown metric `inlet_temp` (did you mean inlet_temp_c?)",
            "p.toml:18:9: rule `hot`: unknown scope `racks`",
            "p.toml:24:9: rule `boil`: impossible threshold: inlet_temp_c > 500 is never true",
            "p.toml:35:8: rule `undefer` contradicts rule `defer`",
            "p.toml:44:10: rule `two`: one action per rule (found cap_w, hold)",
            "p.toml:49:23: rule `bad-syntax`: when: expected a number or a signal",
            "p.toml:55:10: rule `wrong-scope`: class, project, user, priority, deferrable and preemptible select jobs",
            "p.toml:56:9: rule `wrong-scope`: job signals need scope = \"job\"",
            "p.toml:57:10: rule `wrong-scope`: hold acts on jobs; use scope = \"job\"",
        ] {
            assert!(text.contains(want), "missing {want:?} in\n{text}");
        }
        assert_eq!(err.problems.len(), 10, "{text}");
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("30s"), Ok(30.0));
        assert_eq!(parse_duration("1h30m"), Ok(5400.0));
        assert_eq!(parse_duration("250ms"), Ok(0.25));
        assert_eq!(parse_duration("90"), Ok(90.0));
        assert!(parse_duration("5 parsecs").is_err());
        assert!(parse_duration("1h30").is_err());
    }
}
