//! Running `[[rules]]`: for each rule, its scope's entities (or jobs), the condition
//! with its `for` timers, the release condition, minimum hold, ramp and stale handling,
//! and what the active rule wants (caps, clock locks, holds, releases, requeues,
//! suspensions), each with a lease.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};

use chrono::{Datelike, Timelike};
use telemetry::fasthash::FnvMap;
use telemetry::metric::names::PRICE_PER_KWH;
use telemetry::{EntityId, EntityKind, Job, JobState, Snapshot, Timestamp};

use crate::expr::{Agg, BinOp, Cond, Condition, Expr, JobField, Series, Signal, Stat, TimeField};
pub use crate::index::{Fnv, Index};
use crate::plan::{RuleMemories, RuleMemory, Timers};
use crate::rules::{OnStale, Rule, RuleAction, ScopeKind};
use crate::Forecast;

/// A rule's target: the entity (the site for a job), its GPUs, the job.
type Target<'a> = (Cow<'a, EntityId>, Cow<'a, [usize]>, Option<&'a Job>);

/// What one rule wants this tick.
#[derive(Debug, Clone, Default)]
pub struct Wants {
    /// GPU index (into `site.gpus()`) → watts.
    pub caps: Vec<(usize, f64)>,
    /// GPU index → MHz.
    pub clocks: Vec<(usize, f64)>,
    /// Job id → hold lease end.
    pub holds: Vec<(String, Timestamp)>,
    pub releases: Vec<String>,
    pub requeues: Vec<String>,
    pub suspends: Vec<(String, Timestamp)>,
    /// (entity, values, reason, what releases it) for each target that is active.
    pub why: Vec<Why>,
}

#[derive(Debug, Clone)]
pub struct Why {
    pub target: String,
    pub values: BTreeMap<String, f64>,
    pub reason: String,
    pub release: String,
    /// Racks the target's GPUs sit in (for grouping cap decisions).
    pub racks: BTreeSet<usize>,
    /// Whether the rule switched on this tick.
    pub switched_on: bool,
}

/// A signal's value, or why there is none.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Val {
    Ok(f64),
    /// Missing or stale: the rule's `on_stale` decides.
    Stale,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tri {
    True,
    False,
    Unknown,
}

struct Ctx<'a, 'i> {
    index: &'a Index<'i>,
    snapshot: &'a Snapshot,
    forecast: &'a Forecast,
    now: Timestamp,
    local: chrono::DateTime<chrono_tz::Tz>,
    max_defer_s: f64,
    memo: std::cell::RefCell<FnvMap<(u8, i64, u64), Option<f64>>>,
    /// The snapshot's id of each metric the rule reads per GPU, by the address of the
    /// rule's metric name (the rule outlives the context): found once per rule, not
    /// by name for every GPU.
    metric_ids: std::cell::RefCell<Vec<(usize, Option<telemetry::snapshot::MetricId>)>>,
}

/// What the condition looked at, for the audit.
type Seen = BTreeMap<String, f64>;

impl Ctx<'_, '_> {
    fn signal(&self, s: &Signal, entity: &EntityId, gpus: &[usize], job: Option<&Job>) -> Val {
        self.signal_inner(s, entity, gpus, job)
    }

