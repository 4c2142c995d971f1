//! The Redfish source: polls BMCs, PDUs and CDUs, discovering from the service root;
//! its samples go to `serve`'s buffer (or to `telemetry probe`).
//!
//! Per poll it walks `Chassis` (legacy `Power`/`Thermal`, `EnvironmentMetrics`,
//! `Sensors`), `PowerEquipment/RackPDUs` (`Mains`, `Branches`, `Outlets`) and
//! `ThermalEquipment/CDUs` (coolant connectors, pumps, leak detectors).
//!
//! # Layout
//! - [`endpoint`]: one BMC: its async client, auth and session, one GET with a timeout.
//! - `discover`: the async walk: independent GETs of one endpoint in parallel (up to
//!   `per_endpoint`), dependent ones in order; the re-reads of what discovery found.
//! - `walk`: readings out of the fetched resources, in walk order (pure).
//! - [`bind`]: the site's `[[redfish]]` bindings applied to fetched resources (pure).
//! - [`poll`]: the [`Poller`]: global concurrency, a deadline per poll, backoff with
//!   jitter, discoveries in the background, the async loop for `serve`.
//! - `polled`: what one poll of one endpoint gave ([`Polled`], [`BindingReport`]),
//!   made by `walk` and `task`, gathered by `poll` (which re-exports both).
//! - `source`: the poller as a [`crate::source::Source`] ([`RedfishSource`]).
//! - `task`: one endpoint's walk as a task: the re-reads of its plan, or a discovery.
//! - [`stats`]: failures per endpoint and reason, poll durations, overruns.

pub mod bind;
mod discover;
pub mod endpoint;
pub mod extract;
pub mod poll;
mod polled;
mod source;
pub mod stats;
pub mod survey;
mod task;
mod tls;
mod walk;

use std::collections::BTreeMap;

use serde::Deserialize;
use thiserror::Error;

pub use crate::secret::PasswordError;
pub use crate::tls::Tls;
pub use endpoint::Endpoint;
pub use poll::{backoff, BindingReport, Options, Polled, Poller, StatsHandle, REDISCOVER_EVERY};
pub use source::RedfishSource;
pub use stats::EndpointStats;

/// How to authenticate.
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "snake_case", tag = "kind")]
pub enum Auth {
    #[default]
    None,
    /// HTTP Basic on every request.
    Basic {
        username: String,
        #[serde(default)]
        password: String,
        /// A file holding the password (preferred); read when the config is loaded.
        #[serde(default)]
        password_file: Option<std::path::PathBuf>,
    },
    /// A Redfish session: one login, then `X-Auth-Token` (logged in again on 401).
    Session {
        username: String,
        #[serde(default)]
        password: String,
        #[serde(default)]
        password_file: Option<std::path::PathBuf>,
    },
}

impl Auth {
    /// Reads `password_file` (relative to `base`) into `password`; both at once, or
    /// neither for basic or session auth, is an error.
    pub fn read_secrets(&mut self, base: &std::path::Path) -> Result<(), PasswordError> {
        let (Auth::Basic {
            password,
            password_file,
            ..
        }
        | Auth::Session {
            password,
            password_file,
            ..
        }) = self
        else {
            return Ok(());
        };
        match password_file.take() {
            None if password.is_empty() => Err(PasswordError::Missing),
            None => Ok(()),
            Some(_) if !password.is_empty() => Err(PasswordError::Both),
            Some(f) => {
                *password = crate::secret::read(base, &f).map_err(PasswordError::File)?;
                Ok(())
            }
        }
    }
}

/// One BMC, PDU or CDU.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EndpointConfig {
    /// A short name, used in default entity names, in sample sources and as the
    /// `endpoint` label of the Redfish counters.
    pub name: String,
    /// Base URL, e.g. `https://10.1.2.3` (the service root is `/redfish/v1`).
    pub url: String,
    #[serde(default)]
    pub auth: Auth,
    #[serde(default)]
    pub tls: Tls,
    /// The deadline of one GET (connect, headers and body).
    #[serde(default = "default_timeout")]
    pub timeout_s: f64,
    /// Entity for a resource, by its path under `/redfish/v1/`: `"Chassis/1U" =
    /// "node/a01-n01"`, `"RackPDUs/1" = "pdu/pdu-a01"`, `"CDUs/1" = "cooling/cdu-1"`.
    /// Unlisted resources are named `{name}.{id}`.
    #[serde(default)]
    pub entities: BTreeMap<String, String>,
    /// The site file's `[[redfish]]` bindings of this endpoint (set when the config is
    /// loaded, never written in the endpoint's own table). With bindings and no
    /// `entities`, only the bound resources are read.
    #[serde(skip)]
    pub bind: Vec<telemetry::site::redfish::RedfishBinding>,
    /// Read a collection's members in one GET (`$expand`) where the service root
    /// advertises it (`ProtocolFeaturesSupported.ExpandQuery`); a service that then
    /// refuses it or answers without the members is read member by member.
    #[serde(default = "default_expand")]
    pub expand: bool,
}

