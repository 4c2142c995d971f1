//! Readings out of the resources one walk fetched, in walk order: samples, rejects and
//! the plan of what to read again (pure; the fetching is in `discover`).

use std::collections::BTreeMap;

use serde_json::Value;

use super::bind::{self, Matched, Outcome};
use super::extract::{self, Found};
use super::polled::{BindingReport, Polled};
use telemetry::site::redfish::RedfishBinding;
use telemetry::{EntityId, EntityKind, Sample, Timestamp};

/// A fetched resource, read as soon as it arrived (so that a walk holds readings,
/// not JSON trees, while its other GETs are in flight).
#[derive(Debug, Clone)]
pub(super) struct Item {
    kind: Kind,
    entity: EntityId,
    path: String,
    found: Vec<(EntityId, Vec<Found>)>,
    /// Numeric readings in the resource with a unit powerplane does not know.
    unknown: usize,
    /// What each of the endpoint's bindings took from it (by binding index).
    bound: Vec<(usize, Vec<Matched>)>,
}

impl Item {
    /// A resource read during discovery: its readings, and what it holds that is not
    /// understood (counted once per discovery).
    pub(super) fn new(kind: Kind, entity: &EntityId, path: String, value: &Value) -> Self {
        let unknown = super::survey::readings::resource(value, &path)
            .unknown
            .len();
        Item {
            unknown,
            ..Item::reread(kind, entity, path, value)
        }
    }

    /// A resource read again after discovery: its readings only (the steady poll does
    /// no survey; what is not understood was counted when it was discovered).
    pub(super) fn reread(kind: Kind, entity: &EntityId, path: String, value: &Value) -> Self {
        Item {
            found: kind.extract(entity, &path, value),
            unknown: 0,
            bound: Vec::new(),
            kind,
            entity: entity.clone(),
            path,
        }
    }

    /// A resource that the site's bindings name: what each of them takes from it.
    pub(super) fn bound(path: String, value: &Value, bindings: &[RedfishBinding]) -> Self {
        let bound = bindings
            .iter()
            .enumerate()
            .map(|(i, b)| (i, bind::matches(b, &path, value)))
            .filter(|(_, m)| !m.is_empty())
            .collect();
        Item {
            kind: Kind::Bound,
            entity: EntityId::new(EntityKind::Site, ""),
            found: Vec::new(),
            unknown: 0,
            bound,
            path,
        }
    }

    /// Whether any binding took a reading from it.
    pub(super) fn is_bound(&self) -> bool {
        !self.bound.is_empty()
    }
}

/// The readings of one walk of one endpoint.
pub(super) struct Walk {
    name: String,
    pub(super) out: Polled,
    now: Timestamp,
    /// What discovery found worth reading again.
    pub(super) plan: Vec<Read>,
    mains: BTreeMap<EntityId, Vec<Found>>,
    /// What each binding took so far, by binding index.
    bound: BTreeMap<usize, Vec<Matched>>,
}

pub(super) fn last_segment(path: &str) -> &str {
    path.trim_end_matches('/')
        .rsplit('/')
        .next()
        .unwrap_or(path)
}

impl Walk {
    pub(super) fn new(name: &str, now: Timestamp) -> Self {
        Walk {
            name: name.to_string(),
            out: Polled {
                endpoint: name.to_string(),
                ..Polled::default()
            },
            now,
            plan: Vec::new(),
            mains: BTreeMap::new(),
            bound: BTreeMap::new(),
        }
    }

    fn emit(&mut self, entity: &EntityId, found: Vec<Found>) {
        for f in found {
            let unit = telemetry::metric::spec(f.metric)
                .map(|s| s.unit.to_string())
                .unwrap_or_default();
            self.out.samples.push(Sample {
                entity: entity.clone(),
                metric: telemetry::Metric::new(f.metric),
                value: f.value,
                unit: unit.into(),
                ts: self.now,
                source: format!("redfish:{}{}", self.name, f.from).into(),
                quality: f.quality,
            });
        }
    }

    /// Extracts a resource's readings, emits them, and remembers the resource for the
    /// polls that follow discovery when it gave any.
    pub(super) fn read(&mut self, item: Item) {
        self.out.not_understood += item.unknown;
        if item.kind == Kind::Bound {
            if item.is_bound() {
                self.plan.push(Read {
                    path: item.path,
                    kind: Kind::Bound,
                    entity: item.entity,
                });
            }
            for (i, m) in item.bound {
                self.bound.entry(i).or_default().extend(m);
            }
            return;
        }
        let (kind, entity, path, found) = (item.kind, &item.entity, item.path, item.found);
        if found.iter().any(|(_, f)| !f.is_empty()) || kind == Kind::Mains {
            self.plan.push(Read {
                path,
                kind,
                entity: entity.clone(),
            });
        }
        if kind == Kind::Mains {
            self.mains
                .entry(entity.clone())
                .or_default()
                .extend(found.into_iter().flat_map(|(_, f)| f));
            return;
        }
        for (e, f) in found {
            self.emit(&e, f);
        }
    }

