//! Telemetry out: one read cycle ([`Core::tick`]) gives the node report the loop
//! publishes on the GPUs topic, and [`Core::health`] the health it publishes retained.

use std::collections::{BTreeMap, BTreeSet};

use telemetry::agent_proto::{
    Desired, GpuFailure, GpuReport, Health, NodeReport, Process, VERSION,
};
use telemetry::gpu_backend::{GpuError, GpuReading};
use telemetry::Timestamp;
use tracing::warn;

use super::{bump, Core};

fn error_index(e: &GpuError) -> Option<u32> {
    match e {
        GpuError::NotSupported { index, .. }
        | GpuError::NoPermission { index, .. }
        | GpuError::Lost { index }
        | GpuError::Other { index, .. } => Some(*index),
        GpuError::Unavailable(_) => None,
    }
}

impl Core {
    /// One read cycle: read, end leases, re-apply after drift, and the report to
    /// publish.
    pub fn tick(&mut self, now: Timestamp) -> NodeReport {
        self.log_limit
            .warn_suppressed("agent commands", (self.monotonic)());
        let mut all = self.read();
        self.expire(now);
        if !self.rules.dry_run {
            let readings: Vec<GpuReading> = all.iter().flatten().cloned().collect();
            if self.reconcile(&readings, now) {
                all = self.read();
            }
        }
        bump(&mut self.counters, "reads");
        self.seq += 1;
        self.report(all, now)
    }

    /// The node report of one read of every GPU.
    fn report(&mut self, all: Vec<Result<GpuReading, GpuError>>, now: Timestamp) -> NodeReport {
        let mut report = NodeReport {
            v: VERSION,
            node: self.rules.node.clone(),
            time: now,
            seq: self.seq,
            backend: self.backend.name().to_string(),
            gpus: Vec::new(),
            errors: Vec::new(),
        };
        let mut pods = self.pods_of(&all);
        for (n, r) in all.into_iter().enumerate() {
            match r {
                Ok(reading) => {
                    let processes = reading
                        .pids
                        .iter()
                        .map(|pid| Process {
                            pid: *pid,
                            job: crate::procs::job_of(&self.rules.proc_root, *pid),
                        })
                        .collect();
                    let desired = self.p.desired.get(&reading.index).cloned();
                    let pods = pods
                        .remove(reading.uuid.as_str())
                        .map(|p| p.into_iter().collect())
                        .unwrap_or_default();
                    report.gpus.push(GpuReport {
                        reading,
                        processes,
                        desired,
                        pods,
                    });
                }
                Err(e) => {
                    bump(&mut self.counters, "read_errors");
                    report.errors.push(GpuFailure {
                        index: error_index(&e).unwrap_or(n as u32),
                        reason: e.reason().into(),
                        message: e.to_string(),
                    });
                }
            }
        }
        report
    }

    /// The pods holding each GPU read (by UUID), from the kubelet's last answer while
    /// it is fresh enough. The device ids of an answer that no GPU has are counted
    /// (`pod_resources_unmatched_devices`) and logged, once per answer.
    fn pods_of(
        &mut self,
        all: &[Result<GpuReading, GpuError>],
    ) -> BTreeMap<String, BTreeSet<String>> {
        let Some(snap) = self
            .pods
            .as_ref()
            .and_then(|p| p.current((self.monotonic)()))
        else {
            return BTreeMap::new();
        };
        let uuids: BTreeSet<&str> = all.iter().flatten().map(|r| r.uuid.as_str()).collect();
        let (gpus, unmatched) = snap.mapping.assign(&uuids);
        if snap.generation != self.pods_counted {
            self.pods_counted = snap.generation;
            if !unmatched.is_empty() {
                *self
                    .counters
                    .entry("pod_resources_unmatched_devices")
                    .or_default() += unmatched.len() as u64;
                let mig = unmatched.iter().filter(|d| d.starts_with("MIG-")).count();
                if let Some(left_out) = self
                    .log_limit
                    .allow("pod_resources_unmatched", (self.monotonic)())
                {
                    warn!(devices = ?unmatched, mig, left_out, "the kubelet names devices that no GPU of this node has (a MIG device named by its own UUID, or a GPU that failed to read): their pods are not attributed");
                }
            }
        }
        gpus.into_iter().map(|(u, p)| (u.to_string(), p)).collect()
    }

    /// The agent's health now.
    pub fn health(&self, status: &str, now: Timestamp, detail: Option<String>) -> Health {
        let fs: Vec<u32> = self
            .p
            .desired
            .iter()
            .filter(|(_, d)| matches!(d, Desired::FailSafe { .. }))
            .map(|(i, _)| *i)
            .collect();
        let status = if status == "online" && (!fs.is_empty() || !self.failing.is_empty()) {
            "degraded"
        } else {
            status
        };
        Health {
            v: VERSION,
            node: self.rules.node.clone(),
            status: status.to_string(),
            time: Some(now),
            detail,
            backend: Some(self.backend.name().to_string()),
            dry_run: self.rules.dry_run,
            fail_safe: Some(self.rules.fail_safe.name().to_string()),
            fail_safe_gpus: fs,
            counters: self
                .counters
                .iter()
                .map(|(k, v)| (k.to_string(), *v))
                .chain(self.pods.iter().flat_map(|p| {
                    [
                        ("pod_resources_errors".to_string(), p.errors()),
                        ("pod_resources_answers".to_string(), p.answers()),
                    ]
                }))
                .collect(),
        }
    }
}
