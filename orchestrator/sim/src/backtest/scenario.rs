//! The scenario file: what the trace does not say (classes, deadlines), what happens to
//! the facility (a heat wave, a lowered contract limit, a price spike), how the price and
//! carbon files are written, and the seed.
//!
//! ```toml
//! seed = 1
//! tick_s = 300
//!
//! # jobs without a class: the first rule whose share the seeded draw falls in
//! [[classes]]
//! class = "batch"
//! share = 0.6
//! deferrable = true
//! slack_h = 24            # deadline = submit + duration + 24 h (or deadline_h: submit + N h)
//! [[classes]]
//! class = "interactive"
//! share = 0.4
//!
//! [heat_wave]
//! start = "2024-08-12T00:00:00+02:00"
//! days = 3
//! cooling_drop = 0.30     # every cooling unit loses 30% of its capacity
//!
//! [contract]
//! limit_kw = 350          # the facility may draw no more, for the whole run
//!
//! [[cooling_fault]]        # one cooling unit fails, unannounced
//! unit = "cdu-1"
//! start = "2024-08-20T14:00:00+02:00"
//! hours = 6
//! pump_failure = true     # one of two pumps: half the capacity; or capacity = 0.6
//!
//! [[price_spike]]
//! start = "2024-09-03T17:00:00+02:00"
//! hours = 4
//! factor = 5.0            # and/or add_per_kwh = 0.5
//!
//! [[grid_events]]         # a demand-response event the policy's facility is asked to meet
//! id = "peak-1"           # optional (default: grid-event-N, N from 1)
//! start = "2024-09-04T17:00:00+02:00"
//! duration_min = 180
//! shed_pct = 25           # or target_kw = 400: a cap at the meter (IT + cooling)
//!
//! [prices]                # as `serve`'s [prices]: format = "simple" | "csv" | "json" | "entsoe"
//! format = "csv"
//! [prices.csv]
//! time_column = "time"
//! ...
//! ```

use serde::Deserialize;
use telemetry::Timestamp;

use control::feeds::FeedFormat;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClassRule {
    pub class: String,
    /// Share of the jobs without a class that get this one (the shares of all rules
    /// should add up to 1; what is left over keeps `default_class`).
    pub share: f64,
    #[serde(default)]
    pub deferrable: bool,
    /// Deadline = submit + this many hours.
    #[serde(default)]
    pub deadline_h: Option<f64>,
    /// Deadline = submit + duration + this many hours.
    #[serde(default)]
    pub slack_h: Option<f64>,
    #[serde(default)]
    pub priority: i32,
    /// Its jobs may be suspended while they run (the engine's grid controller does so
    /// in a demand-response event; the facility stops them where they are, keeping
    /// their GPUs, until resumed).
    #[serde(default)]
    pub preemptible: bool,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HeatWave {
    #[serde(deserialize_with = "ts")]
    pub start: Timestamp,
    pub days: f64,
    /// The share of every cooling unit's capacity lost (0.3: 30%).
    pub cooling_drop: f64,
}

/// A lowered contract limit: the facility may draw no more than this, for the whole
/// run (the policy gets it as its `site` budget limit; the feeds keep their ratings).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Contract {
    pub limit_kw: f64,
}

/// A cooling unit that loses part of its capacity for a while (a failed pump, a CDU
/// capacity drop): the controller learns of it only from the unit's capacity reading.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CoolingFault {
    pub unit: String,
    #[serde(deserialize_with = "ts")]
    pub start: Timestamp,
    pub hours: f64,
    /// The share of the unit's capacity left (0.6: 60%).
    #[serde(default)]
    pub capacity: Option<f64>,
    /// One of the unit's two pumps fails: half its capacity is left.
    #[serde(default)]
    pub pump_failure: bool,
}

