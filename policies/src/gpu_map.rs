//! Per-GPU state laid out by GPU index.
//!
//! The engine keeps a value for many of a site's GPUs (the caps in force, the draws
//! remembered before them). In a map keyed by GPU id each entry carries its own id, and
//! every evaluation would look each id up in the site and build the map again. A
//! [`GpuMap`] made by the engine is a list by GPU index, named by the site's id table
//! ([`GpuIds`], shared): the next evaluation reads it by index, and the ids are only
//! read where the state leaves the engine (the store, the API, the audit). A map made
//! without a site (read from the store, built by hand) keeps its entries by id until
//! the engine lays it out.
//!
//! Either way it behaves as a map ordered by GPU id: it iterates, serializes and
//! compares in id order, so a state reads and writes the same whatever its layout.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use telemetry::site::GpuIds;
use telemetry::EntityId;

/// A map from GPU id to `T`, laid out by GPU index where it was made for a site.
#[derive(Clone)]
pub struct GpuMap<T> {
    /// The site's GPUs `by_gpu` is indexed by (none: every entry is in `other`).
    table: Option<Arc<GpuIds>>,
    by_gpu: Vec<Option<T>>,
    /// How many of `by_gpu` are set.
    count: usize,
    /// Entries for ids the table does not have (or all of them, with no table).
    other: BTreeMap<EntityId, T>,
}

impl<T> Default for GpuMap<T> {
    fn default() -> Self {
        GpuMap {
            table: None,
            by_gpu: Vec::new(),
            count: 0,
            other: BTreeMap::new(),
        }
    }
}

impl<T> GpuMap<T> {
    pub fn new() -> Self {
        Self::default()
    }

    /// A map laid out by the GPUs of `table`: `by_gpu[i]` is the value of GPU `i`.
    /// `by_gpu` is cut or grown to the table's length.
    pub fn by_index(table: Arc<GpuIds>, mut by_gpu: Vec<Option<T>>) -> Self {
        by_gpu.truncate(table.len());
        by_gpu.resize_with(table.len(), || None);
        let count = by_gpu.iter().filter(|v| v.is_some()).count();
        GpuMap {
            table: Some(table),
            by_gpu,
            count,
            other: BTreeMap::new(),
        }
    }

    /// The id table the map is laid out by, if any.
    pub fn table(&self) -> Option<&Arc<GpuIds>> {
        self.table.as_ref()
    }

    /// The values by GPU index of the table (empty with no table).
    pub fn by_gpu(&self) -> &[Option<T>] {
        &self.by_gpu
    }

    /// The entries not laid out by the table, in id order.
    pub fn others(&self) -> &BTreeMap<EntityId, T> {
        &self.other
    }

    pub fn len(&self) -> usize {
        self.count + self.other.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn position(&self, id: &EntityId) -> Option<usize> {
        self.table.as_ref()?.position(id)
    }

    pub fn get(&self, id: &EntityId) -> Option<&T> {
        match self.position(id) {
            Some(i) => self.by_gpu[i].as_ref(),
            None => self.other.get(id),
        }
    }

    pub fn get_mut(&mut self, id: &EntityId) -> Option<&mut T> {
        match self.position(id) {
            Some(i) => self.by_gpu[i].as_mut(),
            None => self.other.get_mut(id),
        }
    }

    pub fn contains_key(&self, id: &EntityId) -> bool {
        self.get(id).is_some()
    }

    /// Sets the value of a GPU, returning the one it had.
    pub fn insert(&mut self, id: EntityId, value: T) -> Option<T> {
        match self.position(&id) {
            Some(i) => {
                let old = self.by_gpu[i].replace(value);
                self.count += usize::from(old.is_none());
                old
            }
            None => self.other.insert(id, value),
        }
    }

    pub fn remove(&mut self, id: &EntityId) -> Option<T> {
        match self.position(id) {
            Some(i) => {
                let old = self.by_gpu[i].take();
                self.count -= usize::from(old.is_some());
                old
            }
            None => self.other.remove(id),
        }
    }

    pub fn clear(&mut self) {
        self.by_gpu.iter_mut().for_each(|v| *v = None);
        self.count = 0;
        self.other.clear();
    }

    /// Keeps the entries `keep` says yes to.
    pub fn retain(&mut self, mut keep: impl FnMut(&EntityId, &mut T) -> bool) {
        if let Some(t) = &self.table {
            for (id, v) in t.ids().iter().zip(&mut self.by_gpu) {
                if v.as_mut().is_some_and(|x| !keep(id, x)) {
                    *v = None;
                    self.count -= 1;
                }
            }
        }
        self.other.retain(|k, v| keep(k, v));
    }

    /// The entries in id order.
    pub fn iter(&self) -> Iter<'_, T> {
        let (ids, order): (&[EntityId], &[u32]) = match &self.table {
            Some(t) if self.count > 0 => (t.ids(), t.by_id()),
            _ => (&[], &[]),
        };
        Iter {
            ids,
            order: order.iter(),
            by_gpu: &self.by_gpu,
            next_laid: None,
            other: self.other.iter().peekable(),
            left: self.len(),
        }
    }

    pub fn keys(&self) -> impl Iterator<Item = &EntityId> + '_ {
        self.iter().map(|(k, _)| k)
    }

    pub fn values(&self) -> impl Iterator<Item = &T> + '_ {
        self.iter().map(|(_, v)| v)
    }
}

