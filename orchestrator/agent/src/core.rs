//! The agent's state machine, free of MQTT and of the clock: it checks and applies
//! commands, holds every GPU to its desired state, ends leases with the fail-safe,
//! re-applies after drift, and persists what it must remember across a restart.
//!
//! Every setter call goes through [`Core::set`], which clamps into the GPU's own
//! constraints first (safety invariant 1) and, in dry-run mode, only logs.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use telemetry::agent_proto::{
    Ack, AckStatus, Action, Command, Desired, GpuFailure, GpuOutcome, GpuReport, Health, Key,
    NodeReport, Process, VERSION,
};
use telemetry::gpu_backend::{GpuBackend, GpuError, GpuReading};
use telemetry::Timestamp;
use tracing::{error, info, warn};

/// What the agent does to a GPU whose lease ended unrenewed.
#[derive(Debug, Clone, PartialEq)]
pub enum FailSafe {
    /// Default power limit, clocks unlocked.
    RestoreDefault,
    /// A safe cap: watts, or percent of the default limit.
    Cap {
        watts: Option<f64>,
        percent: Option<f64>,
    },
    /// Leave the GPU as it is.
    Keep,
}

impl FailSafe {
    pub fn name(&self) -> &'static str {
        match self {
            FailSafe::RestoreDefault => "restore_default",
            FailSafe::Cap { .. } => "cap",
            FailSafe::Keep => "keep",
        }
    }
}

/// The rules the agent checks commands against.
#[derive(Debug, Clone)]
pub struct Rules {
    pub node: String,
    pub key: Key,
    /// Longest lease accepted; longer ones are shortened to it.
    pub max_lease_s: f64,
    /// A command issued longer ago than this is refused as expired.
    pub max_age_s: f64,
    /// A command issued further in the future than this is refused.
    pub max_skew_s: f64,
    pub fail_safe: FailSafe,
    pub dry_run: bool,
    /// An enforced limit this far from the desired one is drift, and is re-applied.
    pub drift_tolerance_w: f64,
    /// Where processes are looked up (`/proc`).
    pub proc_root: PathBuf,
}

impl Rules {
    pub fn new(node: &str, key: Key) -> Self {
        Rules {
            node: node.to_string(),
            key,
            max_lease_s: 900.0,
            max_age_s: 60.0,
            max_skew_s: 30.0,
            fail_safe: FailSafe::RestoreDefault,
            dry_run: false,
            drift_tolerance_w: 2.0,
            proc_root: PathBuf::from("/proc"),
        }
    }
}

/// What a GPU should run at.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Target {
    Watts(f64),
    Clocks(f64, f64),
    Default,
}

/// What the agent remembers across restarts (the state file).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Persisted {
    pub desired: BTreeMap<u32, Desired>,
    /// When the command behind each GPU's desired state was issued (older commands for
    /// that GPU are superseded).
    #[serde(default)]
    pub issued: BTreeMap<u32, Timestamp>,
    /// Recently accepted command ids with their issue time (replay protection).
    #[serde(default)]
    pub seen: BTreeMap<String, Timestamp>,
    /// GPUs whose clocks this agent locked.
    #[serde(default)]
    pub clocks_locked: BTreeSet<u32>,
    /// The highest fencing epoch of the commands accepted (0: none carried one): a
    /// command from a lower epoch comes from a deposed leader and is refused.
    #[serde(default)]
    pub epoch: u64,
}

/// What the agent does when told to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnExit {
    RestoreDefault,
    Keep,
    FailSafe,
}

pub struct Core {
    rules: Rules,
    backend: Box<dyn GpuBackend>,
    state_file: Option<PathBuf>,
    p: Persisted,
    /// The last good reading of each GPU (for constraints).
    last: BTreeMap<u32, GpuReading>,
    /// GPUs whose desired limit does not hold (degraded).
    failing: BTreeSet<u32>,
    /// Re-applies after drift per GPU: attempts so far and when to try again.
    drift: BTreeMap<u32, (u32, Timestamp)>,
    log_limit: telemetry::log_limit::LogLimiter,
    pub counters: BTreeMap<&'static str, u64>,
    seq: u64,
}

