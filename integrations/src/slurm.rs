//! Slurm through slurmrestd (OpenAPI v0.0.38, Slurm 22.05): list jobs, map them to
//! powerplane's [`Job`], hold and release them; requeue through `scontrol` (v0.0.38 has
//! no requeue call).
//!
//! slurmrestd is spoken to in plain HTTP/1.1 over its unix socket (`rest_auth/local`:
//! the socket's peer uid authenticates; root may name a user with
//! `X-SLURM-USER-NAME`), or over TCP to `http://host:port` for a slurmrestd behind an
//! authenticating proxy. One request per connection.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;
use telemetry::{Job, JobState, Timestamp};
use thiserror::Error;

use crate::scheduler::deadline::{exchange, to_end};

/// The OpenAPI plugin this client speaks.
pub const API: &str = "/slurm/v0.0.38";

#[derive(Debug, Error)]
pub enum SlurmError {
    #[error("slurmrestd at {at}: {message}")]
    Io { at: String, message: String },
    #[error("slurmrestd {method} {path}: HTTP {status}: {body}")]
    Http {
        method: String,
        path: String,
        status: u16,
        body: String,
    },
    #[error("slurmrestd {method} {path}: {errors}")]
    Api {
        method: String,
        path: String,
        errors: String,
    },
    #[error("slurmrestd {path}: cannot decode the answer: {message}")]
    Decode { path: String, message: String },
    #[error("scontrol {args}: {message}")]
    Command { args: String, message: String },
}

/// How Slurm jobs become powerplane jobs.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct JobMapping {
    /// A job's class by its partition (checked after `class=` in the comment).
    #[serde(default)]
    pub class_by_partition: BTreeMap<String, String>,
    /// A job's class by its QOS (checked after the partition).
    #[serde(default)]
    pub class_by_qos: BTreeMap<String, String>,
    /// The class of a job nothing else names.
    #[serde(default = "default_class")]
    pub default_class: String,
    /// Classes whose jobs may be deferred (a comment `deferrable=no|yes` overrides).
    #[serde(default = "default_deferrable")]
    pub deferrable_classes: Vec<String>,
    /// Classes whose jobs may be requeued (a comment `preemptible=no|yes` overrides);
    /// Slurm must also allow the job to requeue.
    #[serde(default)]
    pub preemptible_classes: Vec<String>,
    /// The run time of a job with neither `est=` in its comment nor a time limit.
    #[serde(default = "default_duration")]
    pub default_duration_s: f64,
}

fn default_class() -> String {
    "batch".into()
}
fn default_deferrable() -> Vec<String> {
    vec!["batch".into(), "training".into()]
}
fn default_duration() -> f64 {
    3600.0
}

impl Default for JobMapping {
    fn default() -> Self {
        JobMapping {
            class_by_partition: BTreeMap::new(),
            class_by_qos: BTreeMap::new(),
            default_class: default_class(),
            deferrable_classes: default_deferrable(),
            preemptible_classes: Vec::new(),
            default_duration_s: default_duration(),
        }
    }
}

/// A Slurm job as slurmrestd reports it: the fields powerplane reads.
#[derive(Debug, Clone, PartialEq)]
pub struct SlurmJob {
    pub job_id: u64,
    pub name: String,
    pub user: String,
    pub account: String,
    pub partition: String,
    pub qos: String,
    pub comment: String,
    /// `PENDING`, `RUNNING`, `SUSPENDED`, `COMPLETED`, `CANCELLED`, ...
    pub state: String,
    /// Why a pending job waits: `JobHeldAdmin`, `JobHeldUser`, `Resources`, ...
    pub reason: String,
    pub priority: i64,
    pub gpus: u32,
    pub submit: Option<Timestamp>,
    pub start: Option<Timestamp>,
    pub end: Option<Timestamp>,
    /// `--deadline`.
    pub deadline: Option<Timestamp>,
    /// `--time`, in seconds.
    pub time_limit_s: Option<f64>,
    /// Slurm may requeue it (`--requeue`, `JobRequeue`).
    pub requeue: bool,
    /// Times Slurm restarted (requeued) it.
    pub restarts: u64,
}

