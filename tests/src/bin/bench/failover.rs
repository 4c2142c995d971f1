//! `bench failover [--runs N] [--replicas R]`: R `powerplane serve` replicas with
//! `[ha]` (`lease_s = 5`, `renew_s = 1`, `tick_s = 1`) on a `redis-server` of the
//! bench's own; N times, `kill -9` of the leader and the time until the next leader's
//! first tick (its "actuating" log line, polled every 10 ms), then the killed replica
//! is started again. Prints the median and the maximum, and the ticks lost (ticks due
//! while nobody acted: the failover time over `tick_s`, rounded down).
//!
//! The binary is `target/release/powerplane` unless `POWERPLANE_BIN` names another.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use powerplane_tests::redis_server::RedisServer;
use powerplane_tests::workspace_root;

const LEASE_S: f64 = 5.0;
const TICK_S: f64 = 1.0;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

struct Replica {
    config: PathBuf,
    log: PathBuf,
    child: Option<Child>,
}

impl Replica {
    fn start(&mut self, bin: &Path) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("log");
        self.child = Some(
            Command::new(bin)
                .args(["serve", "--config"])
                .arg(&self.config)
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .expect("serve"),
        );
    }

    fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Ticks this replica began as the leader so far (its take-over log lines).
    fn terms(&self) -> usize {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .matches("restored from the store; actuating")
            .count()
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        self.kill9();
    }
}

pub fn run(runs: usize, replicas: usize) {
    let bin = std::env::var_os("POWERPLANE_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target/release/powerplane"));
    assert!(
        bin.exists(),
        "{}: build it first (cargo build --release --bin powerplane)",
        bin.display()
    );
    let root = workspace_root();
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path();
    std::fs::copy(root.join("examples/demo/site.toml"), d.join("site.toml")).expect("site");
    std::fs::copy(
        root.join("examples/demo/policy.toml"),
        d.join("policy.toml"),
    )
    .expect("policy");
    let mut all: Vec<Replica> = (0..replicas)
        .map(|i| {
            let r = d.join(format!("r{i}"));
            std::fs::create_dir_all(&r).expect("dir");
            let config = r.join("powerplane.toml");
            std::fs::write(
                &config,
                format!(
                    "[controller]\nsite = \"{}\"\npolicy = \"{}\"\ntick_s = {TICK_S}\npolicy_reload_s = 0\n[store]\nkind = \"redis\"\nurl = \"{}\"\nprefix = \"bench-failover\"\ntimeout_s = 0.5\n[ha]\nenabled = true\nlease_s = {LEASE_S}\nrenew_s = 1\ninstance = \"r{i}\"\n[http]\nlisten = \"127.0.0.1:{}\"\nmetrics_public = true\n[[http.tokens]]\nname = \"v\"\nrole = \"viewer\"\ntoken = \"bench-viewer-0123456789abcdef\"\n",
                    d.join("site.toml").display(),
                    d.join("policy.toml").display(),
                    redis.url(),
                    free_port()
                ),
            )
            .expect("config");
            Replica {
                log: r.join("serve.log"),
                config,
                child: None,
            }
        })
        .collect();
    for r in &mut all {
        r.start(&bin);
    }
    let leader_now = |all: &[Replica], before: &[usize]| {
        all.iter()
            .enumerate()
            .find(|(i, r)| r.terms() > before[*i])
            .map(|(i, _)| i)
    };
    let zero = vec![0; replicas];
    let t = Instant::now();
    let mut leader = loop {
        if let Some(i) = leader_now(&all, &zero) {
            break i;
        }
        assert!(t.elapsed() < Duration::from_secs(60), "no leader");
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut times = Vec::new();
    for run in 0..runs {
        // steady state: a couple of renewals
        std::thread::sleep(Duration::from_secs(3));
        let before: Vec<usize> = all.iter().map(Replica::terms).collect();
        let killed = Instant::now();
        all[leader].kill9();
        let next = loop {
            if let Some(i) = leader_now(&all, &before) {
                break i;
            }
            assert!(
                killed.elapsed() < Duration::from_secs(60),
                "run {run}: no new leader"
            );
            std::thread::sleep(Duration::from_millis(10));
        };
        let took = killed.elapsed();
        println!(
            "  run {run:>2}: r{leader} killed, r{next} leads after {:.2} s",
            took.as_secs_f64()
        );
        times.push(took.as_secs_f64());
        all[leader].start(&bin);
        leader = next;
    }
    times.sort_by(f64::total_cmp);
    let median = times[times.len() / 2];
    let max = times.last().copied().unwrap_or(0.0);
    let lost = |s: f64| (s / TICK_S).floor() as u64;
    println!(
        "failover over {runs} runs ({replicas} replicas, lease_s = {LEASE_S}, renew_s = 1, tick_s = {TICK_S}): median {median:.2} s, max {max:.2} s; ticks lost: median {}, max {}",
        lost(median),
        lost(max)
    );
}
