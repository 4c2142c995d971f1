//! Node power under high availability (safety invariants 8 and 9): two `powerplane
//! serve` replicas with `[ha]` on the test's own `redis-server` (never the shared one),
//! both bound to the same node on the real sushy-emulator (`--fake`, a port of its own).
//!
//! - Only the leader commands: the follower's power-down and power-up counters stay at 0
//!   while the leader powers the idle node down.
//! - A leader killed with `kill -9` leaves the node off (it had a minimum off time of an
//!   hour); the replica that takes over powers it up before it decides anything, so a
//!   dead controller never leaves a node off that work may be waiting for.

mod common;

#[path = "../../tests/src/redis_server.rs"]
#[allow(dead_code)]
mod redis_server;

#[path = "common/sushy_emulator.rs"]
mod sushy_emulator;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{http, VIEWER};
use orchestrator::node_power::PowerState;
use redis_server::RedisServer;
use sushy_emulator::Emulator;

/// A child process killed (SIGKILL) when dropped.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

fn metric(port: u16, series: &str) -> Option<f64> {
    let (code, _, body) = http(port, "GET", "/metrics", None, b"");
    if code != 200 {
        return None;
    }
    common::metric_value(&body, series)
}

/// `Some(true)` when the replica on `port` leads, `Some(false)` when it follows.
fn leads(port: u16) -> Option<bool> {
    let (code, _, body) = http(port, "GET", "/metrics", None, b"");
    if code != 200 {
        return None;
    }
    body.lines()
        .find(|l| l.starts_with("powerplane_leader{replica=\""))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<f64>().ok())
        .map(|v| v == 1.0)
}

fn write_config(
    d: &Path,
    i: usize,
    port: u16,
    redis: &str,
    prefix: &str,
    emu: &str,
    system: &str,
) -> PathBuf {
    let r = d.join(format!("r{i}"));
    std::fs::create_dir_all(&r).expect("replica dir");
    let p = |f: &str| d.join(f).display().to_string();
    let config = r.join("powerplane.toml");
    std::fs::write(
        &config,
        format!(
            r#"[controller]
site = "{site}"
policy = "{policy}"
tick_s = 0.5
policy_reload_s = 0
[store]
kind = "redis"
url = "{redis}"
prefix = "{prefix}"
journal = "journal.redb"
timeout_s = 2
[ha]
enabled = true
lease_s = 5
renew_s = 1
instance = "r{i}"
[node_power]
url = "{emu}"
timeout_s = 5
poll_s = 1
systems = {{ "a01-n01" = "{system}" }}
[http]
listen = "127.0.0.1:{port}"
metrics_public = true
[[http.tokens]]
name = "v"
role = "viewer"
token = "{VIEWER}"
"#,
            site = p("site.toml"),
            policy = p("policy.toml"),
        ),
    )
    .expect("config");
    config
}

fn serve(config: &Path) -> Proc {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(config.with_extension("log"))
        .expect("serve log");
    Proc(
        Command::new(env!("CARGO_BIN_EXE_powerplane"))
            .args(["serve", "--run-for-s", "600", "--config"])
            .arg(config)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("serve"),
    )
}

fn logs(configs: &[PathBuf]) -> String {
    configs
        .iter()
        .enumerate()
        .map(|(i, c)| {
            format!(
                "--- r{i} ---\n{}",
                std::fs::read_to_string(c.with_extension("log")).unwrap_or_default()
            )
        })
        .collect()
}

fn wait_until(
    what: &str,
    within: Duration,
    log: &dyn Fn() -> String,
    ok: &mut dyn FnMut() -> bool,
) {
    let start = Instant::now();
    while start.elapsed() < within {
        if ok() {
            return;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    panic!("{what} (waited {within:?})\n{}", log());
}

#[test]
fn only_the_leader_powers_nodes_down_and_a_take_over_powers_up_what_a_dead_leader_left_off() {
    let emu = Emulator::start();
    let (r, system) = emu.first_system();
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path();
    common::write_site_and_deferral_policy(d);
    // no work at all: a01-n01 is idle; nothing kept in reserve; once off, it would stay
    // off for an hour under the same controller
    let mut policy = std::fs::read_to_string(d.join("policy.toml")).expect("policy");
    policy.push_str(
        "[node_power]\nenabled = true\nreserve_gpus = 0\nreserve_share = 0.0\nidle_s = 10\nmin_off_s = 3600\nboot_s = 60\nshutdown_s = 10\n",
    );
    std::fs::write(d.join("policy.toml"), policy).expect("policy");
    let prefix = format!("pptest-nodeha-{}-{}", std::process::id(), free_port());
    let ports = [free_port(), free_port()];
    let configs: Vec<PathBuf> = (0..2)
        .map(|i| write_config(d, i, ports[i], &redis.url(), &prefix, &emu.url, &system))
        .collect();
    let log = || logs(&configs);
    let mut replicas: Vec<Option<Proc>> = configs.iter().map(|c| Some(serve(c))).collect();

    // one leader, one follower
    let mut leader = usize::MAX;
    wait_until(
        "no leader elected",
        Duration::from_secs(60),
        &log,
        &mut || {
            let roles: Vec<Option<bool>> = ports.iter().map(|&p| leads(p)).collect();
            match roles.as_slice() {
                [Some(true), Some(false)] => leader = 0,
                [Some(false), Some(true)] => leader = 1,
                _ => return false,
            }
            true
        },
    );
    let follower = 1 - leader;

    // the leader takes over (the fake system starts off: powered up), then powers the
    // idle node down
    wait_until(
        "the node never came on at take-over",
        Duration::from_secs(120),
        &log,
        &mut || r.power_state(&system).ok() == Some(PowerState::On),
    );
    wait_until(
        "the leader never powered the idle node down",
        Duration::from_secs(120),
        &log,
        &mut || {
            r.power_state(&system).ok() == Some(PowerState::Off)
                && metric(ports[leader], "powerplane_node_power_downs_total") == Some(1.0)
        },
    );
    // the follower has decided nothing and commanded nothing
    for series in [
        "powerplane_node_power_downs_total",
        "powerplane_node_power_ups_total",
    ] {
        assert_eq!(
            metric(ports[follower], series),
            Some(0.0),
            "the follower commanded node power ({series})\n{}",
            log()
        );
    }
    assert_eq!(leads(ports[follower]), Some(false), "{}", log());

    // kill -9 of the leader: nothing powers the node up on its way out
    let dead = replicas[leader].take().expect("leader");
    drop(dead);
    // the follower takes over and powers up the node the dead leader left off
    wait_until(
        "the follower never took over",
        Duration::from_secs(60),
        &log,
        &mut || leads(ports[follower]) == Some(true),
    );
    wait_until(
        "the new leader left the node off that the dead leader powered down",
        Duration::from_secs(120),
        &log,
        &mut || r.power_state(&system).ok() == Some(PowerState::On),
    );
    let text = std::fs::read_to_string(configs[follower].with_extension("log")).expect("log");
    assert!(
        text.contains("taking over, powering up the nodes left off"),
        "{}",
        log()
    );
    drop(replicas);
}