impl SlurmJob {
    /// powerplane's id for it.
    pub fn id(&self) -> String {
        crate::scheduler::JobId::slurm(self.job_id).to_string()
    }

    /// Pending with a hold (user's or admin's: priority 0).
    pub fn is_held(&self) -> bool {
        self.state == "PENDING"
            && (self.reason == "JobHeldAdmin" || self.reason == "JobHeldUser" || self.priority == 0)
    }

    pub fn is_pending(&self) -> bool {
        self.state == "PENDING"
    }

    /// Parses one entry of `jobs` in a v0.0.38 answer.
    pub fn from_json(v: &Value) -> Result<SlurmJob, String> {
        let s = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or("").to_string();
        let n = |k: &str| v.get(k).and_then(Value::as_i64);
        let time = |k: &str| n(k).filter(|t| *t > 0).map(Timestamp::from_secs);
        let job_id = v
            .get("job_id")
            .and_then(Value::as_u64)
            .ok_or("a job without a numeric job_id")?;
        let node_count = n("node_count").unwrap_or(1).max(1) as u32;
        let gpus = gres_gpus(&s("tres_per_job"))
            .or_else(|| gres_gpus(&s("tres_per_node")).map(|g| g * node_count))
            .unwrap_or(0);
        Ok(SlurmJob {
            job_id,
            name: s("name"),
            user: s("user_name"),
            account: s("account"),
            partition: s("partition"),
            qos: s("qos"),
            comment: s("comment"),
            state: s("job_state"),
            reason: s("state_reason"),
            priority: n("priority").unwrap_or(0),
            gpus,
            submit: time("submit_time"),
            start: time("start_time"),
            end: time("end_time"),
            deadline: time("deadline"),
            // minutes; null or absent: no limit
            time_limit_s: n("time_limit")
                .filter(|m| *m > 0 && *m < 0xFFFF_FFFF)
                .map(|m| m as f64 * 60.0),
            requeue: v.get("requeue").and_then(Value::as_bool).unwrap_or(false),
            restarts: n("restart_cnt").unwrap_or(0).max(0) as u64,
        })
    }
}

/// GPUs in a TRES string such as `gres:gpu:2`, `gres:gpu:a100:2` or
/// `gres/gpu=2,cpu=4` (several entries add up).
pub fn gres_gpus(tres: &str) -> Option<u32> {
    let mut total = None;
    for part in tres.split(',') {
        let part = part.trim();
        let count = if let Some(rest) = part.strip_prefix("gres:gpu") {
            // `gres:gpu` (1), `gres:gpu:2`, `gres:gpu:type:2`
            match rest.rsplit(':').next() {
                Some(c) if !rest.is_empty() => c.parse::<u32>().ok().or(Some(1)),
                _ => Some(1),
            }
        } else if let Some(rest) = part.strip_prefix("gres/gpu") {
            rest.rsplit('=').next().and_then(|c| c.parse::<u32>().ok())
        } else {
            None
        };
        if let Some(c) = count {
            total = Some(total.unwrap_or(0) + c);
        }
    }
    total
}

/// `key=value` tokens of a job comment, e.g. `class=batch deadline=2026-01-01T10:00:00Z est=3600`.
pub fn comment_tags(comment: &str) -> BTreeMap<String, String> {
    comment
        .split(|c: char| c.is_whitespace() || c == ',' || c == ';')
        .filter_map(|t| t.split_once('='))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect()
}

fn yes_no(v: Option<&String>) -> Option<bool> {
    match v.map(|s| s.to_ascii_lowercase()) {
        Some(s) if matches!(s.as_str(), "yes" | "true" | "1") => Some(true),
        Some(s) if matches!(s.as_str(), "no" | "false" | "0") => Some(false),
        _ => None,
    }
}

