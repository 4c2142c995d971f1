//! [`ApiClient`]: the blocking facade the Slurm adapter calls from the scheduler's own
//! thread (never from the tick, never inside an async task: it runs a current-thread
//! runtime of its own). Built from [`SlurmApiConfig`]; `build` finds the version.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use hyper::Method;
use serde::Deserialize;
use serde_json::Value;

use super::http::{Answer, Auth, Http, TokenFile, Transport};
use super::shapes::{self, JobView, Request, ShapeError, Update};
use super::version::{self, ApiPin, ApiVersion};
use super::SlurmApiError;

/// Slurm's "invalid job id" error number.
const INVALID_JOB_ID: i64 = 2017;
/// Slurm's "protocol authentication error" (a JWT that slurmctld refused).
const AUTH_ERROR: i64 = 1007;

/// How powerplane reaches slurmrestd (the `[slurm]` section's REST part).
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SlurmApiConfig {
    /// `unix:/path`, `http://host:port` or `https://host:port`.
    pub endpoint: String,
    /// `"auto"` (default) or `"v0.0.42"`, `"v0.0.41"`, `"v0.0.40"`, `"v0.0.38"`.
    #[serde(default)]
    pub api_version: ApiPin,
    /// `X-SLURM-USER-NAME`: the JWT's user; on a unix socket, whom root acts as.
    #[serde(default)]
    pub user: Option<String>,
    /// The JWT (from `scontrol token`), re-read when the file changes; set: JWT auth.
    #[serde(default)]
    pub token_file: Option<PathBuf>,
    /// The CA (PEM) that signed the certificate of an `https://` endpoint.
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// The deadline of one call (connect to last byte), seconds.
    #[serde(default = "default_timeout")]
    pub timeout_s: f64,
    /// Answers over this many bytes are refused.
    #[serde(default = "default_max_answer")]
    pub max_answer_bytes: usize,
    /// The command for what the REST API cannot do (requeue, suspend, resume):
    /// `"scontrol"`, or a list (`["chroot", "/srv/slurm", "scontrol"]`).
    #[serde(default = "default_scontrol", deserialize_with = "one_or_many")]
    pub scontrol: Vec<String>,
}

fn default_timeout() -> f64 {
    10.0
}
fn default_max_answer() -> usize {
    64 << 20
}
/// `scontrol`, found on the PATH.
pub fn default_scontrol() -> Vec<String> {
    vec!["scontrol".into()]
}

/// A command: one word, or the words of a command line (`["chroot", "/srv/slurm", "scontrol"]`).
pub fn one_or_many<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(String),
        Many(Vec<String>),
    }
    Ok(match OneOrMany::deserialize(d)? {
        OneOrMany::One(s) => vec![s],
        OneOrMany::Many(v) => v,
    })
}

impl SlurmApiConfig {
    pub fn new(endpoint: &str) -> SlurmApiConfig {
        SlurmApiConfig {
            endpoint: endpoint.into(),
            api_version: ApiPin::Auto,
            user: None,
            token_file: None,
            ca_file: None,
            timeout_s: default_timeout(),
            max_answer_bytes: default_max_answer(),
            scontrol: default_scontrol(),
        }
    }

    /// Every problem of the config at once.
    pub fn validate(&self) -> Result<(), SlurmApiError> {
        let mut bad = Vec::new();
        if !(self.timeout_s.is_finite() && self.timeout_s > 0.0 && self.timeout_s <= 300.0) {
            bad.push(format!(
                "timeout_s must be within (0, 300], got {}",
                self.timeout_s
            ));
        }
        if self.max_answer_bytes < 1024 {
            bad.push(format!(
                "max_answer_bytes must be at least 1024, got {}",
                self.max_answer_bytes
            ));
        }
        if self.token_file.is_some() && self.user.is_none() {
            bad.push("token_file needs user (the token's user name)".into());
        }
        if self.scontrol.is_empty() {
            bad.push("scontrol must name a command".into());
        }
        if let Err(e) = Transport::parse(&self.endpoint, self.ca_file.as_deref()) {
            bad.push(
                e.to_string()
                    .trim_start_matches("slurm api config: ")
                    .to_string(),
            );
        }
        if bad.is_empty() {
            Ok(())
        } else {
            Err(SlurmApiError::Config(bad.join("; ")))
        }
    }

