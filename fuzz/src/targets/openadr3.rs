//! OpenADR 3: a VTN's JSON read as the VEN reads it (events, programs, the token, VEN
//! objects), and what the VEN does with an event list (its event set: the list taken
//! whole, statuses moved by the clock, the meter sampled and reports made; time moving
//! 10 s an input). The set is kept across inputs, as the VEN keeps it across polls, so
//! a run also tells whether it stays bounded. Inputs are structure-aware JSON mutants
//! of the reader's seeds (telemetry/sources/src/openadr3/testdata, shaped as
//! openleadr-vtn answers) and byte-level mutants of them.

use std::collections::BTreeMap;

use common::rng::Rng;
use serde_json::Value;
use sources::openadr3::held::Events;
use sources::openadr3::parse;
use sources::openadr3::report::report_body;
use telemetry::Timestamp;

use crate::bytes::below;
use crate::corpus::{workspace, JsonCorpus};
use crate::runner::Target;

pub struct OpenAdr3 {
    corpus: JsonCorpus,
    held: Events,
    programs: BTreeMap<String, String>,
    now: Timestamp,
}

pub fn openadr3() -> Box<dyn Target> {
    let dir = workspace().join("telemetry/sources/src/openadr3/testdata");
    let mut paths: Vec<_> = std::fs::read_dir(&dir)
        .map(|rd| rd.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    paths.retain(|p| p.extension().is_some_and(|e| e == "json"));
    paths.sort();
    let seeds: Vec<Value> = paths
        .iter()
        .filter_map(|p| serde_json::from_slice(&std::fs::read(p).ok()?).ok())
        .collect();
    assert!(!seeds.is_empty(), "no OpenADR 3 seeds in {}", dir.display());
    Box::new(OpenAdr3 {
        corpus: JsonCorpus::new(seeds),
        held: Events::default(),
        programs: BTreeMap::new(),
        now: Timestamp::parse_rfc3339("2026-12-07T11:55:00Z").expect("time"),
    })
}

impl Target for OpenAdr3 {
    fn generate(&mut self, rng: &mut Rng) -> Vec<u8> {
        let i = below(rng, self.corpus.len());
        self.corpus.mutant(rng, i, None)
    }

    fn decode(&mut self, input: &[u8]) -> bool {
        self.now = self.now.plus_secs(10.0);
        let now = self.now;
        let mut ok = parse::token(input).is_ok();
        ok |= parse::token_url(input).is_ok();
        ok |= parse::ven_id(input, "powerplane-site-a").is_ok();
        let Ok(Value::Array(list)) = serde_json::from_slice::<Value>(input) else {
            return ok;
        };
        for (id, name) in parse::programs(&list) {
            if self.programs.len() < 1_000 {
                self.programs.insert(id, name);
            }
        }
        let held = &self.held;
        let read: Vec<_> = list
            .iter()
            .filter_map(|e| parse::event(e, &|id| held.first_seen(id, now)).ok())
            .collect();
        let _ = self.held.merge(read, &self.programs, now);
        self.held.tick(now);
        let _ = self.held.sample(now, Some(1_234.5), 10.0);
        for r in self.held.due_reports(now, 60.0) {
            let _ = report_body("powerplane-site-a", &r).to_string();
        }
        let _ = (self.held.next_change(now), self.held.next_report(60.0));
        let _ = self.held.list();
        true
    }
}
