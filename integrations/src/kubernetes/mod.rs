//! Kubernetes: a mutating admission webhook that puts a scheduling gate on pods of
//! deferrable classes, removal of that gate through the API server when the plan lets
//! the pod run, and scheduler-extender `filter`/`prioritize` answers that steer pods
//! away from capped or hot nodes.
//!
//! The gate itself is the record of powerplane's hold: a pod carrying the gate
//! (`powerplane.io/hold` by default) is held by powerplane, and nothing else adds that
//! gate. Kubernetes only accepts scheduling gates at creation, so a pod whose gate was
//! removed cannot be held again.

use std::collections::BTreeMap;
use std::time::Duration;

use policies::Hold;
use serde::Deserialize;
use serde_json::{json, Value};
use telemetry::{Job, JobState, Timestamp};
use thiserror::Error;

use crate::scheduler::SchedulerError;

mod client;
mod lease;
mod pods;

pub use client::{Access, Kube, Way, SERVICE_ACCOUNT_DIR};
pub use lease::KubeLease;
pub use pods::{KubePods, WatchStats, DEFAULT_WATCH_TIMEOUT_S, FIELD_MANAGER};

/// What can go wrong between powerplane and the Kubernetes API server.
#[derive(Debug, Error)]
pub enum KubeError {
    /// Where the API server is or who powerplane is cannot be worked out.
    #[error("Kubernetes: {0}")]
    Config(String),
    /// The pods have not been listed yet (the watch's first list has not come back).
    #[error("Kubernetes: the pods are not listed yet{}", .0.as_deref().map(|e| format!(": {e}")).unwrap_or_default())]
    NotListed(Option<String>),
    /// The call passed its deadline.
    #[error("Kubernetes: {what}: no answer within {} ms", .after.as_millis())]
    Timeout { what: String, after: Duration },
    /// The API server refused (`what`: the call, as the message names it).
    #[error("Kubernetes: {what}: HTTP {status} {reason}: {message}")]
    Status {
        what: String,
        status: u16,
        reason: String,
        message: String,
    },
    /// The exchange failed (connect, TLS, the answer).
    #[error("Kubernetes: {what}: {source}")]
    Transport {
        what: String,
        #[source]
        source: kube::Error,
    },
    #[error("Kubernetes: {0}")]
    Json(#[source] serde_json::Error),
}

impl KubeError {
    /// A kube error of the call `what`: the API server's refusal with its status, or
    /// the transport's failure.
    pub fn from_kube(what: &str, e: kube::Error) -> KubeError {
        match e {
            kube::Error::Api(s) => KubeError::Status {
                what: what.to_string(),
                status: s.code,
                reason: s.reason.clone(),
                message: s.message.chars().take(300).collect(),
            },
            source => KubeError::Transport {
                what: what.to_string(),
                source,
            },
        }
    }

    /// The HTTP status of a refusal.
    pub fn status(&self) -> Option<u16> {
        match self {
            KubeError::Status { status, .. } => Some(*status),
            _ => None,
        }
    }
}

impl From<KubeError> for SchedulerError {
    fn from(e: KubeError) -> Self {
        match &e {
            KubeError::Config(_) => SchedulerError::Setup { source: e.into() },
            KubeError::Timeout { .. } => SchedulerError::Timeout { source: e.into() },
            KubeError::NotListed(_) | KubeError::Transport { .. } => {
                SchedulerError::Unreachable { source: e.into() }
            }
            KubeError::Status { status, .. } => SchedulerError::Refused {
                status: Some(*status),
                source: e.into(),
            },
            KubeError::Json(_) => SchedulerError::BadAnswer { source: e.into() },
        }
    }
}

/// An AdmissionReview or ExtenderArgs that cannot be answered.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{0}")]
pub struct ReviewError(&'static str);

/// How pods are recognised and gated.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PodMapping {
    /// The scheduling gate powerplane adds and removes.
    #[serde(default = "default_gate")]
    pub gate: String,
    /// The pod label naming its class.
    #[serde(default = "default_class_label")]
    pub class_label: String,
    /// Classes gated at admission (annotation `powerplane.io/deferrable: "true"|"false"`
    /// overrides).
    #[serde(default = "default_deferrable")]
    pub deferrable_classes: Vec<String>,
    /// The run time of a pod without a `powerplane.io/est-duration-s` annotation.
    #[serde(default = "default_duration")]
    pub default_duration_s: f64,
}

fn default_gate() -> String {
    "powerplane.io/hold".into()
}
fn default_class_label() -> String {
    "powerplane.io/class".into()
}
fn default_deferrable() -> Vec<String> {
    vec!["batch".into(), "training".into()]
}
fn default_duration() -> f64 {
    3600.0
}

impl Default for PodMapping {
    fn default() -> Self {
        PodMapping {
            gate: default_gate(),
            class_label: default_class_label(),
            deferrable_classes: default_deferrable(),
            default_duration_s: default_duration(),
        }
    }
}

/// The class of a pod without the class label.
pub const DEFAULT_CLASS: &str = "default";
pub const DEFERRABLE_ANNOTATION: &str = "powerplane.io/deferrable";
pub const DEADLINE_ANNOTATION: &str = "powerplane.io/deadline";
/// The power each of the pod's GPUs may draw at most: `"300W"` or `"80%"` (of the
/// GPU's default limit).
pub const GPU_POWER_LIMIT_ANNOTATION: &str = "powerplane.io/gpu-power-limit";
pub const DURATION_ANNOTATION: &str = "powerplane.io/est-duration-s";

fn get<'a>(v: &'a Value, path: &[&str]) -> Option<&'a Value> {
    path.iter().try_fold(v, |v, k| v.get(*k))
}

