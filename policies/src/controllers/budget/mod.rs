//! Power budgets: keep the facility, every utility feed, PDU, branch circuit, rack, and
//! the rows and rooms the policy gives budgets to under their usable power.
//!
//! When the demand of a scope is over its budget, the excess is cut by water-filling in
//! priority order: the GPUs of the lowest-priority jobs (and idle GPUs) are lowered
//! first, each never below its own minimum limit, and within one priority the highest
//! draws are lowered to a common level. Caps lift only once demand is below
//! `release_ratio` × budget (two thresholds), so a scope near its budget does not flap.

pub(crate) mod controller;
mod cut;
mod cut_order;
mod placement;
mod scopes;

use std::collections::BTreeSet;
use std::sync::Arc;

use telemetry::metric::names::POWER_W;
use telemetry::site::GpuRef;
use telemetry::{Job, Site, Snapshot, Timestamp};

use crate::policy::{BudgetRule, OnStale};
use crate::State;

/// One GPU's claim on a budget.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Claim {
    /// What it would draw with no cap, as far as we can tell.
    pub demand_w: f64,
    /// The lowest limit it accepts.
    pub min_w: f64,
    /// Lower is cut first.
    pub priority: i64,
}

/// Allocates `budget_w` among the claims. Returns the allocation of each claim (never
/// above its demand, never below `min(demand, min_w)`) and whether the budget was met.
pub fn waterfill(claims: &[Claim], budget_w: f64) -> (Vec<f64>, bool) {
    let mut alloc: Vec<f64> = claims.iter().map(|c| c.demand_w.max(0.0)).collect();
    let total: f64 = alloc.iter().sum();
    let mut excess = total - budget_w;
    if excess <= 0.0 {
        return (alloc, true);
    }
    // the claims by tier (lowest first), each tier's in their order
    let mut order: Vec<usize> = (0..claims.len()).collect();
    order.sort_by_key(|&i| claims[i].priority);
    for members in order.chunk_by(|&a, &b| claims[a].priority == claims[b].priority) {
        let give = |level: f64| -> f64 {
            members
                .iter()
                .map(|&i| (alloc[i] - level.max(claims[i].min_w)).max(0.0))
                .sum()
        };
        let most = give(0.0);
        if most <= excess {
            for &i in members {
                alloc[i] = alloc[i].min(claims[i].min_w);
            }
            excess -= most;
            continue;
        }
        // find the level whose cut equals the excess: give() falls as the level rises
        let (mut lo, mut hi) = (
            0.0_f64,
            members.iter().map(|&i| alloc[i]).fold(0.0, f64::max),
        );
        for _ in 0..60 {
            let mid = (lo + hi) / 2.0;
            if give(mid) > excess {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        for &i in members {
            alloc[i] = alloc[i].min(hi.max(claims[i].min_w));
        }
        return (alloc, true);
    }
    (alloc, excess <= 1e-9)
}

pub use crate::stage::{BudgetCap, ScopeView};
use cut::{PerGpu, Readings, Starts, Wanted};
use cut_order::job_priority_by_gpu;
use placement::place_starting;
use scopes::{scopes, Scope};

/// What the budget's evaluations of one tick share (the first one and the feed-forward
/// one): the scopes, each GPU's cut order and what it drew before its cap.
pub struct Prepared<'s> {
    scopes: Vec<Scope>,
    priority: Vec<i64>,
    /// What each GPU drew before its cap, where it still runs the job it was read for.
    uncapped: Vec<Option<f64>>,
    /// The prior state's memory of each GPU's draw before its cap, by GPU index.
    remembered: Vec<Option<&'s crate::plan::UncappedDraw>>,
}

/// Prepares the budget's evaluations of one tick; `remembered` is the prior state's
/// memory of each GPU's draw before its cap, by GPU index.
pub fn prepare<'s>(
    site: &Site,
    index: &crate::index::Index<'_>,
    jobs: &[Job],
    remembered: Vec<Option<&'s crate::plan::UncappedDraw>>,
    rule: &BudgetRule,
    now: Timestamp,
) -> Prepared<'s> {
    let gpus = &index.gpus[..];
    let scopes = scopes(site, gpus, rule);
    let uncapped = remembered_draws(index, jobs, &remembered);
    Prepared {
        scopes,
        priority: job_priority_by_gpu(index, jobs, rule, now),
        uncapped,
        remembered,
    }
}

