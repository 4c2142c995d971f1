//! One run of a rule over its targets: for each target, its memory stepped (the `for`
//! timers, on and off with the minimum hold and `on_stale`), what the active rule wants
//! (caps with their ramp, clock locks, holds, releases, requeues, suspensions) and the
//! explanations the audit keeps.

use std::sync::Arc;

use telemetry::fasthash::FnvMap;
use telemetry::{EntityId, Job, JobState, Timestamp};

use super::conditions::Ctx;
use super::texts::{target_name, Texts};
use super::{Tri, Values, Wants, Why};
use crate::index::Index;
use crate::plan::{RuleMemories, RuleMemory, Timers};
use crate::rules::{OnStale, Rule, RuleAction, ScopeKind};

/// One run of a rule over its targets: what it wants so far and its next memory.
pub(super) struct Visit<'a, 'i> {
    rule: &'a Rule,
    ctx: Ctx<'a, 'i>,
    texts: &'a Texts<'a>,
    hold_margin_s: f64,
    max_defer_s: f64,
    now: Timestamp,
    pub(super) wants: Wants,
    pub(super) next: RuleMemories,
    /// Racks a cap (or clock lock) of this rule is already explained in (see the
    /// actions in [`Visit::target`]).
    explained: Vec<bool>,
    /// Whether the targets are GPUs (whose memory keeps each one's position).
    pub(super) by_gpu: bool,
    /// The prior memory, in the order of the targets when they are the same as at the
    /// last evaluation: each target's entry is found at `cursor`; the rest (targets
    /// added or gone, a memory read from the store in name order) by `hashed`, a map
    /// made then.
    prior: &'a [(Arc<str>, RuleMemory)],
    cursor: usize,
    hashed: Option<FnvMap<&'a str, usize>>,
}

impl<'a, 'i> Visit<'a, 'i> {
    /// A run of `rule` with its prior `memory`; `hold_margin_s` and `max_defer_s` bound
    /// its holds as the price rule's do.
    pub(super) fn new(
        rule: &'a Rule,
        ctx: Ctx<'a, 'i>,
        texts: &'a Texts<'a>,
        memory: &'a RuleMemories,
        (hold_margin_s, max_defer_s): (f64, f64),
        now: Timestamp,
    ) -> Self {
        let index = ctx.index;
        Visit {
            rule,
            ctx,
            texts,
            hold_margin_s,
            max_defer_s,
            now,
            wants: Wants::default(),
            // in target order, as the next evaluation visits them
            next: match rule.scope {
                // room for the GPUs' positions too; with no prior memory (the first
                // evaluation), for every GPU rather than a list grown by doubling (room
                // never written to is not made resident)
                ScopeKind::Gpu if memory.is_empty() => {
                    RuleMemories::with_capacity_gpus(index.gpus_picked_at_most(&rule.select))
                }
                ScopeKind::Gpu => RuleMemories::with_capacity_gpus(memory.len()),
                _ => RuleMemories::with_capacity(memory.len()),
            },
            explained: vec![false; index.site.racks.len()],
            by_gpu: false,
            prior: memory.entries(),
            cursor: 0,
            hashed: None,
        }
    }
}

impl Visit<'_, '_> {
    /// The position in the prior memory of a target's entry (by its name, a job's id).
    pub(super) fn find(&mut self, key: &str) -> Option<usize> {
        let prior = self.prior;
        let found = match prior.get(self.cursor) {
            Some((k, _)) if **k == *key => Some(self.cursor),
            _ => self
                .hashed
                .get_or_insert_with(|| {
                    prior
                        .iter()
                        .enumerate()
                        .map(|(i, (k, _))| (&**k, i))
                        .collect()
                })
                .get(key)
                .copied(),
        };
        if let Some(i) = found {
            self.cursor = i + 1;
        }
        found
    }

    /// Runs the rule for one target: the entity (the site for a job), its GPUs, the job,
    /// and the position of its entry in the prior memory.
    pub(super) fn target(
        &mut self,
        entity: &EntityId,
        gpus: &[usize],
        job: Option<&Job>,
        found: Option<usize>,
    ) {
        let prior_entry = found.map(|i| &self.prior[i]);
        let (rule, now) = (self.rule, self.now);
        let target = Target { entity, gpus, job };
        let mut mem = prior_entry.map_or_else(|| fresh_memory(now), |(_, m)| m.clone());
        let (stale, switched_on) = step_memory(&self.ctx, rule, &target, &mut mem, now);
        // texts for the audit, made only for targets that explain what the rule does
        let seen = Seen {
            ctx: &self.ctx,
            texts: self.texts,
            target,
            stale,
            assumed: stale && rule.on_stale == OnStale::AssumeWorst && mem.active,
            switched_on,
        };
        // what the active rule does
        let mut keep = mem.active || !mem.when_true.is_empty() || !mem.release_true.is_empty();
        let wants = &mut self.wants;
        match rule.action {
            RuleAction::CapW(_) | RuleAction::CapPct(_) => {
                keep |= seen.cap(rule, &mut mem, now, wants, &mut self.explained);
            }
            RuleAction::LockClocks(mhz) => {
                if mem.active {
                    seen.lock_clocks(mhz, wants, &mut self.explained);
                }
            }
            RuleAction::Hold | RuleAction::Release | RuleAction::Requeue | RuleAction::Suspend => {
                if let (true, Some(j)) = (mem.active, job) {
                    let limits = (self.hold_margin_s, self.max_defer_s);
                    seen.act_on_job(rule, j, &mut mem, limits, now, wants);
                }
            }
        }
        if keep {
            // memory is keyed by the target's name (a job's id): the rule fixes the kind
            let name = prior_entry.map_or_else(
                || Arc::from(job.map_or(entity.name.as_str(), |j| j.id.as_str())),
                |(k, _)| k.clone(),
            );
            match gpus {
                [g] if self.by_gpu => self.next.push_gpu(name, mem, *g),
                _ => self.next.push(name, mem),
            }
        }
    }
}

