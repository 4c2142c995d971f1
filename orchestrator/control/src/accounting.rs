//! The energy ledger: each interval's energy, charged to the jobs that held the GPUs,
//! to idle, or to cooling overhead, with the price and carbon intensity in force.
//!
//! GPU energy comes from the GPUs' energy counters (a counter that went backwards was
//! reset: that interval falls back to power × time, marked as estimated). A rack's
//! energy is its own meter, else the sum of its nodes' (a BMC's chassis power, else the
//! PDU outlets feeding the node), else its GPUs'. What is beyond the GPUs (CPUs,
//! memory, fans) goes to the GPU slots, by each node's measured share when every node
//! is metered, else evenly, and follows the job on each slot. A GPU held by several
//! jobs is split evenly between them (marked as shared: the split is an estimate).
//! Conservation holds by construction: jobs + idle + overhead = racks + cooling, as
//! measured.

use std::collections::BTreeMap;

use store::{Account, Conditions, InletCondition, LedgerEntry};

use crate::demand::DemandTracker;
use telemetry::fasthash::FnvMap;
use telemetry::metric::names::*;
use telemetry::site::{GpuRef, Rack};
use telemetry::{EntityId, EntityKind, Job, Site, Snapshot, Timestamp};

const J_PER_KWH: f64 = 3.6e6;

#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Sums {
    kwh: f64,
    cost: f64,
    carbon_kg: f64,
    integrated_kwh: f64,
    shared_kwh: f64,
}

/// Accumulates energy per account and rack, and emits ledger entries per interval.
#[derive(Debug, Clone)]
pub struct Accountant {
    interval_s: f64,
    window_start: Option<Timestamp>,
    last_tick: Option<Timestamp>,
    last_energy_j: FnvMap<EntityId, f64>,
    pending: BTreeMap<(Account, Option<String>), Sums>,
    /// Intervals where a GPU counter went backwards.
    pub counter_resets: u64,
    /// The hottest fresh inlet per rack in the open interval.
    inlets: BTreeMap<String, InletCondition>,
    /// The conditions of the last interval closed, until taken.
    closed: Option<Conditions>,
    /// The billing period's peak demand, when the tariff has a demand charge.
    demand: Option<DemandTracker>,
}

impl Accountant {
    pub fn new(interval_s: f64) -> Self {
        Accountant {
            interval_s,
            window_start: None,
            last_tick: None,
            last_energy_j: FnvMap::default(),
            pending: BTreeMap::new(),
            counter_resets: 0,
            inlets: BTreeMap::new(),
            closed: None,
            demand: None,
        }
    }

    /// Also follows the billing period's peak demand.
    pub fn with_demand(mut self, demand: DemandTracker) -> Self {
        self.demand = Some(demand);
        self
    }

    pub fn demand(&self) -> Option<&DemandTracker> {
        self.demand.as_ref()
    }

    pub fn demand_mut(&mut self) -> Option<&mut DemandTracker> {
        self.demand.as_mut()
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
        self.note_inlets(site, snapshot, now);
        let price = observed(snapshot, &site.site_entity(), PRICE_PER_KWH, now).unwrap_or(0.0);
        let carbon = observed(snapshot, &site.site_entity(), CARBON_G_PER_KWH, now).unwrap_or(0.0);
        let sums = self.charge_racks(site, snapshot, jobs, dt, now);
        let charges = sums.charges(site, jobs, snapshot, dt, now);
        if let Some(d) = &mut self.demand {
            d.add(
                last,
                now,
                charges
                    .iter()
                    .map(|(a, r, kwh, ..)| (a.clone(), r.clone(), *kwh)),
            );
        }
        self.add_pending(charges, price, carbon);
        let start = self.window_start.unwrap_or(last);
        if now.secs_since(start) >= self.interval_s - 1e-9 {
            return self.flush(now);
        }
        Vec::new()
    }

    /// Keeps the hottest fresh inlet of each rack in the open interval.
    fn note_inlets(&mut self, site: &Site, snapshot: &Snapshot, now: Timestamp) {
        for rack in &site.racks {
            if let Some(o) = snapshot
                .observe(&EntityId::rack(&rack.id), INLET_TEMP_C, now)
                .filter(|o| !o.stale)
            {
                let c = self
                    .inlets
                    .entry(rack.id.clone())
                    .or_insert(InletCondition {
                        max_c: o.value,
                        limit_c: rack.inlet_limit_c,
                    });
                c.max_c = c.max_c.max(o.value);
            }
        }
    }

