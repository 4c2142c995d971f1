//! The budgets of a site as scopes: each rack, PDU branch circuit, PDU, row and room
//! (from the policy's `[[budget.limits]]`), utility feed and the facility, with the GPUs
//! behind it as runs of GPU indexes and the share of their draw through it.

use telemetry::fasthash::FnvMap;
use telemetry::site::GpuRef;
use telemetry::{EntityId, EntityKind, Site};

use crate::policy::BudgetRule;

/// One power budget of the hierarchy, with the GPUs behind it and the share of each
/// GPU's draw that flows through it (a node fed by two PDUs draws half through each).
pub(super) struct Scope {
    pub entity: EntityId,
    pub rule: &'static str,
    pub budget_kw: f64,
    pub members: Members,
    pub base_w: f64,
    /// The indexes of the racks its members are in, in order.
    pub racks: Vec<usize>,
}

/// The GPUs of a scope with the share of each one's draw that flows through it, kept
/// as runs of consecutive GPU indexes with one share, `(first, end, share)`: a scope's
/// GPUs are whole racks or nodes, which sit together in the site's order, so a scope
/// of a million GPUs is a handful of runs. Listed in the order they were added.
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct Members(pub Vec<(u32, u32, f64)>);

impl Members {
    /// Adds GPUs `a..b` with `share`, after those there are.
    pub fn push_run(&mut self, a: u32, b: u32, share: f64) {
        match self.0.last_mut() {
            Some(r) if r.1 == a && r.2.to_bits() == share.to_bits() => r.1 = b,
            _ => self.0.push((a, b, share)),
        }
    }

    pub fn push(&mut self, i: usize, share: f64) {
        self.push_run(i as u32, i as u32 + 1, share);
    }

    /// Adds the GPUs of the runs `other`, each with `share`.
    pub fn extend_with(&mut self, other: &[(u32, u32, f64)], share: f64) {
        for &(a, b, _) in other {
            self.push_run(a, b, share);
        }
    }