impl JobMapping {
    /// The powerplane job for a Slurm job. `ours`: powerplane holds it (a held job
    /// that is not ours is held by someone else, and is never deferrable: powerplane
    /// must not release it).
    pub fn map(&self, j: &SlurmJob, ours: bool, now: Timestamp) -> Job {
        let tags = comment_tags(&j.comment);
        let class = tags
            .get("class")
            .cloned()
            .or_else(|| self.class_by_partition.get(&j.partition).cloned())
            .or_else(|| self.class_by_qos.get(&j.qos).cloned())
            .unwrap_or_else(|| self.default_class.clone());
        let deadline = tags
            .get("deadline")
            .and_then(|d| Timestamp::parse_rfc3339(d).ok())
            .or(j.deadline);
        let est_duration_s = tags
            .get("est")
            .and_then(|e| e.parse::<f64>().ok())
            .filter(|e| e.is_finite() && *e > 0.0)
            .or(j.time_limit_s)
            .unwrap_or(self.default_duration_s);
        let held_by_others = j.is_held() && !ours;
        let deferrable = !held_by_others
            && yes_no(tags.get("deferrable"))
                .unwrap_or_else(|| self.deferrable_classes.contains(&class));
        let preemptible = j.requeue
            && yes_no(tags.get("preemptible"))
                .unwrap_or_else(|| self.preemptible_classes.contains(&class));
        let state = match j.state.as_str() {
            "PENDING" if ours => JobState::Held,
            "PENDING" | "REQUEUED" | "REQUEUE_FED" | "REQUEUE_HOLD" => JobState::Pending,
            "SUSPENDED" => JobState::Suspended,
            "RUNNING" | "COMPLETING" | "CONFIGURING" | "STAGE_OUT" | "RESIZING" | "SIGNALING"
            | "STOPPED" => JobState::Running,
            "COMPLETED" => JobState::Finished,
            _ => JobState::Cancelled,
        };
        Job {
            id: j.id(),
            scheduler: "slurm".into(),
            name: j.name.clone(),
            user: j.user.clone(),
            project: if j.account.is_empty() {
                j.user.clone()
            } else {
                j.account.clone()
            },
            class,
            priority: j.priority.clamp(i64::from(i32::MIN), i64::from(i32::MAX)) as i32,
            gpus: j.gpus,
            allocated: Vec::new(),
            state,
            submit_time: j.submit.unwrap_or(now),
            start_time: j.start.filter(|_| state != JobState::Pending),
            end_time: j.end.filter(|_| state.is_done()),
            deadline,
            est_duration_s,
            deferrable,
            preemptible,
        }
    }
}

/// Where slurmrestd listens.
#[derive(Debug, Clone, PartialEq)]
pub enum Endpoint {
    Unix(PathBuf),
    Tcp(String),
}

impl Endpoint {
    /// `unix:/path`, a path, or `http://host:port`.
    pub fn parse(s: &str) -> Result<Endpoint, String> {
        if let Some(rest) = s.strip_prefix("http://") {
            let host = rest.trim_end_matches('/');
            if host.is_empty() || host.contains('/') {
                return Err(format!("{s:?}: use http://host:port"));
            }
            Ok(Endpoint::Tcp(host.to_string()))
        } else if s.starts_with("https://") {
            Err(format!(
                "{s:?}: https is not supported; use the unix socket or a local http port"
            ))
        } else {
            Ok(Endpoint::Unix(PathBuf::from(
                s.strip_prefix("unix:").unwrap_or(s),
            )))
        }
    }
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Endpoint::Unix(p) => write!(f, "unix:{}", p.display()),
            Endpoint::Tcp(h) => write!(f, "http://{h}"),
        }
    }
}

/// A slurmrestd client.
#[derive(Debug, Clone)]
pub struct Client {
    pub endpoint: Endpoint,
    /// Sent as `X-SLURM-USER-NAME` (root on the unix socket may act as this user).
    pub user: Option<String>,
    pub timeout: Duration,
    /// The `scontrol` to requeue with.
    pub scontrol: PathBuf,
}

impl Client {
    pub fn new(endpoint: Endpoint) -> Self {
        Client {
            endpoint,
            user: None,
            timeout: Duration::from_secs(10),
            scontrol: PathBuf::from("scontrol"),
        }
    }

