//! One budget evaluation's figures per GPU and each scope's cut: the GPUs' readings and
//! claims, the GPUs reserved for the jobs about to start, and how a scope's cut caps its
//! members (water-filling in the cut order, kept between the two thresholds).

use telemetry::metric::names::POWER_W;
use telemetry::site::GpuRef;
use telemetry::{EntityId, Site, Snapshot, Timestamp};

use super::cut_order::is_protected;
use super::scopes::Members;
use super::{
    facility_budget_kw, gpu_demand, other_w, waterfill, BudgetCap, Claim, Prepared, ScopeView,
};
use crate::policy::BudgetRule;

/// Each GPU's reading in one budget evaluation, by GPU index: its claim, its draw,
/// whether a job may start on it and what it may draw over its demand.
pub(super) struct Readings {
    pub claims: Vec<Claim>,
    pub draws: Vec<f64>,
    /// The GPUs a job may start on: no job holds them and they draw what an idle GPU
    /// does (under their lowest power limit, fresh): a GPU drawing more runs work the
    /// schedulers do not report, one not heard from is counted at its worst already.
    pub free: Vec<bool>,
    /// What a capped GPU with no reading before its cap (its job started under it) may
    /// draw over its demand once its cap lifts: its maximum, less its draw.
    pub unsure: Vec<f64>,
    /// How many GPUs' readings were stale.
    pub stale: usize,
}

impl Readings {
    pub fn of(
        index: &crate::index::Index<'_>,
        prepared: &Prepared<'_>,
        prior_caps: &[Option<&crate::Cap>],
        rule: &BudgetRule,
        now: Timestamp,
    ) -> Readings {
        let gpus = &index.gpus[..];
        let priority = &prepared.priority;
        let uncapped = &prepared.uncapped;
        let mut stale = 0usize;
        let mut claims = Vec::with_capacity(gpus.len());
        let mut draws = Vec::with_capacity(gpus.len());
        let mut free = Vec::with_capacity(gpus.len());
        let mut unsure = vec![0.0; gpus.len()];
        let power = index.metric_id(POWER_W);
        for (i, g) in gpus.iter().enumerate() {
            let obs = power.and_then(|m| index.gpu_observe_id(i, m, now));
            let cap = prior_caps[i].map(|c| c.watts);
            let (draw, demand, was_stale) = gpu_demand(g, obs, cap, uncapped[i], rule);
            if priority[i] != i64::MIN
                && !was_stale
                && uncapped[i].is_none()
                && cap.is_some_and(|c| c < g.model.max_w)
                && demand < g.model.max_w
            {
                unsure[i] = g.model.max_w - demand;
            }
            stale += usize::from(was_stale);
            free.push(priority[i] == i64::MIN && !was_stale && draw < g.model.min_w);
            draws.push(draw);
            claims.push(Claim {
                demand_w: demand,
                min_w: g.model.min_w,
                priority: priority[claims.len()],
            });
        }
        Readings {
            claims,
            draws,
            free,
            unsure,
            stale,
        }
    }
}

/// The GPUs of the jobs about to start, counted at their maximum.
pub(super) struct Starts {
    /// What each adds to its GPU's demand.
    pub extra_w: Vec<f64>,
    pub placed: Vec<bool>,
    pub any_placed: bool,
}

impl Starts {
    /// Counts each placed GPU at its maximum with its job's cut order.
    pub fn reserve(
        gpus: &[GpuRef<'_>],
        claims: &mut [Claim],
        placements: Vec<(usize, i64)>,
    ) -> Starts {
        let mut extra_w = vec![0.0; gpus.len()];
        let mut placed = vec![false; gpus.len()];
        let mut any_placed = false;
        for (i, p) in placements {
            any_placed = true;
            placed[i] = true;
            let max_w = gpus[i].model.max_w;
            extra_w[i] = (max_w - claims[i].demand_w).max(0.0);
            claims[i].demand_w = claims[i].demand_w.max(max_w);
            claims[i].priority = p;
        }
        Starts {
            extra_w,
            placed,
            any_placed,
        }
    }
}

/// The caps the scopes cut so far, by GPU index, with each GPU's demand limited by its
/// cap (what the next scope out counts it at).
pub(super) struct Wanted {
    pub caps: Vec<Option<BudgetCap>>,
    /// Each GPU's claimed demand, or its cap where that is lower.
    pub limited: Vec<f64>,
}

impl Wanted {
    /// Lowers GPU `i`'s cap to `watts` (by `rule`) unless it is that low already;
    /// `demand_w` is the GPU's claimed demand.
    fn tighten(&mut self, i: usize, watts: f64, rule: &'static str, demand_w: f64) {
        match &self.caps[i] {
            Some(w) if w.watts <= watts => {}
            _ => {
                self.caps[i] = Some(BudgetCap { watts, rule });
                self.limited[i] = watts.min(demand_w);
            }
        }
    }
}

/// Each GPU's figures in one budget evaluation, by GPU index.
pub(super) struct PerGpu<'a, 'g> {
    pub gpus: &'a [GpuRef<'g>],
    pub claims: &'a [Claim],
    /// What each GPU may draw over its demand once its cap lifts; `None` where no GPU
    /// may (all zero).
    pub unsure: Option<&'a [f64]>,
    /// What the jobs about to start add to each GPU's demand; `None` where none is
    /// placed (all zero).
    pub extra_w: Option<&'a [f64]>,
    pub prior_caps: &'a [Option<&'a crate::Cap>],
    pub placed: &'a [bool],
    pub free: &'a [bool],
}

