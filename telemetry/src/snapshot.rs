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

/// Latest value of every metric of every entity. Lookups are hashed; the iterators that
/// list readings ([`Snapshot::iter`], [`Snapshot::samples`], [`Snapshot::stale`]) go in
/// entity order, so what is listed is deterministic.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Snapshot {
    readings: crate::fasthash::FnvMap<EntityId, BTreeMap<Metric, Reading>>,
    freshness: BTreeMap<Metric, f64>,
}

impl Snapshot {
    pub fn new() -> Self {
        Self::default()
    }

    /// Overrides the freshness bound of one metric.
    pub fn set_freshness(&mut self, metric: &str, secs: f64) {
        self.freshness.insert(Metric::new(metric), secs);
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
        // a known reading is updated in place
        if let Some(old) = self
            .readings
            .get_mut(&sample.entity)
            .and_then(|m| m.get_mut(sample.metric.as_str()))
        {
            if old.ts > sample.ts {
                return Ok(Ingested::OlderIgnored);
            }
            let reset = sample.metric.as_str() == crate::metric::names::ENERGY_J
                && sample.value < old.value;
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
        let slot = self.readings.entry(sample.entity).or_default();
        let mut outcome = Ingested::Updated;
        if let Some(old) = slot.get(&sample.metric) {
            if old.ts > sample.ts {
                return Ok(Ingested::OlderIgnored);
            }
            if sample.metric.as_str() == crate::metric::names::ENERGY_J && sample.value < old.value
            {
                outcome = Ingested::CounterReset;
            }
        }
        slot.insert(
            sample.metric,
            Reading {
                value: sample.value,
                ts: sample.ts,
                source: sample.source,
                quality: sample.quality,
            },
        );
        Ok(outcome)
    }

    /// The latest value of `metric` of `entity` as seen at `now`, with its age.
    pub fn observe(&self, entity: &EntityId, metric: &str, now: Timestamp) -> Option<Observation> {
        self.observe_in(self.readings.get(entity)?, metric, now)
    }

    /// Every entity with its readings, in no particular order: to look at many
    /// entities' metrics without finding each entity again ([`Snapshot::observe_in`]).
    pub fn entities(&self) -> impl Iterator<Item = (&EntityId, &BTreeMap<Metric, Reading>)> {
        self.readings.iter()
    }

    /// The entities in entity order.
    fn sorted(&self) -> Vec<(&EntityId, &BTreeMap<Metric, Reading>)> {
        let mut v: Vec<_> = self.readings.iter().collect();
        v.sort_unstable_by(|a, b| a.0.cmp(b.0));
        v
    }

    /// [`Snapshot::observe`] on the readings of one entity from [`Snapshot::entities`].
    pub fn observe_in(
        &self,
        readings: &BTreeMap<Metric, Reading>,
        metric: &str,
        now: Timestamp,
    ) -> Option<Observation> {
        let r = readings.get(metric)?;
        let age_s = now.secs_since(r.ts).max(0.0);
        let fresh_s = self
            .freshness
            .get(metric)
            .copied()
            .or_else(|| crate::metric::spec(metric).map(|s| s.freshness_s))
            .unwrap_or(DEFAULT_FRESHNESS_S);
        Some(Observation {
            value: r.value,
            ts: r.ts,
            age_s,
            stale: age_s > fresh_s,
            quality: r.quality,
        })
    }

    /// Every reading, by entity then metric.
    pub fn iter(&self) -> impl Iterator<Item = (&EntityId, &Metric, &Reading)> {
        self.sorted()
            .into_iter()
            .flat_map(|(e, m)| m.iter().map(move |(k, r)| (e, k, r)))
    }

    /// The raw latest reading, without an age.
    pub fn reading(&self, entity: &EntityId, metric: &str) -> Option<&Reading> {
        self.readings.get(entity)?.get(&Metric::new(metric))
    }

    /// Every stale reading at `now`, with the time it became stale.
    pub fn stale(&self, now: Timestamp) -> Vec<(EntityId, Metric, Timestamp)> {
        let mut out = Vec::new();
        for (e, metrics) in self.sorted() {
            for (m, r) in metrics {
                let since = r.ts + self.freshness_s(m);
                if since < now {
                    out.push((e.clone(), m.clone(), since));
                }
            }
        }
        out
    }

    /// Marks every reading of an entity bad (its source said it died).
    pub fn mark_bad(&mut self, entity: &EntityId) {
        if let Some(m) = self.readings.get_mut(entity) {
            for r in m.values_mut() {
                r.quality = Quality::Bad;
            }
        }
    }

    pub fn len(&self) -> usize {
        self.readings.values().map(BTreeMap::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every reading as a sample, in entity and metric order.
    pub fn samples(&self) -> Vec<Sample> {
        let mut out = Vec::with_capacity(self.len());
        for (e, metrics) in self.sorted() {
            for (m, r) in metrics {
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
        }
        out
    }

    /// Builds a snapshot from samples as they are, without range checks (for files
    /// written by powerplane itself, such as test cases).
    pub fn from_samples(samples: impl IntoIterator<Item = Sample>) -> Self {
        let mut s = Snapshot::new();
        for sample in samples {
            let slot = s.readings.entry(sample.entity).or_default();
            let newer = slot.get(&sample.metric).is_none_or(|o| o.ts <= sample.ts);
            if newer {
                slot.insert(
                    sample.metric,
                    Reading {
                        value: sample.value,
                        ts: sample.ts,
                        source: sample.source,
                        quality: sample.quality,
                    },
                );
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
