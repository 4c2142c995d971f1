//! `[schedulers]` in `powerplane.toml`: one section per adapter, and the checks run
//! before anything starts (config → the adapters' reconcilers in [`super`]).

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::Result;
use integrations::kubernetes::{Access, PodMapping};
use integrations::slurm::JobMapping;
use integrations::slurm_api::{ApiPin, SlurmApiConfig, TokenFile};
use integrations::webhook::WebhookKey;
use serde::Deserialize;

/// `[schedulers]` in `powerplane.toml`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SchedulersSection {
    #[serde(default)]
    pub slurm: Option<SlurmSection>,
    #[serde(default)]
    pub webhook: Option<WebhookSection>,
    #[serde(default)]
    pub kubernetes: Option<KubernetesSection>,
}

/// `[schedulers.kubernetes]`: scheduling gates and the scheduler extender.
///
/// Where the API server is: in the cluster by default (the service account); or
/// `kubeconfig` (with `context`); or `api` with `ca_file` and `token_file`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KubernetesSection {
    /// The API server's URL (`https://…`; `http://` only to a loopback `kubectl proxy`).
    #[serde(default)]
    pub api: Option<String>,
    /// PEM of the cluster's CA (with `api`).
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// A bearer token for the API server, re-read as it rotates (with `api`).
    #[serde(default)]
    pub token_file: Option<PathBuf>,
    /// A kubeconfig file (its current context, or `context`).
    #[serde(default)]
    pub kubeconfig: Option<PathBuf>,
    #[serde(default)]
    pub context: Option<String>,
    /// In the cluster: where the service account is mounted.
    #[serde(default)]
    pub service_account_dir: Option<PathBuf>,
    /// Watch pods in this namespace only (default: every namespace).
    #[serde(default)]
    pub namespace: Option<String>,
    /// How long the API server keeps one watch open before it is started again; a
    /// watch silent for this long (and a few seconds) is dropped and made anew.
    #[serde(default = "default_watch_timeout")]
    pub watch_timeout_s: u32,
    #[serde(default = "default_poll")]
    pub poll_s: f64,
    #[serde(default = "default_timeout")]
    pub timeout_s: f64,
    /// The gate, the class label, the deferrable classes.
    #[serde(default)]
    pub pods: PodMapping,
    /// Kubernetes node name → the site file's node id, where they differ.
    #[serde(default)]
    pub node_names: BTreeMap<String, String>,
}

fn default_watch_timeout() -> u32 {
    integrations::kubernetes::DEFAULT_WATCH_TIMEOUT_S
}

impl KubernetesSection {
    /// Where the API server is and who powerplane is, files resolved against `base`.
    pub fn access(&self, base: &std::path::Path) -> Access {
        Access {
            api: self.api.clone(),
            ca_file: self.ca_file.clone(),
            token_file: self.token_file.clone(),
            kubeconfig: self.kubeconfig.clone(),
            context: self.context.clone(),
            service_account_dir: self.service_account_dir.clone(),
        }
        .resolved(|p| crate::paths::resolve(base, p))
    }
}

