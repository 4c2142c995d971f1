//! The offline commands of `powerplane`: the engine, the sources and the ledger on
//! inputs from files, without a running controller.
//!
//! # Layout
//!
//! - [`policy_cli`]: `powerplane policy explain|diff|test`: the engine on inputs from files.
//! - [`check_cli`]: `powerplane site check` and `policy check`: every problem of each file.
//! - [`site_check`]: `powerplane site check --config`: the site against the live BMCs.
//! - [`probe`]: `powerplane telemetry probe`, what the sources deliver, as a table or JSON.
//! - [`probe_cli`]: the probe's command line: sources from flags or from a config.
//! - [`report_cli`]: `powerplane report`: the ledger read from a store, grouped, written.
#![forbid(unsafe_code)]

pub mod check_cli;
pub mod policy_cli;
pub mod probe;
pub mod probe_cli;
pub mod report_cli;
pub mod site_check;
