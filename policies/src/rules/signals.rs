//! The signals of a rule's conditions checked against its scope and the metrics'
//! physical ranges, and a `release` that would flap with its `when`.

use std::ops::Range;
use telemetry::diag::Collector;

use toml::Spanned;

use super::ScopeKind;
use crate::expr::{self, Condition, Signal};
use crate::rules::headroom_limit_known;

/// The byte offset of the text of a TOML string value whose span is `span`: past the
/// opening quote(s). Multi-line strings open with three.
pub(super) fn string_start(src: &str, span: &Range<usize>) -> usize {
    let s = &src[span.start.min(src.len())..span.end.min(src.len())];
    if s.starts_with("\"\"\"") || s.starts_with("'''") {
        span.start + 3
    } else {
        span.start + 1
    }
}

/// The signals of a rule's condition: known metrics, and signals its scope has; and
/// thresholds a metric can reach.
pub(super) fn check_signals(
    src: &str,
    c: &mut Collector<'_>,
    name: &str,
    scope: ScopeKind,
    cond: &Condition,
    raw: &Spanned<String>,
) {
    let base = string_start(src, &raw.span());
    check_signal_kinds(base, c, name, scope, cond);
    check_thresholds(base, c, name, cond);
}

/// Each signal: a metric the telemetry knows, and one the rule's scope has (`base`:
/// where the condition's text starts in the file).
fn check_signal_kinds(
    base: usize,
    c: &mut Collector<'_>,
    name: &str,
    scope: ScopeKind,
    cond: &Condition,
) {
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
}

/// A comparison of a metric with a constant outside its physical range never changes.
fn check_thresholds(base: usize, c: &mut Collector<'_>, name: &str, cond: &Condition) {
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
pub(super) fn overlap(when: &Condition, release: &Condition) -> Option<String> {
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
