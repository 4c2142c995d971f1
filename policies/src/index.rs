//! The site seen as scopes: every entity with its GPUs, the GPUs behind each rule's
//! selector, and each GPU's readings, built once per evaluation and shared by the
//! rules and the budget.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::Arc;

use telemetry::site::{GpuIds, GpuRef};
use telemetry::snapshot::Slot;
use telemetry::{EntityId, EntityKind, Job, Site, Snapshot, Timestamp};

use crate::plan::Hold;
use crate::rules::{ScopeKind, Selector};

pub use telemetry::fasthash::Fnv;
use telemetry::fasthash::FnvMap;

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
    given: Option<&'a JobTable>,
    allocations: std::cell::OnceCell<JobTable>,
    /// `0..gpus.len()`: a GPU target's list of one GPU is a slice of it (no list made
    /// per GPU).
    positions: std::cell::OnceCell<Vec<usize>>,
    /// Each rack's and each node's range of GPU positions, when their GPUs lie
    /// together in the site's order (as a site lists them), found once per evaluation
    /// rather than by every rule that targets racks, nodes or the GPUs of some racks.
    rack_ranges: std::cell::OnceCell<Option<Vec<std::ops::Range<usize>>>>,
    node_ranges: std::cell::OnceCell<Option<Vec<std::ops::Range<usize>>>>,
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
    /// With racks whose GPUs lie together: the racks' ranges, and the next rack, so
    /// that only the GPUs of the racks picked are visited.
    ranges: Option<&'s [std::ops::Range<usize>]>,
    rack: usize,
}

impl GpuTargets<'_, '_> {
    #[inline]
    fn picks(&self, i: usize) -> bool {
        let g = &self.index.gpus[i];
        self.all
            || (self.racks_ok[g.rack_index]
                && (self.sel.names.is_empty()
                    || self.sel.names.iter().any(|n| n.matches(&g.id.name))))
    }
}

impl Iterator for GpuTargets<'_, '_> {
    type Item = usize;

    #[inline]
    fn next(&mut self) -> Option<usize> {
        if let (Some(ranges), false) = (self.ranges, self.all) {
            // the GPUs of the racks picked, rack by rack, in the site's order
            while self.rack < ranges.len() {
                let r = &ranges[self.rack];
                if !self.racks_ok[self.rack] || self.next >= r.end {
                    self.rack += 1;
                    if let Some(n) = ranges.get(self.rack) {
                        self.next = self.next.max(n.start);
                    }
                    continue;
                }
                let i = self.next.max(r.start);
                self.next = i + 1;
                if self.picks(i) {
                    return Some(i);
                }
            }
            return None;
        }
        let gpus = &self.index.gpus;
        while self.next < gpus.len() {
            let i = self.next;
            self.next += 1;
            if self.picks(i) {
                return Some(i);
            }
        }
        None
    }
}

/// The evaluation's jobs resolved on the site, by their position in the list: each
/// job's allocated GPUs as indexes into [`Index::gpus`] (GPUs the site does not know are
/// left out), and each job's position found from its id.
///
/// Resolved at the edge: the job registry makes it once when its jobs change
/// ([`JobTable::new`]) and hands it to every evaluation in
/// [`Inputs::job_table`](crate::Inputs::job_table), so no evaluation looks up its jobs'
/// GPU names or walks every job to find a held one; an evaluation given none (or one made
/// for another site or another number of jobs) makes its own.
#[derive(Debug, Clone)]
pub struct JobTable {
    start: Vec<u32>,
    gpus: Vec<u32>,
    /// Each job's position by the FNV hash of its id; [`JobTable::SHARED`] where two
    /// ids share a hash (those are found by a scan).
    by_id: FnvMap<u64, u32>,
    /// The GPU table of the site it was made for.
    table: Option<Arc<GpuIds>>,
    /// The hash of `by_id` (FNV; another only in a test of ids that share one).
    hash: fn(&str) -> u64,
}

impl PartialEq for JobTable {
    fn eq(&self, other: &Self) -> bool {
        self.start == other.start && self.gpus == other.gpus && self.by_id == other.by_id
    }
}

fn id_hash(id: &str) -> u64 {
    use std::hash::Hasher;
    let mut h = Fnv::default();
    h.write(id.as_bytes());
    h.finish()
}

impl JobTable {
    /// Marks a hash that more than one job's id has.
    const SHARED: u32 = u32::MAX;

