//! Three `powerplane serve` replicas with `[ha]` on the test's own `redis-server`
//! (never the shared one), eight simulated GPU agents (`powerplane agent`, sim backend)
//! on the shared Mosquitto under a topic prefix of their own, a webhook receiver, and a
//! price step that holds a job and then releases it.
//!
//! - `kill -9` of the leader five times in a row: each time a new leader with a larger
//!   epoch, never two at once (every replica's `/metrics` sampled every 100 ms), no
//!   agent in its fail-safe, the receiver sees the hold and the release once each.
//! - A leader paused with SIGSTOP until another took over, then resumed: it does not
//!   act again (no agent applies a command of its epoch after the take-over, none of
//!   its audit entries lands after it).
//! - Redis restarted: no replica leads while the lease cannot be read; one leads again
//!   once Redis is back; the agents' leases hold throughout.

mod common;

#[path = "../../tests/src/redis_server.rs"]
#[allow(dead_code)]
mod redis_server;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{free_port, http, role, VIEWER};
use redis_server::RedisServer;

const OPERATOR: &str = "operator-token-0123456789abcdef";
const ADMIN: &str = "admin-token-0123456789abcdef0";
const WEBHOOK_KEY: &str = "8f3c1d2e4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0";
/// `[ha] lease_s`.
const LEASE_S: f64 = 5.0;
const TICK_S: f64 = 0.5;

fn powerplane() -> Command {
    Command::new(env!("CARGO_BIN_EXE_powerplane"))
}

fn mqtt_port() -> u16 {
    std::env::var("POWERPLANE_TEST_MQTT_PORT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(1883)
}

/// A child process killed (SIGKILL) when dropped.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn signal(pid: u32, sig: &str) {
    let ok = Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .expect("kill");
    assert!(ok.success(), "kill {sig} {pid}");
}

/// The test's world: where the files are and the ports.
struct Rig {
    dir: tempfile::TempDir,
    redis: RedisServer,
    prefix: String,
    ports: Vec<u16>,
    receiver_port: u16,
    nodes: Vec<String>,
    agents: Vec<Proc>,
}

impl Rig {
    fn new(replicas: usize, agents: usize, cheap_in_s: i64) -> Rig {
        let dir = tempfile::tempdir().expect("tmp");
        let d = dir.path();
        let redis = RedisServer::start();
        let prefix = format!("pptest-ha-{}-{}", std::process::id(), free_port());
        common::write_site_and_deferral_policy(d);
        // a hold lease well beyond the test, so that a hold is sent once (not renewed)
        let policy = std::fs::read_to_string(d.join("policy.toml")).expect("policy");
        std::fs::write(
            d.join("policy.toml"),
            policy.replace("lease_s = 120", "lease_s = 1800"),
        )
        .expect("policy");
        common::write_price_step(d, cheap_in_s);
        std::fs::write(d.join("webhook.key"), format!("{WEBHOOK_KEY}\n")).expect("key");
        std::fs::write(d.join("site.key"), "9e".repeat(32)).expect("key");
        let private = std::os::unix::fs::PermissionsExt::from_mode(0o600);
        std::fs::set_permissions(d.join("site.key"), private).expect("chmod");
        let site_text = std::fs::read_to_string(d.join("site.toml")).expect("site");
        let site = telemetry::Site::parse("site.toml", &site_text).expect("site");
        let nodes: Vec<String> = site
            .nodes
            .iter()
            .take(agents)
            .map(|n| n.id.clone())
            .collect();
        let mut rig = Rig {
            ports: (0..replicas).map(|_| free_port()).collect(),
            receiver_port: free_port(),
            dir,
            redis,
            prefix,
            nodes,
            agents: Vec::new(),
        };
        for i in 0..replicas {
            rig.write_replica(i);
        }
        for n in rig.nodes.clone() {
            rig.agents.push(rig.agent(&n));
        }
        rig
    }

    fn d(&self) -> &Path {
        self.dir.path()
    }

    fn config(&self, i: usize) -> PathBuf {
        self.d().join(format!("r{i}")).join("powerplane.toml")
    }

