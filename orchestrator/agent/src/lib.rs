//! `powerplane agent`: one per GPU node. It reads the node's GPUs every interval and
//! publishes what it reads, applies the signed, leased commands of the controller,
//! applies the declared fail-safe when a lease ends unrenewed, and re-applies the
//! desired state after drift. The wire protocol is `telemetry::agent_proto`.
//!
//! A crate of its own with a slim binary (`powerplane-agent`) that carries no store,
//! HTTP server, scheduler client or policy engine; `powerplane agent` runs the same code.
//!
//! # Layout
//!
//! - [`backends`]: the simulated and fault-injecting GPU backends (NVML is in
//!   `sources::nvml`);
//! - [`curves`], [`rng`], [`notify`], [`logs`], [`wall_clock`]: from `powerplane-common`
//!   (re-exported): the power-cap curves, the seeded generator, systemd's notify
//!   protocol, the logs, the clock;
//! - [`core`]: the state machine, free of MQTT and clock;
//! - [`procs`]: which job a GPU process belongs to;
//! - [`pods`]: which Kubernetes pods hold which GPUs (the kubelet's pod-resources API);
//! - [`run`]: the config file and the MQTT loop;
//! - [`cli`]: the command line both binaries share.
#![forbid(unsafe_code)]

pub mod backends;
pub mod cli;
pub mod core;
pub mod pods;
pub mod procs;
pub mod run;

pub use common::{curves, logs, notify, rng, wall_clock};

pub use backends::{Fault, Faulty, Shared, SimGpus};

use serde::Serialize;
use telemetry::gpu_backend::{GpuBackend, GpuError, GpuReading};

/// What `agent --once --json` prints.
#[derive(Debug, Serialize)]
pub struct Once {
    pub node: String,
    pub backend: &'static str,
    pub gpus: Vec<GpuReading>,
    pub errors: Vec<OnceError>,
}

#[derive(Debug, Serialize)]
pub struct OnceError {
    pub index: Option<u32>,
    pub reason: &'static str,
    pub message: String,
}

/// Reads every GPU once.
pub fn once(node: &str, backend: &mut dyn GpuBackend) -> Result<Once, GpuError> {
    let mut out = Once {
        node: node.to_string(),
        backend: backend.name(),
        gpus: Vec::new(),
        errors: Vec::new(),
    };
    for (i, r) in backend.read_all()?.into_iter().enumerate() {
        match r {
            Ok(g) => out.gpus.push(g),
            Err(e) => out.errors.push(OnceError {
                index: Some(i as u32),
                reason: e.reason(),
                message: e.to_string(),
            }),
        }
    }
    Ok(out)
}
