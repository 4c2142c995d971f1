//! The parser: tokens into a condition tree, by the grammar of [`super`].

use super::lex::Tok;
use super::signals::resolve;
use super::{BinOp, Compare, Cond, Expr, ParseError, Span};

/// A recursive-descent parser over the tokens, by the grammar of [`super`].
pub(super) struct Parser {
    pub(super) toks: Vec<(Tok, Span)>,
    pub(super) pos: usize,
    pub(super) end: usize,
    pub(super) next_id: usize,
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

    pub(super) fn or(&mut self) -> Result<Cond, ParseError> {
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
        let signal = resolve(&path, &args).map_err(|e| ParseError {
            at: span.start,
            message: e.to_string(),
        })?;
        Ok(Expr::Signal(signal, span))
    }
}
