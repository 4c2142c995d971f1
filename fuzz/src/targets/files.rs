//! The operators' files: the site (`telemetry::Site::parse`) and the policy
//! (`policies::policy::Policy::parse`), from the repository's examples.

use common::rng::Rng;

use crate::corpus::{read, TomlCorpus};
use crate::runner::Target;

/// A TOML file's parser over mutants of its examples.
pub struct TomlFile {
    corpus: TomlCorpus,
    parse: fn(&str) -> bool,
}

impl Target for TomlFile {
    fn generate(&mut self, rng: &mut Rng) -> Vec<u8> {
        self.corpus.mutant(rng)
    }

    fn decode(&mut self, input: &[u8]) -> bool {
        // the files are read as text: bytes that are not UTF-8 are refused there
        std::str::from_utf8(input).is_ok_and(self.parse)
    }
}

pub fn site() -> Box<dyn Target> {
    let seeds = [
        "examples/demo/site.toml",
        "examples/backtest/site.toml",
        "examples/backtest/site-hot.toml",
    ];
    Box::new(TomlFile {
        corpus: TomlCorpus::new(seeds.iter().map(|s| read(s)).collect()),
        parse: |src| telemetry::Site::parse("site.toml", src).is_ok(),
    })
}

pub fn policy() -> Box<dyn Target> {
    let seeds = [
        "examples/demo/policy.toml",
        "examples/demo/policy-reactive.toml",
        "examples/backtest/policy.toml",
        "examples/policies/emergency.toml",
        "examples/policies/evening-peak.toml",
        "examples/policies/row-b-rules.toml",
        "examples/policies/standard.toml",
    ];
    Box::new(TomlFile {
        corpus: TomlCorpus::new(seeds.iter().map(|s| read(s)).collect()),
        parse: |src| policies::policy::Policy::parse("policy.toml", src).is_ok(),
    })
}
