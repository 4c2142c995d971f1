//! The OpenADR 3 VEN: the REST/JSON client of a utility's (or aggregator's) VTN, as
//! OpenADR 3.1 (and 3.0 where they differ) defines it. It takes a bearer token by the
//! OAuth 2 client-credentials grant, finds or creates its VEN object, polls the
//! programs and events the VTN shows it, publishes them as
//! [`telemetry::grid::GridEvent`]s (source `openadr3`, program = the program's name)
//! for the grid controller, and reports the facility's metered power for every event
//! that asks for reports.
//!
//! Over the one HTTP client stack ([`crate::http`]): every call ends by its deadline; the
//! VTN's certificate is trusted as [`Tls`] says; the client secret comes from a file.
//!
//! # Layout
//!
//! - [`parse`]: what the VTN sends (pure): events and their intervals mapped to grid
//!   targets, programs, the token, VEN objects;
//! - [`held`]: the events held (pure): each poll's list, versions, statuses, samples
//!   and the reports due;
//! - [`notify`]: the VTN's MQTT notifier, where it offers one (a message: poll now);
//! - [`ven`]: the task (tokio): token, VEN object, polling, reports, backoff.
//!
//! # What the VEN understands
//!
//! Payload types `SIMPLE` (a level 0–3), `IMPORT_CAPACITY_LIMIT` and `DISPATCH_SETPOINT`
//! (a cap at the meter, in the event's units, kW where it names none), and
//! `DISPATCH_SETPOINT_RELATIVE` (a shed: a negative change in kW, or in percent with
//! units `PERCENT`). Others (prices, alerts, curves …) are counted in
//! `openadr_signals_skipped_total{reason}` and asked nothing of. OpenADR 3 has no
//! opt-in or opt-out message: an event the VTN lists for the VEN is followed as far as
//! the site can, and the reports show what it delivered. An event the VTN no longer
//! lists was cancelled.

mod call;
pub mod held;
pub mod notify;
pub mod parse;
pub mod report;
pub mod ven;

use thiserror::Error;

pub use ven::Ven;

use crate::http::ClientError;
pub use crate::tls::Tls;

/// The VTN and how to talk to it.
#[derive(Debug, Clone, PartialEq)]
pub struct VenConfig {
    /// The VTN's base URL, up to the resource names (`https://vtn.example/openadr3`).
    pub vtn_url: String,
    /// The VEN's name (`venName` of its VEN object; the `clientName` of its reports).
    pub ven_name: String,
    /// The OAuth 2 client the utility issued.
    pub client_id: String,
    pub client_secret: String,
    /// The token endpoint; without it, the one the VTN names at `GET /auth/server`.
    pub token_url: Option<String>,
    /// Only the events of these programs (by `programName`); empty: every program.
    pub programs: Vec<String>,
    /// The deadline of every call, seconds.
    pub timeout_s: f64,
    /// How often to poll, seconds.
    pub poll_s: f64,
    /// How often the meter is reported while an event that asks for reports is in
    /// force, seconds.
    pub report_s: f64,
    /// The longest wait between retries after failures, seconds.
    pub backoff_max_s: f64,
    /// Subscribe to the VTN's MQTT notifier where it offers one, and poll at once when
    /// it says something changed (polling every `poll_s` goes on beside).
    pub notifications: bool,
    pub tls: Tls,
}

impl VenConfig {
    /// A configuration with the defaults.
    pub fn new(vtn_url: &str, ven_name: &str, client_id: &str, client_secret: &str) -> VenConfig {
        VenConfig {
            vtn_url: vtn_url.to_string(),
            ven_name: ven_name.to_string(),
            client_id: client_id.to_string(),
            client_secret: client_secret.to_string(),
            token_url: None,
            programs: Vec::new(),
            timeout_s: 10.0,
            poll_s: 10.0,
            report_s: 60.0,
            backoff_max_s: 60.0,
            notifications: true,
            tls: Tls::default(),
        }
    }

    /// Every problem at once.
    pub fn validate(&self) -> Result<(), ConfigErrors> {
        let mut p = Vec::new();
        let is_url = |u: &str| {
            let u = u.trim_end_matches('/');
            (u.starts_with("http://") || u.starts_with("https://")) && u.len() >= 9
        };
        if !is_url(&self.vtn_url) {
            p.push(ConfigError::Url("vtn_url", self.vtn_url.clone()));
        }
        if let Some(t) = self.token_url.as_deref().filter(|t| !is_url(t)) {
            p.push(ConfigError::Url("token_url", t.to_string()));
        }
        if self.ven_name.trim().is_empty() || self.ven_name.len() > 128 {
            p.push(ConfigError::VenName);
        }
        if self.client_id.trim().is_empty() || self.client_secret.is_empty() {
            p.push(ConfigError::Credentials);
        }
        for (what, v, range) in [
            ("timeout_s", self.timeout_s, 0.1..=120.0),
            ("poll_s", self.poll_s, 1.0..=86_400.0),
            ("report_s", self.report_s, 1.0..=86_400.0),
            ("backoff_max_s", self.backoff_max_s, 1.0..=3_600.0),
        ] {
            if !range.contains(&v) {
                p.push(ConfigError::Range {
                    what,
                    lo: *range.start(),
                    hi: *range.end(),
                    got: v,
                });
            }
        }
        if self.tls.client_cert_file.is_some() != self.tls.client_key_file.is_some() {
            p.push(ConfigError::HalfIdentity);
        }
        if p.is_empty() {
            Ok(())
        } else {
            Err(ConfigErrors(p))
        }
    }
}

/// One problem of a [`VenConfig`].
#[derive(Debug, Clone, PartialEq, Error)]
pub enum ConfigError {
    #[error("openadr3: {0} must be an http:// or https:// URL, got {1:?}")]
    Url(&'static str, String),
    #[error("openadr3: ven_name must be 1 to 128 characters")]
    VenName,
    #[error("openadr3: client_id and client_secret_file (not empty) are needed")]
    Credentials,
    #[error("openadr3: {what} must be within {lo}..={hi}, got {got}")]
    Range {
        what: &'static str,
        lo: f64,
        hi: f64,
        got: f64,
    },
    #[error("openadr3: give both tls client_cert_file and client_key_file, or neither")]
    HalfIdentity,
}

/// Every problem of a [`VenConfig`].
#[derive(Debug, Clone, PartialEq, Error)]
#[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
pub struct ConfigErrors(pub Vec<ConfigError>);

/// Why no VEN could be built.
#[derive(Debug, Error)]
pub enum VenError {
    #[error(transparent)]
    Config(#[from] ConfigErrors),
    #[error("openadr3: {0}")]
    Client(#[from] ClientError),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_problem_of_a_config_is_told() {
        assert!(VenConfig::new("https://vtn/openadr3", "site-a", "c", "s")
            .validate()
            .is_ok());
        let mut bad = VenConfig::new("ftp://vtn", " ", "", "");
        bad.token_url = Some("vtn/token".into());
        bad.timeout_s = 0.0;
        bad.poll_s = 0.5;
        bad.tls.client_key_file = Some("k".into());
        let e = bad.validate().expect_err("invalid");
        assert_eq!(e.0.len(), 7, "{e}");
        assert!(e.to_string().contains("ftp://vtn"), "{e}");
        assert!(
            e.to_string().contains("poll_s must be within 1..=86400"),
            "{e}"
        );
    }
}
