//! Every reading in one Redfish resource, by the DMTF schemas' conventions rather than
//! by resource type (pure; the crawl that fetches the resources is in `survey`).
//!
//! A reading is a numeric `Reading` (a `Sensor`, or a sensor excerpt such as
//! `PowerWatts`, `TemperatureSummaryCelsius/Intake`, `PolyPhaseVoltage/Line1ToNeutral`,
//! `FanSpeedsPercent[]`), or a legacy `Power`/`Thermal` property (`ReadingCelsius`,
//! `ReadingVolts`, `PowerConsumedWatts`, ...). Its unit is the `ReadingUnits` beside it,
//! else the unit suffix of the nearest property name above it (`...Watts`, `...kWh`,
//! `...Celsius`, `...LitersPerMinute`, `...kPa`, `...Percent`, `...Hz`, `...RPM`).
//! A reading is identified by its `DataSourceUri` where it has one, so a sensor seen
//! through an excerpt and through its own resource counts once.
//!
//! Statistics over an interval keep it: the legacy `Power` resource's
//! `PowerControl[].PowerMetrics` gives the average, minimum and maximum consumed watts
//! over its `IntervalInMin`, and each of those readings carries a [`Window`] (the
//! statistic and the interval), so that a mean over 30 minutes is never taken for an
//! instantaneous reading. `ProcessorMetrics` of processors and accelerators gives
//! `ConsumedPowerWatt` and `TemperatureCelsius` as flat numbers.

use serde_json::{Map, Value};

use telemetry::metric::names::*;

/// One reading found in a resource.
#[derive(Debug, Clone, PartialEq)]
pub struct Reading {
    /// The physical reading: the sensor's URI (`DataSourceUri`), or the resource path
    /// with a JSON pointer to the property (`/redfish/v1/Chassis/1U/Thermal#/Fans/0`).
    pub key: String,
    /// Where it was read (resource path and pointer).
    pub from: String,
    /// The canonical metric and the value in its unit.
    pub metric: &'static str,
    pub value: f64,
    pub unit: &'static str,
    /// The unit as the service stated or implied it (UCUM, e.g. `kW.h`).
    pub redfish_unit: String,
    /// Read from the resource the key names (a `Sensor`), not from an excerpt.
    pub own: bool,
    /// A statistic over an interval (`PowerMetrics`), not an instantaneous reading.
    pub window: Option<Window>,
}

/// Which statistic over an interval a reading is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stat {
    Mean,
    Min,
    Max,
}

/// A reading that is a statistic over an interval that ends when it was read.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Window {
    pub stat: Stat,
    /// The interval's length (the resource's `IntervalInMin`), when it states one.
    pub interval_s: Option<f64>,
}

impl Window {
    /// The statistic a property's name says (`AverageConsumedWatts`, `MinConsumedWatts`,
    /// `MaxConsumedWatts`), for a property of an object that states an interval.
    fn of(name: &str, interval_min: Option<f64>) -> Option<Window> {
        let stat = if name.starts_with("Average") {
            Stat::Mean
        } else if name.starts_with("Min") {
            Stat::Min
        } else if name.starts_with("Max") {
            Stat::Max
        } else {
            return None;
        };
        Some(Window {
            stat,
            interval_s: interval_min
                .filter(|m| m.is_finite() && *m > 0.0)
                .map(|m| m * 60.0),
        })
    }
}

impl std::fmt::Display for Window {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let stat = match self.stat {
            Stat::Mean => "mean",
            Stat::Min => "minimum",
            Stat::Max => "maximum",
        };
        match self.interval_s {
            Some(s) if s >= 60.0 && (s % 60.0).abs() < 1e-9 => {
                write!(f, "{stat} over {} min", s / 60.0)
            }
            Some(s) => write!(f, "{stat} over {s} s"),
            None => write!(f, "{stat} over the service's interval"),
        }
    }
}

