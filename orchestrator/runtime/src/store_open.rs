//! Opening the store for `serve`: Redis's reconnecting connection on the runtime's
//! handle, behind the local journal that keeps what Redis cannot take (see
//! `integrations::store::journal`); the embedded file, behind a journal on another
//! disk where `[store] journal` is set; for tools (`report`), the store alone.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use integrations::store::embedded::EmbeddedBackend;
use integrations::store::journal::{Journaled, Limits};
use integrations::store::postgres::{PostgresBackend, Target};
use integrations::store::redis::RedisBackend;
use integrations::store::Store;
use serde::Deserialize;
use tokio::runtime::Handle;
use tracing::{info, warn};

/// The journal file when `[store] journal` is not set: next to the config file.
pub const DEFAULT_JOURNAL: &str = "powerplane-journal.redb";

/// `[store] kind = "embedded"`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EmbeddedStoreConfig {
    /// The redb file (relative to the config file).
    pub path: PathBuf,
    /// The bound on what waits in memory while the file takes nothing, MiB.
    #[serde(default = "default_max_waiting_mib")]
    pub max_waiting_mib: u64,
    /// A journal on another filesystem: batches the file cannot take (a full or failing
    /// disk) wait there, durably, instead of in memory. None by default.
    #[serde(default)]
    pub journal: Option<PathBuf>,
    #[serde(default = "default_journal_max_mib")]
    pub journal_max_mib: u64,
    #[serde(default = "default_journal_max_batches")]
    pub journal_max_batches: u64,
}

impl EmbeddedStoreConfig {
    /// For `serve`: the file, behind its journal where one is set (replayed now if the
    /// last run left batches in it).
    pub fn open(&self, base: &Path) -> Result<Store> {
        let path = crate::paths::resolve(base, &self.path);
        let file = EmbeddedBackend::open(&path)?;
        let Some(journal) = &self.journal else {
            return Ok(Store::new(Box::new(file)));
        };
        let journal = crate::paths::resolve(base, journal);
        if same_filesystem(&path, &journal) {
            warn!(
                store = %path.display(),
                journal = %journal.display(),
                "[store] journal is on the same filesystem as the store's file: a full disk fills both; put it on another"
            );
        }
        journaled(
            Box::new(file),
            &journal,
            (self.journal_max_mib, self.journal_max_batches),
            "embedded store with a journal",
        )
    }

    /// For tools: the file alone (the journal belongs to `serve`).
    pub fn open_plain(&self, base: &Path) -> Result<Store> {
        let path = crate::paths::resolve(base, &self.path);
        Ok(Store::new(Box::new(EmbeddedBackend::open(&path)?)))
    }

    /// For `serve --check`: the file and the journal checked without writing to them.
    pub fn check(&self, base: &Path) -> Result<String> {
        let path = crate::paths::resolve(base, &self.path);
        let checked = integrations::store::embedded::check(&path)?;
        let mut out = format!("{}: {checked}", path.display());
        if let Some(j) = &self.journal {
            let j = crate::paths::resolve(base, j);
            let checked = integrations::store::embedded::check_journal(&j)?;
            out.push_str(&format!("; journal {}: {checked}", j.display()));
        }
        Ok(out)
    }
}

/// `inner` behind the journal at `path`, bounded by (MiB, batches); what a previous
/// run left in it replayed now.
fn journaled(
    inner: Box<dyn integrations::store::Backend>,
    path: &Path,
    (max_mib, max_batches): (u64, u64),
    what: &str,
) -> Result<Store> {
    let limits = Limits {
        max_bytes: max_mib.saturating_mul(1 << 20),
        max_batches,
    };
    let journaled = Journaled::open(inner, path, limits)
        .with_context(|| format!("cannot open the store journal {}", path.display()))?;
    info!(
        journal = %path.display(),
        waiting = journaled.depth(),
        max_batches,
        max_mib,
        "{what}"
    );
    Ok(Store::new(Box::new(journaled)))
}

/// Whether `a` and `b` (or the folders they will be created in) are on one filesystem.
fn same_filesystem(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let dev = |p: &Path| {
        std::fs::metadata(p)
            .or_else(|_| std::fs::metadata(p.parent().unwrap_or(Path::new("."))))
            .map(|m| m.dev())
            .ok()
    };
    matches!((dev(a), dev(b)), (Some(x), Some(y)) if x == y)
}

