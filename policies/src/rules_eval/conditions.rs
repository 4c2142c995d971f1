//! A rule's conditions evaluated for one target: its signals (metrics of the entity or
//! its GPUs, headroom, forecasts, the time, the job's fields), the expressions and
//! comparisons over them, and the `for` timers, in three-valued logic (a stale or
//! missing signal is unknown).

use std::cell::Cell;

use chrono::{Datelike, Timelike};
use telemetry::fasthash::FnvMap;
use telemetry::metric::names::PRICE_PER_KWH;
use telemetry::{EntityId, EntityKind, Job, JobState, Snapshot, Timestamp};

use super::texts::Texts;
use super::{Tri, Val};
use crate::expr::{
    Agg, BinOp, Compare, Cond, Expr, JobField, QueueField, Series, Signal, Stat, TimeField,
};
use crate::index::Index;
use crate::plan::Timers;
use crate::Forecast;

pub(super) struct Ctx<'a, 'i> {
    pub(super) index: &'a Index<'i>,
    pub(super) snapshot: &'a Snapshot,
    pub(super) forecast: &'a Forecast,
    pub(super) now: Timestamp,
    pub(super) local: chrono::DateTime<chrono_tz::Tz>,
    pub(super) max_defer_s: f64,
    pub(super) memo: std::cell::RefCell<FnvMap<(u8, i64, u64), Option<f64>>>,
    /// The snapshot's id of each metric the rule reads, by the address of the rule's
    /// metric name (the rule outlives the context): found once per rule, not by name
    /// for every GPU.
    pub(super) metric_ids: Vec<(usize, Option<telemetry::snapshot::MetricId>)>,
    /// The site's entity (whose price and carbon intensity the forecasts read).
    pub(super) site: EntityId,
    /// The price and the carbon intensity now (by series), the same for every target.
    pub(super) now_values: [Cell<Option<Val>>; 2],
    /// The last GPU reading (GPU, metric, value): `when` and `release` mostly read the
    /// same metric of a GPU one after the other.
    pub(super) last_gpu: Cell<Option<(usize, telemetry::snapshot::MetricId, Val)>>,
    /// Every job the engine knows, for the `queue.*` signals.
    pub(super) jobs: &'a [Job],
    /// The queue's figures, found once a tick when a rule first reads one.
    pub(super) queue: Cell<Option<Queue>>,
}

/// The site's queue at `now` (see [`QueueField`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Queue {
    jobs: f64,
    gpus: f64,
    short_gpus: f64,
    min_slack_s: f64,
}

impl Queue {
    /// The jobs waiting in their scheduler's queue (pending), the GPUs they ask for
    /// and those beyond the site's GPUs that no running or suspended job holds.
    pub(super) fn of(jobs: &[Job], site_gpus: usize, now: Timestamp) -> Queue {
        let mut q = Queue {
            jobs: 0.0,
            gpus: 0.0,
            short_gpus: 0.0,
            min_slack_s: 1e12,
        };
        let mut held = 0.0;
        for j in jobs {
            match j.state {
                JobState::Pending => {
                    q.jobs += 1.0;
                    q.gpus += f64::from(j.gpus);
                    if let Some(ls) = j.latest_start() {
                        q.min_slack_s = q.min_slack_s.min(ls.secs_since(now));
                    }
                }
                JobState::Running | JobState::Suspended => {
                    held += if j.allocated.is_empty() {
                        f64::from(j.gpus)
                    } else {
                        j.allocated.len() as f64
                    };
                }
                _ => {}
            }
        }
        let free = (site_gpus as f64 - held).max(0.0);
        q.short_gpus = (q.gpus - free).max(0.0);
        q
    }

    /// (jobs, gpus, short_gpus, min_slack_s), for tests.
    #[cfg(test)]
    pub(crate) fn fields(&self) -> (f64, f64, f64, f64) {
        (self.jobs, self.gpus, self.short_gpus, self.min_slack_s)
    }

    fn get(&self, f: QueueField) -> f64 {
        match f {
            QueueField::Jobs => self.jobs,
            QueueField::Gpus => self.gpus,
            QueueField::ShortGpus => self.short_gpus,
            QueueField::MinSlackS => self.min_slack_s,
        }
    }
}

impl<'a, 'i> Ctx<'a, 'i> {
    pub(super) fn new(
        texts: &Texts<'_>,
        index: &'a Index<'i>,
        snapshot: &'a Snapshot,
        forecast: &'a Forecast,
        jobs: &'a [Job],
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
            jobs,
            queue: Cell::new(None),
        }
    }
}

impl Ctx<'_, '_> {
    pub(super) fn signal(
        &self,
        s: &Signal,
        entity: &EntityId,
        gpus: &[usize],
        job: Option<&Job>,
    ) -> Val {
        self.signal_inner(s, entity, gpus, job)
    }

    /// A metric of the target: its GPU's reading for a GPU, else the entity's.
    #[inline]
    pub(super) fn metric(&self, m: &str, entity: &EntityId, gpus: &[usize]) -> Val {
        match gpus {
            [g] if entity.kind == EntityKind::Gpu => self.gpu(*g, m),
            _ => self.observe(entity, m),
        }
    }

    #[inline(always)]
    pub(super) fn gpu(&self, gpu: usize, metric: &str) -> Val {
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

    pub(super) fn observe(&self, entity: &EntityId, metric: &str) -> Val {
        match self.snapshot.observe(entity, metric, self.now) {
            Some(o) if o.usable() => Val::Ok(o.value),
            _ => Val::Stale,
        }
    }

    pub(super) fn signal_inner(
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
                    JobField::SlackS => j
                        .latest_start_at(|| self.speed_of(j))
                        .map_or(1e12, |ls| ls.secs_since(self.now)),
                    JobField::EstDurationS => j.est_duration_s,
                })
            }
            Signal::Queue(f) => {
                let q = self.queue.get().unwrap_or_else(|| {
                    let q = Queue::of(self.jobs, self.index.gpus.len(), self.now);
                    self.queue.set(Some(q));
                    q
                });
                Val::Ok(q.get(*f))
            }
        }
    }

    /// The speed of the slowest GPU model a job runs on (the reference's, 1, where it
    /// runs on none of the site's GPUs yet).
    fn speed_of(&self, j: &Job) -> f64 {
        let (site, gpus) = (self.index.site, &self.index.gpus);
        let positions = j.allocated.iter().filter_map(|g| site.gpu_index(g));
        telemetry::site::slowest(positions.filter_map(|i| gpus.get(i)))
    }

    pub(super) fn forecast_value(&self, series: Series, stat: &Stat, job: Option<&Job>) -> Val {
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
    pub(super) fn operand(
        &self,
        e: &Expr,
        entity: &EntityId,
        gpus: &[usize],
        job: Option<&Job>,
    ) -> Val {
        match e {
            Expr::Num(n) => Val::Ok(*n),
            Expr::Signal(Signal::Metric(m), _) => self.metric(m, entity, gpus),
            _ => self.expr(e, entity, gpus, job),
        }
    }

    pub(super) fn expr(
        &self,
        e: &Expr,
        entity: &EntityId,
        gpus: &[usize],
        job: Option<&Job>,
    ) -> Val {
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
    pub(super) fn top(
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
    pub(super) fn compare(
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
    pub(super) fn cond(
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
    pub(super) fn values(
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
