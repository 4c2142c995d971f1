//! `bench latency [--nodes N] [--steps S] [--shards K]`: from a sample on MQTT to the
//! agent's receipt of the command it causes. A Mosquitto of the bench's own, the
//! release `powerplane serve` (`tick_s = 15`, events at their defaults: 20 ms
//! debounce, 4 per second) on a generated site of N nodes of 8 simulated A40 GPUs (8
//! nodes per rack), and N simulated agents in K threads of this process, each thread
//! one MQTT connection subscribed to its nodes' command topics. Each agent is the real
//! agent core (`agent::core::Core` over `SimGpus`): it checks the signature, lease and
//! replay rules of every command, applies it, answers with a signed ack, and publishes
//! its 8 GPUs' report every second as `powerplane agent` does.
//!
//! Each step publishes one rack's inlet at 36 °C (its limit is 32 °C) and measures the
//! time from the publish to the first `set_power_limit` command an agent of that rack
//! accepts, and to the last of the rack's 8 nodes; 400 ms later the inlet goes back to
//! 25 °C. Steps are about a second apart (700 to 1,200 ms), each on the next rack, so
//! they fall anywhere in the 15 s tick. Prints p50, p99 and max over the steps.
//!
//! With `--grid`, each step is a grid event instead: an admin posts a load target
//! (`POST /api/v1/grid/targets`, a shed of 15 to 35% of the meter) and the bench
//! measures the time from the post (the event's start) to the first and to the last
//! node's accepted `set_power_limit` (the last: the one after which none comes for
//! 500 ms), then cancels the target and lets the caps lift (the policy gives no
//! rebound and no raise limit, so each step starts from uncapped GPUs).
//!
//! The binary is `target/release/powerplane` unless `POWERPLANE_BIN` names another.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use agent::core::{Core, Rules};
use agent::SimGpus;
use powerplane_tests::{workspace_root, Broker};
use sources::mqtt::{Link, LinkEvent, MqttConfig};
use telemetry::agent_proto::{Action, Channel, Command as Cmd, Key, Topics};

const GPUS_PER_NODE: usize = 8;
const NODES_PER_RACK: usize = 8;
const RACKS_PER_ROW: usize = 10;
const PREFIX: &str = "bench-latency/v1";
const KEY_HEX: &str = "5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a";

/// A site of `nodes` nodes of 8 A40 GPUs, 8 nodes per rack, 10 racks per row with a
/// CRAH each, a PDU per rack, one feed; budgets far above the load.
fn site(nodes: usize) -> String {
    let racks = nodes.div_ceil(NODES_PER_RACK);
    let rows = racks.div_ceil(RACKS_PER_ROW);
    let mut s = String::from("version = 1\n[site]\nname = \"latency\"\n[[rooms]]\nid = \"hall\"\n");
    let _ = write!(
        s,
        "[[feeds]]\nid = \"utility\"\nrating_kw = {}\n",
        racks * 40
    );
    for r in 0..racks {
        let _ = write!(
            s,
            "[[pdus]]\nid = \"p{r:03}\"\nfeed = \"utility\"\nrating_kw = 40\n"
        );
    }
    for w in 0..rows {
        let members: Vec<String> = (w * RACKS_PER_ROW..((w + 1) * RACKS_PER_ROW).min(racks))
            .map(|r| format!("\"r{r:03}\""))
            .collect();
        let _ = write!(
            s,
            "[[rows]]\nid = \"w{w:02}\"\nroom = \"hall\"\n[[cooling]]\nid = \"c{w:02}\"\nkind = \"crah\"\ncapacity_kw = 400\nracks = [{}]\n",
            members.join(", ")
        );
    }
    for r in 0..racks {
        let n = NODES_PER_RACK.min(nodes - r * NODES_PER_RACK);
        let _ = write!(
            s,
            "[[racks]]\nid = \"r{r:03}\"\nrow = \"w{:02}\"\npdus = [\"p{r:03}\"]\ninlet_limit_c = 32\nnodes = {n}\ngpus_per_node = {GPUS_PER_NODE}\ngpu_model = \"A40\"\nnode_base_w = 400\n",
            r / RACKS_PER_ROW
        );
    }
    s
}

