//! The grid controller as a controller of the engine: it runs after the price rule
//! (whose verdicts it amends: a job it holds stays held, a job only it held is
//! released by it), writes its caps, its suspensions and its memory.

use std::borrow::Cow;
use std::collections::BTreeMap;

use telemetry::metric::names::POWER_W;
use telemetry::{Job, JobState, Timestamp};

use super::{asked, cut, meter, step, GpuClaim, RULE};
use crate::plan::{hold_limit, round3, GridMemory, Hold};
use crate::policy::GridRule;
use crate::stage::{CapWants, Context, Controller, Explain, Verdict, Wants};

/// The `[grid]` controller.
pub(crate) struct Grid;

impl Controller for Grid {
    fn want<'c>(&self, cx: &'c Context<'_>, wants: &mut Wants<'c>) {
        let rule = &cx.policy.grid;
        let prior = cx.prior.grid.as_ref();
        if !rule.enabled {
            release_own_holds(cx, &BTreeMap::new(), "grid rule disabled", wants);
            return;
        }
        let asked = asked(cx.site, cx.snapshot, cx.now);
        if !asked.active && prior.is_none() && !holds_any(cx) {
            // nothing in force and nothing of ours to undo: the common case, at no cost
            return;
        }
        let tick = Tick::read(cx, rule);
        let Some(mut memory) = step(prior, &asked, &tick.meter, rule, holds_any(cx), cx.now) else {
            release_own_holds(cx, &BTreeMap::new(), "grid event over", wants);
            return;
        };
        let share = tick.meter.it_share();
        let aim_it_w = memory.target_w * share * (1.0 - rule.margin);
        let gpu_budget_w = aim_it_w - tick.other_w;
        let (alloc, met) = cut(&tick.claims, gpu_budget_w);

        // the caps: every GPU whose allocation is under what it would draw
        let mut caps: Vec<Option<f64>> = vec![None; tick.claims.len()];
        let gpus = cx.gpus();
        for (i, (c, a)) in tick.claims.iter().zip(&alloc).enumerate() {
            if *a < c.demand_w - 1.0 {
                caps[i] = Some(gpus[i].model.clamp_limit(*a));
            }
        }
        let short_gpu_w = (alloc.iter().sum::<f64>() - gpu_budget_w).max(0.0);

        // what the rebound limit leaves room for: suspended jobs first, then held work
        let mut room_w = aim_it_w - tick.meter.it_w;
        let per_gpu_w = wants
            .pacing
            .map_or(tick.typical_gpu_w, |p| p.watts_per_gpu)
            .max(1.0);

        // the suspensions: preemptible jobs, cut first first, until the rest is met
        let mut suspends: Vec<(String, Timestamp)> = Vec::new();
        let until = cx.now.plus_secs(rule.lease_s);
        let mut freed_w = 0.0;
        if rule.suspend {
            // those suspended stay so while the event is in force and, after it, until
            // the room under the rebound limit takes them; a job whose deadline now
            // needs it running is resumed at once
            for s in &tick.suspended {
                let need_w = per_gpu_w * f64::from(s.gpus.max(1));
                if s.due || (!memory.event_active() && room_w >= need_w) {
                    room_w -= if s.due { 0.0 } else { need_w };
                    continue;
                }
                suspends.push((s.id.to_owned(), until));
            }
            if !met && memory.event_active() {
                for (k, gain_w) in &tick.suspendable {
                    if freed_w >= short_gpu_w {
                        break;
                    }
                    let id = &cx.jobs[*k].id;
                    if !suspends.iter().any(|(j, _)| j == id) {
                        suspends.push((id.clone(), until));
                        freed_w += gain_w;
                    }
                }
            }
        }
        let shortfall_gpu_w = (short_gpu_w - freed_w).max(0.0);

        // the holds: queued deferrable work, all of it while the event is in force;
        // during the rebound only what the room under the baseline cannot take yet
        let mut held = BTreeMap::new();
        if rule.hold {
            for (job, limit) in &tick.holdable {
                let was = cx.prior.holds.get(&job.id).filter(|h| h.rule == RULE);
                if !memory.event_active() && room_w >= per_gpu_w * f64::from(job.gpus.max(1)) {
                    room_w -= per_gpu_w * f64::from(job.gpus.max(1));
                    continue;
                }
                held.insert(
                    job.id.clone(),
                    Hold {
                        rule: RULE.into(),
                        since: was.map_or(cx.now, |h| h.since),
                        lease_until: (*limit).min(cx.now.plus_secs(rule.lease_s)),
                        reason: hold_reason(&memory),
                    },
                );
            }
        }
        release_own_holds(cx, &held, "the room under the grid limit takes it", wants);
        for (job, h) in held {
            match wants.verdicts.get(&job) {
                Some(Verdict::Hold(_)) => {}
                _ => {
                    wants.verdicts.insert(job, Verdict::Hold(h));
                }
            }
        }

        memory.meter_w = tick.meter.meter_w;
        memory.floor_w = (tick.other_w + tick.floor_gpu_w) / share;
        memory.shortfall_w = shortfall_gpu_w / share;
        let values = values(&memory, &tick, aim_it_w);
        wants.why.insert(
            (RULE, Cow::Borrowed(cx.site_scope.as_str())),
            Explain::Made((values, cap_reason(&memory, met), release(&memory, rule))),
        );
        wants.caps.push(CapWants::Grid { caps });
        wants.grid_suspends = suspends;
        wants.next.grid = Some(memory);
    }
}

