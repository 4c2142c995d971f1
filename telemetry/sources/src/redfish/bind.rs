//! The site's `[[redfish]]` bindings applied to fetched resources (pure): which
//! readings of a resource a binding takes, and the one sample they become.
//!
//! A resource's readings are found by the survey's conventions ([`super::survey::readings`]);
//! a binding takes those of the resources its pattern names, at its property (or all
//! of them), in its metric's unit. `leak_detected` takes the `DetectorState` of leak
//! detectors instead (OK is 0, anything else 1). One physical reading seen twice (an
//! excerpt and its sensor, through a `**` tree) counts once. A statistic over an
//! interval (`PowerMetrics`' average, minimum, maximum) is taken only by a binding that
//! names it with `property`: one without takes instantaneous readings only.

use serde_json::Value;

use super::extract::quality;
use super::survey::readings::Window;
use telemetry::metric::names::LEAK_DETECTED;
use telemetry::site::redfish::{Combine, RedfishBinding};
use telemetry::Quality;

/// One reading a binding took.
#[derive(Debug, Clone, PartialEq)]
pub struct Matched {
    /// The physical reading (the sensor's URI, or the resource and pointer).
    pub key: String,
    /// Where it was read: resource path and JSON pointer.
    pub from: String,
    /// In the binding's metric's unit.
    pub value: f64,
    /// Read from the sensor itself rather than an excerpt of it.
    pub own: bool,
    pub quality: Quality,
    /// A statistic over an interval (`PowerMetrics`), kept with the sample's source.
    pub window: Option<Window>,
}

impl Matched {
    /// Where it was read, and the statistic and interval when it is one.
    pub fn described(&self) -> String {
        match self.window {
            Some(w) => format!("{} ({w})", self.from),
            None => self.from.clone(),
        }
    }
}

/// What a binding made of what it took.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// One sample.
    Value { value: f64, quality: Quality },
    /// No reading matched (no such resource, property or unit).
    Nothing,
    /// Several readings matched and the binding has no `combine`.
    Ambiguous(usize),
}

/// The readings of the resource at `path` that `b` takes.
pub fn matches(b: &RedfishBinding, path: &str, v: &Value) -> Vec<Matched> {
    if !b.resource.matches(path) {
        return Vec::new();
    }
    let Some(q) = quality(v) else {
        return Vec::new(); // absent or disabled: its readings mean nothing
    };
    if b.metric.as_str() == LEAK_DETECTED {
        let mut out = Vec::new();
        leaks(b, path, v, "", q, &mut out);
        return out;
    }
    let Some(unit) = b.metric.spec().map(|s| s.unit) else {
        return Vec::new();
    };
    super::survey::readings::resource(v, path)
        .readings
        .into_iter()
        .filter(|r| r.unit == unit)
        .filter(|r| {
            let ptr = r.from.split_once('#').map_or("", |(_, p)| p);
            (r.window.is_none() || b.property.is_some()) && b.property_matches(ptr)
        })
        .map(|r| Matched {
            key: r.key,
            from: r.from,
            value: r.value,
            own: r.own,
            quality: q,
            window: r.window,
        })
        .collect()
}

/// Leak detectors: the resource itself, or the detectors inline in its groups.
fn leaks(b: &RedfishBinding, path: &str, v: &Value, ptr: &str, q: Quality, out: &mut Vec<Matched>) {
    if let Some(state) = v.get("DetectorState").and_then(Value::as_str) {
        if b.property_matches(ptr) {
            let q = match v.get("Status").map(|_| quality(v)) {
                Some(None) => return,
                Some(Some(own)) => own.max(q),
                None => q,
            };
            let key = v
                .get("DataSourceUri")
                .and_then(Value::as_str)
                .map(str::to_string)
                .unwrap_or_else(|| format!("{path}#{ptr}"));
            out.push(Matched {
                key,
                from: format!("{path}#{ptr}/DetectorState"),
                value: if state == "OK" { 0.0 } else { 1.0 },
                own: ptr.is_empty(),
                quality: q,
                window: None,
            });
        }
    }
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
            let p = format!("{ptr}/LeakDetectorGroups/{gi}/Detectors/{di}");
            leaks(b, path, d, &p, q, out);
        }
    }
}

/// The sample a binding's readings make: duplicates of one physical reading dropped
/// (the sensor's own value kept), then one value, or combined by `combine`. Returns
/// the readings it used.
pub fn settle(b: &RedfishBinding, matched: Vec<Matched>) -> (Outcome, Vec<Matched>) {
    let mut kept: Vec<Matched> = Vec::new();
    for m in matched {
        match kept.iter_mut().find(|k| k.key == m.key) {
            Some(k) if !k.own && m.own => *k = m,
            Some(_) => {}
            None => kept.push(m),
        }
    }
    let outcome = match (kept.len(), b.combine) {
        (0, _) => Outcome::Nothing,
        (1, _) => Outcome::Value {
            value: kept[0].value,
            quality: kept[0].quality,
        },
        (n, None) => Outcome::Ambiguous(n),
        (_, Some(c)) => {
            let values: Vec<f64> = kept.iter().map(|m| m.value).collect();
            match c.apply(&values) {
                Some(value) => Outcome::Value {
                    value,
                    // a sum of readings is as good as its worst one
                    quality: kept
                        .iter()
                        .map(|m| m.quality)
                        .max()
                        .unwrap_or(Quality::Good),
                },
                None => Outcome::Nothing,
            }
        }
    };
    (outcome, kept)
}