    /// Each rack's energy over `dt`, charged to its GPU slots: to the jobs holding
    /// them, else to idle.
    fn charge_racks(
        &mut self,
        site: &Site,
        snapshot: &Snapshot,
        jobs: &[Job],
        dt: f64,
        now: Timestamp,
    ) -> SlotCharges {
        let owners = owners(jobs);
        let mut sums = SlotCharges {
            idle: vec![None; site.racks.len()],
            by_job: BTreeMap::new(),
        };
        let gpus = site.gpus();
        let mut by_rack: Vec<Vec<usize>> = vec![Vec::new(); site.racks.len()];
        for (i, g) in gpus.iter().enumerate() {
            by_rack[g.rack_index].push(i);
        }
        for (ri, rack) in site.racks.iter().enumerate() {
            let rack_gpus: Vec<&GpuRef<'_>> = by_rack[ri].iter().map(|&i| &gpus[i]).collect();
            let per_gpu: Vec<(f64, bool)> = rack_gpus
                .iter()
                .map(|g| self.gpu_energy_j(&g.id, snapshot, dt, now))
                .collect();
            let gpu_j_total: f64 = per_gpu.iter().map(|p| p.0).sum();
            let node_j = node_energy_j(site, rack, snapshot, dt, now);
            let all_metered = !node_j.is_empty() && node_j.values().all(Option::is_some);
            // the rack's energy: its own meter, else its nodes', else its GPUs'
            let rack_j = observed(snapshot, &EntityId::rack(&rack.id), POWER_W, now)
                .map(|w| w * dt)
                .or_else(|| all_metered.then(|| node_j.values().flatten().sum()))
                .unwrap_or(gpu_j_total);
            let other = (rack_j - gpu_j_total).max(0.0);
            // the rest (CPUs, memory, fans) goes to GPU slots: by each node's measured
            // share when every node is metered, else evenly
            let slot_other: Vec<f64> = if all_metered {
                by_node_share(&rack_gpus, &per_gpu, &node_j, other)
            } else {
                vec![other / rack_gpus.len().max(1) as f64; rack_gpus.len()]
            };
            sums.charge_slots(ri, &rack_gpus, per_gpu, slot_other, &owners);
            if rack_gpus.is_empty() {
                add(
                    sums.idle[ri].get_or_insert([0.0; 3]),
                    rack_j / J_PER_KWH,
                    0.0,
                    0.0,
                );
            }
        }
        sums
    }

    /// Adds the charges to the open interval, priced at the price and carbon in force.
    fn add_pending(&mut self, charges: Vec<Charge>, price: f64, carbon: f64) {
        for (account, rack, kwh, estimated, shared) in charges {
            let s = self.pending.entry((account, rack)).or_default();
            s.kwh += kwh;
            s.integrated_kwh += estimated;
            s.shared_kwh += shared;
            s.cost += kwh * price;
            s.carbon_kg += kwh * carbon / 1000.0;
        }
    }

    /// The conditions of the interval closed last, once.
    pub fn take_conditions(&mut self) -> Option<Conditions> {
        self.closed.take()
    }

    /// Closes the current interval.
    pub fn flush(&mut self, now: Timestamp) -> Vec<LedgerEntry> {
        let start = self.window_start.replace(now).unwrap_or(now);
        let inlets = std::mem::take(&mut self.inlets);
        if !inlets.is_empty() {
            self.closed = Some(Conditions {
                start,
                end: now,
                inlets,
            });
        }
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
                integrated_kwh: s.integrated_kwh,
                shared_kwh: s.shared_kwh,
            })
            .collect()
    }

    fn remember_counters(&mut self, site: &Site, snapshot: &Snapshot, now: Timestamp) {
        for g in site.gpus() {
            if let Some(o) = snapshot.observe(&g.id, ENERGY_J, now) {
                self.last_energy_j.insert(g.id.into_owned(), o.value);
            }
        }
    }

    /// Joules a GPU used over the last `dt` seconds: counter delta, else power × time
    /// (then `true`: estimated).
    fn gpu_energy_j(
        &mut self,
        id: &EntityId,
        snapshot: &Snapshot,
        dt: f64,
        now: Timestamp,
    ) -> (f64, bool) {
        let by_power = snapshot
            .observe(id, POWER_W, now)
            .map_or(0.0, |o| o.value * dt);
        let Some(counter) = snapshot.observe(id, ENERGY_J, now).filter(|o| !o.stale) else {
            return (by_power, true);
        };
        let prev = match self.last_energy_j.get_mut(id) {
            Some(v) => Some(std::mem::replace(v, counter.value)),
            None => self.last_energy_j.insert(id.clone(), counter.value),
        };
        match prev {
            Some(prev) if counter.value >= prev => (counter.value - prev, false),
            Some(_) => {
                self.counter_resets += 1;
                (by_power, true)
            }
            None => (by_power, true),
        }
    }
}