    /// The running client: validated, connected once to find the version.
    pub fn build(&self) -> Result<ApiClient, SlurmApiError> {
        not_in_a_runtime()?;
        self.validate()?;
        let transport = Transport::parse(&self.endpoint, self.ca_file.as_deref())?;
        let auth = match (&self.token_file, &self.user) {
            (Some(path), Some(user)) => Auth::Jwt {
                user: user.clone(),
                token: TokenFile::new(path.clone()),
            },
            _ => Auth::Local {
                user: self.user.clone(),
            },
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| {
                SlurmApiError::Config(format!("cannot start the client's runtime: {e}"))
            })?;
        let mut client = ApiClient {
            http: Http {
                transport,
                auth,
                timeout: Duration::from_secs_f64(self.timeout_s),
                max_answer_bytes: self.max_answer_bytes,
            },
            rt,
            version: ApiVersion::V0042,
            scontrol: self.scontrol.clone(),
            counters: Counters::default(),
        };
        client.version = client.detect(self.api_version)?;
        tracing::info!(at = %client.at(), version = %client.version, "slurmrestd version chosen");
        Ok(client)
    }
}

/// What went wrong with answers, for `/metrics` (the adapter exports them).
#[derive(Debug, Default)]
pub struct Counters {
    /// Answers that were not the JSON expected.
    pub malformed_total: AtomicU64,
    /// Answers over `max_answer_bytes`.
    pub oversized_total: AtomicU64,
    /// Calls refused for authentication (401, 511, or Slurm error 1007).
    pub unauthorized_total: AtomicU64,
    /// Calls past their deadline.
    pub timeouts_total: AtomicU64,
}

/// The facade blocks: inside an async task it would stall (or panic) that runtime.
fn not_in_a_runtime() -> Result<(), SlurmApiError> {
    match tokio::runtime::Handle::try_current() {
        Ok(_) => Err(SlurmApiError::Config(
            "the slurmrestd client blocks: call it from the scheduler's own thread or spawn_blocking, not from an async task".into(),
        )),
        Err(_) => Ok(()),
    }
}

/// A slurmrestd client speaking one API version. Blocking: call it from a thread of
/// its own (or `spawn_blocking`), and drop it there too (it owns a runtime).
pub struct ApiClient {
    http: Http,
    rt: tokio::runtime::Runtime,
    version: ApiVersion,
    scontrol: Vec<String>,
    pub counters: Counters,
}

impl ApiClient {
    pub fn version(&self) -> ApiVersion {
        self.version
    }

    /// `unix:/path` or `http://host:port`.
    pub fn at(&self) -> String {
        self.http.transport.display()
    }

    /// The versions the server's `/openapi/v3` lists.
    pub fn offered(&self) -> Result<Vec<String>, SlurmApiError> {
        let v = self.call(Method::GET, "/openapi/v3", None)?;
        Ok(version::offered(&v))
    }

    fn detect(&self, pin: ApiPin) -> Result<ApiVersion, SlurmApiError> {
        let offered = match self.offered() {
            Ok(o) => o,
            Err(
                e @ (SlurmApiError::Unauthorized { .. }
                | SlurmApiError::Io { .. }
                | SlurmApiError::Timeout { .. }),
            ) => return Err(e),
            // no OpenAPI document: ping newest first
            Err(_) => ApiVersion::ALL
                .into_iter()
                .filter(|v| {
                    self.call(Method::GET, &format!("{}/ping", v.prefix()), None)
                        .is_ok()
                })
                .map(|v| v.as_str().to_string())
                .collect(),
        };
        version::choose(pin, &offered).map_err(|(offered, ours)| SlurmApiError::Unsupported {
            at: self.at(),
            offered,
            ours,
            pinned: match pin {
                ApiPin::Auto => String::new(),
                ApiPin::Exact(v) => format!(" (api_version is pinned to {v})"),
            },
        })
    }

