//! Power budgets: keep the facility, every utility feed, PDU, branch circuit, rack, and
//! the rows and rooms the policy gives budgets to under their usable power.
//!
//! When the demand of a scope is over its budget, the excess is cut by water-filling in
//! priority order: the GPUs of the lowest-priority jobs (and idle GPUs) are lowered
//! first, each never below its own minimum limit, and within one priority the highest
//! draws are lowered to a common level. Caps lift only once demand is below
//! `release_ratio` × budget (two thresholds), so a scope near its budget does not flap.

mod controller;

pub(crate) use controller::Budget;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use telemetry::fasthash::FnvMap;
use telemetry::metric::names::POWER_W;
use telemetry::site::GpuRef;
use telemetry::{EntityId, EntityKind, Job, Site, Snapshot, Timestamp};

use crate::index::Held;
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

/// The budget rule's wanted cap for one GPU.
#[derive(Debug, Clone, PartialEq)]
pub struct BudgetCap {
    pub watts: f64,
    /// `budget.rack` or `budget.facility`.
    pub rule: &'static str,
}

/// What the budget rule saw for one scope (the facility or a rack).
#[derive(Debug, Clone, PartialEq)]
pub struct ScopeView {
    pub scope: EntityId,
    pub budget_kw: f64,
    pub measured_kw: Option<f64>,
    pub demand_kw: f64,
    pub feasible: bool,
    pub stale_inputs: usize,
    /// Of the demand, what the GPUs of the jobs about to start add (feed-forward).
    pub starting_kw: f64,
    /// Indexes of the racks the scope covers.
    pub racks: Vec<usize>,
}

impl ScopeView {
    pub fn values(&self) -> BTreeMap<String, f64> {
        let mut v = BTreeMap::new();
        v.insert("budget_kw".into(), round3(self.budget_kw));
        v.insert("demand_kw".into(), round3(self.demand_kw));
        if let Some(m) = self.measured_kw {
            v.insert("measured_kw".into(), round3(m));
        }
        if self.stale_inputs > 0 {
            v.insert("stale_inputs".into(), self.stale_inputs as f64);
        }
        if self.starting_kw > 0.0 {
            v.insert("starting_kw".into(), round3(self.starting_kw));
        }
        v
    }
}

pub(crate) use crate::plan::round3;

/// One power budget of the hierarchy, with the GPUs behind it and the share of each
/// GPU's draw that flows through it (a node fed by two PDUs draws half through each).
struct Scope {
    entity: EntityId,
    rule: &'static str,
    budget_kw: f64,
    members: Members,
    base_w: f64,
    /// The indexes of the racks its members are in, in order.
    racks: Vec<usize>,
}

/// The GPUs of a scope with the share of each one's draw that flows through it, kept
/// as runs of consecutive GPU indexes with one share, `(first, end, share)`: a scope's
/// GPUs are whole racks or nodes, which sit together in the site's order, so a scope
/// of a million GPUs is a handful of runs. Listed in the order they were added.
#[derive(Debug, Clone, Default, PartialEq)]
struct Members(Vec<(u32, u32, f64)>);

impl Members {
    /// Adds GPUs `a..b` with `share`, after those there are.
    fn push_run(&mut self, a: u32, b: u32, share: f64) {
        match self.0.last_mut() {
            Some(r) if r.1 == a && r.2.to_bits() == share.to_bits() => r.1 = b,
            _ => self.0.push((a, b, share)),
        }
    }

    fn push(&mut self, i: usize, share: f64) {
        self.push_run(i as u32, i as u32 + 1, share);
    }

    /// Adds the GPUs of the runs `other`, each with `share`.
    fn extend_with(&mut self, other: &[(u32, u32, f64)], share: f64) {
        for &(a, b, _) in other {
            self.push_run(a, b, share);
        }
    }

    /// GPUs `0..n`, each with its whole draw.
    fn all(n: usize) -> Members {
        let mut m = Members::default();
        if n > 0 {
            m.push_run(0, n as u32, 1.0);
        }
        m
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The sum of the members' `values` (by GPU index), each by its share, in member
    /// order from -0.0 (as `Iterator::sum` of f64 does).
    fn sum(&self, values: &[f64]) -> f64 {
        let mut sum = -0.0_f64;
        for &(a, b, share) in &self.0 {
            for v in &values[a as usize..b as usize] {
                sum += v * share;
            }
        }
        sum
    }

    /// `(GPU index, share)` in order.
    fn iter(&self) -> impl Iterator<Item = (usize, f64)> + Clone + '_ {
        self.0
            .iter()
            .flat_map(|&(a, b, share)| (a..b).map(move |i| (i as usize, share)))
    }
}

