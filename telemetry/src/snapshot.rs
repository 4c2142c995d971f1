//! The snapshot: the latest value and its age for every metric of every entity.
//!
//! It is the one read model everything downstream looks at. Staleness is explicit: an
//! [`Observation`] says how old its value is and whether that is older than the
//! metric's freshness bound.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::{EntityId, Metric, Quality, Sample, Timestamp};

/// Freshness bound for metrics that are not canonical and have no override.
pub const DEFAULT_FRESHNESS_S: f64 = 60.0;
/// A sample stamped further ahead than this of the ingest time is rejected.
pub const MAX_FUTURE_SKEW_S: f64 = 30.0;
/// A sample stamped further back than this is rejected: it is history, not telemetry.
pub const MAX_PAST_S: f64 = 86_400.0;

/// The latest reading of one metric.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Reading {
    pub value: f64,
    pub ts: Timestamp,
    pub source: std::borrow::Cow<'static, str>,
    pub quality: Quality,
}

/// A reading as seen at a given time.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Observation {
    pub value: f64,
    pub ts: Timestamp,
    pub age_s: f64,
    pub stale: bool,
    pub quality: Quality,
}

impl Observation {
    /// Fresh and not marked bad by its source: a rule may act on it.
    pub fn usable(&self) -> bool {
        !self.stale && self.quality != Quality::Bad
    }
}

/// Why a sample did not enter the snapshot.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum Rejected {
    #[error("{entity} {metric}: value {value} is not a finite number")]
    NotFinite {
        entity: EntityId,
        metric: Metric,
        value: f64,
    },
    #[error("{entity} {metric}: {} is outside the physical range {min}..={max}", Num(*.value))]
    OutOfRange {
        entity: EntityId,
        metric: Metric,
        value: f64,
        min: f64,
        max: f64,
    },
    #[error("{entity} {metric}: timestamp {ts} is {ahead_s:.0} s in the future")]
    FromFuture {
        entity: EntityId,
        metric: Metric,
        ts: Timestamp,
        ahead_s: f64,
    },
    #[error("{entity} {metric}: timestamp {ts} is {behind_s:.0} s old")]
    Ancient {
        entity: EntityId,
        metric: Metric,
        ts: Timestamp,
        behind_s: f64,
    },
}

impl Rejected {
    /// A short reason label, for counters.
    pub fn reason(&self) -> &'static str {
        match self {
            Rejected::NotFinite { .. } => "not_finite",
            Rejected::OutOfRange { .. } => "out_of_range",
            Rejected::FromFuture { .. } => "future_timestamp",
            Rejected::Ancient { .. } => "ancient_timestamp",
        }
    }
}

/// A number as people read it: at most six decimals, no float noise.
struct Num(f64);

impl std::fmt::Display for Num {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let r = (self.0 * 1e6).round() / 1e6;
        write!(f, "{r}")
    }
}

/// What happened to an accepted sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ingested {
    /// It is now the latest value.
    Updated,
    /// An equal or newer value was already there; nothing changed.
    OlderIgnored,
    /// It is the latest value, and it is a counter (`energy_j`) that went backwards:
    /// the device was reset or the counter wrapped. Deltas across it are not energy.
    CounterReset,
}

/// A dense id of an entity in one snapshot: its position in the order entities were
/// first seen (or registered with [`Snapshot::register`]). Stable for the snapshot's
/// life; read with [`Snapshot::slot`] once, then use it instead of the name.
pub type Slot = u32;

/// A dense id of a metric in one snapshot (see [`Snapshot::metric_id`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MetricId(u16);

/// The readings of one entity: one per metric, in the order the metrics were first seen.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Readings(Vec<(MetricId, Reading)>);

