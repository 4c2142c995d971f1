//! The site seen as scopes: every entity with its GPUs, the GPUs behind each rule's
//! selector, and each GPU's readings, built once per evaluation and shared by the
//! rules and the budget.

use std::borrow::Cow;
use std::sync::Arc;

use telemetry::site::{GpuIds, GpuRef};
use telemetry::snapshot::Slot;
use telemetry::{EntityId, EntityKind, Job, Site, Snapshot, Timestamp};

use crate::rules::{ScopeKind, Selector};

pub use telemetry::fasthash::Fnv;

/// The site seen as scopes: every entity with its GPUs, built once per evaluation.
pub struct Index<'a> {
    pub site: &'a Site,
    pub gpus: Vec<GpuRef<'a>>,
    snapshot: Option<&'a Snapshot>,
    /// Each GPU's slot in the snapshot (built on first use: slot `i` when the snapshot
    /// gave the site's GPUs the first slots, else found by name once).
    slots: std::cell::OnceCell<Vec<Option<Slot>>>,
    /// The evaluation's jobs, whose allocations are looked up once (see
    /// [`Index::allocations`]).
    jobs: Option<&'a [Job]>,
    /// Their allocations, as given (resolved at the edge) or made on first use.
    given: Option<&'a Allocations>,
    allocations: std::cell::OnceCell<Allocations>,
    /// `0..gpus.len()`: a GPU target's list of one GPU is a slice of it (no list made
    /// per GPU).
    positions: std::cell::OnceCell<Vec<usize>>,
}

/// The GPUs a selector picks, as indexes into [`Index::gpus`] in order (see
/// [`Index::gpu_targets`]).
pub struct GpuTargets<'s, 'a> {
    index: &'s Index<'a>,
    sel: &'s Selector,
    racks_ok: Vec<bool>,
    /// Whether the selector picks every GPU.
    all: bool,
    next: usize,
}

impl Iterator for GpuTargets<'_, '_> {
    type Item = usize;

    #[inline]
    fn next(&mut self) -> Option<usize> {
        let gpus = &self.index.gpus;
        while self.next < gpus.len() {
            let i = self.next;
            self.next += 1;
            let g = &gpus[i];
            if self.all
                || (self.racks_ok[g.rack_index]
                    && (self.sel.names.is_empty()
                        || self.sel.names.iter().any(|n| n.matches(&g.id.name))))
            {
                return Some(i);
            }
        }
        None
    }
}

/// Each job's allocated GPUs as indexes into [`Index::gpus`] (GPUs the site does not
/// know are left out), by the job's position in its list.
///
/// Resolved at the edge: the job registry makes it once when its jobs change
/// ([`Allocations::new`]) and hands it to every evaluation in
/// [`Inputs::allocations`](crate::Inputs::allocations), so no evaluation looks up its
/// jobs' GPU names; an evaluation given none (or one made for another site or another
/// number of jobs) makes its own.
#[derive(Debug, Clone, Default)]
pub struct Allocations {
    start: Vec<u32>,
    gpus: Vec<u32>,
    /// The GPU table of the site it was made for.
    table: Option<Arc<GpuIds>>,
}

impl PartialEq for Allocations {
    fn eq(&self, other: &Self) -> bool {
        self.start == other.start && self.gpus == other.gpus
    }
}

impl Allocations {
    /// The allocations of `jobs` on `site`, in the jobs' order.
    pub fn new(site: &Site, jobs: &[Job]) -> Allocations {
        let mut start = Vec::with_capacity(jobs.len() + 1);
        let mut gpus = Vec::with_capacity(jobs.iter().map(|j| j.allocated.len()).sum());
        start.push(0);
        let n = site.gpu_count();
        for j in jobs {
            gpus.extend(
                j.allocated
                    .iter()
                    .filter_map(|g| site.gpu_index(g).filter(|&i| i < n))
                    .map(|i| i as u32),
            );
            start.push(gpus.len() as u32);
        }
        Allocations {
            start,
            gpus,
            table: site.gpu_table().cloned(),
        }
    }

    /// Whether these are for `jobs` (as many) on `site` (its GPU table).
    pub fn fits(&self, site: &Site, jobs: &[Job]) -> bool {
        self.start.len() == jobs.len() + 1
            && matches!((&self.table, site.gpu_table()), (Some(a), Some(b)) if Arc::ptr_eq(a, b))
    }