/// `combine` as a word, for messages.
pub fn combine_word(c: Option<Combine>) -> String {
    c.map_or_else(|| "none".to_string(), |c| c.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use telemetry::site::redfish::ResourcePattern;
    use telemetry::{EntityId, EntityKind, Metric};

    fn binding(
        resource: &str,
        property: Option<&str>,
        metric: &str,
        combine: Option<Combine>,
    ) -> RedfishBinding {
        RedfishBinding {
            endpoint: "e".into(),
            resource: ResourcePattern::parse(resource).expect("pattern"),
            property: property.map(RedfishBinding::normalise_property),
            entity: EntityId::new(EntityKind::Pdu, "p"),
            metric: Metric::new(metric),
            combine,
            at: "site.toml:1:1".into(),
        }
    }

    #[test]
    fn a_binding_takes_the_readings_of_its_resource_in_its_unit_at_its_property() {
        let mains = json!({
            "PowerWatts": {"Reading": 488.0, "DataSourceUri": "/redfish/v1/S/P"},
            "Voltage": {"Reading": 230.0},
            "PolyPhasePowerWatts": {"Line1ToNeutral": {"Reading": 198.4}, "Line2ToNeutral": {"Reading": 231.5}}
        });
        let path = "/redfish/v1/PowerEquipment/RackPDUs/1/Mains/AC1";
        let any_w = binding("PowerEquipment/RackPDUs/1/Mains/AC1", None, "power_w", None);
        let (o, used) = settle(&any_w, matches(&any_w, path, &mains));
        assert_eq!((o, used.len()), (Outcome::Ambiguous(3), 3));
        let total = binding(
            "PowerEquipment/RackPDUs/1/Mains/*",
            Some("PowerWatts"),
            "power_w",
            None,
        );
        let (o, used) = settle(&total, matches(&total, path, &mains));
        assert_eq!(
            o,
            Outcome::Value {
                value: 488.0,
                quality: Quality::Good
            }
        );
        assert_eq!(used[0].key, "/redfish/v1/S/P");
        let v = binding(
            "PowerEquipment/RackPDUs/1/Mains/AC1",
            None,
            "voltage_v",
            None,
        );
        assert_eq!(
            settle(&v, matches(&v, path, &mains)).0,
            Outcome::Value {
                value: 230.0,
                quality: Quality::Good
            }
        );
        let lines = binding(
            "PowerEquipment/**",
            Some("PolyPhasePowerWatts/Line2ToNeutral"),
            "power_w",
            None,
        );
        assert_eq!(
            settle(&lines, matches(&lines, path, &mains)).0,
            Outcome::Value {
                value: 231.5,
                quality: Quality::Good
            }
        );
        let elsewhere = binding(
            "PowerEquipment/RackPDUs/2/Mains/AC1",
            None,
            "voltage_v",
            None,
        );
        assert!(matches(&elsewhere, path, &mains).is_empty());
    }

    #[test]
    fn readings_of_many_resources_combine_and_one_reading_seen_twice_counts_once() {
        let b = binding(
            "Chassis/1/PowerSubsystem/PowerSupplies/*/Metrics",
            Some("InputPowerWatts"),
            "power_w",
            Some(Combine::Sum),
        );
        let mut all = Vec::new();
        for (i, w) in [(1, 400.0), (2, 410.0)] {
            let psu = json!({"InputPowerWatts": {"Reading": w}, "OutputPowerWatts": {"Reading": w - 20.0}, "Status": {"Health": if i == 2 { "Warning" } else { "OK" }}});
            all.extend(matches(
                &b,
                &format!("/redfish/v1/Chassis/1/PowerSubsystem/PowerSupplies/{i}/Metrics"),
                &psu,
            ));
        }
        all.push(all[0].clone());
        assert_eq!(
            settle(&b, all).0,
            Outcome::Value {
                value: 810.0,
                quality: Quality::Uncertain
            }
        );
        let sensor = binding("Chassis/1/**", None, "temperature_c", None);
        let env = json!({"TemperatureCelsius": {"Reading": 24.0, "DataSourceUri": "/redfish/v1/Chassis/1/Sensors/T"}});
        let own = json!({"ReadingType": "Temperature", "Reading": 24.5});
        let mut m = matches(&sensor, "/redfish/v1/Chassis/1/EnvironmentMetrics", &env);
        m.extend(matches(&sensor, "/redfish/v1/Chassis/1/Sensors/T", &own));
        assert_eq!(
            settle(&sensor, m).0,
            Outcome::Value {
                value: 24.5,
                quality: Quality::Good
            },
            "the sensor's own value"
        );
    }

    #[test]
    fn a_leak_binding_reads_detector_states() {
        let b = binding(
            "ThermalEquipment/CDUs/1/LeakDetection",
            None,
            "leak_detected",
            Some(Combine::Max),
        );
        let ld = json!({"LeakDetectorGroups": [{"Detectors": [
            {"DataSourceUri": "/redfish/v1/X/A", "DetectorState": "OK"},
            {"DataSourceUri": "/redfish/v1/X/B", "DetectorState": "Warning"}]}]});
        let m = matches(&b, "/redfish/v1/ThermalEquipment/CDUs/1/LeakDetection", &ld);
        assert_eq!(m.len(), 2);
        assert_eq!(
            settle(&b, m).0,
            Outcome::Value {
                value: 1.0,
                quality: Quality::Good
            }
        );
        let one = binding(
            "ThermalEquipment/CDUs/1/LeakDetection",
            Some("LeakDetectorGroups/0/Detectors/0"),
            "leak_detected",
            None,
        );
        assert_eq!(
            settle(
                &one,
                matches(
                    &one,
                    "/redfish/v1/ThermalEquipment/CDUs/1/LeakDetection",
                    &ld
                )
            )
            .0,
            Outcome::Value {
                value: 0.0,
                quality: Quality::Good
            }
        );
        let absent = json!({"DetectorState": "Critical", "Status": {"State": "Absent"}});
        let d = binding(
            "ThermalEquipment/CDUs/1/LeakDetection/LeakDetectors/*",
            None,
            "leak_detected",
            None,
        );
        assert!(matches(
            &d,
            "/redfish/v1/ThermalEquipment/CDUs/1/LeakDetection/LeakDetectors/2",
            &absent
        )
        .is_empty());
    }

    #[test]
    fn an_average_is_taken_only_when_named_and_keeps_its_interval() {
        let power = json!({"PowerControl": [{
            "PowerConsumedWatts": 344,
            "PowerMetrics": {"IntervalInMin": 30, "MinConsumedWatts": 271,
                             "MaxConsumedWatts": 489, "AverageConsumedWatts": 319},
            "Status": {"State": "Enabled", "Health": "OK"}
        }]});
        let path = "/redfish/v1/Chassis/1U/Power";
        // no property: the instantaneous reading only, as before
        let any = binding("Chassis/1U/Power", None, "power_w", None);
        let (o, used) = settle(&any, matches(&any, path, &power));
        assert_eq!(
            o,
            Outcome::Value {
                value: 344.0,
                quality: Quality::Good
            }
        );
        assert_eq!(used[0].window, None);
        let avg = binding(
            "Chassis/1U/Power",
            Some("PowerControl/0/PowerMetrics/AverageConsumedWatts"),
            "power_w",
            None,
        );
        let (o, used) = settle(&avg, matches(&avg, path, &power));
        assert_eq!(
            o,
            Outcome::Value {
                value: 319.0,
                quality: Quality::Good
            }
        );
        assert_eq!(
            used[0].described(),
            "/redfish/v1/Chassis/1U/Power#/PowerControl/0/PowerMetrics/AverageConsumedWatts (mean over 30 min)"
        );
        let max = binding(
            "Chassis/*/Power",
            Some("/PowerControl/0/PowerMetrics/MaxConsumedWatts"),
            "power_w",
            None,
        );
        let (o, _) = settle(&max, matches(&max, path, &power));
        assert!(matches!(o, Outcome::Value { value, .. } if value == 489.0));
    }

    #[test]
    fn an_accelerators_metrics_bind_to_a_gpu() {
        let m = json!({"TemperatureCelsius": 41, "ConsumedPowerWatt": 82, "ThrottlingCelsius": 65});
        let path = "/redfish/v1/Systems/1/Processors/GPU_0/ProcessorMetrics";
        let mut temp = binding(
            "Systems/1/Processors/*/ProcessorMetrics",
            Some("TemperatureCelsius"),
            "gpu_temp_c",
            None,
        );
        temp.entity = EntityId::new(EntityKind::Gpu, "n1:0");
        let (o, _) = settle(&temp, matches(&temp, path, &m));
        assert!(matches!(o, Outcome::Value { value, .. } if value == 41.0));
        let power = binding(
            "Systems/1/Processors/GPU_0/ProcessorMetrics",
            None,
            "power_w",
            None,
        );
        let (o, _) = settle(&power, matches(&power, path, &m));
        assert!(matches!(o, Outcome::Value { value, .. } if value == 82.0));
    }
}
