//! The connection to the Kubernetes API server: kube-rs on a small tokio runtime of
//! its own, so that a hung API server costs its own threads and never the caller's.
//!
//! Where the API server is and who powerplane is ([`Access`]):
//! - in the cluster (the default): `KUBERNETES_SERVICE_HOST`/`_PORT` and the service
//!   account's `token`, `ca.crt` and `namespace` (kube re-reads the token and the CA
//!   file as they rotate);
//! - a kubeconfig file (its current context or a named one; token, client
//!   certificate or exec auth as kube supports them);
//! - a URL with a CA file and a token file.
//!
//! Always https with the cluster's CA; plain http only to a loopback address (a local
//! `kubectl proxy`).

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use kube::config::{KubeConfigOptions, Kubeconfig};
use rustls::pki_types::pem::PemObject;
use serde::Deserialize;

use super::KubeError;

/// Where the service account's files are mounted in a pod.
pub const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// How powerplane reaches the API server (`[schedulers.kubernetes]`, `[ha]`).
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Access {
    /// The API server's URL (`https://…`; `http://` only to a loopback address). With
    /// it, `ca_file` and `token_file` say whom to trust and who powerplane is.
    #[serde(default)]
    pub api: Option<String>,
    /// PEM of the cluster's CA (with `api`).
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// A bearer token, re-read as it rotates (with `api`).
    #[serde(default)]
    pub token_file: Option<PathBuf>,
    /// A kubeconfig file: its current context, or `context`.
    #[serde(default)]
    pub kubeconfig: Option<PathBuf>,
    #[serde(default)]
    pub context: Option<String>,
    /// In the cluster: where the service account is mounted (default
    /// `/var/run/secrets/kubernetes.io/serviceaccount`).
    #[serde(default)]
    pub service_account_dir: Option<PathBuf>,
}

/// Which of the three ways [`Access`] names.
#[derive(Debug, Clone, PartialEq)]
pub enum Way<'a> {
    InCluster(PathBuf),
    Kubeconfig(&'a Path, Option<&'a str>),
    Url(&'a str),
}

impl Access {
    /// The way this access names, or why it names none clearly.
    pub fn way(&self) -> Result<Way<'_>, KubeError> {
        match (&self.api, &self.kubeconfig) {
            (Some(_), Some(_)) => Err(KubeError::Config(
                "give either api (with ca_file, token_file) or kubeconfig, not both".into(),
            )),
            (Some(api), None) => {
                if self.context.is_some() {
                    return Err(KubeError::Config("context goes with kubeconfig".into()));
                }
                Ok(Way::Url(api))
            }
            (None, Some(k)) => {
                if self.ca_file.is_some() || self.token_file.is_some() {
                    return Err(KubeError::Config(
                        "ca_file and token_file go with api; a kubeconfig names its own".into(),
                    ));
                }
                Ok(Way::Kubeconfig(k, self.context.as_deref()))
            }
            (None, None) => {
                if self.ca_file.is_some() || self.token_file.is_some() || self.context.is_some() {
                    return Err(KubeError::Config(
                        "ca_file and token_file need api; context needs kubeconfig".into(),
                    ));
                }
                Ok(Way::InCluster(
                    self.service_account_dir
                        .clone()
                        .unwrap_or_else(|| PathBuf::from(SERVICE_ACCOUNT_DIR)),
                ))
            }
        }
    }

    /// The same access with its files resolved against `base` (the config file's
    /// folder).
    pub fn resolved(&self, resolve: impl Fn(&Path) -> PathBuf) -> Access {
        Access {
            api: self.api.clone(),
            ca_file: self.ca_file.as_deref().map(&resolve),
            token_file: self.token_file.as_deref().map(&resolve),
            kubeconfig: self.kubeconfig.as_deref().map(&resolve),
            context: self.context.clone(),
            service_account_dir: self.service_account_dir.as_deref().map(&resolve),
        }
    }

    /// The kube configuration: `timeout` bounds connecting and sending (each call
    /// has its own deadline on top; watches end by their idle timeout).
    pub fn config(&self, timeout: Duration) -> Result<kube::Config, KubeError> {
        let mut cfg = match self.way()? {
            Way::InCluster(dir) => in_cluster(&dir)?,
            Way::Kubeconfig(path, context) => {
                let kc = Kubeconfig::read_from(path).map_err(|e| {
                    KubeError::Config(format!("kubeconfig {}: {e}", path.display()))
                })?;
                let options = KubeConfigOptions {
                    context: context.map(str::to_string),
                    ..Default::default()
                };
                block_on_any(kube::Config::from_custom_kubeconfig(kc, &options))
                    .map_err(|e| KubeError::Config(format!("kubeconfig {}: {e}", path.display())))?
            }
            Way::Url(api) => {
                let url = parse_url(api)?;
                let mut cfg = kube::Config::new(url);
                if let Some(ca) = &self.ca_file {
                    cfg.root_cert = Some(certs(ca)?);
                    cfg.root_cert_file = Some(ca.clone());
                }
                if let Some(t) = &self.token_file {
                    std::fs::read_to_string(t).map_err(|e| {
                        KubeError::Config(format!("token_file {}: {e}", t.display()))
                    })?;
                    cfg.auth_info.token_file = Some(t.display().to_string());
                }
                cfg
            }
        };
        check_scheme(&cfg.cluster_url)?;
        cfg.connect_timeout = Some(timeout);
        cfg.write_timeout = Some(timeout);
        Ok(cfg)
    }
}

