//! The planned load of every rack: what its GPUs would draw under a cap level (running
//! jobs at their demand), what is not GPU in it, its idle GPUs, and the queued jobs'
//! GPUs that may land on them within the horizon.

use telemetry::metric::names::POWER_W;
use telemetry::snapshot::Slot;
use telemetry::{EntityId, GpuModel, Job, JobState, Site, Snapshot, Timestamp};

use crate::index::{Held, Index, JobTable};
use crate::{Cap, State};

/// A GPU's power limit under `fraction` of its default limit.
pub(super) fn limit_w(m: &GpuModel, fraction: f64) -> f64 {
    (m.default_w * fraction).clamp(m.min_w, m.max_w)
}

/// What a queued job adds when it starts on an idle GPU of model `m`, but its share of
/// its node's base power.
pub(super) fn start_gpu_w(m: &GpuModel, fraction: f64) -> f64 {
    (limit_w(m, fraction).min(m.default_w) - m.idle_w).max(0.0)
}

/// Every rack's planned load, in site order, with the racks' GPUs laid out rack by rack
/// in lists shared by all racks (no lists made per rack).
#[derive(Debug, Default)]
pub(super) struct Loads<'m> {
    pub(super) racks: Vec<RackLoad<'m>>,
    /// Each GPU's demand: what it would draw under no cap (a running job's), or its
    /// idle draw; rack by rack, in site order within a rack.
    pub(super) demands: Vec<f64>,
    /// Each GPU's model, as `demands`.
    pub(super) models: Vec<&'m GpuModel>,
    /// Each idle GPU's model and the share of its node's base power a job adds when it
    /// starts on it, rack by rack.
    pub(super) idle: Vec<(&'m GpuModel, f64)>,
}

/// One rack's part of [`Loads`].
#[derive(Debug, Clone, Default)]
pub(super) struct RackLoad<'m> {
    /// What is not GPU: the rack's power reading less its GPUs' draw, else its nodes'
    /// base power.
    pub(super) other_w: f64,
    /// Its GPUs in [`Loads::demands`] and [`Loads::models`].
    pub(super) gpus: std::ops::Range<usize>,
    /// Its idle GPUs in [`Loads::idle`].
    pub(super) idle: std::ops::Range<usize>,
    /// The rack's power reading, when usable.
    pub(super) measured_w: Option<f64>,
    /// When every GPU of the rack is of one model: it, what the demands add up to
    /// uncapped, and the highest demand (NaN when the sum is). A cap level then makes
    /// one limit for the rack, and one at or over the highest demand caps nothing.
    pub(super) uniform: Option<(&'m GpuModel, f64, f64)>,
    /// The rack's slot in the snapshot (its readings are looked up by it).
    pub(super) slot: Option<Slot>,
}

impl<'m> Loads<'m> {
    /// Rack `r`'s load with its GPUs.
    pub(super) fn rack(&self, r: usize) -> Rack<'_, 'm> {
        let load = &self.racks[r];
        Rack {
            load,
            demands: &self.demands[load.gpus.clone()],
            models: &self.models[load.gpus.clone()],
            idle: &self.idle[load.idle.clone()],
        }
    }
}

/// A rack's planned load: what is not GPU, its GPUs, and its idle GPUs, in site order.
pub(super) struct Rack<'l, 'm> {
    pub(super) load: &'l RackLoad<'m>,
    pub(super) demands: &'l [f64],
    pub(super) models: &'l [&'m GpuModel],
    pub(super) idle: &'l [(&'m GpuModel, f64)],
}

impl<'m> Rack<'_, 'm> {
    pub(super) fn draw_w(&self, fraction: f64) -> f64 {
        let other_w = self.load.other_w;
        match self.load.uniform {
            Some((m, uncapped_w, max_w)) => {
                let limit = limit_w(m, fraction);
                if max_w <= limit {
                    // every GPU draws its demand: the sum is the uncapped one
                    other_w + uncapped_w
                } else {
                    other_w + self.demands.iter().map(|d| d.min(limit)).sum::<f64>()
                }
            }
            None => {
                other_w
                    + self
                        .demands
                        .iter()
                        .zip(self.models)
                        .map(|(d, m)| d.min(limit_w(m, fraction)))
                        .sum::<f64>()
            }
        }
    }

    /// What `n` and `m` (n ≤ m) queued GPUs add if they start on this rack's idle GPUs,
    /// in one walk: each sum is the one [`Iterator::sum`] makes of its first GPUs.
    pub(super) fn start_w(&self, fraction: f64, n: usize, m: usize) -> (f64, f64) {
        let m = m.min(self.idle.len());
        let n = n.min(m);
        let start: f64 = std::iter::empty::<f64>().sum();
        let (first, rest) = (&self.idle[..n], &self.idle[n..m]);
        match self.load.uniform {
            Some((model, _, _)) => {
                let gpu_w = start_gpu_w(model, fraction);
                let first_n = first.iter().fold(start, |s, (_, b)| s + (gpu_w + b));
                let all = rest.iter().fold(first_n, |s, (_, b)| s + (gpu_w + b));
                (first_n, all)
            }
            None => {
                let add = |s: f64, (g, b): &(&GpuModel, f64)| s + (start_gpu_w(g, fraction) + b);
                let first_n = first.iter().fold(start, add);
                let all = rest.iter().fold(first_n, add);
                (first_n, all)
            }
        }
    }
}

