//! The NVML backend: NVIDIA's management library, loaded at run time, so that the binary
//! runs on machines without a GPU and says clearly that NVML is missing.

use nvml_wrapper::bitmasks::device::ThrottleReasons;
use nvml_wrapper::enum_wrappers::device::{Clock, TemperatureSensor};
use nvml_wrapper::enums::device::GpuLockedClocksSetting;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::Nvml;

use telemetry::gpu_backend::{GpuBackend, GpuError, GpuReading};

pub struct NvmlBackend {
    nvml: Nvml,
}

impl NvmlBackend {
    /// Loads `libnvidia-ml.so.1` and initializes NVML.
    pub fn open() -> Result<Self, GpuError> {
        Nvml::init().map(|nvml| NvmlBackend { nvml }).map_err(|e| match e {
            NvmlError::LibloadingError(inner) => GpuError::Unavailable(format!("NVML (libnvidia-ml.so.1) could not be loaded: {inner}; is the NVIDIA driver installed?")),
            NvmlError::DriverNotLoaded => GpuError::Unavailable("the NVIDIA driver is not loaded".into()),
            other => GpuError::Unavailable(format!("NVML failed to start: {other}")),
        })
    }
}

fn map(index: u32, what: &str, e: NvmlError) -> GpuError {
    match e {
        NvmlError::NotSupported => GpuError::NotSupported {
            index,
            what: what.into(),
        },
        NvmlError::NoPermission => GpuError::NoPermission {
            index,
            what: what.into(),
        },
        NvmlError::GpuLost => GpuError::Lost { index },
        other => GpuError::Other {
            index,
            message: format!("{what}: {other}"),
        },
    }
}

impl GpuBackend for NvmlBackend {
    fn name(&self) -> &'static str {
        "nvml"
    }

    fn count(&mut self) -> Result<u32, GpuError> {
        self.nvml
            .device_count()
            .map_err(|e| GpuError::Unavailable(format!("device count: {e}")))
    }

    fn read(&mut self, index: u32) -> Result<GpuReading, GpuError> {
        let d = self
            .nvml
            .device_by_index(index)
            .map_err(|e| map(index, "open device", e))?;
        let mw = |r: Result<u32, NvmlError>, what: &str| {
            r.map(|v| f64::from(v) / 1000.0)
                .map_err(|e| map(index, what, e))
        };
        let constraints = d
            .power_management_limit_constraints()
            .map_err(|e| map(index, "power limit constraints", e))?;
        // the lowest graphics clock supported at the highest memory clock
        let sm_min = d
            .supported_memory_clocks()
            .ok()
            .and_then(|m| m.into_iter().max())
            .and_then(|m| d.supported_graphics_clocks(m).ok())
            .and_then(|g| g.into_iter().min())
            .map(f64::from)
            .unwrap_or(0.0);
        let throttle = d
            .current_throttle_reasons()
            .map(throttle_reason_names)
            .unwrap_or_default();
        Ok(GpuReading {
            index,
            uuid: d.uuid().unwrap_or_default(),
            name: d.name().unwrap_or_default(),
            power_w: mw(d.power_usage(), "power usage")?,
            // NVML counts millijoules since the driver loaded
            energy_j: d
                .total_energy_consumption()
                .ok()
                .map(|mj| mj as f64 / 1000.0),
            temp_c: d
                .temperature(TemperatureSensor::Gpu)
                .map(f64::from)
                .map_err(|e| map(index, "temperature", e))?,
            sm_clock_mhz: d.clock_info(Clock::SM).map(f64::from).unwrap_or(0.0),
            mem_clock_mhz: d.clock_info(Clock::Memory).map(f64::from).unwrap_or(0.0),
            utilization_pct: d
                .utilization_rates()
                .map(|u| f64::from(u.gpu))
                .unwrap_or(0.0),
            power_limit_w: mw(d.enforced_power_limit(), "enforced power limit")?,
            default_limit_w: mw(d.power_management_limit_default(), "default power limit")?,
            min_limit_w: f64::from(constraints.min_limit) / 1000.0,
            max_limit_w: f64::from(constraints.max_limit) / 1000.0,
            throttle_reasons: throttle,
            pids: d
                .running_compute_processes()
                .map(|p| p.iter().map(|p| p.pid).collect())
                .unwrap_or_default(),
            sm_clock_min_mhz: sm_min,
            sm_clock_max_mhz: d.max_clock_info(Clock::SM).map(f64::from).unwrap_or(0.0),
        })
    }

    fn set_power_limit(&mut self, index: u32, watts: f64) -> Result<f64, GpuError> {
        let mut d = self
            .nvml
            .device_by_index(index)
            .map_err(|e| map(index, "open device", e))?;
        d.set_power_management_limit((watts * 1000.0).round() as u32)
            .map_err(|e| map(index, "set the power limit", e))?;
        d.enforced_power_limit()
            .map(|v| f64::from(v) / 1000.0)
            .map_err(|e| map(index, "enforced power limit", e))
    }

    fn lock_sm_clocks(
        &mut self,
        index: u32,
        min_mhz: f64,
        max_mhz: f64,
    ) -> Result<(f64, f64), GpuError> {
        let mut d = self
            .nvml
            .device_by_index(index)
            .map_err(|e| map(index, "open device", e))?;
        d.set_gpu_locked_clocks(GpuLockedClocksSetting::Numeric {
            min_clock_mhz: min_mhz.round() as u32,
            max_clock_mhz: max_mhz.round() as u32,
        })
        .map_err(|e| map(index, "lock clocks", e))?;
        Ok((min_mhz.round(), max_mhz.round()))
    }

    fn reset_sm_clocks(&mut self, index: u32) -> Result<(), GpuError> {
        let mut d = self
            .nvml
            .device_by_index(index)
            .map_err(|e| map(index, "open device", e))?;
        d.reset_gpu_locked_clocks()
            .map_err(|e| map(index, "unlock clocks", e))
    }

    fn reset_power_limit(&mut self, index: u32) -> Result<f64, GpuError> {
        let default = {
            let d = self
                .nvml
                .device_by_index(index)
                .map_err(|e| map(index, "open device", e))?;
            d.power_management_limit_default()
                .map_err(|e| map(index, "default power limit", e))?
        };
        self.set_power_limit(index, f64::from(default) / 1000.0)
    }
}

