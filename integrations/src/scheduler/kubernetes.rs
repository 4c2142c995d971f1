//! Kubernetes as a [`Scheduler`]: the pods behind powerplane's scheduling gate, polled
//! and let go by its reconciler.

use serde_json::json;
use telemetry::{Job, Timestamp};

use super::{
    Adapter, Applied, Commit, Counter, Desired, Pass, Requeues, Scheduler, SchedulerError,
    SchedulerId, View,
};
use crate::kubernetes::{KubeApi, KubeSync};

/// Kubernetes pods, through scheduling gates (`k8s:<namespace>/<name>`).
pub const ADAPTER: Adapter = Adapter {
    id: SchedulerId::new("kubernetes"),
    scheduler: "kubernetes",
    prefix: "k8s",
};

impl<A: KubeApi + Send> Scheduler for KubeSync<A> {
    fn id(&self) -> SchedulerId {
        ADAPTER.id
    }

    fn requeues(&self) -> Requeues {
        Requeues::Never("a Kubernetes pod cannot be requeued by powerplane; ignored")
    }

    fn poll(
        &mut self,
        now: Timestamp,
        _store: &mut dyn Commit,
    ) -> Result<Option<Vec<Job>>, SchedulerError> {
        Ok(Some(KubeSync::poll(self, now)?))
    }

    fn apply(&mut self, desired: &Desired, now: Timestamp, _store: &mut dyn Commit) -> Pass {
        self.tell_limits(&desired.limits);
        let errors = self.counters.errors;
        let applied = KubeSync::apply(self, &desired.holds, now)
            .into_iter()
            .map(|job| Applied {
                job,
                action: "release",
                detail: "scheduling gate removed: Kubernetes may schedule the pod".into(),
            })
            .collect();
        Pass {
            applied,
            failed: (self.counters.errors - errors) as u32,
        }
    }

    fn view(&self) -> View {
        View {
            held_by_us: self.gated().into_iter().collect(),
            hints: Default::default(),
        }
    }

    fn status(&self) -> serde_json::Value {
        json!({
            "api": self.api.url(),
            "watch": self.api.watch(),
            "gate": self.mapping.gate,
            "gated": self.gated(),
            "counters": self.counters,
        })
    }

    fn counters(&self) -> Vec<Counter> {
        let c = &self.counters;
        let w = self.api.watch();
        vec![
            (
                "kubernetes_polls_total",
                "Polls of the Kubernetes API for pods",
                c.polls as f64,
            ),
            (
                "kubernetes_poll_errors_total",
                "Polls of the Kubernetes API that failed",
                c.poll_errors as f64,
            ),
            (
                "kubernetes_gates_removed_total",
                "Scheduling gates powerplane removed",
                c.gates_removed as f64,
            ),
            (
                "kubernetes_errors_total",
                "Gate removals that failed (retried)",
                c.errors as f64,
            ),
            (
                "kubernetes_limits_told_total",
                "Events telling pods what their GPU power limit is held at",
                c.limits_told as f64,
            ),
            (
                "kubernetes_bad_limits_total",
                "Pods whose powerplane.io/gpu-power-limit is not a power limit (told as a Warning Event)",
                c.bad_limits as f64,
            ),
            (
                "kubernetes_pods_gated",
                "Pods powerplane's gate holds now",
                self.gated().len() as f64,
            ),
            (
                "kubernetes_watch_lists_total",
                "Lists of the watched pods (the first, and each relist after an expired watch)",
                w.lists as f64,
            ),
            (
                "kubernetes_watch_events_total",
                "Pod watch events taken (added, modified, deleted)",
                w.events as f64,
            ),
            (
                "kubernetes_watch_errors_total",
                "Pod watch or list failures (each retried after a backoff)",
                w.errors as f64,
            ),
            (
                "kubernetes_watched_pods",
                "Pods the watch holds in memory",
                w.pods as f64,
            ),
            (
                "kubernetes_events_recorded_total",
                "Events powerplane recorded on pods",
                w.recorded as f64,
            ),
            (
                "kubernetes_event_errors_total",
                "Events on pods that could not be recorded",
                w.record_errors as f64,
            ),
        ]
    }
}