/// Each rack's planned load, in site order.
pub(super) fn rack_loads<'m>(
    index: &Index<'m>,
    snapshot: &Snapshot,
    alloc: &JobTable,
    jobs: &[Job],
    prior_caps: &[Option<&Cap>],
    now: Timestamp,
) -> Loads<'m> {
    let busy = busy_gpus(index, alloc, jobs);
    let (mut loads, mut racks) = Loads::laid_out(index, &busy);
    let fill = loads.fill(index, &busy, &racks, prior_caps, now);
    measure_racks(index.site, snapshot, &fill, &mut racks, now);
    loads.racks = racks;
    loads
}

/// Whether each GPU runs a job, by GPU index.
fn busy_gpus(index: &Index<'_>, alloc: &JobTable, jobs: &[Job]) -> Vec<bool> {
    let mut busy = vec![false; index.gpus.len()];
    for (k, _) in jobs
        .iter()
        .enumerate()
        .filter(|(_, j)| j.state == JobState::Running)
    {
        for i in alloc.of(k) {
            busy[i] = true;
        }
    }
    busy
}

impl<'m> Loads<'m> {
    /// The shared lists, sized for each rack's GPUs and idle GPUs, and where each
    /// rack's lie in them.
    fn laid_out(index: &Index<'m>, busy: &[bool]) -> (Loads<'m>, Vec<RackLoad<'m>>) {
        let site = index.site;
        // each rack's GPUs and idle GPUs, then where each rack's lie in the shared lists
        let mut counts = vec![(0usize, 0usize); site.racks.len()];
        for (g, &b) in index.gpus.iter().zip(busy) {
            let c = &mut counts[g.rack_index];
            c.0 += 1;
            c.1 += usize::from(!b);
        }
        let (mut gpus_at, mut idle_at) = (0, 0);
        let racks: Vec<RackLoad> = counts
            .iter()
            .map(|&(n, idle)| {
                let load = RackLoad {
                    gpus: gpus_at..gpus_at + n,
                    idle: idle_at..idle_at + idle,
                    ..RackLoad::default()
                };
                (gpus_at, idle_at) = (gpus_at + n, idle_at + idle);
                load
            })
            .collect();
        // every place is written below: the first GPU's model only fills them until then
        let filler = index.gpus.first().map(|g| g.model);
        let loads = Loads {
            demands: vec![0.0; gpus_at],
            models: filler.map_or_else(Vec::new, |m| vec![m; gpus_at]),
            idle: filler.map_or_else(Vec::new, |m| vec![(m, 0.0); idle_at]),
            racks: Vec::new(),
        };
        (loads, racks)
    }

    /// Writes each GPU's demand and model (and each idle GPU's) in its rack's place,
    /// walking the GPUs in site order; returns what each rack's GPUs add up to.
    fn fill(
        &mut self,
        index: &Index<'m>,
        busy: &[bool],
        racks: &[RackLoad<'m>],
        prior_caps: &[Option<&Cap>],
        now: Timestamp,
    ) -> Vec<Fill<'m>> {
        let mut fill: Vec<Fill> = racks
            .iter()
            .map(|r| Fill {
                gpu_at: r.gpus.start,
                idle_at: r.idle.start,
                drawn_w: 0.0,
                model: None,
                same: true,
                uncapped_w: std::iter::empty::<f64>().sum(),
                max_w: f64::NEG_INFINITY,
            })
            .collect();
        let power = index.metric_id(POWER_W);
        for (i, g) in index.gpus.iter().enumerate() {
            let m = g.model;
            let draw = power
                .and_then(|p| index.gpu_observe_id(i, p, now))
                .filter(|o| o.usable())
                .map(|o| o.value);
            let is_busy = busy[i];
            let cap = prior_caps[i].map(|c| c.watts);
            // a GPU at its cap would draw more without it: its default limit
            let demand_w = match (draw, cap) {
                (Some(d), Some(c)) if d >= c - (0.03 * c).max(5.0) => m.default_w,
                (Some(d), _) => d,
                (None, _) if is_busy => m.default_w,
                (None, _) => m.idle_w,
            };
            let f = &mut fill[g.rack_index];
            f.drawn_w += draw.unwrap_or(demand_w);
            self.demands[f.gpu_at] = demand_w;
            self.models[f.gpu_at] = m;
            f.gpu_at += 1;
            if !is_busy {
                self.idle[f.idle_at] = (m, 0.5 * g.node.base_w / f64::from(g.node.gpus.max(1)));
                f.idle_at += 1;
            }
            match f.model {
                None => f.model = Some(m),
                Some(first) => f.same &= std::ptr::eq(first, m),
            }
            f.uncapped_w += demand_w;
            f.max_w = f.max_w.max(demand_w);
        }
        fill
    }
}