/// The indexes of the racks the members of a scope are in, in order. A rack's GPUs sit
/// together in the site's order (`rack_end[r]`: the index after rack `r`'s last GPU),
/// so a run of members is walked rack by rack.
fn racks_of(gpus: &[GpuRef<'_>], rack_end: &[usize], members: &Members) -> Vec<usize> {
    let mut racks: Vec<usize> = Vec::new();
    for &(a, b, _) in &members.0 {
        let mut i = a as usize;
        while i < b as usize {
            let r = gpus[i].rack_index;
            if racks.last() != Some(&r) {
                racks.push(r);
            }
            i = rack_end[r].max(i + 1);
        }
    }
    racks.sort_unstable();
    racks.dedup();
    racks
}

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

/// Every budget of the site, innermost first: racks, PDU branch circuits, PDUs, rows
/// and rooms (from the policy's `[[budget.limits]]`), utility feeds, the facility.
fn scopes(site: &Site, gpus: &[GpuRef<'_>], rule: &BudgetRule) -> Vec<Scope> {
    let limit = |kind: &str, name: &str| {
        rule.limits
            .iter()
            .find(|l| l.scope == kind && l.name == name)
            .map(|l| l.limit_kw * l.derate)
    };
    let mut out = Vec::new();
    // racks: each rack's GPUs as runs, in the GPUs' order
    let per_rack = Grouped::new(
        site.racks.len(),
        gpus.chunk_by(|a, b| a.rack_index == b.rack_index)
            .scan(0u32, |at, run| {
                let a = *at;
                *at += run.len() as u32;
                Some((run[0].rack_index, (a, *at, 1.0)))
            }),
    );
    // the racks (in order) whose GPUs are among those of a scope made of whole racks
    let racks_in = |racks: &mut dyn Iterator<Item = usize>| -> Vec<usize> {
        let mut v: Vec<usize> = racks.filter(|&r| !per_rack.of(r).is_empty()).collect();
        v.sort_unstable();
        v.dedup();
        v
    };
    for (ri, r) in site.racks.iter().enumerate() {
        let members = Members(per_rack.of(ri).to_vec());
        out.push(Scope {
            entity: EntityId::rack(&r.id),
            rule: "budget.rack",
            budget_kw: limit("rack", &r.id).unwrap_or(r.power_budget_kw),
            base_w: r.nodes.iter().map(|&n| site.nodes[n].base_w).sum(),
            racks: racks_in(&mut std::iter::once(ri)),
            members,
        });
    }
    // branch circuits: nodes whose outlets sit on them, by share of the node's outlets
    let branch_of: FnvMap<(&str, &str), &str> = site
        .pdus
        .iter()
        .flat_map(|p| {
            p.outlets.iter().filter_map(move |o| {
                o.branch
                    .as_deref()
                    .map(|b| ((p.id.as_str(), o.id.as_str()), b))
            })
        })
        .collect();
    if !branch_of.is_empty() {
        let mut on_branch: FnvMap<(&str, &str), Vec<(usize, f64)>> = FnvMap::default();
        // each node's GPUs
        let mut per_node: Vec<Members> = vec![Members::default(); site.nodes.len()];
        for (i, g) in gpus.iter().enumerate() {
            per_node[g.node_index].push(i, 1.0);
        }
        for (n, node) in site.nodes.iter().enumerate() {
            let share = 1.0 / node.outlets.len().max(1) as f64;
            for o in &node.outlets {
                let Some((pdu, outlet)) = o.split_once('.') else {
                    continue;
                };
                if let Some(b) = branch_of.get(&(pdu, outlet)) {
                    let v = on_branch.entry((pdu, b)).or_default();
                    match v.iter_mut().find(|(x, _)| *x == n) {
                        Some(e) => e.1 += share,
                        None => v.push((n, share)),
                    }
                }
            }
        }
        // where each rack's GPUs end (one past its last; a rack whose GPUs do not sit
        // together ends at each of them, and is walked GPU by GPU)
        let mut rack_end = vec![0; site.racks.len()];
        let mut together = vec![true; site.racks.len()];
        for (i, g) in gpus.iter().enumerate() {
            let r = g.rack_index;
            together[r] &= rack_end[r] == 0 || rack_end[r] == i;
            rack_end[r] = i + 1;
        }
        for (end, ok) in rack_end.iter_mut().zip(together) {
            if !ok {
                *end = 0;
            }
        }
        for p in &site.pdus {
            for b in &p.branches {
                let Some(nodes) = on_branch.get(&(p.id.as_str(), b.id.as_str())) else {
                    continue;
                };
                let mut members = Members::default();
                let mut base_w = 0.0;
                for &(n, share) in nodes {
                    base_w += site.nodes[n].base_w * share;
                    members.extend_with(&per_node[n].0, share);
                }
                if !members.is_empty() {
                    let name = format!("{}.{}", p.id, b.id);
                    out.push(Scope {
                        budget_kw: limit("branch", &name).unwrap_or(b.rating_kw * p.derate),
                        entity: EntityId::new(EntityKind::Branch, name),
                        rule: "budget.branch",
                        base_w,
                        racks: racks_of(gpus, &rack_end, &members),
                        members,
                    });
                }
            }
        }
    }
    // PDUs: a rack's GPUs split evenly over the rack's PDUs
    let rack_base: Vec<f64> = site
        .racks
        .iter()
        .map(|r| r.nodes.iter().map(|&n| site.nodes[n].base_w).sum())
        .collect();
    // each group (a PDU, a feed) with the racks behind it and the share through it
    let group = |shares: &[(usize, f64)]| {
        let mut members = Members::default();
        let mut base_w = 0.0;
        for &(ri, share) in shares {
            base_w += rack_base[ri] * share;
            members.extend_with(per_rack.of(ri), share);
        }
        let racks = racks_in(&mut shares.iter().map(|&(ri, _)| ri));
        (members, base_w, racks)
    };
    // PDUs and feeds by position (the first of an id), and each PDU id's feed (that of
    // the last PDU of the id)
    let pdu_at: FnvMap<&str, usize> = first_positions(site.pdus.iter().map(|p| p.id.as_str()));
    let feed_at: FnvMap<&str, usize> = first_positions(site.feeds.iter().map(|f| f.id.as_str()));
    let feed_of: FnvMap<&str, Option<usize>> = site
        .pdus
        .iter()
        .map(|p| (p.id.as_str(), feed_at.get(p.feed.as_str()).copied()))
        .collect();
    let mut by_pdu: Vec<(usize, (usize, f64))> = Vec::with_capacity(2 * site.racks.len());
    let mut by_feed: Vec<(usize, (usize, f64))> = Vec::with_capacity(2 * site.racks.len());
    let mut feeds: Vec<(usize, f64)> = Vec::new();
    for (ri, r) in site.racks.iter().enumerate() {
        let share = 1.0 / r.pdus.len().max(1) as f64;
        feeds.clear();
        for p in &r.pdus {
            if let Some(&at) = pdu_at.get(p.as_str()) {
                by_pdu.push((at, (ri, share)));
            }
            if let Some(&Some(f)) = feed_of.get(p.as_str()) {
                match feeds.iter_mut().find(|(x, _)| *x == f) {
                    Some(e) => e.1 += share,
                    None => feeds.push((f, share)),
                }
            }
        }
        by_feed.extend(feeds.iter().map(|&(f, sh)| (f, (ri, sh))));
    }
    let by_pdu = Grouped::new(site.pdus.len(), by_pdu.into_iter());
    for p in &site.pdus {
        let (members, base_w, racks) = group(by_pdu.of(pdu_at[p.id.as_str()]));
        if !members.is_empty() {
            out.push(Scope {
                entity: EntityId::new(EntityKind::Pdu, &p.id),
                rule: "budget.pdu",
                budget_kw: limit("pdu", &p.id).unwrap_or(p.usable_kw()),
                members,
                racks,
                base_w,
            });
        }
    }
    // rows and rooms have budgets only when the policy gives them
    for l in rule
        .limits
        .iter()
        .filter(|l| l.scope == "row" || l.scope == "room")
    {
        let in_scope = |r: &telemetry::site::Rack| match l.scope.as_str() {
            "row" => r.row == l.name,
            _ => site
                .rows
                .iter()
                .any(|row| row.id == r.row && row.room == l.name),
        };
        let mut members = Members::default();
        let mut base_w = 0.0;
        let mut racks = Vec::new();
        for (ri, r) in site.racks.iter().enumerate().filter(|(_, r)| in_scope(r)) {
            base_w += r.nodes.iter().map(|&n| site.nodes[n].base_w).sum::<f64>();
            members.extend_with(per_rack.of(ri), 1.0);
            racks.push(ri);
        }
        out.push(Scope {
            entity: EntityId::new(
                if l.scope == "row" {
                    EntityKind::Row
                } else {
                    EntityKind::Room
                },
                &l.name,
            ),
            rule: if l.scope == "row" {
                "budget.row"
            } else {
                "budget.room"
            },
            budget_kw: l.limit_kw * l.derate,
            members,
            racks: racks_in(&mut racks.into_iter()),
            base_w,
        });
    }
    // feeds: the PDUs they supply (only worth a scope when there is more than one)
    if site.feeds.len() > 1 {
        let by_feed = Grouped::new(site.feeds.len(), by_feed.into_iter());
        for f in &site.feeds {
            let (members, base_w, racks) = group(by_feed.of(feed_at[f.id.as_str()]));
            out.push(Scope {
                entity: EntityId::new(EntityKind::Feed, &f.id),
                rule: "budget.feed",
                budget_kw: limit("feed", &f.id).unwrap_or(f.usable_kw()),
                members,
                racks,
                base_w,
            });
        }
    }
    out
}

/// Each id's first position in a list.
fn first_positions<'a>(ids: impl Iterator<Item = &'a str>) -> FnvMap<&'a str, usize> {
    let mut at = FnvMap::default();
    for (k, id) in ids.enumerate() {
        at.entry(id).or_insert(k);
    }
    at
}