impl PerGpu<'_, '_> {
    /// One scope's cut, applied to `wanted`: the scope's members (`(GPU index, share)`)
    /// claim their demand limited by the scopes inside it (what `wanted` holds so far),
    /// each by its share; `gpu_draw` is what they draw (see [`Members::sum`]). The
    /// members' sums are taken in member order, and the list of limited claims is made
    /// only for a scope that needs it.
    #[allow(clippy::too_many_arguments)]
    pub fn cut(
        &self,
        entity: &EntityId,
        budget_kw: f64,
        measured: Option<telemetry::Observation>,
        base_w: f64,
        gpu_draw: f64,
        members: &Members,
        rule: &BudgetRule,
        stale: usize,
        name: &'static str,
        wanted: &mut Wanted,
    ) -> ScopeView {
        // the sums start from -0.0, as `Iterator::sum` of f64 does
        let (mut demand, mut positive) = (-0.0_f64, -0.0_f64);
        for &(a, b, share) in &members.0 {
            for l in &wanted.limited[a as usize..b as usize] {
                let d = l * share;
                demand += d;
                positive += d.max(0.0);
            }
        }
        // with every GPU's figure zero, a sum of the members' is +0.0 (-0.0 for none)
        let zero = if members.is_empty() { -0.0 } else { 0.0 };
        let unsure_w = self.unsure.map_or(zero, |u| members.sum(u));
        let starting_w = self.extra_w.map_or(zero, |e| members.sum(e));
        let limited = || -> Vec<Claim> {
            members
                .iter()
                .map(|(i, share)| {
                    let c = self.claims[i];
                    Claim {
                        demand_w: wanted.limited[i] * share,
                        min_w: c.min_w * share,
                        priority: c.priority,
                    }
                })
                .collect()
        };
        let measured_kw = measured.filter(|o| o.usable()).map(|o| o.value / 1000.0);
        // what is not GPU in this scope: measured minus GPUs, or the site file's estimate
        let other_w = other_w(measured, base_w, gpu_draw);
        let demand_w: f64 = other_w + demand;
        let target_w = budget_kw * 1000.0 * (1.0 - rule.margin) - other_w;
        let over = demand_w > budget_kw * 1000.0 * (1.0 - rule.margin);
        // water-filling only where the demand is over what the scope may share out
        let (claims, alloc, feasible) = if positive - target_w <= 0.0 {
            let claims = if over { limited() } else { Vec::new() };
            let alloc = claims.iter().map(|c| c.demand_w.max(0.0)).collect();
            (claims, alloc, true)
        } else {
            let claims = limited();
            let (alloc, feasible) = waterfill(&claims, target_w);
            (claims, alloc, feasible)
        };
        let view = ScopeView {
            scope: entity.clone(),
            budget_kw,
            measured_kw,
            demand_kw: demand_w / 1000.0,
            feasible,
            stale_inputs: stale,
            starting_kw: starting_w / 1000.0,
            racks: Vec::new(),
        };
        let cut = if over {
            Cut::To(alloc)
        } else if demand_w + unsure_w > budget_kw * 1000.0 * rule.release_ratio {
            Cut::Keep
        } else {
            Cut::Lift
        };
        apply_cut(&cut, self, members, &claims, name, wanted);
        cap_other_idle(&cut, self, members, &claims, name, wanted);
        view
    }