    fn gpu(&self, gpu: usize, metric: &str) -> Val {
        let key = metric.as_ptr() as usize;
        let found = self
            .metric_ids
            .borrow()
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, id)| *id);
        let id = match found {
            Some(id) => id,
            None => {
                let id = self.index.metric_id(metric);
                self.metric_ids.borrow_mut().push((key, id));
                id
            }
        };
        let Some(id) = id else { return Val::Stale };
        match self.index.gpu_observe_id(gpu, id, self.now) {
            Some(o) if o.usable() => Val::Ok(o.value),
            _ => Val::Stale,
        }
    }

    fn observe(&self, entity: &EntityId, metric: &str) -> Val {
        match self.snapshot.observe(entity, metric, self.now) {
            Some(o) if o.usable() => Val::Ok(o.value),
            _ => Val::Stale,
        }
    }

    fn signal_inner(
        &self,
        s: &Signal,
        entity: &EntityId,
        gpus: &[usize],
        job: Option<&Job>,
    ) -> Val {
        match s {
            Signal::Metric(m) => match gpus {
                [g] if entity.kind == EntityKind::Gpu => self.gpu(*g, m),
                _ => self.observe(entity, m),
            },
            Signal::Gpus(agg, m) => {
                let mut acc: Vec<f64> = Vec::with_capacity(gpus.len());
                for &g in gpus {
                    match self.gpu(g, m) {
                        Val::Ok(v) => acc.push(v),
                        Val::Stale => return Val::Stale,
                    }
                }
                if acc.is_empty() {
                    return match agg {
                        Agg::Sum => Val::Ok(0.0),
                        _ => Val::Stale,
                    };
                }
                Val::Ok(match agg {
                    Agg::Sum => acc.iter().sum(),
                    Agg::Max => acc.iter().copied().fold(f64::MIN, f64::max),
                    Agg::Min => acc.iter().copied().fold(f64::MAX, f64::min),
                    Agg::Avg => acc.iter().sum::<f64>() / acc.len() as f64,
                })
            }
            Signal::Headroom(m) => match (self.index.limit(entity, m), self.observe(entity, m)) {
                (Some(limit), Val::Ok(v)) => Val::Ok(limit - v),
                _ => Val::Stale,
            },
            Signal::Forecast(series, stat) => self.forecast_value(*series, stat, job),
            Signal::Time(f) => Val::Ok(match f {
                TimeField::Hour => {
                    f64::from(self.local.hour()) + f64::from(self.local.minute()) / 60.0
                }
                TimeField::Minute => f64::from(self.local.minute()),
                TimeField::Weekday => f64::from(self.local.weekday().number_from_monday()),
                TimeField::Day => f64::from(self.local.day()),
                TimeField::Month => f64::from(self.local.month()),
                TimeField::Weekend => {
                    f64::from(u8::from(self.local.weekday().number_from_monday() >= 6))
                }
            }),
            Signal::Job(f) => {
                let Some(j) = job else { return Val::Stale };
                Val::Ok(match f {
                    JobField::Priority => f64::from(j.priority),
                    JobField::Gpus => f64::from(j.gpus),
                    JobField::WaitS => self.now.secs_since(j.submit_time).max(0.0),
                    JobField::SlackS => j.latest_start().map_or(1e12, |ls| ls.secs_since(self.now)),
                    JobField::EstDurationS => j.est_duration_s,
                })
            }
        }
    }

    fn forecast_value(&self, series: Series, stat: &Stat, job: Option<&Job>) -> Val {
        let s = match series {
            Series::Price => &self.forecast.price,
            Series::Carbon => &self.forecast.carbon,
        };
        if let Stat::Now = stat {
            let metric = match series {
                Series::Price => PRICE_PER_KWH,
                Series::Carbon => telemetry::metric::names::CARBON_G_PER_KWH,
            };
            let site = self.index.site.site_entity();
            return match self.observe(&site, metric) {
                Val::Ok(v) => Val::Ok(v),
                Val::Stale if !self.forecast.stale => s.at(self.now).map_or(Val::Stale, Val::Ok),
                Val::Stale => Val::Stale,
            };
        }
        if self.forecast.stale {
            return Val::Stale;
        }
        let now = self.now;
        let stats = |w: f64| s.window(now, now + w).filter(|x| x.covered_s >= 0.5 * w);
        // a statistic over a window is the same for every target of the rule this tick:
        // computed once (the keys' first part: 2 + 2 × kind + series, apart from the
        // deadline pairs below, whose first part is the series alone)
        let window_key = match stat {
            Stat::Min(w) => Some((0u8, *w, 0.0)),
            Stat::Max(w) => Some((1, *w, 0.0)),
            Stat::Mean(w) => Some((2, *w, 0.0)),
            Stat::Pct(p, w) => Some((3, *w, *p)),
            Stat::Cheapest(h, w) => Some((4, *w, *h)),
            Stat::Now | Stat::CheapestBeforeDeadline => None,
        }
        .map(|(kind, w, x)| (2 + 2 * kind + series as u8, w.to_bits() as i64, x.to_bits()));
        if let Some(v) = window_key.and_then(|k| self.memo.borrow().get(&k).copied()) {
            return v.map_or(Val::Stale, Val::Ok);
        }
        let v = match stat {
            Stat::Now => None,
            Stat::Min(w) => stats(*w).map(|x| x.min),
            Stat::Max(w) => stats(*w).map(|x| x.max),
            Stat::Mean(w) => stats(*w).map(|x| x.mean),
            Stat::Pct(p, w) => stats(*w).map(|x| x.percentile(*p)),
            Stat::Cheapest(h, w) => stats(*w).and_then(|_| s.cheapest_threshold(*h, now, now + *w)),
            Stat::CheapestBeforeDeadline => job.and_then(|j| {
                let end = match j.deadline {
                    Some(d) => d,
                    None => j.submit_time + self.max_defer_s + j.est_duration_s,
                };
                let hours = j.est_duration_s / 3600.0;
                if end <= now {
                    return None;
                }
                // many jobs share a deadline and a duration: compute each pair once
                let key = (series as u8, end.as_millis(), hours.to_bits());
                if let Some(v) = self.memo.borrow().get(&key) {
                    return *v;
                }
                let v = s.cheapest_threshold(hours, now, end);
                self.memo.borrow_mut().insert(key, v);
                v
            }),
        };
        if let Some(k) = window_key {
            self.memo.borrow_mut().insert(k, v);
        }
        v.map_or(Val::Stale, Val::Ok)
    }

    fn expr(&self, e: &Expr, entity: &EntityId, gpus: &[usize], job: Option<&Job>) -> Val {
        match e {
            Expr::Num(n) => Val::Ok(*n),
            Expr::Signal(s, _) => self.signal(s, entity, gpus, job),
            Expr::Neg(e) => match self.expr(e, entity, gpus, job) {
                Val::Ok(v) => Val::Ok(-v),
                x => x,
            },
            Expr::Bin(a, op, b) => {
                let (a, b) = (
                    self.expr(a, entity, gpus, job),
                    self.expr(b, entity, gpus, job),
                );
                match (a, b) {
                    (Val::Ok(a), Val::Ok(b)) => {
                        let v = match op {
                            BinOp::Add => a + b,
                            BinOp::Sub => a - b,
                            BinOp::Mul => a * b,
                            BinOp::Div => a / b,
                        };
                        if v.is_finite() {
                            Val::Ok(v)
                        } else {
                            Val::Stale
                        }
                    }
                    _ => Val::Stale,
                }
            }
        }
    }

    /// Evaluates a condition, keeping `timers` (since when each comparison has been
    /// true) up to date.
    #[allow(clippy::too_many_arguments)]
    fn cond(
        &self,
        c: &Cond,
        entity: &EntityId,
        gpus: &[usize],
        job: Option<&Job>,
        timers: &mut Timers,
    ) -> Tri {
        match c {
            Cond::Cmp(x) => {
                let a = self.expr(&x.lhs, entity, gpus, job);
                let b = self.expr(&x.rhs, entity, gpus, job);
                match (a, b) {
                    (Val::Ok(a), Val::Ok(b)) => {
                        if x.op.apply(a, b) {
                            let since = timers.start(x.id, self.now);
                            if self.now.secs_since(since) + 1e-6 >= x.for_s {
                                Tri::True
                            } else {
                                Tri::False
                            }
                        } else {
                            timers.remove(x.id);
                            Tri::False
                        }
                    }
                    // a stale input neither starts nor resets the timer
                    _ => Tri::Unknown,
                }
            }
            Cond::And(v) => {
                let r: Vec<Tri> = v
                    .iter()
                    .map(|c| self.cond(c, entity, gpus, job, timers))
                    .collect();
                if r.contains(&Tri::False) {
                    Tri::False
                } else if r.contains(&Tri::Unknown) {
                    Tri::Unknown
                } else {
                    Tri::True
                }
            }
            Cond::Or(v) => {
                let r: Vec<Tri> = v
                    .iter()
                    .map(|c| self.cond(c, entity, gpus, job, timers))
                    .collect();
                if r.contains(&Tri::True) {
                    Tri::True
                } else if r.contains(&Tri::Unknown) {
                    Tri::Unknown
                } else {
                    Tri::False
                }
            }
            Cond::Not(c) => match self.cond(c, entity, gpus, job, timers) {
                Tri::True => Tri::False,
                Tri::False => Tri::True,
                Tri::Unknown => Tri::Unknown,
            },
        }
    }
}

