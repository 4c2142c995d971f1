//! Fetching a document over HTTP(S) (price and carbon feeds), with the same TLS
//! settings as the other sources.

use std::time::Duration;

use thiserror::Error;

use crate::tls::{client_config, Tls, TlsError};

/// Why a document could not be fetched.
#[derive(Debug, Error)]
pub enum FetchError {
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// The client could not be built.
    #[error(transparent)]
    Client(reqwest::Error),
    #[error("GET {url}: {source}")]
    Get {
        url: String,
        #[source]
        source: reqwest::Error,
    },
    #[error("GET {url}: HTTP {status}")]
    Status {
        url: String,
        status: reqwest::StatusCode,
    },
}

/// GETs `url` and returns its body as text; an HTTP error status is an error.
pub fn fetch_text(url: &str, timeout: Duration, tls: &Tls) -> Result<String, FetchError> {
    // reqwest's own TLS needs a process-wide provider; installing it twice is harmless
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut b = reqwest::blocking::Client::builder()
        .timeout(timeout)
        .connect_timeout(timeout)
        .user_agent(concat!("powerplane/", env!("CARGO_PKG_VERSION")));
    if url.starts_with("https://") {
        b = b.tls_backend_preconfigured(client_config(tls)?);
    }
    let client = b.build().map_err(FetchError::Client)?;
    let get = |source| FetchError::Get {
        url: url.to_string(),
        source,
    };
    let resp = client.get(url).send().map_err(get)?;
    let status = resp.status();
    if !status.is_success() {
        return Err(FetchError::Status {
            url: url.to_string(),
            status,
        });
    }
    resp.text().map_err(get)
}
