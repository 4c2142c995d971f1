//! A rule's texts for the audit: the names of its signals, what it acts on, what
//! releases it, and a target's name.

use std::sync::Arc;

use telemetry::{EntityId, Job};

use crate::expr::{Agg, Condition, Series, Signal, Stat};
use crate::rules::{Rule, RuleAction};

/// A rule's texts for the audit, made once per run of the rule rather than for each
/// target it explains.
pub(super) struct Texts<'r> {
    /// Every signal of `when`, then of `release`.
    pub(super) signals: Vec<&'r Signal>,
    /// The signals' names, then `stale_inputs` ([`Texts::stale`]), then the name of
    /// the rule's cap ([`Texts::cap`]).
    pub(super) names: Arc<[String]>,
    /// The condition the rule acts on.
    pub(super) reason: Arc<str>,
    /// The reason when a stale or missing signal is assumed the worst.
    pub(super) assumed: Arc<str>,
    /// What releases the rule.
    pub(super) release: Arc<str>,
}

impl<'r> Texts<'r> {
    pub(super) fn new(rule: &'r Rule) -> Self {
        let signals: Vec<&Signal> = [&rule.when, &rule.release]
            .into_iter()
            .flatten()
            .flat_map(|c| c.signals())
            .map(|(s, _)| s)
            .collect();
        let cap = match rule.action {
            RuleAction::CapPct(_) => "cap_pct",
            _ => "cap_w",
        };
        let names = signals
            .iter()
            .map(|s| signal_name(s))
            .chain(["stale_inputs".to_string(), cap.to_string()])
            .collect();
        let reason = condition_text(rule.when.as_ref());
        Texts {
            signals,
            names,
            assumed: format!("{reason}: a signal is stale or missing, assumed the worst").into(),
            reason: reason.into(),
            release: match (&rule.release, &rule.when) {
                (Some(r), _) => format!("{}{}", r.text, hold_note(rule)),
                (None, Some(w)) => format!("not ({}){}", w.text, hold_note(rule)),
                (None, None) => "the rule is removed or disabled".to_string(),
            }
            .into(),
        }
    }

    /// The position of `stale_inputs` in [`Texts::names`].
    pub(super) fn stale(&self) -> u32 {
        self.signals.len() as u32
    }

    /// The position of the cap's name in [`Texts::names`].
    pub(super) fn cap(&self) -> u32 {
        self.signals.len() as u32 + 1
    }
}

fn signal_name(s: &Signal) -> String {
    let dur = |w: f64| {
        if w % 3600.0 == 0.0 {
            format!("{}h", w / 3600.0)
        } else {
            format!("{}m", w / 60.0)
        }
    };
    let agg = |a: &Agg| match a {
        Agg::Sum => "sum",
        Agg::Max => "max",
        Agg::Min => "min",
        Agg::Avg => "avg",
    };
    match s {
        Signal::Metric(m) => m.clone(),
        Signal::Gpus(a, m) => format!("{}({m})", agg(a)),
        Signal::Headroom(m) => format!("headroom({m})"),
        Signal::Forecast(series, stat) => {
            let n = match series {
                Series::Price => "price",
                Series::Carbon => "carbon",
            };
            match stat {
                Stat::Now => n.to_string(),
                Stat::Min(w) => format!("{n}.min({})", dur(*w)),
                Stat::Max(w) => format!("{n}.max({})", dur(*w)),
                Stat::Mean(w) => format!("{n}.mean({})", dur(*w)),
                Stat::Pct(p, w) => format!("{n}.p{p}({})", dur(*w)),
                Stat::Cheapest(h, w) => format!("{n}.cheapest({h}h, {})", dur(*w)),
                Stat::CheapestBeforeDeadline => format!("{n}.cheapest_before_deadline"),
            }
        }
        Signal::Time(t) => format!("{t:?}").to_lowercase(),
        Signal::Job(f) => format!("job.{}", f.name()),
        Signal::Queue(f) => format!("queue.{}", f.name()),
    }
}

/// A target's name in the audit: `kind/name`, `job/id` for a job.
pub(super) fn target_name(entity: &EntityId, job: Option<&Job>) -> String {
    let (kind, name) = match job {
        Some(j) => ("job", j.id.as_str()),
        None => (entity.kind.as_str(), entity.name.as_str()),
    };
    let mut s = String::with_capacity(kind.len() + 1 + name.len());
    s.push_str(kind);
    s.push('/');
    s.push_str(name);
    s
}

pub(super) fn condition_text(c: Option<&Condition>) -> String {
    c.map_or_else(|| "always".to_string(), |c| c.text.clone())
}

pub(super) fn hold_note(rule: &Rule) -> String {
    if rule.min_hold_s > 0.0 {
        format!(" (held at least {}s)", rule.min_hold_s)
    } else {
        String::new()
    }
}
