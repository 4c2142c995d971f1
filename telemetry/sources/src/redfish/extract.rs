//! Readings out of Redfish resources: pure functions over the JSON a BMC returned.
//!
//! Vendors leave fields out and add OEM ones: every field is optional here, and a
//! reading whose resource is absent or disabled is skipped, not an error.

use serde_json::Value;

use telemetry::metric::names::*;
use telemetry::Quality;

/// One reading found in a resource, before it gets its entity and time.
#[derive(Debug, Clone, PartialEq)]
pub struct Found {
    pub metric: &'static str,
    pub value: f64,
    pub quality: Quality,
    /// Which resource (and field) it came from, for the sample's source.
    pub from: String,
}

/// `Status.Health` (and `Conditions`) as a quality; `None` when the resource is absent
/// or disabled (its readings mean nothing).
pub fn quality(resource: &Value) -> Option<Quality> {
    let status = resource.get("Status");
    let state = status.and_then(|s| s.get("State")).and_then(Value::as_str);
    if matches!(state, Some("Absent" | "Disabled" | "UnavailableOffline")) {
        return None;
    }
    let health = status.and_then(|s| s.get("Health")).and_then(Value::as_str);
    let critical_condition = status
        .and_then(|s| s.get("Conditions"))
        .and_then(Value::as_array)
        .is_some_and(|c| {
            c.iter().any(|c| {
                c.get("Severity").and_then(Value::as_str) == Some("Critical")
                    && c.get("ConditionType").and_then(Value::as_str) == Some("Alert")
            })
        });
    Some(match health {
        Some("Critical") => Quality::Bad,
        Some("Warning") => Quality::Uncertain,
        _ if critical_condition => Quality::Uncertain,
        _ => Quality::Good,
    })
}

/// A `{ "Reading": x }` excerpt, or a bare number.
pub fn reading(v: Option<&Value>) -> Option<f64> {
    let v = v?;
    v.get("Reading")
        .and_then(Value::as_f64)
        .or_else(|| v.as_f64())
}

fn push(out: &mut Vec<Found>, metric: &'static str, value: Option<f64>, q: Quality, from: String) {
    if let Some(value) = value {
        out.push(Found {
            metric,
            value,
            quality: q,
            from,
        });
    }
}

/// Legacy `Power`: the chassis' consumed power (`PowerControl[0].PowerConsumedWatts`);
/// a service that gives only the statistics of `PowerMetrics` gives its average over
/// `IntervalInMin`, the source saying so.
pub fn legacy_power(power: &Value, path: &str) -> Vec<Found> {
    let mut out = Vec::new();
    let Some(pc) = power
        .get("PowerControl")
        .and_then(Value::as_array)
        .and_then(|a| a.first())
    else {
        return out;
    };
    let Some(q) = quality(pc) else {
        return out;
    };
    if let Some(w) = pc.get("PowerConsumedWatts").and_then(Value::as_f64) {
        push(
            &mut out,
            POWER_W,
            Some(w),
            q,
            format!("{path}#PowerControl/0/PowerConsumedWatts"),
        );
        return out;
    }
    let metrics = pc.get("PowerMetrics");
    let interval = metrics
        .and_then(|m| m.get("IntervalInMin"))
        .and_then(Value::as_f64)
        .filter(|m| m.is_finite() && *m > 0.0);
    let over = match interval {
        Some(m) => format!("mean over {m} min"),
        None => "mean over the service's interval".to_string(),
    };
    push(
        &mut out,
        POWER_W,
        metrics
            .and_then(|m| m.get("AverageConsumedWatts"))
            .and_then(Value::as_f64),
        q,
        format!("{path}#PowerControl/0/PowerMetrics/AverageConsumedWatts ({over})"),
    );
    out
}

/// Legacy `Thermal`: the intake temperature.
pub fn legacy_thermal(thermal: &Value, path: &str) -> Vec<Found> {
    let mut out = Vec::new();
    for (i, t) in thermal
        .get("Temperatures")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
    {
        if t.get("PhysicalContext").and_then(Value::as_str) != Some("Intake") {
            continue;
        }
        if let Some(q) = quality(t) {
            push(
                &mut out,
                INLET_TEMP_C,
                t.get("ReadingCelsius").and_then(Value::as_f64),
                q,
                format!("{path}#Temperatures/{i}"),
            );
        }
    }
    out
}

