//! The GPU node agent and the controller's fleet over a real Mosquitto, with simulated
//! GPUs: plan → signed command → agent applies → ack → published telemetry shows the
//! limit; lease expiry → fail-safe; bad commands rejected over the wire; an agent
//! restart restores the desired state.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Receiver;
use std::sync::Arc;
use std::time::{Duration, Instant};

use orchestrator::agent::run;
use orchestrator::agent::{Shared, SimGpus};
use orchestrator::fleet::{Fleet, FleetConfig};
use policies::plan::Cap;
use policies::State;
use powerplane_tests::mqtt_port;
use sources::mqtt::{Link, LinkEvent, MqttConfig};
use telemetry::agent_proto::{
    Ack, AckStatus, Action, Channel, Command, GpuSel, Health, Key, NodeReport, Topics, VERSION,
};
use telemetry::gpu_backend::GpuBackend;
use telemetry::{GpuModel, Site, Timestamp};

const KEY: &str = "3f6c0a1e9b2d4c8e7f5a6b3c2d1e0f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e";

fn key() -> Key {
    Key::from_text(KEY).expect("key")
}

fn now() -> Timestamp {
    common::wall_clock()
}

fn prefix(test: &str) -> String {
    format!("pptest-{}-{test}/v1", std::process::id())
}