/// `[schedulers.webhook]`: any scheduler, through signed webhooks.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebhookSection {
    /// The shared key (hex, `openssl rand -hex 32`): verifies inbound events, signs
    /// outbound actions.
    pub key_file: PathBuf,
    /// Where actions are POSTed (`https://host/path`, or `http://` on a trusted
    /// network); without it, none are sent.
    #[serde(default)]
    pub url: Option<String>,
    /// PEM file of the site's CA, trusted beside the system's roots for the receiver's
    /// certificate.
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// SHA-256 of the receiver's certificate (hex, colons allowed): trust that one only.
    #[serde(default)]
    pub pinned_sha256: Option<String>,
    /// Accept any certificate from the receiver. Say so explicitly; never the default.
    #[serde(default)]
    pub insecure: bool,
    /// Mutual TLS: PEM file of the certificate powerplane shows the receiver.
    #[serde(default)]
    pub client_cert_file: Option<PathBuf>,
    /// Mutual TLS: PEM file of that certificate's private key.
    #[serde(default)]
    pub client_key_file: Option<PathBuf>,
    /// Inbound timestamps further than this from the clock are refused, and so are
    /// events whose body `time` is further than this ahead of it.
    #[serde(default = "default_tolerance")]
    pub tolerance_s: f64,
    /// An event is answered 202 once it is stored (on the next tick); if that takes
    /// longer than this, 503 (the event is still taken: resending is harmless).
    #[serde(default = "default_ack_wait")]
    pub ack_wait_s: f64,
    #[serde(default = "default_attempts")]
    pub max_attempts: u32,
    /// The first retry waits about this long; each next one twice as long.
    #[serde(default = "default_backoff")]
    pub backoff_s: f64,
    #[serde(default = "default_max_backoff")]
    pub max_backoff_s: f64,
    #[serde(default = "default_hook_timeout")]
    pub timeout_s: f64,
    /// Deliveries tried per tick at most.
    #[serde(default = "default_per_tick")]
    pub per_tick: usize,
    /// Classes deferrable unless an event says otherwise.
    #[serde(default = "default_deferrable")]
    pub deferrable_classes: Vec<String>,
    /// Events taken per minute at most, signed ones and those with operator tokens
    /// each; beyond it, 429.
    #[serde(default = "default_events_per_minute")]
    pub events_per_minute: u32,
}

impl WebhookSection {
    /// The section's TLS settings, their files resolved against `base`.
    pub fn tls(&self, base: &std::path::Path) -> sources::tls::Tls {
        let path = |p: &Option<PathBuf>| {
            p.as_ref()
                .map(|p| crate::paths::resolve(base, p).display().to_string())
        };
        sources::tls::Tls {
            ca_file: path(&self.ca_file),
            pinned_sha256: self.pinned_sha256.clone(),
            insecure: self.insecure,
            client_cert_file: path(&self.client_cert_file),
            client_key_file: path(&self.client_key_file),
        }
    }

    /// The receiver's client: `timeout_s` on every POST, the section's TLS.
    pub fn client(
        &self,
        base: &std::path::Path,
    ) -> Result<reqwest::blocking::Client, sources::http::ClientError> {
        sources::http::blocking_client(
            std::time::Duration::from_secs_f64(self.timeout_s),
            &self.tls(base),
        )
    }
}

fn default_events_per_minute() -> u32 {
    6000
}

fn default_tolerance() -> f64 {
    300.0
}
fn default_ack_wait() -> f64 {
    30.0
}
fn default_attempts() -> u32 {
    12
}
fn default_backoff() -> f64 {
    1.0
}
fn default_max_backoff() -> f64 {
    300.0
}
fn default_hook_timeout() -> f64 {
    5.0
}
fn default_per_tick() -> usize {
    50
}
fn default_deferrable() -> Vec<String> {
    vec!["batch".into(), "training".into()]
}

/// `[schedulers.slurm]`: slurmrestd, and how its jobs map to powerplane's.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SlurmSection {
    /// `unix:/path/to/slurmrestd.sock` (rest_auth/local), `http://host:port` or
    /// `https://host:port` (with `ca_file`).
    pub endpoint: String,
    /// `"auto"` (the newest version both speak) or one of `"v0.0.42"`, `"v0.0.41"`,
    /// `"v0.0.40"`, `"v0.0.38"`.
    #[serde(default)]
    pub api_version: ApiPin,
    /// Sent as `X-SLURM-USER-NAME` (root on the unix socket may act as any user;
    /// with `token_file`, the token's user).
    #[serde(default)]
    pub user: Option<String>,
    /// A JWT from `scontrol token` (auth/jwt), re-read when the file changes.
    #[serde(default)]
    pub token_file: Option<PathBuf>,
    /// The PEM CA of an `https://` endpoint's certificate.
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// Answers over this many bytes are refused (and counted).
    #[serde(default = "default_max_answer")]
    pub max_answer_bytes: usize,
    /// Seconds between polls of the job list (0: every tick).
    #[serde(default = "default_poll")]
    pub poll_s: f64,
    #[serde(default = "default_timeout")]
    pub timeout_s: f64,
    /// The `scontrol` that requeues, suspends and resumes (no REST version can): a
    /// command, or a list (`["chroot", "/srv/slurm", "scontrol"]`).
    #[serde(default = "default_scontrol")]
    pub scontrol: Command,
    /// `begin_time` (the default: the job's begin time is the lease, so Slurm starts
    /// it if powerplane stops renewing — no job stays held past its lease, even with a
    /// dead controller) or `hold` (JobHeldAdmin until released).
    #[serde(default = "default_hold_with")]
    pub hold_with: integrations::slurm_sync::HoldWith,
    #[serde(default)]
    pub mapping: JobMapping,
}

