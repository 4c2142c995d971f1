//! The `powerplane` binary's library: wiring, the control loop, the simulator, the demo.
//!
//! # Layout
//!
//! - [`agent`]: `powerplane agent` (the `powerplane-agent` crate, re-exported): GPU
//!   backends, signed leased commands, fail-safe, drift.
//! - [`http`]: `serve`'s `/metrics` and JSON API with bearer-token roles.
//! - [`overrides`]: operators' pins and exemptions with an expiry.
//! - [`admit`]: the gate between the edges and the loop: only the site's entities pass.
//! - [`fleet`]: the controller's side of the agent protocol: commands, acks, renewals.
//! - [`control`]: the control loop, tick → snapshot → evaluate → plan → actuate → audit,
//!   over the [`control::Telemetry`] and [`control::Actuator`] seams.
//! - [`registry`]: the job registry, kept in the store.
//! - [`accounting`]: the energy ledger: every kWh to a job, to idle or to overhead.
//! - [`embedded`]: the embedded (redb) store backend, the default.
//! - [`store_open`]: `[store] kind = "redis"`: Redis on the runtime, behind its journal.
//! - [`schedulers`]: `[schedulers]`: one reconciler per scheduler adapter (Slurm,
//!   Kubernetes, the outbound webhook) on a thread of its own; jobs in, the plan's holds
//!   out, job lifecycles.
//! - [`cadence`]: the control loop's tick delay and duration, for `/metrics`.
//! - [`config`]: `powerplane.toml`, every problem of it and of the files it names in one pass.
//! - [`serve`]: `powerplane serve`: sources on their threads, the loop on a real clock.
//! - [`notify`]: systemd's notify protocol (from `powerplane-common`): READY, WATCHDOG from
//!   the loop, STOPPING.
//! - [`runtime`]: the tokio runtime of `serve`: edge tasks, the shutdown token, the grace timeout.
//! - [`redfish`]: the `[redfish]` poller as a task of `serve`, its counters for `/metrics`.
//! - [`reload`]: `serve` watches its policy file and swaps in valid edits between ticks.
//! - [`sim`]: the simulated facility: GPUs that respond to caps as measured by Zeus,
//!   racks whose inlets follow heat load, a price series and arriving jobs.
//! - [`demo`]: `powerplane demo`, the simulated facility under the control loop.
//! - [`backtest`]: `powerplane backtest`, a job trace and real prices replayed under the
//!   policy and under a no-policy baseline.
//! - [`probe`]: `powerplane telemetry probe`, what the sources deliver, as a table or JSON.
//! - [`policy_cli`]: `powerplane policy explain|diff|test`: the engine on inputs from files.
//! - [`energy_report`]: `powerplane report`: the ledger grouped, as table, CSV, JSON or HTML.
//! - [`report`]: the demo's HTML and CSV reports.
#![forbid(unsafe_code)]

pub mod accounting;
pub mod admit;
pub use agent;
pub mod backtest;
pub mod cadence;
pub mod config;
pub mod control;
pub mod demand;
pub mod demo;
pub mod embedded;
pub mod energy_report;
pub mod fleet;
pub mod ha;
pub mod http;
pub use common::notify;
pub mod node_power;
pub mod overrides;
pub mod paths;
pub mod policy_cli;
pub mod probe;
pub mod redfish;
pub mod registry;
pub mod reload;
pub mod report;
pub mod runtime;
pub mod schedulers;
pub mod serve;
pub mod sim;
pub mod site_check;
pub mod store_open;