    /// GPUs `0..n`, each with its whole draw.
    pub fn all(n: usize) -> Members {
        let mut m = Members::default();
        if n > 0 {
            m.push_run(0, n as u32, 1.0);
        }
        m
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The sum of the members' `values` (by GPU index), each by its share, in member
    /// order from -0.0 (as `Iterator::sum` of f64 does).
    pub fn sum(&self, values: &[f64]) -> f64 {
        let mut sum = -0.0_f64;
        for &(a, b, share) in &self.0 {
            for v in &values[a as usize..b as usize] {
                sum += v * share;
            }
        }
        sum
    }

    /// `(GPU index, share)` in order.
    pub fn iter(&self) -> impl Iterator<Item = (usize, f64)> + Clone + '_ {
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

/// Every budget of the site, innermost first: racks, PDU branch circuits, PDUs, rows
/// and rooms (from the policy's `[[budget.limits]]`), utility feeds, the facility.
pub(super) fn scopes(site: &Site, gpus: &[GpuRef<'_>], rule: &BudgetRule) -> Vec<Scope> {
    let site_scopes = SiteScopes::new(site, gpus, rule);
    let mut out = Vec::new();
    site_scopes.racks(&mut out);
    site_scopes.branches(&mut out);
    let (by_pdu, by_feed) = site_scopes.rack_shares();
    site_scopes.pdus(by_pdu, &mut out);
    site_scopes.rows_and_rooms(&mut out);
    site_scopes.feeds(by_feed, &mut out);
    out
}

/// A rack's share of a group (a PDU, a feed), by the group's position.
type RackShares = Vec<(usize, (usize, f64))>;

/// What the scopes of a site are made from: the site, its GPUs (in index order), the
/// policy's limits and each rack's GPUs as runs.
struct SiteScopes<'a, 'g> {
    site: &'a Site,
    gpus: &'a [GpuRef<'g>],
    rule: &'a BudgetRule,
    /// Each rack's GPUs as runs, in the GPUs' order.
    per_rack: Grouped<(u32, u32, f64)>,
    /// PDUs and feeds by position (the first of an id).
    pdu_at: FnvMap<&'a str, usize>,
    feed_at: FnvMap<&'a str, usize>,
}

impl<'a> SiteScopes<'a, '_> {
    fn new<'g>(site: &'a Site, gpus: &'a [GpuRef<'g>], rule: &'a BudgetRule) -> SiteScopes<'a, 'g> {
        let per_rack = Grouped::new(
            site.racks.len(),
            gpus.chunk_by(|a, b| a.rack_index == b.rack_index)
                .scan(0u32, |at, run| {
                    let a = *at;
                    *at += run.len() as u32;
                    Some((run[0].rack_index, (a, *at, 1.0)))
                }),
        );
        SiteScopes {
            site,
            gpus,
            rule,
            per_rack,
            pdu_at: first_positions(site.pdus.iter().map(|p| p.id.as_str())),
            feed_at: first_positions(site.feeds.iter().map(|f| f.id.as_str())),
        }
    }

    /// The policy's limit of a scope, derated, where it gives one.
    fn limit(&self, kind: &str, name: &str) -> Option<f64> {
        self.rule
            .limits
            .iter()
            .find(|l| l.scope == kind && l.name == name)
            .map(|l| l.limit_kw * l.derate)
    }

    /// The racks (in order) whose GPUs are among those of a scope made of whole racks.
    fn racks_in(&self, racks: &mut dyn Iterator<Item = usize>) -> Vec<usize> {
        let mut v: Vec<usize> = racks.filter(|&r| !self.per_rack.of(r).is_empty()).collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    /// Each rack's scope, its GPUs as runs in the GPUs' order.
    fn racks(&self, out: &mut Vec<Scope>) {
        let site = self.site;
        for (ri, r) in site.racks.iter().enumerate() {
            let members = Members(self.per_rack.of(ri).to_vec());
            out.push(Scope {
                entity: EntityId::rack(&r.id),
                rule: "budget.rack",
                budget_kw: self.limit("rack", &r.id).unwrap_or(r.power_budget_kw),
                base_w: r.nodes.iter().map(|&n| site.nodes[n].base_w).sum(),
                racks: self.racks_in(&mut std::iter::once(ri)),
                members,
            });
        }
    }

    /// Branch circuits: nodes whose outlets sit on them, by share of the node's outlets.
    fn branches(&self, out: &mut Vec<Scope>) {
        let site = self.site;
        let branch_of = self.branch_of_outlets();
        if branch_of.is_empty() {
            return;
        }
        let on_branch = self.nodes_on_branches(&branch_of);
        let per_node = self.per_node();
        let rack_end = self.rack_ends();
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
                        budget_kw: self
                            .limit("branch", &name)
                            .unwrap_or(b.rating_kw * p.derate),
                        entity: EntityId::new(EntityKind::Branch, name),
                        rule: "budget.branch",
                        base_w,
                        racks: racks_of(self.gpus, &rack_end, &members),
                        members,
                    });
                }
            }
        }
    }

    /// The branch circuit of each (PDU, outlet) that names one.
    fn branch_of_outlets(&self) -> FnvMap<(&'a str, &'a str), &'a str> {
        self.site
            .pdus
            .iter()
            .flat_map(|p| {
                p.outlets.iter().filter_map(move |o| {
                    o.branch
                        .as_deref()
                        .map(|b| ((p.id.as_str(), o.id.as_str()), b))
                })
            })
            .collect()
    }

    /// The nodes on each (PDU, branch circuit), with the share of each node's outlets
    /// there, in the nodes' order.
    fn nodes_on_branches(
        &self,
        branch_of: &FnvMap<(&'a str, &'a str), &'a str>,
    ) -> FnvMap<(&'a str, &'a str), Vec<(usize, f64)>> {
        let mut on_branch: FnvMap<(&str, &str), Vec<(usize, f64)>> = FnvMap::default();
        for (n, node) in self.site.nodes.iter().enumerate() {
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
        on_branch
    }

    /// Each node's GPUs.
    fn per_node(&self) -> Vec<Members> {
        let mut per_node: Vec<Members> = vec![Members::default(); self.site.nodes.len()];
        for (i, g) in self.gpus.iter().enumerate() {
            per_node[g.node_index].push(i, 1.0);
        }
        per_node
    }

    /// Where each rack's GPUs end (one past its last; a rack whose GPUs do not sit
    /// together ends at each of them, and is walked GPU by GPU).
    fn rack_ends(&self) -> Vec<usize> {
        let racks = self.site.racks.len();
        let mut rack_end = vec![0; racks];
        let mut together = vec![true; racks];
        for (i, g) in self.gpus.iter().enumerate() {
            let r = g.rack_index;
            together[r] &= rack_end[r] == 0 || rack_end[r] == i;
            rack_end[r] = i + 1;
        }
        for (end, ok) in rack_end.iter_mut().zip(together) {
            if !ok {
                *end = 0;
            }
        }
        rack_end
    }

    /// Each rack's share of its PDUs (a rack's GPUs split evenly over the rack's PDUs)
    /// and of their feeds (that of the last PDU of an id), by PDU and by feed position.
    fn rack_shares(&self) -> (RackShares, RackShares) {
        let site = self.site;
        let feed_of: FnvMap<&str, Option<usize>> = site
            .pdus
            .iter()
            .map(|p| (p.id.as_str(), self.feed_at.get(p.feed.as_str()).copied()))
            .collect();
        let mut by_pdu: RackShares = Vec::with_capacity(2 * site.racks.len());
        let mut by_feed: RackShares = Vec::with_capacity(2 * site.racks.len());
        let mut feeds: Vec<(usize, f64)> = Vec::new();
        for (ri, r) in site.racks.iter().enumerate() {
            let share = 1.0 / r.pdus.len().max(1) as f64;
            feeds.clear();
            for p in &r.pdus {
                if let Some(&at) = self.pdu_at.get(p.as_str()) {
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
        (by_pdu, by_feed)
    }

    /// A group (a PDU, a feed) with the racks behind it and the share through it:
    /// its members, its nodes' base power and its racks.
    fn group(&self, rack_base: &[f64], shares: &[(usize, f64)]) -> (Members, f64, Vec<usize>) {
        let mut members = Members::default();
        let mut base_w = 0.0;
        for &(ri, share) in shares {
            base_w += rack_base[ri] * share;
            members.extend_with(self.per_rack.of(ri), share);
        }
        let racks = self.racks_in(&mut shares.iter().map(|&(ri, _)| ri));
        (members, base_w, racks)
    }

    /// Each rack's nodes' base power.
    fn rack_base(&self) -> Vec<f64> {
        let site = self.site;
        site.racks
            .iter()
            .map(|r| r.nodes.iter().map(|&n| site.nodes[n].base_w).sum())
            .collect()
    }

    /// PDUs: a rack's GPUs split evenly over the rack's PDUs.
    fn pdus(&self, by_pdu: RackShares, out: &mut Vec<Scope>) {
        let rack_base = self.rack_base();
        let by_pdu = Grouped::new(self.site.pdus.len(), by_pdu.into_iter());
        for p in &self.site.pdus {
            let (members, base_w, racks) =
                self.group(&rack_base, by_pdu.of(self.pdu_at[p.id.as_str()]));
            if !members.is_empty() {
                out.push(Scope {
                    entity: EntityId::new(EntityKind::Pdu, &p.id),
                    rule: "budget.pdu",
                    budget_kw: self.limit("pdu", &p.id).unwrap_or(p.usable_kw()),
                    members,
                    racks,
                    base_w,
                });
            }
        }
    }

    /// Rows and rooms have budgets only when the policy gives them.
    fn rows_and_rooms(&self, out: &mut Vec<Scope>) {
        let site = self.site;
        for l in self
            .rule
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
                members.extend_with(self.per_rack.of(ri), 1.0);
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
                racks: self.racks_in(&mut racks.into_iter()),
                base_w,
            });
        }
    }

    /// Feeds: the PDUs they supply (only worth a scope when there is more than one).
    fn feeds(&self, by_feed: RackShares, out: &mut Vec<Scope>) {
        let site = self.site;
        if site.feeds.len() <= 1 {
            return;
        }
        let rack_base = self.rack_base();
        let by_feed = Grouped::new(site.feeds.len(), by_feed.into_iter());
        for f in &site.feeds {
            let (members, base_w, racks) =
                self.group(&rack_base, by_feed.of(self.feed_at[f.id.as_str()]));
            out.push(Scope {
                entity: EntityId::new(EntityKind::Feed, &f.id),
                rule: "budget.feed",
                budget_kw: self.limit("feed", &f.id).unwrap_or(f.usable_kw()),
                members,
                racks,
                base_w,
            });
        }
    }
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
