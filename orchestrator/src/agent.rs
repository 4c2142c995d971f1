//! The node agent's GPU side: the simulated backend (power, energy, temperature and
//! clocks that respond to load and caps as Zeus measured on A40s) and a backend that
//! injects faults, for tests. NVML is in `telemetry::sources::nvml`.
//!
//! `powerplane agent --once --json` reads every GPU once and prints it, for checking a
//! node. Publishing over MQTT, commands, leases and the fail-safe come next.

use std::collections::BTreeMap;

use serde::Serialize;
use telemetry::gpu_backend::{GpuBackend, GpuError, GpuReading};
use telemetry::GpuModel;

use crate::sim::curves::{self, Curve};
use crate::sim::rng::Rng;

struct SimGpu {
    limit_w: f64,
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
}

impl SimGpus {
    /// `n` GPUs of `model`, with loads drawn from `seed`.
    pub fn new(n: u32, model: GpuModel, seed: u64) -> Self {
        let curves = curves::a40();
        let mut rng = Rng::new(seed);
        let gpus = (0..n)
            .map(|_| SimGpu {
                limit_w: model.default_w,
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
        };
        s.advance(0.0);
        s
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
            let (p, _) = self.curves[g.curve].at(g.limit_w / m.max_w);
            g.power_w =
                (m.idle_w + g.load * (p * m.max_w - m.idle_w)).clamp(0.0, g.limit_w.max(m.idle_w));
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
                (1740.0 * speed).round()
            } else {
                210.0
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
            pids: Vec::new(),
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
}

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
        match self.faults.get(&index) {
            Some(Fault::Lost) => Err(GpuError::Lost { index }),
            Some(Fault::NotSupported) => Err(GpuError::NotSupported {
                index,
                what: "setting the power limit".into(),
            }),
            Some(Fault::NoPermission) => Err(GpuError::NoPermission {
                index,
                what: "set the power limit".into(),
            }),
            _ => self.inner.set_power_limit(index, watts),
        }
    }

    fn reset_power_limit(&mut self, index: u32) -> Result<f64, GpuError> {
        match self.faults.get(&index) {
            Some(Fault::Lost) => Err(GpuError::Lost { index }),
            _ => self.inner.reset_power_limit(index),
        }
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;

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
