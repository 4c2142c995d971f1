//! Which Kubernetes pods hold which GPUs, from the kubelet's pod-resources API
//! (`v1.PodResourcesLister/List` on `/var/lib/kubelet/pod-resources/kubelet.sock`).
//!
//! The kubelet says which device-plugin devices it gave each container, idle or not;
//! for NVIDIA's device plugin the device ids are GPU UUIDs, which the read cycle
//! matches against each GPU's UUID. The call runs on a thread of its own every
//! `refresh_s`, with a deadline (`timeout_s`): the read cycle only takes the last
//! mapping, so a kubelet that hangs never delays it. A call that fails (no socket, a
//! refusal, a hang, an error status, garbage) is counted (`pod_resources_errors`) and
//! logged at most once a minute per kind; the last good mapping is kept for at most
//! `3 × refresh_s` after it was read, then dropped, so pods are never attributed from
//! a stale answer.
//!
//! # Layout
//!
//! - this file: the `[kubernetes]` table, the mapping, its refresh thread, and the
//!   matching of device ids to GPUs;
//! - [`proto`]: the API's messages, by hand for `prost`;
//! - [`grpc`]: a unary gRPC call over HTTP/2 on a unix socket.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde::Deserialize;
use tracing::{info, warn};

pub mod grpc;
pub mod proto;

#[cfg(test)]
pub(crate) mod fake;
#[cfg(test)]
mod tests;

/// The method the agent calls.
pub const LIST: &str = "/v1.PodResourcesLister/List";

/// `[kubernetes]` in `agent.toml`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KubernetesConfig {
    /// The kubelet's pod-resources socket.
    #[serde(default = "socket")]
    pub pod_resources_socket: PathBuf,
    /// The device-plugin resources that are GPUs (MIG resources such as
    /// `nvidia.com/mig-1g.10gb` may be listed too).
    #[serde(default = "gpu_resources")]
    pub resource_names: Vec<String>,
    /// How often the kubelet is asked (seconds).
    #[serde(default = "ten")]
    pub refresh_s: f64,
    /// The deadline of each call (seconds).
    #[serde(default = "two")]
    pub timeout_s: f64,
}

fn socket() -> PathBuf {
    "/var/lib/kubelet/pod-resources/kubelet.sock".into()
}
fn gpu_resources() -> Vec<String> {
    vec!["nvidia.com/gpu".into()]
}
fn ten() -> f64 {
    10.0
}
fn two() -> f64 {
    2.0
}

impl Default for KubernetesConfig {
    fn default() -> Self {
        KubernetesConfig {
            pod_resources_socket: socket(),
            resource_names: gpu_resources(),
            refresh_s: ten(),
            timeout_s: two(),
        }
    }
}

/// A value of `[kubernetes]` out of its range.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum KubernetesConfigError {
    #[error("[kubernetes] refresh_s must be within 0.05..=3600, got {0}")]
    RefreshS(f64),
    #[error("[kubernetes] timeout_s must be above 0 and at most refresh_s ({refresh_s}), got {timeout_s}")]
    TimeoutS { refresh_s: f64, timeout_s: f64 },
    #[error("[kubernetes] resource_names must name at least one resource (\"nvidia.com/gpu\"), none empty")]
    ResourceNames,
    #[error("[kubernetes] pod_resources_socket is empty")]
    Socket,
}

impl KubernetesConfig {
    /// Every value within its range.
    pub fn check(&self) -> Result<(), KubernetesConfigError> {
        if !(self.refresh_s.is_finite() && (0.05..=3600.0).contains(&self.refresh_s)) {
            return Err(KubernetesConfigError::RefreshS(self.refresh_s));
        }
        if !(self.timeout_s.is_finite() && self.timeout_s > 0.0 && self.timeout_s <= self.refresh_s)
        {
            return Err(KubernetesConfigError::TimeoutS {
                refresh_s: self.refresh_s,
                timeout_s: self.timeout_s,
            });
        }
        if self.resource_names.is_empty() || self.resource_names.iter().any(|r| r.is_empty()) {
            return Err(KubernetesConfigError::ResourceNames);
        }
        if self.pod_resources_socket.as_os_str().is_empty() {
            return Err(KubernetesConfigError::Socket);
        }
        Ok(())
    }

    /// How long the last good mapping is used without a newer answer.
    pub fn max_age(&self) -> Duration {
        Duration::from_secs_f64(3.0 * self.refresh_s)
    }
}

/// What one answer of the kubelet says: each device id of a GPU resource and the pods
/// (`namespace/name`) whose containers hold it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Mapping {
    pub devices: BTreeMap<String, BTreeSet<String>>,
}

impl Mapping {
    /// The devices of the resources named (others, such as NICs or FPGAs, are left out).
    pub fn from_answer(answer: &proto::ListPodResourcesResponse, resources: &[String]) -> Mapping {
        let mut devices: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for pod in &answer.pod_resources {
            let name = format!("{}/{}", pod.namespace, pod.name);
            for c in &pod.containers {
                for d in &c.devices {
                    if !resources.contains(&d.resource_name) {
                        continue;
                    }
                    for id in &d.device_ids {
                        devices.entry(id.clone()).or_default().insert(name.clone());
                    }
                }
            }
        }
        Mapping { devices }
    }

    /// The pods of each GPU (by UUID) and the device ids no GPU of `uuids` has.
    pub fn assign<'a>(
        &self,
        uuids: &BTreeSet<&'a str>,
    ) -> (BTreeMap<&'a str, BTreeSet<String>>, Vec<String>) {
        let mut gpus: BTreeMap<&'a str, BTreeSet<String>> = BTreeMap::new();
        let mut unmatched = Vec::new();
        for (id, pods) in &self.devices {
            match gpu_of_device(id, uuids) {
                Some(u) => gpus.entry(u).or_default().extend(pods.iter().cloned()),
                None => unmatched.push(id.clone()),
            }
        }
        (gpus, unmatched)
    }
}