/// `EnvironmentMetrics` of a chassis or a cooling unit.
pub fn environment(env: &Value, path: &str) -> Vec<Found> {
    let mut out = Vec::new();
    let q = quality(env).unwrap_or(Quality::Good);
    push(
        &mut out,
        POWER_W,
        reading(env.get("PowerWatts")),
        q,
        format!("{path}#PowerWatts"),
    );
    push(
        &mut out,
        HUMIDITY_PCT,
        reading(env.get("HumidityPercent")),
        q,
        format!("{path}#HumidityPercent"),
    );
    out
}

/// `ThermalSubsystem/ThermalMetrics`: the intake temperature summary.
pub fn thermal_metrics(m: &Value, path: &str) -> Vec<Found> {
    let mut out = Vec::new();
    let q = quality(m).unwrap_or(Quality::Good);
    let summary = m
        .get("TemperatureSummaryCelsius")
        .and_then(|t| t.get("Intake"));
    push(
        &mut out,
        INLET_TEMP_C,
        reading(summary),
        q,
        format!("{path}#TemperatureSummaryCelsius/Intake"),
    );
    out
}

/// `PowerSubsystem/PowerSupplies/{id}/Metrics`: one power supply's input.
pub fn power_supply(m: &Value, path: &str) -> Vec<Found> {
    let mut out = Vec::new();
    let Some(q) = quality(m) else { return out };
    push(
        &mut out,
        POWER_W,
        reading(m.get("InputPowerWatts")),
        q,
        format!("{path}#InputPowerWatts"),
    );
    push(
        &mut out,
        CURRENT_A,
        reading(m.get("InputCurrentAmps")),
        q,
        format!("{path}#InputCurrentAmps"),
    );
    push(
        &mut out,
        VOLTAGE_V,
        reading(m.get("InputVoltage")),
        q,
        format!("{path}#InputVoltage"),
    );
    push(
        &mut out,
        ENERGY_J,
        reading(m.get("EnergykWh")).map(|kwh| kwh * 3.6e6),
        q,
        format!("{path}#EnergykWh"),
    );
    out
}

/// A `Sensor`: an intake temperature becomes the inlet; other sensors are left to the
/// resources that own them.
pub fn sensor(s: &Value, path: &str) -> Vec<Found> {
    let mut out = Vec::new();
    let Some(q) = quality(s) else { return out };
    let kind = s.get("ReadingType").and_then(Value::as_str);
    let context = s.get("PhysicalContext").and_then(Value::as_str);
    let units = s.get("ReadingUnits").and_then(Value::as_str);
    let is_temp = kind == Some("Temperature") || units == Some("Cel");
    if is_temp && context == Some("Intake") {
        push(
            &mut out,
            INLET_TEMP_C,
            s.get("Reading").and_then(Value::as_f64),
            q,
            path.to_string(),
        );
    }
    out
}

/// An outlet, a branch circuit or a mains circuit (`Circuit`/`Outlet` resources).
pub fn circuit(c: &Value, path: &str) -> Vec<Found> {
    let mut out = Vec::new();
    let Some(q) = quality(c) else { return out };
    let power = reading(c.get("PowerWatts")).or_else(|| {
        // a polyphase mains reports per line: its power is the sum of line-to-neutral
        let pp = c.get("PolyPhasePowerWatts")?.as_object()?;
        let lines: Vec<f64> = pp
            .iter()
            .filter(|(k, _)| k.ends_with("ToNeutral"))
            .filter_map(|(_, v)| reading(Some(v)))
            .collect();
        (!lines.is_empty()).then(|| lines.iter().sum())
    });
    push(&mut out, POWER_W, power, q, format!("{path}#PowerWatts"));
    push(
        &mut out,
        CURRENT_A,
        reading(c.get("CurrentAmps")),
        q,
        format!("{path}#CurrentAmps"),
    );
    push(
        &mut out,
        VOLTAGE_V,
        reading(c.get("Voltage")),
        q,
        format!("{path}#Voltage"),
    );
    push(
        &mut out,
        ENERGY_J,
        reading(c.get("EnergykWh")).map(|kwh| kwh * 3.6e6),
        q,
        format!("{path}#EnergykWh"),
    );
    out
}

