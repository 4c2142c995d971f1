//! Telemetry out: one read cycle ([`Core::tick`]) gives the node report the loop
//! publishes on the GPUs topic, and [`Core::health`] the health it publishes retained.

use telemetry::agent_proto::{
    Desired, GpuFailure, GpuReport, Health, NodeReport, Process, VERSION,
};
use telemetry::gpu_backend::{GpuError, GpuReading};
use telemetry::Timestamp;

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
                    report.gpus.push(GpuReport {
                        reading,
                        processes,
                        desired,
                        pods: Vec::new(),
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
                .collect(),
        }
    }
}
