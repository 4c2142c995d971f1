//! [`MqttSource`] as a [`Source`]: its blocking client on the runtime's blocking pool,
//! each message's samples, deaths, rejects and rebirth into the output.

use crate::source::{Batch, Counter, Run, Source, Stats, Task};

use super::{Counters, Event, MqttSource};

impl Source for MqttSource {
    fn kind(&self) -> &'static str {
        "mqtt"
    }

    fn describe(&self) -> String {
        format!("{} {:?}", self.cfg.url, self.filters())
    }

    fn stats(&self) -> Stats {
        let shared = self.shared.clone();
        Stats::new(move || counters(&shared.lock().unwrap_or_else(|p| p.into_inner())))
    }

    fn run(self: Box<Self>, run: Run) -> Task {
        let mut source = self;
        Box::pin(async move {
            let Run { cancel, out, clock } = run;
            let blocking = tokio::task::spawn_blocking(move || {
                MqttSource::run(&mut source, &|| !cancel.is_cancelled(), &clock, &mut |ev| {
                    if let Event::Message { decoded, .. } = ev {
                        out.push(
                            "mqtt",
                            Batch {
                                samples: decoded.samples,
                                dead: decoded.dead,
                                rejects: decoded.rejects,
                                rebirth: decoded.rebirth,
                            },
                        );
                    }
                });
            });
            if let Err(e) = blocking.await {
                tracing::warn!(error = %e, "the mqtt source ended");
            }
        })
    }
}

/// The source's counters, named as in `/metrics` (without the `powerplane_` prefix).
fn counters(c: &Counters) -> Vec<Counter> {
    let one = |name, value| Counter {
        name,
        labels: Vec::new(),
        value,
    };
    let mut out = vec![
        one("mqtt_messages_total", c.messages),
        one("mqtt_samples_total", c.samples),
        one("mqtt_connects_total", c.connects),
        one("mqtt_disconnects_total", c.disconnects),
    ];
    for (reason, n) in &c.rejects {
        out.push(Counter {
            name: "mqtt_rejected_total",
            labels: vec![("reason", reason.to_string())],
            value: *n,
        });
    }
    for (outcome, n) in [("sent", c.rebirths_sent), ("held", c.rebirths_held)] {
        out.push(Counter {
            name: "mqtt_sparkplug_rebirths_total",
            labels: vec![("outcome", outcome.to_string())],
            value: n,
        });
    }
    out
}