/// A CDU's coolant connector (primary or secondary loop).
pub fn coolant_connector(c: &Value, path: &str) -> Vec<Found> {
    let mut out = Vec::new();
    let Some(q) = quality(c) else { return out };
    push(
        &mut out,
        SUPPLY_TEMP_C,
        reading(c.get("SupplyTemperatureCelsius")),
        q,
        format!("{path}#SupplyTemperatureCelsius"),
    );
    push(
        &mut out,
        RETURN_TEMP_C,
        reading(c.get("ReturnTemperatureCelsius")),
        q,
        format!("{path}#ReturnTemperatureCelsius"),
    );
    push(
        &mut out,
        FLOW_LPM,
        reading(c.get("FlowLitersPerMinute")),
        q,
        format!("{path}#FlowLitersPerMinute"),
    );
    push(
        &mut out,
        PRESSURE_KPA,
        reading(c.get("DeltaPressurekPa")),
        q,
        format!("{path}#DeltaPressurekPa"),
    );
    push(
        &mut out,
        HEAT_LOAD_KW,
        reading(c.get("HeatRemovedkW")),
        q,
        format!("{path}#HeatRemovedkW"),
    );
    out
}

/// A CDU pump.
pub fn pump(p: &Value, path: &str) -> Vec<Found> {
    let mut out = Vec::new();
    // a failed pump still reports: its quality says it failed
    let q = quality(p).unwrap_or(Quality::Bad);
    push(
        &mut out,
        FAN_SPEED_PCT,
        reading(p.get("PumpSpeedPercent")),
        q,
        format!("{path}#PumpSpeedPercent"),
    );
    out
}

/// A leak detector: 1 when it reports anything but OK.
pub fn leak_detector(d: &Value, path: &str) -> Vec<Found> {
    let mut out = Vec::new();
    let Some(q) = quality(d) else { return out };
    if let Some(state) = d.get("DetectorState").and_then(Value::as_str) {
        out.push(Found {
            metric: LEAK_DETECTED,
            value: if state == "OK" { 0.0 } else { 1.0 },
            quality: q,
            from: format!("{path}#DetectorState"),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn health_becomes_quality_and_absent_resources_are_skipped() {
        assert_eq!(
            quality(&json!({"Status": {"Health": "OK", "State": "Enabled"}})),
            Some(Quality::Good)
        );
        assert_eq!(
            quality(&json!({"Status": {"Health": "Warning"}})),
            Some(Quality::Uncertain)
        );
        assert_eq!(
            quality(&json!({"Status": {"Health": "Critical"}})),
            Some(Quality::Bad)
        );
        assert_eq!(quality(&json!({"Status": {"State": "Absent"}})), None);
        assert_eq!(
            quality(&json!({})),
            Some(Quality::Good),
            "no Status at all: vendors omit it"
        );
        let cond = json!({"Status": {"Health": "OK", "Conditions": [{"Severity": "Critical", "ConditionType": "Alert"}]}});
        assert_eq!(quality(&cond), Some(Quality::Uncertain));
    }

    #[test]
    fn a_polyphase_mains_sums_its_lines_to_neutral() {
        let m = json!({"PolyPhasePowerWatts": {"Line1ToLine2": {"Reading": 700.0}, "Line1ToNeutral": {"Reading": 198.4}, "Line2ToNeutral": {"Reading": 231.5}, "Line3ToNeutral": {"Reading": 58.1}}});
        let f = circuit(&m, "/x");
        assert_eq!(f.len(), 1);
        assert!((f[0].value - 488.0).abs() < 1e-9);
    }

    #[test]
    fn missing_and_oem_fields_are_tolerated() {
        let weird = json!({"Oem": {"Vendor": {"PowerWatts": 5}}, "PowerWatts": {"DataSourceUri": "/x"}, "Voltage": 230.0});
        let f = circuit(&weird, "/x");
        assert_eq!(
            f.iter().map(|x| (x.metric, x.value)).collect::<Vec<_>>(),
            vec![(VOLTAGE_V, 230.0)]
        );
        assert!(environment(&json!({}), "/e").is_empty());
        assert!(legacy_power(&json!({"PowerControl": []}), "/p").is_empty());
    }

    #[test]
    fn legacy_power_falls_back_to_the_average_and_says_over_what() {
        let both = json!({"PowerControl": [{"PowerConsumedWatts": 344,
            "PowerMetrics": {"IntervalInMin": 30, "AverageConsumedWatts": 319}}]});
        let f = legacy_power(&both, "/p");
        assert_eq!((f.len(), f[0].value), (1, 344.0));
        let avg = json!({"PowerControl": [{
            "PowerMetrics": {"IntervalInMin": 5, "AverageConsumedWatts": 319}}]});
        let f = legacy_power(&avg, "/p");
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].value, 319.0);
        assert_eq!(
            f[0].from,
            "/p#PowerControl/0/PowerMetrics/AverageConsumedWatts (mean over 5 min)"
        );
    }
}