/// The entries of a [`GpuMap`] in id order: those laid out by GPU index (in the
/// table's id order) merged with the others.
pub struct Iter<'a, T> {
    ids: &'a [EntityId],
    order: std::slice::Iter<'a, u32>,
    by_gpu: &'a [Option<T>],
    /// The next laid-out entry, read ahead of the merge.
    next_laid: Option<(&'a EntityId, &'a T)>,
    other: std::iter::Peekable<std::collections::btree_map::Iter<'a, EntityId, T>>,
    left: usize,
}

impl<'a, T> Iterator for Iter<'a, T> {
    type Item = (&'a EntityId, &'a T);

    fn next(&mut self) -> Option<Self::Item> {
        if self.next_laid.is_none() {
            for &i in self.order.by_ref() {
                if let Some(v) = &self.by_gpu[i as usize] {
                    self.next_laid = Some((&self.ids[i as usize], v));
                    break;
                }
            }
        }
        let item = match (self.next_laid, self.other.peek()) {
            (Some(a), Some(b)) if b.0 < a.0 => self.other.next(),
            (Some(_), _) => self.next_laid.take(),
            (None, _) => self.other.next(),
        };
        self.left = self.left.saturating_sub(usize::from(item.is_some()));
        item
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left, Some(self.left))
    }
}

impl<'a, T> IntoIterator for &'a GpuMap<T> {
    type Item = (&'a EntityId, &'a T);
    type IntoIter = Iter<'a, T>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

/// The value of a GPU (as a map's index: panics where there is none).
impl<T> std::ops::Index<&EntityId> for GpuMap<T> {
    type Output = T;

    fn index(&self, id: &EntityId) -> &T {
        match self.get(id) {
            Some(v) => v,
            None => panic!("no entry for {id}"),
        }
    }
}

impl<T> FromIterator<(EntityId, T)> for GpuMap<T> {
    fn from_iter<I: IntoIterator<Item = (EntityId, T)>>(iter: I) -> Self {
        GpuMap {
            other: iter.into_iter().collect(),
            ..GpuMap::default()
        }
    }
}

impl<T> From<BTreeMap<EntityId, T>> for GpuMap<T> {
    fn from(other: BTreeMap<EntityId, T>) -> Self {
        GpuMap {
            other,
            ..GpuMap::default()
        }
    }
}

/// Equal when they hold the same entries, whatever their layout.
impl<T: PartialEq> PartialEq for GpuMap<T> {
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

impl<T: std::fmt::Debug> std::fmt::Debug for GpuMap<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

/// A map by GPU id, in id order (as a `BTreeMap` of the same entries).
impl<T: Serialize> Serialize for GpuMap<T> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(self.iter())
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for GpuMap<T> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        BTreeMap::<EntityId, T>::deserialize(d).map(GpuMap::from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(names: &[&str]) -> Arc<GpuIds> {
        Arc::new(GpuIds::new(
            names.iter().map(|n| EntityId::gpu(n, 0)).collect(),
        ))
    }

    #[test]
    fn laid_out_or_not_it_is_the_same_map() {
        // site order is not id order
        let t = table(&["n2", "n10", "n1"]);
        let laid = GpuMap::by_index(t.clone(), vec![Some(2), None, Some(1)]);
        let mut by_id: GpuMap<i32> = GpuMap::new();
        by_id.insert(EntityId::gpu("n1", 0), 1);
        by_id.insert(EntityId::gpu("n2", 0), 2);
        assert_eq!(laid, by_id);
        let json = |m: &GpuMap<i32>| serde_json::to_string(m).expect("a map serializes");
        assert_eq!(json(&laid), json(&by_id));
        let names: Vec<String> = laid.keys().map(|k| k.name.clone()).collect();
        assert_eq!(names, ["n1:0", "n2:0"]);
        let back: GpuMap<i32> = serde_json::from_str(&json(&laid)).expect("it reads back");
        assert_eq!(back, laid);
    }

    #[test]
    fn ids_outside_the_table_merge_in_id_order() {
        let t = table(&["n3", "n1"]);
        let mut m = GpuMap::by_index(t, vec![Some(3), Some(1)]);
        m.insert(EntityId::gpu("n2", 0), 2);
        m.insert(EntityId::gpu("n0", 0), 0);
        m.insert(EntityId::gpu("n4", 0), 4);
        let values: Vec<i32> = m.values().copied().collect();
        assert_eq!(values, [0, 1, 2, 3, 4]);
        assert_eq!(m.iter().size_hint(), (5, Some(5)));
        assert_eq!(m.len(), 5);
        assert_eq!(m.insert(EntityId::gpu("n1", 0), 10), Some(1));
        assert_eq!(m.len(), 5);
        assert_eq!(m.remove(&EntityId::gpu("n3", 0)), Some(3));
        assert_eq!(m.remove(&EntityId::gpu("n3", 0)), None);
        assert_eq!(m.get(&EntityId::gpu("n2", 0)), Some(&2));
        m.retain(|_, v| *v % 2 == 0);
        let values: Vec<i32> = m.values().copied().collect();
        assert_eq!(values, [0, 10, 2, 4]);
        assert_eq!(m.len(), 4);
        m.clear();
        assert!(m.is_empty());
        assert_eq!(m.iter().next(), None);
    }
}
