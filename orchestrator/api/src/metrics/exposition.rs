//! The exposition format itself: the metric names and units, label escaping, and the
//! families written whole; every step of [`super::render`] adds its samples here.

use std::collections::BTreeMap;
use std::fmt::Write;

use telemetry::metric::names::*;

/// Prometheus name, scale to base units, help.
pub(super) fn prom(metric: &str) -> Option<(&'static str, f64, &'static str)> {
    Some(match metric {
        POWER_W => ("power_watts", 1.0, "Electrical power drawn"),
        ENERGY_J => (
            "energy_joules_total",
            1.0,
            "Cumulative energy as the device reports it (a counter; restarts from 0 on a device reset)",
        ),
        POWER_LIMIT_W => ("gpu_power_limit_watts", 1.0, "Power limit the GPU enforces"),
        GPU_TEMP_C => ("gpu_temperature_celsius", 1.0, "GPU temperature"),
        UTILIZATION_PCT => ("gpu_utilization_ratio", 0.01, "GPU utilization"),
        SM_CLOCK_MHZ => ("gpu_sm_clock_hertz", 1e6, "GPU SM clock"),
        INLET_TEMP_C => (
            "inlet_temperature_celsius",
            1.0,
            "Rack inlet air temperature",
        ),
        SUPPLY_TEMP_C => (
            "supply_temperature_celsius",
            1.0,
            "Coolant or air supply temperature",
        ),
        RETURN_TEMP_C => (
            "return_temperature_celsius",
            1.0,
            "Coolant or air return temperature",
        ),
        HEAT_LOAD_KW => ("heat_load_watts", 1000.0, "Heat load on a cooling unit"),
        COOLING_POWER_W => ("cooling_power_watts", 1.0, "Power drawn by cooling"),
        FLOW_LPM => ("coolant_flow_liters_per_second", 1.0 / 60.0, "Coolant flow"),
        PRESSURE_KPA => ("pressure_pascals", 1000.0, "Coolant pressure"),
        CURRENT_A => ("current_amperes", 1.0, "Electrical current"),
        VOLTAGE_V => ("voltage_volts", 1.0, "Voltage"),
        HUMIDITY_PCT => ("humidity_ratio", 0.01, "Relative humidity"),
        FAN_SPEED_PCT => ("fan_speed_ratio", 0.01, "Fan speed"),
        LEAK_DETECTED => ("leak_detected", 1.0, "1 when a leak detector trips"),
        PRICE_PER_KWH => (
            "price_per_kwh",
            1.0,
            "Electricity price now, in the site's currency",
        ),
        CARBON_G_PER_KWH => (
            "carbon_grams_per_kwh",
            1.0,
            "Carbon intensity of the grid now",
        ),
        PERIOD_PEAK_W => (
            "period_peak_watts",
            1.0,
            "The billing period's highest demand-interval average of IT power so far",
        ),
        DAY_PEAK_W => (
            "day_peak_watts",
            1.0,
            "The highest demand-interval average of IT power over the last 24 hours",
        ),
        _ => return None,
    })
}

pub(super) fn esc(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// One metric family, written whole (HELP, TYPE, samples) so families never interleave.
struct Family {
    help: String,
    kind: &'static str,
    samples: Vec<(String, f64)>,
}

#[derive(Default)]
pub(super) struct Out {
    families: BTreeMap<String, Family>,
}

impl Out {
    pub(super) fn add(
        &mut self,
        name: &str,
        kind: &'static str,
        help: &str,
        labels: &[(&str, &str)],
        v: f64,
    ) {
        if !v.is_finite() {
            return;
        }
        let l = labels
            .iter()
            .map(|(k, v)| format!("{k}=\"{}\"", esc(v)))
            .collect::<Vec<_>>()
            .join(",");
        let f = self
            .families
            .entry(format!("powerplane_{name}"))
            .or_insert(Family {
                help: help.to_string(),
                kind,
                samples: Vec::new(),
            });
        f.samples.push((
            if l.is_empty() {
                String::new()
            } else {
                format!("{{{l}}}")
            },
            v,
        ));
    }

    /// Whether a family of this name (without the `powerplane_` prefix) has samples.
    pub(super) fn has(&self, name: &str) -> bool {
        self.families.contains_key(&format!("powerplane_{name}"))
    }

    /// A sample of a family whose name is the standard one, not ours (`process_*`).
    pub(super) fn add_plain(&mut self, name: &str, kind: &'static str, help: &str, v: f64) {
        if !v.is_finite() {
            return;
        }
        self.families
            .entry(name.to_string())
            .or_insert(Family {
                help: help.to_string(),
                kind,
                samples: Vec::new(),
            })
            .samples
            .push((String::new(), v));
    }

    /// A histogram's `_bucket{le}` (cumulative, to `+Inf`), `_sum` and `_count`, under
    /// `labels` (the same family may hold several label sets).
    pub(super) fn histogram(
        &mut self,
        name: &str,
        help: &str,
        labels: &[(&str, &str)],
        h: &telemetry::histogram::Snapshot,
    ) {
        let base: Vec<String> = labels
            .iter()
            .map(|(k, v)| format!("{k}=\"{}\"", esc(v)))
            .collect();
        let f = self
            .families
            .entry(format!("powerplane_{name}"))
            .or_insert(Family {
                help: help.to_string(),
                kind: "histogram",
                samples: Vec::new(),
            });
        for (le, n) in &h.cumulative {
            let le = if le.is_infinite() {
                "+Inf".to_string()
            } else {
                le.to_string()
            };
            let mut l = base.clone();
            l.push(format!("le=\"{le}\""));
            f.samples
                .push((format!("_bucket{{{}}}", l.join(",")), *n as f64));
        }
        let l = if base.is_empty() {
            String::new()
        } else {
            format!("{{{}}}", base.join(","))
        };
        f.samples.push((format!("_sum{l}"), h.sum_s));
        f.samples.push((format!("_count{l}"), h.count as f64));
    }

    pub(super) fn render(self) -> String {
        let mut s = String::new();
        for (name, f) in self.families {
            let _ = writeln!(s, "# HELP {name} {}", f.help);
            let _ = writeln!(s, "# TYPE {name} {}", f.kind);
            for (labels, v) in f.samples {
                let _ = writeln!(s, "{name}{labels} {v}");
            }
        }
        s
    }
}
