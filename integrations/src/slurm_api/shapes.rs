//! Per-version shapes of slurmrestd's answers and requests, as the real servers send
//! them (golden fixtures in `tests/fixtures/slurm/`): a job list into version-neutral
//! [`JobView`]s, and each [`Update`] into a REST [`Request`] or an `scontrol` call.
//! Pure functions; the IO is in [`super::http`] and [`super::client`].

use serde_json::{json, Value};
use telemetry::Timestamp;

use super::ApiVersion;
use crate::slurm::SlurmJob;

/// A number as slurmrestd sends it: plain in v0.0.38, `{set, infinite, number}` from
/// v0.0.40.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Number {
    /// Absent, `null`, or `{"set": false}`.
    Unset,
    /// `{"infinite": true}`.
    Infinite,
    Set(i64),
}

impl Number {
    pub fn from_json(v: Option<&Value>) -> Number {
        match v {
            Some(Value::Number(n)) => n.as_i64().map_or(Number::Unset, Number::Set),
            Some(Value::Object(o)) => {
                let flag = |k: &str| o.get(k).and_then(Value::as_bool).unwrap_or(false);
                if flag("infinite") {
                    Number::Infinite
                } else if flag("set") {
                    o.get("number")
                        .and_then(Value::as_i64)
                        .map_or(Number::Unset, Number::Set)
                } else {
                    Number::Unset
                }
            }
            _ => Number::Unset,
        }
    }

    pub fn value(self) -> Option<i64> {
        match self {
            Number::Set(n) => Some(n),
            _ => None,
        }
    }

    /// A time: seconds since the epoch, 0 meaning none.
    pub fn time(self) -> Option<Timestamp> {
        self.value().filter(|t| *t > 0).map(Timestamp::from_secs)
    }
}

/// One Slurm job, the same whatever version told of it.
#[derive(Debug, Clone, PartialEq)]
pub struct JobView {
    pub job_id: u64,
    pub name: String,
    pub user: String,
    pub account: String,
    pub partition: String,
    pub qos: String,
    pub comment: String,
    /// The base state first (`PENDING`, `RUNNING`, ...), then flags (`REQUEUED`, ...)
    /// where the version lists them.
    pub state: Vec<String>,
    /// Why a pending job waits: `JobHeldUser`, `JobHeldAdmin`, `BeginTime`, ...
    pub reason: String,
    pub priority: Number,
    pub gpus: u32,
    pub submit: Option<Timestamp>,
    /// The expected (pending) or actual (running) start.
    pub start: Option<Timestamp>,
    pub end: Option<Timestamp>,
    /// When it may start at the earliest (its begin time, once known to slurmctld).
    pub eligible: Option<Timestamp>,
    pub deadline: Option<Timestamp>,
    /// `--time`, minutes.
    pub time_limit_min: Number,
    /// Held: priority 0 or a held reason (and `hold: true` where the version says).
    pub held: bool,
    pub requeue: bool,
    pub restarts: u64,
}

impl JobView {
    /// The base state (`PENDING`, `RUNNING`, ...).
    pub fn base_state(&self) -> &str {
        self.state.first().map_or("", String::as_str)
    }

    /// The adapter's job record, so [`crate::slurm::JobMapping`] maps it as before.
    pub fn to_slurm_job(&self) -> SlurmJob {
        SlurmJob {
            job_id: self.job_id,
            name: self.name.clone(),
            user: self.user.clone(),
            account: self.account.clone(),
            partition: self.partition.clone(),
            qos: self.qos.clone(),
            comment: self.comment.clone(),
            state: self.base_state().to_string(),
            reason: self.reason.clone(),
            priority: self.priority.value().unwrap_or(0),
            gpus: self.gpus,
            submit: self.submit,
            start: self.start,
            end: self.end,
            deadline: self.deadline,
            time_limit_s: self
                .time_limit_min
                .value()
                .filter(|m| *m > 0 && *m < 0xFFFF_FFFF)
                .map(|m| m as f64 * 60.0),
            requeue: self.requeue,
            restarts: self.restarts,
        }
    }

