//! Commands from the controller: the checks a command passes (signature, version,
//! node, fencing epoch, replay, age by the controller's clock, lease, range, GPUs), its application GPU by
//! GPU, and the ack that answers it. Refusals are counted and logged rate-limited.

use telemetry::agent_proto::{
    Ack, AckStatus, Action, Command, Desired, GpuOutcome, GpuSel, VERSION,
};
use telemetry::Timestamp;
use tracing::{info, warn};

use super::apply::{not_applied, Target};
use super::state::Stamped;
use super::{bump, Core};

/// The reason (and counter suffix) of a command from a deposed leader.
pub const STALE_EPOCH: &str = "stale_epoch";
/// The reason (and counter suffix) of a command without an epoch once a leader's
/// epoch has been seen.
pub const NO_EPOCH: &str = "no_epoch";

/// Why a command is refused as a whole: the ack's reason and detail.
struct Refused {
    reason: &'static str,
    detail: String,
}

fn refused<T>(reason: &'static str, detail: String) -> Result<T, Refused> {
    Err(Refused { reason, detail })
}

fn reject_counter(reason: &str) -> &'static str {
    match reason {
        "malformed" => "rejected_malformed",
        "unsigned" => "rejected_unsigned",
        "bad_signature" => "rejected_bad_signature",
        "unsupported_version" => "rejected_unsupported_version",
        "wrong_node" => "rejected_wrong_node",
        "expired" => "rejected_expired",
        "replayed" => "rejected_replayed",
        STALE_EPOCH => "rejected_stale_epoch",
        NO_EPOCH => "rejected_no_epoch",
        "superseded" => "rejected_superseded",
        "out_of_range" => "rejected_out_of_range",
        "no_such_gpu" => "rejected_no_such_gpu",
        _ => "rejected_gpu_error",
    }
}

/// The target an action asks for, once its values are checked (a percent cap is
/// placed per GPU, by [`Core::gpu_target`]).
fn requested(action: &Action) -> Result<Target, Refused> {
    Ok(match action {
        Action::SetPowerLimit { watts, percent, .. } => match (watts, percent) {
            (Some(w), None) if w.is_finite() && *w > 0.0 && *w <= 5000.0 => Target::Watts(*w),
            (None, Some(p)) if p.is_finite() && *p > 0.0 && *p <= 200.0 => Target::Watts(f64::NAN), // per GPU below
            (Some(_), Some(_)) | (None, None) => return refused("out_of_range", "set_power_limit needs exactly one of watts or percent".into()),
            _ => return refused("out_of_range", format!("power limit {watts:?} W / {percent:?} % is not a power limit any GPU takes (0 < W <= 5000, 0 < % <= 200)")),
        },
        Action::LockSmClocks { min_mhz, max_mhz, .. } => {
            if min_mhz.is_finite() && max_mhz.is_finite() && *min_mhz > 0.0 && min_mhz <= max_mhz && *max_mhz <= 10_000.0 {
                Target::Clocks(*min_mhz, *max_mhz)
            } else {
                return refused("out_of_range", format!("clock range {min_mhz}..{max_mhz} MHz is not a range (0 < min <= max <= 10000)"))
            }
        }
        Action::Reset { .. } => Target::Default,
    })
}

/// The desired state a GPU keeps after `o` applied `t` for command `command`.
fn desired_after(t: Target, o: &GpuOutcome, command: String, lease_until: Timestamp) -> Desired {
    match (t, o.applied_w, o.applied_mhz) {
        (Target::Watts(_), Some(w), _) => Desired::Limit {
            watts: w,
            command,
            lease_until,
        },
        (Target::Clocks(..), _, Some((lo, hi))) => Desired::Clocks {
            min_mhz: lo,
            max_mhz: hi,
            command,
            lease_until,
        },
        _ => Desired::Default {
            command,
            lease_until,
        },
    }
}

impl Core {
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
        if let Some(left_out) = self.log_limit.allow(reason, (self.monotonic)()) {
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
        match self.apply_command(&cmd, now) {
            Ok(ack) => ack,
            Err(r) => self.reject(Some(cmd.id.clone()), now, r.reason, r.detail),
        }
    }

    /// A signed command, checked step by step and applied; its ack.
    fn apply_command(&mut self, cmd: &Command, now: Timestamp) -> Result<Ack, Refused> {
        let age = self.check_envelope(cmd, now)?;
        self.remember(cmd, now);
        let lease_until = self.lease_until(cmd, now, age)?;
        let target = requested(&cmd.action)?;
        let (gpus, mut outcomes) = self.gpus_named(cmd)?;
        let superseded = self.apply_to(cmd, target, lease_until, gpus, &mut outcomes);
        Ok(self.settle(cmd, now, lease_until, outcomes, superseded))
    }

