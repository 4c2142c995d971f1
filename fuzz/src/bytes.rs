//! Byte-level mutations: truncation, bit flips, inserted and deleted bytes, a span
//! duplicated or replaced by a dictionary word, and two inputs spliced.

use common::rng::Rng;

/// Bytes that mean something to the formats fuzzed (JSON, TOML, protobuf, UTF-8).
const INTERESTING: &[&[u8]] = &[
    b"\0",
    b"\xff",
    b"\xc3",
    b"\xed\xa0\x80",
    b"\"",
    b"\\",
    b"\\u0000",
    b"\\ud800",
    b"{",
    b"}",
    b"[",
    b"]",
    b",",
    b":",
    b"=",
    b"\n",
    b"[[",
    b"]]",
    b"1e999",
    b"-0",
    b"18446744073709551616",
    b"nan",
    b"inf",
    b"\x08\x80\x80\x80\x80\x80\x80\x80\x80\x80\x01",
    b"\x12\xff\xff\xff\xff\x0f",
];

/// `n` in `0..len` (0 when `len` is 0).
pub fn below(rng: &mut Rng, len: usize) -> usize {
    if len == 0 {
        0
    } else {
        (rng.next_u64() % len as u64) as usize
    }
}

/// A span of `bytes`: (start, end).
fn span(rng: &mut Rng, len: usize) -> (usize, usize) {
    let a = below(rng, len + 1);
    let b = (a + 1 + below(rng, 64)).min(len);
    (a, b.max(a))
}

/// One to four byte-level mutations of `input`; `other` for splicing, `words` a
/// dictionary of the format's tokens.
pub fn mutate(rng: &mut Rng, input: &[u8], other: &[u8], words: &[String]) -> Vec<u8> {
    let mut b = input.to_vec();
    for _ in 0..1 + below(rng, 4) {
        let len = b.len();
        match below(rng, 9) {
            0 => b.truncate(below(rng, len + 1)),
            1 => {
                for _ in 0..1 + below(rng, 8) {
                    if !b.is_empty() {
                        let i = below(rng, b.len());
                        b[i] ^= 1 << below(rng, 8);
                    }
                }
            }
            2 => {
                let at = below(rng, len + 1);
                let n = 1 + below(rng, 16);
                let junk: Vec<u8> = (0..n).map(|_| rng.next_u64() as u8).collect();
                b.splice(at..at, junk);
            }
            3 => {
                let at = below(rng, len + 1);
                let w = INTERESTING[below(rng, INTERESTING.len())];
                b.splice(at..at, w.iter().copied());
            }
            4 => {
                let (s, e) = span(rng, len);
                b.drain(s..e);
            }
            5 => {
                let (s, e) = span(rng, len);
                let copy = b[s..e].to_vec();
                b.splice(e..e, copy);
            }
            6 if !words.is_empty() => {
                let (s, e) = span(rng, len);
                let w = words[below(rng, words.len())].as_bytes().to_vec();
                b.splice(s..e, w);
            }
            7 => {
                let cut = below(rng, len + 1);
                let from = below(rng, other.len() + 1);
                b.truncate(cut);
                b.extend_from_slice(&other[from..]);
            }
            _ => b = duplicate_line(rng, &b),
        }
    }
    b
}

/// One line of `b` written twice (a TOML key or table given twice).
fn duplicate_line(rng: &mut Rng, b: &[u8]) -> Vec<u8> {
    let lines: Vec<&[u8]> = b.split_inclusive(|c| *c == b'\n').collect();
    if lines.is_empty() {
        return b.to_vec();
    }
    let i = below(rng, lines.len());
    let mut out = Vec::with_capacity(b.len() + lines[i].len() + 1);
    for (n, l) in lines.iter().enumerate() {
        out.extend_from_slice(l);
        if n == i {
            if !l.ends_with(b"\n") {
                out.push(b'\n');
            }
            out.extend_from_slice(l);
        }
    }
    out
}