    /// How many jobs these are for.
    pub fn len(&self) -> usize {
        self.start.len().saturating_sub(1)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The GPU indexes of job `j` (its position in the list).
    pub fn of(&self, j: usize) -> impl Iterator<Item = usize> + '_ {
        let (a, b) = (self.start[j] as usize, self.start[j + 1] as usize);
        self.gpus[a..b].iter().map(|&g| g as usize)
    }
}

impl<'a> Index<'a> {
    pub fn new(site: &'a Site, gpus: Vec<GpuRef<'a>>) -> Self {
        Index {
            site,
            gpus,
            snapshot: None,
            slots: std::cell::OnceCell::new(),
            jobs: None,
            given: None,
            allocations: std::cell::OnceCell::new(),
            positions: std::cell::OnceCell::new(),
        }
    }

    /// The index with the evaluation's jobs, whose allocations it looks up once.
    pub fn with_jobs(mut self, jobs: &'a [Job]) -> Self {
        self.jobs = Some(jobs);
        self
    }

    /// The index with the evaluation's jobs and their allocations resolved at the edge
    /// (used where they fit the jobs and the site, else made anew).
    pub fn with_allocated_jobs(mut self, jobs: &'a [Job], given: Option<&'a Allocations>) -> Self {
        self.jobs = Some(jobs);
        self.given = given.filter(|a| a.fits(self.site, jobs));
        debug_assert!(
            self.given
                .is_none_or(|a| *a == Allocations::new(self.site, jobs)),
            "allocations given for other jobs than the evaluation's"
        );
        self
    }

