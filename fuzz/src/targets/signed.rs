//! The signed decoders: the agent's commands (`Core::answer`, what the agent does
//! with a message on its command topic) and the webhook's job events (the signature,
//! the body's parse and the checks the inbox makes before the registry). A mutated
//! body is signed with the project's own signing code, so that it reaches the parser
//! behind the signature; the first byte of an input says how it is sent (0: signed,
//! else as it is, or with junk for a signature).

use std::collections::BTreeMap;

use agent::core::{Core, Rules};
use agent::SimGpus;
use common::rng::Rng;
use integrations::webhook::{JobEvent, WebhookKey};
use integrations::webhook_guard::{check_lengths, check_time, is_stale};
use serde_json::json;
use telemetry::agent_proto::{AckStatus, Action, AllWord, Command, GpuSel, Key, VERSION};
use telemetry::{GpuModel, Job, Timestamp};

use crate::bytes::below;
use crate::corpus::JsonCorpus;
use crate::runner::Target;

const T0: i64 = 1_790_000_000;
const KEY: &str = "8f3c1d2e4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0";

/// An agent of 8 simulated A40s; its state (seen commands, epoch, newest stamp) lives
/// across inputs.
pub struct AgentCommands {
    core: Core,
    key: Key,
    corpus: JsonCorpus,
    n: u64,
}

fn now(n: u64) -> Timestamp {
    Timestamp::from_secs(T0).plus_secs(n as f64 * 0.01)
}

fn core(key: &Key) -> Core {
    let model = GpuModel::builtin("A40").expect("the A40 is built in");
    Core::start(
        Rules::new("n1", key.clone()),
        Box::new(SimGpus::new(8, model, 7)),
        None,
        now(0),
    )
}

/// Seeds: a command of each action, as the controller seals them.
pub fn agent_commands() -> Box<dyn Target> {
    let key = Key::from_text(KEY).expect("key");
    let actions = [
        Action::SetPowerLimit {
            gpus: GpuSel::List(vec![0, 1]),
            watts: Some(200.0),
            percent: None,
        },
        Action::SetPowerLimit {
            gpus: GpuSel::All(AllWord::All),
            watts: None,
            percent: Some(70.0),
        },
        Action::LockSmClocks {
            gpus: GpuSel::List(vec![3]),
            min_mhz: 900.0,
            max_mhz: 1400.0,
        },
        Action::Reset {
            gpus: GpuSel::All(AllWord::All),
        },
    ];
    let seeds = actions
        .into_iter()
        .enumerate()
        .map(|(i, action)| {
            serde_json::to_value(Command {
                v: VERSION,
                id: format!("c{i}"),
                node: "n1".into(),
                issued_at: now(0),
                lease_s: 60.0,
                action,
                epoch: Some(3),
            })
            .expect("a command serializes")
        })
        .collect();
    Box::new(AgentCommands {
        core: core(&key),
        key,
        corpus: JsonCorpus::new(seeds),
        n: 0,
    })
}

impl Target for AgentCommands {
    fn generate(&mut self, rng: &mut Rng) -> Vec<u8> {
        self.n += 1;
        let i = below(rng, self.corpus.len());
        // a fresh id and stamp, so that unmutated fields pass the replay and age checks
        let mut seed = self.corpus.seeds[i].clone();
        seed["id"] = json!(format!("c{}", self.n));
        seed["issued_at"] = json!(now(self.n));
        let body = self.corpus.mutant(rng, i, Some(&seed));
        let mut input = vec![u8::from(below(rng, 10) == 0)];
        input.extend_from_slice(&body);
        input
    }

    fn decode(&mut self, input: &[u8]) -> bool {
        self.n += 1;
        let Some((&how, body)) = input.split_first() else {
            return self.core.answer(input, now(self.n)).is_some();
        };
        let bytes = if how == 0 {
            Command::seal_text(&self.key, &String::from_utf8_lossy(body))
        } else {
            body.to_vec()
        };
        self.core
            .answer(&bytes, now(self.n))
            .is_some_and(|a| a.status != AckStatus::Rejected)
    }
}

/// Webhook job events: signature, parse, lengths, time and staleness checked as the
/// inbox checks them, then applied to the job known so far.
pub struct WebhookEvents {
    key: WebhookKey,
    jobs: BTreeMap<String, Job>,
    corpus: JsonCorpus,
    n: u64,
}

/// Seeds: the events docs/schedulers.md shows, and one with every field.
pub fn webhook_events() -> Box<dyn Target> {
    let seeds = vec![
        json!({"event": "submitted", "scheduler": "lsf", "job": "1234", "gpus": 8,
               "class": "batch", "project": "climate", "user": "ana",
               "est_duration_s": 7200, "deadline": "2026-09-22T06:00:00Z"}),
        json!({"event": "started", "scheduler": "lsf", "job": "1234",
               "time": "2026-09-21T12:00:00Z", "allocated": ["gpu/n1/0", "gpu/n1/1"]}),
        json!({"event": "finished", "scheduler": "lsf", "job": "1234"}),
        json!({"event": "cancelled", "scheduler": "pbs", "job": "j-9"}),
        json!({"event": "submitted", "scheduler": "nomad", "job": "x", "name": "train",
               "priority": -5, "deferrable": true, "preemptible": false}),
    ];
    Box::new(WebhookEvents {
        key: WebhookKey::from_text(KEY).expect("key"),
        jobs: BTreeMap::new(),
        corpus: JsonCorpus::new(seeds),
        n: 0,
    })
}

impl Target for WebhookEvents {
    fn generate(&mut self, rng: &mut Rng) -> Vec<u8> {
        let i = below(rng, self.corpus.len());
        let mut input = vec![below(rng, 12) as u8];
        input.extend_from_slice(&self.corpus.mutant(rng, i, None));
        input
    }

    fn decode(&mut self, input: &[u8]) -> bool {
        self.n += 1;
        let now = Timestamp::parse_rfc3339("2026-09-21T12:00:00Z")
            .expect("time")
            .plus_secs(self.n as f64 * 0.001);
        let (how, body) = input.split_first().map_or((0, input), |(h, b)| (*h, b));
        let ts = (now.as_millis() / 1000).to_string();
        let sig = match how {
            1 => String::from_utf8_lossy(body).chars().take(80).collect(),
            2 => "sha256=00".to_string(),
            _ => self.key.sign(&ts, body),
        };
        let ts = if how == 3 { "12e3".to_string() } else { ts };
        if self
            .key
            .verify(Some(&ts), Some(&sig), body, now, 300.0)
            .is_err()
        {
            return false;
        }
        let Ok(event) = JobEvent::parse(body) else {
            return false;
        };
        if check_lengths(&event).is_err() || check_time(&event, now, 300.0).is_err() {
            return false;
        }
        let id = event.id();
        let at = event
            .time
            .as_deref()
            .and_then(|t| Timestamp::parse_rfc3339(t).ok())
            .unwrap_or(now);
        if let Some(prior) = self.jobs.get(&id) {
            if is_stale(&event, at, prior) {
                return false;
            }
        }
        let job = event.apply(self.jobs.get(&id), &["batch".to_string()], now);
        if self.jobs.len() >= 10_000 {
            self.jobs.clear();
        }
        self.jobs.insert(id, job);
        true
    }
}