/// Whether any hold or suspension in force is the controller's.
fn holds_any(cx: &Context<'_>) -> bool {
    cx.prior.holds.values().any(|h| h.rule == RULE)
        || cx.prior.suspended.values().any(|h| h.rule == RULE)
}

/// Releases the holds the controller placed that it no longer wants (`keep`), unless
/// another controller holds the job.
fn release_own_holds(
    cx: &Context<'_>,
    keep: &BTreeMap<String, Hold>,
    reason: &str,
    wants: &mut Wants<'_>,
) {
    for (job, h) in &cx.prior.holds {
        if h.rule != RULE || keep.contains_key(job) {
            continue;
        }
        if !matches!(wants.verdicts.get(job), Some(Verdict::Hold(_))) {
            wants.verdicts.insert(
                job.clone(),
                Verdict::Release {
                    reason: reason.into(),
                },
            );
        }
    }
}

/// A job the controller suspended, as this tick finds it.
struct Suspended<'c> {
    id: &'c str,
    gpus: u32,
    /// Protected now: resumed at once.
    due: bool,
    rank: i64,
}

/// What one tick of the controller reads of the site.
struct Tick<'c> {
    meter: super::Meter,
    /// IT power that is not the GPUs' draw, W.
    other_w: f64,
    claims: Vec<GpuClaim>,
    /// What the GPUs draw with flexible ones at their floors, W.
    floor_gpu_w: f64,
    /// Running preemptible jobs that may be suspended (their position in the jobs),
    /// cut first first, with what suspending each saves, W.
    suspendable: Vec<(usize, f64)>,
    /// The jobs the controller suspended that are still running or suspended: their
    /// GPUs, and whether they are now protected (their slack down to the budget's
    /// `protect_slack_s` at their model's pace, or a protected class), which resumes
    /// them even while the event is in force; those cut last first (the order they
    /// come back in).
    suspended: Vec<Suspended<'c>>,
    /// Queued deferrable jobs that may be held, with the time they must be released.
    holdable: Vec<(&'c Job, Timestamp)>,
    typical_gpu_w: f64,
}