fn str_at<'a>(v: &'a Value, path: &[&str]) -> Option<&'a str> {
    get(v, path).and_then(Value::as_str)
}

impl PodMapping {
    /// The pod's class, if it carries the class label.
    pub fn class(&self, pod: &Value) -> Option<String> {
        get(pod, &["metadata", "labels"])
            .and_then(|l| l.get(&self.class_label))
            .and_then(Value::as_str)
            .map(str::to_string)
    }

    /// The pod should be gated at admission.
    pub fn deferrable(&self, pod: &Value) -> bool {
        let annotation = get(pod, &["metadata", "annotations"])
            .and_then(|a| a.get(DEFERRABLE_ANNOTATION))
            .and_then(Value::as_str);
        match annotation {
            Some("true") => true,
            Some("false") => false,
            _ => self
                .class(pod)
                .is_some_and(|c| self.deferrable_classes.contains(&c)),
        }
    }

    /// Where the pod's gate sits in `spec.schedulingGates`, if it has it.
    pub fn gate_index(&self, pod: &Value) -> Option<usize> {
        get(pod, &["spec", "schedulingGates"])
            .and_then(Value::as_array)?
            .iter()
            .position(|g| g.get("name").and_then(Value::as_str) == Some(self.gate.as_str()))
    }

    /// powerplane's job for a pod (`k8s:<namespace>/<name>`).
    pub fn job(&self, pod: &Value, now: Timestamp) -> Job {
        let ns = str_at(pod, &["metadata", "namespace"]).unwrap_or("default");
        let name = str_at(pod, &["metadata", "name"]).unwrap_or("");
        let ann = |k: &str| {
            get(pod, &["metadata", "annotations"])
                .and_then(|a| a.get(k))
                .and_then(Value::as_str)
        };
        let gpus: u32 = get(pod, &["spec", "containers"])
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|c| {
                get(c, &["resources", "limits", "nvidia.com/gpu"]).and_then(|g| match g {
                    Value::String(s) => s.parse::<u32>().ok(),
                    Value::Number(n) => n.as_u64().map(|n| n as u32),
                    _ => None,
                })
            })
            .sum();
        let gated = self.gate_index(pod).is_some();
        let phase = str_at(pod, &["status", "phase"]).unwrap_or("Pending");
        let state = match phase {
            "Pending" if gated => JobState::Held,
            "Pending" => JobState::Pending,
            "Running" => JobState::Running,
            "Succeeded" => JobState::Finished,
            _ => JobState::Cancelled,
        };
        let created = str_at(pod, &["metadata", "creationTimestamp"])
            .and_then(|t| Timestamp::parse_rfc3339(t).ok())
            .unwrap_or(now);
        Job {
            id: crate::scheduler::JobId::pod(ns, name).to_string(),
            scheduler: "kubernetes".into(),
            name: name.to_string(),
            user: get(pod, &["spec", "serviceAccountName"])
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string(),
            project: ns.to_string(),
            class: self.class(pod).unwrap_or_else(|| DEFAULT_CLASS.into()),
            priority: get(pod, &["spec", "priority"])
                .and_then(Value::as_i64)
                .unwrap_or(0)
                .clamp(i64::from(i32::MIN), i64::from(i32::MAX)) as i32,
            gpus,
            allocated: Vec::new(),
            state,
            submit_time: created,
            start_time: None,
            end_time: None,
            deadline: ann(DEADLINE_ANNOTATION).and_then(|t| Timestamp::parse_rfc3339(t).ok()),
            est_duration_s: ann(DURATION_ANNOTATION)
                .and_then(|d| d.parse::<f64>().ok())
                .filter(|d| d.is_finite() && *d > 0.0)
                .unwrap_or(self.default_duration_s),
            deferrable: self.deferrable(pod),
            preemptible: false,
            gpu_power_limit: ann(GPU_POWER_LIMIT_ANNOTATION)
                .and_then(|l| telemetry::PowerLimit::parse(l).ok()),
        }
    }

    /// Answers an `admission.k8s.io/v1` AdmissionReview: always allowed; a pod of a
    /// deferrable class being created gets the gate as a JSONPatch.
    pub fn admit(&self, review: &Value) -> Result<Value, ReviewError> {
        let req = review
            .get("request")
            .ok_or(ReviewError("an AdmissionReview without request"))?;
        let uid = req
            .get("uid")
            .and_then(Value::as_str)
            .ok_or(ReviewError("request.uid missing"))?;
        let api_version = review
            .get("apiVersion")
            .and_then(Value::as_str)
            .unwrap_or("admission.k8s.io/v1");
        let mut response = json!({ "uid": uid, "allowed": true });
        let is_pod = str_at(req, &["kind", "kind"]) == Some("Pod")
            && str_at(req, &["kind", "group"]).unwrap_or("").is_empty();
        let creating = req.get("operation").and_then(Value::as_str) == Some("CREATE");
        if let (true, true, Some(pod)) = (is_pod, creating, req.get("object")) {
            if self.deferrable(pod) && self.gate_index(pod).is_none() {
                let gate = json!({ "name": self.gate });
                let mut ops = vec![match get(pod, &["spec", "schedulingGates"])
                    .and_then(Value::as_array)
                {
                    Some(_) => {
                        json!({ "op": "add", "path": "/spec/schedulingGates/-", "value": gate })
                    }
                    None => {
                        json!({ "op": "add", "path": "/spec/schedulingGates", "value": [gate] })
                    }
                }];
                // the watch follows pods by the class label: a pod gated for its
                // annotation alone gets the label too, so it is never lost from view
                if self.class(pod).is_none() {
                    ops.push(
                        match get(pod, &["metadata", "labels"]).and_then(Value::as_object) {
                            Some(_) => json!({
                                "op": "add",
                                "path": format!("/metadata/labels/{}", pointer_escape(&self.class_label)),
                                "value": DEFAULT_CLASS,
                            }),
                            None => json!({
                                "op": "add",
                                "path": "/metadata/labels",
                                "value": { self.class_label.clone(): DEFAULT_CLASS },
                            }),
                        },
                    );
                }
                let patch = Value::Array(ops);
                response["patchType"] = json!("JSONPatch");
                response["patch"] = json!(base64(patch.to_string().as_bytes()));
            }
        }
        Ok(json!({
            "apiVersion": api_version,
            "kind": "AdmissionReview",
            "response": response,
        }))
    }
}

