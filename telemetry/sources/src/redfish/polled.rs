//! What one poll of one Redfish endpoint gave: its samples, rejects and the report of
//! each binding. Made by the walk and the endpoint tasks, gathered by the poller
//! (`poll`), read by `serve`, `telemetry probe` and the tests. It sits below `walk` and
//! `endpoint` (it names an endpoint by its name), so their imports go one way:
//! endpoint → walk → polled.

use std::time::Duration;

use super::RedfishError;
use telemetry::mapping::Reject;
use telemetry::Sample;

/// What one poll of one endpoint gave.
#[derive(Debug, Clone, Default)]
pub struct Polled {
    pub endpoint: String,
    pub samples: Vec<Sample>,
    pub rejects: Vec<Reject>,
    /// The endpoint could not be polled at all (and is backing off).
    pub error: Option<String>,
    /// Skipped: still backing off after an earlier failure.
    pub skipped: bool,
    /// Not read in this poll: its discovery is still running (or waiting for a slot)
    /// and its readings come with a later poll.
    pub deferred: bool,
    /// Cut off at the poll deadline (the interval) before it finished.
    pub overrun: bool,
    /// This poll walked the whole tree.
    pub discovery: bool,
    pub elapsed: Duration,
    pub requests: usize,
    /// Numeric readings, in the resources read, whose unit powerplane does not know.
    pub not_understood: usize,
    /// What each of the site's bindings of this endpoint made of this poll.
    pub bindings: Vec<BindingReport>,
}

/// One `[[redfish]]` binding after a poll: its sample, or why it has none, and the
/// readings it took.
#[derive(Debug, Clone, PartialEq)]
pub struct BindingReport {
    /// Index into the endpoint's `bind`.
    pub index: usize,
    pub outcome: super::bind::Outcome,
    pub used: Vec<super::bind::Matched>,
}

impl Polled {
    /// Nothing yet from the endpoint named `endpoint`.
    pub(super) fn named(endpoint: &str) -> Polled {
        Polled {
            endpoint: endpoint.to_string(),
            ..Polled::default()
        }
    }

    /// An endpoint that could not be polled at all.
    pub(super) fn failed(endpoint: &str, e: &RedfishError) -> Polled {
        Polled {
            error: Some(e.to_string()),
            rejects: vec![Reject {
                reason: e.reason(),
                detail: e.to_string(),
            }],
            ..Polled::named(endpoint)
        }
    }
}