/// Wanted caps per GPU, and what each scope looked like.
///
/// Feed-forward: the jobs about to start (queued jobs free to start, and the held jobs
/// in `starting`, whose hold ends this tick) are placed on idle GPUs before they start
/// (see [`place_starting`]); each GPU they would start on counts at its maximum, with
/// the cut order of its job, in every scope it belongs to. A cut there caps the idle
/// GPU, which bounds what the job draws once it starts; a scope with no idle GPU the
/// jobs would start on reserves nothing.
#[allow(clippy::too_many_arguments)]
pub fn evaluate(
    site: &Site,
    index: &crate::index::Index<'_>,
    prepared: &Prepared<'_>,
    snapshot: &Snapshot,
    prior_caps: &[Option<&crate::Cap>],
    jobs: &[Job],
    prior: &State,
    rule: &BudgetRule,
    starting: &BTreeSet<String>,
    now: Timestamp,
) -> (Vec<Option<BudgetCap>>, Vec<ScopeView>) {
    let gpus = &index.gpus[..];
    let mut read = Readings::of(index, prepared, prior_caps, rule, now);
    let scopes = &prepared.scopes;
    let measured: Vec<Option<telemetry::Observation>> = scopes
        .iter()
        .map(|s| snapshot.observe(&s.entity, POWER_W, now))
        .collect();
    // what each scope's GPUs draw (each by its share), for the headroom the jobs about
    // to start are placed by and for each scope's cut
    let gpu_draws: Vec<f64> = scopes.iter().map(|s| s.members.sum(&read.draws)).collect();
    let placements = place_starting(
        index,
        scopes,
        &measured,
        &gpu_draws,
        &read.claims,
        &read.free,
        jobs,
        prior,
        rule,
        starting,
        now,
    );
    let starts = Starts::reserve(gpus, &mut read.claims, placements);

    let per_gpu = PerGpu {
        gpus,
        claims: &read.claims,
        unsure: (read.unsure.iter().any(|&u| u > 0.0)).then_some(&read.unsure[..]),
        extra_w: starts.any_placed.then_some(&starts.extra_w[..]),
        prior_caps,
        placed: &starts.placed,
        free: &read.free,
    };
    let mut wanted = Wanted {
        caps: vec![None; gpus.len()],
        limited: read.claims.iter().map(|c| c.demand_w).collect(),
    };
    let stale = read.stale;
    let mut views = Vec::with_capacity(scopes.len() + 1);
    // innermost first; each scope shares what its budget leaves among demands already
    // limited by the scopes inside it
    for ((scope, measured), gpu_draw) in scopes.iter().zip(measured).zip(gpu_draws) {
        let mut view = per_gpu.cut(
            &scope.entity,
            scope.budget_kw,
            measured,
            scope.base_w,
            gpu_draw,
            &scope.members,
            rule,
            stale,
            scope.rule,
            &mut wanted,
        );
        view.racks = scope.racks.clone();
        views.push(view);
    }
    // then the facility (the contract with the utility)
    views.push(per_gpu.cut_facility(site, snapshot, &read.draws, rule, stale, now, &mut wanted));
    (wanted.caps, views)
}

/// The facility's budget in kW: the policy's `site` limit (a contract limit) where it
/// gives one, else the sum of the site's feeds after derating.
pub fn facility_budget_kw(site: &Site, rule: &BudgetRule) -> f64 {
    rule.limits
        .iter()
        .find(|l| l.scope == "site")
        .map_or(site.facility_budget_kw(), |l| l.limit_kw * l.derate)
}

