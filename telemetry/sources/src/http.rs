//! Fetching a document over HTTP(S) (price and carbon feeds), with the same TLS
//! settings as the other sources.

use std::time::Duration;

use crate::tls::{client_config, Tls};

/// GETs `url` and returns its body as text; an HTTP error status is an error.
pub fn fetch_text(url: &str, timeout: Duration, tls: &Tls) -> Result<String, String> {
    // reqwest's own TLS needs a process-wide provider; installing it twice is harmless
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut b = reqwest::blocking::Client::builder()
        .timeout(timeout)
        .connect_timeout(timeout)
        .user_agent(concat!("powerplane/", env!("CARGO_PKG_VERSION")));
    if url.starts_with("https://") {
        b = b.tls_backend_preconfigured(client_config(tls)?);
    }
    let client = b.build().map_err(|e| e.to_string())?;
    let resp = client
        .get(url)
        .send()
        .map_err(|e| format!("GET {url}: {e}"))?;
    let status = resp.status();
    if !status.is_success() {
        return Err(format!("GET {url}: HTTP {status}"));
    }
    resp.text().map_err(|e| format!("GET {url}: {e}"))
}
