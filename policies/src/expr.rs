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

use std::fmt;

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

/// A parse problem at a byte offset of the expression.
#[derive(Debug, Clone, PartialEq)]
pub struct ParseError {
    pub at: usize,
    pub message: String,
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Num(f64),
    /// A number with a duration unit, in seconds.
    Dur(f64),
    Name(String),
    Op(CmpOp),
    Plus,
    Minus,
    Star,
    Slash,
    LParen,
    RParen,
    Comma,
    Dot,
}

fn lex(src: &str) -> Result<Vec<(Tok, Span)>, ParseError> {
    let b = src.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i] as char;
        let start = i;
        if c.is_ascii_whitespace() {
            i += 1;
            continue;
        }
        if c.is_ascii_digit() || (c == '.' && b.get(i + 1).is_some_and(|d| d.is_ascii_digit())) {
            while i < b.len() && (b[i].is_ascii_digit() || b[i] == b'.' || b[i] == b'_') {
                i += 1;
            }
            let text: String = src[start..i].chars().filter(|c| *c != '_').collect();
            let n: f64 = text.parse().map_err(|_| ParseError {
                at: start,
                message: format!("`{}` is not a number", &src[start..i]),
            })?;
            // a unit right after the digits makes a duration: 30s, 2m, 1h, 1d
            let ustart = i;
            while i < b.len() && b[i].is_ascii_alphabetic() {
                i += 1;
            }
            let unit = &src[ustart..i];
            let tok = match unit {
                "" => Tok::Num(n),
                "ms" => Tok::Dur(n / 1000.0),
                "s" => Tok::Dur(n),
                "m" | "min" => Tok::Dur(n * 60.0),
                "h" => Tok::Dur(n * 3600.0),
                "d" => Tok::Dur(n * 86400.0),
                u => {
                    return Err(ParseError {
                        at: ustart,
                        message: format!("unknown unit `{u}` (durations take ms, s, m, h, d)"),
                    })
                }
            };
            out.push((tok, start..i));
            continue;
        }
        if c.is_ascii_alphabetic() || c == '_' {
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                i += 1;
            }
            out.push((Tok::Name(src[start..i].to_string()), start..i));
            continue;
        }
        let two = src.get(i..i + 2).unwrap_or("");
        let (tok, len) = match two {
            ">=" => (Tok::Op(CmpOp::Ge), 2),
            "<=" => (Tok::Op(CmpOp::Le), 2),
            "==" => (Tok::Op(CmpOp::Eq), 2),
            "!=" => (Tok::Op(CmpOp::Ne), 2),
            _ => match c {
                '>' => (Tok::Op(CmpOp::Gt), 1),
                '<' => (Tok::Op(CmpOp::Lt), 1),
                '+' => (Tok::Plus, 1),
                '-' => (Tok::Minus, 1),
                '*' => (Tok::Star, 1),
                '/' => (Tok::Slash, 1),
                '(' => (Tok::LParen, 1),
                ')' => (Tok::RParen, 1),
                ',' => (Tok::Comma, 1),
                '.' => (Tok::Dot, 1),
                '=' => {
                    return Err(ParseError {
                        at: i,
                        message: "`=` is not a comparison; write `==`".into(),
                    })
                }
                _ => {
                    return Err(ParseError {
                        at: i,
                        message: format!("unexpected character `{c}`"),
                    })
                }
            },
        };
        i += len;
        out.push((tok, start..i));
    }
    Ok(out)
}

struct Parser {
    toks: Vec<(Tok, Span)>,
    pos: usize,
    end: usize,
    next_id: usize,
}

impl Parser {
    fn peek(&self) -> Option<&Tok> {
        self.toks.get(self.pos).map(|t| &t.0)
    }
    fn at(&self) -> usize {
        self.toks.get(self.pos).map_or(self.end, |t| t.1.start)
    }
    fn bump(&mut self) -> Option<(Tok, Span)> {
        let t = self.toks.get(self.pos).cloned();
        self.pos += 1;
        t
    }
    fn is_word(&self, w: &str) -> bool {
        matches!(self.peek(), Some(Tok::Name(n)) if n == w)
    }
    fn fail<T>(&self, at: usize, message: impl Into<String>) -> Result<T, ParseError> {
        Err(ParseError {
            at,
            message: message.into(),
        })
    }

    fn or(&mut self) -> Result<Cond, ParseError> {
        let mut v = vec![self.and()?];
        while self.is_word("or") {
            self.bump();
            v.push(self.and()?);
        }
        Ok(if v.len() == 1 {
            v.remove(0)
        } else {
            Cond::Or(v)
        })
    }

    fn and(&mut self) -> Result<Cond, ParseError> {
        let mut v = vec![self.unary()?];
        while self.is_word("and") {
            self.bump();
            v.push(self.unary()?);
        }
        Ok(if v.len() == 1 {
            v.remove(0)
        } else {
            Cond::And(v)
        })
    }

