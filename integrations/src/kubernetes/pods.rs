//! The pods powerplane follows, through a watch: a reflector keeps them in memory
//! (listed once, then changed by watch events; relisted when the API server says the
//! watch's version expired, `410 Gone`), so reading them costs no call and a stalled
//! or broken watch never delays a poll. Gates are removed with a JSON patch under
//! powerplane's field manager, and each removal is told on the pod as an Event.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher;
use kube::runtime::WatchStreamExt;
use kube::Resource;
use serde::Serialize;
use serde_json::Value;

use super::{Kube, KubeApi, KubeError};

/// powerplane's field manager and the controller Events name.
pub const FIELD_MANAGER: &str = "powerplane";
const CONTROLLER: &str = "powerplane.io/controller";

/// How the watch is doing, for the status and `/metrics`.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct WatchStats {
    /// The pods have been listed at least once.
    pub listed: bool,
    /// Lists (the first, and every relist after an expired version).
    pub lists: u64,
    /// Watch events taken (added, modified, deleted).
    pub events: u64,
    /// Watch or list failures (each retried after a backoff).
    pub errors: u64,
    pub last_error: Option<String>,
    /// Pods in memory now.
    pub pods: usize,
    /// Events recorded on pods, and recordings that failed.
    pub recorded: u64,
    pub record_errors: u64,
}

/// What the watch task and the poller share.
#[derive(Debug, Default)]
struct Shared {
    stats: WatchStats,
}

