//! The vocabulary of powerplane: what the site looks like and what is known about it.
//!
//! # Layout
//!
//! - [`time`]: [`Timestamp`], milliseconds since the Unix epoch, printed as RFC 3339.
//! - [`entity`]: [`EntityId`], the typed name of anything that has metrics (rack, GPU, feed...).
//! - [`metric`]: the canonical metrics with their unit, physical range and freshness bound.
//! - [`sample`]: [`Sample`], one reading from one source, and its [`Quality`].
//! - [`mapping`]: mapping files that turn MQTT JSON messages into samples.
//! - [`sparkplug`], [`decoder`]: Sparkplug B payloads and the per-node session; the
//!   decoder a source owns (mapping + session).
//! - [`snapshot`]: [`Snapshot`], the latest value and age of every metric of every entity.
//! - [`site`]: the site file (`site.toml`): topology, power path, cooling path, validated
//!   with `file:line:col` diagnostics.
//! - [`units`]: units as sources write them, converted to canonical ones.
//! - [`log_limit`]: repeated warnings, rate-limited, with a count of what was left out.
//! - [`gpu`]: GPU models and their power-limit constraints; [`gpu_backend`]: the trait a
//!   node agent reads and sets GPUs through (NVML in the `telemetry-sources` crate).
//! - [`job`]: [`Job`], a scheduler's job as powerplane sees it.
//! - [`diag`]: diagnostics with file, line and column, shared by every file parser.
//! - [`prices`]: price and carbon series (time → value); [`feeds`]: the feed formats
//!   sites have (CSV with columns, units and local times, JSON, ENTSO-E day-ahead XML),
//!   parsed from text (the fetching is the runtime's).
//!
//! Nothing here does IO (the clients are in the `telemetry-sources` crate,
//! `telemetry/sources`): everything takes time and input as arguments, and never reads
//! the clock, the environment or the network.
#![forbid(unsafe_code)]

pub mod agent_proto;
pub mod csvtext;
pub mod decoder;
pub mod diag;
pub mod entity;
pub mod fasthash;
pub mod feeds;
pub mod gpu;
pub mod gpu_backend;
pub mod grid;
pub mod histogram;
pub mod job;
pub mod log_limit;
pub mod mapping;
pub mod metric;
pub mod prices;
pub mod sample;
pub mod site;
pub mod snapshot;
pub mod sparkplug;
pub mod tariff;
pub mod time;
pub mod units;

pub use entity::{EntityId, EntityKind};
pub use gpu::GpuModel;
pub use job::{Job, JobState, PowerLimit, PowerLimitError};
pub use metric::Metric;
pub use sample::{Quality, Sample};
pub use site::Site;
pub use snapshot::{Observation, Snapshot};
pub use time::Timestamp;
