//! `serve`'s agent edge and actuators: the agents' link (commands out; reports and
//! acks in, as a source like the others, see `runtime::sources`) and the actuators
//! the tick hands its desired state to.

use std::path::{Path, PathBuf};
use std::sync::mpsc::RecvTimeoutError;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Result;
use policies::State;
use sources::mqtt::{Link, LinkEvent};
use sources::source::{Batch, Run, Source, Stats, Task};
use telemetry::agent_proto::{Channel, Topics};
use telemetry::{Site, Timestamp};
use tracing::{info, warn};

use crate::config::AgentsSection;
use common::wall_clock;
use control::fleet::{Fleet, FleetConfig};
use control::Actuator;
use runtime::paths::resolve;

/// Caps without `[agents]`: log when the desired caps change, command nothing. (Holds
/// go to the schedulers in `[schedulers]`, which log their own actions.)
#[derive(Debug, Default)]
pub struct ObserveOnly {
    last: State,
}

impl Actuator for ObserveOnly {
    fn apply(&mut self, state: &State, _now: Timestamp) -> Vec<String> {
        let watts = |s: &State| {
            s.caps
                .iter()
                .map(|(g, c)| (g.clone(), c.watts.to_bits()))
                .collect::<Vec<_>>()
        };
        if watts(state) != watts(&self.last) {
            info!(
                caps = state.caps.len(),
                "desired caps changed (no [agents]: nothing commanded)"
            );
        }
        self.last = state.clone();
        Vec::new()
    }
}

/// Actuation through the GPU agents: the plan's caps and clock locks become signed,
/// leased commands (holds go to the schedulers).
pub struct AgentActuator {
    fleet: Arc<Mutex<Fleet>>,
    link: Link,
    status_file: Option<PathBuf>,
    in_sync: Option<usize>,
}

impl Actuator for AgentActuator {
    fn apply(&mut self, state: &State, now: Timestamp) -> Vec<String> {
        let mut errors = Vec::new();
        let mut fleet = self.fleet.lock().unwrap_or_else(|p| p.into_inner());
        for (topic, payload) in fleet.commands(state, now) {
            // never blocks the tick: `try_publish` into the client's bounded queue; a full
            // queue (a broker that does not take them) counts a drop, retried with backoff
            if !self.link.publish(&topic, payload, true, false) {
                errors.push(format!(
                    "{topic}: command not queued (the broker has been unreachable; retried with backoff)"
                ));
            }
        }
        let status = fleet.status();
        if self.in_sync != Some(status.in_sync) {
            info!(
                in_sync = status.in_sync,
                gpus = status.gpus.len(),
                "GPUs running as desired (acknowledged and enforced)"
            );
            self.in_sync = Some(status.in_sync);
        }
        if let Some(path) = &self.status_file {
            let tmp = path.with_extension("tmp");
            let written = serde_json::to_vec_pretty(&status)
                .map_err(std::io::Error::other)
                .and_then(|b| std::fs::write(&tmp, b))
                .and_then(|_| std::fs::rename(&tmp, path));
            if let Err(e) = written {
                warn!(path = %path.display(), error = %e, "cannot write the agents' status file");
            }
        }
        errors
    }
}

/// The actuator for the plan's caps: the agents (with `[agents]`) or observe-only.
pub struct Actuation {
    pub actuator: Box<dyn Actuator>,
    /// The fleet's view, for the API and `/metrics` (with `[agents]`).
    pub fleet: Option<Arc<Mutex<Fleet>>>,
    /// The source that reads the agents' reports and acks.
    pub reports: Option<AgentReports>,
}

/// Opens the agents' link and the source that takes their reports (started with the
/// others); without `[agents]`, caps are observe-only.
pub fn open_agents(agents: Option<AgentsSection>, site: &Site, base: &Path) -> Result<Actuation> {
    let Some(a) = agents else {
        return Ok(Actuation {
            actuator: Box::new(ObserveOnly::default()),
            fleet: None,
            reports: None,
        });
    };
    let key = agent::run::read_key(&resolve(base, &a.key_file))?;
    let topics = Topics::new(&a.topic_prefix);
    let fleet = Arc::new(Mutex::new(Fleet::new(
        site,
        key,
        topics.clone(),
        FleetConfig {
            lease_s: a.lease_s,
            renew_s: a.renew_s,
            retry_s: a.retry_s,
        },
        wall_clock(),
    )));
    let mut mqtt = a.mqtt.clone();
    if mqtt.client_id.is_none() {
        mqtt.client_id = Some(format!("powerplane-controller-{}", std::process::id()));
    }
    let (link, events) = Link::open(
        &mqtt,
        [Channel::Gpus, Channel::Ack, Channel::Health]
            .into_iter()
            .map(|c| topics.all(c))
            .collect(),
        None,
    )?;
    info!(url = %a.mqtt.url, prefix = %a.topic_prefix, lease_s = a.lease_s, "commanding the GPU agents");
    Ok(Actuation {
        actuator: Box::new(AgentActuator {
            fleet: fleet.clone(),
            link,
            status_file: a.status_file.map(|p| resolve(base, &p)),
            in_sync: None,
        }),
        fleet: Some(fleet.clone()),
        reports: Some(AgentReports { fleet, events }),
    })
}

/// The agents' reports (GPU readings, acks, health) as a source: its samples go in
/// with the others' (see `runtime::sources`); the fleet keeps its own counters.
pub struct AgentReports {
    fleet: Arc<Mutex<Fleet>>,
    events: std::sync::mpsc::Receiver<LinkEvent>,
}

impl Source for AgentReports {
    fn kind(&self) -> &'static str {
        "agents"
    }

    fn describe(&self) -> String {
        "the GPU agents' reports".into()
    }

    fn stats(&self) -> Stats {
        // the fleet's counters are on /metrics through the board
        Stats::new(Vec::new)
    }

    fn run(self: Box<Self>, run: Run) -> Task {
        let AgentReports { fleet, events } = *self;
        let Run { cancel, out, clock } = run;
        Box::pin(async move {
            // the link's receiver blocks: on the blocking pool, watching the token
            let read = tokio::task::spawn_blocking(move || {
                while !cancel.is_cancelled() {
                    match events.recv_timeout(Duration::from_millis(100)) {
                        Ok(LinkEvent::Message { topic, payload }) => {
                            let samples = fleet
                                .lock()
                                .unwrap_or_else(|p| p.into_inner())
                                .on_message(&topic, &payload, clock());
                            out.push(
                                "agents",
                                Batch {
                                    samples,
                                    ..Batch::default()
                                },
                            );
                        }
                        Ok(_) | Err(RecvTimeoutError::Timeout) => {}
                        Err(RecvTimeoutError::Disconnected) => break,
                    }
                }
            });
            if let Err(e) = read.await {
                warn!(error = %e, "the agents' reports ended");
            }
        })
    }
}