/// One charge: the account, its rack, kWh, of which estimated as power × time, of which
/// on a shared GPU.
type Charge = (Account, Option<String>, f64, f64, f64);

/// (kWh, of which estimated as power × time, of which on a shared GPU), summed per
/// rack for idle GPUs and per (job, rack) for jobs' GPUs.
struct SlotCharges {
    idle: Vec<Option<[f64; 3]>>,
    by_job: BTreeMap<(usize, usize), [f64; 3]>,
}

impl SlotCharges {
    /// Charges each GPU slot of rack `ri` (its own energy and its share of the rest)
    /// to the jobs holding it, split evenly, else to idle.
    fn charge_slots(
        &mut self,
        ri: usize,
        rack_gpus: &[&GpuRef<'_>],
        per_gpu: Vec<(f64, bool)>,
        slot_other: Vec<f64>,
        owners: &FnvMap<&EntityId, Vec<usize>>,
    ) {
        for ((g, (j, integrated)), extra) in rack_gpus.iter().zip(per_gpu).zip(slot_other) {
            let kwh = (j + extra) / J_PER_KWH;
            let estimated = if integrated { j / J_PER_KWH } else { 0.0 };
            match owners.get(&*g.id).map(Vec::as_slice) {
                None | Some([]) => add(self.idle[ri].get_or_insert([0.0; 3]), kwh, estimated, 0.0),
                Some(holders) => {
                    let k = holders.len() as f64;
                    let shared = if holders.len() > 1 { kwh / k } else { 0.0 };
                    for &job in holders {
                        add(
                            self.by_job.entry((job, ri)).or_default(),
                            kwh / k,
                            estimated / k,
                            shared,
                        );
                    }
                }
            }
        }
    }

    /// The charges in ledger order: idle per rack, then jobs per (job, rack), then
    /// cooling units' power over `dt` as overhead.
    fn charges(
        self,
        site: &Site,
        jobs: &[Job],
        snapshot: &Snapshot,
        dt: f64,
        now: Timestamp,
    ) -> Vec<Charge> {
        let mut charges: Vec<Charge> = Vec::new();
        for (ri, s) in self.idle.iter().enumerate() {
            if let Some([kwh, est, shared]) = *s {
                let rack = Some(site.racks[ri].id.clone());
                charges.push((Account::Idle, rack, kwh, est, shared));
            }
        }
        for ((k, ri), [kwh, est, shared]) in self.by_job {
            let job = &jobs[k];
            charges.push((
                Account::Job {
                    job: job.id.clone(),
                    project: job.project.clone(),
                    user: job.user.clone(),
                },
                Some(site.racks[ri].id.clone()),
                kwh,
                est,
                shared,
            ));
        }
        for unit in &site.cooling {
            let cooling = EntityId::new(EntityKind::Cooling, &unit.id);
            if let Some(w) = observed(snapshot, &cooling, COOLING_POWER_W, now) {
                charges.push((Account::Overhead, None, w * dt / J_PER_KWH, 0.0, 0.0));
            }
        }
        charges
    }
}

fn add(s: &mut [f64; 3], kwh: f64, est: f64, shared: f64) {
    s[0] += kwh;
    s[1] += est;
    s[2] += shared;
}

fn observed(snapshot: &Snapshot, e: &EntityId, m: &str, now: Timestamp) -> Option<f64> {
    snapshot.observe(e, m, now).map(|o| o.value)
}

/// The jobs holding each GPU, by index in `jobs`: a GPU held by several jobs (MPS,
/// time slicing) is split evenly between them.
fn owners(jobs: &[Job]) -> FnvMap<&EntityId, Vec<usize>> {
    let mut owners: FnvMap<&EntityId, Vec<usize>> = FnvMap::default();
    for (k, j) in jobs.iter().enumerate() {
        for g in &j.allocated {
            owners.entry(g).or_default().push(k);
        }
    }
    owners
}

/// Each node's metered energy over `dt`, by node index: the node's own power (a BMC's
/// chassis power), else the sum of the PDU outlets feeding it.
fn node_energy_j(
    site: &Site,
    rack: &Rack,
    snapshot: &Snapshot,
    dt: f64,
    now: Timestamp,
) -> BTreeMap<usize, Option<f64>> {
    let value = |e: &EntityId| observed(snapshot, e, POWER_W, now);
    rack.nodes
        .iter()
        .map(|&n| {
            let node = &site.nodes[n];
            let own = value(&EntityId::new(EntityKind::Node, node.id.clone()));
            let outlets = if node.outlets.is_empty() {
                None
            } else {
                node.outlets
                    .iter()
                    .map(|o| value(&EntityId::new(EntityKind::Outlet, o.clone())))
                    .sum::<Option<f64>>()
            };
            (n, own.or(outlets).map(|w| w * dt))
        })
        .collect()
}

/// The rack's energy beyond its GPUs (`other`) per GPU slot, when every node is
/// metered: by each node's share of what its nodes used beyond their GPUs, split
/// evenly between the node's slots.
fn by_node_share(
    rack_gpus: &[&GpuRef<'_>],
    per_gpu: &[(f64, bool)],
    node_j: &BTreeMap<usize, Option<f64>>,
    other: f64,
) -> Vec<f64> {
    let node_gpu_j = |n: usize| -> f64 {
        rack_gpus
            .iter()
            .zip(per_gpu)
            .filter(|(g, _)| g.node_index == n)
            .map(|(_, p)| p.0)
            .sum()
    };
    let node_other: BTreeMap<usize, f64> = node_j
        .iter()
        .map(|(n, j)| (*n, (j.unwrap_or(0.0) - node_gpu_j(*n)).max(0.0)))
        .collect();
    let sum: f64 = node_other.values().sum();
    rack_gpus
        .iter()
        .map(|g| {
            let slots = rack_gpus
                .iter()
                .filter(|h| h.node_index == g.node_index)
                .count();
            let share = if sum > 0.0 {
                node_other[&g.node_index] / sum
            } else {
                1.0 / rack_gpus.len() as f64 * slots as f64
            };
            other * share / slots.max(1) as f64
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use telemetry::{JobState, Sample};

    const SITE: &str = "version = 1\n[site]\nname = \"t\"\n[[feeds]]\nid = \"f\"\nrating_kw = 30\n[[cooling]]\nid = \"c\"\ncapacity_kw = 30\nracks = [\"r1\"]\n[[rooms]]\nid = \"h\"\n[[rows]]\nid = \"w\"\nroom = \"h\"\n[[racks]]\nid = \"r1\"\nrow = \"w\"\npower_budget_kw = 10\nnodes = 1\ngpus_per_node = 2\ngpu_model = \"A40\"\n";

    fn t(s: f64) -> Timestamp {
        Timestamp::from_secs(1_790_000_000).plus_secs(s)
    }

    fn job(site: &Site) -> Job {
        Job {
            id: "slurm:1".into(),
            scheduler: "slurm".into(),
            name: "train".into(),
            user: "ana".into(),
            project: "climate".into(),
            class: "training".into(),
            priority: 0,
            gpus: 1,
            allocated: vec![site.gpus()[0].id.clone().into_owned()],
            state: JobState::Running,
            submit_time: t(0.0),
            start_time: Some(t(0.0)),
            end_time: None,
            deadline: None,
            est_duration_s: 3600.0,
            deferrable: false,
            preemptible: false,
            gpu_power_limit: None,
        }
    }

    /// GPU 0 at 200 W with a counter, GPU 1 at 100 W without one, the rack at 400 W,
    /// cooling at 50 W, and the price given.
    fn feed(s: &mut Snapshot, site: &Site, now: Timestamp, counter_j: f64, price: f64) {
        let g = site.gpus();
        for (e, m, v) in [
            (g[0].id.clone().into_owned(), POWER_W, 200.0),
            (g[0].id.clone().into_owned(), ENERGY_J, counter_j),
            (g[1].id.clone().into_owned(), POWER_W, 100.0),
            (EntityId::rack("r1"), POWER_W, 400.0),
            (
                EntityId::new(EntityKind::Cooling, "c"),
                COOLING_POWER_W,
                50.0,
            ),
            (site.site_entity(), PRICE_PER_KWH, price),
        ] {
            s.ingest(Sample::new(e, m, v, now, "t"), now)
                .expect("sample");
        }
    }

    #[test]
    fn energy_is_conserved_and_priced_at_the_price_in_force_when_it_changes() {
        let site = Site::parse("t.toml", SITE).expect("site");
        let jobs = vec![job(&site)];
        let mut a = Accountant::new(3600.0);
        let mut s = Snapshot::new();
        let mut out = Vec::new();
        // 60 s ticks over 20 minutes; the price doubles after 10 minutes
        for i in 0..=20 {
            let now = t(f64::from(i) * 60.0);
            let price = if i <= 10 { 0.1 } else { 0.2 };
            feed(&mut s, &site, now, 200.0 * 60.0 * f64::from(i), price);
            out.extend(a.record(&site, &s, &jobs, now));
        }
        out.extend(a.flush(t(1200.0)));
        let kwh = |acct: &Account| {
            out.iter()
                .filter(|e| &e.account == acct)
                .map(|e| e.energy_kwh)
                .sum::<f64>()
        };
        let total: f64 = out.iter().map(|e| e.energy_kwh).sum();
        // measured: rack 400 W + cooling 50 W for 1200 s
        assert!((total - 450.0 * 1200.0 / J_PER_KWH).abs() < 1e-9, "{total}");
        let job_acct = Account::Job {
            job: "slurm:1".into(),
            project: "climate".into(),
            user: "ana".into(),
        };
        // the job: its GPU's 200 W plus half of the rack's other 100 W
        assert!((kwh(&job_acct) - 250.0 * 1200.0 / J_PER_KWH).abs() < 1e-9);
        assert!((kwh(&Account::Idle) - 150.0 * 1200.0 / J_PER_KWH).abs() < 1e-9);
        assert!((kwh(&Account::Overhead) - 50.0 * 1200.0 / J_PER_KWH).abs() < 1e-9);
        // half the time at 0.1, half at 0.2 (each interval charged at the price at its end)
        let cost: f64 = out
            .iter()
            .filter(|e| e.account == job_acct)
            .map(|e| e.cost)
            .sum();
        let per_min = 250.0 * 60.0 / J_PER_KWH;
        assert!(
            (cost - (per_min * 10.0 * 0.1 + per_min * 10.0 * 0.2)).abs() < 1e-9,
            "{cost}"
        );
    }

    #[test]
    fn a_counter_that_goes_backwards_is_a_reset_and_that_interval_uses_power() {
        let site = Site::parse("t.toml", SITE).expect("site");
        let jobs = vec![job(&site)];
        let mut a = Accountant::new(3600.0);
        let mut s = Snapshot::new();
        let mut out = Vec::new();
        let counters = [1e6, 1e6 + 12_000.0, 500.0, 500.0 + 12_000.0];
        for (i, c) in counters.iter().enumerate() {
            let now = t(60.0 * i as f64);
            feed(&mut s, &site, now, *c, 0.1);
            out.extend(a.record(&site, &s, &jobs, now));
        }
        out.extend(a.flush(t(180.0)));
        assert_eq!(a.counter_resets, 1);
        let gpu_j: f64 = out
            .iter()
            .filter(|e| matches!(e.account, Account::Job { .. }))
            .map(|e| e.energy_kwh * J_PER_KWH)
            .sum();
        // three intervals of 12 kJ each (counter, power × time across the reset, counter),
        // plus the job's share of the rack's other power
        assert!(
            (gpu_j - 3.0 * (12_000.0 + 50.0 * 60.0)).abs() < 1e-6,
            "{gpu_j}"
        );
        // the interval across the reset is marked as estimated: GPU 0's 12 kJ, and
        // GPU 1 (no counter) all along
        let est = |f: &dyn Fn(&Account) -> bool| -> f64 {
            out.iter()
                .filter(|e| f(&e.account))
                .map(|e| e.integrated_kwh * J_PER_KWH)
                .sum()
        };
        let job_est = est(&|a| matches!(a, Account::Job { .. }));
        assert!((job_est - 12_000.0).abs() < 1e-6, "{job_est}");
        let idle_est = est(&|a| *a == Account::Idle);
        assert!((idle_est - 3.0 * 100.0 * 60.0).abs() < 1e-6, "{idle_est}");
    }

    const METERED: &str = "version = 1\n[site]\nname = \"m\"\n[[feeds]]\nid = \"f\"\nrating_kw = 30\n[[pdus]]\nid = \"p1\"\nfeed = \"f\"\nrating_kw = 10\n[[pdus.outlets]]\nid = \"A1\"\nrating_kw = 3\n[[pdus.outlets]]\nid = \"A2\"\nrating_kw = 3\n[[cooling]]\nid = \"c\"\ncapacity_kw = 30\nracks = [\"r1\"]\n[[rooms]]\nid = \"h\"\n[[rows]]\nid = \"w\"\nroom = \"h\"\n[[racks]]\nid = \"r1\"\nrow = \"w\"\npdus = [\"p1\"]\n[[nodes]]\nid = \"n1\"\nrack = \"r1\"\ngpus = 1\ngpu_model = \"A40\"\noutlets = [\"p1.A1\"]\n[[nodes]]\nid = \"n2\"\nrack = \"r1\"\ngpus = 1\ngpu_model = \"A40\"\noutlets = [\"p1.A2\"]\n";

    fn metered(jobs_on_n1: &[&str]) -> Vec<LedgerEntry> {
        let site = Site::parse("m.toml", METERED).expect("site");
        let g = site.gpus();
        let jobs: Vec<Job> = jobs_on_n1
            .iter()
            .map(|id| {
                let mut j = job(&site);
                j.id = id.to_string();
                j.allocated = vec![g[0].id.clone().into_owned()];
                j
            })
            .collect();
        let mut a = Accountant::new(3600.0);
        let mut s = Snapshot::new();
        let mut out = Vec::new();
        for i in 0..=10 {
            let now = t(f64::from(i) * 60.0);
            // no rack meter: the PDU outlets of each node; GPUs by power only
            for (e, m, v) in [
                (g[0].id.clone().into_owned(), POWER_W, 200.0),
                (g[1].id.clone().into_owned(), POWER_W, 100.0),
                (EntityId::new(EntityKind::Outlet, "p1.A1"), POWER_W, 500.0),
                (EntityId::new(EntityKind::Outlet, "p1.A2"), POWER_W, 300.0),
            ] {
                s.ingest(Sample::new(e, m, v, now, "t"), now)
                    .expect("sample");
            }
            out.extend(a.record(&site, &s, &jobs, now));
        }
        out.extend(a.flush(t(600.0)));
        out
    }

    #[test]
    fn node_meters_from_pdu_outlets_decide_where_the_rest_of_the_rack_goes() {
        let out = metered(&["slurm:1"]);
        let w = |f: &dyn Fn(&Account) -> bool| -> f64 {
            out.iter()
                .filter(|e| f(&e.account))
                .map(|e| e.energy_kwh)
                .sum::<f64>()
                * J_PER_KWH
                / 600.0
        };
        // the rack drew what its outlets measured: 800 W
        assert!((w(&|_| true) - 800.0).abs() < 1e-6);
        // n1: its GPU (200 W) and its node's other 300 W; n2 idle: 100 + 200
        assert!((w(&|a| matches!(a, Account::Job { .. })) - 500.0).abs() < 1e-6);
        assert!((w(&|a| *a == Account::Idle) - 300.0).abs() < 1e-6);
        assert!(out.iter().all(|e| e.shared_kwh == 0.0));
    }

    #[test]
    fn a_gpu_two_jobs_share_is_split_evenly_and_marked_shared() {
        let out = metered(&["slurm:1", "slurm:2"]);
        for id in ["slurm:1", "slurm:2"] {
            let e: Vec<_> = out
                .iter()
                .filter(|e| matches!(&e.account, Account::Job { job, .. } if job == id))
                .collect();
            let kwh: f64 = e.iter().map(|e| e.energy_kwh).sum();
            let shared: f64 = e.iter().map(|e| e.shared_kwh).sum();
            assert!(
                (kwh * J_PER_KWH / 600.0 - 250.0).abs() < 1e-6,
                "{id}: {kwh}"
            );
            assert!((shared - kwh).abs() < 1e-12, "all of it from a shared GPU");
        }
    }
}
