//! The budget's cut order: which GPUs are cut first (idle GPUs, then by the class and
//! priority of their jobs, jobs close to their deadline last).

use telemetry::{Job, Timestamp};

use crate::policy::BudgetRule;

/// The cut-order tier of jobs close to their deadline: above every class and priority.
pub(super) const PROTECTED_RANK: i64 = 1 << 24;

/// Whether a cut-order value is that of a job close to its deadline.
pub(super) fn is_protected(priority: i64) -> bool {
    priority >= (PROTECTED_RANK << 33) - (1 << 32)
}

/// The cut order of each busy GPU: GPUs of jobs whose class comes first in
/// `cut_order` are cut first, then by job priority (lower first); jobs whose slack
/// (latest start − now) is at most `protect_slack_s` are cut last, by priority. Idle
/// GPUs (not in the map) are cut before any job's.
pub(super) fn job_priority_by_gpu(
    index: &crate::index::Index<'_>,
    jobs: &[Job],
    rule: &BudgetRule,
    now: Timestamp,
) -> Vec<i64> {
    let mut m = vec![i64::MIN; index.gpus.len()];
    let alloc = index.allocations(jobs);
    for (k, j) in jobs
        .iter()
        .enumerate()
        .filter(|(_, j)| j.state == telemetry::JobState::Running)
    {
        let speed = || telemetry::site::slowest(alloc.of(k).filter_map(|i| index.gpus.get(i)));
        let p = cut_order_of(j, rule, now, speed);
        for i in alloc.of(k) {
            m[i] = p;
        }
    }
    m
}

/// A job's place in the cut order (lower is cut first), see [`job_priority_by_gpu`];
/// `speed`: the slowest model's it runs on (its slack counted at that pace).
pub(super) fn cut_order_of(
    j: &Job,
    rule: &BudgetRule,
    now: Timestamp,
    speed: impl FnOnce() -> f64,
) -> i64 {
    let cut_order = &rule.cut_order;
    let urgent = j
        .latest_start_at(speed)
        .is_some_and(|ls| ls.secs_since(now) <= rule.protect_slack_s);
    let rank = if urgent {
        PROTECTED_RANK
    } else {
        cut_order
            .iter()
            .position(|c| c == &j.class)
            .unwrap_or(cut_order.len()) as i64
    };
    (rank << 33) + i64::from(j.priority)
}
