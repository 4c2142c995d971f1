//! Holds on waiting jobs, shared by the demo's and the backtest's facilities: a plan's
//! hold keeps a job from starting until its lease ends unrenewed.

use telemetry::{Job, JobState, Timestamp};

/// The plan's hold for a job (its lease), or none: a waiting job it holds is held until
/// the lease ends; a held job it no longer holds waits again.
pub(crate) fn apply(job: &mut Job, hold_until: &mut Option<Timestamp>, lease: Option<Timestamp>) {
    match lease {
        Some(lease) if matches!(job.state, JobState::Pending | JobState::Held) => {
            job.state = JobState::Held;
            *hold_until = Some(lease);
        }
        _ => {
            if job.state == JobState::Held {
                job.state = JobState::Pending;
            }
            *hold_until = None;
        }
    }
}

/// Lets a job go whose hold's lease ended by `now`: whether it went from held to
/// waiting.
pub(crate) fn expire(job: &mut Job, hold_until: &mut Option<Timestamp>, now: Timestamp) -> bool {
    if hold_until.is_some_and(|h| h <= now) {
        *hold_until = None;
        if job.state == JobState::Held {
            job.state = JobState::Pending;
            return true;
        }
    }
    false
}

/// The plan's suspension of a running job (its lease), or none: a running job it
/// suspends stops where it is, keeping its GPUs, until the lease ends unrenewed (as
/// Slurm's `scontrol suspend` stops a job's processes and keeps its allocation); a
/// suspended job it no longer suspends runs on. Whether the job's state changed.
pub(crate) fn suspend(
    job: &mut Job,
    suspended_until: &mut Option<Timestamp>,
    lease: Option<Timestamp>,
) -> bool {
    let before = job.state;
    match lease {
        Some(lease) if matches!(job.state, JobState::Running | JobState::Suspended) => {
            job.state = JobState::Suspended;
            *suspended_until = Some(lease);
        }
        _ => {
            if job.state == JobState::Suspended {
                job.state = JobState::Running;
            }
            *suspended_until = None;
        }
    }
    job.state != before
}

/// Resumes a job whose suspension's lease ended by `now`: whether it did.
pub(crate) fn expire_suspension(
    job: &mut Job,
    suspended_until: &mut Option<Timestamp>,
    now: Timestamp,
) -> bool {
    if suspended_until.is_some_and(|h| h <= now) {
        return suspend(job, suspended_until, None);
    }
    false
}