impl CoolingFault {
    fn factor(&self) -> f64 {
        match (self.capacity, self.pump_failure) {
            (Some(c), _) => c,
            (None, _) => crate::Fault::PUMP_FAILURE_FACTOR,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PriceSpike {
    #[serde(deserialize_with = "ts")]
    pub start: Timestamp,
    pub hours: f64,
    #[serde(default = "one")]
    pub factor: f64,
    #[serde(default)]
    pub add_per_kwh: f64,
}

/// A demand-response event (`[[grid_events]]`): from `start` for `duration_min`, shed
/// `shed_pct` % of the meter's baseline (its mean over the hour before `start`) or
/// draw at most `target_kw` at the meter; exactly one of the two. Events may not
/// overlap (each is measured on its own window).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GridEventEntry {
    #[serde(default)]
    pub id: Option<String>,
    #[serde(deserialize_with = "ts")]
    pub start: Timestamp,
    pub duration_min: f64,
    #[serde(default)]
    pub shed_pct: Option<f64>,
    #[serde(default)]
    pub target_kw: Option<f64>,
}

fn one() -> f64 {
    1.0
}

fn ts<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Timestamp, D::Error> {
    let s = String::deserialize(d)?;
    Timestamp::parse_rfc3339(&s)
        .map_err(|e| serde::de::Error::custom(format!("{s:?} is not RFC 3339: {e}")))
}

fn opt_ts<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Timestamp>, D::Error> {
    ts(d).map(Some)
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    #[serde(default = "seed")]
    pub seed: u64,
    /// Control loop period, simulated seconds.
    #[serde(default = "tick")]
    pub tick_s: f64,
    /// Read the facility this often (simulated seconds) between ticks too, and
    /// evaluate a reading that crosses a threshold at once, as `serve` does (its
    /// default debounce and rate, on simulated time); absent: at the ticks only.
    #[serde(default)]
    pub sample_s: Option<f64>,
    /// The class of jobs no rule picks, and of every job when there are no rules.
    #[serde(default = "default_class")]
    pub default_class: String,
    #[serde(default)]
    pub classes: Vec<ClassRule>,
    #[serde(default)]
    pub heat_wave: Option<HeatWave>,
    #[serde(default)]
    pub contract: Option<Contract>,
    #[serde(default)]
    pub price_spike: Vec<PriceSpike>,
    #[serde(default)]
    pub cooling_fault: Vec<CoolingFault>,
    #[serde(default)]
    pub grid_events: Vec<GridEventEntry>,
    #[serde(default)]
    pub prices: Option<FeedFormat>,
    #[serde(default)]
    pub carbon: Option<FeedFormat>,
    /// Where a trace of offsets (Pollux) starts, RFC 3339 (default: `--from`, else the
    /// first price).
    #[serde(default, deserialize_with = "opt_ts")]
    pub trace_start: Option<Timestamp>,
    /// The power-saving run: a node idle this long is suspended (Slurm's
    /// `SuspendTime`), s.
    #[serde(default = "suspend_time")]
    pub suspend_time_s: f64,
}

fn suspend_time() -> f64 {
    1800.0
}

fn seed() -> u64 {
    1
}
fn tick() -> f64 {
    300.0
}
fn default_class() -> String {
    "training".into()
}

impl Default for Scenario {
    fn default() -> Self {
        Scenario {
            seed: seed(),
            tick_s: tick(),
            sample_s: None,
            default_class: default_class(),
            classes: Vec::new(),
            heat_wave: None,
            cooling_fault: Vec::new(),
            grid_events: Vec::new(),
            contract: None,
            price_spike: Vec::new(),
            prices: None,
            carbon: None,
            trace_start: None,
            suspend_time_s: suspend_time(),
        }
    }
}

impl Scenario {
    pub fn parse(file: &str, text: &str) -> anyhow::Result<Scenario> {
        let s: Scenario = toml::from_str(text).map_err(|e| {
            let line = e
                .span()
                .map(|sp| text[..sp.start.min(text.len())].lines().count().max(1))
                .unwrap_or(1);
            anyhow::anyhow!("{file}:{line}: {}", e.message())
        })?;
        let bad = |m: String| Err(anyhow::anyhow!("{file}: {m}"));
        if !(s.suspend_time_s >= 0.0 && s.suspend_time_s.is_finite()) {
            return bad(format!(
                "suspend_time_s must not be negative, got {}",
                s.suspend_time_s
            ));
        }
        if !(30.0..=3600.0).contains(&s.tick_s) {
            return bad(format!("tick_s must be within 30..=3600, got {}", s.tick_s));
        }
        if let Some(v) = s.sample_s {
            if !(1.0..=s.tick_s).contains(&v) {
                return bad(format!(
                    "sample_s must be within 1..=tick_s ({}), got {v}",
                    s.tick_s
                ));
            }
        }
        let total: f64 = s.classes.iter().map(|c| c.share).sum();
        if s.classes.iter().any(|c| !(0.0..=1.0).contains(&c.share)) || total > 1.0 + 1e-9 {
            return bad(format!(
                "class shares must each be within 0..=1 and add up to at most 1, got {total}"
            ));
        }
        for c in &s.classes {
            if c.deadline_h.is_some() && c.slack_h.is_some() {
                return bad(format!(
                    "class {:?}: give deadline_h or slack_h, not both",
                    c.class
                ));
            }
            if c.deferrable && c.deadline_h.is_none() && c.slack_h.is_none() {
                return bad(format!(
                    "class {:?} is deferrable: give it deadline_h or slack_h",
                    c.class
                ));
            }
        }
        if let Some(h) = &s.heat_wave {
            if !(0.0..1.0).contains(&h.cooling_drop) || h.days <= 0.0 {
                return bad(format!(
                    "heat_wave: cooling_drop must be within 0..1 and days positive, got {} and {}",
                    h.cooling_drop, h.days
                ));
            }
        }
        for f in &s.cooling_fault {
            let one = f.capacity.is_some() != f.pump_failure;
            let ok = f.capacity.is_none_or(|c| (0.0..=1.0).contains(&c));
            if !one || !ok || f.hours <= 0.0 {
                return bad(format!(
                    "cooling_fault {}: give capacity (0..=1) or pump_failure = true, and hours positive",
                    f.unit
                ));
            }
        }
        if let Some(c) = &s.contract {
            if c.limit_kw <= 0.0 {
                return bad(format!(
                    "contract: limit_kw must be positive, got {}",
                    c.limit_kw
                ));
            }
        }
        let grid = super::grid::events(&s.grid_events);
        if !grid.errors.is_empty() {
            let all: Vec<String> = grid.errors.iter().map(|e| e.to_string()).collect();
            return bad(all.join("; "));
        }
        Ok(s)
    }

    /// The scenario's grid events, checked (`parse` refused a scenario with a bad one).
    pub fn grid_events(&self) -> Vec<super::grid::DrEvent> {
        super::grid::events(&self.grid_events).events
    }

    /// The share of cooling capacity left at `t`.
    pub fn cooling_factor(&self, t: Timestamp) -> f64 {
        match &self.heat_wave {
            Some(h) if t >= h.start && t < h.start + h.days * 86400.0 => 1.0 - h.cooling_drop,
            _ => 1.0,
        }
    }

    /// The share of each cooling unit's capacity left at `t` (in site order): the heat
    /// wave's, and the faults in force.
    pub fn unit_factors(&self, units: &[String], t: Timestamp) -> Vec<f64> {
        let wave = self.cooling_factor(t);
        units
            .iter()
            .map(|u| {
                self.cooling_fault
                    .iter()
                    .filter(|f| &f.unit == u && t >= f.start && t < f.start + f.hours * 3600.0)
                    .map(CoolingFault::factor)
                    .fold(wave, |a, f| a * f)
            })
            .collect()
    }

    /// Applies the price spikes to a series' points.
    pub fn spike(&self, points: &mut [(Timestamp, f64)]) {
        for s in &self.price_spike {
            let end = s.start + s.hours * 3600.0;
            for p in points.iter_mut() {
                if p.0 >= s.start && p.0 < end {
                    p.1 = p.1 * s.factor + s.add_per_kwh;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FAULTS: &str = r#"
[heat_wave]
start = "2024-08-12T00:00:00Z"
days = 3
cooling_drop = 0.30
[[cooling_fault]]
unit = "cdu-1"
start = "2024-08-13T00:00:00Z"
hours = 6
pump_failure = true
[[cooling_fault]]
unit = "crah-b"
start = "2024-08-20T00:00:00Z"
hours = 2
capacity = 0.6
"#;

    fn at(s: &str) -> Timestamp {
        Timestamp::parse_rfc3339(s).expect("time")
    }

    #[test]
    fn cooling_faults_take_their_units_capacity_for_their_hours_on_top_of_a_heat_wave() {
        let s = Scenario::parse("s.toml", FAULTS).expect("scenario");
        let units = ["cdu-1".to_string(), "crah-b".to_string()];
        let f = |t: &str| s.unit_factors(&units, at(t));
        assert_eq!(f("2024-08-11T23:00:00Z"), vec![1.0, 1.0]);
        assert_eq!(f("2024-08-12T12:00:00Z"), vec![0.7, 0.7], "the heat wave");
        let both = f("2024-08-13T03:00:00Z");
        assert!(
            (both[0] - 0.35).abs() < 1e-12,
            "pump failure in the heat wave: {both:?}"
        );
        assert_eq!(
            f("2024-08-13T06:00:00Z")[0],
            0.7,
            "the pump is back after 6 h"
        );
        assert_eq!(f("2024-08-20T01:00:00Z"), vec![1.0, 0.6]);
        assert_eq!(f("2024-08-20T02:00:00Z"), vec![1.0, 1.0]);
    }

    #[test]
    fn a_cooling_fault_needs_one_of_capacity_or_pump_failure() {
        let both = "[[cooling_fault]]\nunit = \"c\"\nstart = \"2024-08-13T00:00:00Z\"\nhours = 1\ncapacity = 0.5\npump_failure = true\n";
        let neither =
            "[[cooling_fault]]\nunit = \"c\"\nstart = \"2024-08-13T00:00:00Z\"\nhours = 1\n";
        for text in [both, neither] {
            let e = Scenario::parse("s.toml", text).expect_err("refused");
            assert!(
                format!("{e:#}").contains("cooling_fault c: give capacity"),
                "{e:#}"
            );
        }
    }
}
