//! Running `[[rules]]`: for each rule, its scope's entities (or jobs), the condition
//! with its `for` timers, the release condition, minimum hold, ramp and stale handling,
//! and what the active rule wants (caps, clock locks, holds, releases, requeues,
//! suspensions), each with a lease.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::sync::Arc;

use chrono::{Datelike, Timelike};
use telemetry::fasthash::FnvMap;
use telemetry::metric::names::PRICE_PER_KWH;
use telemetry::{EntityId, EntityKind, Job, JobState, Snapshot, Timestamp};

use crate::expr::{
    Agg, BinOp, Compare, Cond, Condition, Expr, JobField, Series, Signal, Stat, TimeField,
};
pub use crate::index::{Fnv, Index};
use crate::plan::{RuleMemories, RuleMemory, Timers};
use crate::rules::{OnStale, Rule, RuleAction, ScopeKind};
use crate::Forecast;

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
    /// What the rule looked at (see [`Why::values`]).
    values: Values,
    /// The rule's reason and what releases it, shared by its explanations.
    pub reason: Arc<str>,
    pub release: Arc<str>,
    /// Racks the target's GPUs sit in, in order, each once (for grouping cap decisions).
    pub racks: Vec<usize>,
    /// Whether the rule switched on this tick.
    pub switched_on: bool,
}

impl Why {
    /// The values of the signals the rule looked at for the target (with the cap it
    /// set, whether an input was stale), by name.
    pub fn values(&self) -> BTreeMap<String, f64> {
        let mut m = BTreeMap::new();
        for &(i, v) in &self.values.seen {
            m.insert(self.values.names[i as usize].clone(), v);
        }
        m
    }
}

/// The values an explanation shows, kept as positions in a list of names that the
/// rule's explanations share, and made into a map ([`Why::values`]) only for those
/// the audit writes.
#[derive(Debug, Clone)]
struct Values {
    names: Arc<[String]>,
    /// (position in `names`, value) in the order taken: a later value of a name
    /// replaces an earlier one.
    seen: Vec<(u32, f64)>,
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
    /// The snapshot's id of each metric the rule reads, by the address of the rule's
    /// metric name (the rule outlives the context): found once per rule, not by name
    /// for every GPU.
    metric_ids: Vec<(usize, Option<telemetry::snapshot::MetricId>)>,
    /// The site's entity (whose price and carbon intensity the forecasts read).
    site: EntityId,
    /// The price and the carbon intensity now (by series), the same for every target.
    now_values: [Cell<Option<Val>>; 2],
    /// The last GPU reading (GPU, metric, value): `when` and `release` mostly read the
    /// same metric of a GPU one after the other.
    last_gpu: Cell<Option<(usize, telemetry::snapshot::MetricId, Val)>>,
}

impl<'a, 'i> Ctx<'a, 'i> {
    fn new(
        texts: &Texts<'_>,
        index: &'a Index<'i>,
        snapshot: &'a Snapshot,
        forecast: &'a Forecast,
        now: Timestamp,
        max_defer_s: f64,
    ) -> Self {
        let metric_ids = texts
            .signals
            .iter()
            .filter_map(|s| match s {
                Signal::Metric(m) | Signal::Gpus(_, m) => Some(m),
                _ => None,
            })
            .map(|m| (m.as_ptr() as usize, index.metric_id(m)))
            .collect();
        Ctx {
            index,
            snapshot,
            forecast,
            now,
            local: now.to_datetime().with_timezone(&index.site.timezone),
            max_defer_s,
            memo: Default::default(),
            metric_ids,
            site: index.site.site_entity(),
            now_values: Default::default(),
            last_gpu: Cell::new(None),
        }
    }
}

impl Ctx<'_, '_> {
    fn signal(&self, s: &Signal, entity: &EntityId, gpus: &[usize], job: Option<&Job>) -> Val {
        self.signal_inner(s, entity, gpus, job)
    }

