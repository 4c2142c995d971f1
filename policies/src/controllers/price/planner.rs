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
    // prefix[k] = price · seconds over slots before k
    let mut prefix = vec![0.0; n + 1];
    for k in 0..n {
        prefix[k + 1] = prefix[k] + p[k] * len[k];
    }
    let horizon_end = end_of(n - 1);

    // committed load: each covers the slots that start before it ends (a difference
    // array, so many long-running jobs cost one search each)
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

    let mut order: Vec<usize> = (0..jobs.len()).collect();
    order.sort_by(|&a, &b| {
        (jobs[a].latest_start, &jobs[a].id).cmp(&(jobs[b].latest_start, &jobs[b].id))
    });
    let mut placements: Vec<Option<Placement>> = vec![None; jobs.len()];
    let mut room = vec![0.0f64; n];
    let mut ends = vec![0usize; n];
    let mut fits: Vec<bool> = Vec::with_capacity(n);
    let mut short: Vec<u32> = Vec::with_capacity(n + 1);
    for i in order {
        let job = &jobs[i];
        let dur = job.duration_s.max(1.0);
        // the last start slot: the last one beginning at or before the latest start
        let last = starts
            .partition_point(|s| *s <= job.latest_start)
            .saturating_sub(1);
        // slots a run starting in k covers: [k, ends[k]) (ends never decrease with k)
        let mut e = 0;
        for k in 0..=last {
            let end = starts[k] + dur;
            if end >= horizon_end {
                e = n;
            } else {
                while e < n && starts[e] < end {
                    e += 1;
                }
            }
            ends[k] = e.max(k + 1);
        }
        let reach = ends[last];
        // room per slot: how many more jobs like this one fit (fractional is fine)
        let per_gpus = 1.0 / f64::from(job.gpus.max(1));
        let per_watts = if job.watts > 0.0 {
            1.0 / job.watts
        } else {
            0.0
        };
        for k in 0..reach {
            let g = f64::from(capacity.gpus.saturating_sub(gpus[k])) * per_gpus;
            let w = if job.watts > 0.0 {
                (capacity.power_w - watts[k]) * per_watts
            } else {
                f64::INFINITY
            };
            room[k] = g.min(w);
        }
        window_fits(&room[..reach], &ends[..=last], &mut fits, &mut short);
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
        let mut best: Option<(f64, usize)> = None;
        for (k, ok) in fits.iter().enumerate() {
            if !ok {
                continue;
            }
            let mut c = run_cost(&prefix, &starts, &p, fill, k, ends[k], dur, horizon_end);
            if k > 0 && delay_per_s > 0.0 {
                c += delay_per_s * starts[k].secs_since(now);
            }
            if best.is_none_or(|(bc, _)| c < bc - 1e-12) {
                best = Some((c, k));
            }
        }
        let (k, forced) = match best {
            Some((_, k)) => (k, false),
            None => (0, true),
        };
        let cost = run_cost(&prefix, &starts, &p, fill, k, ends[k], dur, horizon_end);
        let cost_now = run_cost(&prefix, &starts, &p, fill, 0, ends[0], dur, horizon_end);
        let delay_s = starts[k].secs_since(now);
        for slot in k..ends[k] {
            gpus[slot] = gpus[slot].saturating_add(job.gpus);
            watts[slot] += job.watts;
        }
        placements[i] = Some(Placement {
            id: job.id.clone(),
            start: starts[k],
            mean_price: cost / job.duration_s.max(1.0),
            forced,
            saving: (cost_now - cost) * kwh_per_price_s,
            delay_cost: job.delay_cost_per_s.max(0.0) * delay_s,
            fits_now: fits.first().copied().unwrap_or(false),
        });
    }
    Schedule {
        placements: placements.into_iter().flatten().collect(),
        slot_starts: starts,
        gpus,
        watts,
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