    fn write_replica(&self, i: usize) {
        let d = self.d();
        let r = d.join(format!("r{i}"));
        std::fs::create_dir_all(&r).expect("replica dir");
        let (port, rport, mqtt, url) = (
            self.ports[i],
            self.receiver_port,
            mqtt_port(),
            self.redis.url(),
        );
        let p = |f: &str| d.join(f).display().to_string();
        let prefix = &self.prefix;
        std::fs::write(
            r.join("powerplane.toml"),
            format!(
                r#"[controller]
site = "{site}"
policy = "{policy}"
tick_s = {TICK_S}
policy_reload_s = 0
[store]
kind = "redis"
url = "{url}"
prefix = "{prefix}"
journal = "journal.redb"
timeout_s = 2
[ha]
enabled = true
lease_s = {LEASE_S}
renew_s = 1
instance = "r{i}"
[prices]
file = "{prices}"
[http]
listen = "127.0.0.1:{port}"
metrics_public = true
[[http.tokens]]
name = "v"
role = "viewer"
token = "{VIEWER}"
[[http.tokens]]
name = "o"
role = "operator"
token = "{OPERATOR}"
[[http.tokens]]
name = "a"
role = "admin"
token = "{ADMIN}"
[agents]
key_file = "{key}"
lease_s = 20
renew_s = 2
retry_s = 1
topic_prefix = "{prefix}/v1"
[agents.mqtt]
url = "mqtt://127.0.0.1:{mqtt}"
client_id = "{prefix}-r{i}"
[schedulers.webhook]
key_file = "{wkey}"
url = "http://127.0.0.1:{rport}/hook"
backoff_s = 0.5
max_backoff_s = 2
"#,
                site = p("site.toml"),
                policy = p("policy.toml"),
                prices = p("prices.csv"),
                key = p("site.key"),
                wkey = p("webhook.key"),
            ),
        )
        .expect("config");
    }

    fn agent(&self, node: &str) -> Proc {
        let d = self.d();
        let cfg = d.join(format!("agent-{node}.toml"));
        std::fs::write(
            &cfg,
            format!(
                "node = \"{node}\"\nkey_file = \"site.key\"\ninterval_s = 0.5\ntopic_prefix = \"{}/v1\"\nstate_file = \"agent-{node}.state\"\n[backend]\nkind = \"sim\"\ngpus = 8\n[mqtt]\nurl = \"mqtt://127.0.0.1:{}\"\n",
                self.prefix,
                mqtt_port()
            ),
        )
        .expect("agent config");
        let log = std::fs::File::create(d.join(format!("agent-{node}.log"))).expect("log");
        Proc(
            powerplane()
                .args(["agent", "--config"])
                .arg(&cfg)
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .expect("agent"),
        )
    }

    fn agent_logs(&self) -> String {
        self.nodes
            .iter()
            .map(|n| {
                std::fs::read_to_string(self.d().join(format!("agent-{n}.log"))).unwrap_or_default()
            })
            .collect()
    }

    fn serve(&self, i: usize) -> Proc {
        let cfg = self.config(i);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(cfg.with_extension("log"))
            .expect("serve log");
        Proc(
            powerplane()
                .args(["serve", "--run-for-s", "900", "--config"])
                .arg(&cfg)
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .expect("serve"),
        )
    }

    fn serve_logs(&self) -> String {
        (0..self.ports.len())
            .map(|i| {
                format!(
                    "--- r{i} ---\n{}",
                    std::fs::read_to_string(self.config(i).with_extension("log"))
                        .unwrap_or_default()
                )
            })
            .collect()
    }
}

/// Samples every replica's role every 100 ms; keeps the largest number of leaders seen
/// at once.
struct Sampler {
    stop: Arc<AtomicBool>,
    most: Arc<Mutex<(usize, String)>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Sampler {
    fn start(ports: Vec<u16>) -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let most = Arc::new(Mutex::new((0usize, String::new())));
        let (s, m) = (stop.clone(), most.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                let seen: Vec<(usize, u64)> = ports
                    .iter()
                    .enumerate()
                    .filter_map(|(i, p)| role(*p).filter(|r| r.0).map(|r| (i, r.1)))
                    .collect();
                let mut g = m.lock().expect("lock");
                if seen.len() > g.0 {
                    *g = (seen.len(), format!("{seen:?}"));
                }
                drop(g);
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        Sampler {
            stop,
            most,
            thread: Some(thread),
        }
    }

    fn most(&mut self) -> (usize, String) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.most.lock().expect("lock").clone()
    }
}