/// Re-applies after which a GPU that still drifts is reported degraded.
const DRIFT_DEGRADED: u32 = 3;

fn bump(c: &mut BTreeMap<&'static str, u64>, k: &'static str) {
    *c.entry(k).or_default() += 1;
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

impl Core {
    /// Loads the state file (when given), reads the GPUs and brings each one to what it
    /// should be: the desired state while its lease lasts (after a reboot or a driver
    /// reload the limits are back at default), the fail-safe once it has ended.
    pub fn start(
        rules: Rules,
        backend: Box<dyn GpuBackend>,
        state_file: Option<PathBuf>,
        now: Timestamp,
    ) -> Core {
        let p = state_file.as_deref().map(load_state).unwrap_or_default();
        let mut core = Core {
            rules,
            backend,
            state_file,
            p,
            last: BTreeMap::new(),
            failing: BTreeSet::new(),
            drift: BTreeMap::new(),
            log_limit: telemetry::log_limit::LogLimiter::new(std::time::Duration::from_secs(60)),
            counters: BTreeMap::new(),
            seq: 0,
        };
        core.read();
        let restored: Vec<(u32, Desired)> = core
            .p
            .desired
            .iter()
            .map(|(i, d)| (*i, d.clone()))
            .collect();
        for (i, d) in restored {
            if let Some(t) = target_of(&d) {
                if lease_of(&d).is_none_or(|l| l > now) {
                    info!(gpu = i, desired = ?d, "restoring the desired state from the state file");
                    let _ = core.set(i, t);
                }
            }
        }
        core.expire(now);
        core
    }

    pub fn rules(&self) -> &Rules {
        &self.rules
    }

    pub fn desired(&self) -> &BTreeMap<u32, Desired> {
        &self.p.desired
    }

    /// Reads every GPU; keeps the good readings.
    fn read(&mut self) -> Vec<Result<GpuReading, GpuError>> {
        let all = match self.backend.read_all() {
            Ok(a) => a,
            Err(e) => {
                bump(&mut self.counters, "read_errors");
                return vec![Err(e)];
            }
        };
        for r in all.iter().flatten() {
            self.last.insert(r.index, r.clone());
        }
        all
    }

    fn constraints(&mut self, index: u32) -> Result<GpuReading, GpuError> {
        if let Some(r) = self.last.get(&index) {
            return Ok(r.clone());
        }
        let r = self.backend.read(index)?;
        self.last.insert(index, r.clone());
        Ok(r)
    }

    /// Brings one GPU to `target`, clamped into its constraints. The only path to a
    /// setter.
    fn set(&mut self, index: u32, target: Target) -> GpuOutcome {
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
        let dry = self.rules.dry_run;
        let result: Result<(), GpuError> = (|| {
            match target {
                Target::Watts(w) => {
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
                }
                Target::Clocks(lo, hi) => {
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
                }
                Target::Default => {
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
                }
            }
            Ok(())
        })();
        if let Err(e) = result {
            bump(&mut self.counters, "apply_errors");
            out.error = Some(e.to_string());
        } else if !dry {
            bump(&mut self.counters, "setter_calls");
            if let Some(w) = out.applied_w {
                if let Some(r) = self.last.get_mut(&index) {
                    r.power_limit_w = w;
                }
            }
        }
        out
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

    fn ack(&self, id: Option<String>, now: Timestamp, reason: &str, detail: String) -> Ack {
        Ack {
            v: VERSION,
            node: self.rules.node.clone(),
            id,
            time: now,
            status: AckStatus::Rejected,
            reason: Some(reason.to_string()),
            detail: Some(detail),
            lease_until: None,
            gpus: Vec::new(),
        }
    }

    fn reject(
        &mut self,
        id: Option<String>,
        now: Timestamp,
        reason: &'static str,
        detail: String,
    ) -> Ack {
        bump(&mut self.counters, "commands_rejected");
        *self.counters.entry(reject_counter(reason)).or_default() += 1;
        // a flood of garbage on the command topic must not flood the journal: one line
        // per reason per minute, with how many were left out (all are counted)
        if let Some(left_out) = self.log_limit.allow(reason, std::time::Instant::now()) {
            warn!(node = %self.rules.node, id = ?id, reason, left_out, "command rejected: {detail}");
        }
        self.ack(id, now, reason, detail)
    }

    /// What the agent answers on the wire to a message on its command topic: nothing
    /// to one that fails its signature check (unsigned, bad signature, unreadable),
    /// which is counted (`rejected_*`, `commands_unanswered`) and logged rate-limited
    /// (an answer would let anyone make the agent publish at the rate they send
    /// garbage); else the command's ack, as [`Core::handle`] gives it.
    ///
    /// A command from a deposed leader (an epoch below the highest seen) is refused as
    /// `stale_epoch`, counted, and not answered either: the old leader must not take
    /// the refusal for its agents' attention.
    pub fn answer(&mut self, bytes: &[u8], now: Timestamp) -> Option<Ack> {
        if let Err(e) = Command::open(&self.rules.key, bytes) {
            self.reject(None, now, e.reason(), e.to_string());
            bump(&mut self.counters, "commands_unanswered");
            return None;
        }
        let ack = self.handle(bytes, now);
        if ack.reason.as_deref() == Some(STALE_EPOCH) {
            bump(&mut self.counters, "commands_unanswered");
            return None;
        }
        Some(ack)
    }

    /// Checks and applies one command as received; the answer is its ack.
    pub fn handle(&mut self, bytes: &[u8], now: Timestamp) -> Ack {
        let cmd = match Command::open(&self.rules.key, bytes) {
            Ok(c) => c,
            Err(e) => {
                // no id: an unauthenticated id must not let anyone answer for a real command
                return self.reject(None, now, e.reason(), e.to_string());
            }
        };
        let id = Some(cmd.id.clone());
        if cmd.v != VERSION {
            return self.reject(
                id,
                now,
                "unsupported_version",
                format!("protocol version {} (this agent speaks {VERSION})", cmd.v),
            );
        }
        if cmd.node != self.rules.node {
            return self.reject(
                id,
                now,
                "wrong_node",
                format!(
                    "the command is for node {:?}, this is {:?}",
                    cmd.node, self.rules.node
                ),
            );
        }
        let age = now.secs_since(cmd.issued_at);
        if age > self.rules.max_age_s {
            return self.reject(
                id,
                now,
                "expired",
                format!(
                    "issued {age:.1} s ago, more than the {} s accepted",
                    self.rules.max_age_s
                ),
            );
        }
        if -age > self.rules.max_skew_s {
            return self.reject(
                id,
                now,
                "from_future",
                format!(
                    "issued {:.1} s in the future (clock skew over {} s)",
                    -age, self.rules.max_skew_s
                ),
            );
        }
        if let Some(epoch) = cmd.epoch {
            if epoch < self.p.epoch {
                return self.reject(
                    id,
                    now,
                    STALE_EPOCH,
                    format!(
                        "command {} is from epoch {epoch}; a leader of epoch {} has commanded since",
                        cmd.id, self.p.epoch
                    ),
                );
            }
        }
        if self.p.seen.contains_key(&cmd.id) {
            return self.reject(
                id,
                now,
                "replayed",
                format!("command {} was already received", cmd.id),
            );
        }
        self.p.seen.insert(cmd.id.clone(), cmd.issued_at);
        if let Some(epoch) = cmd.epoch.filter(|e| *e > self.p.epoch) {
            info!(node = %self.rules.node, epoch, was = self.p.epoch, "commands from a new leader");
            self.p.epoch = epoch;
        }
        let horizon = now.plus_secs(-(self.rules.max_age_s + self.rules.max_skew_s));
        self.p.seen.retain(|_, t| *t >= horizon);

        if !(cmd.lease_s.is_finite() && cmd.lease_s > 0.0) {
            return self.reject(
                id,
                now,
                "out_of_range",
                format!("lease_s must be above 0, got {}", cmd.lease_s),
            );
        }
        let lease_s = cmd.lease_s.min(self.rules.max_lease_s);
        let lease_until = cmd.issued_at.min(now).plus_secs(lease_s);
        if lease_until <= now {
            return self.reject(
                id,
                now,
                "expired",
                format!("its {lease_s} s lease ended at {lease_until}, before it arrived"),
            );
        }
        let target = match &cmd.action {
            Action::SetPowerLimit { watts, percent, .. } => match (watts, percent) {
                (Some(w), None) if w.is_finite() && *w > 0.0 && *w <= 5000.0 => Target::Watts(*w),
                (None, Some(p)) if p.is_finite() && *p > 0.0 && *p <= 200.0 => Target::Watts(f64::NAN), // per GPU below
                (Some(_), Some(_)) | (None, None) => return self.reject(id, now, "out_of_range", "set_power_limit needs exactly one of watts or percent".into()),
                _ => return self.reject(id, now, "out_of_range", format!("power limit {watts:?} W / {percent:?} % is not a power limit any GPU takes (0 < W <= 5000, 0 < % <= 200)")),
            },
            Action::LockSmClocks { min_mhz, max_mhz, .. } => {
                if min_mhz.is_finite() && max_mhz.is_finite() && *min_mhz > 0.0 && min_mhz <= max_mhz && *max_mhz <= 10_000.0 {
                    Target::Clocks(*min_mhz, *max_mhz)
                } else {
                    return self.reject(id, now, "out_of_range", format!("clock range {min_mhz}..{max_mhz} MHz is not a range (0 < min <= max <= 10000)"));
                }
            }
            Action::Reset { .. } => Target::Default,
        };
        let count = match self.backend.count() {
            Ok(n) => n,
            Err(e) => return self.reject(id, now, "gpu_error", e.to_string()),
        };
        let gpus: Vec<u32> = (0..count)
            .filter(|i| cmd.action.gpus().contains(*i))
            .collect();
        let missing: Vec<u32> = match cmd.action.gpus() {
            telemetry::agent_proto::GpuSel::List(l) => {
                l.iter().copied().filter(|i| *i >= count).collect()
            }
            _ => Vec::new(),
        };
        if gpus.is_empty() {
            return self.reject(
                id,
                now,
                "no_such_gpu",
                format!("the command names no GPU this node has (it has {count})"),
            );
        }
        let mut outcomes: Vec<GpuOutcome> = missing
            .iter()
            .map(|i| GpuOutcome {
                index: *i,
                applied_w: None,
                applied_mhz: None,
                clamped: false,
                error: Some(format!(
                    "no_such_gpu: GPU {i} does not exist (this node has {count})"
                )),
            })
            .collect();
        let mut superseded = 0;
        for i in gpus {
            if self.p.issued.get(&i).is_some_and(|t| *t > cmd.issued_at) {
                superseded += 1;
                outcomes.push(GpuOutcome {
                    index: i,
                    applied_w: None,
                    applied_mhz: None,
                    clamped: false,
                    error: Some("superseded: a newer command is in force".into()),
                });
                continue;
            }
            let t = match (&cmd.action, target) {
                (
                    Action::SetPowerLimit {
                        percent: Some(p), ..
                    },
                    _,
                ) => match self.constraints(i) {
                    Ok(c) => Target::Watts(c.default_limit_w * p / 100.0),
                    Err(e) => {
                        outcomes.push(GpuOutcome {
                            index: i,
                            applied_w: None,
                            applied_mhz: None,
                            clamped: false,
                            error: Some(e.to_string()),
                        });
                        continue;
                    }
                },
                (_, t) => t,
            };
            let o = self.set(i, t);
            if o.error.is_none() {
                let c = cmd.id.clone();
                let d = match (t, o.applied_w, o.applied_mhz) {
                    (Target::Watts(_), Some(w), _) => Desired::Limit {
                        watts: w,
                        command: c,
                        lease_until,
                    },
                    (Target::Clocks(..), _, Some((lo, hi))) => Desired::Clocks {
                        min_mhz: lo,
                        max_mhz: hi,
                        command: c,
                        lease_until,
                    },
                    _ => Desired::Default {
                        command: c,
                        lease_until,
                    },
                };
                self.p.desired.insert(i, d);
                self.p.issued.insert(i, cmd.issued_at);
                self.failing.remove(&i);
                self.drift.remove(&i);
            }
            outcomes.push(o);
        }
        let failed = outcomes.iter().filter(|o| o.error.is_some()).count();
        let status = if self.rules.dry_run && failed == 0 {
            AckStatus::DryRun
        } else if failed == 0 {
            AckStatus::Applied
        } else if failed < outcomes.len() {
            AckStatus::Partial
        } else {
            AckStatus::Rejected
        };
        let reason = match status {
            AckStatus::Rejected if superseded == outcomes.len() => Some("superseded".to_string()),
            AckStatus::Rejected => Some("gpu_error".to_string()),
            _ => None,
        };
        if status == AckStatus::Rejected {
            bump(&mut self.counters, "commands_rejected");
            *self
                .counters
                .entry(reject_counter(reason.as_deref().unwrap_or("")))
                .or_default() += 1;
        } else {
            bump(&mut self.counters, "commands_applied");
        }
        info!(node = %self.rules.node, id = %cmd.id, epoch = ?cmd.epoch, action = ?cmd.action, status = ?status, lease_until = %lease_until, "command");
        self.save();
        Ack {
            v: VERSION,
            node: self.rules.node.clone(),
            id,
            time: now,
            status,
            reason,
            detail: None,
            lease_until: Some(lease_until),
            gpus: outcomes,
        }
    }

    /// The fail-safe cap for a GPU, clamped into its constraints when they are known.
    fn fail_safe_watts(&mut self, index: u32, reading: Option<&GpuReading>) -> Option<f64> {
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
    fn expire(&mut self, now: Timestamp) {
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
        self.save();
    }

    /// One read cycle: read, end leases, re-apply after drift, and the report to
    /// publish.
    pub fn tick(&mut self, now: Timestamp) -> NodeReport {
        self.log_limit
            .warn_suppressed("agent commands", std::time::Instant::now());
        let mut all = self.read();
        self.expire(now);
        if !self.rules.dry_run {
            let mut fixed = false;
            let readings: Vec<GpuReading> = all.iter().flatten().cloned().collect();
            for r in &readings {
                let Some(d) = self.p.desired.get(&r.index).cloned() else {
                    continue;
                };
                let expected = match &d {
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
                };
                let Some((want, t)) = expected else { continue };
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
                let found = r.power_limit_w;
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
                    fixed = true;
                    continue;
                }
                let attempts = attempts + 1;
                let wait = f64::from(1u32 << attempts.min(9)).min(300.0);
                self.drift.insert(index, (attempts, now.plus_secs(wait)));
                if attempts >= DRIFT_DEGRADED {
                    self.failing.insert(index);
                }
                match &o.error {
                    None if attempts == 1 || attempts == DRIFT_DEGRADED => {
                        error!(gpu = index, found_w = found, desired_w = want, "the power limit does not hold after re-applying (another limiter?); retrying with backoff up to 5 min");
                        fixed = true;
                    }
                    None => fixed = true,
                    Some(e) if attempts == 1 || attempts == DRIFT_DEGRADED => {
                        error!(gpu = index, found_w = found, desired_w = want, error = %e, "the enforced power limit drifted and could not be re-applied; retrying with backoff");
                    }
                    Some(_) => {}
                }
            }
            if fixed {
                all = self.read();
            }
        }
        bump(&mut self.counters, "reads");
        self.seq += 1;
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
                            job: super::procs::job_of(&self.rules.proc_root, *pid),
                        })
                        .collect();
                    let desired = self.p.desired.get(&reading.index).cloned();
                    report.gpus.push(GpuReport {
                        reading,
                        processes,
                        desired,
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

    fn save(&mut self) {
        // a dry run must not leave a desired state that a later real run would apply
        if self.rules.dry_run {
            return;
        }
        let Some(path) = &self.state_file else { return };
        if let Err(e) = save_state(path, &self.p) {
            bump(&mut self.counters, "state_file_errors");
            error!(path = %path.display(), error = %e, "cannot write the agent's state file; a restart would forget the desired state");
        }
    }
}

/// The reason (and counter suffix) of a command from a deposed leader.
pub const STALE_EPOCH: &str = "stale_epoch";

fn reject_counter(reason: &str) -> &'static str {
    match reason {
        "malformed" => "rejected_malformed",
        "unsigned" => "rejected_unsigned",
        "bad_signature" => "rejected_bad_signature",
        "unsupported_version" => "rejected_unsupported_version",
        "wrong_node" => "rejected_wrong_node",
        "expired" => "rejected_expired",
        "from_future" => "rejected_from_future",
        "replayed" => "rejected_replayed",
        STALE_EPOCH => "rejected_stale_epoch",
        "superseded" => "rejected_superseded",
        "out_of_range" => "rejected_out_of_range",
        "no_such_gpu" => "rejected_no_such_gpu",
        _ => "rejected_gpu_error",
    }
}

fn error_index(e: &GpuError) -> Option<u32> {
    match e {
        GpuError::NotSupported { index, .. }
        | GpuError::NoPermission { index, .. }
        | GpuError::Lost { index }
        | GpuError::Other { index, .. } => Some(*index),
        GpuError::Unavailable(_) => None,
    }
}

fn target_of(d: &Desired) -> Option<Target> {
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

fn lease_of(d: &Desired) -> Option<Timestamp> {
    match d {
        Desired::Limit { lease_until, .. }
        | Desired::Clocks { lease_until, .. }
        | Desired::Default { lease_until, .. } => Some(*lease_until),
        Desired::FailSafe { .. } => None,
    }
}

/// Reads the state file; a missing one is an empty state, a corrupt one is set aside
/// (renamed `.corrupt`) and logged.
pub fn load_state(path: &Path) -> Persisted {
    match std::fs::read(path) {
        Ok(b) => match serde_json::from_slice(&b) {
            Ok(p) => p,
            Err(e) => {
                let aside = path.with_extension("corrupt");
                error!(path = %path.display(), error = %e, moved_to = %aside.display(), "the agent's state file is corrupt; starting without a desired state");
                let _ = std::fs::rename(path, aside);
                Persisted::default()
            }
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Persisted::default(),
        Err(e) => {
            error!(path = %path.display(), error = %e, "cannot read the agent's state file; starting without a desired state");
            Persisted::default()
        }
    }
}

/// Writes the state file atomically (temporary file, fsync, rename).
pub fn save_state(path: &Path, p: &Persisted) -> std::io::Result<()> {
    use std::io::Write;
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(&serde_json::to_vec_pretty(p).map_err(std::io::Error::other)?)?;
    f.sync_all()?;
    std::fs::rename(tmp, path)
}

#[cfg(test)]
#[path = "core_tests.rs"]
mod tests;
