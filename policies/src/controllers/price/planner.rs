//! Price-aware planning: when each deferrable job should start so that the energy it
//! draws costs least, within the GPUs and the power the facility has.
//!
//! The horizon is cut into slots (the first from now to the next slot boundary, the
//! rest on a fixed grid, so that plans made on consecutive ticks agree). Each slot has
//! a price (the forecast's time-weighted mean over it) and room: free GPUs and power
//! under the budget after what already runs. Jobs are placed one by one, the one whose
//! latest start comes first first, each into the start slot whose run costs least
//! among those where it fits in every slot it covers and that begin no later than its
//! latest start; a job that fits nowhere starts now (its deadline comes before cost).
//! A start later than now must also be worth its wait: the job's cost of delay (per
//! second, from the policy's cost per GPU-hour) is added to each later slot's cost, so
//! a later slot wins only when its expected saving exceeds the delay's cost.
//!
//! The work per job is linear in the number of slots (prefix sums of prices and of the
//! slots without room), so 50,000 jobs over a 48-hour horizon of
//! 15-minute slots plan in a few tens of milliseconds. Pure and deterministic: the same
//! inputs give the same plan.

use telemetry::Timestamp;

use crate::forecast::StepSeries;

/// A job to place.
#[derive(Debug, Clone, PartialEq)]
pub struct PlanJob {
    pub id: String,
    pub gpus: u32,
    /// What the job is expected to draw while it runs, in W.
    pub watts: f64,
    /// Estimated run time, in seconds.
    pub duration_s: f64,
    /// The last moment it may start (deadline − duration − margin).
    pub latest_start: Timestamp,
    /// What a second of delay costs, in the price's currency (0: a start later is
    /// taken for any saving). A later start is chosen only when its expected saving
    /// against starting now exceeds the cost of the delay.
    pub delay_cost_per_s: f64,
}

/// Load already committed: a running (or about to run) job, until its expected end.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Committed {
    pub gpus: u32,
    pub watts: f64,
    pub until: Timestamp,
}

/// What the facility can give deferrable jobs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Capacity {
    pub gpus: u32,
    /// Power the planned and committed load may reach, in W (budget − base load).
    pub power_w: f64,
}

/// How the horizon is cut.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Horizon {
    pub slot_s: f64,
    pub horizon_s: f64,
}

/// Where a job was placed.
#[derive(Debug, Clone, PartialEq)]
pub struct Placement {
    pub id: String,
    pub start: Timestamp,
    /// Mean price over its planned run.
    pub mean_price: f64,
    /// It fits nowhere before its latest start: it starts now.
    pub forced: bool,
    /// Expected saving of the planned start against starting now (price difference ×
    /// expected energy), in the price's currency.
    pub saving: f64,
    /// What the delay to the planned start costs (`delay_cost_per_s` × delay).
    pub delay_cost: f64,
    /// The job had room to start now: a later start is for the saving alone.
    pub fits_now: bool,
}

/// A plan: a placement per job (in the order given) and the slots' load, for checks.
#[derive(Debug, Clone, PartialEq)]
pub struct Schedule {
    pub placements: Vec<Placement>,
    /// Start of each slot.
    pub slot_starts: Vec<Timestamp>,
    /// GPUs and W planned in each slot (committed load included).
    pub gpus: Vec<u32>,
    pub watts: Vec<f64>,
}

/// The slots of the horizon from `now`.
fn slots(now: Timestamp, h: Horizon) -> Vec<Timestamp> {
    let slot_ms = (h.slot_s.max(60.0) * 1000.0).round() as i64;
    let end = now.0 + (h.horizon_s.max(h.slot_s) * 1000.0).round() as i64;
    let mut out = vec![now];
    let mut t = (now.0.div_euclid(slot_ms) + 1) * slot_ms;
    while t < end {
        out.push(Timestamp(t));
        t += slot_ms;
    }
    out
}

/// Plans every job. `price` must cover `now`; slots it does not cover count at the mean
/// of those it does.
pub fn plan(
    jobs: &[PlanJob],
    committed: &[Committed],
    capacity: Capacity,
    price: &StepSeries,
    horizon: Horizon,
    now: Timestamp,
) -> Schedule {
    let prices = SlotPrices::new(price, horizon, now);
    let (gpus, watts) = committed_load(&prices.starts, committed);
    let mut order: Vec<usize> = (0..jobs.len()).collect();
    order.sort_by(|&a, &b| {
        (jobs[a].latest_start, &jobs[a].id).cmp(&(jobs[b].latest_start, &jobs[b].id))
    });
    let mut placer = Placer::new(&prices, capacity, gpus, watts, now);
    let mut placements: Vec<Option<Placement>> = vec![None; jobs.len()];
    for i in order {
        placements[i] = Some(placer.place(&jobs[i]));
    }
    let Placer { gpus, watts, .. } = placer;
    Schedule {
        placements: placements.into_iter().flatten().collect(),
        slot_starts: prices.starts,
        gpus,
        watts,
    }
}