/// A target's memory before the rule has seen it.
fn fresh_memory(now: Timestamp) -> RuleMemory {
    RuleMemory {
        active: false,
        since: now,
        when_true: Timers::new(),
        release_true: Timers::new(),
        level: None,
        level_at: now,
        done: false,
    }
}

/// What a rule runs for: the entity (the site for a job), its GPUs and the job.
#[derive(Clone, Copy)]
struct Target<'t> {
    entity: &'t EntityId,
    gpus: &'t [usize],
    job: Option<&'t Job>,
}

/// Steps a target's memory: its `when` and `release` conditions with their timers, and
/// the rule on (at once) or off (after the minimum hold; not on a stale signal under
/// `hold_last`). Returns whether a signal was stale and whether the rule switched on.
fn step_memory(
    ctx: &Ctx<'_, '_>,
    rule: &Rule,
    t: &Target<'_>,
    mem: &mut RuleMemory,
    now: Timestamp,
) -> (bool, bool) {
    let Target { entity, gpus, job } = *t;
    let w = match &rule.when {
        None => Tri::True,
        Some(c) => ctx.top(&c.cond, entity, gpus, job, &mut mem.when_true),
    };
    let r = match &rule.release {
        Some(c) => ctx.top(&c.cond, entity, gpus, job, &mut mem.release_true),
        None => match w {
            Tri::True => Tri::False,
            Tri::False => Tri::True,
            Tri::Unknown => Tri::Unknown,
        },
    };
    let stale = w == Tri::Unknown || r == Tri::Unknown;
    let (on, off) = match rule.on_stale {
        OnStale::AssumeWorst => (w != Tri::False, r == Tri::True),
        OnStale::HoldLast => (w == Tri::True, r == Tri::True),
        OnStale::Ignore => (w == Tri::True, r != Tri::False),
    };
    let mut switched_on = false;
    if !mem.active && on {
        mem.active = true;
        mem.since = now;
        mem.done = false;
        switched_on = true;
    } else if mem.active
        && off
        && !(rule.on_stale == OnStale::HoldLast && stale)
        && now.secs_since(mem.since) + 1e-6 >= rule.min_hold_s
    {
        mem.active = false;
        mem.since = now;
    }
    (stale, switched_on)
}

/// One target as its explanations see it: what it is, whether a signal was stale (and
/// assumed the worst), and whether the rule switched on.
struct Seen<'s, 'a, 'i> {
    ctx: &'s Ctx<'a, 'i>,
    texts: &'s Texts<'s>,
    target: Target<'s>,
    stale: bool,
    assumed: bool,
    switched_on: bool,
}