/// The pod's GPU power limit annotation, when it is there and is not a limit: what
/// to tell the pod.
fn bad_limit(pod: &Value) -> Option<String> {
    let v = get(pod, &["metadata", "annotations"])?
        .get(GPU_POWER_LIMIT_ANNOTATION)?
        .as_str()?;
    telemetry::PowerLimit::parse(v)
        .err()
        .map(|e| format!("{GPU_POWER_LIMIT_ANNOTATION}: {e}; no limit of the pod's own is applied"))
}

/// A key as one JSON-pointer segment (RFC 6901: `~` → `~0`, `/` → `~1`).
fn pointer_escape(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

/// Standard base64 with padding (RFC 4648), as AdmissionReview patches are sent.
pub fn base64(data: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(data)
}

/// What the extender knows of a node.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct NodeCondition {
    /// Share of the node's GPUs capped (0..=1).
    pub capped: f64,
    /// Its rack is over its inlet limit (the thermal rule is stepping it down).
    pub hot: bool,
}

/// Case-insensitive field lookup (kube-scheduler's Go structs carry no JSON tags).
fn field<'a>(v: &'a Value, name: &str) -> Option<&'a Value> {
    v.as_object()?
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(name))
        .map(|(_, v)| v)
        .filter(|v| !v.is_null())
}

