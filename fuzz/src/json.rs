//! Structural JSON mutations: a seed parsed to a [`Value`], one of its nodes replaced
//! (another type, an extreme number, a huge, empty or odd string, deep nesting, a long
//! array) or its keys removed, added or duplicated, and written back by a writer of
//! our own, which can also write what a `Value` cannot hold (a key twice, numbers out
//! of range).

use common::rng::Rng;
use serde_json::{Map, Number, Value};

use crate::bytes::below;

/// A string value written as it is, not quoted: how a number no `Value` holds
/// (`1e999`, a 40-digit integer) gets into the text.
const RAW: &str = "\u{e000}raw:";

/// Nesting the generator builds at most (serde_json refuses beyond 128).
pub const MAX_DEPTH: usize = 160;

/// Bytes one long array adds at most, so that a mutant stays within a message's size.
const MAX_GROWTH: usize = 256 * 1024;

/// Numbers at the edges: JSON has no NaN or infinity, so the largest, the smallest,
/// signed zero and integers past 64 bits.
const NUMBERS: &[&str] = &[
    "0",
    "-0",
    "-0.0",
    "1",
    "-1",
    "1e308",
    "-1e308",
    "1.7976931348623157e308",
    "5e-324",
    "1e999",
    "-1e999",
    "18446744073709551615",
    "18446744073709551616",
    "-9223372036854775808",
    "-9223372036854775809",
    "4294967296",
    "65536",
    "256",
    "255",
    "2147483648",
    "123456789012345678901234567890123456789",
    "0.1",
    "1e-7",
    "32503680000",
    "32503680000000",
];

/// Strings that mean something somewhere: empty, control and odd Unicode, look-alike
/// numbers and times, paths and topic wildcards.
const STRINGS: &[&str] = &[
    "",
    " ",
    "\0",
    "\u{7f}",
    "é",
    "𝄞",
    "\u{202e}abc",
    "\u{feff}",
    "\u{ffff}",
    "NaN",
    "inf",
    "-inf",
    "1e999",
    "-0",
    "0x10",
    "all",
    "ALL",
    "2999-01-01T00:00:00Z",
    "1970-01-01T00:00:00Z",
    "0000-00-00T00:00:00Z",
    "2024-02-30T25:61:61+99:99",
    "9999-12-31T23:59:59.999999999-23:59",
    "/",
    "//",
    "../../etc/passwd",
    "#",
    "+",
    "{",
    "{}",
    "%s%n",
    "gpu/",
    "gpu/n1/4294967296",
    "rack/",
    "sha256=",
];

/// Every key and short string in `v`: the format's own words, for added keys and
/// replaced strings.
pub fn words(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                out.push(k.clone());
                words(x, out);
            }
        }
        Value::Array(a) => a.iter().for_each(|x| words(x, out)),
        Value::String(s) if s.len() <= 64 => out.push(s.clone()),
        _ => {}
    }
}

fn pick<'a>(rng: &mut Rng, xs: &'a [&'a str]) -> &'a str {
    xs[below(rng, xs.len())]
}

/// A string from the dictionary, the odd ones, or a long or huge one.
pub fn string(rng: &mut Rng, dict: &[String]) -> String {
    match below(rng, 6) {
        0 | 1 if !dict.is_empty() => dict[below(rng, dict.len())].clone(),
        2 => {
            let n = [65, 129, 257, 1025, 70_000][below(rng, 5)];
            let unit = pick(rng, &["a", "é", "𝄞", "\0", "/"]);
            unit.repeat(n)
        }
        _ => pick(rng, STRINGS).to_string(),
    }
}

/// A number: an edge, or an ordinary one.
fn number(rng: &mut Rng) -> Value {
    match below(rng, 3) {
        0 => Value::String(format!("{RAW}{}", pick(rng, NUMBERS))),
        1 => Number::from_f64(rng.range(-1e6, 1e6)).map_or(Value::Null, Value::Number),
        _ => Value::Number(Number::from(rng.next_u64() >> below(rng, 64))),
    }
}

/// A value of any kind, nested at most `depth` deep.
fn any(rng: &mut Rng, dict: &[String], depth: usize) -> Value {
    match below(rng, if depth == 0 { 4 } else { 7 }) {
        0 => Value::Null,
        1 => Value::Bool(rng.next_u64() & 1 == 1),
        2 => number(rng),
        3 => Value::String(string(rng, dict)),
        4 => Value::Array(
            (0..below(rng, 4))
                .map(|_| any(rng, dict, depth - 1))
                .collect(),
        ),
        5 => nested(rng, depth.min(MAX_DEPTH)),
        _ => {
            let mut m = Map::new();
            for _ in 0..below(rng, 4) {
                m.insert(string(rng, dict), any(rng, dict, depth - 1));
            }
            Value::Object(m)
        }
    }
}

/// Arrays or objects `n` deep, up to [`MAX_DEPTH`].
fn nested(rng: &mut Rng, n: usize) -> Value {
    let n = below(rng, n.max(1)) + 1;
    let obj = rng.next_u64() & 1 == 1;
    let mut v = Value::Null;
    for _ in 0..n {
        v = if obj {
            let mut m = Map::new();
            m.insert("a".into(), v);
            Value::Object(m)
        } else {
            Value::Array(vec![v])
        };
    }
    v
}

/// A node of `v` picked by a random walk down from the root.
fn node<'a>(rng: &mut Rng, v: &'a mut Value) -> &'a mut Value {
    let len = match &*v {
        Value::Object(m) => m.len(),
        Value::Array(a) => a.len(),
        _ => 0,
    };
    if len == 0 || below(rng, 4) == 0 {
        return v;
    }
    let i = below(rng, len);
    match v {
        Value::Object(m) => node(rng, m.values_mut().nth(i).expect("index below len")),
        Value::Array(a) => node(rng, &mut a[i]),
        other => other,
    }
}

