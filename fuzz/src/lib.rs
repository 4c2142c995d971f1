//! Structure-aware fuzzing of powerplane's decoders on stable Rust: each decoder's
//! valid seeds (the repository's examples and fixtures, payloads built with its own
//! types, commands and events signed with its own code) mutated structurally (parsed
//! to a tree, a value replaced by another type, an extreme number, an odd or huge
//! string, deep nesting, a long array, keys removed, added or duplicated) and
//! byte-level (truncated, bits flipped, bytes inserted, two seeds spliced), from one
//! printed seed. Every input runs under `catch_unwind`: a panic is counted and its
//! input kept under `fuzz/regressions/<decoder>/`, which `tests/fuzz.rs` replays on
//! every run; resident memory and time per input are measured.
//!
//! `cargo test -p powerplane-fuzz` runs 3,000 inputs per decoder; `scripts/fuzz`
//! runs 10^6 per decoder in an optimized build and prints the table.
//!
//! # Layout
//! - [`runner`]: the [`runner::Target`] a decoder is driven through, the run
//!   (panics, regression cases, memory, time), its [`runner::Report`], the replay
//! - [`corpus`]: seeds and how a mutant is made of them
//! - [`json`], [`toml_gen`], [`xml`], [`bytes`]: the mutations
//! - [`targets`]: one per decoder ([`targets::DECODERS`])
#![forbid(unsafe_code)]

pub mod bytes;
pub mod corpus;
pub mod json;
pub mod runner;
pub mod targets;
pub mod toml_gen;
pub mod xml;
