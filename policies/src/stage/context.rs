//! The evaluation's inputs as every controller reads them: the site's GPUs listed once,
//! the state in force by GPU index, the enabled rules and the scope names explanations
//! are keyed by. Made once per evaluation, before the controllers run.

use std::collections::BTreeMap;
use std::sync::Arc;

use telemetry::site::{GpuIds, GpuRef};
use telemetry::{EntityId, Job, Site, Snapshot, Timestamp};

use crate::index::JobTable;
use crate::plan::{Cap, State};
use crate::rules::Rule;
use crate::rules_eval;
use crate::{Forecast, GpuMap, Policy};

/// Everything the engine looks at.
#[derive(Debug, Clone, Copy)]
pub struct Inputs<'a> {
    pub site: &'a Site,
    pub snapshot: &'a Snapshot,
    pub jobs: &'a [Job],
    /// What is in force now (the previous plan's state, as applied).
    pub prior: &'a State,
    pub policy: &'a Policy,
    /// Price and carbon forecasts (empty when there is no feed).
    pub forecast: &'a Forecast,
    /// The jobs resolved at the edge (their allocated GPUs as GPU indexes, their ids to
    /// positions), where the caller keeps them with its jobs (the job registry does);
    /// `None`: the evaluation resolves them itself.
    pub job_table: Option<&'a JobTable>,
}

/// What the controllers look at: the inputs, and what is made of them once.
pub(crate) struct Context<'a> {
    pub site: &'a Site,
    pub snapshot: &'a Snapshot,
    pub jobs: &'a [Job],
    pub prior: &'a State,
    pub policy: &'a Policy,
    pub forecast: &'a Forecast,
    pub now: Timestamp,
    /// The site's GPUs, listed once: every step indexes into this.
    pub index: rules_eval::Index<'a>,
    /// The site's GPU id table, where per-GPU state is laid out by it.
    pub table: Option<&'a Arc<GpuIds>>,
    /// The caps in force, by GPU index.
    pub prior_caps: Vec<Option<&'a Cap>>,
    /// The enabled rules and their ids (`rules.<name>`), in the policy's order.
    pub rules: Vec<&'a Rule>,
    pub rule_ids: Vec<String>,
    /// Each rack's scope name (`rack/a01`), made once: explanations are keyed by it.
    pub rack_scopes: Vec<String>,
    pub site_scope: String,
}

impl<'a> Context<'a> {
    pub fn new(inputs: &Inputs<'a>, now: Timestamp) -> Self {
        let Inputs {
            site,
            snapshot,
            jobs,
            prior,
            policy,
            forecast,
            job_table,
        } = *inputs;
        let rules: Vec<&Rule> = policy.rules.iter().filter(|r| r.enabled).collect();
        let rule_ids: Vec<String> = rules.iter().map(|r| r.id()).collect();
        let rack_scopes: Vec<String> = site
            .racks
            .iter()
            .map(|r| EntityId::rack(&r.id).to_string())
            .collect();
        let site_scope = site.site_entity().to_string();
        let index = rules_eval::Index::new(site, site.gpus())
            .with_snapshot(snapshot)
            .with_job_table(jobs, job_table);
        let table = gpu_table(site, &index.gpus);
        let prior_caps = by_index(&index, table, &prior.caps);
        Context {
            site,
            snapshot,
            jobs,
            prior,
            policy,
            forecast,
            now,
            index,
            table,
            prior_caps,
            rules,
            rule_ids,
            rack_scopes,
            site_scope,
        }
    }

    /// The site's GPUs, in index order.
    pub fn gpus(&self) -> &[GpuRef<'a>] {
        &self.index.gpus
    }

    /// A per-GPU map of the state as a list by GPU index.
    pub fn by_index<'m, T>(&self, map: &'m GpuMap<T>) -> Vec<Option<&'m T>> {
        by_index(&self.index, self.table, map)
    }

    /// A list by GPU index as a per-GPU map of the state.
    pub fn to_map<T>(&self, list: Vec<Option<T>>) -> GpuMap<T> {
        to_map(self.site, self.table, self.gpus(), list)
    }
}

/// A per-GPU map as a list by the index of the evaluation's GPUs: read in place where
/// the map is laid out by the same GPUs (`table`), else each id found in the site.
fn by_index<'c, T>(
    index: &rules_eval::Index<'_>,
    table: Option<&Arc<GpuIds>>,
    map: &'c GpuMap<T>,
) -> Vec<Option<&'c T>> {
    let n = index.gpus.len();
    let same = matches!((table, map.table()), (Some(a), Some(b)) if Arc::ptr_eq(a, b));
    let mut v: Vec<Option<&T>> = if same {
        map.by_gpu().iter().map(Option::as_ref).collect()
    } else {
        vec![None; n]
    };
    let by_id: Box<dyn Iterator<Item = (&EntityId, &T)>> = if same {
        Box::new(map.others().iter())
    } else {
        Box::new(map.iter())
    };
    for (id, c) in by_id {
        if let Some(i) = index.gpu_index(id) {
            v[i] = Some(c);
        }
    }
    v
}

/// The site's GPU id table, where the evaluation's GPUs are the ones it names (in
/// order): per-GPU state is then laid out by it.
fn gpu_table<'s>(site: &'s Site, gpus: &[GpuRef<'_>]) -> Option<&'s Arc<GpuIds>> {
    site.gpu_table().filter(|t| {
        t.len() == gpus.len()
            && t.ids()
                .iter()
                .zip(gpus)
                .all(|(a, g)| std::ptr::eq(a, &*g.id) || *a == *g.id)
    })
}

/// A list by GPU index as a map by GPU id: laid out by the site's GPU table where
/// there is one, else keyed by id.
fn to_map<T>(
    site: &Site,
    table: Option<&Arc<GpuIds>>,
    gpus: &[GpuRef<'_>],
    mut caps: Vec<Option<T>>,
) -> GpuMap<T> {
    if let Some(t) = table.filter(|_| caps.len() == gpus.len()) {
        // an empty map holds no list
        if caps.iter().all(Option::is_none) {
            return GpuMap::new();
        }
        return GpuMap::by_index(t.clone(), caps);
    }
    let n = gpus.len().min(caps.len());
    let same = caps.len() == gpus.len();
    let mut entry = |i: usize| caps[i].take().map(|c| (EntityId::clone(&gpus[i].id), c));
    // in id order, the map is built without sorting
    let map: BTreeMap<EntityId, T> = match site.gpus_by_id() {
        order if order.len() == gpus.len() && same => {
            order.iter().filter_map(|&i| entry(i as usize)).collect()
        }
        _ => (0..n).filter_map(entry).collect(),
    };
    map.into()
}
