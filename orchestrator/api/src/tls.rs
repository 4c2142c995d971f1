//! Optional TLS of the HTTP edge: a certificate chain and key (PEM) from
//! `[http] tls_cert_file` / `tls_key_file`, served with rustls, and reread on SIGHUP
//! (new connections get the new pair; a pair that does not load leaves the old one).

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

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
    let chain: Vec<_> = rustls_pemfile::certs(&mut read(cert)?.as_slice())
        .filter_map(Result::ok)
        .collect();
    if chain.is_empty() {
        return Err(TlsError::NoCert(cert.to_path_buf()));
    }
    let private = rustls_pemfile::private_key(&mut read(key)?.as_slice())
        .ok()
        .flatten()
        .ok_or_else(|| TlsError::NoKey(key.to_path_buf()))?;
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

/// Rereads the pair on every SIGHUP until shutdown (the policy reloads on the same
/// signal, see [`runtime::reload`]).
pub async fn reload_on_sighup(tls: Arc<Tls>, stats: Arc<HttpStats>, shutdown: CancellationToken) {
    let mut hup = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
        Ok(s) => s,
        Err(e) => {
            warn!(error = %e, "cannot watch SIGHUP; the TLS certificate is not reread");
            return;
        }
    };
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            got = hup.recv() => {
                if got.is_none() {
                    return;
                }
            }
        }
        match tls.reload() {
            Ok(()) => {
                bump(&stats.tls_reloads_ok);
                info!(cert = %tls.cert.display(), "SIGHUP: TLS certificate reread");
            }
            Err(e) => {
                bump(&stats.tls_reloads_error);
                warn!(error = %e, "SIGHUP: TLS certificate not reread; the previous one stays");
            }
        }
    }
}