    /// The table of `jobs` on `site`, in the jobs' order.
    pub fn new(site: &Site, jobs: &[Job]) -> JobTable {
        Self::with_hash(site, jobs, id_hash)
    }

    fn with_hash(site: &Site, jobs: &[Job], hash: fn(&str) -> u64) -> JobTable {
        let mut start = Vec::with_capacity(jobs.len() + 1);
        let mut gpus = Vec::with_capacity(jobs.iter().map(|j| j.allocated.len()).sum());
        let mut by_id = FnvMap::with_capacity_and_hasher(jobs.len(), Default::default());
        start.push(0);
        let n = site.gpu_count();
        for (p, j) in jobs.iter().enumerate() {
            gpus.extend(
                j.allocated
                    .iter()
                    .filter_map(|g| site.gpu_index(g).filter(|&i| i < n))
                    .map(|i| i as u32),
            );
            start.push(gpus.len() as u32);
            by_id
                .entry(hash(&j.id))
                .and_modify(|q| *q = Self::SHARED)
                .or_insert(p as u32);
        }
        JobTable {
            start,
            gpus,
            by_id,
            table: site.gpu_table().cloned(),
            hash,
        }
    }

    /// Whether this is for `jobs` (as many) on `site` (its GPU table).
    pub fn fits(&self, site: &Site, jobs: &[Job]) -> bool {
        self.start.len() == jobs.len() + 1
            && matches!((&self.table, site.gpu_table()), (Some(a), Some(b)) if Arc::ptr_eq(a, b))
    }

    /// The GPU indexes of job `j` (its position in the list).
    pub fn of(&self, j: usize) -> impl Iterator<Item = usize> + '_ {
        let (a, b) = (self.start[j] as usize, self.start[j + 1] as usize);
        self.gpus[a..b].iter().map(|&g| g as usize)
    }

    /// The position in `jobs` (the list this table was made for) of the job with this
    /// id (the first one, if the list has it twice).
    pub fn position(&self, jobs: &[Job], id: &str) -> Option<usize> {
        self.positions(jobs, id).next()
    }

    /// Every position in `jobs` of a job with this id (one, unless the list has it more
    /// than once).
    pub fn positions<'j>(&self, jobs: &'j [Job], id: &'j str) -> impl Iterator<Item = usize> + 'j {
        let (one, scan) = match self.by_id.get(&(self.hash)(id)) {
            None => (None, false),
            Some(&Self::SHARED) => (None, true),
            Some(&p) => (
                jobs.get(p as usize)
                    .filter(|j| j.id == id)
                    .map(|_| p as usize),
                false,
            ),
        };
        let scanned = jobs
            .iter()
            .enumerate()
            .filter(move |(_, j)| scan && j.id == id)
            .map(|(p, _)| p);
        one.into_iter().chain(scanned)
    }

    /// A table whose ids all share one hash (to test the scan).
    #[cfg(test)]
    pub(crate) fn with_one_hash(site: &Site, jobs: &[Job]) -> JobTable {
        Self::with_hash(site, jobs, |_| 7)
    }
}

/// The prior hold of each job, by the job's position in the list (each held id found
/// once in the jobs' table, not every job's id looked up).
pub(crate) struct Held<'a>(Vec<Option<&'a Hold>>);

impl<'a> Held<'a> {
    pub(crate) fn new(holds: &'a BTreeMap<String, Hold>, jobs: &[Job], table: &JobTable) -> Self {
        let mut by_job = Vec::new();
        if !holds.is_empty() {
            by_job.resize(jobs.len(), None);
            for (id, h) in holds {
                for p in table.positions(jobs, id) {
                    by_job[p] = Some(h);
                }
            }
        }
        Held(by_job)
    }

