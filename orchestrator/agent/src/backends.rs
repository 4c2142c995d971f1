//! GPU backends of the node agent besides NVML (`sources::nvml`): the
//! simulated backend (power, energy, temperature and clocks that respond to load and
//! caps as Zeus measured on A40s) and a backend that injects faults, for tests.

use std::collections::BTreeMap;

use telemetry::gpu_backend::{GpuBackend, GpuError, GpuReading};
use telemetry::GpuModel;

use crate::curves::{self, Curve};
use crate::rng::Rng;

struct SimGpu {
    limit_w: f64,
    /// Locked SM clock range, if any.
    clocks: Option<(f64, f64)>,
    load: f64,
    curve: usize,
    energy_j: f64,
    power_w: f64,
}

/// GPUs that answer like real ones: under a cap they draw less and clock lower.
pub struct SimGpus {
    model: GpuModel,
    curves: Vec<Curve>,
    gpus: Vec<SimGpu>,
    /// Processes to report per GPU.
    pub pids: BTreeMap<u32, Vec<u32>>,
    /// Live mode: time passes with the wall clock (energy grows between reads).
    live_since: Option<std::time::Instant>,
}

impl SimGpus {
    /// `n` GPUs of `model`, with loads drawn from `seed`.
    pub fn new(n: u32, model: GpuModel, seed: u64) -> Self {
        let curves = curves::a40();
        let mut rng = Rng::new(seed);
        let gpus = (0..n)
            .map(|_| SimGpu {
                limit_w: model.default_w,
                clocks: None,
                load: rng.range(0.0, 1.0),
                curve: (rng.f64() * curves.len() as f64) as usize % curves.len().max(1),
                energy_j: 0.0,
                power_w: model.idle_w,
            })
            .collect();
        let mut s = SimGpus {
            model,
            curves,
            gpus,
            pids: BTreeMap::new(),
            live_since: None,
        };
        s.advance(0.0);
        s
    }

    /// GPUs on the wall clock: every read lets the time since the last one pass.
    pub fn live(mut self) -> Self {
        self.live_since = Some(std::time::Instant::now());
        self
    }

    /// Sets how busy a GPU is (0 idle, 1 flat out).
    pub fn set_load(&mut self, index: u32, load: f64) {
        if let Some(g) = self.gpus.get_mut(index as usize) {
            g.load = load.clamp(0.0, 1.0);
        }
        self.advance(0.0);
    }

    /// Lets `dt_s` seconds pass: power follows load and limit, energy accumulates.
    pub fn advance(&mut self, dt_s: f64) {
        let m = &self.model;
        for g in &mut self.gpus {
            let (p, speed) = self.curves[g.curve].at(g.limit_w / m.max_w);
            // a clock locked below where the cap lets it run cuts dynamic power with it
            let clock_share = g
                .clocks
                .map_or(1.0, |(_, hi)| (hi / (SIM_MAX_SM_MHZ * speed)).min(1.0));
            g.power_w = (m.idle_w + g.load * clock_share * (p * m.max_w - m.idle_w))
                .clamp(0.0, g.limit_w.max(m.idle_w));
            g.energy_j += g.power_w * dt_s;
        }
    }

    fn gpu(&self, index: u32) -> Result<&SimGpu, GpuError> {
        self.gpus.get(index as usize).ok_or(GpuError::Other {
            index,
            message: "no such GPU".into(),
        })
    }
}

