//! The expression's tokens: numbers, durations, names, operators and punctuation.

use super::{CmpOp, ParseError, Span};

#[derive(Debug, Clone, PartialEq)]
pub(super) enum Tok {
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

/// The tokens of an expression, each with its span; the first problem, if any.
pub(super) fn lex(src: &str) -> Result<Vec<(Tok, Span)>, ParseError> {
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
            let (tok, end) = number(src, start)?;
            i = end;
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
        let (tok, len) = symbol(src, i, c)?;
        i += len;
        out.push((tok, start..i));
    }
    Ok(out)
}

/// The number (or duration: a unit right after the digits) at `start`, and where it
/// ends.
fn number(src: &str, start: usize) -> Result<(Tok, usize), ParseError> {
    let b = src.as_bytes();
    let mut i = start;
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
    Ok((tok, i))
}

/// The operator or punctuation at `i` (its first character `c`), and its length.
fn symbol(src: &str, i: usize, c: char) -> Result<(Tok, usize), ParseError> {
    let two = src.get(i..i + 2).unwrap_or("");
    Ok(match two {
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
    })
}