/// Each GPU's draw before its cap, where the GPU still runs the job it was read for.
fn remembered_draws(
    index: &crate::index::Index<'_>,
    jobs: &[Job],
    remembered: &[Option<&crate::plan::UncappedDraw>],
) -> Vec<Option<f64>> {
    let mut out = vec![None; index.gpus.len()];
    if remembered.iter().all(Option::is_none) {
        return out;
    }
    let alloc = index.allocations(jobs);
    for (i, j) in running_gpus(&alloc, jobs) {
        out[i] = remembered[i].filter(|d| *d.job == *j.id).map(|d| d.watts);
    }
    out
}

/// (GPU index, its job) for every GPU of a running job.
fn running_gpus<'j>(
    alloc: &'j crate::index::JobTable,
    jobs: &'j [Job],
) -> impl Iterator<Item = (usize, &'j Job)> + 'j {
    jobs.iter()
        .enumerate()
        .filter(|(_, j)| j.state == telemetry::JobState::Running)
        .flat_map(move |(k, j)| alloc.of(k).map(move |i| (i, j)))
}

/// What each capped busy GPU drew before its cap, for the job it runs (the memory
/// [`gpu_demand`] counts it at): a GPU capped now that ran at its default limit until
/// now (no cap was in force, and the limit it reports, if any, is its default) is
/// remembered at its reading now; one capped before keeps what was remembered for the
/// same job; an uncapped or idle GPU, or one running another job, is forgotten.
/// By GPU index.
pub fn remember_uncapped(
    index: &crate::index::Index<'_>,
    prepared: &Prepared<'_>,
    jobs: &[Job],
    prior_caps: &[Option<&crate::Cap>],
    next_caps: &[Option<crate::Cap>],
    now: Timestamp,
) -> Vec<Option<crate::plan::UncappedDraw>> {
    let mut out = vec![None; index.gpus.len()];
    let alloc = index.allocations(jobs);
    let (limit, power) = (
        index.metric_id(telemetry::metric::names::POWER_LIMIT_W),
        index.metric_id(POWER_W),
    );
    let mut last: Option<(&Job, Arc<str>)> = None;
    for (i, j) in running_gpus(&alloc, jobs) {
        if next_caps[i].is_none() {
            continue;
        }
        let g = &index.gpus[i];
        let kept = prepared.remembered[i].filter(|d| *d.job == *j.id);
        let read = || {
            let at_default = limit
                .and_then(|m| index.gpu_observe_id(i, m, now))
                .filter(|o| o.usable())
                .is_none_or(|o| o.value >= g.model.default_w - 0.5);
            let obs = power
                .and_then(|m| index.gpu_observe_id(i, m, now))
                .filter(|o| o.usable())?;
            (prior_caps[i].is_none() && at_default).then(|| crate::plan::UncappedDraw {
                job: match &last {
                    Some((k, id)) if std::ptr::eq(*k, j) => id.clone(),
                    _ => Arc::from(j.id.as_str()),
                },
                watts: obs.value,
                at: now,
            })
        };
        if let Some(d) = kept.cloned().or_else(read) {
            // the job's GPUs come one after another: they share its id
            last = Some((j, d.job.clone()));
            out[i] = Some(d);
        }
    }
    out
}

/// (what it draws now, what it would draw uncapped, whether its reading was stale).
/// A GPU under a cap draws less than it would without: one drawing about what its cap
/// allows would draw more (its maximum, as far as we can tell); one drawing less than
/// its cap still runs slower and draws less than uncapped (a cap bounds the peaks, the
/// average sits under it), so where its draw before the cap is remembered for the job
/// it runs (`uncapped`), that is its demand.
fn gpu_demand(
    g: &GpuRef<'_>,
    obs: Option<telemetry::Observation>,
    cap: Option<f64>,
    uncapped: Option<f64>,
    rule: &BudgetRule,
) -> (f64, f64, bool) {
    let (draw, stale) = match obs {
        Some(o) if o.usable() => (o.value, false),
        Some(o) => match rule.on_stale {
            OnStale::AssumeWorst => (g.model.max_w, true),
            OnStale::HoldLast => (o.value, true),
            OnStale::Ignore => (g.model.idle_w, true),
        },
        None => match rule.on_stale {
            OnStale::Ignore => (g.model.idle_w, true),
            _ => (g.model.max_w, true),
        },
    };
    let capped = cap.is_some_and(|c| c < g.model.max_w);
    let cap = cap.unwrap_or(g.model.default_w);
    // a GPU drawing what its cap allows would draw more without it: assume its maximum
    // (unless it drew more than its cap before it: then that)
    let at_cap = draw >= cap - rule.deadband_w.max(cap * 0.03);
    let demand = match uncapped.filter(|_| capped && !stale) {
        Some(u) if at_cap && u < cap => g.model.max_w,
        Some(u) => u.max(draw),
        None if at_cap && capped => g.model.max_w,
        None => draw,
    };
    (draw, demand, stale)
}

/// What is not GPU in a scope: measured minus its GPUs' draw, or the site file's
/// estimate of its nodes' base power when unmeasured.
fn other_w(measured: Option<telemetry::Observation>, base_w: f64, gpu_draw_w: f64) -> f64 {
    match measured.filter(|o| o.usable()) {
        Some(o) => (o.value - gpu_draw_w).max(0.0),
        None => base_w,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn claim(d: f64, p: i64) -> Claim {
        Claim {
            demand_w: d,
            min_w: 100.0,
            priority: p,
        }
    }

    #[test]
    fn nothing_is_cut_under_budget() {
        let (a, ok) = waterfill(&[claim(300.0, 0), claim(200.0, 0)], 600.0);
        assert!(ok);
        assert_eq!(a, vec![300.0, 200.0]);
    }

    #[test]
    fn the_lowest_priority_is_cut_first_and_never_below_its_minimum() {
        let claims = [claim(300.0, 0), claim(300.0, 5), claim(300.0, 0)];
        let (a, ok) = waterfill(&claims, 700.0);
        assert!(ok);
        assert_eq!(a[1], 300.0, "high priority untouched");
        assert!(
            (a[0] - 200.0).abs() < 1e-6 && (a[2] - 200.0).abs() < 1e-6,
            "{a:?}"
        );
        let (a, ok) = waterfill(&claims, 450.0);
        assert!(ok);
        assert_eq!((a[0], a[2]), (100.0, 100.0));
        assert!((a[1] - 250.0).abs() < 1e-6, "{a:?}");
    }

    #[test]
    fn an_infeasible_budget_is_reported_with_everything_at_minimum() {
        let (a, ok) = waterfill(&[claim(300.0, 0), claim(300.0, 1)], 150.0);
        assert!(!ok);
        assert_eq!(a, vec![100.0, 100.0]);
    }

    #[test]
    fn within_a_tier_the_highest_draws_are_cut_to_a_common_level() {
        let (a, _) = waterfill(&[claim(300.0, 0), claim(150.0, 0), claim(280.0, 0)], 650.0);
        assert_eq!(a[1], 150.0);
        assert!(
            (a[0] - 250.0).abs() < 1e-6 && (a[2] - 250.0).abs() < 1e-6,
            "{a:?}"
        );
    }

    proptest! {
        #[test]
        fn a_feasible_budget_is_never_exceeded(
            demands in proptest::collection::vec((0.0f64..700.0, 50.0f64..200.0, 0i64..4), 1..60),
            budget in 0.0f64..30_000.0,
        ) {
            let claims: Vec<Claim> = demands.iter().map(|&(d, m, p)| Claim { demand_w: d, min_w: m, priority: p }).collect();
            let floor: f64 = claims.iter().map(|c| c.demand_w.min(c.min_w)).sum();
            let (alloc, ok) = waterfill(&claims, budget);
            let total: f64 = alloc.iter().sum();
            if floor <= budget {
                prop_assert!(ok);
                prop_assert!(total <= budget + 1e-6, "total {total} over budget {budget}");
            } else {
                prop_assert!(!ok);
            }
            for (a, c) in alloc.iter().zip(&claims) {
                prop_assert!(*a <= c.demand_w + 1e-9);
                prop_assert!(*a >= c.demand_w.min(c.min_w) - 1e-9);
            }
        }
    }
}