impl GpuBackend for SimGpus {
    fn name(&self) -> &'static str {
        "sim"
    }

    fn count(&mut self) -> Result<u32, GpuError> {
        if let Some(t) = self.live_since {
            let now = std::time::Instant::now();
            self.advance((now - t).as_secs_f64());
            self.live_since = Some(now);
        }
        Ok(self.gpus.len() as u32)
    }

    fn read(&mut self, index: u32) -> Result<GpuReading, GpuError> {
        let m = self.model.clone();
        let g = self.gpu(index)?;
        let (_, speed) = self.curves[g.curve].at(g.limit_w / m.max_w);
        let capped = g.limit_w < m.default_w - 0.5 && g.load > 0.0;
        Ok(GpuReading {
            index,
            uuid: format!("GPU-sim-{index:04}"),
            name: format!("Simulated {}", m.name),
            power_w: g.power_w,
            energy_j: Some(g.energy_j),
            temp_c: 28.0 + 0.16 * g.power_w,
            sm_clock_mhz: if g.load > 0.0 {
                (SIM_MAX_SM_MHZ * speed)
                    .min(g.clocks.map_or(f64::MAX, |c| c.1))
                    .round()
            } else {
                SIM_MIN_SM_MHZ
            },
            mem_clock_mhz: if g.load > 0.0 { 7251.0 } else { 405.0 },
            utilization_pct: (g.load * 100.0).round(),
            power_limit_w: g.limit_w,
            default_limit_w: m.default_w,
            min_limit_w: m.min_w,
            max_limit_w: m.max_w,
            throttle_reasons: if capped {
                vec!["sw_power_cap".into()]
            } else {
                Vec::new()
            },
            pids: self.pids.get(&index).cloned().unwrap_or_default(),
            sm_clock_min_mhz: SIM_MIN_SM_MHZ,
            sm_clock_max_mhz: SIM_MAX_SM_MHZ,
        })
    }

    fn set_power_limit(&mut self, index: u32, watts: f64) -> Result<f64, GpuError> {
        let (min, max) = (self.model.min_w, self.model.max_w);
        if !(min..=max).contains(&watts) {
            // NVML answers INVALID_ARGUMENT: the caller must clamp first
            return Err(GpuError::Other {
                index,
                message: format!("power limit {watts} W is outside {min}..={max} W"),
            });
        }
        self.gpu(index)?;
        self.gpus[index as usize].limit_w = watts;
        self.advance(0.0);
        Ok(watts)
    }

    fn reset_power_limit(&mut self, index: u32) -> Result<f64, GpuError> {
        let d = self.model.default_w;
        self.set_power_limit(index, d)
    }

    fn lock_sm_clocks(
        &mut self,
        index: u32,
        min_mhz: f64,
        max_mhz: f64,
    ) -> Result<(f64, f64), GpuError> {
        if !(SIM_MIN_SM_MHZ <= min_mhz && min_mhz <= max_mhz && max_mhz <= SIM_MAX_SM_MHZ) {
            return Err(GpuError::Other {
                index,
                message: format!("clock range {min_mhz}..={max_mhz} MHz is not supported"),
            });
        }
        self.gpu(index)?;
        self.gpus[index as usize].clocks = Some((min_mhz, max_mhz));
        self.advance(0.0);
        Ok((min_mhz, max_mhz))
    }

    fn reset_sm_clocks(&mut self, index: u32) -> Result<(), GpuError> {
        self.gpu(index)?;
        self.gpus[index as usize].clocks = None;
        self.advance(0.0);
        Ok(())
    }
}

/// The simulated GPUs' supported SM clock range (an A40's).
pub const SIM_MIN_SM_MHZ: f64 = 210.0;
pub const SIM_MAX_SM_MHZ: f64 = 1740.0;

/// A failure to inject.
#[derive(Debug, Clone, PartialEq)]
pub enum Fault {
    /// Reads work; setting limits is not supported.
    NotSupported,
    /// Reads work; setting limits is refused.
    NoPermission,
    /// The GPU fell off the bus: everything fails.
    Lost,
    /// The driver reloaded: the limit is back at its default (once).
    DriverReload,
}

/// A backend whose GPUs fail as told.
pub struct Faulty<B: GpuBackend> {
    pub inner: B,
    pub faults: BTreeMap<u32, Fault>,
}

impl<B: GpuBackend> Faulty<B> {
    /// The error a setter meets on a GPU with a fault: `doing` ("setting the power
    /// limit") and `to_do` ("set the power limit") word the message.
    fn setter_fault(&self, index: u32, doing: &str, to_do: &str) -> Result<(), GpuError> {
        match self.faults.get(&index) {
            Some(Fault::Lost) => Err(GpuError::Lost { index }),
            Some(Fault::NotSupported) => Err(GpuError::NotSupported {
                index,
                what: doing.into(),
            }),
            Some(Fault::NoPermission) => Err(GpuError::NoPermission {
                index,
                what: to_do.into(),
            }),
            _ => Ok(()),
        }
    }
}

impl<B: GpuBackend> GpuBackend for Faulty<B> {
    fn name(&self) -> &'static str {
        "fault"
    }

    fn count(&mut self) -> Result<u32, GpuError> {
        self.inner.count()
    }

    fn read(&mut self, index: u32) -> Result<GpuReading, GpuError> {
        match self.faults.get(&index) {
            Some(Fault::Lost) => Err(GpuError::Lost { index }),
            Some(Fault::DriverReload) => {
                self.faults.remove(&index);
                self.inner.reset_power_limit(index)?;
                self.inner.read(index)
            }
            _ => self.inner.read(index),
        }
    }

    fn set_power_limit(&mut self, index: u32, watts: f64) -> Result<f64, GpuError> {
        self.setter_fault(index, "setting the power limit", "set the power limit")?;
        self.inner.set_power_limit(index, watts)
    }

    fn reset_power_limit(&mut self, index: u32) -> Result<f64, GpuError> {
        match self.faults.get(&index) {
            Some(Fault::Lost) => Err(GpuError::Lost { index }),
            _ => self.inner.reset_power_limit(index),
        }
    }

    fn lock_sm_clocks(
        &mut self,
        index: u32,
        min_mhz: f64,
        max_mhz: f64,
    ) -> Result<(f64, f64), GpuError> {
        self.setter_fault(index, "locking clocks", "lock clocks")?;
        self.inner.lock_sm_clocks(index, min_mhz, max_mhz)
    }

    fn reset_sm_clocks(&mut self, index: u32) -> Result<(), GpuError> {
        match self.faults.get(&index) {
            Some(Fault::Lost) => Err(GpuError::Lost { index }),
            _ => self.inner.reset_sm_clocks(index),
        }
    }
}