impl<'c> Tick<'c> {
    fn read(cx: &'c Context<'_>, rule: &GridRule) -> Tick<'c> {
        let gpus = cx.gpus();
        let now = cx.now;
        let power = cx.index.metric_id(POWER_W);
        let alloc = cx.index.allocations(cx.jobs);
        // each GPU's running job, by GPU index
        let mut job_of: Vec<Option<usize>> = vec![None; gpus.len()];
        for (k, j) in cx.jobs.iter().enumerate() {
            if j.state == JobState::Running {
                for i in alloc.of(k) {
                    job_of[i] = Some(k);
                }
            }
        }
        let slack = cx.policy.budget.protect_slack_s;
        // a job's slack at the pace of the slowest model it holds (1: none held)
        let protected = |k: usize| {
            let j = &cx.jobs[k];
            let speed =
                || telemetry::site::slowest(alloc.of(k).filter_map(|i| cx.index.gpus.get(i)));
            rule.protect.contains(&j.class)
                || j.latest_start_at(speed)
                    .is_some_and(|ls| ls.secs_since(now) <= slack)
        };
        let rank = |j: &Job| -> i64 {
            let r = rule
                .shed_order
                .iter()
                .position(|c| c == &j.class)
                .unwrap_or(rule.shed_order.len()) as i64;
            (r << 33) + i64::from(j.priority)
        };
        let mut claims = Vec::with_capacity(gpus.len());
        let mut gpu_draw_w = 0.0;
        let mut floor_gpu_w = 0.0;
        for (i, g) in gpus.iter().enumerate() {
            let m = g.model;
            let obs = power
                .and_then(|p| cx.index.gpu_observe_id(i, p, now))
                .filter(|o| o.usable());
            let cap = cx.prior_caps[i].map(|c| c.watts);
            // not read: counted at what its cap (or its default limit) allows
            let draw = obs.map_or(cap.unwrap_or(m.default_w), |o| o.value);
            // a GPU at its cap would draw more without it: its default limit
            let at_cap = cap.is_some_and(|c| draw >= c * 0.95 && c < m.default_w);
            let demand = if at_cap { m.default_w } else { draw };
            gpu_draw_w += draw;
            let claim = match job_of[i].map(|k| (k, &cx.jobs[k])) {
                Some((k, _)) if protected(k) => GpuClaim {
                    draw_w: draw,
                    demand_w: demand,
                    floor_w: demand,
                    priority: i64::MAX,
                },
                Some((_, j)) => GpuClaim {
                    draw_w: draw,
                    demand_w: demand,
                    floor_w: (rule.floor_of(&j.class) * m.default_w).max(m.min_w),
                    priority: rank(j),
                },
                None => GpuClaim {
                    draw_w: draw,
                    demand_w: demand,
                    floor_w: m.min_w,
                    priority: i64::MIN,
                },
            };
            floor_gpu_w += claim.floor_w.min(claim.draw_w);
            claims.push(claim);
        }
        let base_w: f64 = cx.site.nodes.iter().map(|n| n.base_w).sum();
        let meter = meter(cx.site, cx.snapshot, rule, gpu_draw_w + base_w, now);
        let other_w = (meter.it_w - gpu_draw_w).max(0.0);

        let (suspendable, suspended) = suspensions(cx, &alloc, &claims, &protected, &rank);
        if rule.suspend {
            floor_gpu_w -= suspendable.iter().map(|s| s.1).sum::<f64>();
        }
        let price = &cx.policy.price;
        let mut holdable: Vec<(&Job, Timestamp)> = cx
            .jobs
            .iter()
            .enumerate()
            .filter(|(_, j)| j.deferrable && matches!(j.state, JobState::Pending | JobState::Held))
            .filter(|&(k, _)| !protected(k))
            .map(|(_, j)| (j, hold_limit(j, price.margin_s, price.max_defer_s)))
            .filter(|(_, limit)| *limit > now)
            .collect();
        // the most urgent first (released first during the rebound)
        holdable.sort_by(|a, b| a.1.cmp(&b.1).then_with(|| a.0.id.cmp(&b.0.id)));
        let typical_gpu_w = crate::controllers::budget::controller::typical_gpu_w(gpus);
        Tick {
            meter,
            other_w,
            claims,
            floor_gpu_w: floor_gpu_w.max(0.0),
            suspendable,
            suspended,
            holdable,
            typical_gpu_w,
        }
    }
}