/// The candidate node names of ExtenderArgs (from `NodeNames` or `Nodes.items`).
fn candidates(args: &Value) -> Result<(Vec<String>, bool), ReviewError> {
    if let Some(names) = field(args, "NodeNames").and_then(Value::as_array) {
        return Ok((
            names
                .iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect(),
            true,
        ));
    }
    let items = field(args, "Nodes")
        .and_then(|n| n.get("items"))
        .and_then(Value::as_array)
        .ok_or(ReviewError(
            "ExtenderArgs with neither NodeNames nor Nodes.items",
        ))?;
    Ok((
        items
            .iter()
            .filter_map(|n| str_at(n, &["metadata", "name"]))
            .map(str::to_string)
            .collect(),
        false,
    ))
}

/// `filter`: drops nodes in hot racks while cooler candidates remain. Answers an
/// ExtenderFilterResult in the form asked (names or full nodes).
pub fn filter(args: &Value, nodes: &BTreeMap<String, NodeCondition>) -> Value {
    let (names, by_name) = match candidates(args) {
        Ok(c) => c,
        Err(e) => {
            return json!({ "NodeNames": null, "Nodes": null, "FailedNodes": {}, "Error": e.to_string() })
        }
    };
    let hot = |n: &str| nodes.get(n).is_some_and(|c| c.hot);
    let cool: Vec<&String> = names.iter().filter(|n| !hot(n)).collect();
    // never filter every node: a pod must still be able to run somewhere
    let keep: Vec<String> = if cool.is_empty() {
        names.clone()
    } else {
        cool.into_iter().cloned().collect()
    };
    let failed: BTreeMap<&String, &str> = names
        .iter()
        .filter(|n| !keep.contains(n))
        .map(|n| (n, "powerplane: the node's rack is over its inlet limit"))
        .collect();
    if by_name {
        json!({ "NodeNames": keep, "Nodes": null, "FailedNodes": failed, "Error": "" })
    } else {
        let items: Vec<Value> = field(args, "Nodes")
            .and_then(|n| n.get("items"))
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter(|n| {
                str_at(n, &["metadata", "name"]).is_some_and(|name| keep.iter().any(|k| k == name))
            })
            .cloned()
            .collect();
        json!({
            "Nodes": { "apiVersion": "v1", "kind": "NodeList", "items": items },
            "NodeNames": null,
            "FailedNodes": failed,
            "Error": "",
        })
    }
}

/// `prioritize`: a HostPriorityList, 0..=10 (kube-scheduler's MaxExtenderPriority):
/// 10 for a cool node with no GPU capped, less the more of its GPUs are capped, 0 in a
/// hot rack; nodes powerplane does not know get 5.
pub fn prioritize(args: &Value, nodes: &BTreeMap<String, NodeCondition>) -> Value {
    let names = candidates(args).map(|c| c.0).unwrap_or_default();
    let list: Vec<Value> = names
        .iter()
        .map(|n| {
            let score = match nodes.get(n) {
                None => 5,
                Some(c) if c.hot => 0,
                Some(c) => (10.0 * (1.0 - c.capped.clamp(0.0, 1.0))).round() as i64,
            };
            json!({ "Host": n, "Score": score })
        })
        .collect();
    Value::Array(list)
}

/// The Kubernetes API, as powerplane uses it.
pub trait KubeApi {
    /// The pods powerplane watches (those with the class label), as the API server
    /// last said; an error until they are first listed.
    fn pods(&mut self) -> Result<Vec<Value>, KubeError>;
    /// Removes `spec.schedulingGates[index]` if it is still `gate`.
    fn remove_gate(
        &mut self,
        namespace: &str,
        name: &str,
        index: usize,
        gate: &str,
    ) -> Result<(), KubeError>;
    /// Tells the pod, as an Event (best effort: a failure is counted by the API's
    /// own stats, never retried).
    fn event(&mut self, namespace: &str, name: &str, warning: bool, reason: &str, note: String);
    /// The API server, for the status.
    fn url(&self) -> String;
    /// How the watch is doing.
    fn watch(&self) -> WatchStats;
}

/// Counters of the gate keeper.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct KubeCounters {
    /// Pods told (as Events) of their GPU power limit, and pods whose limit is not one.
    pub limits_told: u64,
    pub bad_limits: u64,
    pub polls: u64,
    pub poll_errors: u64,
    pub gates_removed: u64,
    pub errors: u64,
    pub last_error: Option<String>,
}

