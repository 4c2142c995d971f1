//! TLS for every outbound client (MQTT, Redfish, webhooks, feeds, node power): how the
//! server is trusted (the system's roots plus the site's CA file, one pinned
//! certificate, or, said explicitly, anything) and, for mutual TLS, the client's own
//! certificate and key.

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use serde::Deserialize;
use sha2::{Digest, Sha256};

/// How to trust a server's certificate, and what the client shows of itself.
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tls {
    /// PEM file of the site's CA (one or more certificates), trusted beside the
    /// system's roots.
    #[serde(default)]
    pub ca_file: Option<String>,
    /// SHA-256 of the server's certificate (hex, colons allowed): trust exactly that one.
    #[serde(default)]
    pub pinned_sha256: Option<String>,
    /// Accept any certificate. Say so explicitly; never the default.
    #[serde(default)]
    pub insecure: bool,
    /// Mutual TLS: PEM file of the client's certificate (its chain, leaf first).
    #[serde(default)]
    pub client_cert_file: Option<String>,
    /// Mutual TLS: PEM file of the client certificate's private key.
    #[serde(default)]
    pub client_key_file: Option<String>,
}

impl Tls {
    /// The same settings with every file path resolved by `resolve` (relative paths
    /// are the config file's).
    pub fn resolved(&self, resolve: impl Fn(&str) -> String) -> Tls {
        Tls {
            ca_file: self.ca_file.as_deref().map(&resolve),
            client_cert_file: self.client_cert_file.as_deref().map(&resolve),
            client_key_file: self.client_key_file.as_deref().map(&resolve),
            ..self.clone()
        }
    }
}

/// Why trust settings give no TLS client configuration.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("give one of tls.ca_file, tls.pinned_sha256 and tls.insecure")]
    Modes,
    #[error("tls.pinned_sha256 {0:?} is not 64 hex digits")]
    BadPin(String),
    #[error("tls.ca_file {path}: {source}")]
    CaPem {
        path: String,
        #[source]
        source: rustls::pki_types::pem::Error,
    },
    #[error("tls.ca_file {path}: {source}")]
    CaCertificate {
        path: String,
        #[source]
        source: rustls::Error,
    },
    #[error("tls.ca_file {0}: no certificate in it")]
    NoCertificate(String),
    /// The provider offers none of the safe protocol versions.
    #[error(transparent)]
    Protocols(rustls::Error),
    #[error("give both tls client_cert_file and client_key_file, or neither")]
    HalfIdentity,
    #[error("client_cert_file {path}: {source}")]
    ClientCertPem {
        path: String,
        #[source]
        source: rustls::pki_types::pem::Error,
    },
    #[error("client_cert_file {0}: no certificate in it")]
    NoClientCertificate(String),
    #[error("client_key_file {path}: {source}")]
    ClientKeyPem {
        path: String,
        #[source]
        source: rustls::pki_types::pem::Error,
    },
    /// The key does not fit the certificate, or is of a kind rustls cannot sign with.
    #[error("client_cert_file and client_key_file: {0}")]
    ClientIdentity(#[source] rustls::Error),
}

pub(crate) fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A rustls client configuration that trusts what `tls` says and, with a client
/// certificate, shows it.
pub fn client_config(tls: &Tls) -> Result<rustls::ClientConfig, TlsError> {
    let modes = usize::from(tls.insecure)
        + usize::from(tls.ca_file.is_some())
        + usize::from(tls.pinned_sha256.is_some());
    if modes > 1 {
        return Err(TlsError::Modes);
    }
    let identity = identity(tls)?;
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(TlsError::Protocols)?;
    let verified = if tls.pinned_sha256.is_some() || tls.insecure {
        let want = match &tls.pinned_sha256 {
            Some(pin) => Some(parse_fingerprint(pin).ok_or_else(|| TlsError::BadPin(pin.clone()))?),
            None => None,
        };
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(Pinned {
                want,
                provider: provider(),
            }))
    } else {
        builder.with_root_certificates(roots(tls.ca_file.as_deref())?)
    };
    match identity {
        Some((chain, key)) => verified
            .with_client_auth_cert(chain, key)
            .map_err(TlsError::ClientIdentity),
        None => Ok(verified.with_no_client_auth()),
    }
}

/// The system's roots, and the certificates of `ca_file`.
fn roots(ca_file: Option<&str>) -> Result<rustls::RootCertStore, TlsError> {
    let mut roots = rustls::RootCertStore::empty();
    // an unreadable system store leaves the site's CA (or, without one, nothing
    // trusted: every handshake then fails with a clear certificate error)
    for c in rustls_native_certs::load_native_certs().certs {
        let _ = roots.add(c);
    }
    if let Some(ca) = ca_file {
        let pem = |source| TlsError::CaPem {
            path: ca.to_string(),
            source,
        };
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(ca)
            .map_err(pem)?
            .collect::<Result<_, _>>()
            .map_err(pem)?;
        if certs.is_empty() {
            return Err(TlsError::NoCertificate(ca.to_string()));
        }
        for c in certs {
            roots.add(c).map_err(|source| TlsError::CaCertificate {
                path: ca.to_string(),
                source,
            })?;
        }
    }
    Ok(roots)
}

pub(crate) type Identity = (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>);

/// The client's certificate chain and key, when both are given.
fn identity(tls: &Tls) -> Result<Option<Identity>, TlsError> {
    match (&tls.client_cert_file, &tls.client_key_file) {
        (None, None) => Ok(None),
        (Some(c), Some(k)) => identity_files(c, k).map(Some),
        _ => Err(TlsError::HalfIdentity),
    }
}

/// The certificate chain (leaf first) and key in the PEM files `cert` and `key`.
pub(crate) fn identity_files(cert: &str, key: &str) -> Result<Identity, TlsError> {
    let pem = |source| TlsError::ClientCertPem {
        path: cert.to_string(),
        source,
    };
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .map_err(pem)?
        .collect::<Result<_, _>>()
        .map_err(pem)?;
    if chain.is_empty() {
        return Err(TlsError::NoClientCertificate(cert.to_string()));
    }
    let key = PrivateKeyDer::from_pem_file(key).map_err(|source| TlsError::ClientKeyPem {
        path: key.to_string(),
        source,
    })?;
    Ok((chain, key))
}

/// `AB:CD:...` or `abcd...` → 32 bytes.
pub fn parse_fingerprint(s: &str) -> Option<[u8; 32]> {
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

/// Trusts exactly one certificate by its SHA-256 (or, with no pin, any: `insecure`);
/// handshake signatures are still checked.
#[derive(Debug)]
pub(crate) struct Pinned {
    pub(crate) want: Option<[u8; 32]>,
    pub(crate) provider: Arc<rustls::crypto::CryptoProvider>,
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
        match self.want {
            Some(w) if w != got => Err(rustls::Error::General(
                "certificate does not match the pinned SHA-256".into(),
            )),
            _ => Ok(ServerCertVerified::assertion()),
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

    #[test]
    fn one_trust_mode_at_a_time() {
        let both = Tls {
            insecure: true,
            pinned_sha256: Some("ab".repeat(32)),
            ..Tls::default()
        };
        assert!(client_config(&both).is_err());
        let missing = client_config(&Tls {
            ca_file: Some("/nonexistent.pem".into()),
            ..Tls::default()
        });
        assert!(missing
            .err()
            .is_some_and(|e| e.to_string().contains("/nonexistent.pem")));
    }
}