/// An accepted `set_power_limit`: which node, and when.
struct Receipt {
    node: usize,
    at: Instant,
}

/// One simulated node: the agent's core and its topics.
struct SimNode {
    index: usize,
    core: Core,
    t_gpus: String,
    t_health: String,
    t_ack: String,
    next: Instant,
}

/// Counters of all agent threads together.
#[derive(Default)]
struct AgentStats {
    reports: AtomicU64,
    commands: AtomicU64,
    acks: AtomicU64,
    unanswered: AtomicU64,
    dropped: AtomicU64,
}

/// The agents of `nodes` on one MQTT connection, until `stop`.
fn agent_thread(
    url: String,
    shard: usize,
    nodes: Vec<(usize, String)>,
    tx: mpsc::Sender<Receipt>,
    connected: mpsc::Sender<usize>,
    stats: Arc<AgentStats>,
    stop: Arc<AtomicBool>,
) {
    let key = Key::from_text(KEY_HEX).expect("key");
    let topics = Topics::new(PREFIX);
    let model = telemetry::GpuModel::builtin("A40").expect("A40");
    let interval = Duration::from_secs(1);
    let start = Instant::now();
    let count = nodes.len().max(1);
    let mut by_topic: HashMap<String, usize> = HashMap::new();
    let mut sims: Vec<SimNode> = nodes
        .iter()
        .enumerate()
        .map(|(i, (index, name))| {
            by_topic.insert(topics.topic(name, Channel::Cmd), i);
            let rules = Rules::new(name, key.clone());
            let gpus = SimGpus::new(GPUS_PER_NODE as u32, model.clone(), *index as u64 + 1).live();
            SimNode {
                index: *index,
                core: Core::start(rules, Box::new(gpus), None, agent::wall_clock()),
                t_gpus: topics.topic(name, Channel::Gpus),
                t_health: topics.topic(name, Channel::Health),
                t_ack: topics.topic(name, Channel::Ack),
                // reports spread over the second, as independent agents' would be
                next: start + interval.mul_f64(i as f64 / count as f64),
            }
        })
        .collect();
    let mut cfg = MqttConfig::new(&url);
    cfg.client_id = Some(format!("bench-agents-{shard}-{}", std::process::id()));
    let filters: Vec<String> = by_topic.keys().cloned().collect();
    let (link, events) = Link::open(&cfg, filters, None).expect("agent link");
    while !stop.load(Ordering::Relaxed) {
        let due = sims
            .iter()
            .map(|n| n.next)
            .min()
            .unwrap_or(start + interval);
        let wait = due
            .saturating_duration_since(Instant::now())
            .min(Duration::from_millis(50));
        match events.recv_timeout(wait) {
            Ok(LinkEvent::Connected) => {
                for n in &sims {
                    let h = n.core.health("online", agent::wall_clock(), None);
                    link.publish(
                        &n.t_health,
                        serde_json::to_vec(&h).expect("json"),
                        true,
                        true,
                    );
                }
                let _ = connected.send(shard);
            }
            Ok(LinkEvent::Message { topic, payload }) => {
                let Some(&i) = by_topic.get(&topic) else {
                    continue;
                };
                let n = &mut sims[i];
                stats.commands.fetch_add(1, Ordering::Relaxed);
                match n.core.answer(&payload, agent::wall_clock()) {
                    Some(ack) => {
                        link.publish(&n.t_ack, ack.seal(&key), true, false);
                        stats.acks.fetch_add(1, Ordering::Relaxed);
                        let applied = ack.status != telemetry::agent_proto::AckStatus::Rejected;
                        let cap = Cmd::open(&key, &payload)
                            .is_ok_and(|c| matches!(c.action, Action::SetPowerLimit { .. }));
                        if applied && cap {
                            let _ = tx.send(Receipt {
                                node: n.index,
                                at: Instant::now(),
                            });
                        }
                        // the agent shows its new state at once
                        n.next = Instant::now();
                    }
                    None => {
                        stats.unanswered.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            Ok(LinkEvent::Disconnected(_)) | Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
        let now = Instant::now();
        for n in sims.iter_mut().filter(|n| n.next <= now) {
            let report = n.core.tick(agent::wall_clock());
            link.publish(
                &n.t_gpus,
                serde_json::to_vec(&report).expect("json"),
                false,
                false,
            );
            stats.reports.fetch_add(1, Ordering::Relaxed);
            n.next += interval;
            if n.next < now {
                n.next = now + interval;
            }
        }
    }
    stats
        .dropped
        .fetch_add(link.dropped.load(Ordering::Relaxed), Ordering::Relaxed);
}

struct Serve(Child);

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// CPU seconds (user + system) and peak RSS (MB) of a process, from `/proc`.
fn cpu_and_rss(pid: u32) -> (f64, f64) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // the fields after the command name, which is in parentheses
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, r)| r.split_whitespace().collect())
        .unwrap_or_default();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    let cpu = (ticks(11) + ticks(12)) / 100.0;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let rss = status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<f64>().ok())
        .unwrap_or(0.0)
        / 1024.0;
    (cpu, rss)
}