/// The Kubernetes API through kube-rs: pods watched by `label` (every namespace, or
/// one), gates removed by JSON patch.
pub struct KubePods {
    kube: Kube,
    store: Store<Pod>,
    shared: Arc<Mutex<Shared>>,
    recorder: Recorder,
    /// Gates removed whose pod the watch has not yet shown without them: the pod is
    /// reported ungated meanwhile (the removal happened), for at most a minute.
    ungated: HashMap<(String, String), Instant>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for KubePods {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// How long a watch runs before the API server ends it (and it is started again):
/// also, with kube's margin of a few seconds, how long a silent watch is trusted.
pub const DEFAULT_WATCH_TIMEOUT_S: u32 = 290;

impl KubePods {
    /// Starts watching pods carrying `label` (a label selector, e.g.
    /// `powerplane.io/class`) in `namespace` (`None`: all), each watch ended by the
    /// server after `watch_timeout_s`.
    pub fn start(
        kube: Kube,
        label: &str,
        namespace: Option<&str>,
        watch_timeout_s: u32,
    ) -> KubePods {
        let api: Api<Pod> = match namespace {
            Some(ns) => Api::namespaced(kube.client.clone(), ns),
            None => Api::all(kube.client.clone()),
        };
        let (store, writer) = reflector::store();
        let shared = Arc::new(Mutex::new(Shared::default()));
        let config = watcher::Config::default()
            .labels(label)
            .timeout(watch_timeout_s.max(1));
        let stream = reflector::reflector(writer, watcher(api, config).default_backoff());
        let (sh, reader) = (shared.clone(), store.clone());
        let task = kube.spawn(async move {
            let mut stream = std::pin::pin!(stream);
            while let Some(event) = stream.next().await {
                let mut g = sh.lock().unwrap_or_else(|p| p.into_inner());
                let s = &mut g.stats;
                match event {
                    Ok(watcher::Event::Init) => s.lists += 1,
                    Ok(watcher::Event::InitDone) => s.listed = true,
                    Ok(watcher::Event::InitApply(_)) => {}
                    Ok(watcher::Event::Apply(_) | watcher::Event::Delete(_)) => s.events += 1,
                    Err(e) => {
                        s.errors += 1;
                        s.last_error = Some(e.to_string());
                        tracing::warn!(error = %e, "Kubernetes pod watch failed; retrying after a backoff");
                    }
                }
                s.pods = reader.len();
            }
        });
        let reporter = Reporter {
            controller: CONTROLLER.into(),
            instance: Some(crate::lease::host_name()),
        };
        let recorder = Recorder::new(kube.client.clone(), reporter);
        KubePods {
            kube,
            store,
            shared,
            recorder,
            ungated: HashMap::new(),
            task,
        }
    }

    fn shared(&self) -> std::sync::MutexGuard<'_, Shared> {
        self.shared.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Tells the pod, as an Event, what powerplane did (best effort: a failure is
    /// counted and logged, never retried).
    pub fn record(&self, pod: &Pod, reason: &str, action: &str, note: String, warning: bool) {
        let reference = pod.object_ref(&());
        let (recorder, event) = (
            self.recorder.clone(),
            Event {
                type_: if warning {
                    EventType::Warning
                } else {
                    EventType::Normal
                },
                reason: reason.into(),
                note: Some(note),
                action: action.into(),
                secondary: None,
            },
        );
        let out = self.kube.call("record an event", async move {
            recorder.publish(&event, &reference).await
        });
        let mut g = self.shared();
        match out {
            Ok(()) => g.stats.recorded += 1,
            Err(e) => {
                g.stats.record_errors += 1;
                tracing::warn!(error = %e, "cannot record an event on a pod");
            }
        }
    }

    fn cached(&self, ns: &str, name: &str) -> Option<Arc<Pod>> {
        self.store.get(&reflector::ObjectRef::new(name).within(ns))
    }
}

fn gate_names(pod: &Pod) -> Vec<&str> {
    pod.spec
        .as_ref()
        .and_then(|s| s.scheduling_gates.as_ref())
        .map(|g| g.iter().map(|g| g.name.as_str()).collect())
        .unwrap_or_default()
}

impl KubeApi for KubePods {
    fn pods(&mut self) -> Result<Vec<Value>, KubeError> {
        {
            let g = self.shared();
            if !g.stats.listed {
                return Err(KubeError::NotListed(g.stats.last_error.clone()));
            }
        }
        let pods = self.store.state();
        let now = Instant::now();
        let mut out = Vec::with_capacity(pods.len());
        for pod in pods {
            let key = (
                pod.metadata.namespace.clone().unwrap_or_default(),
                pod.metadata.name.clone().unwrap_or_default(),
            );
            let mut v = serde_json::to_value(pod.as_ref()).map_err(KubeError::Json)?;
            if let Some(at) = self.ungated.get(&key) {
                let fresh = now.duration_since(*at) < Duration::from_secs(60);
                // the watch has not shown the removal yet: show it as done
                match v
                    .pointer_mut("/spec/schedulingGates")
                    .and_then(Value::as_array_mut)
                {
                    Some(gates) if fresh && !gates.is_empty() => gates.clear(),
                    _ => {
                        self.ungated.remove(&key);
                    }
                }
            }
            out.push(v);
        }
        self.ungated
            .retain(|_, at| now.duration_since(*at) < Duration::from_secs(60));
        Ok(out)
    }

    fn remove_gate(
        &mut self,
        ns: &str,
        name: &str,
        index: usize,
        gate: &str,
    ) -> Result<(), KubeError> {
        // the test makes the removal fail rather than remove another gate if the list moved
        let patch: json_patch::Patch = serde_json::from_value(serde_json::json!([
            { "op": "test", "path": format!("/spec/schedulingGates/{index}/name"), "value": gate },
            { "op": "remove", "path": format!("/spec/schedulingGates/{index}") },
        ]))
        .map_err(KubeError::Json)?;
        let api: Api<Pod> = Api::namespaced(self.kube.client.clone(), ns);
        let params = PatchParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..Default::default()
        };
        let what = format!("remove the gate of {ns}/{name}");
        let pod_name = name.to_string();
        let pod = self.kube.call(&what, async move {
            api.patch(&pod_name, &params, &Patch::<()>::Json(patch))
                .await
        })?;
        self.ungated
            .insert((ns.to_string(), name.to_string()), Instant::now());
        let left = gate_names(&pod).len();
        self.record(
            &pod,
            "Released",
            "RemoveSchedulingGate",
            format!(
                "powerplane removed its scheduling gate {gate:?}: the plan lets the pod run now{}",
                if left > 0 {
                    format!(" ({left} other gate(s) remain)")
                } else {
                    String::new()
                }
            ),
            false,
        );
        Ok(())
    }

    fn event(&mut self, ns: &str, name: &str, warning: bool, reason: &str, note: String) {
        match self.cached(ns, name) {
            Some(pod) => self.record(&pod, reason, "PowerLimit", note, warning),
            None => self.shared().stats.record_errors += 1,
        }
    }

    fn url(&self) -> String {
        self.kube.url.clone()
    }

    fn watch(&self) -> WatchStats {
        let mut s = self.shared().stats.clone();
        s.pods = self.store.len();
        s
    }
}

impl KubePods {
    /// A pod as the watch last saw it.
    pub fn pod(&self, ns: &str, name: &str) -> Option<Arc<Pod>> {
        self.cached(ns, name)
    }
}