    fn unary(&mut self) -> Result<Cond, ParseError> {
        if self.is_word("not") {
            self.bump();
            return Ok(Cond::Not(Box::new(self.unary()?)));
        }
        // a parenthesis opens either a condition or an arithmetic expression: try the
        // condition first and fall back
        if self.peek() == Some(&Tok::LParen) {
            let save = (self.pos, self.next_id);
            self.bump();
            if let Ok(c) = self.or() {
                if self.peek() == Some(&Tok::RParen) {
                    self.bump();
                    if !matches!(
                        self.peek(),
                        Some(Tok::Op(_) | Tok::Plus | Tok::Minus | Tok::Star | Tok::Slash)
                    ) {
                        return Ok(c);
                    }
                }
            }
            self.pos = save.0;
            self.next_id = save.1;
        }
        self.compare()
    }

    fn compare(&mut self) -> Result<Cond, ParseError> {
        let start = self.at();
        let lhs = self.expr()?;
        let op = match self.bump() {
            Some((Tok::Op(op), _)) => op,
            Some((_, sp)) => {
                return self.fail(
                    sp.start,
                    "expected a comparison (>, >=, <, <=, ==, !=) after the value",
                )
            }
            None => {
                return self.fail(
                    self.end,
                    "expected a comparison (>, >=, <, <=, ==, !=) at the end",
                )
            }
        };
        let rhs = self.expr()?;
        let mut for_s = 0.0;
        if self.is_word("for") {
            self.bump();
            match self.bump() {
                Some((Tok::Dur(d), _)) => for_s = d,
                Some((Tok::Num(0.0), _)) => {}
                Some((_, sp)) => {
                    return self.fail(sp.start, "`for` takes a duration such as 30s, 2m or 1h")
                }
                None => return self.fail(self.end, "`for` takes a duration such as 30s"),
            }
        }
        let end = self
            .toks
            .get(self.pos.saturating_sub(1))
            .map_or(self.end, |t| t.1.end);
        let id = self.next_id;
        self.next_id += 1;
        Ok(Cond::Cmp(Compare {
            lhs,
            op,
            rhs,
            for_s,
            id,
            span: start..end,
        }))
    }

    fn expr(&mut self) -> Result<Expr, ParseError> {
        let mut e = self.term()?;
        loop {
            let op = match self.peek() {
                Some(Tok::Plus) => BinOp::Add,
                Some(Tok::Minus) => BinOp::Sub,
                _ => return Ok(e),
            };
            self.bump();
            e = Expr::Bin(Box::new(e), op, Box::new(self.term()?));
        }
    }

    fn term(&mut self) -> Result<Expr, ParseError> {
        let mut e = self.factor()?;
        loop {
            let op = match self.peek() {
                Some(Tok::Star) => BinOp::Mul,
                Some(Tok::Slash) => BinOp::Div,
                _ => return Ok(e),
            };
            self.bump();
            e = Expr::Bin(Box::new(e), op, Box::new(self.factor()?));
        }
    }

    fn factor(&mut self) -> Result<Expr, ParseError> {
        match self.bump() {
            Some((Tok::Num(n), _)) => Ok(Expr::Num(n)),
            Some((Tok::Dur(d), _)) => Ok(Expr::Num(d)),
            Some((Tok::Minus, _)) => Ok(Expr::Neg(Box::new(self.factor()?))),
            Some((Tok::LParen, _)) => {
                let e = self.expr()?;
                match self.bump() {
                    Some((Tok::RParen, _)) => Ok(e),
                    Some((_, sp)) => self.fail(sp.start, "expected `)`"),
                    None => self.fail(self.end, "missing `)`"),
                }
            }
            Some((Tok::Name(n), sp)) => self.signal(n, sp),
            Some((_, sp)) => self.fail(sp.start, "expected a number or a signal"),
            None => self.fail(self.end, "expected a number or a signal at the end"),
        }
    }

    /// `name(.name)*` with optional call arguments (numbers, durations or a metric).
    fn signal(&mut self, first: String, sp: Span) -> Result<Expr, ParseError> {
        if ["and", "or", "not", "for"].contains(&first.as_str()) {
            return self.fail(sp.start, format!("expected a value, found `{first}`"));
        }
        let mut path = vec![first];
        let mut end = sp.end;
        while self.peek() == Some(&Tok::Dot) {
            self.bump();
            match self.bump() {
                Some((Tok::Name(n), s)) => {
                    path.push(n);
                    end = s.end;
                }
                Some((Tok::Num(n), s)) => {
                    // `price.p25` lexes as a name; `x.25` is an error
                    return self.fail(s.start, format!("unexpected number {n} after `.`"));
                }
                Some((_, s)) => return self.fail(s.start, "expected a name after `.`"),
                None => return self.fail(self.end, "expected a name after `.`"),
            }
        }
        let mut args: Vec<(Tok, Span)> = Vec::new();
        if self.peek() == Some(&Tok::LParen) {
            self.bump();
            loop {
                match self.bump() {
                    Some((Tok::RParen, s)) => {
                        end = s.end;
                        break;
                    }
                    Some((Tok::Comma, _)) => {}
                    Some((t @ (Tok::Num(_) | Tok::Dur(_) | Tok::Name(_)), s)) => args.push((t, s)),
                    Some((_, s)) => return self.fail(s.start, "unexpected token in arguments"),
                    None => return self.fail(self.end, "missing `)` after the arguments"),
                }
            }
        }
        let span = sp.start..end;
        let signal = resolve(&path, &args).map_err(|message| ParseError {
            at: span.start,
            message,
        })?;
        Ok(Expr::Signal(signal, span))
    }
}