    /// One entry of `jobs` in any version's answer.
    pub fn from_json(v: &Value) -> Result<JobView, ShapeError> {
        let s = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or("").to_string();
        let n = |k: &str| Number::from_json(v.get(k));
        let job_id = v
            .get("job_id")
            .and_then(Value::as_u64)
            .ok_or(ShapeError::NoJobId)?;
        let state: Vec<String> = match v.get("job_state") {
            Some(Value::String(s)) => vec![s.clone()],
            Some(Value::Array(a)) => a
                .iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect(),
            _ => return Err(ShapeError::NoJobState(job_id)),
        };
        let nodes = n("node_count").value().unwrap_or(1).max(1) as u32;
        let gpus = gres_gpus(&s("tres_per_job"))
            .or_else(|| gres_gpus(&s("tres_per_node")).map(|g| g * nodes))
            .unwrap_or(0);
        let reason = s("state_reason");
        let priority = n("priority");
        let pending = state.first().is_some_and(|s| s == "PENDING");
        let held = pending
            && (reason == "JobHeldUser"
                || reason == "JobHeldAdmin"
                || priority == Number::Set(0)
                || v.get("hold").and_then(Value::as_bool).unwrap_or(false));
        Ok(JobView {
            job_id,
            name: s("name"),
            user: s("user_name"),
            account: s("account"),
            partition: s("partition"),
            qos: s("qos"),
            comment: s("comment"),
            state,
            reason,
            priority,
            gpus,
            submit: n("submit_time").time(),
            start: n("start_time").time(),
            end: n("end_time").time(),
            eligible: n("eligible_time").time(),
            deadline: n("deadline").time(),
            time_limit_min: n("time_limit"),
            held,
            requeue: v.get("requeue").and_then(Value::as_bool).unwrap_or(false),
            restarts: n("restart_cnt").value().unwrap_or(0).max(0) as u64,
        })
    }
}

/// An answer that is not the shape of any version's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShapeError {
    #[error("not JSON")]
    NotJson,
    #[error("no jobs array")]
    NoJobs,
    #[error("a job without a numeric job_id")]
    NoJobId,
    #[error("job {0}: no job_state")]
    NoJobState(u64),
}

/// The jobs of a `GET .../jobs` or `.../job/{id}` answer (the same `jobs` array in
/// every version).
pub fn parse_jobs(answer: &Value) -> Result<Vec<JobView>, ShapeError> {
    answer
        .get("jobs")
        .and_then(Value::as_array)
        .ok_or(ShapeError::NoJobs)?
        .iter()
        .map(JobView::from_json)
        .collect()
}

/// GPUs in a TRES string: `gres/gpu:2` and `gres/gpu:a100:2` (v0.0.40+),
/// `gres:gpu:2` (v0.0.38), `gres/gpu=2`; several entries add up.
pub fn gres_gpus(tres: &str) -> Option<u32> {
    let mut total = None;
    for part in tres.split(',').map(str::trim) {
        let rest = part
            .strip_prefix("gres/gpu")
            .or_else(|| part.strip_prefix("gres:gpu"));
        let Some(rest) = rest else { continue };
        let count = match rest {
            "" => Some(1),
            r if r.starts_with('=') => r[1..].parse::<u32>().ok(),
            r if r.starts_with(':') => {
                // `:2`, `:type:2`, or `:type` (one)
                let last = r.rsplit(':').next().unwrap_or("");
                Some(last.parse::<u32>().unwrap_or(1))
            }
            _ => None, // `gres/gpumem...`: not a GPU count
        };
        if let Some(c) = count {
            total = Some(total.unwrap_or(0) + c);
        }
    }
    total
}

/// A change powerplane makes to a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Update {
    Hold,
    Release,
    /// Not before this time (the lease's end); 0: now.
    BeginAt {
        unix_s: i64,
    },
    Requeue,
    Suspend,
    Resume,
}

/// How an [`Update`] reaches Slurm.
#[derive(Debug, Clone, PartialEq)]
pub enum Request {
    /// `POST {path}` with this JSON body.
    Post { path: String, body: Value },
    /// `scontrol {args}`: no version of the REST API has the call.
    Scontrol { args: Vec<String> },
}