/// The GPU (its UUID, one of `uuids`) a device id names: the UUID itself; a
/// time-sliced replica of it (`GPU-...::3`, as NVIDIA's plugin names shared GPUs); or,
/// for a MIG device of the form `MIG-GPU-<parent uuid>/<gi>/<ci>`, its parent GPU.
/// MIG devices named by a UUID of their own (`MIG-<uuid>`, newer drivers) do not name
/// their parent: `None`, as for an id no GPU of the node has.
pub fn gpu_of_device<'a>(id: &str, uuids: &BTreeSet<&'a str>) -> Option<&'a str> {
    if let Some(u) = uuids.get(id) {
        return Some(u);
    }
    if let Some((base, replica)) = id.rsplit_once("::") {
        if !replica.is_empty() && replica.bytes().all(|b| b.is_ascii_digit()) {
            return gpu_of_device(base, uuids);
        }
    }
    let parent = id.strip_prefix("MIG-")?.split('/').next()?;
    parent
        .starts_with("GPU-")
        .then(|| uuids.get(parent).copied())
        .flatten()
}

/// The last good mapping, as the read cycle takes it.
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub mapping: Arc<Mapping>,
    /// Since the kubelet answered it.
    pub age: Duration,
    /// Increases with every answer (the read cycle counts unmatched ids once per answer).
    pub generation: u64,
}

#[derive(Debug, Default)]
struct State {
    latest: Option<(Arc<Mapping>, Instant, u64)>,
    generation: u64,
    answers: u64,
    errors: u64,
}

/// The mapping the refresh thread keeps up to date; dropping it stops the thread.
pub struct PodResources {
    state: Arc<Mutex<State>>,
    max_age: Duration,
    /// Dropped with this handle: the refresh thread stops at once.
    _stop: tokio::sync::oneshot::Sender<()>,
}

fn locked(m: &Mutex<State>) -> MutexGuard<'_, State> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl PodResources {
    /// Starts the refresh thread; its first call goes out at once.
    pub fn start(cfg: &KubernetesConfig) -> std::io::Result<PodResources> {
        let state = Arc::new(Mutex::new(State::default()));
        let (stop, stopped) = tokio::sync::oneshot::channel();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let (cfg2, state2) = (cfg.clone(), state.clone());
        std::thread::Builder::new()
            .name("pod-resources".into())
            .spawn(move || rt.block_on(refresh(cfg2, state2, stopped)))?;
        info!(socket = %cfg.pod_resources_socket.display(), resources = ?cfg.resource_names, refresh_s = cfg.refresh_s, "asking the kubelet which pods hold the GPUs");
        Ok(PodResources {
            state,
            max_age: cfg.max_age(),
            _stop: stop,
        })
    }

    /// The last good mapping, unless it is older than `3 × refresh_s` at `now` (then it
    /// is dropped for good: a later answer brings a new one).
    pub fn current(&self, now: Instant) -> Option<Snapshot> {
        let mut s = locked(&self.state);
        let (mapping, at, generation) = s.latest.clone()?;
        let age = now.saturating_duration_since(at);
        if age > self.max_age {
            warn!(
                age_s = age.as_secs_f64(),
                max_age_s = self.max_age.as_secs_f64(),
                "no answer from the kubelet's pod-resources API for too long: GPUs are no longer attributed to pods until it answers"
            );
            s.latest = None;
            return None;
        }
        Some(Snapshot {
            mapping,
            age,
            generation,
        })
    }

    /// Calls that failed so far.
    pub fn errors(&self) -> u64 {
        locked(&self.state).errors
    }

    /// Calls that were answered so far.
    pub fn answers(&self) -> u64 {
        locked(&self.state).answers
    }
}

/// The refresh loop: one call every `refresh_s` (from the start of the last one), until
/// `stopped` fires or its sender is dropped.
async fn refresh(
    cfg: KubernetesConfig,
    state: Arc<Mutex<State>>,
    mut stopped: tokio::sync::oneshot::Receiver<()>,
) {
    let every = Duration::from_secs_f64(cfg.refresh_s);
    let deadline = Duration::from_secs_f64(cfg.timeout_s);
    let mut log = telemetry::log_limit::LogLimiter::new(Duration::from_secs(60));
    let mut failing = false;
    loop {
        let started = tokio::time::Instant::now();
        let call = grpc::unary::<_, proto::ListPodResourcesResponse>(
            &cfg.pod_resources_socket,
            LIST,
            &proto::ListPodResourcesRequest {},
            deadline,
        );
        let answer = tokio::select! {
            a = call => a,
            _ = &mut stopped => return,
        };
        match answer {
            Ok(a) => {
                let mapping = Mapping::from_answer(&a, &cfg.resource_names);
                let n = mapping.devices.len();
                {
                    let mut s = locked(&state);
                    s.generation += 1;
                    s.answers += 1;
                    s.latest = Some((Arc::new(mapping), Instant::now(), s.generation));
                }
                if failing {
                    info!(devices = n, "the kubelet's pod-resources API answers again");
                }
                failing = false;
            }
            Err(e) => {
                locked(&state).errors += 1;
                failing = true;
                if let Some(left_out) = log.allow(e.reason(), Instant::now()) {
                    warn!(socket = %cfg.pod_resources_socket.display(), error = %e, left_out, "cannot list the pods' resources from the kubelet; the last answer is kept for 3 x refresh_s");
                }
            }
        }
        tokio::select! {
            _ = tokio::time::sleep_until(started + every) => {}
            _ = &mut stopped => return,
        }
    }
}
