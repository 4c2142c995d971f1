//! Kubernetes glue: the adapter opened from `[schedulers.kubernetes]`, and what the
//! admission webhook and the scheduler extender read (the HTTP side, off the loop).

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::Result;
use integrations::kubernetes::{Kube, KubePods, KubeSync, NodeCondition, PodMapping};
use integrations::scheduler::Scheduler;
use policies::State;
use tracing::info;

use integrations::store::Store;

use super::config::{KubernetesSection, SchedulersSection};
use super::Opened;

/// What the admission and extender endpoints need.
pub struct KubeHooks {
    pub pods: PodMapping,
    pub node_names: BTreeMap<String, String>,
}

impl KubeHooks {
    /// Per Kubernetes node: the share of its GPUs capped, and whether its rack is
    /// being stepped down for heat (a thermal level below 1).
    pub fn conditions(
        &self,
        site: &telemetry::Site,
        state: &State,
    ) -> BTreeMap<String, NodeCondition> {
        let by_site: BTreeMap<&str, &str> = self
            .node_names
            .iter()
            .map(|(k, v)| (v.as_str(), k.as_str()))
            .collect();
        site.nodes
            .iter()
            .map(|n| {
                let capped = (0..n.gpus)
                    .filter(|i| {
                        state
                            .caps
                            .contains_key(&telemetry::EntityId::gpu(&n.id, *i))
                    })
                    .count();
                let hot = state.thermal.get(&n.rack).is_some_and(|t| t.fraction < 1.0);
                let name = by_site.get(n.id.as_str()).copied().unwrap_or(&n.id);
                (
                    name.to_string(),
                    NodeCondition {
                        capped: if n.gpus == 0 {
                            0.0
                        } else {
                            capped as f64 / f64::from(n.gpus)
                        },
                        hot,
                    },
                )
            })
            .collect()
    }
}

/// The Kubernetes adapter of `[schedulers.kubernetes]` and its poll interval.
pub fn open(
    section: &SchedulersSection,
    base: &std::path::Path,
    _store: &mut Store,
) -> Result<Option<Opened>> {
    let Some(k) = &section.kubernetes else {
        return Ok(None);
    };
    // a list or watch silent for its server-side timeout and 10 s more is dropped
    let kube = Kube::watching(
        &k.access(base),
        Duration::from_secs_f64(k.timeout_s),
        Duration::from_secs(u64::from(k.watch_timeout_s) + 10),
    )?;
    info!(api = %kube.url, gate = %k.pods.gate, label = %k.pods.class_label, "steering Kubernetes pods through scheduling gates (watching pods with the class label)");
    let api = KubePods::start(
        kube,
        &k.pods.class_label,
        k.namespace.as_deref(),
        k.watch_timeout_s,
    );
    let adapter: Box<dyn Scheduler> = Box::new(KubeSync::new(api, k.pods.clone()));
    Ok(Some(Opened {
        adapter,
        poll_s: Some(k.poll_s),
    }))
}

/// What the admission and extender endpoints of `[schedulers.kubernetes]` read.
pub fn hooks(k: &KubernetesSection) -> std::sync::Arc<KubeHooks> {
    std::sync::Arc::new(KubeHooks {
        pods: k.pods.clone(),
        node_names: k.node_names.clone(),
    })
}