    /// The prior hold of the job at position `p`.
    pub(crate) fn get(&self, p: usize) -> Option<&'a Hold> {
        self.0.get(p).copied().flatten()
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
            rack_ranges: std::cell::OnceCell::new(),
            node_ranges: std::cell::OnceCell::new(),
        }
    }

    /// The index with the evaluation's jobs and their table made at the edge (used
    /// where it fits the jobs and the site, else made anew on first use).
    pub fn with_job_table(mut self, jobs: &'a [Job], given: Option<&'a JobTable>) -> Self {
        self.jobs = Some(jobs);
        self.given = given.filter(|t| t.fits(self.site, jobs));
        debug_assert!(
            self.given
                .is_none_or(|t| *t == JobTable::new(self.site, jobs)),
            "a job table given for other jobs than the evaluation's"
        );
        self
    }

    /// The table of the evaluation's jobs (see [`Index::allocations`]).
    pub fn job_table(&self) -> Option<&JobTable> {
        self.jobs.map(|own| self.table_of(own))
    }

    /// The table given for the evaluation's jobs `own`, else made once.
    fn table_of(&self, own: &[Job]) -> &JobTable {
        self.given.unwrap_or_else(|| {
            self.allocations
                .get_or_init(|| JobTable::new(self.site, own))
        })
    }

    /// The position among the evaluation's jobs of the job with this id.
    pub fn job_position(&self, id: &str) -> Option<usize> {
        let own = self.jobs?;
        self.job_table()?.position(own, id)
    }

    /// The jobs' table (their allocations as GPU indexes): for the evaluation's jobs
    /// ([`Index::with_job_table`]) given or made once and kept, so each job's GPU names are
    /// looked up once per evaluation and not by every controller and rule that reads
    /// them; for another list made anew.
    pub fn allocations(&self, jobs: &[Job]) -> Cow<'_, JobTable> {
        match self.jobs {
            Some(own) if std::ptr::eq(own, jobs) => Cow::Borrowed(self.table_of(own)),
            _ => Cow::Owned(JobTable::new(self.site, jobs)),
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
        // the racks' ranges, where they follow one another in the site's order (the
        // GPUs are then visited in the same order as one by one)
        let ranges = self.rack_ranges().map(Vec::as_slice).filter(|r| {
            r.iter()
                .filter(|x| !x.is_empty())
                .zip(r.iter().filter(|x| !x.is_empty()).skip(1))
                .all(|(a, b)| a.end <= b.start)
        });
        GpuTargets {
            index: self,
            sel,
            // a selector that picks every rack and names no GPUs picks every GPU
            all: sel.names.is_empty() && racks_ok.iter().all(|&ok| ok),
            racks_ok,
            next: ranges.and_then(|r| r.first()).map_or(0, |r| r.start),
            ranges,
            rack: 0,
        }
    }

    /// At most how many GPUs the selector picks: the GPUs of the racks it picks (all
    /// of them where the racks' GPUs do not lie together).
    pub(crate) fn gpus_picked_at_most(&self, sel: &Selector) -> usize {
        match self.rack_ranges() {
            Some(ranges) => self
                .racks_selected(sel)
                .iter()
                .zip(ranges)
                .filter(|(ok, _)| **ok)
                .map(|(_, r)| r.len())
                .sum(),
            None => self.gpus.len(),
        }
    }

    /// Each rack's range of GPU positions, when the racks' GPUs lie together.
    fn rack_ranges(&self) -> Option<&Vec<std::ops::Range<usize>>> {
        self.rack_ranges
            .get_or_init(|| self.ranges_of(self.site.racks.len(), |g| g.rack_index))
            .as_ref()
    }

    fn node_ranges(&self) -> Option<&Vec<std::ops::Range<usize>>> {
        self.node_ranges
            .get_or_init(|| self.ranges_of(self.site.nodes.len(), |g| g.node_index))
            .as_ref()
    }

    /// Each group's range of positions, `None` unless every group's GPUs lie together.
    fn ranges_of(
        &self,
        groups: usize,
        group: impl Fn(&GpuRef<'_>) -> usize,
    ) -> Option<Vec<std::ops::Range<usize>>> {
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
        together.then_some(ranges)
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
        ranges: Option<&Vec<std::ops::Range<usize>>>,
    ) -> Vec<Cow<'_, [usize]>> {
        if let Some(ranges) = ranges {
            let positions = self.positions();
            return ranges
                .iter()
                .map(|r| Cow::Borrowed(&positions[r.clone()]))
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
        let q = Query {
            index: self,
            sel,
            racks_ok: self.racks_selected(sel),
        };
        let mut out = Vec::new();
        match scope {
            ScopeKind::Site => q.site(&mut out),
            ScopeKind::Rack | ScopeKind::Node => q.grouped(scope, &mut out),
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
            ScopeKind::Job => {}
            ScopeKind::Room
            | ScopeKind::Row
            | ScopeKind::Cooling
            | ScopeKind::Pdu
            | ScopeKind::Feed => q.equipment(scope, &mut out),
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

/// The targets of a scope, as [`Index::targets`] lists them.
type Targets<'q> = Vec<(Cow<'q, EntityId>, Cow<'q, [usize]>)>;

/// What [`Index::targets`] selects by: the selector, and the racks it keeps.
struct Query<'q, 's, 'a> {
    index: &'q Index<'a>,
    sel: &'s Selector,
    racks_ok: Vec<bool>,
}

impl<'q> Query<'q, '_, '_> {
    /// Whether the selector's names pick `n` (no names pick everything).
    fn names(&self, n: &str) -> bool {
        let sel = self.sel;
        sel.names.is_empty() || sel.names.iter().any(|g| g.matches(n))
    }

    /// The GPUs of the racks kept for which `f` holds, in order.
    fn gpus_where(&self, f: &dyn Fn(&GpuRef<'_>) -> bool) -> Cow<'q, [usize]> {
        let racks_ok = &self.racks_ok;
        Cow::Owned(
            self.index
                .gpus
                .iter()
                .enumerate()
                .filter(|(_, g)| racks_ok[g.rack_index] && f(g))
                .map(|(i, _)| i)
                .collect(),
        )
    }

    /// The site, with its GPUs in the racks kept.
    fn site(&self, out: &mut Targets<'q>) {
        let s = self.index.site;
        if self.names(&s.name) {
            // every GPU (the common case) without a list made of them
            let g = if self.racks_ok.iter().all(|&ok| ok) {
                Cow::Borrowed(self.index.positions())
            } else {
                self.gpus_where(&|_| true)
            };
            out.push((Cow::Owned(s.site_entity()), g));
        }
    }

    /// Racks or nodes, each with its GPUs (slices of the positions where they lie
    /// together).
    fn grouped(&self, scope: ScopeKind, out: &mut Targets<'q>) {
        let (index, s) = (self.index, self.index.site);
        let racks_ok = &self.racks_ok;
        if scope == ScopeKind::Rack {
            let per = index.grouped(s.racks.len(), |g| g.rack_index, index.rack_ranges());
            for (i, (r, g)) in s.racks.iter().zip(per).enumerate() {
                if racks_ok[i] && self.names(&r.id) {
                    out.push((Cow::Owned(EntityId::rack(&r.id)), g));
                }
            }
            return;
        }
        let per = index.grouped(s.nodes.len(), |g| g.node_index, index.node_ranges());
        for (node, g) in s.nodes.iter().zip(per) {
            let Some(rack) = index.rack_index(&node.rack) else {
                continue;
            };
            if racks_ok[rack] && self.names(&node.id) {
                out.push((Cow::Owned(EntityId::node(&node.id)), g));
            }
        }
    }

    /// Rooms, rows, cooling units, PDUs or feeds, each with the GPUs of the racks kept
    /// that it holds or serves.
    fn equipment(&self, scope: ScopeKind, out: &mut Targets<'q>) {
        let (index, s) = (self.index, self.index.site);
        match scope {
            ScopeKind::Room => {
                for room in s.rooms.iter().filter(|r| self.names(r)) {
                    let g = self.gpus_where(&|g| index.room_of(g.rack_index) == room);
                    out.push((Cow::Owned(EntityId::new(EntityKind::Room, room)), g));
                }
            }
            ScopeKind::Row => {
                for row in s.rows.iter().filter(|r| self.names(&r.id)) {
                    let g = self.gpus_where(&|g| g.rack.row == row.id);
                    out.push((Cow::Owned(EntityId::new(EntityKind::Row, &row.id)), g));
                }
            }
            ScopeKind::Cooling => {
                for c in s.cooling.iter().filter(|c| self.names(&c.id)) {
                    let g = self.gpus_where(&|g| c.racks.contains(&g.rack.id));
                    out.push((Cow::Owned(EntityId::new(EntityKind::Cooling, &c.id)), g));
                }
            }
            ScopeKind::Pdu => {
                for p in s.pdus.iter().filter(|p| self.names(&p.id)) {
                    let g = self.gpus_where(&|g| g.rack.pdus.contains(&p.id));
                    out.push((Cow::Owned(EntityId::new(EntityKind::Pdu, &p.id)), g));
                }
            }
            ScopeKind::Feed => {
                for f in s.feeds.iter().filter(|f| self.names(&f.id)) {
                    let pdus: Vec<&str> = s
                        .pdus
                        .iter()
                        .filter(|p| p.feed == f.id)
                        .map(|p| p.id.as_str())
                        .collect();
                    let g = self
                        .gpus_where(&|g| g.rack.pdus.iter().any(|p| pdus.contains(&p.as_str())));
                    out.push((Cow::Owned(EntityId::new(EntityKind::Feed, &f.id)), g));
                }
            }
            _ => {}
        }
    }
}
