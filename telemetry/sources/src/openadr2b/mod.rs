//! The OpenADR 2.0b VEN: the client side of a utility's (or aggregator's) demand-response
//! server (the VTN). It registers, polls, answers events (opting in or out as the caller
//! decides), reports the metered power when asked, and publishes the events it holds as
//! [`telemetry::grid::GridEvent`]s (source `openadr2b`, program = the market context)
//! for the grid controller.
//!
//! simpleHttp, pull model, over the one HTTP client stack ([`crate::http`]): every call
//! ends by its deadline, and mutual TLS (which 2.0b normally asks for) is the client
//! certificate and key of [`Tls`]. Payloads are unsigned unless `xml_signature` asks
//! for XML signatures ([`sign`]), made with that same identity.
//!
//! # Layout
//!
//! - [`iso`]: ISO 8601 durations and date-times as 2.0b writes them;
//! - [`payload`]: the XML the VEN sends (pure, escaped, in schema order);
//! - [`sign`]: its XML signature (inclusive canonical XML, SHA-256, the client key);
//! - [`parse`]: what the VTN sends, read by namespace and local name (pure), events
//!   mapped to grid targets;
//! - [`events`]: the VEN's event set (pure): merging, answering, cancelling, expiry;
//! - [`ven`]: the task (tokio): registration, polling, answers, backoff and
//!   re-registration; with `call` (why an exchange failed, the counters) and
//!   `reports` (the meter sampled and sent as the VTN asked).

pub(crate) mod call;
pub mod events;
pub mod iso;
pub mod parse;
pub mod payload;
mod reports;
pub mod sign;
pub mod ven;

use serde::Deserialize;
use thiserror::Error;

pub use events::Opt;
pub use ven::{MeterFn, OptFn, Ven};

use crate::http::ClientError;
pub use crate::tls::Tls;

/// `[demand_response.openadr2b]`: the VTN and how to talk to it.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VenConfig {
    /// The VTN's base URL, up to the service names
    /// (`https://vtn.example/OpenADR2/Simple/2.0b`).
    pub vtn_url: String,
    /// The VEN's name, sent when it registers (`oadrVenName`).
    pub ven_name: String,
    /// The deadline of every call to the VTN, seconds.
    #[serde(default = "default_timeout_s")]
    pub timeout_s: f64,
    /// How often to poll, seconds; without it, as often as the VTN asks
    /// (`oadrRequestedOadrPollFreq`), else every 10 s.
    #[serde(default)]
    pub poll_s: Option<f64>,
    /// The longest wait between retries after failures, seconds.
    #[serde(default = "default_backoff_max_s")]
    pub backoff_max_s: f64,
    /// How the VTN's certificate is trusted, and the VEN's own for mutual TLS.
    #[serde(default)]
    pub tls: Tls,
    /// Sign every payload (XML-DSig, OpenADR 2.0b's message-level security) with the
    /// mutual-TLS identity (`tls.client_cert_file`, `tls.client_key_file`), and say so
    /// when registering (`oadrXmlSignature`).
    #[serde(default)]
    pub xml_signature: bool,
    /// The SHA-256 of the certificate the VTN signs its messages with (hex, colons
    /// allowed): every message from the VTN must carry an XML signature made with it,
    /// else it is refused. Left out, the VTN's signatures are not checked.
    #[serde(default)]
    pub vtn_signing_sha256: Option<String>,
}

fn default_timeout_s() -> f64 {
    10.0
}

fn default_backoff_max_s() -> f64 {
    60.0
}

impl VenConfig {
    /// A configuration with the defaults.
    pub fn new(vtn_url: &str, ven_name: &str) -> VenConfig {
        VenConfig {
            vtn_url: vtn_url.to_string(),
            ven_name: ven_name.to_string(),
            timeout_s: default_timeout_s(),
            poll_s: None,
            backoff_max_s: default_backoff_max_s(),
            tls: Tls::default(),
            xml_signature: false,
            vtn_signing_sha256: None,
        }
    }

