//! Seeds and how a mutant is made of them: structurally (the seed's tree changed and
//! written back) or byte-level (its bytes, or a structural mutant's, cut, flipped,
//! spliced with another seed's), or the seed as it is.

use common::rng::Rng;

use crate::bytes::{self, below};
use crate::{json, toml_gen};

/// Valid JSON seeds, parsed, with their text and the words they use.
pub struct JsonCorpus {
    pub seeds: Vec<serde_json::Value>,
    texts: Vec<Vec<u8>>,
    pub dict: Vec<String>,
}

impl JsonCorpus {
    pub fn new(seeds: Vec<serde_json::Value>) -> Self {
        let mut dict = Vec::new();
        seeds.iter().for_each(|s| json::words(s, &mut dict));
        dict.sort();
        dict.dedup();
        let texts = seeds.iter().map(|s| s.to_string().into_bytes()).collect();
        JsonCorpus { seeds, texts, dict }
    }

    pub fn len(&self) -> usize {
        self.seeds.len()
    }

    pub fn is_empty(&self) -> bool {
        self.seeds.is_empty()
    }

    /// A mutant of seed `i` (or of `seed`, a fresh copy of it, where given).
    pub fn mutant(&self, rng: &mut Rng, i: usize, seed: Option<&serde_json::Value>) -> Vec<u8> {
        let seed = seed.unwrap_or(&self.seeds[i]);
        let other = &self.texts[below(rng, self.texts.len())];
        match below(rng, 20) {
            0 => seed.to_string().into_bytes(),
            1..=11 => json::mutant(rng, seed, &self.dict).into_bytes(),
            12..=15 => bytes::mutate(rng, seed.to_string().as_bytes(), other, &self.dict),
            _ => {
                let m = json::mutant(rng, seed, &self.dict);
                bytes::mutate(rng, m.as_bytes(), other, &self.dict)
            }
        }
    }
}

/// Valid TOML seeds, parsed, with their text and the words they use.
pub struct TomlCorpus {
    seeds: Vec<toml::Value>,
    texts: Vec<Vec<u8>>,
    dict: Vec<String>,
}

impl TomlCorpus {
    /// The seeds' texts; each must parse.
    pub fn new(texts: Vec<String>) -> Self {
        let seeds: Vec<toml::Value> = texts
            .iter()
            .map(|t| toml::from_str(t).expect("a seed is valid TOML"))
            .collect();
        let mut dict = Vec::new();
        seeds.iter().for_each(|s| toml_gen::words(s, &mut dict));
        dict.sort();
        dict.dedup();
        let texts = texts.into_iter().map(String::into_bytes).collect();
        TomlCorpus { seeds, texts, dict }
    }

    pub fn mutant(&self, rng: &mut Rng) -> Vec<u8> {
        let i = below(rng, self.seeds.len());
        let text = &self.texts[i];
        let other = &self.texts[below(rng, self.texts.len())];
        match below(rng, 20) {
            0 => text.clone(),
            1..=11 => toml_gen::mutant(rng, &self.seeds[i], &self.dict)
                .map_or_else(|| text.clone(), String::into_bytes),
            12..=15 => bytes::mutate(rng, text, other, &self.dict),
            _ => {
                let m = toml_gen::mutant(rng, &self.seeds[i], &self.dict)
                    .map_or_else(|| text.clone(), String::into_bytes);
                bytes::mutate(rng, &m, other, &self.dict)
            }
        }
    }
}

/// The workspace's root (seeds are read from its examples and fixtures).
pub fn workspace() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the crate sits in the workspace")
        .to_path_buf()
}

/// The text of `rel`, a file of the workspace.
pub fn read(rel: &str) -> String {
    let p = workspace().join(rel);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("seed {}: {e}", p.display()))
}

/// `input` split at its first newline: (head, rest).
pub fn split_line(input: &[u8]) -> (String, &[u8]) {
    match input.iter().position(|b| *b == b'\n') {
        Some(i) => (
            String::from_utf8_lossy(&input[..i]).into_owned(),
            &input[i + 1..],
        ),
        None => (String::from_utf8_lossy(input).into_owned(), &[][..]),
    }
}

/// `head` and `body` as one input, `head` on the first line.
pub fn join_line(head: &str, body: &[u8]) -> Vec<u8> {
    let mut v = head.replace('\n', " ").into_bytes();
    v.push(b'\n');
    v.extend_from_slice(body);
    v
}

/// A topic or path with one level replaced now and then (an odd string, a word, a
/// wildcard, nothing).
pub fn mutate_levels(rng: &mut Rng, s: &str, dict: &[String]) -> String {
    if below(rng, 4) != 0 {
        return s.to_string();
    }
    let mut levels: Vec<String> = s.split('/').map(str::to_string).collect();
    let i = below(rng, levels.len());
    match below(rng, 4) {
        0 => levels[i] = json::string(rng, dict).chars().take(300).collect(),
        1 => {
            levels.remove(i);
        }
        2 => levels.insert(i, json::string(rng, dict).chars().take(40).collect()),
        _ => levels[i] = ["", "+", "#", "..", "spBv1.0"][below(rng, 5)].to_string(),
    }
    levels.join("/")
}
