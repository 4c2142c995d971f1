//! The poller as a [`Source`]: [`RedfishSource`] polls every interval on the runtime;
//! each endpoint's samples go into the output as soon as they are read (its failures
//! are counted in its [`StatsHandle`], not passed on as rejects).

use std::time::Duration;

use super::{Poller, StatsHandle};
use crate::source::{Batch, Counter, Run, Source, Stats, Task};

/// The Redfish poller with its interval.
pub struct RedfishSource {
    pub poller: Poller,
    pub interval: Duration,
}

impl RedfishSource {
    pub fn new(poller: Poller, interval: Duration) -> Self {
        RedfishSource { poller, interval }
    }
}

impl Source for RedfishSource {
    fn kind(&self) -> &'static str {
        "redfish"
    }

    fn describe(&self) -> String {
        format!(
            "{} endpoints every {} s",
            self.poller.endpoints.len(),
            self.interval.as_secs_f64()
        )
    }

    fn stats(&self) -> Stats {
        let handle = self.poller.stats();
        Stats::new(move || counters(&handle))
    }

    fn run(self: Box<Self>, run: Run) -> Task {
        let RedfishSource { poller, interval } = *self;
        let Run { cancel, out, clock } = run;
        Box::pin(poller.run(
            interval,
            clock,
            cancel.cancelled_owned(),
            move |p: &mut super::Polled| {
                out.push(
                    "redfish",
                    Batch {
                        samples: std::mem::take(&mut p.samples),
                        ..Batch::default()
                    },
                );
            },
        ))
    }
}

/// Every endpoint's counters, labelled by endpoint (and failures by reason), named as
/// in `/metrics` (without the `powerplane_` prefix).
fn counters(handle: &StatsHandle) -> Vec<Counter> {
    let mut out = Vec::new();
    for e in handle.snapshot() {
        let ep = || vec![("endpoint", e.endpoint.clone())];
        for (name, value) in [
            ("redfish_requests_total", e.requests),
            ("redfish_poll_overruns_total", e.overruns),
            ("redfish_polls_skipped_total", e.skipped),
            ("redfish_not_understood_total", e.not_understood),
        ] {
            out.push(Counter {
                name,
                labels: ep(),
                value,
            });
        }
        for (reason, n) in &e.failures {
            let mut labels = ep();
            labels.push(("reason", reason.to_string()));
            out.push(Counter {
                name: "redfish_failures_total",
                labels,
                value: *n,
            });
        }
    }
    out
}