/// Each rack's power reading and slot, what is not GPU in it, and its one model where
/// all its GPUs are of one.
fn measure_racks<'m>(
    site: &Site,
    snapshot: &Snapshot,
    fill: &[Fill<'m>],
    racks: &mut [RackLoad<'m>],
    now: Timestamp,
) {
    let rack_power = snapshot.metric_id(POWER_W);
    for (ri, rack) in site.racks.iter().enumerate() {
        let slot = snapshot.slot(&EntityId::rack(&rack.id));
        let measured = rack_power
            .zip(slot)
            .and_then(|(m, s)| snapshot.observe_slot(s, m, now))
            .filter(|o| o.usable())
            .map(|o| o.value);
        let base: f64 = rack.nodes.iter().map(|&n| site.nodes[n].base_w).sum();
        let load = &mut racks[ri];
        load.slot = slot;
        load.measured_w = measured;
        let f = &fill[ri];
        load.other_w = measured.map_or(base, |w| (w - f.drawn_w).max(0.0));
        // no demand is NaN when their sum is not
        let max_w = if f.uncapped_w.is_nan() {
            f64::NAN
        } else {
            f.max_w
        };
        load.uniform = f.model.filter(|_| f.same).map(|m| (m, f.uncapped_w, max_w));
    }
}

/// One rack's GPUs as [`rack_loads`] walks them in site order: where its next GPU and
/// idle GPU go in [`Loads`], and what [`RackLoad::other_w`] and [`RackLoad::uniform`]
/// are made of.
pub(super) struct Fill<'m> {
    pub(super) gpu_at: usize,
    pub(super) idle_at: usize,
    /// What its GPUs draw: their readings, else their demands.
    pub(super) drawn_w: f64,
    /// Its first GPU's model, and whether every GPU so far is of that model.
    pub(super) model: Option<&'m GpuModel>,
    pub(super) same: bool,
    /// Its GPUs' demands added up (as [`Iterator::sum`] does) and the highest.
    pub(super) uncapped_w: f64,
    pub(super) max_w: f64,
}

/// The queued jobs' GPUs as [`Queue::gpus`] counts them (made once per evaluation).
pub(super) struct Queue {
    /// GPUs of the pending jobs that are not held.
    pub(super) free: usize,
    /// The held jobs that have a latest start: when each hold must end (the latest
    /// start less the price rule's `release_margin_s`), in order, with the GPUs of the
    /// held jobs whose hold ends by then.
    pub(super) held_ends: Vec<(Timestamp, usize)>,
}

impl Queue {
    pub(super) fn new(
        jobs: &[Job],
        table: &JobTable,
        prior: &State,
        release_margin_s: f64,
    ) -> Queue {
        let held = Held::new(&prior.holds, jobs, table);
        let mut free = 0;
        let mut held_ends = Vec::new();
        for (k, j) in jobs
            .iter()
            .enumerate()
            .filter(|(_, j)| matches!(j.state, JobState::Pending | JobState::Held))
        {
            let gpus = j.gpus as usize;
            if held.get(k).is_none() {
                free += gpus;
            } else if let Some(t) = j.latest_start() {
                held_ends.push((t + -release_margin_s, gpus));
            }
        }
        held_ends.sort_unstable();
        let mut total = 0;
        for e in &mut held_ends {
            total += e.1;
            e.1 = total;
        }
        Queue { free, held_ends }
    }

    /// GPUs of the queued jobs that may start within `horizon_s`: pending and not held,
    /// or held with a hold that must end within the horizon (the job's latest start,
    /// less the price rule's `release_margin_s`, falls in it). A hold's lease is
    /// renewed every tick, so it is not taken for its end.
    pub(super) fn gpus(&self, now: Timestamp, horizon_s: f64) -> usize {
        let by = now + horizon_s;
        let k = self.held_ends.partition_point(|&(t, _)| t <= by);
        self.free + k.checked_sub(1).map_or(0, |k| self.held_ends[k].1)
    }
}
