//! Drift and reconcile: an enforced power limit that is not the desired one (driver
//! reload, reboot, a manual change, another limiter) is re-applied, with backoff when
//! re-applying does not hold; a GPU that keeps drifting is reported degraded.

use telemetry::agent_proto::Desired;
use telemetry::gpu_backend::GpuReading;
use telemetry::Timestamp;
use tracing::{error, info, warn};

use super::apply::Target;
use super::{bump, Core};

/// Re-applies after which a GPU that still drifts is reported degraded.
const DRIFT_DEGRADED: u32 = 3;

impl Core {
    /// Re-applies the desired limit of every GPU read that drifted from it; whether a
    /// setter changed anything (the GPUs are then read again).
    pub(super) fn reconcile(&mut self, readings: &[GpuReading], now: Timestamp) -> bool {
        let mut fixed = false;
        for r in readings {
            let Some(d) = self.p.desired.get(&r.index).cloned() else {
                continue;
            };
            let Some((want, t)) = self.expected(r, &d) else {
                continue;
            };
            let index = r.index;
            if (r.power_limit_w - want).abs() <= self.rules.drift_tolerance_w {
                if self.drift.remove(&index).is_some() {
                    info!(gpu = index, "the enforced power limit is as desired again");
                }
                self.failing.remove(&index);
                continue;
            }
            // back off when re-applying does not hold (something else limits the
            // GPU, or the setter keeps failing): 1 s, 2 s, 4 s ... up to 5 min
            let (attempts, next_try) = self.drift.get(&index).copied().unwrap_or((0, now));
            if now < next_try {
                continue;
            }
            fixed |= self.reapply(r, want, t, attempts, now);
        }
        fixed
    }

    /// The limit a GPU should show under its desired state, and the target that sets
    /// it (none for locked clocks, or a fail-safe that keeps the GPU as it is).
    fn expected(&mut self, r: &GpuReading, d: &Desired) -> Option<(f64, Target)> {
        match d {
            Desired::Limit { watts, .. } => Some((*watts, Target::Watts(*watts))),
            Desired::Default { .. } => Some((r.default_limit_w, Target::Default)),
            Desired::FailSafe {
                fail_safe, watts, ..
            } => match (fail_safe.as_str(), watts) {
                ("restore_default", _) => Some((r.default_limit_w, Target::Default)),
                ("cap", Some(w)) => Some((*w, Target::Watts(*w))),
                // a percent cap whose GPU could not be read when the lease ended
                ("cap", None) => self
                    .fail_safe_watts(r.index, Some(r))
                    .map(|w| (w, Target::Watts(w))),
                _ => None,
            },
            Desired::Clocks { .. } => None,
        }
    }

    /// Re-applies `t` to a GPU that drifted from `want`, after `attempts` earlier
    /// tries; whether the setter took it.
    fn reapply(
        &mut self,
        r: &GpuReading,
        want: f64,
        t: Target,
        attempts: u32,
        now: Timestamp,
    ) -> bool {
        let (index, found) = (r.index, r.power_limit_w);
        let o = self.set(index, t);
        bump(&mut self.counters, "drift_reapplied");
        // a re-apply that holds ends the matter; one that does not backs off
        let holds = o.error.is_none()
            && self.backend.read(index).is_ok_and(|after| {
                (after.power_limit_w - want).abs() <= self.rules.drift_tolerance_w
            });
        if holds {
            if attempts == 0 {
                warn!(gpu = index, found_w = found, desired_w = want, "the enforced power limit drifted (driver reload, reboot or a manual change); re-applied");
            } else {
                info!(
                    gpu = index,
                    desired_w = want,
                    "the enforced power limit holds again"
                );
            }
            self.drift.remove(&index);
            self.failing.remove(&index);
            return true;
        }
        let attempts = attempts + 1;
        let wait = f64::from(1u32 << attempts.min(9)).min(300.0);
        self.drift.insert(index, (attempts, now.plus_secs(wait)));
        if attempts >= DRIFT_DEGRADED {
            self.failing.insert(index);
        }
        let loud = attempts == 1 || attempts == DRIFT_DEGRADED;
        match &o.error {
            None if loud => {
                error!(gpu = index, found_w = found, desired_w = want, "the power limit does not hold after re-applying (another limiter?); retrying with backoff up to 5 min");
            }
            Some(e) if loud => {
                error!(gpu = index, found_w = found, desired_w = want, error = %e, "the enforced power limit drifted and could not be re-applied; retrying with backoff");
            }
            _ => {}
        }
        o.error.is_none()
    }
}
