//! Cooling faults the simulated facilities inject (the demo's `--fault`, the
//! backtest's `[[cooling_fault]]`): a unit that removes only part of its capacity.

use telemetry::Site;

/// Why a `--fault` cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum FaultError {
    #[error("fault {0:?}: expected UNIT=FACTOR@MINUTES or UNIT=pump@MINUTES")]
    Shape(String),
    #[error("fault {fault:?}: no cooling unit {unit:?} in the site")]
    Unit { fault: String, unit: String },
    #[error("fault {fault:?}: factor must be within 0..=1 and minutes not negative, got {factor} and {minutes}")]
    Range {
        fault: String,
        factor: f64,
        minutes: f64,
    },
}

/// A cooling fault the simulator injects: from `at_s` seconds into the run, the unit
/// removes only `factor` of its capacity (a failed pump, a CDU capacity drop).
#[derive(Debug, Clone, PartialEq)]
pub struct Fault {
    pub unit: String,
    pub at_s: f64,
    pub factor: f64,
}

impl Fault {
    /// What is left of a unit's capacity after one of its two pumps fails.
    pub const PUMP_FAILURE_FACTOR: f64 = 0.5;

    /// Parses `UNIT=FACTOR@MINUTES` or `UNIT=pump@MINUTES` (`crah-b=0.6@60`: from
    /// minute 60, crah-b removes 60% of its capacity).
    pub fn parse(s: &str, site: &Site) -> Result<Fault, FaultError> {
        let bad = || FaultError::Shape(s.to_string());
        let (unit, rest) = s.split_once('=').ok_or_else(bad)?;
        let (what, at) = rest.split_once('@').ok_or_else(bad)?;
        if !site.cooling.iter().any(|c| c.id == unit) {
            return Err(FaultError::Unit {
                fault: s.to_string(),
                unit: unit.to_string(),
            });
        }
        let factor = match what {
            "pump" => Fault::PUMP_FAILURE_FACTOR,
            f => f.parse::<f64>().map_err(|_| bad())?,
        };
        let minutes: f64 = at.parse().map_err(|_| bad())?;
        if !(0.0..=1.0).contains(&factor) || !(0.0..=1e6).contains(&minutes) {
            return Err(FaultError::Range {
                fault: s.to_string(),
                factor,
                minutes,
            });
        }
        Ok(Fault {
            unit: unit.to_string(),
            at_s: minutes * 60.0,
            factor,
        })
    }
}