impl Readings {
    fn get(&self, m: MetricId) -> Option<&Reading> {
        self.0.iter().find(|(k, _)| *k == m).map(|(_, r)| r)
    }
    fn get_mut(&mut self, m: MetricId) -> Option<&mut Reading> {
        self.0.iter_mut().find(|(k, _)| *k == m).map(|(_, r)| r)
    }
    /// Adds a metric's reading, growing the list by one: an entity has a handful of
    /// metrics, and a million GPUs' lists grown by doubling would hold room for twice
    /// their readings.
    fn push(&mut self, m: MetricId, r: Reading) {
        self.0.reserve_exact(1);
        self.0.push((m, r));
    }
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
    pub fn len(&self) -> usize {
        self.0.len()
    }
}

/// A metric the snapshot has seen, with its freshness bound.
#[derive(Debug, Clone, PartialEq)]
struct MetricSlot {
    metric: Metric,
    fresh_s: f64,
    counter: bool,
}

/// Latest value of every metric of every entity. Each entity gets a dense [`Slot`] and
/// each metric a [`MetricId`] the first time it is seen, so that readings live in
/// vectors indexed by them and the engine, having found an entity once, reads by
/// index; names are hashed only where they come in. The iterators that list readings
/// ([`Snapshot::iter`], [`Snapshot::samples`], [`Snapshot::stale`]) go in entity
/// order, so what is listed is deterministic.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// Each entity's slot by the hash of its id: the ids themselves are kept once, in
    /// `entities` (a site of a million GPUs would otherwise hold each id twice).
    slots: crate::fasthash::FnvMap<u64, Slot>,
    /// Ids whose hash another id had first (rare), with their slots.
    collided: crate::fasthash::FnvMap<EntityId, Slot>,
    entities: Vec<EntityId>,
    readings: Vec<Readings>,
    metrics: Vec<MetricSlot>,
    freshness: BTreeMap<Metric, f64>,
    /// The slot the last sample went to: a poll lists entities in the same order every
    /// time (a site's GPUs in slot order, then each rack's readings), so the next
    /// sample is most often for this slot or the one after it, found without hashing.
    last: Slot,
}

/// The hash an entity's slot is found by.
fn id_hash(e: &EntityId) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = crate::fasthash::Fnv::default();
    e.hash(&mut h);
    h.finish()
}

/// Two snapshots are equal when they hold the same readings, whatever the order their
/// entities and metrics were first seen in.
impl PartialEq for Snapshot {
    fn eq(&self, other: &Self) -> bool {
        self.freshness == other.freshness
            && self.len() == other.len()
            && self.iter().zip(other.iter()).all(|(a, b)| a == b)
    }
}

impl Snapshot {
    pub fn new() -> Self {
        Self::default()
    }