/// The horizon's slots and their prices: each slot's price (a slot the series does not
/// cover at `fill`, the mean of those it does), and price · seconds before each slot.
struct SlotPrices {
    starts: Vec<Timestamp>,
    p: Vec<f64>,
    fill: f64,
    /// `prefix[k]` = price · seconds over slots before k.
    prefix: Vec<f64>,
    horizon_end: Timestamp,
}

impl SlotPrices {
    fn new(price: &StepSeries, horizon: Horizon, now: Timestamp) -> SlotPrices {
        let starts = slots(now, horizon);
        let n = starts.len();
        let end_of = |k: usize| {
            starts
                .get(k + 1)
                .copied()
                .unwrap_or_else(|| starts[k] + horizon.slot_s)
        };
        let len: Vec<f64> = (0..n).map(|k| end_of(k).secs_since(starts[k])).collect();
        let known: Vec<Option<f64>> = (0..n).map(|k| price.mean(starts[k], end_of(k))).collect();
        let (sum, cnt) = known
            .iter()
            .flatten()
            .fold((0.0, 0usize), |a, p| (a.0 + p, a.1 + 1));
        let fill = if cnt > 0 { sum / cnt as f64 } else { 0.0 };
        let p: Vec<f64> = known.iter().map(|v| v.unwrap_or(fill)).collect();
        let mut prefix = vec![0.0; n + 1];
        for k in 0..n {
            prefix[k + 1] = prefix[k] + p[k] * len[k];
        }
        let horizon_end = end_of(n - 1);
        SlotPrices {
            starts,
            p,
            fill,
            prefix,
            horizon_end,
        }
    }

    /// See [`run_cost`].
    fn run_cost(&self, k: usize, end_slot: usize, dur: f64) -> f64 {
        run_cost(
            &self.prefix,
            &self.starts,
            &self.p,
            self.fill,
            k,
            end_slot,
            dur,
            self.horizon_end,
        )
    }
}

/// The committed load in each slot, (GPUs, W): each covers the slots that start before
/// it ends (a difference array, so many long-running jobs cost one search each).
fn committed_load(starts: &[Timestamp], committed: &[Committed]) -> (Vec<u32>, Vec<f64>) {
    let n = starts.len();
    let mut d_gpus = vec![0i64; n + 1];
    let mut d_watts = vec![0.0f64; n + 1];
    for c in committed {
        let end = starts.partition_point(|s| *s < c.until);
        d_gpus[0] += i64::from(c.gpus);
        d_gpus[end] -= i64::from(c.gpus);
        d_watts[0] += c.watts;
        d_watts[end] -= c.watts;
    }
    let mut gpus = vec![0u32; n];
    let mut watts = vec![0.0f64; n];
    let (mut g_run, mut w_run) = (0i64, 0.0f64);
    for k in 0..n {
        g_run += d_gpus[k];
        w_run += d_watts[k];
        gpus[k] = u32::try_from(g_run.max(0)).unwrap_or(u32::MAX);
        watts[k] = w_run;
    }
    (gpus, watts)
}

/// Places jobs one after another, each on the load planned so far (the lists of one
/// job's search are kept for the next).
struct Placer<'p> {
    prices: &'p SlotPrices,
    capacity: Capacity,
    now: Timestamp,
    /// GPUs and W planned in each slot.
    gpus: Vec<u32>,
    watts: Vec<f64>,
    room: Vec<f64>,
    ends: Vec<usize>,
    fits: Vec<bool>,
    short: Vec<u32>,
}