    /// Version, node, fencing epoch, replay and age; the command's age (s) by the
    /// controller's clock.
    fn check_envelope(&mut self, cmd: &Command, now: Timestamp) -> Result<f64, Refused> {
        if cmd.v != VERSION {
            return refused(
                "unsupported_version",
                format!("protocol version {} (this agent speaks {VERSION})", cmd.v),
            );
        }
        if cmd.node != self.rules.node {
            return refused(
                "wrong_node",
                format!(
                    "the command is for node {:?}, this is {:?}",
                    cmd.node, self.rules.node
                ),
            );
        }
        match cmd.epoch {
            Some(epoch) if epoch < self.p.epoch => {
                return refused(
                    STALE_EPOCH,
                    format!(
                        "command {} is from epoch {epoch}; a leader of epoch {} has commanded since",
                        cmd.id, self.p.epoch
                    ),
                );
            }
            // fencing has no exceptions: a controller without [ha] (or an old one)
            // beside the leader must not command
            None if self.p.epoch > 0 => {
                return refused(
                    NO_EPOCH,
                    format!(
                        "command {} carries no fencing epoch, and a leader of epoch {} commands this node: a controller without [ha] beside the replicas? (a site that leaves [ha] removes this agent's state_file once, see docs/deployment.md)",
                        cmd.id, self.p.epoch
                    ),
                );
            }
            _ => {}
        }
        if self.p.seen.contains_key(&cmd.id) {
            return refused(
                "replayed",
                format!("command {} was already received", cmd.id),
            );
        }
        let age = self.age_of(cmd, now);
        if age > self.rules.max_age_s {
            return refused(
                "expired",
                format!(
                    "issued {age:.1} s ago by the controller's clock (its stamp against the newest command accepted), more than the {} s accepted",
                    self.rules.max_age_s
                ),
            );
        }
        self.note_skew(cmd, now);
        Ok(age)
    }

    /// How long ago the controller issued `cmd`, by the controller's clock as its
    /// signed stamps tell: how far the stamp is behind the newest one accepted, plus
    /// the time since that one arrived (at most `max_age_s`, so that a step of the
    /// agent's own clock ages no command by more). The first command, and the first of
    /// a new leader, is 0 s old: its lease runs from its arrival.
    ///
    /// The agent's own clock never refuses a command: a clock minutes slow or fast
    /// would otherwise keep every command out and the GPUs uncapped.
    fn age_of(&self, cmd: &Command, now: Timestamp) -> f64 {
        let Some(newest) = self.p.newest else {
            return 0.0;
        };
        if cmd.epoch.is_some_and(|e| e > self.p.epoch) {
            return 0.0;
        }
        let elapsed = now
            .secs_since(newest.arrived)
            .clamp(0.0, self.rules.max_age_s);
        newest.issued_at.secs_since(cmd.issued_at) + elapsed
    }

    /// Counts, and logs rate-limited, a command stamped further than `max_skew_s` from
    /// the agent's clock at its arrival: it is applied (its lease runs from arrival),
    /// but the agent's clock, or the controller's, is off.
    fn note_skew(&mut self, cmd: &Command, now: Timestamp) {
        let ahead_s = cmd.issued_at.secs_since(now);
        if ahead_s.abs() <= self.rules.max_skew_s {
            return;
        }
        bump(&mut self.counters, "commands_clock_skewed");
        if let Some(left_out) = self.log_limit.allow("clock_skew", (self.monotonic)()) {
            warn!(node = %self.rules.node, id = %cmd.id, ahead_s, max_clock_skew_s = self.rules.max_skew_s, left_out,
                "a command is stamped {ahead_s:.1} s from this agent's clock: applied with its lease from its arrival; check the clocks (NTP) of this node and the controller");
        }
    }

    /// Remembers the command's id (replays), its stamp (the controller's clock) and a
    /// new leader's epoch; forgets the ids too old to come back (their stamps are
    /// refused as expired).
    fn remember(&mut self, cmd: &Command, now: Timestamp) {
        self.p.seen.insert(cmd.id.clone(), cmd.issued_at);
        let new_epoch = cmd.epoch.is_some_and(|e| e > self.p.epoch);
        if let Some(epoch) = cmd.epoch.filter(|e| *e > self.p.epoch) {
            info!(node = %self.rules.node, epoch, was = self.p.epoch, "commands from a new leader");
            self.p.epoch = epoch;
        }
        if new_epoch || self.p.newest.is_none_or(|n| cmd.issued_at > n.issued_at) {
            self.p.newest = Some(Stamped {
                issued_at: cmd.issued_at,
                arrived: now,
            });
        }
        if let Some(newest) = self.p.newest {
            let horizon = newest.issued_at.plus_secs(-self.rules.max_age_s);
            self.p.seen.retain(|_, t| *t >= horizon);
        }
    }