/// One to four structural mutations of `v`.
pub fn mutate(rng: &mut Rng, v: &mut Value, dict: &[String]) {
    for _ in 0..1 + below(rng, 4) {
        let n = node(rng, v);
        match below(rng, 8) {
            0 => *n = any(rng, dict, 3),
            1 => *n = number(rng),
            2 => *n = Value::String(string(rng, dict)),
            3 => *n = nested(rng, MAX_DEPTH),
            4 => match n {
                Value::Object(m) if !m.is_empty() => {
                    let k = m.keys().nth(below(rng, m.len())).cloned();
                    k.map(|k| m.remove(&k));
                }
                Value::Array(a) if !a.is_empty() => {
                    a.remove(below(rng, a.len()));
                }
                _ => *n = Value::Null,
            },
            5 => {
                if let Value::Object(m) = n {
                    m.insert(string(rng, dict), any(rng, dict, 2));
                } else {
                    *n = Value::Object(Map::new());
                }
            }
            6 => {
                let el = match &*n {
                    Value::Array(a) if !a.is_empty() => a[below(rng, a.len())].clone(),
                    other => other.clone(),
                };
                // long, but bounded: at most MAX_GROWTH bytes of copies
                let size = el.to_string().len().max(1);
                let copies = [2, 100, 1000, 20_000][below(rng, 4)]
                    .min(MAX_GROWTH / size)
                    .max(1);
                *n = Value::Array(vec![el; copies]);
            }
            _ => {
                let flipped = match &*n {
                    Value::Bool(b) => Value::String(b.to_string()),
                    Value::Number(x) => Value::String(x.to_string()),
                    Value::String(s) => s
                        .parse::<f64>()
                        .ok()
                        .and_then(Number::from_f64)
                        .map_or(Value::Bool(true), Value::Number),
                    Value::Array(a) => a.first().cloned().unwrap_or(Value::Null),
                    Value::Object(m) => Value::Array(m.values().cloned().collect()),
                    Value::Null => Value::Bool(false),
                };
                *n = flipped;
            }
        }
    }
}

/// `v` as JSON text; an object's first key written twice now and then (`dup_every`:
/// one object in so many; 0 for never), at most `dups` times in all (a key written
/// twice at every level of a deep nest would double the text at each).
pub fn write(rng: &mut Rng, v: &Value, dup_every: usize, dups: &mut usize, out: &mut String) {
    match v {
        Value::String(s) => match s.strip_prefix(RAW) {
            Some(raw) => out.push_str(raw),
            None => out.push_str(&Value::String(s.clone()).to_string()),
        },
        Value::Array(a) => {
            out.push('[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write(rng, x, dup_every, dups, out);
            }
            out.push(']');
        }
        Value::Object(m) => {
            out.push('{');
            let dup = *dups > 0 && dup_every > 0 && below(rng, dup_every) == 0;
            if dup {
                *dups -= 1;
            }
            let mut first = true;
            for (i, (k, x)) in m.iter().enumerate() {
                for _ in 0..if dup && i == 0 { 2 } else { 1 } {
                    if !first {
                        out.push(',');
                    }
                    first = false;
                    out.push_str(&Value::String(k.clone()).to_string());
                    out.push(':');
                    write(rng, x, dup_every, dups, out);
                }
            }
            out.push('}');
        }
        other => out.push_str(&other.to_string()),
    }
}

/// A structural mutant of `seed`, as text.
pub fn mutant(rng: &mut Rng, seed: &Value, dict: &[String]) -> String {
    let mut v = seed.clone();
    mutate(rng, &mut v, dict);
    let mut out = String::new();
    write(rng, &v, 8, &mut 2, &mut out);
    out
}