/// The in-cluster configuration from the environment and the service account's files
/// under `dir`.
fn in_cluster(dir: &Path) -> Result<kube::Config, KubeError> {
    let host = std::env::var("KUBERNETES_SERVICE_HOST").map_err(|_| {
        KubeError::Config(
            "not in a cluster (KUBERNETES_SERVICE_HOST is not set): give api or kubeconfig".into(),
        )
    })?;
    let port = std::env::var("KUBERNETES_SERVICE_PORT").unwrap_or_else(|_| "443".into());
    let host = if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]")
    } else {
        host
    };
    let url = parse_url(&format!("https://{host}:{port}"))?;
    let token = dir.join("token");
    std::fs::read_to_string(&token).map_err(|e| {
        KubeError::Config(format!("service account token {}: {e}", token.display()))
    })?;
    let ca = dir.join("ca.crt");
    let namespace = std::fs::read_to_string(dir.join("namespace"))
        .map(|n| n.trim().to_string())
        .unwrap_or_else(|_| "default".into());
    let mut cfg = kube::Config::new(url);
    cfg.default_namespace = namespace;
    cfg.root_cert = Some(certs(&ca)?);
    cfg.root_cert_file = Some(ca);
    cfg.auth_info.token_file = Some(token.display().to_string());
    Ok(cfg)
}

fn parse_url(api: &str) -> Result<http::Uri, KubeError> {
    api.parse::<http::Uri>()
        .map_err(|e| KubeError::Config(format!("api {api:?}: {e}")))
}

/// https, or http to a loopback address only.
fn check_scheme(url: &http::Uri) -> Result<(), KubeError> {
    match url.scheme_str() {
        Some("https") => Ok(()),
        Some("http") => {
            let host = url.host().unwrap_or("").trim_matches(['[', ']']);
            let loopback = host == "localhost"
                || host
                    .parse::<std::net::IpAddr>()
                    .is_ok_and(|ip| ip.is_loopback());
            if loopback {
                Ok(())
            } else {
                Err(KubeError::Config(format!(
                    "{url}: plain http only to a loopback address (kubectl proxy); the API server over https with its CA"
                )))
            }
        }
        _ => Err(KubeError::Config(format!("{url}: not an https:// URL"))),
    }
}

/// The certificates of a PEM file, as DER.
fn certs(path: &Path) -> Result<Vec<Vec<u8>>, KubeError> {
    let bad = |e: String| KubeError::Config(format!("CA {}: {e}", path.display()));
    let certs: Vec<Vec<u8>> = rustls::pki_types::CertificateDer::pem_file_iter(path)
        .map_err(|e| bad(e.to_string()))?
        .map(|c| c.map(|c| c.to_vec()).map_err(|e| bad(e.to_string())))
        .collect::<Result<_, _>>()?;
    if certs.is_empty() {
        return Err(bad("no certificate in the file".into()));
    }
    Ok(certs)
}

/// A tokio runtime of the connection's own (one worker): shut down in the background
/// when the last user drops it, so dropping never blocks, from any thread.
struct OwnRuntime(Option<tokio::runtime::Runtime>);

