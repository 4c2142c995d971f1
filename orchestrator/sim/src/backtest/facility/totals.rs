//! What the backtest's facility adds up over a run, and what it shows at each tick.

use telemetry::Timestamp;

/// What the facility did over a run.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Totals {
    pub it_kwh: f64,
    pub cooling_kwh: f64,
    pub cost: f64,
    pub carbon_kg: f64,
    pub peak_kw: f64,
    pub budget_violation_s: f64,
    pub thermal_violation_s: f64,
    pub capped_gpu_s: f64,
    /// GPU-seconds of work delivered (full-speed equivalent).
    pub work_gpu_s: f64,
    /// GPU-seconds that suspended jobs held their GPUs without running.
    pub suspended_gpu_s: f64,
    /// Seconds of the run the price series did not cover (counted at 0).
    pub price_gap_s: f64,
    /// Seconds of the run the carbon series did not cover.
    pub carbon_gap_s: f64,
    /// Energy cost alone (without the demand charge).
    pub energy_cost: f64,
    /// Highest IT power per billing period (calendar month in the site's time zone),
    /// in order: (`YYYY-MM`, kW).
    pub period_peaks_kw: Vec<(String, f64)>,
    /// Node power-downs and power-ups, and the energy boots and shutdowns drew.
    pub power_downs: u64,
    /// Nodes brought back because their power-down's lease ended unrenewed.
    pub lease_resumes: u64,
    pub power_ups: u64,
    pub transition_kwh: f64,
    /// Node-hours spent off.
    pub node_off_h: f64,
    /// The part of the energy that jobs drew: busy GPUs, the share of node base power
    /// that follows load, and the cooling of both (the idle floor left out).
    pub job_kwh: f64,
    pub job_cost: f64,
    /// The jobs' IT energy alone (busy GPUs and the node power that follows load), and
    /// its cost; the cooling's cost (see `decompose`).
    pub job_it_kwh: f64,
    pub job_it_cost: f64,
    pub cooling_cost: f64,
    /// GPU-hours of work delivered per day of the run (from its start).
    pub gpu_hours_per_day: Vec<f64>,
}

/// The facility at one tick, for charts.
#[derive(Debug, Clone, PartialEq)]
pub struct Point {
    pub t: Timestamp,
    pub it_kw: f64,
    pub cooling_kw: f64,
    pub budget_kw: f64,
    pub price: f64,
    pub hottest_inlet_c: f64,
    pub waiting: usize,
    pub held: usize,
    pub running: usize,
    pub busy_gpus: usize,
}