/// Keeps the gates in step with the plan.
pub struct KubeSync<A: KubeApi> {
    pub api: A,
    pub mapping: PodMapping,
    /// Gated pods at the last poll: job id → (namespace, name, gate index).
    gated: BTreeMap<String, (String, String, usize)>,
    /// Jobs reported and not finished: one whose pod disappears is finished.
    live: BTreeMap<String, Job>,
    /// What each pod was last told of its GPU power limit (reason, note).
    told: BTreeMap<String, (&'static str, String)>,
    pub counters: KubeCounters,
}

impl<A: KubeApi> KubeSync<A> {
    pub fn new(api: A, mapping: PodMapping) -> Self {
        KubeSync {
            api,
            mapping,
            gated: BTreeMap::new(),
            live: BTreeMap::new(),
            told: BTreeMap::new(),
            counters: KubeCounters::default(),
        }
    }

    /// Pods powerplane gates or whose class it knows, as jobs (gated ones held); a
    /// pod that disappears is reported finished once.
    pub fn poll(&mut self, now: Timestamp) -> Result<Vec<Job>, KubeError> {
        self.counters.polls += 1;
        let pods = self.api.pods().inspect_err(|e| {
            self.counters.poll_errors += 1;
            self.counters.last_error = Some(e.to_string());
        })?;
        self.gated.clear();
        let mut jobs = Vec::new();
        for pod in &pods {
            let gate = self.mapping.gate_index(pod);
            if gate.is_none() && self.mapping.class(pod).is_none() {
                continue;
            }
            let job = self.mapping.job(pod, now);
            if let Some(bad) = bad_limit(pod) {
                self.tell(&job.id, true, "PowerLimitRefused", bad);
            }
            if let Some(i) = gate {
                let ns = str_at(pod, &["metadata", "namespace"]).unwrap_or("default");
                let name = str_at(pod, &["metadata", "name"]).unwrap_or("");
                self.gated
                    .insert(job.id.clone(), (ns.to_string(), name.to_string(), i));
            }
            jobs.push(job);
        }
        for (id, mut gone) in std::mem::take(&mut self.live) {
            if !jobs.iter().any(|j| j.id == id) {
                gone.state = JobState::Finished;
                gone.end_time.get_or_insert(now);
                jobs.push(gone);
            }
        }
        self.live = jobs
            .iter()
            .filter(|j| !j.state.is_done())
            .map(|j| (j.id.clone(), j.clone()))
            .collect();
        let live = &self.live;
        self.told.retain(|id, _| live.contains_key(id));
        Ok(jobs)
    }

    /// Tells each pod with a GPU power limit what is in force, when that changes.
    pub fn tell_limits(&mut self, limits: &BTreeMap<String, crate::scheduler::JobLimit>) {
        for (id, l) in limits {
            if !self.live.contains_key(id) {
                continue;
            }
            let (warning, reason, note) = l.tell();
            self.tell(id, warning, reason, note);
        }
    }

    /// An Event on the pod of job `id`, unless it was told just that last.
    fn tell(&mut self, id: &str, warning: bool, reason: &'static str, note: String) {
        if self
            .told
            .get(id)
            .is_some_and(|(r, n)| *r == reason && *n == note)
        {
            return;
        }
        let Some((ns, name)) = id.strip_prefix("k8s:").and_then(|p| p.split_once('/')) else {
            return;
        };
        if reason == "PowerLimitRefused" {
            self.counters.bad_limits += 1;
        } else {
            self.counters.limits_told += 1;
        }
        tracing::info!(pod = %id, reason, "{note}");
        self.api.event(ns, name, warning, reason, note.clone());
        self.told.insert(id.to_string(), (reason, note));
    }

    /// Jobs gated now, by id.
    pub fn gated(&self) -> Vec<String> {
        self.gated.keys().cloned().collect()
    }

    /// Removes the gate of every gated pod the plan does not hold (or whose hold's
    /// lease has passed). Returns the pods released.
    pub fn apply(&mut self, desired: &BTreeMap<String, Hold>, now: Timestamp) -> Vec<String> {
        let mut released = Vec::new();
        for (id, (ns, name, i)) in self.gated.clone() {
            if desired.get(&id).is_some_and(|h| h.lease_until > now) {
                continue;
            }
            match self.api.remove_gate(&ns, &name, i, &self.mapping.gate) {
                Ok(()) => {
                    self.counters.gates_removed += 1;
                    self.gated.remove(&id);
                    released.push(id);
                }
                Err(e) => {
                    self.counters.errors += 1;
                    self.counters.last_error = Some(e.to_string());
                }
            }
        }
        released
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_rfc_4648() {
        for (plain, enc) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64(plain.as_bytes()), enc);
        }
    }
}