/// `[store] kind = "redis"`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedisStoreConfig {
    /// `redis://[:password@]host:port[/db]`; or give `url_file`.
    #[serde(default)]
    pub url: Option<String>,
    /// A file holding the URL (with its password), readable by the controller only.
    #[serde(default)]
    pub url_file: Option<PathBuf>,
    #[serde(default = "default_prefix")]
    pub prefix: String,
    /// Batches Redis cannot take wait here (relative to the config file).
    #[serde(default = "default_journal")]
    pub journal: PathBuf,
    /// Bound on the journal: encoded size of its batches, in MiB.
    #[serde(default = "default_journal_max_mib")]
    pub journal_max_mib: u64,
    /// Bound on the journal: number of batches (one per tick, about).
    #[serde(default = "default_journal_max_batches")]
    pub journal_max_batches: u64,
    /// The bound on what waits in memory while neither Redis nor the journal takes
    /// anything, MiB.
    #[serde(default = "default_max_waiting_mib")]
    pub max_waiting_mib: u64,
    /// Deadline of each call to Redis.
    #[serde(default = "default_timeout")]
    pub timeout_s: f64,
}

fn default_prefix() -> String {
    "powerplane".into()
}
fn default_journal() -> PathBuf {
    PathBuf::from(DEFAULT_JOURNAL)
}
fn default_journal_max_mib() -> u64 {
    Limits::default().max_bytes >> 20
}
fn default_journal_max_batches() -> u64 {
    Limits::default().max_batches
}
/// `[store] max_waiting_mib`: 64.
pub fn default_max_waiting_mib() -> u64 {
    (control::DEFAULT_MAX_WAITING_BYTES >> 20) as u64
}
fn default_timeout() -> f64 {
    2.0
}

impl RedisStoreConfig {
    /// The URL, from `url` or from `url_file` (relative to the config's folder).
    pub fn url(&self, base: &Path) -> Result<String> {
        store_url("redis", self.url.as_deref(), self.url_file.as_deref(), base)
    }

    fn deadline(&self) -> Duration {
        Duration::from_secs_f64(self.timeout_s.clamp(0.05, 60.0))
    }

    /// For `serve`: Redis with its connection's tasks on `handle`, behind the journal
    /// (replayed now if the last run left batches in it).
    pub fn open_journaled(&self, base: &Path, handle: Handle) -> Result<Store> {
        let url = self.url(base)?;
        let redis = RedisBackend::connect_on(&url, &self.prefix, handle, self.deadline())?;
        let path = crate::paths::resolve(base, &self.journal);
        journaled(
            Box::new(redis),
            &path,
            (self.journal_max_mib, self.journal_max_batches),
            "redis store with a local journal",
        )
    }

    /// For tools: Redis alone (the journal belongs to `serve`).
    pub fn open_plain(&self, base: &Path) -> Result<Store> {
        Ok(Store::new(Box::new(RedisBackend::connect(
            &self.url(base)?,
            &self.prefix,
        )?)))
    }
}

/// `[store] kind = "postgres"`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PostgresStoreConfig {
    /// `postgres://user[:password]@host[:port]/database[?options]` (or a key-value
    /// string); or give `url_file`.
    #[serde(default)]
    pub url: Option<String>,
    /// A file holding the URL (with its password), readable by the controller only.
    #[serde(default)]
    pub url_file: Option<PathBuf>,
    /// A file holding only the password (for a URL without one), readable by the
    /// controller only.
    #[serde(default)]
    pub password_file: Option<PathBuf>,
    /// Or the name of an environment variable holding the password (a systemd
    /// drop-in's `Environment=` or `LoadCredential=`).
    #[serde(default)]
    pub password_env: Option<String>,
    /// TLS to the server (the keys of every outbound client: `ca_file`,
    /// `pinned_sha256`, `insecure`, `client_cert_file`, `client_key_file`): with it,
    /// the server must speak TLS and show a certificate these trust for its host name.
    #[serde(default)]
    pub tls: Option<sources::tls::Tls>,
    /// The schema the store's tables live in (created where missing).
    #[serde(default = "default_prefix")]
    pub schema: String,
    /// Batches PostgreSQL cannot take wait here (relative to the config file).
    #[serde(default = "default_postgres_journal")]
    pub journal: PathBuf,
    #[serde(default = "default_journal_max_mib")]
    pub journal_max_mib: u64,
    #[serde(default = "default_journal_max_batches")]
    pub journal_max_batches: u64,
    #[serde(default = "default_max_waiting_mib")]
    pub max_waiting_mib: u64,
    /// Deadline of each call to PostgreSQL.
    #[serde(default = "default_timeout")]
    pub timeout_s: f64,
}

