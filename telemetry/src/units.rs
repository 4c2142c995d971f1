//! Units as sources write them, and conversion to each metric's canonical unit.

/// What a unit measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dimension {
    Temperature,
    Power,
    Energy,
    Flow,
    Pressure,
    Ratio,
    Frequency,
    Current,
    Voltage,
    Price,
    CarbonIntensity,
}

/// A unit: `base = value × scale + offset`, in its dimension's base unit
/// (°C, W, J, L/min, kPa, %, MHz, A, V, currency/kWh, gCO2/kWh).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Unit {
    pub name: &'static str,
    pub dimension: Dimension,
    scale: f64,
    offset: f64,
}

const fn u(name: &'static str, dimension: Dimension, scale: f64, offset: f64) -> Unit {
    Unit {
        name,
        dimension,
        scale,
        offset,
    }
}

use Dimension::*;

/// Every spelling powerplane understands, first the canonical one of each unit.
const UNITS: &[(&[&str], Unit)] = &[
    (
        &["°C", "degC", "C", "celsius", "Cel"],
        u("°C", Temperature, 1.0, 0.0),
    ),
    (
        &["°F", "degF", "F", "fahrenheit"],
        u("°F", Temperature, 5.0 / 9.0, -32.0 * 5.0 / 9.0),
    ),
    (&["K", "kelvin"], u("K", Temperature, 1.0, -273.15)),
    (&["W", "watt", "watts"], u("W", Power, 1.0, 0.0)),
    (&["kW", "kilowatt", "kilowatts"], u("kW", Power, 1e3, 0.0)),
    (&["MW", "megawatt"], u("MW", Power, 1e6, 0.0)),
    (
        &["BTU/h", "BTU/hr", "btuh"],
        u("BTU/h", Power, 0.293_071_07, 0.0),
    ),
    (&["J", "joule", "joules"], u("J", Energy, 1.0, 0.0)),
    (&["mJ"], u("mJ", Energy, 1e-3, 0.0)),
    (&["Wh"], u("Wh", Energy, 3600.0, 0.0)),
    (&["kWh", "kW.h"], u("kWh", Energy, 3.6e6, 0.0)),
    (&["MWh"], u("MWh", Energy, 3.6e9, 0.0)),
    (
        &["L/min", "l/min", "lpm", "LPM"],
        u("L/min", Flow, 1.0, 0.0),
    ),
    (
        &["GPM", "gpm", "gal/min"],
        u("GPM", Flow, 3.785_411_784, 0.0),
    ),
    (&["m3/h", "m³/h"], u("m3/h", Flow, 1000.0 / 60.0, 0.0)),
    (&["L/s", "l/s"], u("L/s", Flow, 60.0, 0.0)),
    (&["kPa"], u("kPa", Pressure, 1.0, 0.0)),
    (&["Pa"], u("Pa", Pressure, 1e-3, 0.0)),
    (&["bar"], u("bar", Pressure, 100.0, 0.0)),
    (&["psi", "PSI"], u("psi", Pressure, 6.894_757, 0.0)),
    (&["%", "percent", "pct"], u("%", Ratio, 1.0, 0.0)),
    (&["ratio", "fraction"], u("ratio", Ratio, 100.0, 0.0)),
    (&["MHz"], u("MHz", Frequency, 1.0, 0.0)),
    (&["GHz"], u("GHz", Frequency, 1000.0, 0.0)),
    (&["Hz"], u("Hz", Frequency, 1e-6, 0.0)),
    (&["A", "amp", "amps"], u("A", Current, 1.0, 0.0)),
    (&["mA"], u("mA", Current, 1e-3, 0.0)),
    (&["V", "volt", "volts"], u("V", Voltage, 1.0, 0.0)),
    (
        &["currency/kWh", "EUR/kWh", "USD/kWh", "GBP/kWh"],
        u("currency/kWh", Price, 1.0, 0.0),
    ),
    (
        &["currency/MWh", "EUR/MWh", "USD/MWh", "GBP/MWh"],
        u("currency/MWh", Price, 1e-3, 0.0),
    ),
    (&["ct/kWh", "cents/kWh"], u("ct/kWh", Price, 1e-2, 0.0)),
    (
        &["gCO2/kWh", "g/kWh"],
        u("gCO2/kWh", CarbonIntensity, 1.0, 0.0),
    ),
    (&["kgCO2/MWh"], u("kgCO2/MWh", CarbonIntensity, 1.0, 0.0)),
    (
        &["lbsCO2/MWh", "lbs/MWh"],
        u("lbsCO2/MWh", CarbonIntensity, 0.453_592_37, 0.0),
    ),
];

impl Unit {
    /// Looks a unit up by any of its spellings.
    pub fn parse(s: &str) -> Option<Unit> {
        let s = s.trim();
        UNITS
            .iter()
            .find(|(names, _)| names.contains(&s))
            .map(|(_, u)| *u)
    }

    /// Converts `value` in this unit into `to`; `None` across dimensions.
    pub fn convert(&self, value: f64, to: &Unit) -> Option<f64> {
        if self.dimension != to.dimension {
            return None;
        }
        let base = value * self.scale + self.offset;
        Some((base - to.offset) / to.scale)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conv(v: f64, from: &str, to: &str) -> f64 {
        let (a, b) = (Unit::parse(from).expect(from), Unit::parse(to).expect(to));
        a.convert(v, &b).expect("same dimension")
    }

    #[test]
    fn converts_what_facilities_send() {
        assert!((conv(89.6, "degF", "°C") - 32.0).abs() < 1e-9);
        assert!((conv(300.15, "K", "°C") - 27.0).abs() < 1e-9);
        assert!((conv(1.5, "kW", "W") - 1500.0).abs() < 1e-9);
        assert!((conv(2.0, "kWh", "J") - 7.2e6).abs() < 1e-6);
        assert!((conv(10.0, "GPM", "L/min") - 37.854_117_84).abs() < 1e-9);
        assert!((conv(2.0, "bar", "kPa") - 200.0).abs() < 1e-9);
        assert!((conv(120.0, "EUR/MWh", "currency/kWh") - 0.12).abs() < 1e-12);
        assert!((conv(3000.0, "W", "kW") - 3.0).abs() < 1e-12);
        assert!((conv(0.42, "ratio", "%") - 42.0).abs() < 1e-12);
    }

    #[test]
    fn refuses_across_dimensions_and_unknown_units() {
        let (c, w) = (Unit::parse("°C").expect("c"), Unit::parse("W").expect("w"));
        assert_eq!(c.convert(1.0, &w), None);
        assert_eq!(Unit::parse("furlongs/fortnight"), None);
    }
}
