//! The energy ledger: each interval's energy, charged to the jobs that held the GPUs,
//! to idle, or to cooling overhead, with the price and carbon intensity in force.
//!
//! GPU energy comes from the GPUs' energy counters (a counter that went backwards was
//! reset: that interval falls back to power × time). A rack's energy beyond its GPUs
//! (CPUs, memory, fans) is split evenly over the rack's GPU slots and follows the job on
//! each slot. Conservation holds by construction: jobs + idle + overhead = racks +
//! cooling, as measured.

use std::collections::BTreeMap;

use integrations::store::{Account, LedgerEntry};
use telemetry::metric::names::*;
use telemetry::{EntityId, EntityKind, Job, Site, Snapshot, Timestamp};

const J_PER_KWH: f64 = 3.6e6;

#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Sums {
    kwh: f64,
    cost: f64,
    carbon_kg: f64,
}

/// Accumulates energy per account and rack, and emits ledger entries per interval.
#[derive(Debug, Clone)]
pub struct Accountant {
    interval_s: f64,
    window_start: Option<Timestamp>,
    last_tick: Option<Timestamp>,
    last_energy_j: BTreeMap<EntityId, f64>,
    pending: BTreeMap<(Account, Option<String>), Sums>,
    /// Intervals where a GPU counter went backwards.
    pub counter_resets: u64,
}

impl Accountant {
    pub fn new(interval_s: f64) -> Self {
        Accountant {
            interval_s,
            window_start: None,
            last_tick: None,
            last_energy_j: BTreeMap::new(),
            pending: BTreeMap::new(),
            counter_resets: 0,
        }
    }

    /// Charges the energy used since the previous call. Returns the ledger entries of
    /// any interval that closed.
    pub fn record(
        &mut self,
        site: &Site,
        snapshot: &Snapshot,
        jobs: &[Job],
        now: Timestamp,
    ) -> Vec<LedgerEntry> {
        let Some(last) = self.last_tick.replace(now) else {
            self.window_start = Some(now);
            self.remember_counters(site, snapshot, now);
            return Vec::new();
        };
        let dt = now.secs_since(last);
        if dt <= 0.0 {
            return Vec::new();
        }
        let value = |e: &EntityId, m: &str| snapshot.observe(e, m, now).map(|o| o.value);
        let price = value(&site.site_entity(), PRICE_PER_KWH).unwrap_or(0.0);
        let carbon = value(&site.site_entity(), CARBON_G_PER_KWH).unwrap_or(0.0);
        let owner: BTreeMap<&EntityId, &Job> = jobs
            .iter()
            .flat_map(|j| j.allocated.iter().map(move |g| (g, j)))
            .collect();
        let mut charges: Vec<(Account, Option<String>, f64)> = Vec::new();
        let gpus = site.gpus();
        for rack in &site.racks {
            let rack_gpus: Vec<_> = gpus.iter().filter(|g| g.rack.id == rack.id).collect();
            let per_gpu_j: Vec<f64> = rack_gpus
                .iter()
                .map(|g| self.gpu_energy_j(&g.id, snapshot, dt, now))
                .collect();
            let gpu_j_total: f64 = per_gpu_j.iter().sum();
            let rack_j = value(&EntityId::rack(&rack.id), POWER_W).map_or(gpu_j_total, |w| w * dt);
            let other_per_slot = (rack_j - gpu_j_total).max(0.0) / rack_gpus.len().max(1) as f64;
            for (g, j) in rack_gpus.iter().zip(per_gpu_j) {
                let account = match owner.get(&g.id) {
                    Some(job) => Account::Job {
                        job: job.id.clone(),
                        project: job.project.clone(),
                        user: job.user.clone(),
                    },
                    None => Account::Idle,
                };
                charges.push((
                    account,
                    Some(rack.id.clone()),
                    (j + other_per_slot) / J_PER_KWH,
                ));
            }
            if rack_gpus.is_empty() {
                charges.push((Account::Idle, Some(rack.id.clone()), rack_j / J_PER_KWH));
            }
        }
        for unit in &site.cooling {
            if let Some(w) = value(
                &EntityId::new(EntityKind::Cooling, &unit.id),
                COOLING_POWER_W,
            ) {
                charges.push((Account::Overhead, None, w * dt / J_PER_KWH));
            }
        }
        for (account, rack, kwh) in charges {
            let s = self.pending.entry((account, rack)).or_default();
            s.kwh += kwh;
            s.cost += kwh * price;
            s.carbon_kg += kwh * carbon / 1000.0;
        }
        let start = self.window_start.unwrap_or(last);
        if now.secs_since(start) >= self.interval_s - 1e-9 {
            return self.flush(now);
        }
        Vec::new()
    }

    /// Closes the current interval.
    pub fn flush(&mut self, now: Timestamp) -> Vec<LedgerEntry> {
        let start = self.window_start.replace(now).unwrap_or(now);
        std::mem::take(&mut self.pending)
            .into_iter()
            .filter(|(_, s)| s.kwh != 0.0)
            .map(|((account, rack), s)| LedgerEntry {
                start,
                end: now,
                account,
                rack,
                energy_kwh: s.kwh,
                cost: s.cost,
                carbon_kg: s.carbon_kg,
            })
            .collect()
    }

    fn remember_counters(&mut self, site: &Site, snapshot: &Snapshot, now: Timestamp) {
        for g in site.gpus() {
            if let Some(o) = snapshot.observe(&g.id, ENERGY_J, now) {
                self.last_energy_j.insert(g.id, o.value);
            }
        }
    }

    /// Joules a GPU used over the last `dt` seconds: counter delta, else power × time.
    fn gpu_energy_j(&mut self, id: &EntityId, snapshot: &Snapshot, dt: f64, now: Timestamp) -> f64 {
        let by_power = snapshot
            .observe(id, POWER_W, now)
            .map_or(0.0, |o| o.value * dt);
        let Some(counter) = snapshot.observe(id, ENERGY_J, now).filter(|o| !o.stale) else {
            return by_power;
        };
        match self.last_energy_j.insert(id.clone(), counter.value) {
            Some(prev) if counter.value >= prev => counter.value - prev,
            Some(_) => {
                self.counter_resets += 1;
                by_power
            }
            None => by_power,
        }
    }
}