fn default_postgres_journal() -> PathBuf {
    PathBuf::from("powerplane-postgres-journal.redb")
}

impl PostgresStoreConfig {
    /// The URL, from `url` or from `url_file` (relative to the config's folder).
    pub fn url(&self, base: &Path) -> Result<String> {
        store_url(
            "postgres",
            self.url.as_deref(),
            self.url_file.as_deref(),
            base,
        )
    }

    /// Where to connect: the URL, the password from `password_file` or `password_env`,
    /// TLS from `tls` (its files relative to the config's folder).
    pub fn target(&self, base: &Path) -> Result<Target> {
        let url = self.url(base)?;
        let password = match (&self.password_file, &self.password_env) {
            (None, None) => None,
            (Some(f), None) => Some(
                sources::secret::read(base, f)
                    .map(|p| p.trim_end_matches(['\n', '\r']).to_string())
                    .map_err(|e| anyhow::anyhow!("[store] password_file: {e}"))?,
            ),
            (None, Some(var)) => Some(std::env::var(var).map_err(|_| {
                anyhow::anyhow!("[store] password_env: the environment has no {var:?}")
            })?),
            (Some(_), Some(_)) => {
                anyhow::bail!("[store] give one of password_file and password_env")
            }
        };
        if password.as_deref() == Some("") {
            anyhow::bail!("[store] the password (password_file or password_env) is empty");
        }
        let tls = match &self.tls {
            Some(t) => {
                let resolved = t.resolved(|p| {
                    crate::paths::resolve(base, Path::new(p))
                        .display()
                        .to_string()
                });
                let config = sources::tls::client_config(&resolved)
                    .map_err(|e| anyhow::anyhow!("[store] {e}"))?;
                Some(Arc::new(config))
            }
            None => None,
        };
        let target = Target { url, password, tls };
        target
            .check()
            .map_err(|e| anyhow::anyhow!("[store] url {}: {e}", target.shown()))?;
        Ok(target)
    }

    pub fn deadline(&self) -> Duration {
        Duration::from_secs_f64(self.timeout_s.clamp(0.05, 60.0))
    }

    /// For `serve`: PostgreSQL with its connection's task on `handle`, behind the
    /// journal (replayed now if the last run left batches in it).
    pub fn open_journaled(&self, base: &Path, handle: Handle) -> Result<Store> {
        let target = self.target(base)?;
        let pg = PostgresBackend::connect_on(&target, &self.schema, handle, self.deadline())?;
        let path = crate::paths::resolve(base, &self.journal);
        journaled(
            Box::new(pg),
            &path,
            (self.journal_max_mib, self.journal_max_batches),
            "postgres store with a local journal",
        )
    }

    /// For tools: PostgreSQL alone (the journal belongs to `serve`).
    pub fn open_plain(&self, base: &Path) -> Result<Store> {
        Ok(Store::new(Box::new(PostgresBackend::connect_to(
            &self.target(base)?,
            &self.schema,
        )?)))
    }
}

/// A server store's URL: `url`, or the secret in `url_file` (relative to `base`).
fn store_url(kind: &str, url: Option<&str>, file: Option<&Path>, base: &Path) -> Result<String> {
    match (url, file) {
        (Some(u), None) => Ok(u.to_string()),
        (None, Some(f)) => sources::secret::read(base, f)
            .map(|u| u.trim().to_string())
            .map_err(|e| anyhow::anyhow!("[store] url_file: {e}")),
        _ => anyhow::bail!("[store] kind = \"{kind}\" needs exactly one of url or url_file"),
    }
}
