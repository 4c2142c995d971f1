//! One walk of one endpoint: discovery from the service root, and the re-reads of what
//! discovery found.

use std::collections::BTreeMap;

use serde_json::Value;

use super::extract::{self, Found};
use super::{Endpoint, Polled, RedfishError};
use crate::mapping::Reject;
use crate::{EntityId, EntityKind, Sample, Timestamp};

/// One walk of one endpoint, collecting samples and per-resource rejects.
pub(super) struct Walk<'a> {
    ep: &'a Endpoint,
    pub(super) out: Polled,
    now: Timestamp,
    /// What discovery found worth reading again.
    pub(super) plan: Vec<Read>,
    mains: BTreeMap<EntityId, Vec<Found>>,
}

fn link(v: &Value, key: &str) -> Option<String> {
    v.get(key)?.get("@odata.id")?.as_str().map(str::to_string)
}

fn members(v: &Value) -> Vec<String> {
    v.get("Members")
        .and_then(Value::as_array)
        .map(|m| {
            m.iter()
                .filter_map(|x| x.get("@odata.id")?.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

fn last_segment(path: &str) -> &str {
    path.trim_end_matches('/')
        .rsplit('/')
        .next()
        .unwrap_or(path)
}

impl<'a> Walk<'a> {
    pub(super) fn new(ep: &'a Endpoint, now: Timestamp) -> Self {
        Walk {
            ep,
            out: Polled {
                endpoint: ep.cfg.name.clone(),
                ..Polled::default()
            },
            now,
            plan: Vec::new(),
            mains: BTreeMap::new(),
        }
    }

    pub(super) fn get(&mut self, path: &str) -> Result<Value, RedfishError> {
        self.out.requests += 1;
        self.ep.get(path)
    }

    /// GET that records a failure as a reject and carries on.
    fn try_get(&mut self, path: &str) -> Option<Value> {
        match self.get(path) {
            Ok(v) => Some(v),
            Err(e) => {
                self.out.rejects.push(Reject {
                    reason: e.reason(),
                    detail: e.to_string(),
                });
                None
            }
        }
    }

    fn collection(&mut self, parent: &Value, key: &str) -> Vec<(String, Value)> {
        let Some(path) = link(parent, key) else {
            return Vec::new();
        };
        let Some(coll) = self.try_get(&path) else {
            return Vec::new();
        };
        members(&coll)
            .into_iter()
            .filter_map(|m| self.try_get(&m).map(|v| (m, v)))
            .collect()
    }

    fn emit(&mut self, entity: &EntityId, found: Vec<Found>) {
        for f in found {
            let unit = crate::metric::spec(f.metric)
                .map(|s| s.unit.to_string())
                .unwrap_or_default();
            self.out.samples.push(Sample {
                entity: entity.clone(),
                metric: crate::Metric::new(f.metric),
                value: f.value,
                unit: unit.into(),
                ts: self.now,
                source: format!("redfish:{}{}", self.ep.cfg.name, f.from).into(),
                quality: f.quality,
            });
        }
    }

    /// Extracts a resource's readings, emits them, and remembers the resource for the
    /// polls that follow discovery when it gave any.
    fn read(&mut self, kind: Kind, entity: &EntityId, path: &str, v: &Value) {
        let found = kind.extract(entity, path, v);
        if found.iter().any(|(_, f)| !f.is_empty()) || kind == Kind::Mains {
            self.plan.push(Read {
                path: path.to_string(),
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

    fn read_link(&mut self, kind: Kind, entity: &EntityId, parent: &Value, key: &str) {
        if let Some(p) = link(parent, key) {
            if let Some(v) = self.try_get(&p) {
                self.read(kind, entity, &p, &v);
            }
        }
    }

    /// Sums each PDU's mains into its own readings.
    fn flush_mains(&mut self) {
        for (e, found) in std::mem::take(&mut self.mains) {
            self.emit(&e, sum_by_metric(found));
        }
    }

    /// The polls after discovery: only the resources that gave readings.
    pub(super) fn replay(&mut self, plan: &[Read]) -> Result<(), RedfishError> {
        for r in plan {
            match self.get(&r.path) {
                Ok(v) => self.read(r.kind, &r.entity, &r.path, &v),
                Err(e) if e.reason() == "http_status" => return Err(e), // the tree changed: discover again
                Err(e) if matches!(e.reason(), "timeout" | "unreachable" | "tls") => return Err(e),
                Err(e) => self.out.rejects.push(Reject {
                    reason: e.reason(),
                    detail: e.to_string(),
                }),
            }
        }
        self.flush_mains();
        Ok(())
    }

    pub(super) fn chassis(&mut self, root: &Value) {
        for (path, c) in self.collection(root, "Chassis") {
            let id = last_segment(&path).to_string();
            let entity = self
                .ep
                .entity(&format!("Chassis/{id}"), EntityKind::Node, &id);
            // legacy first: where both exist, the current model's reading is the one kept
            self.read_link(Kind::LegacyPower, &entity, &c, "Power");
            self.read_link(Kind::LegacyThermal, &entity, &c, "Thermal");
            if let Some(ts) = link(&c, "ThermalSubsystem").and_then(|p| self.try_get(&p)) {
                self.read_link(Kind::ThermalMetrics, &entity, &ts, "ThermalMetrics");
            }
            if let Some(ps) = link(&c, "PowerSubsystem").and_then(|p| self.try_get(&p)) {
                for (pp, psu) in self.collection(&ps, "PowerSupplies") {
                    let e = EntityId::new(
                        EntityKind::Node,
                        format!("{}.psu.{}", entity.name, last_segment(&pp)),
                    );
                    self.read_link(Kind::PowerSupply, &e, &psu, "Metrics");
                }
            }
            self.read_link(Kind::Environment, &entity, &c, "EnvironmentMetrics");
            for (sp, s) in self.collection(&c, "Sensors") {
                self.read(Kind::Sensor, &entity, &sp, &s);
            }
        }
    }

    pub(super) fn power_equipment(&mut self, root: &Value) {
        let Some(pe) = link(root, "PowerEquipment").and_then(|p| self.try_get(&p)) else {
            return;
        };
        for (path, pdu) in self.collection(&pe, "RackPDUs") {
            let id = last_segment(&path).to_string();
            let entity = self
                .ep
                .entity(&format!("RackPDUs/{id}"), EntityKind::Pdu, &id);
            for (mp, m) in self.collection(&pdu, "Mains") {
                self.read(Kind::Mains, &entity, &mp, &m);
            }
            for (bp, b) in self.collection(&pdu, "Branches") {
                let e = EntityId::new(
                    EntityKind::Branch,
                    format!("{}.{}", entity.name, last_segment(&bp)),
                );
                self.read(Kind::Circuit, &e, &bp, &b);
            }
            for (op, o) in self.collection(&pdu, "Outlets") {
                let e = EntityId::new(
                    EntityKind::Outlet,
                    format!("{}.{}", entity.name, last_segment(&op)),
                );
                self.read(Kind::Circuit, &e, &op, &o);
            }
        }
        self.flush_mains();
    }

    pub(super) fn thermal_equipment(&mut self, root: &Value) {
        let Some(te) = link(root, "ThermalEquipment").and_then(|p| self.try_get(&p)) else {
            return;
        };
        for (path, cdu) in self.collection(&te, "CDUs") {
            let id = last_segment(&path).to_string();
            let entity = self
                .ep
                .entity(&format!("CDUs/{id}"), EntityKind::Cooling, &id);
            self.read_link(Kind::Environment, &entity, &cdu, "EnvironmentMetrics");
            for (loop_key, loop_name) in [
                ("PrimaryCoolantConnectors", "primary"),
                ("SecondaryCoolantConnectors", "secondary"),
            ] {
                let conns = self.collection(&cdu, loop_key);
                let single = conns.len() == 1;
                for (cp, c) in conns {
                    let name = if single {
                        format!("{}.{loop_name}", entity.name)
                    } else {
                        format!("{}.{loop_name}{}", entity.name, last_segment(&cp))
                    };
                    self.read(
                        Kind::Coolant,
                        &EntityId::new(EntityKind::Cooling, name),
                        &cp,
                        &c,
                    );
                }
            }
            for (pp, p) in self.collection(&cdu, "Pumps") {
                let e = EntityId::new(
                    EntityKind::Cooling,
                    format!("{}.pump{}", entity.name, last_segment(&pp)),
                );
                self.read(Kind::Pump, &e, &pp, &p);
            }
            if let Some((lp, ld)) =
                link(&cdu, "LeakDetection").and_then(|p| self.try_get(&p).map(|v| (p, v)))
            {
                // detectors as linked resources, or inline in their groups
                for (dp, d) in self.collection(&ld, "LeakDetectors") {
                    let e = EntityId::new(
                        EntityKind::Cooling,
                        format!("{}.leak.{}", entity.name, last_segment(&dp)),
                    );
                    self.read(Kind::LeakDetector, &e, &dp, &d);
                }
                self.read(Kind::LeakGroups, &entity, &lp, &ld);
            }
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
    path: String,
    kind: Kind,
    entity: EntityId,
}

/// Several mains of one PDU: power, current and energy add up; voltage is the first.
fn sum_by_metric(found: Vec<Found>) -> Vec<Found> {
    let mut out: Vec<Found> = Vec::new();
    for f in found {
        match out.iter_mut().find(|o| o.metric == f.metric) {
            Some(o) if f.metric != crate::metric::names::VOLTAGE_V => {
                o.value += f.value;
                o.quality = o.quality.max(f.quality);
            }
            Some(_) => {}
            None => out.push(f),
        }
    }
    out
}
