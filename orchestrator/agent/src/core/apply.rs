//! The only path to a GPU's setters: [`Core::set`] clamps every target into the
//! GPU's own constraints first (safety invariant 1) and, in dry-run mode, only logs.
//! Commands, the fail-safe, drift and shutdown all end here.

use telemetry::agent_proto::{Desired, GpuOutcome};
use telemetry::gpu_backend::{GpuError, GpuReading};
use tracing::info;

use super::{bump, Core};

/// What a GPU should run at.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Target {
    Watts(f64),
    Clocks(f64, f64),
    Default,
}

/// `v` within `lo..=hi`, and whether it had to move. An empty or NaN range is an
/// error: the GPU's constraints are unknown, and nothing is set.
fn clamp(v: f64, lo: f64, hi: f64, index: u32) -> Result<(f64, bool), GpuError> {
    if lo
        .partial_cmp(&hi)
        .is_none_or(|o| o == std::cmp::Ordering::Greater)
        || !v.is_finite()
    {
        return Err(GpuError::Other {
            index,
            message: format!(
                "cannot place {v} within {lo}..={hi}: the GPU's constraints are unknown"
            ),
        });
    }
    let c = v.clamp(lo, hi);
    Ok((c, (c - v).abs() > 1e-9))
}

/// The target a desired state asks for (none for a fail-safe that keeps the GPU as
/// it is, or a percent cap not yet placed).
pub(super) fn target_of(d: &Desired) -> Option<Target> {
    match d {
        Desired::Limit { watts, .. } => Some(Target::Watts(*watts)),
        Desired::Clocks {
            min_mhz, max_mhz, ..
        } => Some(Target::Clocks(*min_mhz, *max_mhz)),
        Desired::Default { .. } => Some(Target::Default),
        Desired::FailSafe {
            fail_safe, watts, ..
        } => match (fail_safe.as_str(), watts) {
            ("restore_default", _) => Some(Target::Default),
            ("cap", Some(w)) => Some(Target::Watts(*w)),
            _ => None,
        },
    }
}

/// An outcome for GPU `index` that nothing was applied to, with why.
pub(super) fn not_applied(index: u32, error: String) -> GpuOutcome {
    GpuOutcome {
        index,
        applied_w: None,
        applied_mhz: None,
        clamped: false,
        error: Some(error),
    }
}

impl Core {
    /// The GPU's constraints: its last good reading, or a fresh one.
    pub(super) fn constraints(&mut self, index: u32) -> Result<GpuReading, GpuError> {
        if let Some(r) = self.last.get(&index) {
            return Ok(r.clone());
        }
        let r = self.backend.read(index)?;
        self.last.insert(index, r.clone());
        Ok(r)
    }

    /// Brings one GPU to `target`, clamped into its constraints. The only path to a
    /// setter.
    pub(super) fn set(&mut self, index: u32, target: Target) -> GpuOutcome {
        let mut out = GpuOutcome {
            index,
            applied_w: None,
            applied_mhz: None,
            clamped: false,
            error: None,
        };
        let c = match self.constraints(index) {
            Ok(c) => c,
            Err(e) => {
                out.error = Some(e.to_string());
                return out;
            }
        };
        let result = match target {
            Target::Watts(w) => self.set_watts(&c, w, &mut out),
            Target::Clocks(lo, hi) => self.lock_clocks(&c, lo, hi, &mut out),
            Target::Default => self.restore_default(&c, &mut out),
        };
        if let Err(e) = result {
            bump(&mut self.counters, "apply_errors");
            out.error = Some(e.to_string());
        } else if !self.rules.dry_run {
            bump(&mut self.counters, "setter_calls");
            if let Some(w) = out.applied_w {
                if let Some(r) = self.last.get_mut(&index) {
                    r.power_limit_w = w;
                }
            }
        }
        out
    }

    fn set_watts(&mut self, c: &GpuReading, w: f64, out: &mut GpuOutcome) -> Result<(), GpuError> {
        let (index, dry) = (out.index, self.rules.dry_run);
        let (w, clamped) = clamp(w, c.min_limit_w, c.max_limit_w, index)?;
        out.clamped = clamped;
        if self.p.clocks_locked.contains(&index) {
            self.unlock(index, dry)?;
        }
        out.applied_w = Some(if dry {
            info!(gpu = index, watts = w, "dry-run: would set the power limit");
            w
        } else {
            self.backend.set_power_limit(index, w)?
        });
        Ok(())
    }

    fn lock_clocks(
        &mut self,
        c: &GpuReading,
        lo: f64,
        hi: f64,
        out: &mut GpuOutcome,
    ) -> Result<(), GpuError> {
        let (index, dry) = (out.index, self.rules.dry_run);
        if c.sm_clock_max_mhz.is_nan() || c.sm_clock_max_mhz <= 0.0 {
            return Err(GpuError::NotSupported {
                index,
                what: "locking clocks (the supported clock range is unknown)".into(),
            });
        }
        let (lo_c, hi_c) = (c.sm_clock_min_mhz, c.sm_clock_max_mhz);
        let (lo2, a) = clamp(lo, lo_c, hi_c, index)?;
        let (hi2, b) = clamp(hi, lo2, hi_c, index)?;
        out.clamped = a || b;
        out.applied_mhz = Some(if dry {
            info!(
                gpu = index,
                min_mhz = lo2,
                max_mhz = hi2,
                "dry-run: would lock SM clocks"
            );
            (lo2, hi2)
        } else {
            let r = self.backend.lock_sm_clocks(index, lo2, hi2)?;
            self.p.clocks_locked.insert(index);
            r
        });
        Ok(())
    }

    fn restore_default(&mut self, c: &GpuReading, out: &mut GpuOutcome) -> Result<(), GpuError> {
        let (index, dry) = (out.index, self.rules.dry_run);
        if self.p.clocks_locked.contains(&index) {
            self.unlock(index, dry)?;
        }
        out.applied_w = Some(if dry {
            info!(
                gpu = index,
                watts = c.default_limit_w,
                "dry-run: would restore the default power limit"
            );
            c.default_limit_w
        } else {
            self.backend.reset_power_limit(index)?
        });
        Ok(())
    }

    fn unlock(&mut self, index: u32, dry: bool) -> Result<(), GpuError> {
        if dry {
            info!(gpu = index, "dry-run: would unlock SM clocks");
        } else {
            self.backend.reset_sm_clocks(index)?;
            self.p.clocks_locked.remove(&index);
        }
        Ok(())
    }
}