    /// Every job slurmctld knows (pending, running, and recently ended).
    pub fn jobs(&self) -> Result<Vec<SlurmJob>, SlurmError> {
        let path = format!("{API}/jobs");
        let v = self.call("GET", &path, None)?;
        let jobs = v
            .get("jobs")
            .and_then(Value::as_array)
            .ok_or_else(|| SlurmError::Decode {
                path: path.clone(),
                message: "no jobs array".into(),
            })?;
        jobs.iter()
            .map(|j| {
                SlurmJob::from_json(j).map_err(|message| SlurmError::Decode {
                    path: path.clone(),
                    message,
                })
            })
            .collect()
    }

    /// One job (`None`: slurmctld does not know it).
    pub fn job(&self, job_id: u64) -> Result<Option<SlurmJob>, SlurmError> {
        let path = format!("{API}/job/{job_id}");
        match self.call("GET", &path, None) {
            Ok(v) => match v
                .get("jobs")
                .and_then(Value::as_array)
                .and_then(|a| a.first())
            {
                Some(j) => SlurmJob::from_json(j)
                    .map(Some)
                    .map_err(|message| SlurmError::Decode { path, message }),
                None => Ok(None),
            },
            Err(SlurmError::Api { errors, .. } | SlurmError::Http { body: errors, .. })
                if errors.contains("Invalid job id") =>
            {
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// Holds a pending job (priority 0: `JobHeldAdmin` when slurmrestd's user is an
    /// operator, else `JobHeldUser`).
    pub fn hold(&self, job_id: u64) -> Result<(), SlurmError> {
        self.update(job_id, serde_json::json!({ "hold": true }))
    }

    /// Releases a held job.
    pub fn release(&self, job_id: u64) -> Result<(), SlurmError> {
        self.update(job_id, serde_json::json!({ "hold": false }))
    }

    /// Sets a pending job's begin time `secs` from now (0: now): Slurm will not
    /// start it before.
    pub fn set_begin(&self, job_id: u64, secs: u64) -> Result<(), SlurmError> {
        let when = if secs == 0 {
            "now".to_string()
        } else {
            format!("now+{secs}")
        };
        self.update(job_id, serde_json::json!({ "begin_time": when }))
    }

    fn update(&self, job_id: u64, body: Value) -> Result<(), SlurmError> {
        self.call("POST", &format!("{API}/job/{job_id}"), Some(&body))
            .map(|_| ())
    }

    /// Requeues a job (`scontrol requeue`; OpenAPI v0.0.38 has no requeue call).
    pub fn requeue(&self, job_id: u64) -> Result<(), SlurmError> {
        self.scontrol("requeue", job_id)
    }

    /// Suspends a running job (`scontrol suspend`; not in OpenAPI v0.0.38).
    pub fn suspend(&self, job_id: u64) -> Result<(), SlurmError> {
        self.scontrol("suspend", job_id)
    }

    /// Resumes a suspended job (`scontrol resume`).
    pub fn resume(&self, job_id: u64) -> Result<(), SlurmError> {
        self.scontrol("resume", job_id)
    }

    fn scontrol(&self, verb: &str, job_id: u64) -> Result<(), SlurmError> {
        let args = format!("{verb} {job_id}");
        let out = std::process::Command::new(&self.scontrol)
            .args([verb, &job_id.to_string()])
            .output()
            .map_err(|e| SlurmError::Command {
                args: args.clone(),
                message: format!("cannot run {}: {e}", self.scontrol.display()),
            })?;
        if out.status.success() {
            Ok(())
        } else {
            Err(SlurmError::Command {
                args,
                message: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            })
        }
    }

    /// slurmrestd answers (and slurmctld with it).
    pub fn ping(&self) -> Result<(), SlurmError> {
        self.call("GET", &format!("{API}/ping"), None).map(|_| ())
    }

    /// One request; an answer with a non-empty `errors` array is an error.
    fn call(&self, method: &str, path: &str, body: Option<&Value>) -> Result<Value, SlurmError> {
        let body = body.map(Value::to_string).unwrap_or_default();
        let (status, text) = self.exchange(method, path, &body)?;
        let v: Option<Value> = serde_json::from_slice(&text).ok();
        let errors = v
            .as_ref()
            .and_then(|v| v.get("errors"))
            .and_then(Value::as_array)
            .filter(|e| !e.is_empty())
            .map(|e| {
                e.iter()
                    .map(|x| {
                        let d = x.get("description").and_then(Value::as_str).unwrap_or("");
                        let e = x.get("error").and_then(Value::as_str).unwrap_or("");
                        [d, e]
                            .into_iter()
                            .filter(|s| !s.is_empty())
                            .collect::<Vec<_>>()
                            .join(": ")
                    })
                    .collect::<Vec<_>>()
                    .join("; ")
            });
        if !(200..300).contains(&status) {
            return Err(SlurmError::Http {
                method: method.into(),
                path: path.into(),
                status,
                body: errors
                    .unwrap_or_else(|| String::from_utf8_lossy(&text).chars().take(300).collect()),
            });
        }
        if let Some(errors) = errors {
            return Err(SlurmError::Api {
                method: method.into(),
                path: path.into(),
                errors,
            });
        }
        v.ok_or_else(|| SlurmError::Decode {
            path: path.into(),
            message: "not JSON".into(),
        })
    }

    fn exchange(&self, method: &str, path: &str, body: &str) -> Result<(u16, Vec<u8>), SlurmError> {
        let io = |e: std::io::Error| SlurmError::Io {
            at: self.endpoint.to_string(),
            message: e.to_string(),
        };
        let mut req = format!(
            "{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nAccept: application/json\r\n"
        );
        if let Some(u) = &self.user {
            req.push_str(&format!("X-SLURM-USER-NAME: {u}\r\n"));
        }
        if !body.is_empty() || method == "POST" {
            req.push_str(&format!(
                "Content-Type: application/json\r\nContent-Length: {}\r\n",
                body.len()
            ));
        }
        req.push_str("\r\n");
        req.push_str(body);
        // the whole call, connect included, ends by `timeout`
        let deadline = std::time::Instant::now() + self.timeout;
        let raw = match &self.endpoint {
            Endpoint::Unix(p) => {
                let mut s = std::os::unix::net::UnixStream::connect(p).map_err(io)?;
                exchange(&mut s, req.as_bytes(), deadline, to_end).map_err(io)?
            }
            Endpoint::Tcp(h) => {
                use std::net::ToSocketAddrs;
                let addr = h
                    .to_socket_addrs()
                    .map_err(io)?
                    .next()
                    .ok_or_else(|| io(std::io::Error::other("no address")))?;
                let mut s =
                    std::net::TcpStream::connect_timeout(&addr, self.timeout).map_err(io)?;
                exchange(&mut s, req.as_bytes(), deadline, to_end).map_err(io)?
            }
        };
        parse_response(&raw).map_err(|message| SlurmError::Io {
            at: self.endpoint.to_string(),
            message,
        })
    }
}

/// Status and body of an HTTP/1.1 response (Content-Length, chunked, or to the end).
pub fn parse_response(raw: &[u8]) -> Result<(u16, Vec<u8>), String> {
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or("the answer has no header end")?;
    let head = String::from_utf8_lossy(&raw[..split]);
    let body = &raw[split + 4..];
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse::<u16>().ok())
        .ok_or_else(|| format!("bad status line in {:?}", head.lines().next()))?;
    let mut length = None;
    let mut chunked = false;
    for l in lines {
        if let Some((k, v)) = l.split_once(':') {
            let (k, v) = (k.trim().to_ascii_lowercase(), v.trim());
            if k == "content-length" {
                length = v.parse::<usize>().ok();
            } else if k == "transfer-encoding" && v.eq_ignore_ascii_case("chunked") {
                chunked = true;
            }
        }
    }
    if chunked {
        let mut out = Vec::new();
        let mut rest = body;
        loop {
            let eol = rest
                .windows(2)
                .position(|w| w == b"\r\n")
                .ok_or("truncated chunk")?;
            let size = usize::from_str_radix(
                String::from_utf8_lossy(&rest[..eol])
                    .split(';')
                    .next()
                    .unwrap_or("")
                    .trim(),
                16,
            )
            .map_err(|e| format!("bad chunk size: {e}"))?;
            rest = &rest[eol + 2..];
            if size == 0 {
                break;
            }
            if rest.len() < size {
                return Err("truncated chunk".into());
            }
            out.extend_from_slice(&rest[..size]);
            rest = rest.get(size + 2..).unwrap_or(&[]);
        }
        return Ok((status, out));
    }
    match length {
        Some(n) if body.len() >= n => Ok((status, body[..n].to_vec())),
        Some(n) => Err(format!("answer cut short: {} of {n} bytes", body.len())),
        None => Ok((status, body.to_vec())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpus_are_read_from_every_tres_form() {
        assert_eq!(gres_gpus("gres:gpu:2"), Some(2));
        assert_eq!(gres_gpus("gres:gpu:a100:3"), Some(3));
        assert_eq!(gres_gpus("gres:gpu"), Some(1));
        assert_eq!(gres_gpus("gres/gpu=4,cpu=2"), Some(4));
        assert_eq!(gres_gpus("cpu=2"), None);
        assert_eq!(gres_gpus(""), None);
    }

    #[test]
    fn chunked_and_sized_answers_are_read() {
        let raw = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\n{\"a\r\n4\r\n\":1}\r\n0\r\n\r\n";
        assert_eq!(parse_response(raw), Ok((200, b"{\"a\":1}".to_vec())));
        let raw = b"HTTP/1.1 400 BAD REQUEST\r\nContent-Length: 2\r\n\r\nnoEXTRA";
        assert_eq!(parse_response(raw), Ok((400, b"no".to_vec())));
        assert!(parse_response(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nab").is_err());
    }

    #[test]
    fn the_comment_the_partition_and_the_time_limit_map_a_job() {
        let v = serde_json::json!({
            "job_id": 7, "name": "train", "user_name": "ana", "account": "physics",
            "partition": "long", "qos": "normal", "job_state": "PENDING",
            "state_reason": "Resources", "priority": 4000, "tres_per_node": "gres:gpu:2",
            "node_count": 2, "submit_time": 1_700_000_000, "start_time": 0, "deadline": 0,
            "time_limit": 90, "requeue": true, "restart_cnt": 0,
            "comment": "deadline=2023-11-15T00:00:00Z est=1800"
        });
        let j = SlurmJob::from_json(&v).expect("job");
        let mut m = JobMapping::default();
        m.class_by_partition
            .insert("long".into(), "training".into());
        m.preemptible_classes.push("training".into());
        let job = m.map(&j, false, Timestamp::from_secs(1_700_000_100));
        assert_eq!(job.id, "slurm:7");
        assert_eq!(job.class, "training");
        assert_eq!(job.project, "physics");
        assert_eq!(job.gpus, 4);
        assert_eq!(job.est_duration_s, 1800.0);
        assert_eq!(
            job.deadline,
            Some(Timestamp::parse_rfc3339("2023-11-15T00:00:00Z").expect("t"))
        );
        assert!(job.deferrable && job.preemptible);
        assert_eq!(job.state, JobState::Pending);
        // without est=, the time limit (minutes) is the estimate
        let mut v2 = v.clone();
        v2["comment"] = "class=inference".into();
        let job = m.map(
            &SlurmJob::from_json(&v2).expect("job"),
            false,
            Timestamp::from_secs(0),
        );
        assert_eq!(
            (job.class.as_str(), job.est_duration_s),
            ("inference", 5400.0)
        );
        assert!(!job.deferrable);
        // held by an admin: never deferrable; held by powerplane: Held
        let mut v3 = v.clone();
        v3["state_reason"] = "JobHeldAdmin".into();
        v3["priority"] = 0.into();
        let held = SlurmJob::from_json(&v3).expect("job");
        assert!(!m.map(&held, false, Timestamp::from_secs(0)).deferrable);
        let ours = m.map(&held, true, Timestamp::from_secs(0));
        assert!(ours.deferrable);
        assert_eq!(ours.state, JobState::Held);
    }

    #[test]
    fn endpoints_parse() {
        assert_eq!(
            Endpoint::parse("unix:/run/s.sock"),
            Ok(Endpoint::Unix("/run/s.sock".into()))
        );
        assert_eq!(
            Endpoint::parse("http://127.0.0.1:6820"),
            Ok(Endpoint::Tcp("127.0.0.1:6820".into()))
        );
        assert!(Endpoint::parse("https://x").is_err());
    }
}