    /// When the command's lease ends on the agent's clock: its arrival plus the lease
    /// (shortened to the longest accepted) less its age by the controller's clock. A
    /// stamp ahead of the agent's clock gets no longer lease than that.
    fn lease_until(&self, cmd: &Command, now: Timestamp, age: f64) -> Result<Timestamp, Refused> {
        if !(cmd.lease_s.is_finite() && cmd.lease_s > 0.0) {
            return refused(
                "out_of_range",
                format!("lease_s must be above 0, got {}", cmd.lease_s),
            );
        }
        let lease_s = cmd.lease_s.min(self.rules.max_lease_s);
        let lease_until = now.plus_secs(lease_s - age.max(0.0));
        if lease_until <= now {
            return refused(
                "expired",
                format!("its {lease_s} s lease ended before it arrived (issued {age:.1} s ago by the controller's clock)"),
            );
        }
        Ok(lease_until)
    }

    /// The GPUs of this node the command names, and an outcome for each one it names
    /// that this node lacks.
    fn gpus_named(&mut self, cmd: &Command) -> Result<(Vec<u32>, Vec<GpuOutcome>), Refused> {
        let count = match self.backend.count() {
            Ok(n) => n,
            Err(e) => return refused("gpu_error", e.to_string()),
        };
        let gpus: Vec<u32> = (0..count)
            .filter(|i| cmd.action.gpus().contains(*i))
            .collect();
        let missing: Vec<u32> = match cmd.action.gpus() {
            GpuSel::List(l) => l.iter().copied().filter(|i| *i >= count).collect(),
            _ => Vec::new(),
        };
        if gpus.is_empty() {
            return refused(
                "no_such_gpu",
                format!("the command names no GPU this node has (it has {count})"),
            );
        }
        let outcomes = missing
            .iter()
            .map(|i| {
                not_applied(
                    *i,
                    format!("no_such_gpu: GPU {i} does not exist (this node has {count})"),
                )
            })
            .collect();
        Ok((gpus, outcomes))
    }

    /// Applies the command to each GPU a newer command does not hold; how many were
    /// superseded.
    fn apply_to(
        &mut self,
        cmd: &Command,
        target: Target,
        lease_until: Timestamp,
        gpus: Vec<u32>,
        outcomes: &mut Vec<GpuOutcome>,
    ) -> usize {
        let mut superseded = 0;
        for i in gpus {
            if self.p.issued.get(&i).is_some_and(|t| *t > cmd.issued_at) {
                superseded += 1;
                outcomes.push(not_applied(
                    i,
                    "superseded: a newer command is in force".into(),
                ));
                continue;
            }
            let t = match self.gpu_target(cmd, i, target) {
                Ok(t) => t,
                Err(o) => {
                    outcomes.push(o);
                    continue;
                }
            };
            let o = self.set(i, t);
            if o.error.is_none() {
                let d = desired_after(t, &o, cmd.id.clone(), lease_until);
                self.p.desired.insert(i, d);
                self.p.issued.insert(i, cmd.issued_at);
                self.failing.remove(&i);
                self.drift.remove(&i);
            }
            outcomes.push(o);
        }
        superseded
    }

    /// The command's target for GPU `i`: a percent cap is placed on the GPU's default
    /// limit, which needs its constraints.
    fn gpu_target(&mut self, cmd: &Command, i: u32, target: Target) -> Result<Target, GpuOutcome> {
        match &cmd.action {
            Action::SetPowerLimit {
                percent: Some(p), ..
            } => match self.constraints(i) {
                Ok(c) => Ok(Target::Watts(c.default_limit_w * p / 100.0)),
                Err(e) => Err(not_applied(i, e.to_string())),
            },
            _ => Ok(target),
        }
    }

    /// The ack of an applied command, from its GPUs' outcomes; counted, logged and
    /// saved.
    fn settle(
        &mut self,
        cmd: &Command,
        now: Timestamp,
        lease_until: Timestamp,
        outcomes: Vec<GpuOutcome>,
        superseded: usize,
    ) -> Ack {
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
        info!(node = %self.rules.node, id = %cmd.id, epoch = ?cmd.epoch, action = ?cmd.action, status = ?status, issued_at = %cmd.issued_at, lease_until = %lease_until, "command");
        self.save();
        Ack {
            v: VERSION,
            node: self.rules.node.clone(),
            id: Some(cmd.id.clone()),
            time: now,
            status,
            reason,
            detail: None,
            lease_until: Some(lease_until),
            gpus: outcomes,
        }
    }
}
