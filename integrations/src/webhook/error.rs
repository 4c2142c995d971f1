//! What can go wrong with the webhooks, by cause: a key too short to sign
//! ([`KeyTooShort`]), an inbound event refused ([`EventError`]), an outbound POST
//! that got no status ([`PostError`]) and a delivery attempt that failed
//! ([`DeliveryError`]: unanswered, retried, or refused for good).

use thiserror::Error;

/// A webhook key that cannot sign.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("the webhook key is {0} bytes; at least 16 are needed (openssl rand -hex 32)")]
pub struct KeyTooShort(pub usize);

/// A job event that is refused (its body, or a field that cannot be taken).
#[derive(Debug, Error)]
pub enum EventError {
    #[error("{0}")]
    Json(#[from] serde_json::Error),
    #[error("scheduler {0:?}: use 1-64 of [A-Za-z0-9_-], not \"slurm\" or \"kubernetes\" (their adapters report their jobs)")]
    Scheduler(String),
    #[error("job: 1-128 printable characters")]
    Job,
    #[error("est_duration_s {0}: must be within (0, 1 year]")]
    Duration(f64),
    #[error("gpus {0}: absurd")]
    Gpus(u32),
    #[error("allocated {gpu:?}: {message}")]
    Allocated { gpu: String, message: String },
    #[error("{time:?}: not RFC 3339: {message}")]
    Time { time: String, message: String },
}

/// A POST to the webhook receiver that got no HTTP status back: by what an operator
/// fixes (the receiver's address, its certificate or ours, a receiver that hangs).
#[derive(Debug, Error)]
pub enum PostError {
    /// No connection: refused, reset, no such host, or a proxy that failed.
    #[error("POST {url}: cannot connect: {message}")]
    Connect { url: String, message: String },
    /// The TLS handshake failed: the receiver's certificate is not trusted (`ca_file`,
    /// `pinned_sha256`), or it wants a client certificate (`client_cert_file`).
    #[error("POST {url}: TLS: {message}")]
    Tls { url: String, message: String },
    /// No answer by the deadline (`timeout_s`).
    #[error("POST {url}: no answer within the deadline: {message}")]
    Timeout { url: String, message: String },
    #[error("POST {url}: {message}")]
    Other { url: String, message: String },
}

impl PostError {
    /// Sorts a client error by its cause.
    pub fn of(url: &str, e: &reqwest::Error) -> PostError {
        let message = sources::http::chain(e);
        let url = url.to_string();
        match sources::http::classify(e) {
            "timeout" => PostError::Timeout { url, message },
            "tls" => PostError::Tls { url, message },
            _ if e.is_connect() => PostError::Connect { url, message },
            _ => PostError::Other { url, message },
        }
    }
}

/// Why one delivery attempt failed.
#[derive(Debug, Error)]
pub enum DeliveryError {
    /// No HTTP status came back (the receiver is down, hangs, or is not HTTP).
    #[error(transparent)]
    Unanswered(PostError),
    /// An HTTP status worth retrying (408, 429, 5xx, ...).
    #[error("HTTP {status}")]
    Status { status: u16 },
    /// A 4xx other than 408 and 429: retrying cannot help.
    #[error("HTTP {status}: the receiver refused the action")]
    Refused { status: u16 },
}

impl DeliveryError {
    /// Retrying cannot help: the action is dead-lettered.
    pub fn refused(&self) -> bool {
        matches!(self, DeliveryError::Refused { .. })
    }
}
