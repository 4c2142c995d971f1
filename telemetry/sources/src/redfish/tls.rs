//! The async HTTP client of an endpoint (from [`crate::http::client`]): one per
//! distinct TLS setting and timeout, shared (with its connection pool) by the
//! endpoints that have the same.

use std::time::Duration;

use super::{EndpointConfig, RedfishError};

pub(super) fn client(cfg: &EndpointConfig) -> Result<reqwest::Client, RedfishError> {
    if !(0.1..=120.0).contains(&cfg.timeout_s) {
        return Err(RedfishError::Config {
            endpoint: cfg.name.clone(),
            message: format!("timeout_s must be within 0.1..=120, got {}", cfg.timeout_s),
        });
    }
    crate::http::client(Duration::from_secs_f64(cfg.timeout_s), &cfg.tls).map_err(|e| {
        RedfishError::Config {
            endpoint: cfg.name.clone(),
            message: e.to_string(),
        }
    })
}