    /// The jobs' allocations as GPU indexes: for the evaluation's jobs
    /// ([`Index::with_jobs`]) made once and kept, so each job's GPU names are looked up
    /// once per evaluation and not by every controller and rule that reads them; for
    /// another list made anew.
    pub fn allocations(&self, jobs: &[Job]) -> Cow<'_, Allocations> {
        match self.jobs {
            Some(own) if std::ptr::eq(own, jobs) => Cow::Borrowed(match self.given {
                Some(given) => given,
                None => self
                    .allocations
                    .get_or_init(|| Allocations::new(self.site, own)),
            }),
            _ => Cow::Owned(Allocations::new(self.site, jobs)),
        }
    }

    /// The index with the snapshot whose GPU readings [`Index::gpu_observe`] reads.
    pub fn with_snapshot(mut self, snapshot: &'a Snapshot) -> Self {
        self.snapshot = Some(snapshot);
        self
    }

    /// The position of a GPU in `gpus`, from its id (`node:index`).
    pub fn gpu_index(&self, id: &EntityId) -> Option<usize> {
        self.site.gpu_index(id).filter(|&i| i < self.gpus.len())
    }

    /// A GPU's reading of `metric` at `now` (as [`Snapshot::observe`], without finding
    /// the GPU in the snapshot again for each metric).
    pub fn gpu_observe(
        &self,
        gpu: usize,
        metric: &str,
        now: Timestamp,
    ) -> Option<telemetry::Observation> {
        let snap = self.snapshot?;
        let m = snap.metric_id(metric)?;
        let slot = self.gpu_slots(snap)[gpu]?;
        snap.observe_slot(slot, m, now)
    }

    /// The snapshot's id of a metric (see [`Index::gpu_observe_id`]).
    pub fn metric_id(&self, metric: &str) -> Option<telemetry::snapshot::MetricId> {
        self.snapshot?.metric_id(metric)
    }

    /// A GPU's reading of a metric found once with [`Index::metric_id`].
    #[inline(always)]
    pub fn gpu_observe_id(
        &self,
        gpu: usize,
        metric: telemetry::snapshot::MetricId,
        now: Timestamp,
    ) -> Option<telemetry::Observation> {
        let snap = self.snapshot?;
        let slot = self.gpu_slots(snap)[gpu]?;
        snap.observe_slot(slot, metric, now)
    }

    /// Each GPU's slot in the snapshot.
    fn gpu_slots(&self, snap: &Snapshot) -> &[Option<Slot>] {
        self.slots.get_or_init(|| {
            self.gpus
                .iter()
                .enumerate()
                .map(|(i, g)| match snap.entity_at(i as Slot) {
                    Some(e) if *e == *g.id => Some(i as Slot),
                    _ => snap.slot(&g.id),
                })
                .collect()
        })
    }

    /// Rack index of each rack id.
    pub(crate) fn rack_index(&self, id: &str) -> Option<usize> {
        self.site.rack_index(id)
    }

    pub(crate) fn row_of(&self, rack: usize) -> &str {
        &self.site.racks[rack].row
    }

    pub(crate) fn room_of(&self, rack: usize) -> &str {
        let row = self.row_of(rack);
        self.site
            .rows
            .iter()
            .find(|r| r.id == row)
            .map_or("", |r| r.room.as_str())
    }

    /// Whether a rack is inside a `kind/name` container.
    pub(crate) fn rack_within(&self, rack: usize, within: &str) -> bool {
        let Some((kind, name)) = within.split_once('/') else {
            return false;
        };
        let r = &self.site.racks[rack];
        match kind {
            "rack" => r.id == name,
            "row" => r.row == name,
            "room" => self.room_of(rack) == name,
            "cooling" => r.cooling == name,
            "pdu" => r.pdus.iter().any(|p| p == name),
            "feed" => r
                .pdus
                .iter()
                .any(|p| self.site.pdus.iter().any(|x| &x.id == p && x.feed == name)),
            _ => false,
        }
    }

    pub(crate) fn racks_selected(&self, sel: &Selector) -> Vec<bool> {
        self.site
            .racks
            .iter()
            .enumerate()
            .map(|(i, r)| {
                sel.labels
                    .iter()
                    .all(|(k, v)| r.labels.get(k).is_some_and(|x| x == v))
                    && (sel.within.is_empty() || sel.within.iter().any(|w| self.rack_within(i, w)))
            })
            .collect()
    }

    /// The GPUs the selector picks, as indexes into `gpus` (the targets of a GPU rule,
    /// without a list made of them).
    pub fn gpu_targets<'s>(&'s self, sel: &'s Selector) -> GpuTargets<'s, 'a> {
        let racks_ok = self.racks_selected(sel);
        GpuTargets {
            index: self,
            sel,
            // a selector that picks every rack and names no GPUs picks every GPU
            all: sel.names.is_empty() && racks_ok.iter().all(|&ok| ok),
            racks_ok,
            next: 0,
        }
    }

    /// `0..gpus.len()`, whose slices are lists of GPU indexes.
    fn positions(&self) -> &[usize] {
        self.positions
            .get_or_init(|| (0..self.gpus.len()).collect())
    }

    /// The GPU indexes in each of `groups` groups (racks, nodes), by `group` of a GPU:
    /// slices of [`Index::positions`] when each group's GPUs lie together in the
    /// site's order (as a site lists them, rack by rack and node by node), else lists.
    fn grouped(
        &self,
        groups: usize,
        group: impl Fn(&GpuRef<'_>) -> usize,
    ) -> Vec<Cow<'_, [usize]>> {
        // each group's range of positions while the groups lie together
        let mut ranges = vec![0..0; groups];
        let together = self.gpus.iter().enumerate().all(|(i, g)| {
            let r = &mut ranges[group(g)];
            if r.start == r.end {
                *r = i..i + 1;
                true
            } else if r.end == i {
                r.end = i + 1;
                true
            } else {
                false
            }
        });
        if together {
            let positions = self.positions();
            return ranges
                .into_iter()
                .map(|r| Cow::Borrowed(&positions[r]))
                .collect();
        }
        let mut per: Vec<Vec<usize>> = vec![Vec::new(); groups];
        for (i, g) in self.gpus.iter().enumerate() {
            per[group(g)].push(i);
        }
        per.into_iter().map(Cow::Owned).collect()
    }

    /// Every entity of a scope the selector picks, with the GPU indexes inside it.
    pub fn targets(
        &self,
        scope: ScopeKind,
        sel: &Selector,
    ) -> Vec<(Cow<'_, EntityId>, Cow<'_, [usize]>)> {
        let names = |n: &str| sel.names.is_empty() || sel.names.iter().any(|g| g.matches(n));
        let racks_ok = self.racks_selected(sel);
        let gpus_where = |f: &dyn Fn(&GpuRef<'_>) -> bool| -> Cow<'_, [usize]> {
            Cow::Owned(
                self.gpus
                    .iter()
                    .enumerate()
                    .filter(|(_, g)| racks_ok[g.rack_index] && f(g))
                    .map(|(i, _)| i)
                    .collect(),
            )
        };
        let s = self.site;
        let mut out = Vec::new();
        match scope {
            ScopeKind::Site => {
                if names(&s.name) {
                    // every GPU (the common case) without a list made of them
                    let g = if racks_ok.iter().all(|&ok| ok) {
                        Cow::Borrowed(self.positions())
                    } else {
                        gpus_where(&|_| true)
                    };
                    out.push((Cow::Owned(s.site_entity()), g));
                }
            }
            ScopeKind::Room => {
                for room in s.rooms.iter().filter(|r| names(r)) {
                    let g = gpus_where(&|g| self.room_of(g.rack_index) == room);
                    out.push((Cow::Owned(EntityId::new(EntityKind::Room, room)), g));
                }
            }
            ScopeKind::Row => {
                for row in s.rows.iter().filter(|r| names(&r.id)) {
                    let g = gpus_where(&|g| g.rack.row == row.id);
                    out.push((Cow::Owned(EntityId::new(EntityKind::Row, &row.id)), g));
                }
            }
            ScopeKind::Rack => {
                let per = self.grouped(s.racks.len(), |g| g.rack_index);
                for (i, (r, g)) in s.racks.iter().zip(per).enumerate() {
                    if racks_ok[i] && names(&r.id) {
                        out.push((Cow::Owned(EntityId::rack(&r.id)), g));
                    }
                }
            }
            ScopeKind::Node => {
                let per = self.grouped(s.nodes.len(), |g| g.node_index);
                for (node, g) in s.nodes.iter().zip(per) {
                    let Some(rack) = self.rack_index(&node.rack) else {
                        continue;
                    };
                    if racks_ok[rack] && names(&node.id) {
                        out.push((Cow::Owned(EntityId::node(&node.id)), g));
                    }
                }
            }
            ScopeKind::Gpu => {
                out.reserve(self.gpus.len());
                let positions = self.positions();
                for i in self.gpu_targets(sel) {
                    out.push((
                        Cow::Borrowed(&*self.gpus[i].id),
                        Cow::Borrowed(std::slice::from_ref(&positions[i])),
                    ));
                }
            }
            ScopeKind::Cooling => {
                for c in s.cooling.iter().filter(|c| names(&c.id)) {
                    let g = gpus_where(&|g| c.racks.contains(&g.rack.id));
                    out.push((Cow::Owned(EntityId::new(EntityKind::Cooling, &c.id)), g));
                }
            }
            ScopeKind::Pdu => {
                for p in s.pdus.iter().filter(|p| names(&p.id)) {
                    let g = gpus_where(&|g| g.rack.pdus.contains(&p.id));
                    out.push((Cow::Owned(EntityId::new(EntityKind::Pdu, &p.id)), g));
                }
            }
            ScopeKind::Feed => {
                for f in s.feeds.iter().filter(|f| names(&f.id)) {
                    let pdus: Vec<&str> = s
                        .pdus
                        .iter()
                        .filter(|p| p.feed == f.id)
                        .map(|p| p.id.as_str())
                        .collect();
                    let g = gpus_where(&|g| g.rack.pdus.iter().any(|p| pdus.contains(&p.as_str())));
                    out.push((Cow::Owned(EntityId::new(EntityKind::Feed, &f.id)), g));
                }
            }
            ScopeKind::Job => {}
        }
        out
    }

    pub(crate) fn limit(&self, entity: &EntityId, metric: &str) -> Option<f64> {
        let s = self.site;
        match (entity.kind, metric) {
            (EntityKind::Site, "power_w") => Some(s.facility_budget_kw() * 1000.0),
            (EntityKind::Feed, "power_w") => s
                .feeds
                .iter()
                .find(|f| f.id == entity.name)
                .map(|f| f.usable_kw() * 1000.0),
            (EntityKind::Pdu, "power_w") => s
                .pdus
                .iter()
                .find(|p| p.id == entity.name)
                .map(|p| p.usable_kw() * 1000.0),
            (EntityKind::Rack, "power_w") => {
                s.rack(&entity.name).map(|r| r.power_budget_kw * 1000.0)
            }
            (EntityKind::Rack, "inlet_temp_c") => s.rack(&entity.name).map(|r| r.inlet_limit_c),
            (EntityKind::Cooling, "heat_load_kw") => s
                .cooling
                .iter()
                .find(|c| c.id == entity.name)
                .map(|c| c.capacity_kw),
            _ => None,
        }
    }
}
