//! The condition language of policy rules: `inlet_temp_c > 32 for 30s`,
//! `price > price.p75(24h) and hour >= 8`, `headroom(power_w) < 2000`.
//!
//! ```text
//! cond    := or
//! or      := and ("or" and)*
//! and     := unary ("and" unary)*
//! unary   := "not" unary | "(" cond ")" | compare
//! compare := expr OP expr ["for" DURATION]        OP: > >= < <= == !=
//! expr    := term (("+" | "-") term)*
//! term    := factor (("*" | "/") factor)*
//! factor  := NUMBER | "-" factor | "(" expr ")" | signal
//! signal  := NAME ("." NAME)* ["(" args ")"]
//! ```
//!
//! Parsing gives every problem with its byte offset in the expression, so that
//! `policy check` can point at the very character.

mod lex;
mod parser;
mod signals;

use std::fmt;

use lex::{lex, Tok};
use parser::Parser;

pub use signals::SignalError;

/// A span of the expression text, in bytes.
pub type Span = std::ops::Range<usize>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CmpOp {
    Gt,
    Ge,
    Lt,
    Le,
    Eq,
    Ne,
}

impl CmpOp {
    pub fn apply(self, a: f64, b: f64) -> bool {
        match self {
            CmpOp::Gt => a > b,
            CmpOp::Ge => a >= b,
            CmpOp::Lt => a < b,
            CmpOp::Le => a <= b,
            CmpOp::Eq => (a - b).abs() < 1e-9,
            CmpOp::Ne => (a - b).abs() >= 1e-9,
        }
    }
    fn text(self) -> &'static str {
        match self {
            CmpOp::Gt => ">",
            CmpOp::Ge => ">=",
            CmpOp::Lt => "<",
            CmpOp::Le => "<=",
            CmpOp::Eq => "==",
            CmpOp::Ne => "!=",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BinOp {
    Add,
    Sub,
    Mul,
    Div,
}

/// How GPU readings of a scope are combined.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Agg {
    Sum,
    Max,
    Min,
    Avg,
}

/// A statistic of a forecast series (price or carbon).
#[derive(Debug, Clone, PartialEq)]
pub enum Stat {
    /// The value in force now.
    Now,
    Min(f64),
    Max(f64),
    Mean(f64),
    /// Percentile `p` (0..=100) over the next `window` seconds.
    Pct(f64, f64),
    /// The highest value among the cheapest `hours` of the next `window` seconds.
    Cheapest(f64, f64),
    /// For a job: the highest value among the cheapest hours it needs before its
    /// latest end (its estimated duration, up to its deadline).
    CheapestBeforeDeadline,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Series {
    Price,
    Carbon,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeField {
    Hour,
    Minute,
    Weekday,
    Day,
    Month,
    Weekend,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobField {
    Priority,
    Gpus,
    WaitS,
    SlackS,
    EstDurationS,
}

impl JobField {
    /// The field's name after `job.`.
    pub fn name(self) -> &'static str {
        match self {
            JobField::Priority => "priority",
            JobField::Gpus => "gpus",
            JobField::WaitS => "wait_s",
            JobField::SlackS => "slack_s",
            JobField::EstDurationS => "est_duration_s",
        }
    }
}

/// The site's queue: the jobs that wait in their scheduler's queue for GPUs (pending,
/// not held by powerplane), the same for every target of a rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QueueField {
    /// Waiting jobs.
    Jobs,
    /// GPUs the waiting jobs ask for.
    Gpus,
    /// GPUs the waiting jobs ask for beyond those no running or suspended job holds:
    /// work that cannot start until running work ends (0 when the hall has room).
    ShortGpus,
    /// The least slack (latest start − now) of a waiting job with a deadline, in
    /// seconds; 10^12 when none has one.
    MinSlackS,
}

impl QueueField {
    /// The field's name after `queue.`.
    pub fn name(self) -> &'static str {
        match self {
            QueueField::Jobs => "jobs",
            QueueField::Gpus => "gpus",
            QueueField::ShortGpus => "short_gpus",
            QueueField::MinSlackS => "min_slack_s",
        }
    }
}

/// Something the engine measures or knows.
#[derive(Debug, Clone, PartialEq)]
pub enum Signal {
    /// A metric of the scope's own entity.
    Metric(String),
    /// A metric over the GPUs of the scope.
    Gpus(Agg, String),
    /// The scope's limit for a metric minus its value.
    Headroom(String),
    Forecast(Series, Stat),
    Time(TimeField),
    Job(JobField),
    Queue(QueueField),
}

impl Signal {
    /// Whether the signal needs a job scope.
    pub fn needs_job(&self) -> bool {
        matches!(
            self,
            Signal::Job(_) | Signal::Forecast(_, Stat::CheapestBeforeDeadline)
        )
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Expr {
    Num(f64),
    Signal(Signal, Span),
    Neg(Box<Expr>),
    Bin(Box<Expr>, BinOp, Box<Expr>),
}

/// A comparison, with its own `for` duration and an index for the engine's timers.
#[derive(Debug, Clone, PartialEq)]
pub struct Compare {
    pub lhs: Expr,
    pub op: CmpOp,
    pub rhs: Expr,
    pub for_s: f64,
    /// Position among the condition's comparisons (the key of its timer).
    pub id: usize,
    pub span: Span,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Cond {
    Cmp(Compare),
    And(Vec<Cond>),
    Or(Vec<Cond>),
    Not(Box<Cond>),
}

/// A parsed condition with its source text.
#[derive(Debug, Clone, PartialEq)]
pub struct Condition {
    pub text: String,
    pub cond: Cond,
}

impl fmt::Display for Condition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl Condition {
    /// Every comparison, in order.
    pub fn compares(&self) -> Vec<&Compare> {
        fn walk<'a>(c: &'a Cond, out: &mut Vec<&'a Compare>) {
            match c {
                Cond::Cmp(x) => out.push(x),
                Cond::And(v) | Cond::Or(v) => v.iter().for_each(|c| walk(c, out)),
                Cond::Not(c) => walk(c, out),
            }
        }
        let mut out = Vec::new();
        walk(&self.cond, &mut out);
        out
    }

    /// Every signal with its span.
    pub fn signals(&self) -> Vec<(&Signal, &Span)> {
        fn walk<'a>(e: &'a Expr, out: &mut Vec<(&'a Signal, &'a Span)>) {
            match e {
                Expr::Num(_) => {}
                Expr::Signal(s, sp) => out.push((s, sp)),
                Expr::Neg(e) => walk(e, out),
                Expr::Bin(a, _, b) => {
                    walk(a, out);
                    walk(b, out);
                }
            }
        }
        let mut out = Vec::new();
        for c in self.compares() {
            walk(&c.lhs, &mut out);
            walk(&c.rhs, &mut out);
        }
        out
    }
}

/// A parse problem at a byte offset of the expression (its text is what `policy check`
/// shows at that offset).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct ParseError {
    pub at: usize,
    pub message: String,
}

/// Parses a condition; `Err` holds every problem found (the parser stops at the first
/// syntax error, so usually one).
pub fn parse(src: &str) -> Result<Condition, Vec<ParseError>> {
    let toks = lex(src).map_err(|e| vec![e])?;
    if toks.is_empty() {
        return Err(vec![ParseError {
            at: 0,
            message: "empty condition".into(),
        }]);
    }
    let mut p = Parser {
        toks,
        pos: 0,
        end: src.len(),
        next_id: 0,
    };
    let cond = p.or().map_err(|e| vec![e])?;
    if let Some((t, sp)) = p.toks.get(p.pos) {
        let what = match t {
            Tok::Name(n) => format!("`{n}`"),
            _ => format!("`{}`", &src[sp.clone()]),
        };
        return Err(vec![ParseError {
            at: sp.start,
            message: format!("unexpected {what}; conditions are joined with `and` / `or`"),
        }]);
    }
    Ok(Condition {
        text: src.to_string(),
        cond,
    })
}

impl fmt::Display for CmpOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.text())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cmp(c: &Condition, i: usize) -> &Compare {
        c.compares()[i]
    }

    #[test]
    fn comparison_with_duration() {
        let c = parse("inlet_temp_c > 32 for 30s").expect("parses");
        let x = cmp(&c, 0);
        assert_eq!(x.op, CmpOp::Gt);
        assert_eq!(x.for_s, 30.0);
        assert_eq!(
            x.lhs,
            Expr::Signal(Signal::Metric("inlet_temp_c".into()), 0..12)
        );
        assert_eq!(x.rhs, Expr::Num(32.0));
    }

    #[test]
    fn boolean_structure_and_signals() {
        let c = parse(
            "(price > price.p75(24h) or carbon > 400) and not weekend == 1 and headroom(power_w) < 2.5*1000 for 2m",
        )
        .expect("parses");
        let Cond::And(parts) = &c.cond else {
            panic!("and expected: {:?}", c.cond)
        };
        assert_eq!(parts.len(), 3);
        assert!(matches!(parts[0], Cond::Or(_)));
        assert!(matches!(parts[1], Cond::Not(_)));
        let sigs: Vec<_> = c.signals().into_iter().map(|s| s.0.clone()).collect();
        assert_eq!(
            sigs,
            vec![
                Signal::Forecast(Series::Price, Stat::Now),
                Signal::Forecast(Series::Price, Stat::Pct(75.0, 86400.0)),
                Signal::Forecast(Series::Carbon, Stat::Now),
                Signal::Time(TimeField::Weekend),
                Signal::Headroom("power_w".into()),
            ]
        );
        assert_eq!(cmp(&c, 3).for_s, 120.0);
        assert_eq!(
            c.compares().iter().map(|c| c.id).collect::<Vec<_>>(),
            vec![0, 1, 2, 3]
        );
    }

    #[test]
    fn parenthesised_arithmetic_is_not_a_condition() {
        let c = parse("(max(gpu_temp_c) - 5) * 2 > 150").expect("parses");
        assert!(matches!(c.cond, Cond::Cmp(_)));
    }

    #[test]
    fn errors_point_at_the_character() {
        let e = parse("inlet_temp_c > 32 for 30x").expect_err("invalid");
        assert_eq!(e[0].at, 24);
        assert!(e[0].message.contains("unknown unit"), "{:?}", e);
        let e = parse("inlet_temp_c = 32").expect_err("invalid");
        assert_eq!(e[0].at, 13);
        let e = parse("inlet_temp_c 32").expect_err("invalid");
        assert_eq!(e[0].at, 13);
        let e = parse("price.p75 > 1").expect_err("invalid");
        assert!(e[0].message.contains("duration"), "{:?}", e);
        let e = parse("price.cheapest(30h, 24h) > 1").expect_err("invalid");
        assert!(e[0].message.contains("cannot fit"), "{:?}", e);
        let e = parse("job.colour > 1").expect_err("invalid");
        assert!(e[0].message.contains("unknown job field"), "{:?}", e);
        let e = parse("a > 1 b > 2").expect_err("invalid");
        assert!(e[0].message.contains("joined with"), "{:?}", e);
        assert!(parse("  ").is_err());
    }
}
