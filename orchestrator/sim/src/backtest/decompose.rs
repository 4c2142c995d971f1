//! Where the policy's saving against Slurm-style power saving comes from, and what it
//! costs: so that a regression is explained, not just measured.
//!
//! The energy is split three ways in both runs, each step priced at its hour: the idle
//! floor's IT energy (idle GPUs, the base power of nodes without work, nodes off,
//! booting and shutting down: what node power moves), the jobs' IT energy (busy GPUs
//! and the node power that follows load: what caps move) and the cooling. Each part's
//! difference in kWh is priced at power saving's mean price for that part (its volume);
//! what is left of the energy cost's difference is when the energy was drawn (price
//! shifting). With the demand charge's difference the five parts add up to the saving
//! exactly.

use serde::Serialize;

use super::facility::{Facility, Totals};

/// The policy against power saving, in the site's currency (positive: the policy
/// spent less), and what the policy's management cost the jobs.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Decomposition {
    /// Power saving's cost less the policy's: the sum of the five parts below.
    pub saving: f64,
    /// The idle floor's IT energy power saving drew beyond the policy's, at power
    /// saving's mean price for it.
    pub node_power: f64,
    /// The jobs' IT energy likewise (caps, and work run at better efficiency).
    pub caps: f64,
    pub cooling: f64,
    /// What the energy cost beyond its volume: drawn in cheaper or dearer hours.
    pub price_shifting: f64,
    pub demand_charge: f64,
    /// The kWh behind the first three parts (power saving's less the policy's).
    pub node_power_kwh: f64,
    pub caps_kwh: f64,
    pub cooling_kwh: f64,
    /// Node-hours off: the policy's less power saving's.
    pub node_off_h: f64,
    /// Power-downs: the policy's less power saving's.
    pub power_downs: i64,
    /// What it cost: hours the jobs waited longer than under power saving (summed over
    /// the jobs that waited longer), the GPU-hours that ran capped, the jobs held.
    pub added_wait_h: f64,
    pub capped_gpu_hours: f64,
    pub jobs_deferred: usize,
    pub deferred_wait_mean_h: f64,
}

/// One run's energy in three parts: (kWh, cost) of the idle floor's IT, the jobs' IT,
/// and the cooling; and its demand charge.
struct Parts {
    floor: (f64, f64),
    jobs: (f64, f64),
    cooling: (f64, f64),
}

impl Parts {
    fn of(t: &Totals) -> Parts {
        let jobs = (t.job_it_kwh, t.job_it_cost);
        let cooling = (t.cooling_kwh, t.cooling_cost);
        let floor = (
            t.it_kwh - jobs.0,
            t.energy_cost - t.cooling_cost - t.job_it_cost,
        );
        Parts {
            floor,
            jobs,
            cooling,
        }
    }
}

/// The policy's run `pol` against power saving's `ps`, with their demand charges, the
/// jobs the policy held and their mean wait (s).
pub(super) fn against_power_save(
    ps: &Facility,
    pol: &Facility,
    (ps_charge, pol_charge): (f64, f64),
    (jobs_deferred, deferred_wait_mean_s): (usize, f64),
) -> Decomposition {
    let (a, b) = (Parts::of(&ps.totals), Parts::of(&pol.totals));
    // a part's volume: its kWh difference at power saving's mean price for it
    let volume = |(ka, ca): (f64, f64), (kb, _): (f64, f64)| {
        let price = if ka > 0.0 { ca / ka } else { 0.0 };
        (ka - kb) * price
    };
    let node_power = volume(a.floor, b.floor);
    let caps = volume(a.jobs, b.jobs);
    let cooling = volume(a.cooling, b.cooling);
    let energy = ps.totals.energy_cost - pol.totals.energy_cost;
    let demand_charge = ps_charge - pol_charge;
    Decomposition {
        saving: energy + demand_charge,
        node_power,
        caps,
        cooling,
        price_shifting: energy - node_power - caps - cooling,
        demand_charge,
        node_power_kwh: a.floor.0 - b.floor.0,
        caps_kwh: a.jobs.0 - b.jobs.0,
        cooling_kwh: a.cooling.0 - b.cooling.0,
        node_off_h: pol.totals.node_off_h - ps.totals.node_off_h,
        power_downs: pol.totals.power_downs as i64 - ps.totals.power_downs as i64,
        added_wait_h: super::added_wait_h(ps, pol),
        capped_gpu_hours: pol.totals.capped_gpu_s / 3600.0,
        jobs_deferred,
        deferred_wait_mean_h: deferred_wait_mean_s / 3600.0,
    }
}

impl Decomposition {
    /// The summary's lines.
    pub fn lines(&self, currency_of: impl Fn(f64) -> String) -> String {
        format!(
            "  saving against power saving {} = node power {} ({:+.0} kWh, {:+.1} node-hours off, {:+} power-downs) + caps {} ({:+.0} kWh) + cooling {} ({:+.0} kWh) + price shifting {} + demand charge {}\n  what it cost: {:.1} h more waiting than under power saving, {:.1} GPU-hours capped, {} jobs held ({:.1} h mean wait)",
            currency_of(self.saving),
            currency_of(self.node_power),
            self.node_power_kwh,
            self.node_off_h,
            self.power_downs,
            currency_of(self.caps),
            self.caps_kwh,
            currency_of(self.cooling),
            self.cooling_kwh,
            currency_of(self.price_shifting),
            currency_of(self.demand_charge),
            self.added_wait_h,
            self.capped_gpu_hours,
            self.jobs_deferred,
            self.deferred_wait_mean_h,
        )
    }
}
