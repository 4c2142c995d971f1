//! The feed-forward's placement of the jobs about to start on the idle GPUs, in the
//! scheduler's order, the way that hurts the budgets most.

use std::collections::BTreeSet;

use telemetry::site::GpuRef;
use telemetry::{Job, Timestamp};

use super::cut_order::cut_order_of;
use super::scopes::Scope;
use super::{other_w, Claim};
use crate::index::Held;
use crate::policy::BudgetRule;
use crate::State;

/// Feed-forward placement: the idle GPUs the jobs about to start would start on, each
/// with its job's cut order. The jobs about to start are the queued jobs that are not
/// held and the held jobs whose hold ends this tick (`starting`, the releases of this
/// tick's plan); the scheduler may start them at any moment before the next tick, on
/// the idle GPUs (`free`). The engine does not know where, so it assumes the placement
/// that hurts most: in the scheduler's order (priority, then submission), each job on
/// the idle GPUs whose tightest scope has the least headroom (GPUs of a node together),
/// a job that does not fit on the idle GPUs left not started at all. So no more GPUs
/// are reserved than the jobs ask for and the idle GPUs present, and only in the scopes
/// they are in.
#[allow(clippy::too_many_arguments)]
pub(super) fn place_starting(
    index: &crate::index::Index<'_>,
    scopes: &[Scope],
    measured: &[Option<telemetry::Observation>],
    gpu_draws: &[f64],
    claims: &[Claim],
    free: &[bool],
    jobs: &[Job],
    prior: &State,
    rule: &BudgetRule,
    starting: &BTreeSet<String>,
    now: Timestamp,
) -> Vec<(usize, i64)> {
    let queued = queued_in_order(index, jobs, prior, starting);
    if queued.is_empty() {
        return Vec::new();
    }
    let idle = idle_by_headroom(&index.gpus, scopes, measured, gpu_draws, claims, free, rule);
    assign_idle(&queued, &idle, jobs, rule, now)
}

/// The jobs about to start (queued and not held, or held with a hold that ends this
/// tick, asking for GPUs), as (their place in the scheduler's order, their position),
/// in the scheduler's order.
fn queued_in_order(
    index: &crate::index::Index<'_>,
    jobs: &[Job],
    prior: &State,
    starting: &BTreeSet<String>,
) -> Vec<(QueueKey, u32)> {
    let held = Held::new(&prior.holds, jobs, &index.allocations(jobs));
    let mut queued: Vec<(QueueKey, u32)> = jobs
        .iter()
        .enumerate()
        .filter(|&(k, j)| match j.state {
            telemetry::JobState::Pending => held.get(k).is_none() || starting.contains(&j.id),
            telemetry::JobState::Held => starting.contains(&j.id),
            _ => false,
        })
        .filter(|(_, j)| j.gpus > 0)
        .map(|(k, j)| (QueueKey::of(j), k as u32))
        .collect();
    // the scheduler's order: priority (highest first), then submission, then id, then
    // the jobs' order (so the unstable sort keeps jobs that compare equal as listed)
    queued.sort_unstable_by(|(a, p), (b, q)| {
        a.cmp(b)
            .then_with(|| jobs[*p as usize].id.cmp(&jobs[*q as usize].id))
            .then(p.cmp(q))
    });
    queued
}

/// The idle GPUs, each with its tightest scope's headroom (as a key that orders as
/// `f64::total_cmp` does), by that headroom then by index.
fn idle_by_headroom(
    gpus: &[GpuRef<'_>],
    scopes: &[Scope],
    measured: &[Option<telemetry::Observation>],
    gpu_draws: &[f64],
    claims: &[Claim],
    free: &[bool],
    rule: &BudgetRule,
) -> Vec<(i64, usize)> {
    // the idle GPUs, in order, and the headroom of each one's tightest scope
    let idle: Vec<usize> = (0..gpus.len()).filter(|&i| free[i]).collect();
    let mut tightest = vec![f64::INFINITY; idle.len()];
    for ((scope, obs), &gpu_draw) in scopes.iter().zip(measured).zip(gpu_draws) {
        // the sum starts from -0.0, as `Iterator::sum` of f64 does
        let mut demand = -0.0_f64;
        for &(a, b, share) in &scope.members.0 {
            for c in &claims[a as usize..b as usize] {
                demand += c.demand_w * share;
            }
        }
        let headroom = scope.budget_kw * 1000.0 * (1.0 - rule.margin)
            - other_w(*obs, scope.base_w, gpu_draw)
            - demand;
        // the scope's idle GPUs: those of each run, found in the ordered list
        for &(a, b, _) in &scope.members.0 {
            let from = idle.partition_point(|&i| i < a as usize);
            let to = from + idle[from..].partition_point(|&i| i < b as usize);
            for t in &mut tightest[from..to] {
                *t = t.min(headroom);
            }
        }
    }
    // the idle GPUs by their tightest headroom (as `f64::total_cmp` orders it), then by
    // index: no two compare equal, so the unstable sort gives the one order
    let mut idle: Vec<(i64, usize)> = idle
        .iter()
        .zip(&tightest)
        .map(|(&i, &t)| (total_order_key(t), i))
        .collect();
    idle.sort_unstable();
    idle
}

/// Each job in order on the idle GPUs left first in `idle` (a job that does not fit is
/// not started): (GPU index, its job's cut order).
fn assign_idle(
    queued: &[(QueueKey, u32)],
    idle: &[(i64, usize)],
    jobs: &[Job],
    rule: &BudgetRule,
    now: Timestamp,
) -> Vec<(usize, i64)> {
    let mut out = Vec::new();
    let mut next = 0;
    for &(_, k) in queued {
        let j = &jobs[k as usize];
        let n = j.gpus as usize;
        if idle.len() - next < n {
            continue;
        }
        // placed on idle GPUs of any model: counted at the reference pace
        let p = cut_order_of(j, rule, now, || 1.0);
        out.extend(idle[next..next + n].iter().map(|&(_, i)| (i, p)));
        next += n;
    }
    out
}

/// A queued job's place in the scheduler's order short of its whole id: priority
/// (highest first), submission, then the first 16 bytes of its id (zero-padded, as
/// big-endian bytes compare as the id's bytes do). Two keys that differ order their jobs
/// as the ids would; equal keys leave the order to the whole ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct QueueKey(std::cmp::Reverse<i32>, Timestamp, u64, u64);

impl QueueKey {
    fn of(j: &Job) -> QueueKey {
        let mut head = [0u8; 16];
        let n = j.id.len().min(16);
        head[..n].copy_from_slice(&j.id.as_bytes()[..n]);
        let (hi, lo) = head.split_at(8);
        let word = |b: &[u8]| u64::from_be_bytes(b.try_into().expect("8 bytes"));
        QueueKey(
            std::cmp::Reverse(j.priority),
            j.submit_time,
            word(hi),
            word(lo),
        )
    }
}

/// An integer that orders floats as [`f64::total_cmp`] does.
fn total_order_key(x: f64) -> i64 {
    let bits = x.to_bits() as i64;
    bits ^ ((((bits >> 63) as u64) >> 1) as i64)
}