    /// Gives each of `entities` a slot, in this order, before any reading arrives (a
    /// site's entities, so that slot `i` is the site's `i`-th entity). An entity that
    /// already has one keeps it. An entity with no reading is listed nowhere.
    pub fn register<'e>(&mut self, entities: impl IntoIterator<Item = &'e EntityId>) {
        for e in entities {
            self.slot_or_insert(e);
        }
    }

    fn slot_or_insert(&mut self, e: &EntityId) -> Slot {
        let next = self.last.wrapping_add(1);
        for s in [next, self.last] {
            if self.entities.get(s as usize) == Some(e) {
                self.last = s;
                return s;
            }
        }
        let s = self.slot_or_insert_hashed(id_hash(e), e);
        self.last = s;
        s
    }

    fn slot_or_insert_hashed(&mut self, h: u64, e: &EntityId) -> Slot {
        if let Some(s) = self.find(h, e) {
            return s;
        }
        let s = self.entities.len() as Slot;
        match self.slots.entry(h) {
            std::collections::hash_map::Entry::Vacant(v) => {
                v.insert(s);
            }
            std::collections::hash_map::Entry::Occupied(_) => {
                self.collided.insert(e.clone(), s);
            }
        }
        self.entities.push(e.clone());
        self.readings.push(Readings::default());
        s
    }

    fn find(&self, h: u64, e: &EntityId) -> Option<Slot> {
        match self.slots.get(&h) {
            Some(&s) if self.entities[s as usize] == *e => Some(s),
            Some(_) => self.collided.get(e).copied(),
            None => None,
        }
    }

    /// The slot of an entity, if the snapshot has seen it.
    pub fn slot(&self, entity: &EntityId) -> Option<Slot> {
        self.find(id_hash(entity), entity)
    }

    /// The entity in a slot.
    pub fn entity_at(&self, slot: Slot) -> Option<&EntityId> {
        self.entities.get(slot as usize)
    }

    /// How many slots there are (entities seen or registered).
    pub fn slots(&self) -> usize {
        self.entities.len()
    }

    /// The id of a metric, if the snapshot has seen it.
    pub fn metric_id(&self, metric: &str) -> Option<MetricId> {
        self.metrics
            .iter()
            .position(|m| m.metric.as_str() == metric)
            .map(|i| MetricId(i as u16))
    }

    fn metric_or_insert(&mut self, metric: &Metric) -> MetricId {
        if let Some(id) = self.metric_id(metric.as_str()) {
            return id;
        }
        let fresh_s = self.freshness_s(metric);
        self.metrics.push(MetricSlot {
            metric: metric.clone(),
            fresh_s,
            counter: metric.as_str() == crate::metric::names::ENERGY_J,
        });
        MetricId((self.metrics.len() - 1) as u16)
    }

    /// Overrides the freshness bound of one metric.
    pub fn set_freshness(&mut self, metric: &str, secs: f64) {
        self.freshness.insert(Metric::new(metric), secs);
        for m in &mut self.metrics {
            if m.metric.as_str() == metric {
                m.fresh_s = secs;
            }
        }
    }

    pub fn freshness_s(&self, metric: &Metric) -> f64 {
        self.freshness
            .get(metric)
            .copied()
            .or_else(|| metric.spec().map(|s| s.freshness_s))
            .unwrap_or(DEFAULT_FRESHNESS_S)
    }

    /// Validates a sample and keeps it if it is newer than what is there.
    pub fn ingest(&mut self, sample: Sample, now: Timestamp) -> Result<Ingested, Rejected> {
        validate(&sample, now)?;
        let slot = self.slot_or_insert(&sample.entity);
        let m = self.metric_or_insert(&sample.metric);
        let counter = self.metrics[m.0 as usize].counter;
        let readings = &mut self.readings[slot as usize];
        if let Some(old) = readings.get_mut(m) {
            // a known reading is updated in place
            if old.ts > sample.ts {
                return Ok(Ingested::OlderIgnored);
            }
            let reset = counter && sample.value < old.value;
            old.value = sample.value;
            old.ts = sample.ts;
            old.quality = sample.quality;
            if old.source != sample.source {
                old.source = sample.source;
            }
            return Ok(if reset {
                Ingested::CounterReset
            } else {
                Ingested::Updated
            });
        }
        readings.push(
            m,
            Reading {
                value: sample.value,
                ts: sample.ts,
                source: sample.source,
                quality: sample.quality,
            },
        );
        Ok(Ingested::Updated)
    }

    /// The latest value of `metric` of `entity` as seen at `now`, with its age.
    pub fn observe(&self, entity: &EntityId, metric: &str, now: Timestamp) -> Option<Observation> {
        let m = self.metric_id(metric)?;
        self.observe_slot(self.slot(entity)?, m, now)
    }

    /// [`Snapshot::observe`] by slot and metric id: no name is looked up.
    pub fn observe_slot(
        &self,
        slot: Slot,
        metric: MetricId,
        now: Timestamp,
    ) -> Option<Observation> {
        let r = self.readings.get(slot as usize)?.get(metric)?;
        let age_s = now.secs_since(r.ts).max(0.0);
        Some(Observation {
            value: r.value,
            ts: r.ts,
            age_s,
            stale: age_s > self.metrics[metric.0 as usize].fresh_s,
            quality: r.quality,
        })
    }

    /// The entities with readings, in entity order.
    fn sorted(&self) -> Vec<(&EntityId, &Readings)> {
        let mut v: Vec<_> = self
            .entities
            .iter()
            .zip(&self.readings)
            .filter(|(_, r)| !r.is_empty())
            .collect();
        v.sort_unstable_by(|a, b| a.0.cmp(b.0));
        v
    }

    /// One entity's readings by metric name order.
    fn by_metric<'s>(&'s self, r: &'s Readings) -> Vec<(&'s Metric, &'s Reading)> {
        let mut v: Vec<_> =
            r.0.iter()
                .map(|(m, x)| (&self.metrics[m.0 as usize].metric, x))
                .collect();
        v.sort_unstable_by(|a, b| a.0.cmp(b.0));
        v
    }

    /// Every reading, by entity then metric.
    pub fn iter(&self) -> impl Iterator<Item = (&EntityId, &Metric, &Reading)> {
        self.sorted()
            .into_iter()
            .flat_map(|(e, r)| self.by_metric(r).into_iter().map(move |(m, x)| (e, m, x)))
    }

    /// The raw latest reading, without an age.
    pub fn reading(&self, entity: &EntityId, metric: &str) -> Option<&Reading> {
        let m = self.metric_id(metric)?;
        self.readings.get(self.slot(entity)? as usize)?.get(m)
    }

    /// Every stale reading at `now`, with the time it became stale.
    pub fn stale(&self, now: Timestamp) -> Vec<(EntityId, Metric, Timestamp)> {
        let mut out = Vec::new();
        for (e, m, r) in self.iter() {
            let since = r.ts + self.freshness_s(m);
            if since < now {
                out.push((e.clone(), m.clone(), since));
            }
        }
        out
    }

    /// Marks every reading of an entity bad (its source said it died).
    pub fn mark_bad(&mut self, entity: &EntityId) {
        if let Some(s) = self.slot(entity) {
            for (_, r) in &mut self.readings[s as usize].0 {
                r.quality = Quality::Bad;
            }
        }
    }

    pub fn len(&self) -> usize {
        self.readings.iter().map(Readings::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every reading as a sample, in entity and metric order.
    pub fn samples(&self) -> Vec<Sample> {
        let mut out = Vec::with_capacity(self.len());
        for (e, m, r) in self.iter() {
            out.push(Sample {
                entity: e.clone(),
                metric: m.clone(),
                value: r.value,
                unit: m
                    .spec()
                    .map_or(std::borrow::Cow::Borrowed(""), |s| s.unit.into()),
                ts: r.ts,
                source: r.source.clone(),
                quality: r.quality,
            });
        }
        out
    }

    /// Builds a snapshot from samples as they are, without range checks (for files
    /// written by powerplane itself, such as test cases).
    pub fn from_samples(samples: impl IntoIterator<Item = Sample>) -> Self {
        let mut s = Snapshot::new();
        for sample in samples {
            let slot = s.slot_or_insert(&sample.entity);
            let m = s.metric_or_insert(&sample.metric);
            let readings = &mut s.readings[slot as usize];
            let reading = Reading {
                value: sample.value,
                ts: sample.ts,
                source: sample.source,
                quality: sample.quality,
            };
            match readings.get_mut(m) {
                Some(old) if old.ts <= reading.ts => *old = reading,
                Some(_) => {}
                None => readings.push(m, reading),
            }
        }
        s
    }
}

fn validate(s: &Sample, now: Timestamp) -> Result<(), Rejected> {
    if !s.value.is_finite() {
        return Err(Rejected::NotFinite {
            entity: s.entity.clone(),
            metric: s.metric.clone(),
            value: s.value,
        });
    }
    if let Some(spec) = s.metric.spec() {
        if s.value < spec.min || s.value > spec.max {
            return Err(Rejected::OutOfRange {
                entity: s.entity.clone(),
                metric: s.metric.clone(),
                value: s.value,
                min: spec.min,
                max: spec.max,
            });
        }
    }
    let ahead_s = s.ts.secs_since(now);
    if -ahead_s > MAX_PAST_S {
        return Err(Rejected::Ancient {
            entity: s.entity.clone(),
            metric: s.metric.clone(),
            ts: s.ts,
            behind_s: -ahead_s,
        });
    }
    if ahead_s > MAX_FUTURE_SKEW_S {
        return Err(Rejected::FromFuture {
            entity: s.entity.clone(),
            metric: s.metric.clone(),
            ts: s.ts,
            ahead_s,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    /// Two ids with the same hash each keep their own slot; a third with that hash is
    /// not found.
    #[test]
    fn ids_whose_hashes_collide_keep_their_slots() {
        let mut s = super::Snapshot::new();
        let (a, b, c) = (
            super::EntityId::rack("a"),
            super::EntityId::rack("b"),
            super::EntityId::rack("c"),
        );
        assert_eq!(s.slot_or_insert_hashed(7, &a), 0);
        assert_eq!(s.slot_or_insert_hashed(7, &b), 1);
        assert_eq!(s.slot_or_insert_hashed(7, &a), 0);
        assert_eq!(s.slot_or_insert_hashed(7, &b), 1);
        assert_eq!(s.find(7, &a), Some(0));
        assert_eq!(s.find(7, &b), Some(1));
        assert_eq!(s.find(7, &c), None);
        assert_eq!(s.entity_at(1), Some(&b));
    }

    use super::*;
    use crate::metric::names::*;

    fn rack() -> EntityId {
        EntityId::rack("a01")
    }

    #[test]
    fn a_value_older_than_its_bound_is_stale() {
        let mut s = Snapshot::new();
        let t0 = Timestamp::from_secs(1000);
        s.ingest(Sample::new(rack(), INLET_TEMP_C, 27.0, t0, "test"), t0)
            .expect("accepted");
        let fresh = s.observe(&rack(), INLET_TEMP_C, t0 + 59.0).expect("known");
        assert!(!fresh.stale && fresh.usable());
        let old = s.observe(&rack(), INLET_TEMP_C, t0 + 61.0).expect("known");
        assert!(old.stale && !old.usable());
        assert_eq!(old.age_s, 61.0);
        assert_eq!(
            s.stale(t0 + 61.0),
            vec![(rack(), Metric::new(INLET_TEMP_C), t0 + 60.0)]
        );
    }

    /// Entities are found by the slot after the last one first: samples in another
    /// order than the last poll's, or for an entity not seen yet, still land on their
    /// own entity.
    #[test]
    fn samples_in_any_order_reach_their_own_entity() {
        let mut s = Snapshot::new();
        let ids: Vec<EntityId> = ["a01", "a02", "a03"].map(EntityId::rack).to_vec();
        s.register(&ids);
        let t0 = Timestamp::from_secs(1000);
        let orders: [&[usize]; 4] = [&[0, 1, 2], &[2, 1, 0], &[1, 1, 0, 2], &[0, 2]];
        for (k, order) in orders.iter().enumerate() {
            let t = t0 + k as f64;
            for &i in *order {
                let v = 20.0 + (10 * k + i) as f64;
                s.ingest(Sample::new(ids[i].clone(), INLET_TEMP_C, v, t, "t"), t)
                    .expect("accepted");
            }
            for &i in *order {
                assert_eq!(
                    s.observe(&ids[i], INLET_TEMP_C, t).map(|o| o.value),
                    Some(20.0 + (10 * k + i) as f64),
                    "order {order:?}, {}",
                    ids[i]
                );
            }
        }
        let new = EntityId::rack("b01");
        s.ingest(Sample::new(new.clone(), INLET_TEMP_C, 30.0, t0, "t"), t0)
            .expect("accepted");
        assert_eq!(s.slot(&new), Some(3));
        assert_eq!(
            (0..3).map(|i| s.slot(&ids[i])).collect::<Vec<_>>(),
            vec![Some(0), Some(1), Some(2)]
        );
        assert_eq!(
            s.observe(&ids[1], INLET_TEMP_C, t0 + 2.0).map(|o| o.value),
            Some(41.0)
        );
    }

    #[test]
    fn absurd_values_are_rejected_and_the_last_good_kept() {
        let mut s = Snapshot::new();
        let t0 = Timestamp::from_secs(1000);
        s.ingest(Sample::new(rack(), INLET_TEMP_C, 27.0, t0, "t"), t0)
            .expect("accepted");
        let hot = s.ingest(
            Sample::new(rack(), INLET_TEMP_C, 500.0, t0 + 1.0, "t"),
            t0 + 1.0,
        );
        assert_eq!(hot.expect_err("rejected").reason(), "out_of_range");
        let nan = s.ingest(
            Sample::new(rack(), INLET_TEMP_C, f64::NAN, t0 + 1.0, "t"),
            t0,
        );
        assert_eq!(nan.expect_err("rejected").reason(), "not_finite");
        let neg = s.ingest(Sample::new(rack(), POWER_W, -5.0, t0, "t"), t0);
        assert_eq!(neg.expect_err("rejected").reason(), "out_of_range");
        let future = s.ingest(
            Sample::new(rack(), INLET_TEMP_C, 28.0, t0 + 3600.0, "t"),
            t0,
        );
        assert_eq!(future.expect_err("rejected").reason(), "future_timestamp");
        assert_eq!(
            s.observe(&rack(), INLET_TEMP_C, t0).map(|o| o.value),
            Some(27.0)
        );
    }

    #[test]
    fn history_is_not_telemetry_and_a_counter_going_back_is_a_reset() {
        let mut s = Snapshot::new();
        let t0 = Timestamp::from_secs(1_000_000);
        let old = s.ingest(
            Sample::new(rack(), INLET_TEMP_C, 25.0, t0 + -90_000.0, "t"),
            t0,
        );
        assert_eq!(old.expect_err("rejected").reason(), "ancient_timestamp");
        let gpu = EntityId::gpu("n1", 0);
        assert_eq!(
            s.ingest(Sample::new(gpu.clone(), ENERGY_J, 5e6, t0, "t"), t0),
            Ok(Ingested::Updated)
        );
        assert_eq!(
            s.ingest(
                Sample::new(gpu.clone(), ENERGY_J, 6e6, t0 + 1.0, "t"),
                t0 + 1.0
            ),
            Ok(Ingested::Updated)
        );
        assert_eq!(
            s.ingest(Sample::new(gpu, ENERGY_J, 10.0, t0 + 2.0, "t"), t0 + 2.0),
            Ok(Ingested::CounterReset)
        );
    }

    #[test]
    fn an_older_sample_does_not_replace_a_newer_one() {
        let mut s = Snapshot::new();
        let t0 = Timestamp::from_secs(1000);
        s.ingest(Sample::new(rack(), INLET_TEMP_C, 27.0, t0, "t"), t0)
            .expect("accepted");
        let r = s.ingest(Sample::new(rack(), INLET_TEMP_C, 20.0, t0 + -5.0, "t"), t0);
        assert_eq!(r, Ok(Ingested::OlderIgnored));
        assert_eq!(
            s.observe(&rack(), INLET_TEMP_C, t0).map(|o| o.value),
            Some(27.0)
        );
    }

    #[test]
    fn bad_quality_is_not_usable_even_when_fresh() {
        let mut s = Snapshot::new();
        let t0 = Timestamp::from_secs(1000);
        s.ingest(Sample::new(rack(), INLET_TEMP_C, 27.0, t0, "t"), t0)
            .expect("accepted");
        s.mark_bad(&rack());
        let o = s.observe(&rack(), INLET_TEMP_C, t0).expect("known");
        assert!(!o.stale && !o.usable());
    }
}