/// The replica that leads (index, epoch), waiting up to `within` for one with an epoch
/// above `above`.
fn leader_after(rig: &Rig, above: u64, within: Duration) -> (usize, u64, Duration) {
    let t = Instant::now();
    loop {
        for (i, p) in rig.ports.iter().enumerate() {
            if let Some((true, e)) = role(*p) {
                if e > above {
                    return (i, e, t.elapsed());
                }
            }
        }
        assert!(
            t.elapsed() < within,
            "no leader with an epoch above {above} within {within:?}; logs:\n{}",
            rig.serve_logs()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The receiver: (idempotency key, body) of every POST.
type Got = Arc<Mutex<Vec<(String, String)>>>;

fn receiver(port: u16) -> Got {
    let got: Got = Arc::default();
    let server = tiny_http::Server::http(("127.0.0.1", port)).expect("receiver");
    let sink = got.clone();
    std::thread::spawn(move || {
        for mut req in server.incoming_requests() {
            let key = req
                .headers()
                .iter()
                .find(|x| x.field.equiv("Idempotency-Key"))
                .map(|x| x.value.as_str().to_string())
                .unwrap_or_default();
            let mut body = String::new();
            let _ = std::io::Read::read_to_string(req.as_reader(), &mut body);
            sink.lock().expect("lock").push((key, body));
            let _ = req.respond(tiny_http::Response::from_string("ok"));
        }
    });
    got
}

/// (job, action) → the distinct idempotency keys the receiver saw for it.
fn actions(
    got: &Got,
) -> std::collections::BTreeMap<(String, String), std::collections::BTreeSet<String>> {
    let mut out: std::collections::BTreeMap<_, std::collections::BTreeSet<String>> =
        Default::default();
    for (key, body) in got.lock().expect("lock").iter() {
        let v: serde_json::Value = serde_json::from_str(body).expect("json body");
        assert!(
            v["epoch"].as_u64().is_some(),
            "an action without its epoch: {body}"
        );
        out.entry((
            v["job"].as_str().unwrap_or("").to_string(),
            v["action"].as_str().unwrap_or("").to_string(),
        ))
        .or_default()
        .insert(key.clone());
    }
    out
}

fn submit(port: u16, job: &str) -> u16 {
    let far = (chrono::Utc::now() + chrono::Duration::hours(6)).to_rfc3339();
    let body = format!(
        r#"{{"event":"submitted","scheduler":"lsf","job":"{job}","class":"batch","project":"p","user":"u","gpus":2,"deadline":"{far}","est_duration_s":600}}"#
    );
    // a leader that has not yet taken over (restored, schedulers open) answers 503:
    // resend, as a scheduler's hook does
    let t = Instant::now();
    loop {
        let code = http(
            port,
            "POST",
            "/api/v1/events",
            Some(OPERATOR),
            body.as_bytes(),
        )
        .0;
        if code != 503 || t.elapsed() > Duration::from_secs(30) {
            return code;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn five_leader_kills_one_leader_at_a_time_no_fail_safe_each_action_once() {
    // the price falls after the five failovers
    let rig = Rig::new(3, 8, 110);
    let cheap_at = chrono::Utc::now() + chrono::Duration::seconds(110);
    let got = receiver(rig.receiver_port);
    let mut serves: Vec<Option<Proc>> = (0..3).map(|i| Some(rig.serve(i))).collect();
    let mut sampler = Sampler::start(rig.ports.clone());
    let (mut leader, mut epoch, _) = leader_after(&rig, 0, Duration::from_secs(60));
    // the leader can be elected before the other replicas listen (a loaded machine)
    wait_until(
        "every replica answers",
        Duration::from_secs(60),
        &rig,
        || rig.ports.iter().all(|p| role(*p).is_some()),
    );
    // a follower refuses writes, naming the leader
    let follower = (leader + 1) % 3;
    let (code, _, body) = http(
        rig.ports[follower],
        "POST",
        "/api/v1/events",
        Some(OPERATOR),
        b"{}",
    );
    assert_eq!(code, 503, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).expect("json");
    assert_eq!(v["leader"], format!("r{leader}"), "{body}");
    let (code, _, body) = http(
        rig.ports[follower],
        "GET",
        "/api/v1/status",
        Some(VIEWER),
        b"",
    );
    assert_eq!(code, 200);
    let st: serde_json::Value = serde_json::from_str(&body).expect("status");
    assert_eq!(st["ha"]["role"], "follower", "{st}");
    assert_eq!(st["ha"]["leader"], format!("r{leader}"), "{st}");
    // the job is held through the leader
    assert_eq!(submit(rig.ports[leader], "a"), 202, "{}", rig.serve_logs());
    let t = Instant::now();
    while !actions(&got).contains_key(&("lsf:a".into(), "hold".into())) {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "no hold; logs:\n{}",
            rig.serve_logs()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let mut failovers = Vec::new();
    for round in 0..5 {
        // let the agents hear from the leader before it dies
        std::thread::sleep(Duration::from_secs(3));
        // kill -9 the leader (dropping it), then wait for the next one
        drop(serves[leader].take());
        let (next, next_epoch, took) = leader_after(&rig, epoch, Duration::from_secs(30));
        assert_ne!(next, leader, "round {round}");
        assert!(
            next_epoch > epoch,
            "round {round}: epoch {next_epoch} after {epoch}"
        );
        failovers.push(took);
        serves[leader] = Some(rig.serve(leader));
        leader = next;
        epoch = next_epoch;
    }
    // the release, once the price fell
    let t = Instant::now();
    while !actions(&got).contains_key(&("lsf:a".into(), "release".into())) {
        assert!(
            t.elapsed() < Duration::from_secs(90),
            "no release; logs:\n{}",
            rig.serve_logs()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(
        chrono::Utc::now() >= cheap_at,
        "released before the price fell"
    );
    std::thread::sleep(Duration::from_secs(2));
    let (most, when) = sampler.most();
    assert_eq!(most, 1, "two leaders at once: {when}");
    let seen = actions(&got);
    let summary: Vec<_> = seen.iter().map(|(k, ids)| (k.clone(), ids.len())).collect();
    assert_eq!(
        summary,
        vec![
            (("lsf:a".to_string(), "hold".to_string()), 1),
            (("lsf:a".to_string(), "release".to_string()), 1)
        ],
        "each action once: {seen:?}"
    );
    let agents = rig.agent_logs();
    let lapsed: Vec<&str> = agents
        .lines()
        .filter(|l| l.contains("the fail-safe is in force"))
        .collect();
    assert!(
        lapsed.is_empty(),
        "an agent's lease lapsed during a failover (failovers {failovers:?}):\n{}\nserve warnings:\n{}",
        lapsed.join("\n"),
        rig.serve_logs()
            .lines()
            .filter(|l| l.contains("WARN") || l.contains("leader") || l.starts_with("---"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    let worst = failovers.iter().max().copied().unwrap_or_default();
    eprintln!("failovers: {failovers:?}");
    // goal: lease_s plus one tick; bound: generous on a loaded machine
    assert!(
        worst < Duration::from_secs_f64(LEASE_S * 3.0),
        "a failover took {worst:?}: {failovers:?}"
    );
}

/// Lines of the agents' logs that say a command of `epoch` was applied.
fn applied_of(rig: &Rig, epoch: u64) -> usize {
    rig.agent_logs()
        .lines()
        .filter(|l| l.contains(&format!("epoch=Some({epoch})")) && l.contains(" command"))
        .count()
}

/// When each command the agents applied under `epoch` was issued (the controller's
/// stamp, from the agent's log line), with the line.
fn issued_under(rig: &Rig, epoch: u64) -> Vec<(chrono::DateTime<chrono::Utc>, String)> {
    rig.agent_logs()
        .lines()
        .filter(|l| l.contains(&format!("epoch=Some({epoch})")) && l.contains(" command"))
        .map(|l| {
            let stamp = l
                .split_whitespace()
                .find_map(|w| w.strip_prefix("issued_at="))
                .unwrap_or_else(|| panic!("no issued_at in the agent's line {l}"));
            let issued = chrono::DateTime::parse_from_rfc3339(stamp)
                .unwrap_or_else(|e| panic!("issued_at {stamp}: {e}"))
                .with_timezone(&chrono::Utc);
            (issued, l.to_string())
        })
        .collect()
}

/// Audit entries in Redis that name `epoch`.
fn audited_under(rig: &Rig, epoch: u64) -> usize {
    use integrations::store::Backend;
    let mut redis =
        integrations::store::redis::RedisBackend::connect(&rig.redis.url(), &rig.prefix)
            .expect("connect to the test redis");
    let entries = redis.read_log("audit", 1, 1_000_000).expect("audit log");
    entries
        .iter()
        .filter_map(|(_, e)| serde_json::from_slice::<serde_json::Value>(e).ok())
        .filter(|v| v["epoch"].as_u64() == Some(epoch))
        .count()
}

fn wait_until(what: &str, within: Duration, rig: &Rig, ok: impl Fn() -> bool) {
    let t = Instant::now();
    while !ok() {
        assert!(
            t.elapsed() < within,
            "{what} within {within:?}; logs:\n{}",
            rig.serve_logs()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_leader_paused_until_another_took_over_does_nothing_when_it_resumes() {
    let rig = Rig::new(2, 2, 3600);
    let _receiver = receiver(rig.receiver_port);
    let serves: Vec<Proc> = (0..2).map(|i| rig.serve(i)).collect();
    let (old, e1, _) = leader_after(&rig, 0, Duration::from_secs(60));
    // a held job: the leader audits its decision under its epoch
    assert_eq!(submit(rig.ports[old], "p"), 202, "{}", rig.serve_logs());
    wait_until(
        "the agents commanded under the first epoch",
        Duration::from_secs(30),
        &rig,
        || applied_of(&rig, e1) >= rig.nodes.len(),
    );
    wait_until("the hold audited", Duration::from_secs(30), &rig, || {
        audited_under(&rig, e1) > 0
    });
    let pid = serves[old].0.id();
    signal(pid, "-STOP");
    let (next, e2, _) = leader_after(&rig, e1, Duration::from_secs(30));
    assert_ne!(next, old);
    wait_until(
        "the agents commanded under the new epoch",
        Duration::from_secs(30),
        &rig,
        || applied_of(&rig, e2) >= rig.nodes.len(),
    );
    let (applied, audited) = (applied_of(&rig, e1), audited_under(&rig, e1));
    signal(pid, "-CONT");
    // the resumed replica finds itself deposed and does nothing
    wait_until(
        "the resumed replica a follower",
        Duration::from_secs(20),
        &rig,
        || role(rig.ports[old]) == Some((false, e2)),
    );
    std::thread::sleep(Duration::from_secs(5));
    assert_eq!(
        applied_of(&rig, e1),
        applied,
        "an agent applied a command of the deposed leader"
    );
    assert_eq!(
        audited_under(&rig, e1),
        audited,
        "a commit of the deposed leader landed"
    );
    assert_eq!(role(rig.ports[next]), Some((true, e2)));
    let logs = rig.serve_logs();
    assert!(logs.contains("not the leader"), "{logs}");
    assert!(
        !rig.agent_logs().contains("the fail-safe is in force"),
        "{}",
        rig.agent_logs()
    );
}

#[test]
fn with_redis_down_no_replica_leads_and_one_leads_again_once_it_is_back() {
    let mut rig = Rig::new(2, 2, 3600);
    let _serves: Vec<Proc> = (0..2).map(|i| rig.serve(i)).collect();
    let (_, e1, _) = leader_after(&rig, 0, Duration::from_secs(60));
    wait_until(
        "the agents commanded",
        Duration::from_secs(30),
        &rig,
        || applied_of(&rig, e1) >= rig.nodes.len(),
    );
    rig.redis.kill9();
    let down = Instant::now();
    // within a renewal and a deadline, nobody leads
    wait_until(
        "no leader while Redis is down",
        Duration::from_secs_f64(LEASE_S),
        &rig,
        || rig.ports.iter().all(|p| role(*p).is_some_and(|r| !r.0)),
    );
    // every replica has stepped down by now: a command applied from here on under
    // the old epoch may only be one already on its way, issued before this instant
    let stepped_down = chrono::Utc::now();
    let applied = applied_of(&rig, e1);
    let mut sampler = Sampler::start(rig.ports.clone());
    std::thread::sleep(Duration::from_secs(6));
    let (most, when) = sampler.most();
    assert_eq!(most, 0, "a replica led with Redis down: {when}");
    let late: Vec<String> = issued_under(&rig, e1)
        .into_iter()
        .filter(|(issued, _)| *issued > stepped_down)
        .map(|(_, line)| line)
        .collect();
    assert!(
        late.is_empty(),
        "a command was issued while the lease could not be read (no leader since {stepped_down}): {late:#?}"
    );
    rig.redis.restart();
    let (_, e2, _) = leader_after(&rig, 0, Duration::from_secs(30));
    assert!(
        e2 >= e1,
        "epoch {e2} after {e1} (the AOF keeps the counter)"
    );
    eprintln!("redis down for {:?}", down.elapsed());
    wait_until(
        "the agents commanded again",
        Duration::from_secs(30),
        &rig,
        || {
            rig.agent_logs()
                .lines()
                .filter(|l| l.contains(" command"))
                .count()
                > applied
        },
    );
    assert!(
        !rig.agent_logs().contains("the fail-safe is in force"),
        "the caps lapsed during the outage:\n{}",
        rig.agent_logs()
    );
}

#[test]
fn a_second_serve_on_the_same_embedded_store_refuses_to_start() {
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path();
    common::write_site_and_deferral_policy(d);
    let port = free_port();
    std::fs::write(
        d.join("powerplane.toml"),
        format!("[controller]\nsite = \"site.toml\"\npolicy = \"policy.toml\"\ntick_s = 0.5\n[store]\nkind = \"embedded\"\npath = \"state.redb\"\n[http]\nlisten = \"127.0.0.1:{port}\"\nmetrics_public = true\n[[http.tokens]]\nname = \"v\"\nrole = \"viewer\"\ntoken = \"{VIEWER}\"\n"),
    )
    .expect("config");
    let config = d.join("powerplane.toml");
    let _first = Proc(
        powerplane()
            .args(["serve", "--run-for-s", "60", "--config"])
            .arg(&config)
            .stderr(Stdio::null())
            .spawn()
            .expect("serve"),
    );
    let t = Instant::now();
    while role(port).is_none() {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "the first serve never answered"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let second = powerplane()
        .args(["serve", "--run-for-s", "5", "--config"])
        .arg(&config)
        .output()
        .expect("serve");
    assert!(
        !second.status.success(),
        "a second controller on one redb file started"
    );
    let err = String::from_utf8_lossy(&second.stderr);
    assert!(err.contains("already open in another process"), "{err}");
    assert!(err.contains("kind = \"redis\""), "{err}");
    // the first one still leads, alone
    assert_eq!(role(port), Some((true, 0)));
}

#[test]
fn a_redis_stall_longer_than_the_lease_loses_no_event_answered_202() {
    let rig = Rig::new(3, 2, 3600);
    let _receiver = receiver(rig.receiver_port);
    let _serves: Vec<Proc> = (0..3).map(|i| rig.serve(i)).collect();
    let (_, e1, _) = leader_after(&rig, 0, Duration::from_secs(60));
    wait_until(
        "every replica answers",
        Duration::from_secs(60),
        &rig,
        || rig.ports.iter().all(|p| role(*p).is_some()),
    );
    // a scheduler sends a job every 150 ms, each until one replica answers 202
    let stop = Arc::new(AtomicBool::new(false));
    let sender = {
        let (ports, stop) = (rig.ports.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut accepted = Vec::new();
            let mut unanswered = Vec::new();
            for n in 0.. {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let job = format!("stall-{n}");
                match common::send_until_accepted(&ports, OPERATOR, &job, Duration::from_secs(90)) {
                    Some(id) => accepted.push(id),
                    None => unanswered.push(job),
                }
                std::thread::sleep(Duration::from_millis(150));
            }
            (accepted, unanswered)
        })
    };
    std::thread::sleep(Duration::from_secs(4));
    // Redis stalls for 20 s: four times the lease
    rig.redis.pause();
    std::thread::sleep(Duration::from_secs(20));
    rig.redis.resume();
    let (_, e2, leaderless) = leader_after(&rig, e1, Duration::from_secs(60));
    // the take-overs the followers sent during the stall ran when Redis woke: the
    // term one of them took unknowingly is taken up at its next round, not waited out
    assert!(
        leaderless < Duration::from_secs_f64(LEASE_S),
        "no leader for {leaderless:?} after Redis woke (lease {LEASE_S} s)"
    );
    std::thread::sleep(Duration::from_secs(6));
    stop.store(true, Ordering::Relaxed);
    let (accepted, unanswered) = sender.join().expect("sender");
    assert!(unanswered.is_empty(), "never accepted: {unanswered:?}");
    assert!(accepted.len() >= 5, "only {} jobs accepted", accepted.len());
    // what the leader committed is in Redis: every job answered 202 among it
    wait_until(
        "the leader stored every accepted job",
        Duration::from_secs(30),
        &rig,
        || {
            let mut store = integrations::store::Store::new(Box::new(
                integrations::store::redis::RedisBackend::connect(&rig.redis.url(), &rig.prefix)
                    .expect("connect to the test redis"),
            ));
            let stored: std::collections::BTreeSet<String> = store
                .jobs()
                .map(|jobs| jobs.into_iter().map(|j| j.id).collect())
                .unwrap_or_default();
            let lost: Vec<&String> = accepted.iter().filter(|id| !stored.contains(*id)).collect();
            if !lost.is_empty() {
                eprintln!(
                    "{} of {} answered 202 not stored yet: {lost:?}",
                    lost.len(),
                    accepted.len()
                );
            }
            lost.is_empty()
        },
    );
    eprintln!(
        "{} jobs answered 202 across a 20 s Redis stall (epoch {e1} → {e2}), all stored; a leader {leaderless:?} after Redis woke",
        accepted.len()
    );
    let logs = rig.serve_logs();
    assert!(logs.contains("elected leader"), "{logs}");
}

#[test]
fn a_controller_without_ha_on_the_replicas_store_refuses_to_start_and_says_why() {
    let rig = Rig::new(1, 0, 3600);
    let _leader = rig.serve(0);
    let (_, epoch, _) = leader_after(&rig, 0, Duration::from_secs(60));
    // the same configuration without [ha] (its own port and journal)
    let cfg = std::fs::read_to_string(rig.config(0)).expect("config");
    let (head, tail) = cfg.split_once("[ha]\n").expect("[ha]");
    let tail = &tail[tail.find("[prices]").expect("[prices]")..];
    let plain = format!("{head}{tail}")
        .replace(
            &format!("127.0.0.1:{}", rig.ports[0]),
            &format!("127.0.0.1:{}", free_port()),
        )
        .replace("journal.redb", "plain-journal.redb");
    let r = rig.d().join("plain");
    std::fs::create_dir_all(&r).expect("dir");
    std::fs::write(r.join("powerplane.toml"), plain).expect("config");
    let out = powerplane()
        .args(["serve", "--run-for-s", "5", "--config"])
        .arg(r.join("powerplane.toml"))
        .output()
        .expect("serve");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "a controller without [ha] started beside the leader:\n{err}"
    );
    assert!(err.contains("holds a leader lease"), "{err}");
    assert!(err.contains(&format!("epoch {epoch}")), "{err}");
    assert!(err.contains("\"r0\""), "the holder named: {err}");
    assert!(err.contains("Enable [ha]"), "{err}");
    // the leader went on leading
    assert_eq!(role(rig.ports[0]), Some((true, epoch)));
}

/// The lowest cap in force on rack a01, as a replica shows it.
fn a01_cap(port: u16) -> Option<f64> {
    let (_, _, body) = http(port, "GET", "/api/v1/racks", Some(VIEWER), b"");
    let v: serde_json::Value = serde_json::from_str(&body).ok()?;
    v["racks"].as_array()?.iter().find(|r| r["id"] == "a01")?["lowest_cap_w"].as_f64()
}

/// The ids of the overrides a replica lists (`None`: it did not answer).
fn overrides_on(port: u16) -> Option<Vec<String>> {
    let (code, _, body) = http(port, "GET", "/api/v1/overrides", Some(VIEWER), b"");
    if code != 200 {
        return None;
    }
    let v: serde_json::Value = serde_json::from_str(&body).ok()?;
    Some(
        v["overrides"]
            .as_array()?
            .iter()
            .filter_map(|o| o["id"].as_str().map(str::to_string))
            .collect(),
    )
}

#[test]
fn an_override_and_a_grid_target_answered_201_hold_on_the_next_leader_and_what_the_store_cannot_take_is_refused(
) {
    let rig = Rig::new(2, 0, 3600);
    let mut serves: Vec<Option<Proc>> = (0..2).map(|i| Some(rig.serve(i))).collect();
    let (old, e1, _) = leader_after(&rig, 0, Duration::from_secs(60));
    wait_until(
        "every replica answers",
        Duration::from_secs(60),
        &rig,
        || rig.ports.iter().all(|p| role(*p).is_some()),
    );
    let pin = |w: f64| {
        format!(
            r#"{{"kind": "pin_rack_cap", "rack": "a01", "watts_per_gpu": {w}, "for_s": 3600, "reason": "PDU maintenance"}}"#
        )
    };
    // below what the policy alone gives the rack: its effect shows
    std::thread::sleep(Duration::from_secs(2));
    let before = a01_cap(rig.ports[old]);
    let pinned = before.map_or(150.0, |w| (w - 25.0).round());
    eprintln!("rack a01 capped at {before:?} W by the policy; pinned at {pinned} W");
    let (code, _, body) = http(
        rig.ports[old],
        "POST",
        "/api/v1/overrides",
        Some(OPERATOR),
        pin(pinned).as_bytes(),
    );
    assert_eq!(code, 201, "{body}");
    let set: serde_json::Value = serde_json::from_str(&body).expect("json");
    let id = set["id"].as_str().expect("id").to_string();
    // an operator's grid target, tomorrow
    let tomorrow = (chrono::Utc::now() + chrono::Duration::days(1)).to_rfc3339();
    let target = format!(
        r#"{{"id": "evening", "start": "{tomorrow}", "duration_min": 60, "shed_pct": 20}}"#
    );
    let (code, _, body) = http(
        rig.ports[old],
        "POST",
        "/api/v1/grid/targets",
        Some(ADMIN),
        target.as_bytes(),
    );
    assert_eq!(code, 201, "{body}");
    // the follower mirrors the override from the store
    let follower = 1 - old;
    wait_until(
        "the follower lists it",
        Duration::from_secs(20),
        &rig,
        || overrides_on(rig.ports[follower]).is_some_and(|l| l.contains(&id)),
    );
    // the leader dies: the next one applies the same override
    drop(serves[old].take());
    let (next, e2, _) = leader_after(&rig, e1, Duration::from_secs(30));
    assert_eq!(next, follower);
    assert_eq!(overrides_on(rig.ports[next]), Some(vec![id.clone()]));
    let (_, _, body) = http(
        rig.ports[next],
        "GET",
        "/api/v1/grid/targets",
        Some(VIEWER),
        b"",
    );
    let targets: serde_json::Value = serde_json::from_str(&body).expect("json");
    let listed: Vec<(String, String)> = targets["targets"]
        .as_array()
        .expect("targets")
        .iter()
        .map(|t| {
            (
                t["id"].as_str().unwrap_or("").to_string(),
                t["status"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    assert_eq!(
        listed,
        vec![("evening".to_string(), "pending".to_string())],
        "{body}\n{}",
        rig.serve_logs()
            .lines()
            .filter(|l| l.contains("grid") || l.contains("leader") || l.contains("override"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    wait_until(
        "the next leader applies it",
        Duration::from_secs(20),
        &rig,
        || a01_cap(rig.ports[next]) == Some(pinned),
    );
    eprintln!("epoch {e1} → {e2}: the override in force on the next leader");

    // the store stalls: a new override and a new target cannot be stored, so each is
    // refused and not set (sent at once: the stall soon costs the leader its lease)
    let late = target.replace("evening", "late");
    let port = rig.ports[next];
    rig.redis.pause();
    let t = Instant::now();
    let grid_post = std::thread::spawn(move || {
        http(
            port,
            "POST",
            "/api/v1/grid/targets",
            Some(ADMIN),
            late.as_bytes(),
        )
    });
    let (code, _, body) = http(
        port,
        "POST",
        "/api/v1/overrides",
        Some(OPERATOR),
        pin(pinned - 10.0).as_bytes(),
    );
    let (grid_code, _, grid_body) = grid_post.join().expect("grid post");
    let waited = t.elapsed();
    rig.redis.resume();
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("nothing was set"), "{body}");
    assert_eq!(grid_code, 503, "{grid_body}");
    assert!(grid_body.contains("withdrawn"), "{grid_body}");
    assert!(waited < Duration::from_secs(9), "answered after {waited:?}");
    assert_eq!(overrides_on(port), Some(vec![id.clone()]));
    drop(serves);
}
