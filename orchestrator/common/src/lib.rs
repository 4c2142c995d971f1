//! Utilities both binaries (`powerplane` and `powerplane-agent`) need. Light on
//! purpose: no async runtime, HTTP or store, since the agent links it.
//!
//! # Layout
//!
//! - [`cli_docs`]: man pages and shell completions from a binary's clap definition;
//! - [`clock`]: the time now, behind the [`clock::Clock`] seam so tests can pass their own;
//! - [`logs`]: text or JSON logs on stderr;
//! - [`notify`]: systemd's notify protocol (READY, WATCHDOG, STOPPING);
//! - [`curves`], [`rng`]: the measured power-cap curves and the seeded generator the
//!   simulated GPUs and the facility simulator use;
//! - [`paths`]: paths in config files, relative to the file's folder.
#![forbid(unsafe_code)]

pub mod cli_docs;
pub mod clock;
pub mod curves;
pub mod logs;
pub mod notify;
pub mod paths;
pub mod rng;

pub use clock::{wall_clock, Clock, WallClock};
pub use paths::resolve;