/// Items grouped by a key `0..n`, each group's in the order they were given (made once,
/// with no list per group).
struct Grouped<T> {
    start: Vec<usize>,
    items: Vec<T>,
}

impl<T> Grouped<T> {
    fn new(n: usize, pairs: impl Iterator<Item = (usize, T)>) -> Grouped<T> {
        let mut pairs: Vec<(usize, T)> = pairs.collect();
        // stable: each group's items stay in the order given
        pairs.sort_by_key(|&(k, _)| k);
        let mut start = vec![0; n + 1];
        for &(k, _) in &pairs {
            start[k + 1] += 1;
        }
        for k in 0..n {
            start[k + 1] += start[k];
        }
        Grouped {
            start,
            items: pairs.into_iter().map(|(_, item)| item).collect(),
        }
    }

    /// The items of group `k`, in order.
    fn of(&self, k: usize) -> &[T] {
        &self.items[self.start[k]..self.start[k + 1]]
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
    let priority = &prepared.priority;
    let uncapped = &prepared.uncapped;
    let mut stale = 0usize;
    let mut claims = Vec::with_capacity(gpus.len());
    let mut draws = Vec::with_capacity(gpus.len());
    // the GPUs a job may start on: no job holds them and they draw what an idle GPU
    // does (under their lowest power limit, fresh): a GPU drawing more runs work the
    // schedulers do not report, one not heard from is counted at its worst already
    let mut free = Vec::with_capacity(gpus.len());
    // what a capped GPU with no reading before its cap (its job started under it) may
    // draw over its demand once its cap lifts: its maximum, less its draw
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
    let scopes = &prepared.scopes;
    let measured: Vec<Option<telemetry::Observation>> = scopes
        .iter()
        .map(|s| snapshot.observe(&s.entity, POWER_W, now))
        .collect();
    // what each scope's GPUs draw (each by its share), for the headroom the jobs about
    // to start are placed by and for each scope's cut
    let gpu_draws: Vec<f64> = scopes.iter().map(|s| s.members.sum(&draws)).collect();
    // the GPUs of the jobs about to start, at their maximum
    let mut extra_w = vec![0.0; gpus.len()];
    let mut placed = vec![false; gpus.len()];
    let mut any_placed = false;
    for (i, p) in place_starting(
        index, scopes, &measured, &gpu_draws, &claims, &free, jobs, prior, rule, starting, now,
    ) {
        any_placed = true;
        placed[i] = true;
        let max_w = gpus[i].model.max_w;
        extra_w[i] = (max_w - claims[i].demand_w).max(0.0);
        claims[i].demand_w = claims[i].demand_w.max(max_w);
        claims[i].priority = p;
    }

    let per_gpu = PerGpu {
        gpus,
        claims: &claims,
        unsure: (unsure.iter().any(|&u| u > 0.0)).then_some(&unsure[..]),
        extra_w: any_placed.then_some(&extra_w[..]),
        prior_caps,
        placed: &placed,
        free: &free,
    };
    let mut wanted = Wanted {
        caps: vec![None; gpus.len()],
        limited: claims.iter().map(|c| c.demand_w).collect(),
    };
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
    let base_w: f64 = site.nodes.iter().map(|n| n.base_w).sum();
    let entity = site.site_entity();
    let all = Members::all(gpus.len());
    let mut view = per_gpu.cut(
        &entity,
        facility_budget_kw(site, rule),
        snapshot.observe(&entity, POWER_W, now),
        base_w,
        all.sum(&draws),
        &all,
        rule,
        stale,
        "budget.facility",
        &mut wanted,
    );
    view.racks = (0..site.racks.len()).collect();
    views.push(view);
    (wanted.caps, views)
}

/// The caps the scopes cut so far, by GPU index, with each GPU's demand limited by its
/// cap (what the next scope out counts it at).
struct Wanted {
    caps: Vec<Option<BudgetCap>>,
    /// Each GPU's claimed demand, or its cap where that is lower.
    limited: Vec<f64>,
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
struct PerGpu<'a, 'g> {
    gpus: &'a [GpuRef<'g>],
    claims: &'a [Claim],
    /// What each GPU may draw over its demand once its cap lifts; `None` where no GPU
    /// may (all zero).
    unsure: Option<&'a [f64]>,
    /// What the jobs about to start add to each GPU's demand; `None` where none is
    /// placed (all zero).
    extra_w: Option<&'a [f64]>,
    prior_caps: &'a [Option<&'a crate::Cap>],
    placed: &'a [bool],
    free: &'a [bool],
}