/// A numeric reading whose unit powerplane does not know.
#[derive(Debug, Clone, PartialEq)]
pub struct Unknown {
    pub key: String,
    pub property: String,
    pub unit: Option<String>,
}

/// The readings of one resource, and the numeric readings it could not map.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Found {
    pub readings: Vec<Reading>,
    pub unknown: Vec<Unknown>,
}

/// Flat legacy properties that are readings, and their units.
pub const LEGACY: &[(&str, &str)] = &[
    ("ReadingCelsius", "Cel"),
    ("ReadingVolts", "V"),
    ("PowerConsumedWatts", "W"),
    ("PowerInputWatts", "W"),
    ("PowerOutputWatts", "W"),
    ("LastPowerOutputWatts", "W"),
    ("LineInputVoltage", "V"),
    // `PowerControl[].PowerMetrics`: statistics over its `IntervalInMin`
    ("AverageConsumedWatts", "W"),
    ("MinConsumedWatts", "W"),
    ("MaxConsumedWatts", "W"),
    // `ProcessorMetrics` of a processor or accelerator
    ("ConsumedPowerWatt", "W"),
    ("TemperatureCelsius", "Cel"),
];

/// Subtrees that hold links, requests or OEM extensions, not readings of this resource.
const SKIP: &[&str] = &[
    "Links",
    "Actions",
    "Oem",
    "RelatedItem",
    "Thresholds",
    "NumericThresholds",
];

/// The unit a property name implies, by the schemas' naming (suffix first).
pub fn unit_of_name(name: &str) -> Option<&'static str> {
    const SUFFIXES: &[(&str, &str)] = &[
        ("kWh", "kW.h"),
        ("WattHours", "W.h"),
        ("Wh", "W.h"),
        ("Joules", "J"),
        ("kW", "kW"),
        ("Watts", "W"),
        ("Watt", "W"),
        ("Amps", "A"),
        ("Volts", "V"),
        ("Voltage", "V"),
        ("Voltages", "V"),
        ("Celsius", "Cel"),
        ("LitersPerMinute", "L/min"),
        ("LPM", "L/min"),
        ("kPa", "kPa"),
        ("Pa", "Pa"),
        ("Percent", "%"),
        ("Hz", "Hz"),
        ("RPM", "{rev}/min"),
        ("CMM", "m3/min"),
        ("VA", "V.A"),
        ("VAR", "var"),
    ];
    SUFFIXES
        .iter()
        .find(|(s, _)| name.ends_with(s))
        .map(|(_, u)| *u)
}

/// The unit the schema fixes for a `Sensor`'s `ReadingType` (its `ReadingUnits` "shall
/// be" this; services get it wrong, e.g. `kW` for an `EnergykWh` sensor).
pub fn unit_of_type(kind: &str) -> Option<&'static str> {
    Some(match kind {
        "Temperature" => "Cel",
        "Humidity" | "Percent" => "%",
        "Power" => "W",
        "EnergykWh" => "kW.h",
        "EnergyJoules" => "J",
        "EnergyWh" => "W.h",
        "Voltage" => "V",
        "Current" => "A",
        "Frequency" => "Hz",
        "Pressure" | "PressurePa" => "Pa",
        "PressurekPa" => "kPa",
        "Rotational" => "RPM",
        "AirFlowCMM" => "m3/min",
        "AirFlow" => "[ft_i]3/min",
        "LiquidFlow" => "L/s",
        "LiquidFlowLPM" => "L/min",
        "Heat" => "kW",
        _ => return None,
    })
}

