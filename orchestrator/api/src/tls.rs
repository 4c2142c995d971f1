//! Optional TLS of the HTTP edge: a certificate chain and key (PEM) from
//! `[http] tls_cert_file` / `tls_key_file`, served with rustls, and reread on SIGHUP
//! and when the files change (looked at every `tls_reload_s`: a renewed certificate,
//! a Secret volume that cert-manager updated). New connections get the new pair; a
//! pair that does not load (a certificate written before its key) leaves the old one
//! and is tried again when the files change again.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::stats::{bump, HttpStats};

/// Why a certificate or key could not be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("[http] tls: cannot read {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("[http] tls: no certificate in {0} (PEM \"BEGIN CERTIFICATE\")")]
    NoCert(PathBuf),
    #[error("[http] tls: no private key in {0} (PEM PKCS#8, PKCS#1 or SEC1)")]
    NoKey(PathBuf),
    #[error("[http] tls: certificate {cert} and key {key} do not make a server config")]
    Config {
        cert: PathBuf,
        key: PathBuf,
        #[source]
        source: rustls::Error,
    },
    #[error("[http] tls: give both tls_cert_file and tls_key_file, or neither")]
    Half,
}

/// The acceptor in force, swapped on reload.
pub struct Tls {
    cert: PathBuf,
    key: PathBuf,
    current: RwLock<TlsAcceptor>,
}

impl Tls {
    /// Loads the pair; fails when either file is missing or they do not match.
    pub fn load(cert: &Path, key: &Path) -> Result<Self, TlsError> {
        let acceptor = acceptor(cert, key)?;
        Ok(Tls {
            cert: cert.to_path_buf(),
            key: key.to_path_buf(),
            current: RwLock::new(acceptor),
        })
    }

    /// The acceptor for a new connection.
    pub fn acceptor(&self) -> TlsAcceptor {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Rereads the pair; on error the one in force stays.
    pub fn reload(&self) -> Result<(), TlsError> {
        let fresh = acceptor(&self.cert, &self.key)?;
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = fresh;
        Ok(())
    }
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.to_path_buf(),
        source,
    })
}

/// A rustls acceptor (HTTP/1.1 by ALPN) for the pair.
fn acceptor(cert: &Path, key: &Path) -> Result<TlsAcceptor, TlsError> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&read(cert)?)
        .filter_map(Result::ok)
        .collect();
    if chain.is_empty() {
        return Err(TlsError::NoCert(cert.to_path_buf()));
    }
    let private = PrivateKeyDer::from_pem_slice(&read(key)?)
        .map_err(|_| TlsError::NoKey(key.to_path_buf()))?;
    let config_error = |source| TlsError::Config {
        cert: cert.to_path_buf(),
        key: key.to_path_buf(),
        source,
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(config_error)?
        .with_no_client_auth()
        .with_single_cert(chain, private)
        .map_err(config_error)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// What the two files hold now, as one fingerprint (`None`: one cannot be read).
async fn fingerprint(tls: &Tls) -> Option<u64> {
    use std::hash::{Hash, Hasher};
    let cert = tokio::fs::read(&tls.cert).await.ok()?;
    let key = tokio::fs::read(&tls.key).await.ok()?;
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (cert, key).hash(&mut h);
    Some(h.finish())
}

/// Rereads the pair on every SIGHUP (the policy reloads on the same signal, see
/// [`runtime::reload`]) and, with `every`, whenever what the files hold changes,
/// until shutdown.
pub async fn reload_on_sighup(
    tls: Arc<Tls>,
    stats: Arc<HttpStats>,
    shutdown: CancellationToken,
    every: Option<std::time::Duration>,
) {
    let mut hup = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
        Ok(s) => s,
        Err(e) => {
            warn!(error = %e, "cannot watch SIGHUP; the TLS certificate is not reread");
            return;
        }
    };
    let mut seen = fingerprint(&tls).await;
    let mut look = every.map(|e| {
        let mut t = tokio::time::interval(e.max(std::time::Duration::from_millis(100)));
        t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        t
    });
    loop {
        let why = tokio::select! {
            _ = shutdown.cancelled() => return,
            got = hup.recv() => {
                if got.is_none() {
                    return;
                }
                seen = fingerprint(&tls).await;
                "SIGHUP"
            }
            _ = async {
                match look.as_mut() {
                    Some(t) => t.tick().await,
                    None => std::future::pending().await,
                }
            } => {
                let now = fingerprint(&tls).await;
                if now.is_none() || now == seen {
                    continue;
                }
                seen = now;
                "the files changed"
            }
        };
        match tls.reload() {
            Ok(()) => {
                bump(&stats.tls_reloads_ok);
                info!(cert = %tls.cert.display(), why, "TLS certificate reread");
            }
            Err(e) => {
                bump(&stats.tls_reloads_error);
                warn!(error = %e, why, "TLS certificate not reread; the previous one stays");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CERT: &str = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
    const KEY: &str = "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n";

    fn pair(cert: &str, key: &str) -> (tempfile::TempDir, PathBuf, PathBuf) {
        let dir = tempfile::tempdir().expect("tmp");
        let (c, k) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
        std::fs::write(&c, cert).expect("cert");
        std::fs::write(&k, key).expect("key");
        (dir, c, k)
    }

    #[test]
    fn a_missing_file_is_a_read_error_naming_it() {
        let (_dir, c, k) = pair(CERT, KEY);
        let gone = c.with_file_name("gone.pem");
        let e = Tls::load(&gone, &k).err().expect("error");
        assert!(
            matches!(e, TlsError::Read { ref path, .. } if *path == gone),
            "{e}"
        );
    }

    #[test]
    fn a_file_without_a_certificate_block_is_no_cert() {
        let (_dir, c, k) = pair("not pem\n", KEY);
        let e = Tls::load(&c, &k).err().expect("error");
        assert!(matches!(e, TlsError::NoCert(ref p) if *p == c), "{e}");
        let (_dir, c, k) = pair(KEY, KEY);
        let e = Tls::load(&c, &k).err().expect("error");
        assert!(matches!(e, TlsError::NoCert(_)), "{e}");
    }

    #[test]
    fn a_file_without_a_key_block_is_no_key() {
        let (_dir, c, k) = pair(CERT, CERT);
        let e = Tls::load(&c, &k).err().expect("error");
        assert!(matches!(e, TlsError::NoKey(ref p) if *p == k), "{e}");
    }

    #[test]
    fn a_key_block_of_any_kind_is_taken_and_then_checked_by_rustls() {
        for label in ["PRIVATE KEY", "RSA PRIVATE KEY", "EC PRIVATE KEY"] {
            let key = format!("-----BEGIN {label}-----\nAAAA\n-----END {label}-----\n");
            let (_dir, c, k) = pair(CERT, &key);
            let e = Tls::load(&c, &k).err().expect("error");
            assert!(matches!(e, TlsError::Config { .. }), "{label}: {e}");
        }
    }
}