/// A backend shared between the agent that drives it and a test that looks at it or
/// changes it underneath (a reboot, someone running nvidia-smi).
pub struct Shared<B: GpuBackend>(pub std::sync::Arc<std::sync::Mutex<B>>);

impl<B: GpuBackend> Clone for Shared<B> {
    fn clone(&self) -> Self {
        Shared(self.0.clone())
    }
}

impl<B: GpuBackend> Shared<B> {
    pub fn new(b: B) -> Self {
        Shared(std::sync::Arc::new(std::sync::Mutex::new(b)))
    }
    pub fn lock(&self) -> std::sync::MutexGuard<'_, B> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl<B: GpuBackend> GpuBackend for Shared<B> {
    fn name(&self) -> &'static str {
        self.lock().name()
    }
    fn count(&mut self) -> Result<u32, GpuError> {
        self.lock().count()
    }
    fn read(&mut self, index: u32) -> Result<GpuReading, GpuError> {
        self.lock().read(index)
    }
    fn set_power_limit(&mut self, index: u32, watts: f64) -> Result<f64, GpuError> {
        self.lock().set_power_limit(index, watts)
    }
    fn reset_power_limit(&mut self, index: u32) -> Result<f64, GpuError> {
        self.lock().reset_power_limit(index)
    }
    fn lock_sm_clocks(
        &mut self,
        index: u32,
        min_mhz: f64,
        max_mhz: f64,
    ) -> Result<(f64, f64), GpuError> {
        self.lock().lock_sm_clocks(index, min_mhz, max_mhz)
    }
    fn reset_sm_clocks(&mut self, index: u32) -> Result<(), GpuError> {
        self.lock().reset_sm_clocks(index)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::once;

    fn a40() -> GpuModel {
        GpuModel::builtin("A40").expect("a40")
    }

    #[test]
    fn a_capped_busy_gpu_draws_less_clocks_lower_and_says_why() {
        let mut s = SimGpus::new(2, a40(), 1);
        s.set_load(0, 1.0);
        let free = s.read(0).expect("read");
        assert_eq!(free.power_limit_w, 300.0);
        assert!(free.throttle_reasons.is_empty());
        assert_eq!(s.set_power_limit(0, 150.0), Ok(150.0));
        let capped = s.read(0).expect("read");
        assert!(
            capped.power_w <= 150.0 && capped.power_w < free.power_w,
            "{} -> {}",
            free.power_w,
            capped.power_w
        );
        assert!(capped.sm_clock_mhz <= free.sm_clock_mhz);
        assert_eq!(capped.throttle_reasons, vec!["sw_power_cap"]);
        assert_eq!(s.reset_power_limit(0), Ok(300.0));
        assert_eq!(s.read(0).expect("read").power_limit_w, 300.0);
    }

    #[test]
    fn limits_outside_the_constraints_are_refused_and_energy_only_grows() {
        let mut s = SimGpus::new(1, a40(), 2);
        assert!(s.set_power_limit(0, 50.0).is_err() && s.set_power_limit(0, 301.0).is_err());
        let e0 = s.read(0).expect("read").energy_j.expect("counter");
        s.advance(10.0);
        let e1 = s.read(0).expect("read").energy_j.expect("counter");
        assert!(e1 > e0);
    }

    #[test]
    fn injected_faults_fail_as_real_gpus_do() {
        let mut f = Faulty {
            inner: SimGpus::new(4, a40(), 3),
            faults: BTreeMap::new(),
        };
        f.faults.insert(0, Fault::NotSupported);
        f.faults.insert(1, Fault::NoPermission);
        f.faults.insert(2, Fault::Lost);
        assert_eq!(
            f.set_power_limit(0, 200.0).map_err(|e| e.reason()),
            Err("not_supported")
        );
        assert_eq!(
            f.set_power_limit(1, 200.0).map_err(|e| e.reason()),
            Err("no_permission")
        );
        assert_eq!(f.read(2).map_err(|e| e.reason()), Err("gpu_lost"));
        assert!(f.read(0).is_ok(), "reads still work");
        f.set_power_limit(3, 200.0).expect("set");
        f.faults.insert(3, Fault::DriverReload);
        assert_eq!(
            f.read(3).expect("read").power_limit_w,
            300.0,
            "a driver reload restores the default"
        );
        let report = once("n1", &mut f).expect("once");
        assert_eq!(report.gpus.len(), 3);
        assert_eq!(report.errors.len(), 1);
        assert_eq!(report.errors[0].reason, "gpu_lost");
    }
}