impl Seen<'_, '_, '_> {
    fn index(&self) -> &Index<'_> {
        self.ctx.index
    }

    fn reason(&self) -> Arc<str> {
        if self.assumed {
            self.texts.assumed.clone()
        } else {
            self.texts.reason.clone()
        }
    }

    /// The signals' values, then whether one was stale, then the cap's level.
    fn values(&self, cap: Option<f64>) -> Values {
        let Target { entity, gpus, job } = self.target;
        let texts = self.texts;
        let mut seen = self.ctx.values(texts, entity, gpus, job);
        if self.stale {
            seen.push((texts.stale(), 1.0));
        }
        if let Some(level) = cap {
            seen.push((texts.cap(), level));
        }
        Values {
            names: texts.names.clone(),
            seen,
        }
    }

    /// The audit explains a cap or a clock lock per rack (the first target of the rule
    /// in a rack says why; the engine keeps no other): a target whose racks are all
    /// explained adds nothing.
    fn explains(&self, explained: &[bool]) -> bool {
        let index = self.index();
        self.target
            .gpus
            .iter()
            .any(|&g| !explained[index.gpus[g].rack_index])
    }

    /// The target's racks, in order, marked explained.
    fn racks(&self, explained: &mut [bool]) -> Vec<usize> {
        let index = self.index();
        // a site lists its GPUs rack by rack: the racks come in order, each once per
        // run of its GPUs, and only a target whose GPUs are not in that order is sorted
        let mut racks: Vec<usize> = Vec::new();
        let mut ordered = true;
        for &g in self.target.gpus {
            let r = index.gpus[g].rack_index;
            match racks.last() {
                Some(&last) if last == r => {}
                Some(&last) => {
                    ordered &= last < r;
                    racks.push(r);
                }
                None => racks.push(r),
            }
        }
        if !ordered {
            racks.sort_unstable();
            racks.dedup();
        }
        for &r in &racks {
            explained[r] = true;
        }
        racks
    }

    /// What explains the rule's want for the target.
    fn why(&self, values: Values, racks: Vec<usize>) -> Why {
        Why {
            target: target_name(self.target.entity, self.target.job),
            values,
            reason: self.reason(),
            release: self.texts.release.clone(),
            racks,
            switched_on: self.switched_on,
        }
    }

    /// A cap rule: the level toward its goal (at the ramp's rate), the GPUs' caps under
    /// it, and why. Returns whether the memory is kept for the level.
    fn cap(
        &self,
        rule: &Rule,
        mem: &mut RuleMemory,
        now: Timestamp,
        wants: &mut Wants,
        explained: &mut [bool],
    ) -> bool {
        let index = self.index();
        let gpus = self.target.gpus;
        let mut keep = false;
        let (target, open) = match rule.action {
            RuleAction::CapW(w) => (
                w,
                gpus.iter()
                    .map(|&g| index.gpus[g].model.default_w)
                    .fold(0.0, f64::max),
            ),
            RuleAction::CapPct(p) => (p, 100.0),
            _ => (0.0, 0.0),
        };
        let goal = if mem.active { target } else { open };
        let level = match (rule.ramp_per_min, mem.level) {
            // a ramp moves the level toward the goal at its rate
            (Some(rate), Some(l)) => {
                let step = rate * now.secs_since(mem.level_at).max(0.0) / 60.0;
                if goal < l {
                    (l - step).max(goal)
                } else {
                    (l + step).min(goal)
                }
            }
            // a ramp starts from uncapped
            (Some(_), None) => open,
            (None, _) => goal,
        };
        let capped = level < open - 1e-9;
        if capped || (mem.active && rule.ramp_per_min.is_some()) {
            mem.level = Some(level);
            mem.level_at = now;
            keep = true;
        } else {
            mem.level = None;
        }
        if capped {
            for &g in gpus {
                let m = index.gpus[g].model;
                let watts = match rule.action {
                    RuleAction::CapPct(_) => m.default_w * level / 100.0,
                    _ => level,
                };
                wants.caps.push((g, watts));
            }
        }
        if (self.switched_on || capped) && self.explains(explained) {
            let racks = self.racks(explained);
            let values = self.values(Some((level * 10.0).round() / 10.0));
            wants.why.push(self.why(values, racks));
        }
        keep
    }

    /// An active clock-lock rule: the GPUs' clocks, and why.
    fn lock_clocks(&self, mhz: f64, wants: &mut Wants, explained: &mut [bool]) {
        for &g in self.target.gpus {
            wants.clocks.push((g, mhz));
        }
        if self.explains(explained) {
            let values = self.values(None);
            let racks = self.racks(explained);
            wants.why.push(self.why(values, racks));
        }
    }

    /// An active job rule: a hold (within the job's hold limit), a release, a requeue
    /// (once) or a suspension, where the job's state allows it, and why.
    fn act_on_job(
        &self,
        rule: &Rule,
        j: &Job,
        mem: &mut RuleMemory,
        (hold_margin_s, max_defer_s): (f64, f64),
        now: Timestamp,
        wants: &mut Wants,
    ) {
        let waiting = matches!(j.state, JobState::Pending | JobState::Held);
        let running = j.state == JobState::Running;
        let acted = match rule.action {
            RuleAction::Hold => {
                let by = crate::plan::hold_limit(j, hold_margin_s, max_defer_s);
                if waiting && now < by {
                    let until = (now + rule.lease_s).min(by);
                    wants.holds.push((j.id.clone(), until));
                    true
                } else {
                    false
                }
            }
            RuleAction::Release => {
                wants.releases.push(j.id.clone());
                true
            }
            RuleAction::Requeue => {
                if running && j.preemptible && !mem.done {
                    wants.requeues.push(j.id.clone());
                    mem.done = true;
                    true
                } else {
                    false
                }
            }
            _ => {
                // a job the scheduler reports suspended stays suspended
                if (running || j.state == JobState::Suspended) && j.preemptible {
                    wants.suspends.push((j.id.clone(), now + rule.lease_s));
                    true
                } else {
                    false
                }
            }
        };
        if acted {
            wants.why.push(self.why(self.values(None), Vec::new()));
        }
    }
}
