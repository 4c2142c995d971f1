//! GPU backends behind one trait: what a node agent reads from its GPUs and the few
//! setters it may call. NVML is one implementation (`sources::nvml`, in `telemetry-sources`); the simulator and
//! the fault-injecting backend live in the `orchestrator` crate.

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// One read of one GPU.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuReading {
    pub index: u32,
    pub uuid: String,
    pub name: String,
    pub power_w: f64,
    /// Energy counter since the driver loaded, in joules (`None`: not supported).
    pub energy_j: Option<f64>,
    pub temp_c: f64,
    pub sm_clock_mhz: f64,
    pub mem_clock_mhz: f64,
    pub utilization_pct: f64,
    /// The limit the GPU enforces now.
    pub power_limit_w: f64,
    pub default_limit_w: f64,
    pub min_limit_w: f64,
    pub max_limit_w: f64,
    /// Why the GPU runs slower than it could (`power_cap`, `hw_slowdown`, ...).
    pub throttle_reasons: Vec<String>,
    /// Processes using the GPU.
    pub pids: Vec<u32>,
    /// The SM clock range the GPU supports (MHz); 0 when unknown.
    #[serde(default)]
    pub sm_clock_min_mhz: f64,
    #[serde(default)]
    pub sm_clock_max_mhz: f64,
}

/// Why a GPU call failed.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum GpuError {
    #[error("gpu backend unavailable: {0}")]
    Unavailable(String),
    #[error("gpu {index}: {what} is not supported on this GPU")]
    NotSupported { index: u32, what: String },
    #[error("gpu {index}: no permission to {what} (setting limits needs root or CAP_SYS_ADMIN)")]
    NoPermission { index: u32, what: String },
    #[error("gpu {index} is lost (fell off the bus or the driver reset it)")]
    Lost { index: u32 },
    #[error("gpu {index}: {message}")]
    Other { index: u32, message: String },
}

impl GpuError {
    /// A short label for counters.
    pub fn reason(&self) -> &'static str {
        match self {
            GpuError::Unavailable(_) => "unavailable",
            GpuError::NotSupported { .. } => "not_supported",
            GpuError::NoPermission { .. } => "no_permission",
            GpuError::Lost { .. } => "gpu_lost",
            GpuError::Other { .. } => "other",
        }
    }
}

/// A node's GPUs. Calls may block (NVML does): callers keep them off latency-critical
/// paths.
pub trait GpuBackend: Send {
    /// `nvml`, `sim`, ...
    fn name(&self) -> &'static str;
    fn count(&mut self) -> Result<u32, GpuError>;
    fn read(&mut self, index: u32) -> Result<GpuReading, GpuError>;
    /// Sets the power limit (clamped by the caller into the GPU's constraints); returns
    /// the limit the GPU reports afterwards.
    fn set_power_limit(&mut self, index: u32, watts: f64) -> Result<f64, GpuError>;
    /// Restores the default power limit.
    fn reset_power_limit(&mut self, index: u32) -> Result<f64, GpuError>;

    /// Locks the SM clock into `min..=max` MHz (within the supported range, checked by
    /// the caller); returns the range in force.
    fn lock_sm_clocks(
        &mut self,
        index: u32,
        min_mhz: f64,
        max_mhz: f64,
    ) -> Result<(f64, f64), GpuError> {
        let _ = (min_mhz, max_mhz);
        Err(GpuError::NotSupported {
            index,
            what: "locking clocks".into(),
        })
    }
    /// Unlocks the SM clock.
    fn reset_sm_clocks(&mut self, index: u32) -> Result<(), GpuError> {
        Err(GpuError::NotSupported {
            index,
            what: "unlocking clocks".into(),
        })
    }

    /// Every GPU, each read or failed on its own.
    fn read_all(&mut self) -> Result<Vec<Result<GpuReading, GpuError>>, GpuError> {
        let n = self.count()?;
        Ok((0..n).map(|i| self.read(i)).collect())
    }
}