/// A command: one word, or the words of a command line.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(untagged)]
pub enum Command {
    One(PathBuf),
    Many(Vec<String>),
}

impl SlurmSection {
    /// The REST client's config; relative paths are taken from `base` (the config
    /// file's folder).
    pub fn api_config(&self, base: &std::path::Path) -> SlurmApiConfig {
        let mut c = SlurmApiConfig::new(&self.endpoint);
        c.api_version = self.api_version;
        c.user = self.user.clone();
        c.token_file = self
            .token_file
            .as_ref()
            .map(|t| crate::paths::resolve(base, t));
        c.ca_file = self
            .ca_file
            .as_ref()
            .map(|t| crate::paths::resolve(base, t));
        c.timeout_s = self.timeout_s;
        c.max_answer_bytes = self.max_answer_bytes;
        c.scontrol = match &self.scontrol {
            Command::One(p) => vec![p.display().to_string()],
            Command::Many(v) => v.clone(),
        };
        c
    }
}

fn default_poll() -> f64 {
    15.0
}

fn default_max_answer() -> usize {
    SlurmApiConfig::new("unix:/").max_answer_bytes
}

fn default_hold_with() -> integrations::slurm_sync::HoldWith {
    integrations::slurm_sync::HoldWith::BeginTime
}
fn default_timeout() -> f64 {
    10.0
}
fn default_scontrol() -> Command {
    Command::One(PathBuf::from("scontrol"))
}

/// Checks the section before anything starts (`base`: the config file's folder).
pub fn check(s: &SchedulersSection, file: &str, base: &std::path::Path) -> Result<()> {
    if let Some(k) = &s.kubernetes {
        anyhow::ensure!(
            k.poll_s >= 0.0 && k.timeout_s > 0.0 && k.watch_timeout_s >= 1 && !k.pods.gate.is_empty(),
            "{file}: [schedulers.kubernetes] needs poll_s >= 0, timeout_s > 0, watch_timeout_s >= 1 and a gate name"
        );
        // the way named, its files readable (in the cluster: only once there)
        let access = k.access(base);
        match access
            .way()
            .map_err(|e| anyhow::anyhow!("{file}: [schedulers.kubernetes] {e}"))?
        {
            integrations::kubernetes::Way::InCluster(_) => {}
            _ => {
                access
                    .config(std::time::Duration::from_secs_f64(k.timeout_s))
                    .map_err(|e| anyhow::anyhow!("{file}: [schedulers.kubernetes] {e}"))?;
            }
        }
    }
    if let Some(w) = &s.webhook {
        read_key(&crate::paths::resolve(base, &w.key_file))?;
        if let Some(u) = &w.url {
            anyhow::ensure!(
                u.starts_with("http://") || u.starts_with("https://"),
                "{file}: [schedulers.webhook] url {u:?}: an http:// or https:// URL"
            );
            w.client(base)
                .map_err(|e| anyhow::anyhow!("{file}: [schedulers.webhook] {e}"))?;
        }
        anyhow::ensure!(
            w.tolerance_s > 0.0
                && w.ack_wait_s > 0.0
                && w.backoff_s > 0.0
                && w.max_backoff_s >= w.backoff_s
                && w.timeout_s > 0.0
                && w.max_attempts >= 1
                && w.per_tick >= 1
                && w.events_per_minute >= 1,
            "{file}: [schedulers.webhook] needs tolerance_s, backoff_s, timeout_s above 0, max_backoff_s >= backoff_s, max_attempts, per_tick and events_per_minute at least 1"
        );
    }
    if let Some(sl) = &s.slurm {
        check_slurm(sl, file, base)?;
    }
    Ok(())
}