/// A running agent on simulated GPUs that the test can look at.
struct Agent {
    gpus: Shared<SimGpus>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Agent {
    fn start(dir: &Path, node: &str, prefix: &str, extra: &str, gpus: Shared<SimGpus>) -> Agent {
        std::fs::write(dir.join("site.key"), KEY).expect("key");
        let cfg = dir.join("agent.toml");
        std::fs::write(
            &cfg,
            format!(
                "node = \"{node}\"\nkey_file = \"site.key\"\ninterval_s = 0.2\ntopic_prefix = \"{prefix}\"\n{extra}\n[backend]\nkind = \"sim\"\n[mqtt]\nurl = \"mqtt://127.0.0.1:{}\"\nclient_id = \"agent-{node}-{}\"\n",
                mqtt_port(),
                std::process::id()
            ),
        )
        .expect("agent.toml");
        let loaded = run::load(&cfg, false).expect("agent config");
        let stop = Arc::new(AtomicBool::new(false));
        let (s, b) = (stop.clone(), gpus.clone());
        let thread = std::thread::spawn(move || {
            run::run_wall(loaded, Box::new(b), &|| !s.load(Ordering::Relaxed)).expect("agent ran");
        });
        Agent {
            gpus,
            stop,
            thread: Some(thread),
        }
    }

    fn limit(&self, i: u32) -> f64 {
        self.gpus.lock().read(i).expect("read").power_limit_w
    }

    fn stop(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            t.join().expect("agent thread");
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn sim(n: u32) -> Shared<SimGpus> {
    let mut s = SimGpus::new(n, GpuModel::builtin("A40").expect("a40"), 5);
    for i in 0..n {
        s.set_load(i, 1.0);
    }
    Shared::new(s)
}

/// A client on the test's prefix: publishes, and waits for what arrives.
struct Wire {
    link: Link,
    events: Receiver<LinkEvent>,
    topics: Topics,
}

impl Wire {
    fn open(prefix: &str) -> Wire {
        let topics = Topics::new(prefix);
        let mut cfg = MqttConfig::new(&format!("mqtt://127.0.0.1:{}", mqtt_port()));
        cfg.client_id = Some(format!("wire-{}-{prefix}", std::process::id()));
        let (link, events) =
            Link::open(&cfg, vec![format!("{prefix}/nodes/#")], None).expect("link");
        let w = Wire {
            link,
            events,
            topics,
        };
        w.wait("the connection", Duration::from_secs(10), |e| {
            matches!(e, LinkEvent::Connected).then_some(())
        });
        w
    }

    fn wait<T>(
        &self,
        what: &str,
        within: Duration,
        mut f: impl FnMut(&LinkEvent) -> Option<T>,
    ) -> T {
        let end = Instant::now() + within;
        while Instant::now() < end {
            if let Ok(e) = self.events.recv_timeout(Duration::from_millis(50)) {
                if let Some(t) = f(&e) {
                    return t;
                }
            }
        }
        panic!(
            "waited {within:?} for {what}: it never came (is mosquitto running on port {}?)",
            mqtt_port()
        );
    }

    fn on<T>(
        &self,
        node: &str,
        ch: Channel,
        what: &str,
        within: Duration,
        mut f: impl FnMut(&[u8]) -> Option<T>,
    ) -> T {
        let topic = self.topics.topic(node, ch);
        self.wait(what, within, |e| match e {
            LinkEvent::Message { topic: t, payload } if *t == topic => f(payload),
            _ => None,
        })
    }

    /// Waits for the agent's `online` health.
    fn online(&self, node: &str) {
        self.on(
            node,
            Channel::Health,
            "the agent online",
            Duration::from_secs(10),
            |b| {
                serde_json::from_slice::<Health>(b)
                    .ok()
                    .filter(|h| h.status == "online")
            },
        );
    }

    fn send(&self, node: &str, payload: Vec<u8>) {
        assert!(self
            .link
            .publish(&self.topics.topic(node, Channel::Cmd), payload, true, false));
    }

    fn ack(&self, node: &str, id: &str) -> Ack {
        self.on(
            node,
            Channel::Ack,
            &format!("the ack of {id}"),
            Duration::from_secs(10),
            |p| {
                Ack::open(&key(), p)
                    .ok()
                    .filter(|a| a.id.as_deref() == Some(id))
            },
        )
    }
}

fn command(node: &str, id: &str, lease_s: f64, action: Action) -> Command {
    Command {
        v: VERSION,
        id: id.into(),
        node: node.into(),
        issued_at: now(),
        lease_s,
        action,
        epoch: None,
    }
}

fn set(gpus: Vec<u32>, watts: f64) -> Action {
    Action::SetPowerLimit {
        gpus: GpuSel::List(gpus),
        watts: Some(watts),
        percent: None,
    }
}

const SITE: &str = r#"
version = 1
[site]
name = "t"
[[feeds]]
id = "f"
rating_kw = 30
[[cooling]]
id = "c"
capacity_kw = 30
racks = ["r1"]
[[rooms]]
id = "h"
[[rows]]
id = "w"
room = "h"
[[racks]]
id = "r1"
row = "w"
power_budget_kw = 20
nodes = 1
gpus_per_node = 4
gpu_model = "A40"
"#;

#[test]
fn a_planned_cap_reaches_the_gpu_is_acknowledged_and_shows_in_the_telemetry() {
    let p = prefix("e2e");
    let site = Site::parse("t.toml", SITE).expect("site");
    let node = site.gpus()[0].node.id.clone();
    let dir = tempfile::tempdir().expect("tmp");
    let wire = Wire::open(&p);
    let agent = Agent::start(dir.path(), &node, &p, "", sim(4));
    wire.online(&node);

    // the controller's side, as serve runs it
    let mut fleet = Fleet::new(&site, key(), Topics::new(&p), FleetConfig::default(), now());
    let mut state = State::default();
    for g in site.gpus().iter().take(2) {
        state.caps.insert(
            g.id.clone().into_owned(),
            Cap {
                watts: 175.0,
                rule: "budget.rack".into(),
                since: now(),
                lease_until: now().plus_secs(300.0),
            },
        );
    }
    for (topic, payload) in fleet.commands(&state, now()) {
        assert!(wire.link.publish(&topic, payload, true, false));
    }
    // acks and reports flow back into the fleet until every GPU is in sync
    let end = Instant::now() + Duration::from_secs(10);
    let mut samples = Vec::new();
    while fleet.status().in_sync < 4 {
        assert!(
            Instant::now() < end,
            "not in sync: {}",
            serde_json::to_string_pretty(&fleet.status()).unwrap_or_default()
        );
        if let Ok(LinkEvent::Message { topic, payload }) =
            wire.events.recv_timeout(Duration::from_millis(50))
        {
            samples.extend(fleet.on_message(&topic, &payload, now()));
        }
    }
    assert_eq!(
        (agent.limit(0), agent.limit(1), agent.limit(2)),
        (175.0, 175.0, 300.0)
    );
    let books: Vec<_> = fleet.books().collect();
    assert_eq!(books[0].applied_w, Some(175.0));
    assert_eq!(books[0].enforced_w, Some(175.0));
    assert_eq!(books[2].enforced_w, Some(300.0));
    assert!(
        samples.iter().any(|s| s.entity == *site.gpus()[0].id
            && s.metric.as_str() == "power_w"
            && s.value <= 175.0),
        "the capped GPU's power arrives as a sample"
    );

    // the published telemetry shows the limit, the desired state and its lease
    let r: NodeReport = wire.on(
        &node,
        Channel::Gpus,
        "a report",
        Duration::from_secs(5),
        |b| serde_json::from_slice(b).ok(),
    );
    assert_eq!(r.gpus[0].reading.power_limit_w, 175.0);
    assert!(r.gpus[0].reading.power_w <= 175.0);
    assert!(
        matches!(r.gpus[0].desired, Some(telemetry::agent_proto::Desired::Limit { watts, .. }) if watts == 175.0)
    );
    agent.stop();
    // on_exit = restore_default (the default)
    let last: Health = wire.on(
        &node,
        Channel::Health,
        "the agent stopped",
        Duration::from_secs(5),
        |b| {
            serde_json::from_slice::<Health>(b)
                .ok()
                .filter(|h| h.status == "stopped")
        },
    );
    assert!(last.detail.unwrap_or_default().contains("restore_default"));
}

#[test]
fn a_lease_that_is_not_renewed_ends_in_the_fail_safe() {
    let p = prefix("lease");
    let dir = tempfile::tempdir().expect("tmp");
    let wire = Wire::open(&p);
    let agent = Agent::start(
        dir.path(),
        "n-lease",
        &p,
        "fail_safe = \"cap\"\nfail_safe_cap_w = 150",
        sim(2),
    );
    wire.online("n-lease");
    let c = command("n-lease", "lease-1", 2.0, set(vec![0, 1], 250.0));
    wire.send("n-lease", c.seal(&key()));
    assert_eq!(wire.ack("n-lease", "lease-1").status, AckStatus::Applied);
    assert_eq!(agent.limit(0), 250.0);
    // the controller goes silent: after 2 s the agent caps at 150 W and says so
    let h: Health = wire.on(
        "n-lease",
        Channel::Health,
        "the fail-safe",
        Duration::from_secs(10),
        |b| {
            serde_json::from_slice::<Health>(b)
                .ok()
                .filter(|h| h.fail_safe_gpus == vec![0, 1])
        },
    );
    assert_eq!(h.status, "degraded");
    assert_eq!(h.fail_safe.as_deref(), Some("cap"));
    assert_eq!((agent.limit(0), agent.limit(1)), (150.0, 150.0));
    agent.stop();
}

#[test]
fn unsigned_forged_and_malformed_commands_get_no_answer_replayed_expired_and_absurd_ones_are_rejected(
) {
    let p = prefix("reject");
    let dir = tempfile::tempdir().expect("tmp");
    let wire = Wire::open(&p);
    let agent = Agent::start(dir.path(), "n-rej", &p, "", sim(2));
    wire.online("n-rej");
    let good = command("n-rej", "ok-1", 60.0, set(vec![0], 200.0));
    wire.send("n-rej", good.seal(&key()));
    assert_eq!(wire.ack("n-rej", "ok-1").status, AckStatus::Applied);

    let forged = command("n-rej", "forged", 60.0, set(vec![0], 100.0));
    let mut expired = command("n-rej", "old", 60.0, set(vec![0], 100.0));
    expired.issued_at = now().plus_secs(-3600.0);
    // a message that fails its signature check gets no answer at all
    let unauthenticated: Vec<(&str, Vec<u8>)> = vec![
        (
            "bad_signature",
            forged.seal(&Key::from_text("somebody else's key, long enough").expect("key")),
        ),
        (
            "unsigned",
            format!(
                "{{\"body\":{}}}",
                serde_json::to_string(&command("n-rej", "unsigned", 60.0, set(vec![0], 100.0)))
                    .expect("json")
            )
            .into_bytes(),
        ),
        ("malformed", b"\xff not json".to_vec()),
    ];
    for (_, bytes) in &unauthenticated {
        wire.send("n-rej", bytes.clone());
    }
    // authentic commands are answered, rejected ones with their id and reason
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("ok-1", good.seal(&key()), "replayed"),
        ("old", expired.seal(&key()), "expired"),
        (
            "absurd",
            command("n-rej", "absurd", 60.0, set(vec![0], 1e7)).seal(&key()),
            "out_of_range",
        ),
    ];
    let mut unanswered = 0;
    for (id, bytes, reason) in cases {
        wire.send("n-rej", bytes);
        let ack = wire.on(
            "n-rej",
            Channel::Ack,
            reason,
            Duration::from_secs(10),
            |p| {
                let a = Ack::open(&key(), p).ok()?;
                if a.id.is_none() {
                    unanswered += 1;
                }
                (a.reason.as_deref() == Some(reason) && a.id.as_deref() == Some(id)).then_some(a)
            },
        );
        assert_eq!(ack.status, AckStatus::Rejected, "{id}");
    }
    assert_eq!(
        unanswered, 0,
        "an unauthenticated message was answered (acks without an id)"
    );
    // each is counted, as the agent's health shows
    let h: Health = wire.on(
        "n-rej",
        Channel::Health,
        "the health with the refusals counted",
        Duration::from_secs(20),
        |b| {
            serde_json::from_slice::<Health>(b)
                .ok()
                .filter(|h| h.counters.get("commands_unanswered").copied().unwrap_or(0) >= 3)
        },
    );
    for (reason, _) in &unauthenticated {
        assert_eq!(
            h.counters.get(&format!("rejected_{reason}")).copied(),
            Some(1),
            "{reason}: {:?}",
            h.counters
        );
    }
    assert_eq!(agent.limit(0), 200.0, "nothing rejected changed the GPU");
    agent.stop();
}

#[test]
fn a_restarted_agent_restores_the_desired_state_without_waiting_for_the_controller() {
    let p = prefix("restart");
    let dir = tempfile::tempdir().expect("tmp");
    let wire = Wire::open(&p);
    let extra = "state_file = \"agent-state.json\"\non_exit = \"keep\"";
    let agent = Agent::start(dir.path(), "n-rs", &p, extra, sim(2));
    wire.online("n-rs");
    wire.send(
        "n-rs",
        command("n-rs", "rs-1", 120.0, set(vec![1], 160.0)).seal(&key()),
    );
    assert_eq!(wire.ack("n-rs", "rs-1").status, AckStatus::Applied);
    agent.stop();

    // the node rebooted: its GPUs are back at their default limit
    let rebooted = sim(2);
    assert_eq!(rebooted.lock().read(1).expect("read").power_limit_w, 300.0);
    let agent = Agent::start(dir.path(), "n-rs", &p, extra, rebooted);
    let r: NodeReport = wire.on(
        "n-rs",
        Channel::Gpus,
        "a report after the restart",
        Duration::from_secs(10),
        |b| serde_json::from_slice(b).ok(),
    );
    assert_eq!(r.gpus[1].reading.power_limit_w, 160.0);
    assert_eq!(r.gpus[0].reading.power_limit_w, 300.0);
    agent.stop();
}