fn default_expand() -> bool {
    true
}

fn default_timeout() -> f64 {
    5.0
}

impl EndpointConfig {
    pub fn new(name: &str, url: &str) -> Self {
        EndpointConfig {
            name: name.into(),
            url: url.trim_end_matches('/').into(),
            auth: Auth::None,
            tls: Tls::default(),
            timeout_s: default_timeout(),
            entities: BTreeMap::new(),
            bind: Vec::new(),
            expand: default_expand(),
        }
    }

    /// Whether discovery walks the built-in tree (`Chassis`, `RackPDUs`, `CDUs`): always
    /// but for an endpoint the site binds and that lists no `entities`.
    pub fn walks_tree(&self) -> bool {
        self.bind.is_empty() || !self.entities.is_empty()
    }
}

#[derive(Debug, Error)]
pub enum RedfishError {
    #[error("redfish {endpoint}: {message}")]
    Config { endpoint: String, message: String },
    #[error("redfish {endpoint}: {method} {path}: {kind}: {message}")]
    Fetch {
        endpoint: String,
        /// `GET`, or `POST` for an action.
        method: &'static str,
        path: String,
        kind: &'static str,
        /// The HTTP status, for `http_status` and `auth`.
        status: Option<u16>,
        message: String,
    },
}

impl RedfishError {
    /// A short label for rejects: `timeout`, `unreachable`, `http_status`, `bad_json`,
    /// `oversize`, `tls`, `auth`, `deadline`.
    pub fn reason(&self) -> &'static str {
        match self {
            RedfishError::Config { .. } => "config",
            RedfishError::Fetch { kind, .. } => kind,
        }
    }

    /// The `reason` label of `powerplane_redfish_failures_total`: `timeout`, `connect`,
    /// `tls`, `status_4xx`, `status_5xx`, `bad_json`, `oversize`, `auth`, `config`.
    pub fn failure(&self) -> &'static str {
        match self {
            RedfishError::Config { .. } => "config",
            RedfishError::Fetch { kind, status, .. } => match (*kind, status) {
                ("unreachable", _) => "connect",
                ("http_status", Some(s)) if (400..500).contains(s) => "status_4xx",
                ("http_status", _) => "status_5xx",
                ("deadline", _) => "timeout",
                (k, _) => k,
            },
        }
    }

    /// The endpoint cannot be talked to at all: the rest of its walk is not tried.
    pub fn is_fatal(&self) -> bool {
        matches!(
            self.reason(),
            "timeout" | "unreachable" | "tls" | "deadline" | "config"
        )
    }

    /// The resource is gone (404, 410): the tree changed, discover it again.
    pub fn is_gone(&self) -> bool {
        matches!(
            self,
            RedfishError::Fetch {
                status: Some(404 | 410),
                ..
            }
        )
    }
}

/// Every failure reason of [`RedfishError::failure`], for exporting zeros.
pub const FAILURE_REASONS: [&str; 9] = [
    "timeout",
    "connect",
    "tls",
    "status_4xx",
    "status_5xx",
    "bad_json",
    "oversize",
    "auth",
    "config",
];

#[cfg(test)]
mod tests {
    use super::*;

    fn fetch(kind: &'static str, status: Option<u16>) -> RedfishError {
        RedfishError::Fetch {
            endpoint: "e".into(),
            method: "GET",
            path: "/redfish/v1".into(),
            kind,
            status,
            message: String::new(),
        }
    }

    #[test]
    fn failures_are_labelled_by_what_an_operator_fixes() {
        assert_eq!(fetch("unreachable", None).failure(), "connect");
        assert_eq!(fetch("http_status", Some(404)).failure(), "status_4xx");
        assert_eq!(fetch("http_status", Some(503)).failure(), "status_5xx");
        assert_eq!(fetch("timeout", None).failure(), "timeout");
        assert_eq!(fetch("auth", Some(401)).failure(), "auth");
        assert!(fetch("http_status", Some(404)).is_gone());
        assert!(!fetch("http_status", Some(500)).is_gone());
        for e in [fetch("timeout", None), fetch("unreachable", None)] {
            assert!(FAILURE_REASONS.contains(&e.failure()));
            assert!(e.is_fatal());
        }
    }
}