/// `[schedulers.slurm]`: every problem at once (the REST client's own checks
/// included: endpoint, ca_file, timeout_s, max_answer_bytes, token_file and user).
fn check_slurm(sl: &SlurmSection, file: &str, base: &std::path::Path) -> Result<()> {
    let mut bad = Vec::new();
    if !(sl.poll_s >= 0.0 && sl.poll_s.is_finite()) {
        bad.push(format!("poll_s must be 0 or more, got {}", sl.poll_s));
    }
    if sl.mapping.default_duration_s <= 0.0 {
        bad.push("mapping.default_duration_s must be above 0".to_string());
    }
    let api = sl.api_config(base);
    if let Err(e) = api.validate() {
        bad.push(
            e.to_string()
                .trim_start_matches("slurm api config: ")
                .to_string(),
        );
    }
    if let Some(t) = &api.token_file {
        if let Err(e) = TokenFile::new(t.clone()).token() {
            bad.push(e.to_string());
        }
    }
    anyhow::ensure!(
        bad.is_empty(),
        "{file}: [schedulers.slurm] {}",
        bad.join("; ")
    );
    Ok(())
}

pub(crate) fn read_key(path: &std::path::Path) -> Result<WebhookKey> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| anyhow::anyhow!("cannot read the webhook key {}: {e}", path.display()))?;
    WebhookKey::from_text(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_slurm_rest_keys_are_read_and_check_names_every_problem_at_once() {
        let s: SchedulersSection = serde_json::from_value(serde_json::json!({ "slurm": {
            "endpoint": "http://127.0.0.1:6820",
            "api_version": "v0.0.41",
            "user": "slurm",
            "token_file": "slurm.jwt",
            "max_answer_bytes": 1_000_000,
            "scontrol": ["chroot", "/srv/slurm", "scontrol"],
        }}))
        .expect("section");
        let sl = s.slurm.as_ref().expect("slurm");
        let api = sl.api_config(std::path::Path::new("/etc/powerplane"));
        assert_eq!(
            api.api_version,
            ApiPin::Exact(integrations::slurm_api::ApiVersion::V0041)
        );
        assert_eq!(
            api.token_file.as_deref(),
            Some(std::path::Path::new("/etc/powerplane/slurm.jwt"))
        );
        assert_eq!((api.max_answer_bytes, api.scontrol.len()), (1_000_000, 3));

        let bad: SchedulersSection = serde_json::from_value(serde_json::json!({ "slurm": {
            "endpoint": "https://slurm.example:8443",
            "token_file": "/nonexistent/slurm.jwt",
            "timeout_s": 0.0,
            "max_answer_bytes": 10,
            "poll_s": -1.0,
        }}))
        .expect("section");
        let e = check(&bad, "powerplane.toml", std::path::Path::new("/"))
            .expect_err("bad")
            .to_string();
        for part in [
            "[schedulers.slurm]",
            "poll_s",
            "timeout_s",
            "max_answer_bytes",
            "ca_file",
            "needs user",
            "/nonexistent/slurm.jwt",
        ] {
            assert!(e.contains(part), "{part} missing in: {e}");
        }
        assert!(
            serde_json::from_value::<SchedulersSection>(serde_json::json!({ "slurm": {
                "endpoint": "unix:/s", "api_version": "v0.0.37",
            }}))
            .is_err()
        );
    }
}
