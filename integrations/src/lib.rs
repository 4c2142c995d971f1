//! The edges of powerplane that talk to the outside world.
//!
//! # Layout
//!
//! - [`scheduler`]: the one [`scheduler::Scheduler`] trait every scheduler adapter
//!   implements (Slurm, Kubernetes, the outbound webhook), with typed
//!   [`scheduler::SchedulerId`] and [`scheduler::JobId`]; each runs on a reconciler of
//!   its own in `powerplane-runtime`, off the control loop.
//! - [`store`]: the durable store's backends. The contract ([`store::Backend`]),
//!   the typed [`store::Store`] and its records are the `store` crate's (re-exported):
//!   what must survive a restart (audit log, energy ledger, job registry, caps and
//!   holds with their leases). The Redis backend lives here (reconnecting, a deadline
//!   per call), with [`store::journal`], the local journal that keeps what Redis
//!   cannot take and replays it, and [`store::embedded`], the embedded (redb)
//!   backend, the default.
//! - `prices` and `feeds` (re-exported from `telemetry`): price and carbon series
//!   (time → value) and the feed formats sites have: CSV with columns, units and
//!   local times, JSON, ENTSO-E day-ahead XML.
//! - [`slurm`]: Slurm jobs and their mapping to powerplane jobs; [`slurm_sync`] keeps
//!   Slurm's holds in step with the plan, through [`slurm_api`].
//! - [`slurm_api`]: the versioned slurmrestd layer (v0.0.38, v0.0.40 to v0.0.42):
//!   version detection, per-version shapes, a hyper client with JWT and TLS.
//! - [`webhook`]: generic schedulers over signed webhooks: job events in, actions out
//!   through a durable outbox with retries and a dead-letter list.
//! - [`webhook_guard`]: inbound events' replay window, rate limit, field limits and
//!   staleness, between the signature check and the job registry.
//! - [`kubernetes`]: the admission webhook's scheduling gate, its removal through the
//!   API server, and the scheduler extender's filter and prioritize answers.
#![forbid(unsafe_code)]

pub mod kubernetes;
pub mod lease;
pub mod scheduler;
pub mod slurm;
pub mod slurm_api;
pub mod slurm_sync;
pub mod store;
pub use telemetry::{feeds, prices};
pub mod webhook;
pub mod webhook_guard;