impl PerGpu<'_, '_> {
    /// One scope's cut, applied to `wanted`: the scope's members (`(GPU index, share)`)
    /// claim their demand limited by the scopes inside it (what `wanted` holds so far),
    /// each by its share; `gpu_draw` is what they draw (see [`Members::sum`]). The
    /// members' sums are taken in member order, and the list of limited claims is made
    /// only for a scope that needs it.
    #[allow(clippy::too_many_arguments)]
    fn cut(
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

/// What a scope needs this tick.
#[derive(Debug, Clone, PartialEq)]
enum Cut {
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

/// Feed-forward placement: the idle GPUs the jobs about to start would start on, each
/// with its job's cut order. The jobs about to start are the queued jobs that are not
/// held and the held jobs whose hold ends this tick (`starting`, the releases of this
/// tick's plan); the scheduler may start them at any moment before the next tick, on
/// the idle GPUs (`free`). The engine does not know where, so it assumes the placement
/// that hurts most: in the scheduler's order (priority, then submission), each job on
/// the idle GPUs whose tightest scope has the least headroom (GPUs of a node together),
/// a job that does not fit on the idle GPUs left not started at all. So no more GPUs
/// are reserved than the jobs ask for and the idle GPUs present, and only in the scopes
/// they are in.
#[allow(clippy::too_many_arguments)]
fn place_starting(
    index: &crate::index::Index<'_>,
    scopes: &[Scope],
    measured: &[Option<telemetry::Observation>],
    gpu_draws: &[f64],
    claims: &[Claim],
    free: &[bool],
    jobs: &[Job],
    prior: &State,
    rule: &BudgetRule,
    starting: &BTreeSet<String>,
    now: Timestamp,
) -> Vec<(usize, i64)> {
    let gpus = &index.gpus[..];
    let held = Held::new(&prior.holds, jobs, &index.allocations(jobs));
    let mut queued: Vec<(QueueKey, u32)> = jobs
        .iter()
        .enumerate()
        .filter(|&(k, j)| match j.state {
            telemetry::JobState::Pending => held.get(k).is_none() || starting.contains(&j.id),
            telemetry::JobState::Held => starting.contains(&j.id),
            _ => false,
        })
        .filter(|(_, j)| j.gpus > 0)
        .map(|(k, j)| (QueueKey::of(j), k as u32))
        .collect();
    if queued.is_empty() {
        return Vec::new();
    }
    // the scheduler's order: priority (highest first), then submission, then id, then
    // the jobs' order (so the unstable sort keeps jobs that compare equal as listed)
    queued.sort_unstable_by(|(a, p), (b, q)| {
        a.cmp(b)
            .then_with(|| jobs[*p as usize].id.cmp(&jobs[*q as usize].id))
            .then(p.cmp(q))
    });
    // the idle GPUs, in order, and the headroom of each one's tightest scope
    let idle: Vec<usize> = (0..gpus.len()).filter(|&i| free[i]).collect();
    let mut tightest = vec![f64::INFINITY; idle.len()];
    for ((scope, obs), &gpu_draw) in scopes.iter().zip(measured).zip(gpu_draws) {
        // the sum starts from -0.0, as `Iterator::sum` of f64 does
        let mut demand = -0.0_f64;
        for &(a, b, share) in &scope.members.0 {
            for c in &claims[a as usize..b as usize] {
                demand += c.demand_w * share;
            }
        }
        let headroom = scope.budget_kw * 1000.0 * (1.0 - rule.margin)
            - other_w(*obs, scope.base_w, gpu_draw)
            - demand;
        // the scope's idle GPUs: those of each run, found in the ordered list
        for &(a, b, _) in &scope.members.0 {
            let from = idle.partition_point(|&i| i < a as usize);
            let to = from + idle[from..].partition_point(|&i| i < b as usize);
            for t in &mut tightest[from..to] {
                *t = t.min(headroom);
            }
        }
    }
    // the idle GPUs by their tightest headroom (as `f64::total_cmp` orders it), then by
    // index: no two compare equal, so the unstable sort gives the one order
    let mut idle: Vec<(i64, usize)> = idle
        .iter()
        .zip(&tightest)
        .map(|(&i, &t)| (total_order_key(t), i))
        .collect();
    idle.sort_unstable();
    let mut out = Vec::new();
    let mut next = 0;
    for (_, k) in queued {
        let j = &jobs[k as usize];
        let n = j.gpus as usize;
        if idle.len() - next < n {
            continue;
        }
        let p = cut_order_of(j, rule, now);
        out.extend(idle[next..next + n].iter().map(|&(_, i)| (i, p)));
        next += n;
    }
    out
}

/// A queued job's place in the scheduler's order short of its whole id: priority
/// (highest first), submission, then the first 16 bytes of its id (zero-padded, as
/// big-endian bytes compare as the id's bytes do). Two keys that differ order their jobs
/// as the ids would; equal keys leave the order to the whole ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct QueueKey(std::cmp::Reverse<i32>, Timestamp, u64, u64);

impl QueueKey {
    fn of(j: &Job) -> QueueKey {
        let mut head = [0u8; 16];
        let n = j.id.len().min(16);
        head[..n].copy_from_slice(&j.id.as_bytes()[..n]);
        let (hi, lo) = head.split_at(8);
        let word = |b: &[u8]| u64::from_be_bytes(b.try_into().expect("8 bytes"));
        QueueKey(
            std::cmp::Reverse(j.priority),
            j.submit_time,
            word(hi),
            word(lo),
        )
    }
}

/// An integer that orders floats as [`f64::total_cmp`] does.
fn total_order_key(x: f64) -> i64 {
    let bits = x.to_bits() as i64;
    bits ^ ((((bits >> 63) as u64) >> 1) as i64)
}

/// The cut-order tier of jobs close to their deadline: above every class and priority.
const PROTECTED_RANK: i64 = 1 << 24;

/// Whether a cut-order value is that of a job close to its deadline.
fn is_protected(priority: i64) -> bool {
    priority >= (PROTECTED_RANK << 33) - (1 << 32)
}

/// The cut order of each busy GPU: GPUs of jobs whose class comes first in
/// `cut_order` are cut first, then by job priority (lower first); jobs whose slack
/// (latest start − now) is at most `protect_slack_s` are cut last, by priority. Idle
/// GPUs (not in the map) are cut before any job's.
fn job_priority_by_gpu(
    index: &crate::index::Index<'_>,
    jobs: &[Job],
    rule: &BudgetRule,
    now: Timestamp,
) -> Vec<i64> {
    let mut m = vec![i64::MIN; index.gpus.len()];
    let alloc = index.allocations(jobs);
    for (k, j) in jobs
        .iter()
        .enumerate()
        .filter(|(_, j)| j.state == telemetry::JobState::Running)
    {
        let p = cut_order_of(j, rule, now);
        for i in alloc.of(k) {
            m[i] = p;
        }
    }
    m
}

/// A job's place in the cut order (lower is cut first), see [`job_priority_by_gpu`].
fn cut_order_of(j: &Job, rule: &BudgetRule, now: Timestamp) -> i64 {
    let cut_order = &rule.cut_order;
    let urgent = j
        .latest_start()
        .is_some_and(|ls| ls.secs_since(now) <= rule.protect_slack_s);
    let rank = if urgent {
        PROTECTED_RANK
    } else {
        cut_order
            .iter()
            .position(|c| c == &j.class)
            .unwrap_or(cut_order.len()) as i64
    };
    (rank << 33) + i64::from(j.priority)
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