/// The canonical metric, its unit and the factor from a Redfish unit; `hint` is the
/// `ReadingType` or property name (it tells humidity and speed from other percents,
/// heat from electrical kW).
pub fn canonical(unit: &str, hint: &str) -> Option<(&'static str, &'static str, f64)> {
    let heat = hint.contains("Heat");
    Some(match unit {
        "Cel" => (TEMPERATURE_C, "°C", 1.0),
        "W" => (POWER_W, "W", 1.0),
        "kW" if heat => (HEAT_LOAD_KW, "kW", 1.0),
        "kW" => (POWER_W, "W", 1000.0),
        "A" => (CURRENT_A, "A", 1.0),
        "V" => (VOLTAGE_V, "V", 1.0),
        "kW.h" | "kWh" => (ENERGY_J, "J", 3.6e6),
        "W.h" | "Wh" => (ENERGY_J, "J", 3600.0),
        "J" => (ENERGY_J, "J", 1.0),
        "L/min" => (FLOW_LPM, "L/min", 1.0),
        "L/s" => (FLOW_LPM, "L/min", 60.0),
        "kPa" => (PRESSURE_KPA, "kPa", 1.0),
        "Pa" => (PRESSURE_KPA, "kPa", 0.001),
        "%" if hint.contains("Humidity") => (HUMIDITY_PCT, "%", 1.0),
        "%" if hint.contains("Speed") || hint.contains("Fan") => (FAN_SPEED_PCT, "%", 1.0),
        "%" => (PERCENT, "%", 1.0),
        "Hz" => (FREQUENCY_HZ, "Hz", 1.0),
        "RPM" | "{rev}/min" => (SPEED_RPM, "RPM", 1.0),
        "m3/min" => (AIRFLOW_M3_MIN, "m3/min", 1.0),
        // cubic feet per minute
        "[ft_i]3/min" => (AIRFLOW_M3_MIN, "m3/min", 0.028_316_846_592),
        "V.A" | "VA" => (APPARENT_POWER_VA, "VA", 1.0),
        _ => return None,
    })
}

/// Every reading in `v`, the resource at `path`.
pub fn resource(v: &Value, path: &str) -> Found {
    let mut found = Found::default();
    let Some(obj) = v.as_object() else {
        return found;
    };
    let kind = obj
        .get("ReadingType")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    // a `Control`'s sensor excerpt is in the units of its set point
    let set_point_units = obj.get("SetPointUnits").and_then(Value::as_str);
    let mut w = Walker {
        path,
        set_point_units,
        out: &mut found,
    };
    w.object(obj, "", &[], &kind, true);
    found
}

struct Walker<'a> {
    path: &'a str,
    set_point_units: Option<&'a str>,
    out: &'a mut Found,
}