impl Ctx<'_, '_> {
    /// The values of every signal of the rule's conditions for one target (for the
    /// audit; computed only for targets the rule acts on).
    fn values(&self, rule: &Rule, entity: &EntityId, gpus: &[usize], job: Option<&Job>) -> Seen {
        let mut seen = Seen::new();
        for c in [&rule.when, &rule.release].into_iter().flatten() {
            for (sig, _) in c.signals() {
                if let Val::Ok(x) = self.signal_inner(sig, entity, gpus, job) {
                    seen.insert(signal_name(sig), (x * 1000.0).round() / 1000.0);
                }
            }
        }
        seen
    }
}

fn signal_name(s: &Signal) -> String {
    let dur = |w: f64| {
        if w % 3600.0 == 0.0 {
            format!("{}h", w / 3600.0)
        } else {
            format!("{}m", w / 60.0)
        }
    };
    let agg = |a: &Agg| match a {
        Agg::Sum => "sum",
        Agg::Max => "max",
        Agg::Min => "min",
        Agg::Avg => "avg",
    };
    match s {
        Signal::Metric(m) => m.clone(),
        Signal::Gpus(a, m) => format!("{}({m})", agg(a)),
        Signal::Headroom(m) => format!("headroom({m})"),
        Signal::Forecast(series, stat) => {
            let n = match series {
                Series::Price => "price",
                Series::Carbon => "carbon",
            };
            match stat {
                Stat::Now => n.to_string(),
                Stat::Min(w) => format!("{n}.min({})", dur(*w)),
                Stat::Max(w) => format!("{n}.max({})", dur(*w)),
                Stat::Mean(w) => format!("{n}.mean({})", dur(*w)),
                Stat::Pct(p, w) => format!("{n}.p{p}({})", dur(*w)),
                Stat::Cheapest(h, w) => format!("{n}.cheapest({h}h, {})", dur(*w)),
                Stat::CheapestBeforeDeadline => format!("{n}.cheapest_before_deadline"),
            }
        }
        Signal::Time(t) => format!("{t:?}").to_lowercase(),
        Signal::Job(f) => format!("job.{}", format!("{f:?}").to_lowercase()),
    }
}