/// The request for an update in a version, `now_unix_s` being the time now. Hold,
/// release and the begin time are `POST /slurm/vX/job/{id}` in every version (v0.0.38
/// and v0.0.40+ take the job description itself, not wrapped); only the begin time's
/// shape differs: `{set, number}` from v0.0.40; in v0.0.38 a time string that
/// slurmctld parses (`now+N`; its OpenAPI document says integer, but 22.05 answers
/// "Unable to parse time" to a number). Requeue, suspend and resume have no REST call
/// in v0.0.38 to v0.0.42: `scontrol`.
pub fn request(version: ApiVersion, job_id: u64, update: Update, now_unix_s: i64) -> Request {
    let post = |body: Value| Request::Post {
        path: format!("{}/job/{job_id}", version.prefix()),
        body,
    };
    let scontrol = |verb: &str| Request::Scontrol {
        args: vec![verb.to_string(), job_id.to_string()],
    };
    match update {
        Update::Hold => post(json!({ "hold": true })),
        Update::Release => post(json!({ "hold": false })),
        Update::BeginAt { unix_s } if version.is_data_parser() => post(
            json!({ "begin_time": { "set": true, "infinite": false, "number": unix_s.max(0) } }),
        ),
        Update::BeginAt { unix_s } if unix_s <= now_unix_s => post(json!({ "begin_time": "now" })),
        Update::BeginAt { unix_s } => {
            post(json!({ "begin_time": format!("now+{}", unix_s - now_unix_s) }))
        }
        Update::Requeue => scontrol("requeue"),
        Update::Suspend => scontrol("suspend"),
        Update::Resume => scontrol("resume"),
    }
}

/// The `errors` of an answer: one line each (`description: error (number)`), and
/// Slurm's error numbers.
pub fn errors(answer: &Value) -> Option<(String, Vec<i64>)> {
    let list = answer.get("errors").and_then(Value::as_array)?;
    if list.is_empty() {
        return None;
    }
    let mut numbers = Vec::new();
    let text = list
        .iter()
        .map(|e| {
            let d = e.get("description").and_then(Value::as_str).unwrap_or("");
            let x = e.get("error").and_then(Value::as_str).unwrap_or("");
            let n = e
                .get("error_number")
                .or_else(|| e.get("errno"))
                .and_then(Value::as_i64);
            numbers.extend(n);
            let mut line = [d, x]
                .into_iter()
                .filter(|s| !s.is_empty())
                .collect::<Vec<_>>()
                .join(": ");
            if let Some(n) = n {
                line.push_str(&format!(" ({n})"));
            }
            line
        })
        .collect::<Vec<_>>()
        .join("; ");
    Some((text, numbers))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_come_plain_or_as_a_struct() {
        let n = |v: Value| Number::from_json(Some(&v));
        assert_eq!(n(json!(5)), Number::Set(5));
        assert_eq!(
            n(json!({"set": true, "infinite": false, "number": 7})),
            Number::Set(7)
        );
        assert_eq!(
            n(json!({"set": false, "infinite": false, "number": 7})),
            Number::Unset
        );
        assert_eq!(
            n(json!({"set": true, "infinite": true, "number": 0})),
            Number::Infinite
        );
        assert_eq!(Number::from_json(None), Number::Unset);
        assert_eq!(n(json!({"set": true, "number": 0})).time(), None);
    }

    #[test]
    fn gpus_are_read_from_every_tres_spelling() {
        assert_eq!(gres_gpus("gres/gpu:1"), Some(1));
        assert_eq!(gres_gpus("gres/gpu:a100:2"), Some(2));
        assert_eq!(gres_gpus("gres:gpu:3"), Some(3));
        assert_eq!(gres_gpus("gres/gpu=4,cpu=2"), Some(4));
        assert_eq!(gres_gpus("gres/gpu"), Some(1));
        assert_eq!(gres_gpus("gres/gpu:1,gres/gpu:a100:2"), Some(3));
        assert_eq!(gres_gpus("cpu=4"), None);
        assert_eq!(gres_gpus(""), None);
    }

    #[test]
    fn the_begin_time_is_a_number_in_v0038_and_a_struct_from_v0040() {
        let at = Update::BeginAt {
            unix_s: 1_800_000_000,
        };
        assert_eq!(
            request(ApiVersion::V0038, 7, at, 1_799_996_400),
            Request::Post {
                path: "/slurm/v0.0.38/job/7".into(),
                body: json!({ "begin_time": "now+3600" })
            }
        );
        for v in [ApiVersion::V0040, ApiVersion::V0041, ApiVersion::V0042] {
            assert_eq!(
                request(v, 7, at, 1_799_996_400),
                Request::Post {
                    path: format!("/slurm/{v}/job/7"),
                    body: json!({ "begin_time": { "set": true, "infinite": false, "number": 1_800_000_000 } })
                }
            );
        }
    }

    #[test]
    fn requeue_suspend_and_resume_go_through_scontrol_in_every_version() {
        for v in ApiVersion::ALL {
            for (u, verb) in [
                (Update::Requeue, "requeue"),
                (Update::Suspend, "suspend"),
                (Update::Resume, "resume"),
            ] {
                assert_eq!(
                    request(v, 9, u, 0),
                    Request::Scontrol {
                        args: vec![verb.into(), "9".into()]
                    }
                );
            }
        }
    }
}