    /// Every problem at once.
    pub fn validate(&self) -> Result<(), ConfigErrors> {
        let mut p = Vec::new();
        let url = self.vtn_url.trim_end_matches('/');
        if !(url.starts_with("http://") || url.starts_with("https://")) || url.len() < 9 {
            p.push(ConfigError::VtnUrl(self.vtn_url.clone()));
        }
        if self.ven_name.trim().is_empty() {
            p.push(ConfigError::VenName);
        }
        if !(0.1..=120.0).contains(&self.timeout_s) {
            p.push(ConfigError::Timeout(self.timeout_s));
        }
        if let Some(s) = self.poll_s {
            if !(0.1..=86_400.0).contains(&s) {
                p.push(ConfigError::Poll(s));
            }
        }
        if !(1.0..=3_600.0).contains(&self.backoff_max_s) {
            p.push(ConfigError::Backoff(self.backoff_max_s));
        }
        if self.tls.client_cert_file.is_some() != self.tls.client_key_file.is_some() {
            p.push(ConfigError::HalfIdentity);
        }
        if self.xml_signature && self.tls.client_cert_file.is_none() {
            p.push(ConfigError::SignatureIdentity);
        }
        if let Some(pin) = &self.vtn_signing_sha256 {
            if crate::tls::parse_fingerprint(pin).is_none() {
                p.push(ConfigError::VtnSigningPin(pin.clone()));
            }
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
    #[error("openadr2b: vtn_url must be an http:// or https:// URL, got {0:?}")]
    VtnUrl(String),
    #[error("openadr2b: ven_name must not be empty")]
    VenName,
    #[error("openadr2b: timeout_s must be within 0.1..=120, got {0}")]
    Timeout(f64),
    #[error("openadr2b: poll_s must be within 0.1..=86400, got {0}")]
    Poll(f64),
    #[error("openadr2b: backoff_max_s must be within 1..=3600, got {0}")]
    Backoff(f64),
    #[error("openadr2b: give both tls client_cert_file and client_key_file, or neither")]
    HalfIdentity,
    #[error("openadr2b: xml_signature signs with the mutual-TLS identity: give tls client_cert_file and client_key_file")]
    SignatureIdentity,
    #[error("openadr2b: vtn_signing_sha256 {0:?} is not 64 hex digits")]
    VtnSigningPin(String),
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
    #[error("openadr2b: {0}")]
    Client(#[from] ClientError),
    #[error("openadr2b: {0}")]
    Sign(#[from] sign::SignError),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_config_reads_with_defaults_and_every_problem_is_told() {
        let c: VenConfig = toml::from_str(
            "vtn_url = \"https://vtn/OpenADR2/Simple/2.0b\"\nven_name = \"site-a\"\n\
             [tls]\nclient_cert_file = \"ven.pem\"\nclient_key_file = \"ven.key\"\n",
        )
        .expect("config");
        assert_eq!(c.timeout_s, 10.0);
        assert_eq!(c.tls.client_cert_file.as_deref(), Some("ven.pem"));
        assert!(c.validate().is_ok());
        assert!(
            toml::from_str::<VenConfig>("vtn_url = \"x\"\nven_name = \"a\"\nfoo = 1\n").is_err()
        );
        let mut bad = VenConfig::new("ftp://vtn", " ");
        bad.timeout_s = 0.0;
        bad.poll_s = Some(-1.0);
        bad.tls.client_key_file = Some("k".into());
        bad.xml_signature = true;
        bad.vtn_signing_sha256 = Some("AB:CD".into());
        let e = bad.validate().expect_err("invalid");
        assert_eq!(e.0.len(), 7, "{e}");
        assert!(
            e.0.contains(&ConfigError::VtnSigningPin("AB:CD".into())),
            "{e}"
        );
        assert!(e.to_string().contains("ftp://vtn"));
        assert!(e.0.contains(&ConfigError::SignatureIdentity), "{e}");
        assert!(!c.xml_signature, "unsigned unless asked");
    }
}
