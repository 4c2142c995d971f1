//! Every decoder under generated inputs: `POWERPLANE_FUZZ_INPUTS` of them (3,000 by
//! default; `scripts/fuzz` runs 10^6), from `POWERPLANE_FUZZ_SEED` (printed); no input
//! may panic, resident memory must stay bounded, and every kept regression case is
//! replayed.

use std::path::PathBuf;

use powerplane_fuzz::runner::{replay, run, Report};
use powerplane_fuzz::targets::{decoder, DECODERS};

/// How much the process's resident memory may grow over one decoder's run.
const RSS_BOUND: i64 = 512 * 1024 * 1024;

fn regressions() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("regressions")
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.replace('_', "").parse().ok())
        .unwrap_or(default)
}

fn fuzz(name: &str) {
    let d = decoder(name).expect("a decoder of that name");
    let count = env_u64("POWERPLANE_FUZZ_INPUTS", 3_000);
    let seed = env_u64("POWERPLANE_FUZZ_SEED", 36);
    println!("fuzzing {name}: {count} inputs from seed {seed} (POWERPLANE_FUZZ_SEED={seed})");
    let r: Report = run(d, count, seed, &regressions());
    println!("{}\n{}", Report::header(), r.row());
    for (path, message) in &r.saved {
        println!("panic, kept as {}: {message}", path.display());
    }
    assert_eq!(
        r.panics, 0,
        "{name}: {} inputs panicked (seed {seed})",
        r.panics
    );
    assert!(
        r.rss_peak_growth < RSS_BOUND,
        "{name}: resident memory grew by {} bytes, beyond {RSS_BOUND}",
        r.rss_peak_growth
    );
}

#[test]
fn mqtt_json() {
    fuzz("mqtt_json");
}

#[test]
fn sparkplug_b() {
    fuzz("sparkplug_b");
}

#[test]
fn openadr2b() {
    fuzz("openadr2b");
}

#[test]
fn openadr3() {
    fuzz("openadr3");
}

#[test]
fn agent_command() {
    fuzz("agent_command");
}

#[test]
fn webhook_event() {
    fuzz("webhook_event");
}

#[test]
fn redfish_json() {
    fuzz("redfish_json");
}

#[test]
fn site_toml() {
    fuzz("site_toml");
}

#[test]
fn policy_toml() {
    fuzz("policy_toml");
}

#[test]
fn every_kept_regression_case_decodes_without_a_panic() {
    let mut failed = Vec::new();
    for d in DECODERS {
        let (n, panics) = replay(*d, &regressions());
        println!("{}: {n} regression cases replayed", d.name);
        failed.extend(panics);
    }
    assert!(
        failed.is_empty(),
        "regression cases panic again: {failed:#?}"
    );
}
