//! The `powerplane` binary's library: a facade. The code lives in the crates under
//! `orchestrator/` (see docs/architecture.md); this crate re-exports their modules
//! under the paths they had when they were one crate (`orchestrator::serve`,
//! `orchestrator::config`, `orchestrator::sim`, `orchestrator::http`, ...), for the
//! tests and the bench. The binary itself (`src/main.rs`) holds only the command line.
//!
//! # Layout
//!
//! - [`agent`]: `powerplane agent` (the `powerplane-agent` crate).
//! - [`control`], [`accounting`], [`admit`], [`cadence`], [`demand`], [`fleet`],
//!   [`overrides`], [`registry`]: the control loop and its state (`powerplane-control`).
//! - [`report`], [`energy_report`]: reports as files (`powerplane-report`).
//! - [`sim`], [`demo`], [`backtest`]: the simulated facility and the runs on it
//!   (`powerplane-sim`).
//! - [`runtime`], [`redfish`], [`ha`], [`schedulers`], [`store_open`], [`reload`],
//!   [`node_power`], [`paths`]: the tokio runtime and its edges (`powerplane-runtime`).
//! - [`embedded`]: the embedded (redb) store backend (`integrations::store::embedded`).
//! - [`http`]: the HTTP API, `/metrics` and the status page (`powerplane-api`).
//! - [`serve`], [`config`]: `powerplane.toml` and the assembly (`powerplane-serve`).
//! - [`policy_cli`], [`probe`], [`site_check`]: the offline commands (`powerplane-tools`).
//! - [`notify`]: systemd's notify protocol (from `powerplane-common`).
#![forbid(unsafe_code)]

pub use agent;
pub use api as http;
pub use common::notify;
pub use control;
pub use control::{accounting, admit, cadence, demand, fleet, overrides, registry};
pub use integrations::store::embedded;
pub use report;
pub use report::energy_report;
pub use runtime;
pub use runtime::{ha, node_power, paths, redfish, reload, schedulers, store_open};
pub use serve;
pub use serve::config;
pub use sim;
pub use sim::{backtest, demo};
pub use tools::{policy_cli, probe, site_check};
