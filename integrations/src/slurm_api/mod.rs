//! The versioned slurmrestd layer: between the Slurm adapter (above) and slurmrestd
//! (below). It finds which REST API version the server speaks, reads its job list into
//! one version-neutral [`JobView`], builds each version's update bodies, and carries
//! them over a maintained HTTP client (unix socket or TCP, optional TLS, JWT).
//!
//! # Layout
//!
//! - [`version`]: the versions powerplane speaks ([`ApiVersion`]), the config pin
//!   ([`ApiPin`]), and the choice from what the server's `/openapi/v3` lists.
//! - [`shapes`]: per-version shapes: a job list into [`JobView`]s (state a string in
//!   v0.0.38, a list from v0.0.40; numbers as `{set, infinite, number}`), and the
//!   request for each [`Update`] (hold, release, begin time, requeue, suspend, resume),
//!   REST or `scontrol` where no version has a call for it.
//! - [`http`]: hyper over a unix socket or TCP (rustls with a CA file for `https://`),
//!   one deadline per call, a cap on the answer's size, JWT headers from a token file
//!   that is re-read when it changes.
//! - [`client`]: [`ApiClient`], the blocking facade the adapter calls from the
//!   scheduler's own thread (a current-thread runtime inside), built from
//!   [`SlurmApiConfig`].
//!
//! Against a real server: `tests/tests/slurm24.rs` (Slurm 24.11 and 22.05), and the
//! adapter on it in `tests/tests/slurm.rs` and `orchestrator/tests/slurm_serve.rs`; golden
//! inputs saved from both: `tests/fixtures/slurm/`.

pub mod client;
pub mod http;
pub mod shapes;
pub mod version;

pub use client::{ApiClient, SlurmApiConfig};
pub use http::TokenFile;
pub use shapes::{JobView, Number, Request, ShapeError, Update};
pub use version::{ApiPin, ApiVersion};

use thiserror::Error;

/// What can go wrong between powerplane and slurmrestd.
#[derive(Debug, Error)]
pub enum SlurmApiError {
    #[error("slurm api config: {0}")]
    Config(String),
    #[error("slurmrestd at {at}: {message}")]
    Io { at: String, message: String },
    #[error("slurmrestd at {at}: no answer within {timeout_s} s ({method} {path})")]
    Timeout {
        at: String,
        method: String,
        path: String,
        timeout_s: f64,
    },
    #[error("slurmrestd at {at}: the answer to {path} is over {limit} bytes; refused (raise max_answer_bytes if the job list is that large)")]
    TooLarge {
        at: String,
        path: String,
        limit: usize,
    },
    #[error("slurmrestd at {at} offers {offered:?}; powerplane speaks {ours:?}{pinned}")]
    Unsupported {
        at: String,
        offered: Vec<String>,
        ours: Vec<String>,
        /// `, pinned to v0.0.41` when the config named one
        pinned: String,
    },
    #[error("slurmrestd at {at} refused {who} (HTTP {status}{detail}): {advice}")]
    Unauthorized {
        at: String,
        who: String,
        status: u16,
        detail: String,
        advice: String,
    },
    #[error("slurmrestd {method} {path}: HTTP {status}: {body}")]
    Http {
        method: String,
        path: String,
        status: u16,
        body: String,
    },
    #[error("slurmrestd {method} {path}: {errors}")]
    Api {
        method: String,
        path: String,
        errors: String,
        /// Slurm's error numbers (2017: invalid job id, 2010: not the job's user, ...)
        numbers: Vec<i64>,
    },
    #[error("slurmrestd {path}: cannot decode the answer: {source}")]
    Decode {
        path: String,
        #[source]
        source: ShapeError,
    },
    #[error("scontrol {args}: {message}")]
    Command { args: String, message: String },
}
