//! The one outbound HTTP client stack (reqwest on tokio), for every call powerplane
//! makes over HTTP: webhook deliveries, price and carbon feeds, Redfish telemetry and
//! Redfish node power. Each client
//! - ends every call by its deadline (connect, headers and body);
//! - trusts what [`Tls`] says: the system's roots plus the site's `ca_file`, one pinned
//!   certificate, or (said explicitly) anything;
//! - shows `client_cert_file` / `client_key_file` when the server asks (mutual TLS);
//! - goes through the proxy that `HTTPS_PROXY` / `HTTP_PROXY` / `ALL_PROXY` name,
//!   except for the hosts in `NO_PROXY` (reqwest's system proxy).
//!
//! [`client`] is the async client (on the caller's runtime); [`blocking_client`] the
//! same for the threads of their own that make blocking calls (it runs its own
//! runtime thread; build and use it outside the async runtime's workers).

use std::time::Duration;

use thiserror::Error;

use crate::tls::{client_config, Tls, TlsError};

/// Why no client could be built.
#[derive(Debug, Error)]
pub enum ClientError {
    #[error(transparent)]
    Tls(#[from] TlsError),
    #[error("timeout_s must be within 0.1..=120, got {0}")]
    Timeout(f64),
    #[error("cannot build the HTTP client: {0}")]
    Build(#[source] reqwest::Error),
}

const USER_AGENT: &str = concat!("powerplane/", env!("CARGO_PKG_VERSION"));

/// Servers (BMCs above all) close idle connections early: none is kept longer.
const POOL_IDLE: Duration = Duration::from_secs(30);

fn checked(timeout: Duration, tls: &Tls) -> Result<rustls::ClientConfig, ClientError> {
    let s = timeout.as_secs_f64();
    if !(0.1..=120.0).contains(&s) {
        return Err(ClientError::Timeout(s));
    }
    // reqwest's own TLS needs a process-wide provider; installing it twice is harmless
    let _ = rustls::crypto::ring::default_provider().install_default();
    Ok(client_config(tls)?)
}

/// An async client whose every call ends within `timeout`, trusting what `tls` says.
pub fn client(timeout: Duration, tls: &Tls) -> Result<reqwest::Client, ClientError> {
    let config = checked(timeout, tls)?;
    reqwest::Client::builder()
        .timeout(timeout)
        .connect_timeout(timeout)
        .pool_idle_timeout(POOL_IDLE)
        .user_agent(USER_AGENT)
        .tls_backend_preconfigured(config)
        .build()
        .map_err(ClientError::Build)
}

/// [`client`] for blocking calls on a thread of their own.
pub fn blocking_client(
    timeout: Duration,
    tls: &Tls,
) -> Result<reqwest::blocking::Client, ClientError> {
    let config = checked(timeout, tls)?;
    reqwest::blocking::Client::builder()
        .timeout(timeout)
        .connect_timeout(timeout)
        .pool_idle_timeout(POOL_IDLE)
        .user_agent(USER_AGENT)
        .tls_backend_preconfigured(config)
        .build()
        .map_err(ClientError::Build)
}

/// What a failed call ran into, by what an operator fixes: `timeout`, `tls` (a
/// certificate refused, by either side) or `unreachable` (refused, reset, DNS, proxy).
pub fn classify(e: &reqwest::Error) -> &'static str {
    let text = chain(e).to_ascii_lowercase();
    if e.is_timeout() || text.contains("timed out") {
        "timeout"
    } else if text.contains("certificate")
        || text.contains("tls")
        || text.contains("handshake")
        || text.contains("alert")
    {
        "tls"
    } else {
        "unreachable"
    }
}

/// An error and its causes on one line (reqwest's own message says little: "error
/// sending request").
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

/// Why an answer's body was not read whole.
#[derive(Debug, Error)]
pub enum BodyError {
    #[error("the answer is larger than {} MiB", .0 >> 20)]
    TooLarge(usize),
    #[error("{}", chain(.0))]
    Transport(#[source] reqwest::Error),
}

/// An answer's body, read chunk by chunk up to `max` bytes: beyond it nothing of it is
/// kept (a server that streams without end fills no memory).
pub async fn read_capped(mut resp: reqwest::Response, max: usize) -> Result<Vec<u8>, BodyError> {
    if resp.content_length().is_some_and(|n| n > max as u64) {
        return Err(BodyError::TooLarge(max));
    }
    let mut body = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(BodyError::Transport)? {
        if body.len() + chunk.len() > max {
            return Err(BodyError::TooLarge(max));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}
