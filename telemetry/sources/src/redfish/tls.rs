//! The async HTTP client of an endpoint: one per distinct TLS setting and timeout,
//! shared (with its connection pool) by the endpoints that have the same.

use std::sync::Arc;
use std::time::Duration;

use super::{EndpointConfig, RedfishError};
use crate::tls::{parse_fingerprint, provider, Pinned};

pub(super) fn client(cfg: &EndpointConfig) -> Result<reqwest::Client, RedfishError> {
    let bad = |message: String| RedfishError::Config {
        endpoint: cfg.name.clone(),
        message,
    };
    // reqwest's own TLS needs a process-wide provider; installing it twice is harmless
    let _ = rustls::crypto::ring::default_provider().install_default();
    if !(0.1..=120.0).contains(&cfg.timeout_s) {
        return Err(bad(format!(
            "timeout_s must be within 0.1..=120, got {}",
            cfg.timeout_s
        )));
    }
    let timeout = Duration::from_secs_f64(cfg.timeout_s);
    let mut b = reqwest::Client::builder()
        .timeout(timeout)
        .connect_timeout(timeout)
        // a BMC closes idle connections early; do not keep them long
        .pool_idle_timeout(Duration::from_secs(30))
        .user_agent(concat!("powerplane/", env!("CARGO_PKG_VERSION")));
    let tls = &cfg.tls;
    let modes = usize::from(tls.insecure)
        + usize::from(tls.ca_file.is_some())
        + usize::from(tls.pinned_sha256.is_some());
    if modes > 1 {
        return Err(bad(
            "give one of tls.ca_file, tls.pinned_sha256 and tls.insecure".into(),
        ));
    }
    if let Some(pin) = &tls.pinned_sha256 {
        let want = parse_fingerprint(pin)
            .ok_or_else(|| bad(format!("tls.pinned_sha256 {pin:?} is not 64 hex digits")))?;
        let config = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| bad(e.to_string()))?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(Pinned {
                want: Some(want),
                provider: provider(),
            }))
            .with_no_client_auth();
        b = b.tls_backend_preconfigured(config);
    } else if let Some(ca) = &tls.ca_file {
        let pem = std::fs::read(ca).map_err(|e| bad(format!("tls.ca_file {ca}: {e}")))?;
        let certs = reqwest::Certificate::from_pem_bundle(&pem)
            .map_err(|e| bad(format!("tls.ca_file {ca}: {e}")))?;
        if certs.is_empty() {
            return Err(bad(format!("tls.ca_file {ca}: no certificate in it")));
        }
        b = b.tls_certs_only(certs);
    } else if tls.insecure {
        b = b.tls_danger_accept_invalid_certs(true);
    }
    b.build()
        .map_err(|e| bad(format!("cannot build the HTTP client: {e}")))
}