impl Drop for OwnRuntime {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

/// A client to one API server, with the runtime it runs on.
#[derive(Clone)]
pub struct Kube {
    pub client: kube::Client,
    /// The namespace of the configuration (the service account's, the context's).
    pub namespace: String,
    /// The API server's URL, for status and messages.
    pub url: String,
    /// Each call's deadline.
    pub timeout: Duration,
    rt: Arc<OwnRuntime>,
}

impl std::fmt::Debug for Kube {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kube")
            .field("url", &self.url)
            .field("namespace", &self.namespace)
            .finish()
    }
}

impl Kube {
    /// Connects lazily: the client is built here, the first request makes the
    /// connection. Each call ends by `timeout` ([`Kube::call`]).
    pub fn new(access: &Access, timeout: Duration) -> Result<Kube, KubeError> {
        Self::build(access, timeout, None)
    }

    /// A client for watches: besides each call's deadline, an answer (a list, a
    /// watch) silent for `idle` is dropped, so a list on a connection that went dead
    /// without closing is made anew instead of waiting for ever. `idle` must exceed
    /// the longest a watch may stay silent (its server-side timeout).
    pub fn watching(access: &Access, timeout: Duration, idle: Duration) -> Result<Kube, KubeError> {
        Self::build(access, timeout, Some(idle))
    }

    fn build(
        access: &Access,
        timeout: Duration,
        idle: Option<Duration>,
    ) -> Result<Kube, KubeError> {
        let mut cfg = access.config(timeout)?;
        if let Some(idle) = idle {
            cfg.read_timeout = Some(idle);
            // counted from each request sent, not from when its pooled connection idled
            cfg.reset_reader_on_write = true;
        }
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("kube")
            .enable_all()
            .build()
            .map_err(|e| KubeError::Config(format!("cannot start the client's runtime: {e}")))?;
        let (url, namespace) = (cfg.cluster_url.to_string(), cfg.default_namespace.clone());
        let client = {
            let _in = rt.enter();
            kube::Client::try_from(cfg).map_err(|e| KubeError::Config(e.to_string()))?
        };
        Ok(Kube {
            client,
            namespace,
            url,
            timeout,
            rt: Arc::new(OwnRuntime(Some(rt))),
        })
    }

    fn runtime(&self) -> &tokio::runtime::Runtime {
        self.rt.0.as_ref().expect("the runtime lives until dropped")
    }

    /// Runs `f` on the client's runtime in the background.
    pub fn spawn<F>(&self, f: F) -> tokio::task::JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.runtime().spawn(f)
    }

    /// Runs one call to its end or to the deadline (`what` names it in the error).
    /// Blocks the calling thread: call it from a thread of its own (a reconciler, the
    /// election), never from a task.
    pub fn call<T: Send + 'static>(
        &self,
        what: &str,
        f: impl Future<Output = Result<T, kube::Error>> + Send + 'static,
    ) -> Result<T, KubeError> {
        let timeout = self.timeout;
        let out = self.spawn(async move { tokio::time::timeout(timeout, f).await });
        match block_on_any(out) {
            Ok(Ok(Ok(v))) => Ok(v),
            Ok(Ok(Err(e))) => Err(KubeError::from_kube(what, e)),
            Ok(Err(_)) => Err(KubeError::Timeout {
                what: what.to_string(),
                after: timeout,
            }),
            Err(e) => Err(KubeError::Config(format!(
                "{what}: the client's runtime: {e}"
            ))),
        }
    }
}

/// Waits for `f` on this thread: directly outside a runtime, on a short-lived thread
/// of its own inside one (a runtime's thread must not block on another future).
fn block_on_any<F: Future + Send>(f: F) -> F::Output
where
    F::Output: Send,
{
    if tokio::runtime::Handle::try_current().is_ok() {
        std::thread::scope(|s| {
            s.spawn(|| wait_here(f))
                .join()
                .expect("the waiting thread does not panic")
        })
    } else {
        wait_here(f)
    }
}

/// Drives `f` to its end on this thread, on a current-thread runtime made for it (the
/// calls themselves run on the client's runtime; this thread only waits).
fn wait_here<F: Future>(f: F) -> F::Output {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a current-thread runtime starts");
    rt.block_on(f)
}