    /// A metric of the target: its GPU's reading for a GPU, else the entity's.
    #[inline]
    fn metric(&self, m: &str, entity: &EntityId, gpus: &[usize]) -> Val {
        match gpus {
            [g] if entity.kind == EntityKind::Gpu => self.gpu(*g, m),
            _ => self.observe(entity, m),
        }
    }

    #[inline(always)]
    fn gpu(&self, gpu: usize, metric: &str) -> Val {
        let key = metric.as_ptr() as usize;
        let id = match self.metric_ids.iter().find(|(k, _)| *k == key) {
            Some((_, id)) => *id,
            None => self.index.metric_id(metric),
        };
        let Some(id) = id else { return Val::Stale };
        if let Some((g, m, v)) = self.last_gpu.get() {
            if g == gpu && m == id {
                return v;
            }
        }
        let v = match self.index.gpu_observe_id(gpu, id, self.now) {
            Some(o) if o.usable() => Val::Ok(o.value),
            _ => Val::Stale,
        };
        self.last_gpu.set(Some((gpu, id, v)));
        v
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
            Signal::Metric(m) => self.metric(m, entity, gpus),
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
            let memo = &self.now_values[series as usize];
            if let Some(v) = memo.get() {
                return v;
            }
            let metric = match series {
                Series::Price => PRICE_PER_KWH,
                Series::Carbon => telemetry::metric::names::CARBON_G_PER_KWH,
            };
            let v = match self.observe(&self.site, metric) {
                Val::Ok(v) => Val::Ok(v),
                Val::Stale if !self.forecast.stale => s.at(self.now).map_or(Val::Stale, Val::Ok),
                Val::Stale => Val::Stale,
            };
            memo.set(Some(v));
            return v;
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

    /// A side of a comparison: a number or a metric (the common cases) read in place,
    /// anything else by [`Ctx::expr`].
    #[inline(always)]
    fn operand(&self, e: &Expr, entity: &EntityId, gpus: &[usize], job: Option<&Job>) -> Val {
        match e {
            Expr::Num(n) => Val::Ok(*n),
            Expr::Signal(Signal::Metric(m), _) => self.metric(m, entity, gpus),
            _ => self.expr(e, entity, gpus, job),
        }
    }

    fn expr(&self, e: &Expr, entity: &EntityId, gpus: &[usize], job: Option<&Job>) -> Val {
        match e {
            Expr::Num(n) => Val::Ok(*n),
            // the common case read without the other signals' code
            Expr::Signal(Signal::Metric(m), _) => self.metric(m, entity, gpus),
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

    /// Evaluates a condition where a rule's `when` or `release` starts: a comparison
    /// (the most common condition) in place, anything else by [`Ctx::cond`].
    #[inline(always)]
    fn top(
        &self,
        c: &Cond,
        entity: &EntityId,
        gpus: &[usize],
        job: Option<&Job>,
        timers: &mut Timers,
    ) -> Tri {
        match c {
            Cond::Cmp(x) => self.compare(x, entity, gpus, job, timers),
            _ => self.cond(c, entity, gpus, job, timers),
        }
    }

    /// One comparison, keeping its timer (since when it has been true) up to date.
    #[inline(always)]
    fn compare(
        &self,
        x: &Compare,
        entity: &EntityId,
        gpus: &[usize],
        job: Option<&Job>,
        timers: &mut Timers,
    ) -> Tri {
        let a = self.operand(&x.lhs, entity, gpus, job);
        let b = self.operand(&x.rhs, entity, gpus, job);
        match (a, b) {
            (Val::Ok(a), Val::Ok(b)) if !x.op.apply(a, b) => {
                timers.remove(x.id);
                Tri::False
            }
            (Val::Ok(_), Val::Ok(_)) if x.for_s <= 0.0 => {
                // true at once: nothing to time, so no timer is kept (the memory holds
                // only what a later decision reads; one left by an older build is
                // dropped)
                timers.remove(x.id);
                Tri::True
            }
            (Val::Ok(_), Val::Ok(_)) => {
                let since = timers.start(x.id, self.now);
                if self.now.secs_since(since) + 1e-6 >= x.for_s {
                    Tri::True
                } else {
                    Tri::False
                }
            }
            // a stale input neither starts nor resets the timer
            _ => Tri::Unknown,
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
            Cond::Cmp(x) => self.compare(x, entity, gpus, job, timers),
            // every part is evaluated (each keeps its timers): false if one is false,
            // else unknown if one is unknown
            Cond::And(v) => v.iter().fold(Tri::True, |r, c| {
                match (self.cond(c, entity, gpus, job, timers), r) {
                    (Tri::False, _) => Tri::False,
                    (Tri::Unknown, Tri::True) => Tri::Unknown,
                    _ => r,
                }
            }),
            // true if one is true, else unknown if one is unknown
            Cond::Or(v) => v.iter().fold(Tri::False, |r, c| {
                match (self.cond(c, entity, gpus, job, timers), r) {
                    (Tri::True, _) => Tri::True,
                    (Tri::Unknown, Tri::False) => Tri::Unknown,
                    _ => r,
                }
            }),
            Cond::Not(c) => match self.cond(c, entity, gpus, job, timers) {
                Tri::True => Tri::False,
                Tri::False => Tri::True,
                Tri::Unknown => Tri::Unknown,
            },
        }
    }
}

impl Ctx<'_, '_> {
    /// The values of every signal of the rule's conditions for one target, by the
    /// signal's position in [`Texts::names`] (for the audit; computed only for targets
    /// that explain what the rule does), with room for two more.
    fn values(
        &self,
        texts: &Texts<'_>,
        entity: &EntityId,
        gpus: &[usize],
        job: Option<&Job>,
    ) -> Vec<(u32, f64)> {
        let mut seen = Vec::with_capacity(texts.signals.len() + 2);
        for (i, sig) in texts.signals.iter().enumerate() {
            if let Val::Ok(x) = self.signal_inner(sig, entity, gpus, job) {
                seen.push((i as u32, (x * 1000.0).round() / 1000.0));
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
    let texts = Texts::new(rule);
    let mut visit = Visit {
        rule,
        ctx: Ctx::new(&texts, index, snapshot, forecast, now, max_defer_s),
        texts: &texts,
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
                RuleMemories::with_capacity_gpus(index.gpus.len())
            }
            ScopeKind::Gpu => RuleMemories::with_capacity_gpus(memory.len()),
            _ => RuleMemories::with_capacity(memory.len()),
        },
        explained: vec![false; index.site.racks.len()],
        by_gpu: false,
        prior: memory.entries(),
        cursor: 0,
        hashed: None,
    };
    match rule.scope {
        ScopeKind::Job => {
            let site_entity = index.site.site_entity();
            let alloc = index.allocations(jobs);
            // one list for the GPUs of every job, refilled for each
            let mut gpus = Vec::new();
            for (k, j) in jobs.iter().enumerate() {
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
                if relevant && rule.select.matches_job(j) {
                    gpus.clear();
                    gpus.extend(alloc.of(k));
                    let found = visit.find(&j.id);
                    visit.target(&site_entity, &gpus, Some(j), found);
                }
            }
        }
        // a GPU's list of one GPU is its position: no list of targets is made
        ScopeKind::Gpu => {
            visit.by_gpu = true;
            let entries = gpu_entries(memory, index);
            for g in index.gpu_targets(&rule.select) {
                let entity: &EntityId = &index.gpus[g].id;
                let found = match &entries {
                    Some(e) => (e[g] != u32::MAX).then_some(e[g] as usize),
                    None => visit.find(&entity.name),
                };
                visit.target(entity, std::slice::from_ref(&g), None, found);
            }
        }
        scope => {
            for (entity, gpus) in index.targets(scope, &rule.select) {
                let found = visit.find(&entity.name);
                visit.target(&entity, &gpus, None, found);
            }
        }
    }
    visit.next.shrink_if_sparse();
    (visit.wants, visit.next)
}

/// For a rule over GPUs, the position in its prior memory of each GPU's entry
/// (`u32::MAX` for none), by the GPUs' positions the memory kept: `None` unless each of
/// them still names its entry's GPU (a memory read from the store, a changed site), and
/// the entries are found by name. GPUs' names are unique, so a GPU without an entry
/// here has none at all.
fn gpu_entries(memory: &RuleMemories, index: &Index<'_>) -> Option<Vec<u32>> {
    let positions = memory.gpu_positions()?;
    let mut entries = vec![u32::MAX; index.gpus.len()];
    for (i, (&g, (name, _))) in positions.iter().zip(memory.entries()).enumerate() {
        let e = entries.get_mut(g as usize)?;
        if *e != u32::MAX || *index.gpus[g as usize].id.name != **name {
            return None;
        }
        *e = i as u32;
    }
    Some(entries)
}

/// A rule's texts for the audit, made once per run of the rule rather than for each
/// target it explains.
struct Texts<'r> {
    /// Every signal of `when`, then of `release`.
    signals: Vec<&'r Signal>,
    /// The signals' names, then `stale_inputs` ([`Texts::stale`]), then the name of
    /// the rule's cap ([`Texts::cap`]).
    names: Arc<[String]>,
    /// The condition the rule acts on.
    reason: Arc<str>,
    /// The reason when a stale or missing signal is assumed the worst.
    assumed: Arc<str>,
    /// What releases the rule.
    release: Arc<str>,
}

impl<'r> Texts<'r> {
    fn new(rule: &'r Rule) -> Self {
        let signals: Vec<&Signal> = [&rule.when, &rule.release]
            .into_iter()
            .flatten()
            .flat_map(|c| c.signals())
            .map(|(s, _)| s)
            .collect();
        let cap = match rule.action {
            RuleAction::CapPct(_) => "cap_pct",
            _ => "cap_w",
        };
        let names = signals
            .iter()
            .map(|s| signal_name(s))
            .chain(["stale_inputs".to_string(), cap.to_string()])
            .collect();
        let reason = condition_text(rule.when.as_ref());
        Texts {
            signals,
            names,
            assumed: format!("{reason}: a signal is stale or missing, assumed the worst").into(),
            reason: reason.into(),
            release: match (&rule.release, &rule.when) {
                (Some(r), _) => format!("{}{}", r.text, hold_note(rule)),
                (None, Some(w)) => format!("not ({}){}", w.text, hold_note(rule)),
                (None, None) => "the rule is removed or disabled".to_string(),
            }
            .into(),
        }
    }

    /// The position of `stale_inputs` in [`Texts::names`].
    fn stale(&self) -> u32 {
        self.signals.len() as u32
    }

    /// The position of the cap's name in [`Texts::names`].
    fn cap(&self) -> u32 {
        self.signals.len() as u32 + 1
    }
}

/// One run of a rule over its targets: what it wants so far and its next memory.
struct Visit<'a, 'i> {
    rule: &'a Rule,
    ctx: Ctx<'a, 'i>,
    texts: &'a Texts<'a>,
    hold_margin_s: f64,
    max_defer_s: f64,
    now: Timestamp,
    wants: Wants,
    next: RuleMemories,
    /// Racks a cap (or clock lock) of this rule is already explained in (see the
    /// actions in [`Visit::target`]).
    explained: Vec<bool>,
    /// Whether the targets are GPUs (whose memory keeps each one's position).
    by_gpu: bool,
    /// The prior memory, in the order of the targets when they are the same as at the
    /// last evaluation: each target's entry is found at `cursor`; the rest (targets
    /// added or gone, a memory read from the store in name order) by `hashed`, a map
    /// made then.
    prior: &'a [(Arc<str>, RuleMemory)],
    cursor: usize,
    hashed: Option<FnvMap<&'a str, usize>>,
}

impl Visit<'_, '_> {
    /// The position in the prior memory of a target's entry (by its name, a job's id).
    fn find(&mut self, key: &str) -> Option<usize> {
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
    fn target(
        &mut self,
        entity: &EntityId,
        gpus: &[usize],
        job: Option<&Job>,
        found: Option<usize>,
    ) {
        let prior_entry = found.map(|i| &self.prior[i]);
        let Visit {
            rule,
            ctx,
            texts,
            hold_margin_s,
            max_defer_s,
            now,
            wants,
            next,
            explained,
            by_gpu,
            ..
        } = self;
        let (rule, texts, now) = (*rule, *texts, *now);
        let index = ctx.index;
        let mut mem = prior_entry.map_or_else(
            || RuleMemory {
                active: false,
                since: now,
                when_true: Timers::new(),
                release_true: Timers::new(),
                level: None,
                level_at: now,
                done: false,
            },
            |(_, m)| m.clone(),
        );
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
        // texts for the audit, made only for targets that explain what the rule does
        let assumed = stale && rule.on_stale == OnStale::AssumeWorst && mem.active;
        let reason = || {
            if assumed {
                texts.assumed.clone()
            } else {
                texts.reason.clone()
            }
        };
        // the signals' values, then whether one was stale, then the cap's level
        let values = |cap: Option<f64>| {
            let mut seen = ctx.values(texts, entity, gpus, job);
            if stale {
                seen.push((texts.stale(), 1.0));
            }
            if let Some(level) = cap {
                seen.push((texts.cap(), level));
            }
            Values {
                names: texts.names.clone(),
                seen,
            }
        };
        // the audit explains a cap or a clock lock per rack (the first target of the
        // rule in a rack says why; the engine keeps no other): a target whose racks
        // are all explained adds nothing
        let explains =
            |explained: &[bool]| gpus.iter().any(|&g| !explained[index.gpus[g].rack_index]);
        let racks = |explained: &mut [bool]| {
            let mut racks: Vec<usize> = gpus.iter().map(|&g| index.gpus[g].rack_index).collect();
            racks.sort_unstable();
            racks.dedup();
            for &r in &racks {
                explained[r] = true;
            }
            racks
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
                    for &g in gpus {
                        let m = index.gpus[g].model;
                        let watts = match rule.action {
                            RuleAction::CapPct(_) => m.default_w * level / 100.0,
                            _ => level,
                        };
                        wants.caps.push((g, watts));
                    }
                }
                if (switched_on || capped) && explains(explained) {
                    let racks = racks(explained);
                    wants.why.push(Why {
                        target: target_name(entity, job),
                        values: values(Some((level * 10.0).round() / 10.0)),
                        reason: reason(),
                        release: texts.release.clone(),
                        racks,
                        switched_on,
                    });
                }
            }
            RuleAction::LockClocks(mhz) => {
                if mem.active {
                    for &g in gpus {
                        wants.clocks.push((g, mhz));
                    }
                    if explains(explained) {
                        wants.why.push(Why {
                            target: target_name(entity, job),
                            values: values(None),
                            reason: reason(),
                            release: texts.release.clone(),
                            racks: racks(explained),
                            switched_on,
                        });
                    }
                }
            }
            RuleAction::Hold | RuleAction::Release | RuleAction::Requeue | RuleAction::Suspend => {
                if let (true, Some(j)) = (mem.active, job) {
                    let waiting = matches!(j.state, JobState::Pending | JobState::Held);
                    let running = j.state == JobState::Running;
                    let acted = match rule.action {
                        RuleAction::Hold => {
                            let by = crate::price::hold_limit(j, *hold_margin_s, *max_defer_s);
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
                            target: target_name(entity, job),
                            values: values(None),
                            reason: reason(),
                            release: texts.release.clone(),
                            racks: Vec::new(),
                            switched_on,
                        });
                    }
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
                [g] if *by_gpu => next.push_gpu(name, mem, *g),
                _ => next.push(name, mem),
            }
        }
    }
}

/// A target's name in the audit: `kind/name`, `job/id` for a job.
fn target_name(entity: &EntityId, job: Option<&Job>) -> String {
    let (kind, name) = match job {
        Some(j) => ("job", j.id.as_str()),
        None => (entity.kind.as_str(), entity.name.as_str()),
    };
    let mut s = String::with_capacity(kind.len() + 1 + name.len());
    s.push_str(kind);
    s.push('/');
    s.push_str(name);
    s
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