/// `GET /metrics` over a plain connection, with a deadline.
fn get_metrics(port: u16) -> String {
    use std::io::{Read, Write};
    let Ok(mut c) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return String::new();
    };
    let _ = c.set_read_timeout(Some(Duration::from_secs(5)));
    let _ = c.write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
    let mut body = String::new();
    let _ = c.read_to_string(&mut body);
    body
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn line(what: &str, v: &mut [f64]) -> String {
    v.sort_by(f64::total_cmp);
    format!(
        "  {what:<28} n={:>4}  p50 {:7.1} ms  p99 {:7.1} ms  max {:7.1} ms",
        v.len(),
        percentile(v, 50.0),
        percentile(v, 99.0),
        v.last().copied().unwrap_or(f64::NAN)
    )
}

/// A request over a plain connection, with a deadline: the status code.
fn call(port: u16, method: &str, path: &str, token: &str, body: &str) -> u16 {
    use std::io::{Read, Write};
    let Ok(mut c) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return 0;
    };
    let _ = c.set_read_timeout(Some(Duration::from_secs(5)));
    let _ = write!(
        c,
        "{method} {path} HTTP/1.0\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut answer = String::new();
    let _ = c.read_to_string(&mut answer);
    answer
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

const ADMIN: &str = "bench-latency-admin-token-0123456789";

pub fn run(nodes: usize, steps: usize, shards: usize, grid: bool) {
    let bin = std::env::var_os("POWERPLANE_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target/release/powerplane"));
    assert!(
        bin.exists(),
        "{}: build it first (cargo build --release --bin powerplane)",
        bin.display()
    );
    let nodes = nodes.max(NODES_PER_RACK);
    let broker = Broker::start();
    let url = format!("mqtt://127.0.0.1:{}", broker.port);
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path();
    let site_text = site(nodes);
    std::fs::write(d.join("site.toml"), &site_text).expect("site");
    let parsed = telemetry::Site::parse("site.toml", &site_text).expect("the generated site");
    std::fs::write(
        d.join("policy.toml"),
        if grid {
            "version = 1\n[budget]\nenabled = false\nraise_w_per_min = 1000000\n[thermal]\nenabled = false\n[grid]\nrebound_s = 0\nfloor_fraction = 0.34\n"
        } else {
            "version = 1\n[budget]\nenabled = false\n"
        },
    )
    .expect("policy");
    std::fs::write(
        d.join("mapping.toml"),
        "version = 1\n[[json]]\ntopic = \"bench-latency/racks/{rack}/inlet\"\nentity = \"rack/{rack}\"\nmetric = \"inlet_temp_c\"\nvalue = \"/c\"\n",
    )
    .expect("mapping");
    std::fs::write(d.join("site.key"), KEY_HEX).expect("key");
    std::fs::write(
        d.join("viewer.token"),
        "bench-latency-viewer-token-0123456789",
    )
    .expect("token");
    for f in ["site.key", "viewer.token"] {
        std::fs::set_permissions(
            d.join(f),
            std::os::unix::fs::PermissionsExt::from_mode(0o600),
        )
        .expect("chmod");
    }
    let http_port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    // 8 GPUs x 6 readings per node and second, 15 s between ticks, with room
    let buffer = (nodes * GPUS_PER_NODE * 6 * 20).max(200_000);
    std::fs::write(
        d.join("powerplane.toml"),
        format!(
            "[controller]\nsite = \"site.toml\"\npolicy = \"policy.toml\"\ntick_s = 15\nbuffer_samples = {buffer}\n\n[store]\nkind = \"embedded\"\npath = \"state.redb\"\n\n[mqtt]\nurl = \"{url}\"\nmapping = \"mapping.toml\"\n\n[http]\nlisten = \"127.0.0.1:{http_port}\"\nmetrics_public = true\n[[http.tokens]]\nname = \"bench\"\nrole = \"viewer\"\ntoken_file = \"viewer.token\"\n[[http.tokens]]\nname = \"facility\"\nrole = \"admin\"\ntoken = \"{ADMIN}\"\n\n[demand_response]\n\n[agents]\nkey_file = \"site.key\"\nlease_s = 60\nrenew_s = 20\nretry_s = 2\ntopic_prefix = \"{PREFIX}\"\n[agents.mqtt]\nurl = \"{url}\"\n"
        ),
    )
    .expect("config");

    // node index -> rack index, in the site's order
    let rack_of: HashMap<&str, usize> = parsed
        .racks
        .iter()
        .enumerate()
        .map(|(i, r)| (r.id.as_str(), i))
        .collect();
    let node_names: Vec<String> = parsed.nodes.iter().map(|n| n.id.clone()).collect();
    let node_rack: Vec<usize> = parsed
        .nodes
        .iter()
        .map(|n| rack_of[n.rack.as_str()])
        .collect();
    let racks = parsed.racks.len();
    println!(
        "latency: {} nodes, {} GPUs, {racks} racks; serve tick_s = 15, event debounce 20 ms, at most 4 per s; {shards} agent threads, reports every 1 s",
        node_names.len(),
        parsed.gpu_count()
    );

    let (tx, receipts) = mpsc::channel::<Receipt>();
    let (ctx, connected) = mpsc::channel::<usize>();
    let stop = Arc::new(AtomicBool::new(false));
    let stats = Arc::new(AgentStats::default());
    let mut threads = Vec::new();
    let shards = shards.clamp(1, node_names.len());
    for s in 0..shards {
        let mine: Vec<(usize, String)> = node_names
            .iter()
            .enumerate()
            .filter(|(i, _)| i % shards == s)
            .map(|(i, n)| (i, n.clone()))
            .collect();
        let (url, tx, ctx, stats, stop) = (
            url.clone(),
            tx.clone(),
            ctx.clone(),
            stats.clone(),
            stop.clone(),
        );
        threads.push(std::thread::spawn(move || {
            agent_thread(url, s, mine, tx, ctx, stats, stop)
        }));
    }
    for _ in 0..shards {
        connected
            .recv_timeout(Duration::from_secs(20))
            .expect("every agent thread connects to the broker");
    }

    let log_path = d.join("serve.log");
    let log = std::fs::File::create(&log_path).expect("log");
    let run_for = 60 + steps * 2;
    let serve = Serve(
        Command::new(&bin)
            .args(["serve", "--run-for-s", &run_for.to_string(), "--config"])
            .arg(d.join("powerplane.toml"))
            .env("POWERPLANE_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("serve"),
    );
    let mut serve = serve;
    let pid = serve.0.id();
    let mut pcfg = MqttConfig::new(&url);
    pcfg.client_id = Some(format!("bench-latency-pub-{}", std::process::id()));
    let (publisher, _pub_events) = Link::open(&pcfg, Vec::new(), None).expect("publisher");
    let inlet = |rack: usize, c: f64| {
        let topic = format!("bench-latency/racks/{}/inlet", parsed.racks[rack].id);
        assert!(
            publisher.publish(&topic, format!("{{\"c\": {c}}}").into_bytes(), true, false),
            "publish"
        );
    };
    // settle: every rack at 25 °C, and the first tick's leases on every node
    std::thread::sleep(Duration::from_secs(2));
    for r in 0..racks {
        inlet(r, 25.0);
    }
    let settle_until = Instant::now() + Duration::from_secs(30);
    while stats.acks.load(Ordering::Relaxed) < node_names.len() as u64 {
        assert!(
            Instant::now() < settle_until,
            "the agents got {} commands of serve's first tick ({} nodes): is serve running? its log: {}",
            stats.acks.load(Ordering::Relaxed),
            node_names.len(),
            std::fs::read_to_string(&log_path).unwrap_or_default()
        );
        if let Ok(Some(status)) = serve.0.try_wait() {
            panic!(
                "serve exited ({status}): {}",
                std::fs::read_to_string(&log_path).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_secs(2));
    let (cpu0, _) = cpu_and_rss(pid);
    let t0 = Instant::now();

    let verbose = std::env::var_os("BENCH_VERBOSE").is_some();
    if grid {
        let mut first_ms = Vec::new();
        let mut all_ms = Vec::new();
        let mut capped = Vec::new();
        let mut missed = 0usize;
        for k in 0..steps {
            while receipts.try_recv().is_ok() {}
            let shed = 15 + (k * 7) % 21;
            let body = format!("{{\"id\": \"b{k}\", \"duration_min\": 5, \"shed_pct\": {shed}}}");
            let sent = Instant::now();
            let code = call(http_port, "POST", "/api/v1/grid/targets", ADMIN, &body);
            assert_eq!(code, 201, "posting a grid target");
            let mut got = std::collections::BTreeSet::new();
            let (mut first, mut last) = (None, None);
            let deadline = sent + Duration::from_secs(5);
            loop {
                let quiet = last.map_or(deadline, |l: Instant| {
                    (l + Duration::from_millis(500)).min(deadline)
                });
                let Ok(r) = receipts.recv_timeout(quiet.saturating_duration_since(Instant::now()))
                else {
                    break;
                };
                got.insert(r.node);
                first.get_or_insert(r.at);
                last = Some(r.at);
            }
            let ms = |t: Instant| t.duration_since(sent).as_secs_f64() * 1000.0;
            match (first, last) {
                (Some(f), Some(l)) => {
                    first_ms.push(ms(f));
                    all_ms.push(ms(l));
                    capped.push(got.len() as f64);
                    if verbose {
                        println!("  step {k:>3}: shed {shed}%, {} nodes, first {:7.1} ms, last {:7.1} ms", got.len(), ms(f), ms(l));
                    }
                }
                _ => missed += 1,
            }
            assert_eq!(
                call(
                    http_port,
                    "DELETE",
                    &format!("/api/v1/grid/targets/b{k}"),
                    ADMIN,
                    ""
                ),
                200,
                "cancelling a grid target"
            );
            // the caps lift (no rebound, no raise limit): drained before the next step
            std::thread::sleep(Duration::from_millis(1500));
        }
        let (cpu1, rss) = cpu_and_rss(pid);
        stop.store(true, Ordering::Relaxed);
        for t in threads {
            let _ = t.join();
        }
        drop(serve);
        println!("{}", line("event start -> first node", &mut first_ms));
        println!("{}", line("event start -> last node", &mut all_ms));
        capped.sort_by(f64::total_cmp);
        println!(
            "  nodes commanded per event: median {:.0} of {}; events without a command within 5 s: {missed}",
            percentile(&capped, 50.0),
            node_names.len()
        );
        println!(
            "  serve: {:.1} s of CPU over the steps, peak RSS {rss:.0} MB",
            cpu1 - cpu0
        );
        return;
    }
    let mut first_ms = Vec::new();
    let mut all_ms = Vec::new();
    let mut missed = Vec::new();
    for k in 0..steps {
        let rack = k % racks;
        let members = node_rack.iter().filter(|&&r| r == rack).count();
        while receipts.try_recv().is_ok() {}
        let sent = Instant::now();
        inlet(rack, 36.0);
        let mut got = std::collections::BTreeSet::new();
        let (mut first, mut last) = (None, None);
        let deadline = sent + Duration::from_secs(16);
        while got.len() < members {
            let Ok(r) = receipts.recv_timeout(deadline.saturating_duration_since(Instant::now()))
            else {
                break;
            };
            if node_rack[r.node] == rack && got.insert(r.node) {
                first.get_or_insert(r.at);
                last = Some(r.at);
            }
        }
        let ms = |t: Instant| t.duration_since(sent).as_secs_f64() * 1000.0;
        match (first, last) {
            (Some(f), Some(l)) if got.len() == members => {
                first_ms.push(ms(f));
                all_ms.push(ms(l));
                if verbose {
                    println!(
                        "  step {k:>3} at {:8.3} s: rack {}, first {:7.1} ms, all {:7.1} ms",
                        sent.duration_since(t0).as_secs_f64(),
                        parsed.racks[rack].id,
                        ms(f),
                        ms(l)
                    );
                }
            }
            _ => missed.push((k, parsed.racks[rack].id.clone(), got.len())),
        }
        // the inlet back down, then the next step 0.7 to 1.2 s after this one
        let back = sent + Duration::from_millis(400);
        std::thread::sleep(back.saturating_duration_since(Instant::now()));
        inlet(rack, 25.0);
        let next = sent + Duration::from_millis(700 + (k as u64 * 137) % 500);
        std::thread::sleep(next.saturating_duration_since(Instant::now()));
    }
    let span = t0.elapsed().as_secs_f64();
    let (cpu1, rss) = cpu_and_rss(pid);
    let metrics = get_metrics(http_port);
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        let _ = t.join();
    }
    drop(serve);
    let text = std::fs::read_to_string(&log_path).unwrap_or_default();
    let warnings = text.lines().filter(|l| l.contains("WARN")).count();
    println!("{}", line("publish -> first node", &mut first_ms));
    println!("{}", line("publish -> all 8 nodes", &mut all_ms));
    println!(
        "  steps without a command for every node of the rack within 16 s: {} {:?}",
        missed.len(),
        missed
    );
    println!(
        "  serve: {:.1} s of CPU over the {span:.1} s of steps ({:.0}% of one core), peak RSS {rss:.0} MB, {warnings} warning lines",
        cpu1 - cpu0,
        (cpu1 - cpu0) / span * 100.0
    );
    println!(
        "  agents: {} reports, {} commands, {} acks, {} unanswered, {} dropped by the links",
        stats.reports.load(Ordering::Relaxed),
        stats.commands.load(Ordering::Relaxed),
        stats.acks.load(Ordering::Relaxed),
        stats.unanswered.load(Ordering::Relaxed),
        stats.dropped.load(Ordering::Relaxed)
    );
    for l in metrics.lines().filter(|l| {
        [
            "powerplane_event_",
            "powerplane_tick_duration",
            "powerplane_samples_dropped",
        ]
        .iter()
        .any(|p| l.starts_with(p))
    }) {
        println!("  serve /metrics: {l}");
    }
    if std::env::var_os("BENCH_KEEP_LOG").is_some() {
        let keep = std::env::temp_dir().join("bench-latency-serve.log");
        let _ = std::fs::write(&keep, &text);
        println!("  serve's log: {}", keep.display());
    }
}