impl Walker<'_> {
    /// `names` are the property names from the resource down to `obj`.
    fn object(
        &mut self,
        obj: &Map<String, Value>,
        ptr: &str,
        names: &[&str],
        kind: &str,
        top: bool,
    ) {
        if let Some(r) = obj.get("Reading").and_then(Value::as_f64) {
            self.reading(obj, ptr, names, kind, top, r);
        }
        let interval_min = obj.get("IntervalInMin").and_then(Value::as_f64);
        for (name, unit) in LEGACY {
            if let Some(x) = obj.get(*name).and_then(Value::as_f64) {
                let key = format!("{}#{ptr}/{name}", self.path);
                let window = obj
                    .contains_key("IntervalInMin")
                    .then(|| Window::of(name, interval_min))
                    .flatten();
                self.push(key, format!("{ptr}/{name}"), unit, name, x, false, window);
            }
        }
        for (k, child) in obj {
            if SKIP.contains(&k.as_str()) || k.starts_with('@') {
                continue;
            }
            let p = format!("{ptr}/{k}");
            let mut n = names.to_vec();
            n.push(k);
            self.value(child, &p, &n, kind);
        }
    }

    fn value(&mut self, v: &Value, ptr: &str, names: &[&str], kind: &str) {
        match v {
            Value::Object(o) => self.object(o, ptr, names, kind, false),
            Value::Array(a) => {
                for (i, x) in a.iter().enumerate() {
                    self.value(x, &format!("{ptr}/{i}"), names, kind);
                }
            }
            _ => {}
        }
    }

    fn reading(
        &mut self,
        obj: &Map<String, Value>,
        ptr: &str,
        names: &[&str],
        kind: &str,
        top: bool,
        r: f64,
    ) {
        let typed = if top { unit_of_type(kind) } else { None };
        let stated = obj.get("ReadingUnits").and_then(Value::as_str);
        let implied = names.iter().rev().find_map(|n| unit_of_name(n));
        let unit = typed.or(stated).or(implied).or(self.set_point_units);
        let source = obj.get("DataSourceUri").and_then(Value::as_str);
        let key = match (top, source) {
            (true, _) => self.path.to_string(),
            (false, Some(s)) => s.to_string(),
            (false, None) => format!("{}#{ptr}", self.path),
        };
        let name = names.join("/");
        let hint = if top { kind.to_string() } else { name.clone() };
        match unit {
            Some(u) => self.push(key, format!("{ptr}/Reading"), u, &hint, r, top, None),
            None => self.out.unknown.push(Unknown {
                key,
                property: format!("{ptr}/Reading"),
                unit: None,
            }),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn push(
        &mut self,
        key: String,
        ptr: String,
        unit: &str,
        hint: &str,
        x: f64,
        own: bool,
        window: Option<Window>,
    ) {
        match canonical(unit, hint) {
            Some((metric, canon, factor)) => self.out.readings.push(Reading {
                key,
                from: format!("{}#{ptr}", self.path),
                metric,
                value: x * factor,
                unit: canon,
                redfish_unit: unit.to_string(),
                own,
                window,
            }),
            None => self.out.unknown.push(Unknown {
                key,
                property: ptr,
                unit: Some(unit.to_string()),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_sensor_is_read_by_its_type_and_units() {
        let s = json!({"ReadingType": "EnergykWh", "ReadingUnits": "kW.h", "Reading": 2.5});
        let f = resource(&s, "/redfish/v1/Chassis/1/Sensors/E");
        assert_eq!(f.readings.len(), 1);
        let r = &f.readings[0];
        assert_eq!((r.metric, r.value, r.unit), (ENERGY_J, 9.0e6, "J"));
        assert_eq!(r.key, "/redfish/v1/Chassis/1/Sensors/E");
        assert!(r.own);
    }

    #[test]
    fn excerpts_take_their_unit_from_the_property_name_and_their_key_from_the_source() {
        let m = json!({
            "PolyPhaseVoltage": {"Line1ToNeutral": {"Reading": 118.2, "DataSourceUri": "/s/V1"}},
            "FanSpeedsPercent": [{"Reading": 45.0, "DeviceName": "fan 1"}],
            "HumidityPercent": {"Reading": 38.0},
            "Thresholds": {"UpperCritical": {"Reading": 99.0}},
            "Oem": {"X": {"PowerWatts": {"Reading": 5.0}}}
        });
        let f = resource(&m, "/p");
        let got: Vec<_> = f
            .readings
            .iter()
            .map(|r| (r.key.as_str(), r.metric, r.value))
            .collect();
        let mut got = got;
        got.sort_by(|a, b| a.0.cmp(b.0));
        assert_eq!(
            got,
            vec![
                ("/p#/FanSpeedsPercent/0", FAN_SPEED_PCT, 45.0),
                ("/p#/HumidityPercent", HUMIDITY_PCT, 38.0),
                ("/s/V1", VOLTAGE_V, 118.2),
            ]
        );
    }

    #[test]
    fn flows_in_litres_per_second_and_cubic_feet_per_minute_are_converted() {
        let l = resource(&json!({"ReadingType": "LiquidFlow", "Reading": 0.5}), "/f");
        assert_eq!(
            (l.readings[0].metric, l.readings[0].value),
            (FLOW_LPM, 30.0)
        );
        let a = resource(&json!({"ReadingType": "AirFlow", "Reading": 100.0}), "/a");
        assert_eq!(a.readings[0].metric, AIRFLOW_M3_MIN);
        assert!((a.readings[0].value - 2.8316846592).abs() < 1e-9);
    }

    #[test]
    fn a_reading_without_a_known_unit_is_named_unknown() {
        let f = resource(
            &json!({"Widget": {"Reading": 3.0}, "Level": {"Reading": 1.0, "ReadingUnits": "mm"}}),
            "/p",
        );
        assert!(f.readings.is_empty());
        assert_eq!(f.unknown.len(), 2);
    }

    #[test]
    fn power_metrics_are_statistics_that_keep_their_interval() {
        // `PowerControl` as the DMTF's public-rackmount1 mockup serves it
        let p = json!({"PowerControl": [{
            "PowerConsumedWatts": 344,
            "PowerMetrics": {"IntervalInMin": 30, "MinConsumedWatts": 271,
                             "MaxConsumedWatts": 489, "AverageConsumedWatts": 319},
            "Status": {"State": "Enabled", "Health": "OK"}
        }]});
        let f = resource(&p, "/redfish/v1/Chassis/1U/Power");
        let got: Vec<_> = f
            .readings
            .iter()
            .map(|r| {
                (
                    r.from.rsplit('/').next().expect("pointer"),
                    r.value,
                    r.window,
                )
            })
            .collect();
        let w = |stat| {
            Some(Window {
                stat,
                interval_s: Some(1800.0),
            })
        };
        assert_eq!(
            got,
            vec![
                ("PowerConsumedWatts", 344.0, None),
                ("AverageConsumedWatts", 319.0, w(Stat::Mean)),
                ("MinConsumedWatts", 271.0, w(Stat::Min)),
                ("MaxConsumedWatts", 489.0, w(Stat::Max)),
            ]
        );
        assert!(f.readings.iter().all(|r| r.metric == POWER_W));
        assert_eq!(
            w(Stat::Mean).expect("window").to_string(),
            "mean over 30 min"
        );
        // an interval the service does not state is said so, not made up
        let bare = resource(
            &json!({"PowerMetrics": {"IntervalInMin": null, "AverageConsumedWatts": 10}}),
            "/p",
        );
        assert_eq!(bare.readings[0].window.expect("window").interval_s, None);
    }

    #[test]
    fn processor_metrics_give_power_and_temperature() {
        let m = json!({
            "@odata.type": "#ProcessorMetrics.v1_7_0.ProcessorMetrics",
            "BandwidthPercent": 62,
            "TemperatureCelsius": 41,
            "ConsumedPowerWatt": 82,
            "CoreVoltage": {"Reading": 0.9}
        });
        let path = "/redfish/v1/Systems/1/Processors/GPU_0/ProcessorMetrics";
        let f = resource(&m, path);
        let mut got: Vec<_> = f
            .readings
            .iter()
            .map(|r| (r.key.as_str(), r.metric, r.value, r.window))
            .collect();
        got.sort_by(|a, b| a.0.cmp(b.0));
        assert_eq!(
            got,
            vec![
                (
                    "/redfish/v1/Systems/1/Processors/GPU_0/ProcessorMetrics#/ConsumedPowerWatt",
                    POWER_W,
                    82.0,
                    None
                ),
                (
                    "/redfish/v1/Systems/1/Processors/GPU_0/ProcessorMetrics#/CoreVoltage",
                    VOLTAGE_V,
                    0.9,
                    None
                ),
                (
                    "/redfish/v1/Systems/1/Processors/GPU_0/ProcessorMetrics#/TemperatureCelsius",
                    TEMPERATURE_C,
                    41.0,
                    None
                ),
            ]
        );
        // a newer service's excerpt of the same name is read once, as an excerpt
        let e = resource(&json!({"ConsumedPowerWatt": {"Reading": 80.0}}), "/e");
        assert_eq!(e.readings.len(), 1);
        assert_eq!((e.readings[0].metric, e.readings[0].value), (POWER_W, 80.0));
    }
}
