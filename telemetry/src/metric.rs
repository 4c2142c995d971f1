//! Canonical metrics: one name, one unit, a physical range, and a freshness bound.
//!
//! Sources convert to these units before a sample enters the snapshot; a value outside
//! the physical range is rejected, never believed.

use std::fmt;

use serde::{Deserialize, Serialize};

/// The name of a metric, e.g. `inlet_temp_c`. The unit is part of the name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Metric(pub String);

impl Metric {
    pub fn new(name: &str) -> Self {
        Metric(name.to_string())
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
    /// The registered spec of this metric, if it is a known one.
    pub fn spec(&self) -> Option<&'static MetricSpec> {
        spec(&self.0)
    }
}

impl std::borrow::Borrow<str> for Metric {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Metric {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<&str> for Metric {
    fn from(s: &str) -> Self {
        Metric::new(s)
    }
}

/// What powerplane knows about a metric.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MetricSpec {
    pub name: &'static str,
    pub unit: &'static str,
    /// Smallest physically plausible value (inclusive).
    pub min: f64,
    /// Largest physically plausible value (inclusive).
    pub max: f64,
    /// A value older than this is stale.
    pub freshness_s: f64,
    pub help: &'static str,
}

/// Names of the canonical metrics.
pub mod names {
    pub const POWER_W: &str = "power_w";
    pub const ENERGY_J: &str = "energy_j";
    pub const POWER_LIMIT_W: &str = "power_limit_w";
    pub const GPU_TEMP_C: &str = "gpu_temp_c";
    pub const UTILIZATION_PCT: &str = "utilization_pct";
    pub const SM_CLOCK_MHZ: &str = "sm_clock_mhz";
    pub const INLET_TEMP_C: &str = "inlet_temp_c";
    pub const SUPPLY_TEMP_C: &str = "supply_temp_c";
    pub const RETURN_TEMP_C: &str = "return_temp_c";
    pub const HEAT_LOAD_KW: &str = "heat_load_kw";
    pub const COOLING_CAPACITY_KW: &str = "cooling_capacity_kw";
    pub const COOLING_POWER_W: &str = "cooling_power_w";
    pub const FLOW_LPM: &str = "flow_lpm";
    pub const PRESSURE_KPA: &str = "pressure_kpa";
    pub const CURRENT_A: &str = "current_a";
    pub const VOLTAGE_V: &str = "voltage_v";
    pub const HUMIDITY_PCT: &str = "humidity_pct";
    pub const FAN_SPEED_PCT: &str = "fan_speed_pct";
    pub const LEAK_DETECTED: &str = "leak_detected";
    pub const PRICE_PER_KWH: &str = "price_per_kwh";
    pub const CARBON_G_PER_KWH: &str = "carbon_g_per_kwh";
    /// The billing period's highest demand-interval average of IT power so far.
    pub const PERIOD_PEAK_W: &str = "period_peak_w";
    /// The highest demand-interval average of IT power over the last 24 hours.
    pub const DAY_PEAK_W: &str = "day_peak_w";
    /// Power at the utility's revenue meter: IT, cooling and losses (a site reading).
    pub const FACILITY_POWER_W: &str = "facility_power_w";
    /// 1 while a grid (demand-response) event is in force at the site, else 0.
    pub const GRID_EVENT_ACTIVE: &str = "grid_event_active";
    /// The event's shed as a fraction of the baseline (0.25: 25% below it).
    pub const GRID_SHED_FRACTION: &str = "grid_shed_fraction";
    /// The event's shed at the meter, in W below the baseline.
    pub const GRID_SHED_W: &str = "grid_shed_w";
    /// The event's cap at the meter, in W.
    pub const GRID_CAP_W: &str = "grid_cap_w";
    /// The baseline the event's shed is taken from, in W at the meter, where the edge
    /// that publishes the event computed one.
    pub const GRID_BASELINE_W: &str = "grid_baseline_w";
    pub const TEMPERATURE_C: &str = "temperature_c";
    pub const PERCENT: &str = "percent";
    pub const FREQUENCY_HZ: &str = "frequency_hz";
    pub const SPEED_RPM: &str = "speed_rpm";
    pub const AIRFLOW_M3_MIN: &str = "airflow_m3_min";
    pub const APPARENT_POWER_VA: &str = "apparent_power_va";
    pub const OUTPUT_POWER_W: &str = "output_power_w";
    pub const DEW_POINT_C: &str = "dew_point_c";
}

const SPECS: &[MetricSpec] = &[
    MetricSpec {
        name: names::POWER_W,
        unit: "W",
        min: 0.0,
        max: 50e6,
        freshness_s: 30.0,
        help: "electrical power drawn",
    },
    MetricSpec {
        name: names::ENERGY_J,
        unit: "J",
        min: 0.0,
        max: 1e18,
        freshness_s: 30.0,
        help: "energy counter since an arbitrary origin",
    },
    MetricSpec {
        name: names::POWER_LIMIT_W,
        unit: "W",
        min: 0.0,
        max: 5000.0,
        freshness_s: 60.0,
        help: "enforced GPU power limit",
    },
    MetricSpec {
        name: names::GPU_TEMP_C,
        unit: "°C",
        min: -10.0,
        max: 130.0,
        freshness_s: 30.0,
        help: "GPU die temperature",
    },
    MetricSpec {
        name: names::UTILIZATION_PCT,
        unit: "%",
        min: 0.0,
        max: 100.0,
        freshness_s: 30.0,
        help: "GPU utilization",
    },
    MetricSpec {
        name: names::SM_CLOCK_MHZ,
        unit: "MHz",
        min: 0.0,
        max: 5000.0,
        freshness_s: 30.0,
        help: "GPU SM clock",
    },
    MetricSpec {
        name: names::INLET_TEMP_C,
        unit: "°C",
        min: -20.0,
        max: 80.0,
        freshness_s: 60.0,
        help: "rack or server air inlet temperature",
    },
    MetricSpec {
        name: names::SUPPLY_TEMP_C,
        unit: "°C",
        min: -10.0,
        max: 100.0,
        freshness_s: 60.0,
        help: "coolant or air supply temperature of a cooling unit",
    },
    MetricSpec {
        name: names::RETURN_TEMP_C,
        unit: "°C",
        min: -10.0,
        max: 100.0,
        freshness_s: 60.0,
        help: "coolant or air return temperature of a cooling unit",
    },
    MetricSpec {
        name: names::HEAT_LOAD_KW,
        unit: "kW",
        min: 0.0,
        max: 100_000.0,
        freshness_s: 60.0,
        help: "heat removed by a cooling unit",
    },
    MetricSpec {
        name: names::COOLING_CAPACITY_KW,
        unit: "kW",
        min: 0.0,
        max: 100_000.0,
        freshness_s: 60.0,
        help: "heat a cooling unit can remove now (lower after a pump or fan fault)",
    },
    MetricSpec {
        name: names::COOLING_POWER_W,
        unit: "W",
        min: 0.0,
        max: 50e6,
        freshness_s: 60.0,
        help: "electrical power of cooling equipment",
    },
    MetricSpec {
        name: names::FLOW_LPM,
        unit: "L/min",
        min: 0.0,
        max: 100_000.0,
        freshness_s: 60.0,
        help: "coolant flow",
    },
    MetricSpec {
        name: names::PRESSURE_KPA,
        unit: "kPa",
        min: -100.0,
        max: 5000.0,
        freshness_s: 60.0,
        help: "coolant pressure (gauge or differential)",
    },
    MetricSpec {
        name: names::CURRENT_A,
        unit: "A",
        min: 0.0,
        max: 10_000.0,
        freshness_s: 30.0,
        help: "electrical current",
    },
    MetricSpec {
        name: names::VOLTAGE_V,
        unit: "V",
        min: 0.0,
        max: 100_000.0,
        freshness_s: 30.0,
        help: "electrical voltage",
    },
    MetricSpec {
        name: names::HUMIDITY_PCT,
        unit: "%",
        min: 0.0,
        max: 100.0,
        freshness_s: 120.0,
        help: "relative humidity",
    },
    MetricSpec {
        name: names::FAN_SPEED_PCT,
        unit: "%",
        min: 0.0,
        max: 100.0,
        freshness_s: 60.0,
        help: "fan or pump speed",
    },
    MetricSpec {
        name: names::LEAK_DETECTED,
        unit: "bool",
        min: 0.0,
        max: 1.0,
        freshness_s: 60.0,
        help: "1 when a leak detector trips",
    },
    MetricSpec {
        name: names::PRICE_PER_KWH,
        unit: "currency/kWh",
        min: -10.0,
        max: 100.0,
        freshness_s: 7200.0,
        help: "electricity price in force",
    },
    MetricSpec {
        name: names::PERIOD_PEAK_W,
        unit: "W",
        min: 0.0,
        max: 1e9,
        freshness_s: 7200.0,
        help: "the billing period's highest demand-interval average of IT power so far",
    },
    MetricSpec {
        name: names::DAY_PEAK_W,
        unit: "W",
        min: 0.0,
        max: 1e9,
        freshness_s: 7200.0,
        help: "the highest demand-interval average of IT power over the last 24 hours",
    },
    MetricSpec {
        name: names::FACILITY_POWER_W,
        unit: "W",
        min: 0.0,
        max: 1e9,
        freshness_s: 30.0,
        help: "power at the utility meter (IT, cooling and losses)",
    },
    MetricSpec {
        name: names::GRID_EVENT_ACTIVE,
        unit: "",
        min: 0.0,
        max: 1.0,
        freshness_s: 30.0,
        help: "1 while a demand-response event is in force",
    },
    MetricSpec {
        name: names::GRID_SHED_FRACTION,
        unit: "",
        min: 0.0,
        max: 1.0,
        freshness_s: 30.0,
        help: "a demand-response event's shed as a fraction of the baseline",
    },
    MetricSpec {
        name: names::GRID_SHED_W,
        unit: "W",
        min: 0.0,
        max: 1e9,
        freshness_s: 30.0,
        help: "a demand-response event's shed at the meter below the baseline",
    },
    MetricSpec {
        name: names::GRID_CAP_W,
        unit: "W",
        min: 0.0,
        max: 1e9,
        freshness_s: 30.0,
        help: "a demand-response event's cap at the meter",
    },
    MetricSpec {
        name: names::GRID_BASELINE_W,
        unit: "W",
        min: 0.0,
        max: 1e9,
        freshness_s: 30.0,
        help: "the baseline a demand-response event's shed is taken from",
    },
    MetricSpec {
        name: names::CARBON_G_PER_KWH,
        unit: "gCO2/kWh",
        min: 0.0,
        max: 3000.0,
        freshness_s: 7200.0,
        help: "grid carbon intensity in force",
    },
    MetricSpec {
        name: names::TEMPERATURE_C,
        unit: "°C",
        min: -60.0,
        max: 250.0,
        freshness_s: 60.0,
        help: "a temperature sensor other than a GPU die or an air inlet (exhaust, CPU, coolant, ambient)",
    },
    MetricSpec {
        name: names::PERCENT,
        unit: "%",
        min: 0.0,
        max: 100.0,
        freshness_s: 60.0,
        help: "a percentage reading other than humidity or a fan or pump speed",
    },
    MetricSpec {
        name: names::FREQUENCY_HZ,
        unit: "Hz",
        min: 0.0,
        max: 1e9,
        freshness_s: 60.0,
        help: "a frequency: AC line frequency, clock",
    },
    MetricSpec {
        name: names::SPEED_RPM,
        unit: "RPM",
        min: 0.0,
        max: 1e6,
        freshness_s: 60.0,
        help: "a fan or pump rotational speed",
    },
    MetricSpec {
        name: names::AIRFLOW_M3_MIN,
        unit: "m3/min",
        min: 0.0,
        max: 1e6,
        freshness_s: 60.0,
        help: "air flow",
    },
    MetricSpec {
        name: names::APPARENT_POWER_VA,
        unit: "VA",
        min: 0.0,
        max: 50e6,
        freshness_s: 30.0,
        help: "apparent electrical power",
    },
    MetricSpec {
        name: names::OUTPUT_POWER_W,
        unit: "W",
        min: 0.0,
        max: 50e6,
        freshness_s: 30.0,
        help: "electrical power a power supply delivers (its input less its losses)",
    },
    MetricSpec {
        name: names::DEW_POINT_C,
        unit: "°C",
        min: -60.0,
        max: 60.0,
        freshness_s: 60.0,
        help: "dew point of the air",
    },
];

/// The spec of a canonical metric.
pub fn spec(name: &str) -> Option<&'static MetricSpec> {
    SPECS.iter().find(|s| s.name == name)
}

/// Every canonical metric.
pub fn all() -> &'static [MetricSpec] {
    SPECS
}