/// The running preemptible jobs that may be suspended (not protected), cut first
/// first, with what suspending each saves (its GPUs from their floors to idle, W);
/// and the jobs the controller suspended that are still there, cut last first.
fn suspensions<'c>(
    cx: &'c Context<'_>,
    alloc: &crate::index::JobTable,
    claims: &[GpuClaim],
    protected: &dyn Fn(usize) -> bool,
    rank: &dyn Fn(&Job) -> i64,
) -> (Vec<(usize, f64)>, Vec<Suspended<'c>>) {
    let gpus = cx.gpus();
    let mut suspendable: Vec<(i64, usize, f64)> = Vec::new();
    let mut suspended = Vec::new();
    for (k, j) in cx.jobs.iter().enumerate() {
        let ours = cx
            .prior
            .suspended
            .get(&j.id)
            .is_some_and(|h| h.rule == RULE);
        if ours && matches!(j.state, JobState::Running | JobState::Suspended) {
            suspended.push(Suspended {
                id: j.id.as_str(),
                gpus: j.gpus,
                due: protected(k),
                rank: rank(j),
            });
        }
        if j.state != JobState::Running || !j.preemptible || protected(k) {
            continue;
        }
        let gain: f64 = alloc
            .of(k)
            .map(|i| (claims[i].floor_w.min(claims[i].draw_w) - gpus[i].model.idle_w).max(0.0))
            .sum();
        if gain > 0.0 {
            suspendable.push((rank(j), k, gain));
        }
    }
    suspendable.sort_by_key(|&(r, k, _)| (r, k));
    suspended.sort_by_key(|s| (std::cmp::Reverse(s.rank), s.id));
    let suspendable = suspendable.into_iter().map(|(_, k, g)| (k, g)).collect();
    (suspendable, suspended)
}

fn hold_reason(m: &GridMemory) -> String {
    if m.event_active() {
        format!(
            "grid event: meter target {:.1} kW (baseline {:.1} kW)",
            m.target_w / 1000.0,
            m.baseline_w / 1000.0
        )
    } else {
        format!(
            "grid event over: rebound limit {:.1} kW (the pre-event baseline) until the room under it takes the job",
            m.baseline_w / 1000.0
        )
    }
}

fn cap_reason(m: &GridMemory, met: bool) -> String {
    let what = if m.event_active() {
        "grid event"
    } else {
        "grid rebound limit"
    };
    let mut s = format!(
        "{what}: meter {:.1} kW against target {:.1} kW (baseline {:.1} kW)",
        m.meter_w / 1000.0,
        m.target_w / 1000.0,
        m.baseline_w / 1000.0
    );
    if !met {
        s.push_str(&format!(
            " (flexible work at its floors reaches {:.1} kW at best: {:.1} kW short without protected work)",
            m.floor_w / 1000.0,
            m.shortfall_w / 1000.0
        ));
    }
    s
}

fn release(m: &GridMemory, rule: &GridRule) -> String {
    match m.rebound_until {
        Some(t) => format!("the rebound limit ends at {t}"),
        None => format!(
            "the event's end; then the rebound limit (the pre-event baseline) for {:.0} min",
            rule.rebound_s / 60.0
        ),
    }
}

fn values(m: &GridMemory, tick: &Tick<'_>, aim_it_w: f64) -> BTreeMap<String, f64> {
    let mut v = BTreeMap::new();
    v.insert("baseline_kw".into(), round3(m.baseline_w / 1000.0));
    v.insert("target_kw".into(), round3(m.target_w / 1000.0));
    v.insert("meter_kw".into(), round3(m.meter_w / 1000.0));
    v.insert("it_kw".into(), round3(tick.meter.it_w / 1000.0));
    v.insert("it_target_kw".into(), round3(aim_it_w / 1000.0));
    v.insert("floor_kw".into(), round3(m.floor_w / 1000.0));
    if m.shortfall_w > 0.0 {
        v.insert("shortfall_kw".into(), round3(m.shortfall_w / 1000.0));
    }
    v
}
