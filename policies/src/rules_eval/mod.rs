//! Running `[[rules]]`: for each rule, its scope's entities (or jobs), the condition
//! with its `for` timers, the release condition, minimum hold, ramp and stale handling,
//! and what the active rule wants (caps, clock locks, holds, releases, requeues,
//! suspensions), each with a lease.
//!
//! # Layout
//!
//! - `conditions.rs`: a rule's conditions for one target, in three-valued logic.
//! - `target.rs`: one run over the targets: each target's memory stepped, what the
//!   active rule wants, and why.
//! - `texts.rs`: the rule's texts for the audit.

mod conditions;
mod target;
mod texts;

use std::collections::BTreeMap;
use std::sync::Arc;

use telemetry::{EntityId, Job, JobState, Snapshot, Timestamp};

use conditions::Ctx;
use target::Visit;
use texts::Texts;

pub use crate::index::{Fnv, Index};
use crate::plan::RuleMemories;
use crate::rules::{Rule, RuleAction, ScopeKind};
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

/// The queue's figures (jobs, gpus, short_gpus, min_slack_s) for a site of
/// `site_gpus` GPUs, as the `queue.*` signals read them.
#[cfg(test)]
pub(crate) fn queue_of(jobs: &[Job], site_gpus: usize, now: Timestamp) -> (f64, f64, f64, f64) {
    conditions::Queue::of(jobs, site_gpus, now).fields()
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
    let ctx = Ctx::new(&texts, index, snapshot, forecast, jobs, now, max_defer_s);
    let mut visit = Visit::new(rule, ctx, &texts, memory, (hold_margin_s, max_defer_s), now);
    match rule.scope {
        ScopeKind::Job => run_jobs(&mut visit, rule, index, jobs),
        // a GPU's list of one GPU is its position: no list of targets is made
        ScopeKind::Gpu => {
            visit.by_gpu = true;
            let entries = gpu_entries(memory, index);
            for g in index.gpu_targets(&rule.select) {
                let entity: &EntityId = &index.gpus[g].id;
                let found = match &entries {
                    Some(e) => e.get(g),
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

/// A rule over jobs: each job the action can apply to and the rule selects, with its
/// GPUs, for the site.
fn run_jobs(visit: &mut Visit<'_, '_>, rule: &Rule, index: &Index<'_>, jobs: &[Job]) {
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

/// The position in a GPU rule's prior memory of each GPU's entry, by GPU position: a
/// list over every GPU where the memory holds many of them, a map where it holds few
/// (a rule over one rack of a large site does not make a list of every GPU).
enum GpuEntries {
    Dense(Vec<u32>),
    Sparse(telemetry::fasthash::FnvMap<u32, u32>),
}

impl GpuEntries {
    fn get(&self, g: usize) -> Option<usize> {
        match self {
            GpuEntries::Dense(e) => (e[g] != u32::MAX).then_some(e[g] as usize),
            GpuEntries::Sparse(m) => m.get(&(g as u32)).map(|&i| i as usize),
        }
    }
}

/// For a rule over GPUs, the position in its prior memory of each GPU's entry, by the
/// GPUs' positions the memory kept: `None` unless each of them still names its
/// entry's GPU (a memory read from the store, a changed site), and the entries are
/// found by name. GPUs' names are unique, so a GPU without an entry here has none at
/// all.
fn gpu_entries(memory: &RuleMemories, index: &Index<'_>) -> Option<GpuEntries> {
    let positions = memory.gpu_positions()?;
    let gpus = index.gpus.len();
    let names_ok =
        |g: u32, name: &str| (g as usize) < gpus && *index.gpus[g as usize].id.name == *name;
    // a map while the memory holds under an eighth of the site's GPUs
    if positions.len().saturating_mul(8) < gpus {
        let mut m = telemetry::fasthash::FnvMap::with_capacity_and_hasher(
            positions.len(),
            Default::default(),
        );
        for (i, (&g, (name, _))) in positions.iter().zip(memory.entries()).enumerate() {
            if !names_ok(g, name) || m.insert(g, i as u32).is_some() {
                return None;
            }
        }
        return Some(GpuEntries::Sparse(m));
    }
    let mut entries = vec![u32::MAX; gpus];
    for (i, (&g, (name, _))) in positions.iter().zip(memory.entries()).enumerate() {
        let e = entries.get_mut(g as usize)?;
        if *e != u32::MAX || !names_ok(g, name) {
            return None;
        }
        *e = i as u32;
    }
    Some(GpuEntries::Dense(entries))
}