/// Runs one rule over its targets. `memory` is the rule's prior memory (keyed by
/// target) and is replaced by the next one.
#[allow(clippy::too_many_arguments)]
pub fn run(
    rule: &Rule,
    index: &Index<'_>,
    snapshot: &Snapshot,
    forecast: &Forecast,
    jobs: &[Job],
    memory: &RuleMemories,
    hold_margin_s: f64,
    max_defer_s: f64,
    now: Timestamp,
) -> (Wants, RuleMemories) {
    let ctx = Ctx {
        index,
        snapshot,
        forecast,
        now,
        local: now.to_datetime().with_timezone(&index.site.timezone),
        max_defer_s,
        memo: Default::default(),
        metric_ids: Default::default(),
    };
    let mut wants = Wants::default();
    // in target order, as the next evaluation visits them
    let mut next = RuleMemories::with_capacity(memory.len());
    let site_entity = index.site.site_entity();
    let targets: Vec<Target<'_>> = if rule.scope == ScopeKind::Job {
        let alloc = index.allocations(jobs);
        jobs.iter()
            .enumerate()
            .filter(|(_, j)| {
                // only the jobs the action can apply to
                let relevant = match rule.action {
                    RuleAction::Hold | RuleAction::Release => {
                        matches!(j.state, JobState::Pending | JobState::Held)
                    }
                    RuleAction::Suspend => {
                        matches!(j.state, JobState::Running | JobState::Suspended)
                    }
                    _ => j.state == JobState::Running,
                };
                relevant && rule.select.matches_job(j)
            })
            .map(|(k, j)| {
                let gpus = Cow::Owned(alloc.of(k).collect());
                (Cow::Borrowed(&site_entity), gpus, Some(j))
            })
            .collect()
    } else {
        index
            .targets(rule.scope, &rule.select)
            .into_iter()
            .map(|(e, g)| (e, g, None))
            .collect()
    };
    // racks a cap of this rule is already explained in (see the cap action below)
    let mut explained: Vec<bool> = vec![false; index.site.racks.len()];
    // the prior memory is in the order of the targets when they are the same as at the
    // last evaluation: each target's entry is found at a cursor; the rest (targets
    // added or gone, a memory read from the store in name order) by a map made then
    let prior = memory.entries();
    let mut cursor = 0usize;
    let mut hashed: Option<FnvMap<&str, usize>> = None;
    for (entity, gpus, job) in targets {
        let entity: &EntityId = &entity;
        // memory is keyed by the target's name (a job's id): the rule fixes the kind
        let key: &str = job.map_or(entity.name.as_str(), |j| j.id.as_str());
        let target_name = || job.map_or_else(|| entity.to_string(), |j| format!("job/{}", j.id));
        let found = match prior.get(cursor) {
            Some((k, _)) if **k == *key => Some(cursor),
            _ => hashed
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
            cursor = i + 1;
        }
        let prior_entry = found.map(|i| &prior[i]);
        let mut mem = prior_entry.map(|(_, m)| m.clone()).unwrap_or(RuleMemory {
            active: false,
            since: now,
            when_true: Timers::new(),
            release_true: Timers::new(),
            level: None,
            level_at: now,
            done: false,
        });
        let w = match &rule.when {
            None => Tri::True,
            Some(c) => ctx.cond(&c.cond, entity, &gpus, job, &mut mem.when_true),
        };
        let r = match &rule.release {
            Some(c) => ctx.cond(&c.cond, entity, &gpus, job, &mut mem.release_true),
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
        // texts for the audit, made only for targets the rule acts on
        let release_text = || match (&rule.release, &rule.when) {
            (Some(r), _) => format!("{}{}", r.text, hold_note(rule)),
            (None, Some(w)) => format!("not ({}){}", w.text, hold_note(rule)),
            (None, None) => "the rule is removed or disabled".to_string(),
        };
        let assumed = stale && rule.on_stale == OnStale::AssumeWorst && mem.active;
        let reason = || {
            if assumed {
                format!(
                    "{}: a signal is stale or missing, assumed the worst",
                    condition_text(rule.when.as_ref())
                )
            } else {
                condition_text(rule.when.as_ref())
            }
        };
        let values = || {
            let mut v = ctx.values(rule, entity, &gpus, job);
            if stale {
                v.insert("stale_inputs".into(), 1.0);
            }
            v
        };
        // what the active rule does
        let mut keep = mem.active || !mem.when_true.is_empty() || !mem.release_true.is_empty();
        match rule.action {
            RuleAction::CapW(_) | RuleAction::CapPct(_) => {
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
                    for &g in gpus.iter() {
                        let m = index.gpus[g].model;
                        let watts = match rule.action {
                            RuleAction::CapPct(_) => m.default_w * level / 100.0,
                            _ => level,
                        };
                        wants.caps.push((g, watts));
                    }
                }
                // the audit explains a cap per rack (the first target of the rule in a
                // rack says why): a target whose racks are all explained adds nothing
                let explains = || gpus.iter().any(|&g| !explained[index.gpus[g].rack_index]);
                if switched_on || (capped && explains()) {
                    let racks: BTreeSet<usize> =
                        gpus.iter().map(|&g| index.gpus[g].rack_index).collect();
                    for &r in &racks {
                        explained[r] = true;
                    }
                    let mut values = values();
                    values.insert(
                        match rule.action {
                            RuleAction::CapPct(_) => "cap_pct".into(),
                            _ => "cap_w".into(),
                        },
                        (level * 10.0).round() / 10.0,
                    );
                    wants.why.push(Why {
                        target: target_name(),
                        values,
                        reason: reason(),
                        release: release_text(),
                        racks,
                        switched_on,
                    });
                }
            }
            RuleAction::LockClocks(mhz) => {
                if mem.active {
                    for &g in gpus.iter() {
                        wants.clocks.push((g, mhz));
                    }
                    wants.why.push(Why {
                        target: target_name(),
                        values: values(),
                        reason: reason(),
                        release: release_text(),
                        racks: gpus.iter().map(|&g| index.gpus[g].rack_index).collect(),
                        switched_on,
                    });
                }
            }
            RuleAction::Hold | RuleAction::Release | RuleAction::Requeue | RuleAction::Suspend => {
                if let (true, Some(j)) = (mem.active, job) {
                    let waiting = matches!(j.state, JobState::Pending | JobState::Held);
                    let running = j.state == JobState::Running;
                    let acted = match rule.action {
                        RuleAction::Hold => {
                            let by = crate::price::hold_limit(j, hold_margin_s, max_defer_s);
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
                        wants.why.push(Why {
                            target: format!("job/{}", j.id),
                            values: values(),
                            reason: reason(),
                            release: release_text(),
                            racks: BTreeSet::new(),
                            switched_on,
                        });
                    }
                }
            }
        }
        if keep {
            let name = prior_entry.map_or_else(|| std::sync::Arc::from(key), |(k, _)| k.clone());
            next.push(name, mem);
        }
    }
    (wants, next)
}

fn condition_text(c: Option<&Condition>) -> String {
    c.map_or_else(|| "always".to_string(), |c| c.text.clone())
}

fn hold_note(rule: &Rule) -> String {
    if rule.min_hold_s > 0.0 {
        format!(" (held at least {}s)", rule.min_hold_s)
    } else {
        String::new()
    }
}
