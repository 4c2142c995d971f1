//! A sample: one reading of one metric of one entity, from one source.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};

use crate::{EntityId, Metric, Timestamp};

/// How far a reading can be trusted, as its source reported it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Quality {
    /// The source vouches for it.
    Good,
    /// The source reports a warning (e.g. Redfish `Status.Health = Warning`).
    Uncertain,
    /// The source reports a fault; the value is kept for display, never acted on as good.
    Bad,
}

/// One reading. `value` is in the metric's canonical unit; `unit` says which.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    pub entity: EntityId,
    pub metric: Metric,
    pub value: f64,
    pub unit: Cow<'static, str>,
    pub ts: Timestamp,
    pub source: Cow<'static, str>,
    pub quality: Quality,
}

impl Sample {
    /// A good sample of a canonical metric, with the metric's own unit.
    pub fn new(entity: EntityId, metric: &str, value: f64, ts: Timestamp, source: &str) -> Self {
        let unit = crate::metric::spec(metric).map_or(Cow::Borrowed(""), |s| Cow::Borrowed(s.unit));
        Sample {
            entity,
            metric: Metric::new(metric),
            value,
            unit,
            ts,
            source: Cow::Owned(source.to_string()),
            quality: Quality::Good,
        }
    }

    /// [`Sample::new`] from a source named by a constant (no copy of the name).
    pub fn from_static(
        entity: EntityId,
        metric: &str,
        value: f64,
        ts: Timestamp,
        source: &'static str,
    ) -> Self {
        Sample {
            source: Cow::Borrowed(source),
            ..Sample::new(entity, metric, value, ts, "")
        }
    }
}
