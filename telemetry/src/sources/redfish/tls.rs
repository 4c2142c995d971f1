//! One HTTP client per endpoint, trusting what its TLS settings say: the system's
//! roots, a CA file, one pinned certificate, or (said explicitly) anything.

use std::sync::Arc;
use std::time::Duration;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use sha2::{Digest, Sha256};

use super::{EndpointConfig, RedfishError};

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

pub(super) fn client(cfg: &EndpointConfig) -> Result<reqwest::blocking::Client, RedfishError> {
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
    let mut b = reqwest::blocking::Client::builder()
        .timeout(timeout)
        .connect_timeout(timeout)
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
                want,
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

/// `AB:CD:...` or `abcd...` → 32 bytes.
pub(super) fn parse_fingerprint(s: &str) -> Option<[u8; 32]> {
    let hex: String = s
        .chars()
        .filter(|c| *c != ':' && !c.is_whitespace())
        .collect();
    if hex.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

/// Trusts exactly one certificate, by its SHA-256; signatures are still checked.
#[derive(Debug)]
struct Pinned {
    want: [u8; 32],
    provider: Arc<rustls::crypto::CryptoProvider>,
}

impl ServerCertVerifier for Pinned {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let got: [u8; 32] = Sha256::digest(end_entity.as_ref()).into();
        if got == self.want {
            Ok(ServerCertVerified::assertion())
        } else {
            Err(rustls::Error::General(
                "certificate does not match the pinned SHA-256".into(),
            ))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fingerprints_take_colons_or_not() {
        let hex = "ab".repeat(32);
        assert_eq!(parse_fingerprint(&hex), Some([0xab; 32]));
        let colons = vec!["AB"; 32].join(":");
        assert_eq!(parse_fingerprint(&colons), Some([0xab; 32]));
        assert_eq!(parse_fingerprint("abcd"), None);
        assert_eq!(parse_fingerprint(&"zz".repeat(32)), None);
    }
}
