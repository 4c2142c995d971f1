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

mod compile;
mod signals;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::expr::Condition;

pub(crate) use compile::{compile, RawRule};

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