    /// Reads every item in order, then sums each PDU's mains into its own readings,
    /// and makes each binding's sample (a report for every binding).
    pub(super) fn read_all(&mut self, items: Vec<Item>, bindings: &[RedfishBinding]) {
        for i in items {
            self.read(i);
        }
        for (e, found) in std::mem::take(&mut self.mains) {
            self.emit(&e, sum_by_metric(found));
        }
        let mut bound = std::mem::take(&mut self.bound);
        for (i, b) in bindings.iter().enumerate() {
            let (outcome, used) = bind::settle(b, bound.remove(&i).unwrap_or_default());
            if let Outcome::Value { value, quality } = outcome {
                let from = match used.as_slice() {
                    [one] => one.described(),
                    _ => format!(
                        "/redfish/v1/{} ({} of {})",
                        b.resource,
                        bind::combine_word(b.combine),
                        used.len()
                    ),
                };
                self.out.samples.push(Sample {
                    entity: b.entity.clone(),
                    metric: b.metric.clone(),
                    value,
                    unit: b.metric.spec().map(|s| s.unit).unwrap_or_default().into(),
                    ts: self.now,
                    source: format!("redfish:{}{from}", self.name).into(),
                    quality,
                });
            }
            self.out.bindings.push(BindingReport {
                index: i,
                outcome,
                used,
            });
        }
    }
}

/// How to read a resource that discovery found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    LegacyPower,
    LegacyThermal,
    ThermalMetrics,
    PowerSupply,
    Environment,
    Sensor,
    /// A PDU's mains: summed over all of them into the PDU's own readings.
    Mains,
    Circuit,
    Coolant,
    Pump,
    LeakDetector,
    /// `LeakDetection` with its detectors inline in groups.
    LeakGroups,
    /// A resource the site's `[[redfish]]` bindings name.
    Bound,
}

impl Kind {
    fn extract(self, entity: &EntityId, path: &str, v: &Value) -> Vec<(EntityId, Vec<Found>)> {
        let one = |f: Vec<Found>| vec![(entity.clone(), f)];
        match self {
            Kind::LegacyPower => one(extract::legacy_power(v, path)),
            Kind::LegacyThermal => one(extract::legacy_thermal(v, path)),
            Kind::Environment => one(extract::environment(v, path)),
            Kind::ThermalMetrics => one(extract::thermal_metrics(v, path)),
            Kind::PowerSupply => one(extract::power_supply(v, path)),
            Kind::Sensor => one(extract::sensor(v, path)),
            Kind::Mains | Kind::Circuit => one(extract::circuit(v, path)),
            Kind::Coolant => one(extract::coolant_connector(v, path)),
            Kind::Pump => one(extract::pump(v, path)),
            Kind::LeakDetector => one(extract::leak_detector(v, path)),
            // read by the bindings, see `Item::bound`
            Kind::Bound => Vec::new(),
            Kind::LeakGroups => {
                let mut out = Vec::new();
                for (gi, g) in v
                    .get("LeakDetectorGroups")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .enumerate()
                {
                    for (di, d) in g
                        .get("Detectors")
                        .and_then(Value::as_array)
                        .into_iter()
                        .flatten()
                        .enumerate()
                    {
                        let id = d
                            .get("DataSourceUri")
                            .and_then(Value::as_str)
                            .map(last_segment)
                            .map(str::to_string)
                            .unwrap_or_else(|| format!("{gi}-{di}"));
                        let e = EntityId::new(
                            EntityKind::Cooling,
                            format!("{}.leak.{id}", entity.name),
                        );
                        out.push((
                            e,
                            extract::leak_detector(
                                d,
                                &format!("{path}#LeakDetectorGroups/{gi}/Detectors/{di}"),
                            ),
                        ));
                    }
                }
                out
            }
        }
    }
}

/// One resource to GET on every poll, and how to read it.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Read {
    pub(super) path: String,
    pub(super) kind: Kind,
    pub(super) entity: EntityId,
}

/// Several mains of one PDU: power, current and energy add up; voltage is the first.
fn sum_by_metric(found: Vec<Found>) -> Vec<Found> {
    let mut out: Vec<Found> = Vec::new();
    for f in found {
        match out.iter_mut().find(|o| o.metric == f.metric) {
            Some(o) if f.metric != telemetry::metric::names::VOLTAGE_V => {
                o.value += f.value;
                o.quality = o.quality.max(f.quality);
            }
            Some(_) => {}
            None => out.push(f),
        }
    }
    out
}
