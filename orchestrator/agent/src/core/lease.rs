//! Leases and the fail-safe: a GPU whose lease ended unrenewed gets the declared
//! fail-safe (default limit, a safe cap, or left as it is), and a clean stop leaves
//! what `on_exit` says.

use telemetry::agent_proto::Desired;
use telemetry::gpu_backend::GpuReading;
use telemetry::Timestamp;
use tracing::{error, info, warn};

use super::apply::Target;
use super::{bump, Core, FailSafe, OnExit};

/// When a desired state's lease ends (a fail-safe has none).
pub(super) fn lease_of(d: &Desired) -> Option<Timestamp> {
    match d {
        Desired::Limit { lease_until, .. }
        | Desired::Clocks { lease_until, .. }
        | Desired::Default { lease_until, .. } => Some(*lease_until),
        Desired::FailSafe { .. } => None,
    }
}

impl Core {
    /// The fail-safe cap for a GPU, clamped into its constraints when they are known.
    pub(super) fn fail_safe_watts(
        &mut self,
        index: u32,
        reading: Option<&GpuReading>,
    ) -> Option<f64> {
        let FailSafe::Cap { watts, percent } = self.rules.fail_safe.clone() else {
            return None;
        };
        let c = match reading {
            Some(r) => Some(r.clone()),
            None => self.constraints(index).ok(),
        };
        let w = match (watts, percent, &c) {
            (Some(w), _, _) => w,
            (None, Some(p), Some(c)) => c.default_limit_w * p / 100.0,
            _ => return None,
        };
        Some(match &c {
            Some(c) if c.min_limit_w <= c.max_limit_w => w.clamp(c.min_limit_w, c.max_limit_w),
            _ => w,
        })
    }

    /// Ends the leases that ran out: the fail-safe applies to their GPUs.
    pub(super) fn expire(&mut self, now: Timestamp) {
        let ended: Vec<(u32, String, Timestamp)> = self
            .p
            .desired
            .iter()
            .filter_map(|(i, d)| match d {
                Desired::Limit {
                    command,
                    lease_until,
                    ..
                }
                | Desired::Clocks {
                    command,
                    lease_until,
                    ..
                }
                | Desired::Default {
                    command,
                    lease_until,
                } if *lease_until <= now => Some((*i, command.clone(), *lease_until)),
                _ => None,
            })
            .collect();
        if ended.is_empty() {
            return;
        }
        for (i, cmd, until) in ended {
            self.fail_safe(i, cmd, until, now);
        }
        self.save();
    }

    /// Applies the fail-safe to GPU `i`, whose lease from command `cmd` ended at
    /// `until`.
    fn fail_safe(&mut self, i: u32, cmd: String, until: Timestamp, now: Timestamp) {
        let fs = self.rules.fail_safe.clone();
        // what the fail-safe wants is kept even if setting it fails now: the drift
        // check retries it on the next reads
        let (watts, outcome) = match &fs {
            FailSafe::RestoreDefault => (None, Some(self.set(i, Target::Default))),
            FailSafe::Cap { .. } => {
                let w = self.fail_safe_watts(i, None);
                (w, w.map(|w| self.set(i, Target::Watts(w))))
            }
            FailSafe::Keep => (None, None),
        };
        match outcome.as_ref().and_then(|o| o.error.clone()) {
            Some(e) => {
                bump(&mut self.counters, "fail_safe_errors");
                error!(gpu = i, error = %e, "the fail-safe could not be applied yet; retrying on the next reads");
            }
            None => bump(&mut self.counters, "fail_safe_applied"),
        }
        warn!(node = %self.rules.node, gpu = i, command = %cmd, lease_until = %until, fail_safe = fs.name(), watts = ?watts,
            "no renewal from the controller: the lease ended, the fail-safe is in force");
        self.p.desired.insert(
            i,
            Desired::FailSafe {
                fail_safe: fs.name().into(),
                watts,
                since: now,
                after: cmd,
            },
        );
    }

    /// The wall clock stepped by `step_s` seconds (NTP setting it, `date -s`), as the
    /// monotonic clock tells: every lease, the arrival that commands are aged by and
    /// the drift retries move with it, so each keeps what was left of it. Without this
    /// a clock set back an hour would keep a cap an hour past its lease, and one set
    /// forward would end every lease at once.
    pub fn clock_stepped(&mut self, step_s: f64) {
        if !step_s.is_finite() || step_s == 0.0 {
            return;
        }
        bump(&mut self.counters, "clock_steps");
        warn!(node = %self.rules.node, step_s, "the wall clock stepped: the leases are moved with it");
        for d in self.p.desired.values_mut() {
            if let Desired::Limit { lease_until, .. }
            | Desired::Clocks { lease_until, .. }
            | Desired::Default { lease_until, .. } = d
            {
                *lease_until = lease_until.plus_secs(step_s);
            }
        }
        if let Some(n) = self.p.newest.as_mut() {
            n.arrived = n.arrived.plus_secs(step_s);
        }
        for (_, at) in self.drift.values_mut() {
            *at = at.plus_secs(step_s);
        }
        self.save();
    }

    /// What to leave behind on a clean stop.
    pub fn shutdown(&mut self, on_exit: OnExit, now: Timestamp) {
        let gpus: Vec<u32> = self.p.desired.keys().copied().collect();
        match on_exit {
            OnExit::Keep => info!("stopping; the GPUs keep their limits (on_exit = keep)"),
            OnExit::RestoreDefault => {
                for i in gpus {
                    let o = self.set(i, Target::Default);
                    info!(gpu = i, applied_w = ?o.applied_w, error = ?o.error, "stopping: default power limit restored");
                    self.p.desired.remove(&i);
                    self.p.issued.remove(&i);
                }
            }
            OnExit::FailSafe => {
                for d in self.p.desired.values_mut() {
                    if let Desired::Limit { lease_until, .. }
                    | Desired::Clocks { lease_until, .. }
                    | Desired::Default { lease_until, .. } = d
                    {
                        *lease_until = now;
                    }
                }
                self.expire(now);
            }
        }
        self.save();
    }
}
