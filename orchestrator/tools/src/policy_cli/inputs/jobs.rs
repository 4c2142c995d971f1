//! Jobs as the inputs give them: a jobs file (TOML `[[jobs]]` or JSON) or a test
//! tick's `jobs`, with defaults for what they leave out.

use serde::Deserialize;
use telemetry::{Job, JobState, Site, Timestamp};

use super::{at, is_json, json_error, parse_time, toml_error, InputError, Names, Pos, Problems};

/// One job as written in a jobs file or a test tick: only `id` is required.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawJob {
    pub id: String,
    #[serde(default)]
    pub scheduler: Option<String>,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub user: Option<String>,
    #[serde(default)]
    pub project: Option<String>,
    #[serde(default)]
    pub class: Option<String>,
    #[serde(default)]
    pub priority: Option<i32>,
    #[serde(default)]
    pub gpus: Option<u32>,
    /// GPU ids or patterns (`gpu/a01-n01:*`).
    #[serde(default)]
    pub allocated: Vec<String>,
    #[serde(default)]
    pub state: Option<JobState>,
    #[serde(default)]
    pub submit_time: Option<String>,
    #[serde(default)]
    pub start_time: Option<String>,
    #[serde(default)]
    pub end_time: Option<String>,
    #[serde(default)]
    pub deadline: Option<String>,
    #[serde(default)]
    pub est_duration_s: Option<f64>,
    #[serde(default)]
    pub deferrable: Option<bool>,
    #[serde(default)]
    pub preemptible: Option<bool>,
}

impl RawJob {
    /// The job, with defaults, and times (RFC 3339 or offsets) placed relative to `now`.
    pub fn job(&self, names: &Names<'_>, now: Timestamp) -> Result<Job, InputError> {
        if self.id.trim().is_empty() {
            return Err(InputError::NoJobId);
        }
        let t = |what: &'static str, s: &Option<String>| -> Result<Option<Timestamp>, InputError> {
            s.as_ref()
                .map(|s| {
                    parse_time(s, now).map_err(|e| InputError::JobTime {
                        job: self.id.clone(),
                        field: what,
                        source: Box::new(e),
                    })
                })
                .transpose()
        };
        let mut allocated = Vec::new();
        for a in &self.allocated {
            let ids = names.resolve(a).map_err(|e| InputError::Allocated {
                job: self.id.clone(),
                source: Box::new(e),
            })?;
            if let Some(bad) = ids.iter().find(|e| e.kind != telemetry::EntityKind::Gpu) {
                return Err(InputError::NotAGpu {
                    job: self.id.clone(),
                    id: bad.clone(),
                });
            }
            allocated.extend(ids);
        }
        let state = self.state.unwrap_or(if allocated.is_empty() {
            JobState::Pending
        } else {
            JobState::Running
        });
        let gpus = self.gpus.unwrap_or((allocated.len() as u32).max(1));
        let est = self.est_duration_s.unwrap_or(3600.0);
        if !(est.is_finite() && est >= 0.0) {
            return Err(InputError::Duration(self.id.clone()));
        }
        Ok(Job {
            id: self.id.clone(),
            scheduler: self.scheduler.clone().unwrap_or_else(|| {
                self.id
                    .split_once(':')
                    .map_or("file".to_string(), |(s, _)| s.to_string())
            }),
            name: self.name.clone().unwrap_or_else(|| self.id.clone()),
            user: self.user.clone().unwrap_or_else(|| "unknown".into()),
            project: self.project.clone().unwrap_or_else(|| "default".into()),
            class: self.class.clone().unwrap_or_else(|| "batch".into()),
            priority: self.priority.unwrap_or(0),
            gpus,
            allocated,
            state,
            submit_time: t("submit_time", &self.submit_time)?.unwrap_or(now),
            start_time: t("start_time", &self.start_time)?,
            end_time: t("end_time", &self.end_time)?,
            deadline: t("deadline", &self.deadline)?,
            est_duration_s: est,
            deferrable: self.deferrable.unwrap_or(true),
            preemptible: self.preemptible.unwrap_or(false),
            gpu_power_limit: None,
        })
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawJobsToml {
    #[serde(default)]
    jobs: Vec<toml::Spanned<RawJob>>,
}

/// A jobs file: TOML `[[jobs]]`, or JSON (a list, or `{"jobs": [...]}`).
pub fn jobs_file(file: &str, src: &str, site: &Site, now: Timestamp) -> Result<Vec<Job>, Problems> {
    let raw: Vec<(Pos, RawJob)> = if is_json(file) {
        let v: serde_json::Value =
            serde_json::from_str(src).map_err(|e| vec![json_error(file, &e)])?;
        let list = match v {
            serde_json::Value::Array(l) => l,
            serde_json::Value::Object(mut m) => match m.remove("jobs") {
                Some(serde_json::Value::Array(l)) => l,
                _ => {
                    return Err(vec![format!(
                        "{file}: expected a list of jobs or {{\"jobs\": [...]}}"
                    )])
                }
            },
            _ => {
                return Err(vec![format!(
                    "{file}: expected a list of jobs or {{\"jobs\": [...]}}"
                )])
            }
        };
        let mut out = Vec::new();
        let mut problems = Vec::new();
        for (i, mut j) in list.into_iter().enumerate() {
            // `/api/v1/jobs` lists {"job": {...}, "held": ...}
            if let Some(inner) = j
                .get_mut("job")
                .filter(|v| v.is_object())
                .map(std::mem::take)
            {
                j = inner;
            }
            match serde_json::from_value::<RawJob>(j) {
                Ok(j) => out.push((Pos::Path(format!("jobs[{i}]")), j)),
                Err(e) => problems.push(format!("{file}: jobs[{i}]: {e}")),
            }
        }
        if !problems.is_empty() {
            return Err(problems);
        }
        out
    } else {
        let r: RawJobsToml = toml::from_str(src).map_err(|e| vec![toml_error(file, src, &e)])?;
        r.jobs
            .into_iter()
            .map(|j| (Pos::Span(j.span()), j.into_inner()))
            .collect()
    };
    let mut problems = Vec::new();
    let mut jobs: Vec<Job> = Vec::new();
    let names = Names::new(site);
    for (pos, r) in raw {
        match r.job(&names, now) {
            Ok(j) if jobs.iter().any(|o| o.id == j.id) => problems.push(at(
                file,
                src,
                &pos,
                &format!("job {} is listed twice", j.id),
            )),
            Ok(j) => jobs.push(j),
            Err(e) => problems.push(at(file, src, &pos, &e.to_string())),
        }
    }
    if problems.is_empty() {
        Ok(jobs)
    } else {
        Err(problems)
    }
}