    /// slurmrestd and slurmctld answer.
    pub fn ping(&self) -> Result<(), SlurmApiError> {
        self.call(
            Method::GET,
            &format!("{}/ping", self.version.prefix()),
            None,
        )
        .map(|_| ())
    }

    /// Every job slurmctld knows.
    pub fn jobs(&self) -> Result<Vec<JobView>, SlurmApiError> {
        let path = format!("{}/jobs", self.version.prefix());
        let v = self.call(Method::GET, &path, None)?;
        self.decode(&path, shapes::parse_jobs(&v))
    }

    /// One job; `None` when slurmctld does not know it.
    pub fn job(&self, job_id: u64) -> Result<Option<JobView>, SlurmApiError> {
        let path = format!("{}/job/{job_id}", self.version.prefix());
        match self.call(Method::GET, &path, None) {
            Ok(v) => Ok(self
                .decode(&path, shapes::parse_jobs(&v))?
                .into_iter()
                .next()),
            Err(SlurmApiError::Api { numbers, .. }) if numbers.contains(&INVALID_JOB_ID) => {
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// Applies an update the way this version can (REST, or `scontrol`).
    pub fn update(&self, job_id: u64, update: Update) -> Result<(), SlurmApiError> {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        match shapes::request(self.version, job_id, update, now) {
            Request::Post { path, body } => self.call(Method::POST, &path, Some(&body)).map(|_| ()),
            Request::Scontrol { args } => self.scontrol(&args),
        }
    }

    fn decode<T>(&self, path: &str, r: Result<T, ShapeError>) -> Result<T, SlurmApiError> {
        r.map_err(|source| {
            self.counters
                .malformed_total
                .fetch_add(1, Ordering::Relaxed);
            SlurmApiError::Decode {
                path: path.into(),
                source,
            }
        })
    }

    /// One call; refusals of auth, non-2xx statuses and `errors` become errors.
    fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Value, SlurmApiError> {
        not_in_a_runtime()?;
        let answer = self.rt.block_on(self.http.call(method.clone(), path, body));
        let answer = answer.inspect_err(|e| match e {
            SlurmApiError::TooLarge { .. } => {
                self.counters
                    .oversized_total
                    .fetch_add(1, Ordering::Relaxed);
            }
            SlurmApiError::Timeout { .. } => {
                self.counters.timeouts_total.fetch_add(1, Ordering::Relaxed);
            }
            _ => {}
        })?;
        let Answer { status, body: text } = answer;
        let v: Option<Value> = serde_json::from_slice(&text).ok();
        let errors = v.as_ref().and_then(shapes::errors);
        let refused = status == 401
            || status == 511
            || errors
                .as_ref()
                .is_some_and(|(_, n)| n.contains(&AUTH_ERROR));
        if refused {
            self.counters
                .unauthorized_total
                .fetch_add(1, Ordering::Relaxed);
            let detail = errors.map(|(t, _)| t).unwrap_or_else(|| {
                String::from_utf8_lossy(&text)
                    .trim()
                    .chars()
                    .take(200)
                    .collect()
            });
            return Err(self.unauthorized(status, detail));
        }
        if let Some((errors, numbers)) = errors {
            return Err(SlurmApiError::Api {
                method: method.to_string(),
                path: path.into(),
                errors,
                numbers,
            });
        }
        if !(200..300).contains(&status) {
            return Err(SlurmApiError::Http {
                method: method.to_string(),
                path: path.into(),
                status,
                body: String::from_utf8_lossy(&text)
                    .trim()
                    .chars()
                    .take(300)
                    .collect(),
            });
        }
        self.decode(path, v.ok_or(ShapeError::NotJson))
    }

    fn unauthorized(&self, status: u16, detail: String) -> SlurmApiError {
        let detail = if detail.is_empty() {
            detail
        } else {
            format!(": {detail}")
        };
        let (who, advice) = match &self.http.auth {
            Auth::Jwt { user, token } => {
                token.forget();
                (
                format!("user {user}'s token from {}", token.path.display()),
                format!(
                    "the token expired or is wrong; write a fresh one with `scontrol token username={user} lifespan=86400` (the part after SLURM_JWT=) into {} — it is re-read on the next call",
                    token.path.display()
                ),
                )
            }
            Auth::Local { user } => (
                match user {
                    Some(u) => format!("this process acting as {u}"),
                    None => "this process's user".to_string(),
                },
                "rest_auth/local accepts only slurmrestd's own uid and root on its socket; run powerplane as one of them, or use JWT (user and token_file)".to_string(),
            ),
        };
        SlurmApiError::Unauthorized {
            at: self.at(),
            who,
            status,
            detail,
            advice,
        }
    }

    /// `scontrol <args>` within the call deadline.
    fn scontrol(&self, args: &[String]) -> Result<(), SlurmApiError> {
        not_in_a_runtime()?;
        let shown = args.join(" ");
        let fail = |message: String| SlurmApiError::Command {
            args: shown.clone(),
            message,
        };
        let (cmd, pre) = self
            .scontrol
            .split_first()
            .ok_or_else(|| fail("no scontrol command".into()))?;
        let mut c = tokio::process::Command::new(cmd);
        c.args(pre).args(args).kill_on_drop(true);
        let out = self
            .rt
            .block_on(async { tokio::time::timeout(self.http.timeout, c.output()).await })
            .map_err(|_| {
                fail(format!(
                    "no answer within {} s",
                    self.http.timeout.as_secs_f64()
                ))
            })?
            .map_err(|e| fail(format!("cannot run {cmd}: {e}")))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(fail(
                String::from_utf8_lossy(&out.stderr).trim().to_string(),
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_config_reads_a_pin_and_scontrol_as_a_word_or_a_list_and_names_every_problem() {
        let c: SlurmApiConfig = serde_json::from_value(serde_json::json!({
            "endpoint": "unix:/run/slurmrestd.sock",
            "api_version": "v0.0.41",
            "scontrol": "scontrol",
        }))
        .expect("config");
        assert_eq!(c.api_version, ApiPin::Exact(ApiVersion::V0041));
        assert_eq!(c.scontrol, ["scontrol"]);
        let c: SlurmApiConfig = serde_json::from_value(serde_json::json!({
            "endpoint": "http://127.0.0.1:6820",
            "scontrol": ["chroot", "/srv", "scontrol"],
        }))
        .expect("config");
        assert_eq!((c.api_version, c.scontrol.len()), (ApiPin::Auto, 3));
        assert!(c.validate().is_ok());

        let mut bad = SlurmApiConfig::new("https://slurm.example");
        bad.timeout_s = 0.0;
        bad.token_file = Some("/etc/powerplane/slurm.jwt".into());
        let e = bad.validate().expect_err("three problems").to_string();
        assert!(
            e.contains("timeout_s") && e.contains("needs user") && e.contains("ca_file"),
            "{e}"
        );
        let e = serde_json::from_value::<SlurmApiConfig>(serde_json::json!({
            "endpoint": "unix:/s", "api_version": "v0.0.37"
        }))
        .expect_err("unknown version")
        .to_string();
        assert!(e.contains("v0.0.37") && e.contains("auto"), "{e}");
    }

    #[tokio::test]
    async fn inside_an_async_task_the_blocking_client_refuses_instead_of_stalling() {
        let e = SlurmApiConfig::new("unix:/nonexistent.sock")
            .build()
            .err()
            .expect("refused");
        assert!(e.to_string().contains("spawn_blocking"), "{e}");
    }
}
