//! Structural TOML mutations: a seed parsed to a [`toml::Value`], then a node
//! replaced (another type, an extreme or non-finite number, an odd or huge string, deep
//! nesting, a long array), a key removed or added, and written back.

use common::rng::Rng;
use toml::{Table, Value};

use crate::bytes::below;
use crate::json::string;

/// Every key and short string in `v`.
pub fn words(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Table(t) => {
            for (k, x) in t {
                out.push(k.clone());
                words(x, out);
            }
        }
        Value::Array(a) => a.iter().for_each(|x| words(x, out)),
        Value::String(s) if s.len() <= 64 => out.push(s.clone()),
        _ => {}
    }
}

fn number(rng: &mut Rng) -> Value {
    const FLOATS: &[f64] = &[
        f64::NAN,
        f64::INFINITY,
        f64::NEG_INFINITY,
        -0.0,
        1e308,
        -1e308,
        f64::MIN_POSITIVE,
        5e-324,
        0.1,
    ];
    const INTS: &[i64] = &[
        0,
        -1,
        1,
        i64::MAX,
        i64::MIN,
        4_294_967_296,
        65_536,
        255,
        -255,
    ];
    match below(rng, 3) {
        0 => Value::Float(FLOATS[below(rng, FLOATS.len())]),
        1 => Value::Integer(INTS[below(rng, INTS.len())]),
        _ => Value::Integer((rng.next_u64() >> below(rng, 64)) as i64),
    }
}

fn any(rng: &mut Rng, dict: &[String], depth: usize) -> Value {
    match below(rng, if depth == 0 { 4 } else { 7 }) {
        0 => Value::Boolean(rng.next_u64() & 1 == 1),
        1 => number(rng),
        2 => Value::String(string(rng, dict)),
        3 => "1979-05-27T07:32:00Z"
            .parse()
            .map(Value::Datetime)
            .unwrap_or(Value::Boolean(false)),
        4 => Value::Array(
            (0..below(rng, 4))
                .map(|_| any(rng, dict, depth - 1))
                .collect(),
        ),
        5 => nested(rng),
        _ => {
            let mut t = Table::new();
            for _ in 0..below(rng, 4) {
                t.insert(string(rng, dict), any(rng, dict, depth - 1));
            }
            Value::Table(t)
        }
    }
}

/// Tables or arrays nested up to 64 deep.
fn nested(rng: &mut Rng) -> Value {
    let n = 1 + below(rng, 64);
    let table = rng.next_u64() & 1 == 1;
    let mut v = Value::Integer(1);
    for _ in 0..n {
        v = if table {
            let mut t = Table::new();
            t.insert("a".into(), v);
            Value::Table(t)
        } else {
            Value::Array(vec![v])
        };
    }
    v
}

fn node<'a>(rng: &mut Rng, v: &'a mut Value) -> &'a mut Value {
    let len = match &*v {
        Value::Table(t) => t.len(),
        Value::Array(a) => a.len(),
        _ => 0,
    };
    if len == 0 || below(rng, 4) == 0 {
        return v;
    }
    let i = below(rng, len);
    match v {
        Value::Table(t) => node(
            rng,
            t.iter_mut()
                .nth(i)
                .map(|(_, c)| c)
                .expect("index below len"),
        ),
        Value::Array(a) => node(rng, &mut a[i]),
        other => other,
    }
}

/// One to four structural mutations of `v` (the root stays a table).
pub fn mutate(rng: &mut Rng, v: &mut Value, dict: &[String]) {
    for _ in 0..1 + below(rng, 4) {
        let n = node(rng, v);
        match below(rng, 7) {
            0 if !matches!(n, Value::Table(_)) => *n = any(rng, dict, 3),
            1 if !matches!(n, Value::Table(_)) => *n = number(rng),
            2 if !matches!(n, Value::Table(_)) => *n = Value::String(string(rng, dict)),
            3 if !matches!(n, Value::Table(_)) => *n = nested(rng),
            4 => match n {
                Value::Table(t) if !t.is_empty() => {
                    let k = t.keys().nth(below(rng, t.len())).cloned();
                    k.map(|k| t.remove(&k));
                }
                Value::Array(a) if !a.is_empty() => {
                    a.remove(below(rng, a.len()));
                }
                _ => {}
            },
            5 => match n {
                Value::Table(t) => {
                    t.insert(string(rng, dict), any(rng, dict, 2));
                }
                Value::Array(a) if !a.is_empty() => {
                    let el = a[below(rng, a.len())].clone();
                    // long, but at most some 256 KiB of copies
                    let size = el.to_string().len().max(1);
                    let copies = [2, 50, 1000][below(rng, 3)].min(256 * 1024 / size).max(1);
                    a.extend(std::iter::repeat_n(el, copies));
                }
                _ => {}
            },
            _ => {
                if let Value::Table(t) = n {
                    if let Some(k) = t.keys().nth(below(rng, t.len().max(1))).cloned() {
                        if !matches!(t.get(&k), Some(Value::Table(_))) {
                            t.insert(k, any(rng, dict, 2));
                        }
                    }
                }
            }
        }
    }
}

/// A structural mutant of `seed` as text; `None` when the serializer cannot write it.
pub fn mutant(rng: &mut Rng, seed: &Value, dict: &[String]) -> Option<String> {
    let mut v = seed.clone();
    mutate(rng, &mut v, dict);
    toml::to_string(&v).ok()
}
