//! The telemetry sources of `serve`, held in one list: each input is a
//! [`sources::source::Source`] built from its config section ([`crate::mqtt`] from
//! `[mqtt]`, [`crate::redfish`] from `[redfish]`, the agents' reports from `[agents]`),
//! started alike by [`start`] on the runtime with the one shutdown token, logged alike
//! and counted alike.
//!
//! What every source reads goes through one [`Admission`]: only the site's entities
//! reach the tick's bounded buffer (see `control::admit`), and the rejects and
//! Sparkplug rebirths a source reports are counted for `/metrics`.

use std::sync::Arc;

use sources::source::{Batch, Output, Run, Source, Stats};
use tracing::info;

use crate::buffer::Buffer;
use crate::Runtime;
use control::admit::{Gate, Tally, REBIRTH_HELD, REBIRTH_SENT};

/// Where every source's batches go: the gate, then the buffer (bounded: the newest
/// kept, what it drops counted); never blocks.
pub struct Admission {
    pub buffer: Arc<Buffer>,
    pub gate: Arc<Gate>,
    /// The decoders' rejects and the rebirths, by reason.
    pub rejects: Arc<Tally>,
}

impl Output for Admission {
    fn push(&self, kind: &'static str, batch: Batch) {
        for r in &batch.rejects {
            self.rejects.add(r.reason, 1);
        }
        if let Some(r) = &batch.rebirth {
            self.rejects
                .add(if r.sent { REBIRTH_SENT } else { REBIRTH_HELD }, 1);
        }
        if batch.samples.is_empty() && batch.dead.is_empty() {
            return;
        }
        self.buffer.push(
            self.gate.admit(batch.samples, kind),
            self.gate.admit_dead(batch.dead, kind),
        );
    }
}

/// A started source's name and counters.
pub struct Running {
    pub kind: &'static str,
    pub stats: Stats,
}

/// Starts every source as a task on `runtime`: each reads until the runtime's shutdown
/// token is cancelled, and `Runtime::stop` waits for it.
pub fn start(list: Vec<Box<dyn Source>>, runtime: &Runtime, out: Arc<dyn Output>) -> Vec<Running> {
    let mut running = Vec::with_capacity(list.len());
    for s in list {
        info!(source = s.kind(), what = %s.describe(), "source starting");
        running.push(Running {
            kind: s.kind(),
            stats: s.stats(),
        });
        runtime.spawn(s.run(Run {
            cancel: runtime.shutdown.clone(),
            out: out.clone(),
            clock: common::wall_clock,
        }));
    }
    running
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use sources::source::{Counter, Task};
    use telemetry::mapping::{Rebirth, Reject};
    use telemetry::metric::names::INLET_TEMP_C;
    use telemetry::{EntityId, Sample, Site};

    /// A source that pushes one batch per millisecond until cancelled.
    struct Ticker(Arc<AtomicUsize>);

    impl Source for Ticker {
        fn kind(&self) -> &'static str {
            "ticker"
        }
        fn describe(&self) -> String {
            "one batch per ms".into()
        }
        fn stats(&self) -> Stats {
            let n = self.0.clone();
            Stats::new(move || {
                vec![Counter {
                    name: "ticker_batches_total",
                    labels: Vec::new(),
                    value: n.load(Ordering::Relaxed) as u64,
                }]
            })
        }
        fn run(self: Box<Self>, run: Run) -> Task {
            Box::pin(async move {
                while !run.cancel.is_cancelled() {
                    let now = (run.clock)();
                    run.out.push(
                        "ticker",
                        Batch {
                            samples: vec![
                                Sample::new(EntityId::rack("a01"), INLET_TEMP_C, 25.0, now, "t"),
                                Sample::new(EntityId::rack("nope"), INLET_TEMP_C, 25.0, now, "t"),
                            ],
                            rejects: vec![Reject {
                                reason: "bad_json",
                                detail: String::new(),
                            }],
                            rebirth: Some(Rebirth {
                                sent: true,
                                ..Rebirth::default()
                            }),
                            ..Batch::default()
                        },
                    );
                    self.0.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            })
        }
    }

    #[test]
    fn every_source_runs_until_the_one_token_is_cancelled_and_only_the_site_passes() {
        let site = Site::parse("site.toml", control::examples::DEFAULT_SITE).expect("site");
        let runtime = Runtime::new(2).expect("runtime");
        let admission = Arc::new(Admission {
            buffer: Arc::new(Buffer::new(1_000_000)),
            gate: Arc::new(Gate::new(&site)),
            rejects: Arc::new(Tally::default()),
        });
        let (a, b) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let running = start(
            vec![Box::new(Ticker(a.clone())), Box::new(Ticker(b.clone()))],
            &runtime,
            admission.clone(),
        );
        assert_eq!(running.len(), 2);
        while a.load(Ordering::Relaxed) < 5 || b.load(Ordering::Relaxed) < 5 {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(
            runtime.stop(Duration::from_secs(5)),
            "every source ended on the token"
        );
        let (na, nb) = (a.load(Ordering::Relaxed), b.load(Ordering::Relaxed));
        let counted = running[0].stats.read()[0].value + running[1].stats.read()[0].value;
        assert_eq!(counted, (na + nb) as u64, "stats read the running sources");
        let samples = admission.buffer.drain();
        assert_eq!(
            samples.0.len(),
            na + nb,
            "one of two samples per batch is the site's"
        );
        assert_eq!(admission.gate.take_refused(), (na + nb) as u64);
        let rejects = admission.rejects.counts();
        assert_eq!(rejects.get("bad_json"), Some(&((na + nb) as u64)));
        assert_eq!(rejects.get(REBIRTH_SENT), Some(&((na + nb) as u64)));
    }
}
