//! Why a call to a scheduler failed, by cause: [`SchedulerError`] (what the
//! [`super::Scheduler`] trait returns). Each carries the adapter's own error
//! as its `source`; its text is that error's, as the logs and the status show it.

use thiserror::Error;

use crate::slurm_api::SlurmApiError;

/// The adapter's own error behind a [`SchedulerError`].
pub type Cause = Box<dyn std::error::Error + Send + Sync + 'static>;

/// A scheduler call that failed, by cause.
#[derive(Debug, Error)]
pub enum SchedulerError {
    /// The scheduler could not be reached (no address, connect or IO failed).
    #[error("{source}")]
    Unreachable {
        #[source]
        source: Cause,
    },
    /// No answer by the call's deadline.
    #[error("{source}")]
    Timeout {
        #[source]
        source: Cause,
    },
    /// The scheduler answered and refused, with its status where it gave one.
    #[error("{source}")]
    Refused {
        status: Option<u16>,
        #[source]
        source: Cause,
    },
    /// The answer was not what the adapter reads (malformed, oversized, cut short).
    #[error("{source}")]
    BadAnswer {
        #[source]
        source: Cause,
    },
    /// The adapter is not set up to make the call (its config, a version the server
    /// does not speak, a command that failed).
    #[error("{source}")]
    Setup {
        #[source]
        source: Cause,
    },
    /// The adapter has no way to requeue a job.
    #[error("job {job}: the {scheduler} adapter cannot requeue")]
    CannotRequeue { job: String, scheduler: String },
}

impl SchedulerError {
    /// The HTTP status the scheduler refused with, if it gave one.
    pub fn status(&self) -> Option<u16> {
        match self {
            SchedulerError::Refused { status, .. } => *status,
            _ => None,
        }
    }
}

impl From<SlurmApiError> for SchedulerError {
    fn from(e: SlurmApiError) -> Self {
        match &e {
            SlurmApiError::Io { .. } => SchedulerError::Unreachable { source: e.into() },
            SlurmApiError::Timeout { .. } => SchedulerError::Timeout { source: e.into() },
            SlurmApiError::Unauthorized { status, .. } | SlurmApiError::Http { status, .. } => {
                SchedulerError::Refused {
                    status: Some(*status),
                    source: e.into(),
                }
            }
            SlurmApiError::Api { .. } => SchedulerError::Refused {
                status: None,
                source: e.into(),
            },
            SlurmApiError::TooLarge { .. } | SlurmApiError::Decode { .. } => {
                SchedulerError::BadAnswer { source: e.into() }
            }
            SlurmApiError::Config(_)
            | SlurmApiError::Unsupported { .. }
            | SlurmApiError::Command { .. } => SchedulerError::Setup { source: e.into() },
        }
    }
}
