//! OpenADR 2.0b: a VTN's payload read as the VEN reads it (`parse`), and what the VEN
//! does with an `oadrDistributeEvent` (its event set: merge, answers, time moving 10 s
//! an input). The set is kept across inputs, as the VEN keeps it across polls, so a
//! run also tells whether it stays bounded. Inputs are structure-aware XML mutants
//! ([`crate::xml`]) of the payloads the reader's tests use (OpenLEADR's VTN's), and
//! byte-level mutants of them.

use common::rng::Rng;
use sources::openadr2b::events::Events;
use sources::openadr2b::parse::{parse, Inbound};
use telemetry::Timestamp;

use crate::bytes::{self, below};
use crate::corpus::workspace;
use crate::runner::Target;
use crate::xml::{self, Dict, XNode};

pub struct OpenAdr {
    seeds: Vec<XNode>,
    texts: Vec<Vec<u8>>,
    dict: Dict,
    words: Vec<String>,
    held: Events,
    now: Timestamp,
}

/// The reader's test payloads.
fn seeds() -> Vec<String> {
    let dir = workspace().join("telemetry/sources/src/openadr2b/testdata");
    let mut paths: Vec<_> = std::fs::read_dir(&dir)
        .map(|rd| rd.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    paths.retain(|p| p.extension().is_some_and(|e| e == "xml"));
    paths.sort();
    paths
        .iter()
        .filter_map(|p| std::fs::read_to_string(p).ok())
        .collect()
}

pub fn openadr2b() -> Box<dyn Target> {
    let texts = seeds();
    assert!(!texts.is_empty(), "no OpenADR 2.0b seeds");
    let trees: Vec<XNode> = texts
        .iter()
        .map(|t| xml::parse(t).expect("a seed is XML"))
        .collect();
    let mut names = Vec::new();
    let mut spaces = Vec::new();
    trees
        .iter()
        .for_each(|t| xml::words(t, &mut names, &mut spaces));
    names.sort();
    names.dedup();
    spaces.sort();
    spaces.dedup();
    let words = names.clone();
    Box::new(OpenAdr {
        seeds: trees,
        texts: texts.into_iter().map(String::into_bytes).collect(),
        dict: Dict { names, spaces },
        words,
        held: Events::default(),
        now: Timestamp::parse_rfc3339("2026-12-04T17:00:00Z").expect("time"),
    })
}

impl Target for OpenAdr {
    fn generate(&mut self, rng: &mut Rng) -> Vec<u8> {
        let i = below(rng, self.seeds.len());
        let o = below(rng, self.seeds.len());
        match below(rng, 20) {
            0 => self.texts[i].clone(),
            1..=13 => xml::mutant(rng, &self.seeds[i], &self.seeds[o], &self.dict).into_bytes(),
            14..=16 => bytes::mutate(rng, &self.texts[i], &self.texts[o], &self.words),
            _ => {
                let m = xml::mutant(rng, &self.seeds[i], &self.seeds[o], &self.dict);
                bytes::mutate(rng, m.as_bytes(), &self.texts[o], &self.words)
            }
        }
    }

    fn decode(&mut self, input: &[u8]) -> bool {
        self.now = self.now.plus_secs(10.0);
        let Ok(text) = std::str::from_utf8(input) else {
            return false;
        };
        match parse(text) {
            Ok(Inbound::DistributeEvent(d)) => {
                let _ = self.held.merge(&d.request_id, &d.events);
                let _ = self.held.unanswered();
                self.held.tick(self.now);
                let _ = self.held.next_change(self.now);
                let _ = self.held.list();
                true
            }
            Ok(_) => true,
            Err(e) => {
                let _ = (e.reason(), e.to_string());
                false
            }
        }
    }
}
