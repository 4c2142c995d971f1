//! Dense ids of a site's entities, made once when the site is built: racks, nodes and
//! GPUs are numbered by their position in the site (GPU `i` is the `i`-th of
//! [`Site::gpus`]), and names are looked up in hash maps only where they come in
//! (a job's allocation, a sample, a policy's selector).

use std::sync::Arc;

use crate::fasthash::FnvMap;
use crate::{EntityId, EntityKind};

use super::Site;

/// Names to dense ids, and the GPU numbering.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SiteIds {
    racks: FnvMap<String, u32>,
    nodes: FnvMap<String, u32>,
    /// The index in [`Site::gpus`] of each node's first GPU.
    first_gpu: Vec<u32>,
    /// The cooling unit of each rack (its index in [`Site::cooling`]).
    rack_cooling: Vec<Option<u32>>,
    /// The GPUs' ids, shared with the per-GPU state laid out by GPU index.
    gpus: Arc<GpuIds>,
}

/// A site's GPU ids in site order (GPU `i` is the `i`-th of [`Site::gpus`]) and in id
/// order, made once when the site is built. Per-GPU state laid out by GPU index holds
/// it (an `Arc`, shared) to name its entries and to list them in id order.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct GpuIds {
    ids: Vec<EntityId>,
    /// GPU indexes in the order of their ids.
    by_id: Vec<u32>,
}

impl GpuIds {
    /// The table of these ids (in site order).
    pub fn new(ids: Vec<EntityId>) -> GpuIds {
        let mut by_id: Vec<u32> = (0..ids.len() as u32).collect();
        by_id.sort_by(|&a, &b| ids[a as usize].cmp(&ids[b as usize]));
        GpuIds { ids, by_id }
    }

    pub fn len(&self) -> usize {
        self.ids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// The ids in site order.
    pub fn ids(&self) -> &[EntityId] {
        &self.ids
    }

    /// GPU indexes in the order of their ids.
    pub fn by_id(&self) -> &[u32] {
        &self.by_id
    }

    /// The GPU index of an id (a binary search in id order).
    pub fn position(&self, id: &EntityId) -> Option<usize> {
        self.by_id
            .binary_search_by(|&i| self.ids[i as usize].cmp(id))
            .ok()
            .map(|k| self.by_id[k] as usize)
    }
}

impl SiteIds {
    pub(super) fn build(site: &Site) -> SiteIds {
        let racks = site
            .racks
            .iter()
            .enumerate()
            .map(|(i, r)| (r.id.clone(), i as u32))
            .collect();
        let nodes = site
            .nodes
            .iter()
            .enumerate()
            .map(|(i, n)| (n.id.clone(), i as u32))
            .collect();
        let mut first_gpu = vec![u32::MAX; site.nodes.len()];
        let mut k = 0u32;
        for rack in &site.racks {
            for &n in &rack.nodes {
                let node = &site.nodes[n];
                if site.gpu_models.contains_key(&node.gpu_model) {
                    first_gpu[n] = k;
                    k += node.gpus;
                }
            }
        }
        let mut rack_cooling = vec![None; site.racks.len()];
        let by_id: FnvMap<&str, usize> = site
            .racks
            .iter()
            .enumerate()
            .map(|(i, r)| (r.id.as_str(), i))
            .collect();
        for (u, c) in site.cooling.iter().enumerate() {
            for r in &c.racks {
                if let Some(&i) = by_id.get(r.as_str()) {
                    rack_cooling[i].get_or_insert(u as u32);
                }
            }
        }
        // in the order of `Site::gpus`: rack by rack, node by node
        let mut ids = Vec::with_capacity(k as usize);
        for rack in &site.racks {
            for &n in &rack.nodes {
                let node = &site.nodes[n];
                if site.gpu_models.contains_key(&node.gpu_model) {
                    ids.extend((0..node.gpus).map(|i| EntityId::gpu(&node.id, i)));
                }
            }
        }
        SiteIds {
            racks,
            nodes,
            first_gpu,
            rack_cooling,
            gpus: Arc::new(GpuIds::new(ids)),
        }
    }
}

impl Site {
    /// The position of a rack in [`Site::racks`].
    pub fn rack_index(&self, id: &str) -> Option<usize> {
        match self.ids.racks.get(id) {
            Some(&i) if self.racks.get(i as usize).is_some_and(|r| r.id == id) => Some(i as usize),
            // a site changed after it was built
            _ => self.racks.iter().position(|r| r.id == id),
        }
    }

    /// The position of a node in [`Site::nodes`].
    pub fn node_index(&self, id: &str) -> Option<usize> {
        match self.ids.nodes.get(id) {
            Some(&i) if self.nodes.get(i as usize).is_some_and(|n| n.id == id) => Some(i as usize),
            _ => self.nodes.iter().position(|n| n.id == id),
        }
    }

    /// The position of a GPU (`gpu/node:index`) in [`Site::gpus`].
    pub fn gpu_index(&self, id: &EntityId) -> Option<usize> {
        if id.kind != EntityKind::Gpu {
            return None;
        }
        let (node, i) = id.name.rsplit_once(':')?;
        let i: u32 = i.parse().ok()?;
        let n = self.node_index(node)?;
        let first = *self.ids.first_gpu.get(n)?;
        (first != u32::MAX && i < self.nodes[n].gpus).then_some((first + i) as usize)
    }

    /// GPU indexes (into [`Site::gpus`]) in the order of their ids; empty when the
    /// site changed after it was built.
    pub fn gpus_by_id(&self) -> &[u32] {
        match self.gpu_table() {
            Some(t) => t.by_id(),
            None => &[],
        }
    }

    /// The GPUs' ids as made when the site was built; none when the site changed since
    /// (its GPUs are no longer those).
    pub fn gpu_table(&self) -> Option<&Arc<GpuIds>> {
        let t = &self.ids.gpus;
        (t.len() == self.gpu_count()).then_some(t)
    }

    /// The ids made when the site was built of node `n`'s GPUs, where they still are
    /// that node's.
    pub(super) fn node_gpu_ids(&self, n: usize) -> Option<&[EntityId]> {
        let node = self.nodes.get(n)?;
        let first = *self.ids.first_gpu.get(n)? as usize;
        let ids = self.ids.gpus.ids.get(first..first + node.gpus as usize)?;
        ids.first()
            .is_none_or(|e| {
                e.name
                    .strip_prefix(node.id.as_str())
                    .is_some_and(|r| r.starts_with(':'))
            })
            .then_some(ids)
    }

    /// The index in [`Site::cooling`] of the unit that serves a rack (by index).
    pub fn cooling_index_of(&self, rack: usize) -> Option<usize> {
        match self.ids.rack_cooling.get(rack).copied().flatten() {
            Some(u) => Some(u as usize),
            None => {
                let id = &self.racks.get(rack)?.id;
                self.cooling.iter().position(|c| c.racks.contains(id))
            }
        }
    }
}