fn dur_arg(args: &[(Tok, Span)], i: usize, what: &str) -> Result<f64, String> {
    match args.get(i) {
        Some((Tok::Dur(d), _)) if *d > 0.0 => Ok(*d),
        Some((Tok::Num(_), _)) => Err(format!(
            "{what} takes a duration with a unit, such as 6h or 90m"
        )),
        _ => Err(format!("{what} takes a duration such as 24h")),
    }
}

fn name_arg(args: &[(Tok, Span)], what: &str) -> Result<String, String> {
    match args {
        [(Tok::Name(n), _)] => Ok(n.clone()),
        _ => Err(format!(
            "{what} takes one metric name, e.g. {what}(power_w)"
        )),
    }
}

/// Turns a dotted name with arguments into a signal, or says why it is not one.
fn resolve(path: &[String], args: &[(Tok, Span)]) -> Result<Signal, String> {
    let p: Vec<&str> = path.iter().map(String::as_str).collect();
    let no_args = |s: Signal| {
        if args.is_empty() {
            Ok(s)
        } else {
            Err(format!("`{}` takes no arguments", p.join(".")))
        }
    };
    match p.as_slice() {
        [agg @ ("sum" | "max" | "min" | "avg")] => {
            let a = match *agg {
                "sum" => Agg::Sum,
                "max" => Agg::Max,
                "min" => Agg::Min,
                _ => Agg::Avg,
            };
            Ok(Signal::Gpus(a, name_arg(args, agg)?))
        }
        ["headroom"] => Ok(Signal::Headroom(name_arg(args, "headroom")?)),
        [s @ ("price" | "carbon"), rest @ ..] => {
            let series = if *s == "price" {
                Series::Price
            } else {
                Series::Carbon
            };
            let stat = match rest {
                [] if args.is_empty() => Stat::Now,
                ["now"] => Stat::Now,
                ["min"] => Stat::Min(dur_arg(args, 0, &format!("{s}.min"))?),
                ["max"] => Stat::Max(dur_arg(args, 0, &format!("{s}.max"))?),
                ["mean"] => Stat::Mean(dur_arg(args, 0, &format!("{s}.mean"))?),
                ["cheapest"] => {
                    let n = dur_arg(args, 0, &format!("{s}.cheapest"))?;
                    let w = dur_arg(args, 1, &format!("{s}.cheapest(hours, window)"))?;
                    if n > w {
                        return Err(format!(
                            "{s}.cheapest: {} h cannot fit in a window of {} h",
                            n / 3600.0,
                            w / 3600.0
                        ));
                    }
                    Stat::Cheapest(n / 3600.0, w)
                }
                ["cheapest_before_deadline"] if args.is_empty() => Stat::CheapestBeforeDeadline,
                [pct] if pct.starts_with('p') && pct[1..].parse::<f64>().is_ok() => {
                    let p: f64 = pct[1..].parse().unwrap_or(50.0);
                    if !(0.0..=100.0).contains(&p) {
                        return Err(format!("percentile {p} is outside 0..100"));
                    }
                    Stat::Pct(p, dur_arg(args, 0, &format!("{s}.{pct}"))?)
                }
                _ => {
                    return Err(format!(
                        "unknown signal `{}`: {s} takes .now, .min(W), .max(W), .mean(W), .pNN(W), .cheapest(H, W) or .cheapest_before_deadline",
                        p.join(".")
                    ))
                }
            };
            Ok(Signal::Forecast(series, stat))
        }
        [t @ ("hour" | "minute" | "weekday" | "day" | "month" | "weekend")] => {
            no_args(Signal::Time(match *t {
                "hour" => TimeField::Hour,
                "minute" => TimeField::Minute,
                "weekday" => TimeField::Weekday,
                "day" => TimeField::Day,
                "month" => TimeField::Month,
                _ => TimeField::Weekend,
            }))
        }
        ["job", f] => no_args(Signal::Job(match *f {
            "priority" => JobField::Priority,
            "gpus" => JobField::Gpus,
            "wait_s" => JobField::WaitS,
            "slack_s" => JobField::SlackS,
            "est_duration_s" => JobField::EstDurationS,
            other => {
                return Err(format!(
                "unknown job field `{other}`: job.priority, job.gpus, job.wait_s, job.slack_s or job.est_duration_s"
            ))
            }
        })),
        [metric] => no_args(Signal::Metric(metric.to_string())),
        _ => Err(format!("unknown signal `{}`", p.join("."))),
    }
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