/// NVML's throttle reasons (`nvmlClocksThrottleReason*`), by the names the agent
/// reports: NVML's own, in snake case.
const THROTTLE_REASONS: [(ThrottleReasons, &str); 9] = [
    (ThrottleReasons::GPU_IDLE, "gpu_idle"),
    (
        ThrottleReasons::APPLICATIONS_CLOCKS_SETTING,
        "applications_clocks_setting",
    ),
    (ThrottleReasons::SW_POWER_CAP, "sw_power_cap"),
    (ThrottleReasons::HW_SLOWDOWN, "hw_slowdown"),
    (ThrottleReasons::SYNC_BOOST, "sync_boost"),
    (ThrottleReasons::SW_THERMAL_SLOWDOWN, "sw_thermal_slowdown"),
    (ThrottleReasons::HW_THERMAL_SLOWDOWN, "hw_thermal_slowdown"),
    (
        ThrottleReasons::HW_POWER_BRAKE_SLOWDOWN,
        "hw_power_brake_slowdown",
    ),
    (
        ThrottleReasons::DISPLAY_CLOCK_SETTING,
        "display_clock_setting",
    ),
];

/// The names of the reasons set in `reasons`, read bit by bit (an unthrottled GPU has
/// none); a bit NVML documents after this list comes out as `unknown_0x...`.
pub fn throttle_reason_names(reasons: ThrottleReasons) -> Vec<String> {
    let bits = reasons.bits();
    let mut known = 0u64;
    let mut names = Vec::new();
    for (flag, name) in THROTTLE_REASONS {
        known |= flag.bits();
        if bits & flag.bits() != 0 {
            names.push(name.to_string());
        }
    }
    let mut rest = bits & !known;
    while rest != 0 {
        let bit = rest & rest.wrapping_neg();
        names.push(format!("unknown_{bit:#x}"));
        rest &= !bit;
    }
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn throttle_reasons_are_named_bit_by_bit() {
        // NVML's documented values (nvml.h): none 0, idle 0x1, sw power cap 0x4,
        // hw slowdown 0x8, sw thermal 0x20, hw thermal 0x40
        assert!(throttle_reason_names(ThrottleReasons::from_bits_retain(0)).is_empty());
        assert_eq!(
            throttle_reason_names(ThrottleReasons::from_bits_retain(0x4)),
            ["sw_power_cap"]
        );
        assert_eq!(
            throttle_reason_names(ThrottleReasons::from_bits_retain(0x1 | 0x8 | 0x20 | 0x40)),
            [
                "gpu_idle",
                "hw_slowdown",
                "sw_thermal_slowdown",
                "hw_thermal_slowdown"
            ]
        );
        assert_eq!(
            throttle_reason_names(ThrottleReasons::from_bits_retain(0x4 | 0x1000)),
            ["sw_power_cap", "unknown_0x1000"]
        );
        // every name once, snake case, no debug formatting
        for (flag, name) in THROTTLE_REASONS {
            assert_eq!(throttle_reason_names(flag), [name]);
            assert!(name.chars().all(|c| c.is_ascii_lowercase() || c == '_'));
        }
    }
}