    /// The facility's cut (the contract with the utility), applied to `wanted`: every
    /// GPU with its whole draw, under [`facility_budget_kw`].
    #[allow(clippy::too_many_arguments)]
    pub fn cut_facility(
        &self,
        site: &Site,
        snapshot: &Snapshot,
        draws: &[f64],
        rule: &BudgetRule,
        stale: usize,
        now: Timestamp,
        wanted: &mut Wanted,
    ) -> ScopeView {
        let base_w: f64 = site.nodes.iter().map(|n| n.base_w).sum();
        let entity = site.site_entity();
        let all = Members::all(self.gpus.len());
        let mut view = self.cut(
            &entity,
            facility_budget_kw(site, rule),
            snapshot.observe(&entity, POWER_W, now),
            base_w,
            all.sum(draws),
            &all,
            rule,
            stale,
            "budget.facility",
            wanted,
        );
        view.racks = (0..site.racks.len()).collect();
        view
    }
}

/// What a scope needs this tick.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Cut {
    /// Over budget: cap to these allocations.
    To(Vec<f64>),
    /// Between the two thresholds: keep the caps in force, raise nothing.
    Keep,
    /// Under the release threshold: this scope wants no caps.
    Lift,
}

/// Applies a scope's cut to its members (`(GPU index, share)`), tightening `wanted`;
/// `claims` are the members' limited claims where the cut is [`Cut::To`].
/// Over the release threshold, the caps of GPUs whose demand is unsure (`unsure` > 0:
/// no reading before their cap) stay where they are: the cut counted them at their draw.
fn apply_cut(
    cut: &Cut,
    per_gpu: &PerGpu<'_, '_>,
    members: &Members,
    claims: &[Claim],
    name: &'static str,
    wanted: &mut Wanted,
) {
    let PerGpu {
        gpus, prior_caps, ..
    } = *per_gpu;
    // the cut order is the same in the limited claims as in the GPUs' own
    let priority = |i: usize| per_gpu.claims[i].priority;
    let demand = |i: usize| per_gpu.claims[i].demand_w;
    if let Some(unsure) = per_gpu.unsure.filter(|_| !matches!(cut, Cut::Lift)) {
        for (i, _) in members.iter() {
            if unsure[i] > 0.0 && !is_protected(priority(i)) {
                if let Some(p) = prior_caps[i] {
                    wanted.tighten(i, p.watts, name, demand(i));
                }
            }
        }
    }
    match cut {
        Cut::Lift => {}
        Cut::Keep => {
            // between the two thresholds: budget caps in force stay as they are, but for
            // jobs close to their deadline (the demand already counts them uncapped)
            for (i, _) in members.iter() {
                if is_protected(priority(i)) {
                    continue;
                }
                if let Some(c) = prior_caps[i].filter(|c| *c.rule == *name) {
                    wanted.tighten(i, c.watts, name, demand(i));
                }
            }
        }
        Cut::To(alloc) => {
            for (((i, share), c), a) in members.iter().zip(claims).zip(alloc) {
                if *a < c.demand_w - 1e-6 {
                    // the allocation is of the share through this scope: the GPU's cap
                    // is the allocation over its share
                    let watts = gpus[i].model.clamp_limit(*a / share);
                    wanted.tighten(i, watts, name, demand(i));
                }
            }
        }
    }
}

/// Where a scope's cut caps the idle GPUs the jobs about to start were placed on, its
/// other idle GPUs get the lowest of those caps too: the scheduler may start the jobs
/// on any of them, and an idle GPU under a cap it does not reach loses nothing.
fn cap_other_idle(
    cut: &Cut,
    per_gpu: &PerGpu<'_, '_>,
    members: &Members,
    claims: &[Claim],
    name: &'static str,
    wanted: &mut Wanted,
) {
    let Cut::To(alloc) = cut else {
        return;
    };
    let PerGpu {
        gpus, placed, free, ..
    } = *per_gpu;
    let level = members
        .iter()
        .zip(claims)
        .zip(alloc)
        .filter(|(((i, _), c), a)| placed[*i] && **a < c.demand_w - 1e-6)
        .map(|(((_, share), _), a)| a / share)
        .fold(f64::INFINITY, f64::min);
    if !level.is_finite() {
        return;
    }
    for (i, _) in members.iter() {
        if free[i] && !placed[i] {
            let watts = gpus[i].model.clamp_limit(level);
            wanted.tighten(i, watts, name, per_gpu.claims[i].demand_w);
        }
    }
}