impl<'p> Placer<'p> {
    fn new(
        prices: &'p SlotPrices,
        capacity: Capacity,
        gpus: Vec<u32>,
        watts: Vec<f64>,
        now: Timestamp,
    ) -> Placer<'p> {
        let n = prices.starts.len();
        Placer {
            prices,
            capacity,
            now,
            gpus,
            watts,
            room: vec![0.0f64; n],
            ends: vec![0usize; n],
            fits: Vec::with_capacity(n),
            short: Vec::with_capacity(n + 1),
        }
    }

    /// Places `job` in its cheapest start slot with room for its whole run (now where
    /// there is none), and adds it to the planned load.
    fn place(&mut self, job: &PlanJob) -> Placement {
        let prices = self.prices;
        let starts = &prices.starts;
        let dur = job.duration_s.max(1.0);
        // the last start slot: the last one beginning at or before the latest start
        let last = starts
            .partition_point(|s| *s <= job.latest_start)
            .saturating_sub(1);
        self.run_ends(last, dur);
        self.room(job, self.ends[last]);
        let reach = self.ends[last];
        window_fits(
            &self.room[..reach],
            &self.ends[..=last],
            &mut self.fits,
            &mut self.short,
        );
        // the delay's cost in the units of run_cost (price × seconds of run): the
        // currency per second of delay over the job's kW
        let kwh_per_price_s = job.watts.max(0.0) / 3.6e6;
        let delay_per_s = if job.delay_cost_per_s > 0.0 && kwh_per_price_s > 0.0 {
            job.delay_cost_per_s / kwh_per_price_s
        } else if job.delay_cost_per_s > 0.0 {
            f64::INFINITY
        } else {
            0.0
        };
        let (k, forced) = match self.cheapest(dur, delay_per_s) {
            Some(k) => (k, false),
            None => (0, true),
        };
        let end = self.ends[k];
        let cost = prices.run_cost(k, end, dur);
        let cost_now = prices.run_cost(0, self.ends[0], dur);
        let delay_s = starts[k].secs_since(self.now);
        for slot in k..end {
            self.gpus[slot] = self.gpus[slot].saturating_add(job.gpus);
            self.watts[slot] += job.watts;
        }
        Placement {
            id: job.id.clone(),
            start: starts[k],
            mean_price: cost / job.duration_s.max(1.0),
            forced,
            saving: (cost_now - cost) * kwh_per_price_s,
            delay_cost: job.delay_cost_per_s.max(0.0) * delay_s,
            fits_now: self.fits.first().copied().unwrap_or(false),
        }
    }

    /// The slots a run of `dur` starting in each slot k ≤ `last` covers: `[k, ends[k])`
    /// (ends never decrease with k).
    fn run_ends(&mut self, last: usize, dur: f64) {
        let prices = self.prices;
        let starts = &prices.starts;
        let n = starts.len();
        let mut e = 0;
        for k in 0..=last {
            let end = starts[k] + dur;
            if end >= prices.horizon_end {
                e = n;
            } else {
                while e < n && starts[e] < end {
                    e += 1;
                }
            }
            self.ends[k] = e.max(k + 1);
        }
    }

    /// Room per slot up to `reach`: how many more jobs like this one fit (fractional is
    /// fine).
    fn room(&mut self, job: &PlanJob, reach: usize) {
        let per_gpus = 1.0 / f64::from(job.gpus.max(1));
        let per_watts = if job.watts > 0.0 {
            1.0 / job.watts
        } else {
            0.0
        };
        for k in 0..reach {
            let g = f64::from(self.capacity.gpus.saturating_sub(self.gpus[k])) * per_gpus;
            let w = if job.watts > 0.0 {
                (self.capacity.power_w - self.watts[k]) * per_watts
            } else {
                f64::INFINITY
            };
            self.room[k] = g.min(w);
        }
    }

    /// The start slot of least cost (a later one only when cheaper by more than 1e-12)
    /// among those the run fits from, the delay's cost included.
    fn cheapest(&self, dur: f64, delay_per_s: f64) -> Option<usize> {
        let starts = &self.prices.starts;
        let mut best: Option<(f64, usize)> = None;
        for (k, ok) in self.fits.iter().enumerate() {
            if !ok {
                continue;
            }
            let mut c = self.prices.run_cost(k, self.ends[k], dur);
            if k > 0 && delay_per_s > 0.0 {
                c += delay_per_s * starts[k].secs_since(self.now);
            }
            if best.is_none_or(|(bc, _)| c < bc - 1e-12) {
                best = Some((c, k));
            }
        }
        best.map(|(_, k)| k)
    }
}

/// For each start slot k: whether the job fits (room ≥ 1) in every slot of its run,
/// `[k, ends[k])`: no slot without room in the window, by a running count of the slots
/// without room (`short`, reused between jobs).
fn window_fits(room: &[f64], ends: &[usize], out: &mut Vec<bool>, short: &mut Vec<u32>) {
    short.clear();
    short.push(0);
    let mut c = 0u32;
    for r in room {
        c += u32::from(*r < 1.0 - 1e-9);
        short.push(c);
    }
    out.clear();
    out.extend(ends.iter().enumerate().map(|(k, &e)| {
        let e = e.min(room.len());
        k < e && short[e] == short[k]
    }));
}

/// Price × seconds of a run of `dur` seconds starting at slot `k` and ending before slot
/// `end_slot` (the first slot starting at or after its end); past the horizon at `fill`.
#[allow(clippy::too_many_arguments)]
fn run_cost(
    prefix: &[f64],
    starts: &[Timestamp],
    p: &[f64],
    fill: f64,
    k: usize,
    end_slot: usize,
    dur: f64,
    horizon_end: Timestamp,
) -> f64 {
    let t0 = starts[k];
    let end = t0 + dur.max(1.0);
    if end >= horizon_end {
        let n = starts.len();
        return prefix[n] - prefix[k] + end.secs_since(horizon_end) * fill;
    }
    let j = end_slot.max(k + 1) - 1; // the slot holding the end
    prefix[j] - prefix[k] + end.secs_since(starts[j]) * p[j]
}

#[cfg(test)]
mod tests;
