//! `powerplane serve` with a Redis store through a 30 s Redis outage: the test's own
//! `redis-server` is killed (`kill -9`), the policy changes during the outage (the
//! caps come off), serve is stopped with SIGTERM during the outage, Redis comes back
//! 30 s after it died, and serve starts again: Redis then holds what serve decided and
//! actuated during the outage, every decision once.

mod common;

#[path = "../../tests/src/redis_server.rs"]
#[allow(dead_code)]
mod redis_server;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use integrations::store::redis::RedisBackend;
use integrations::store::Store;
use redis_server::RedisServer;

fn powerplane() -> Command {
    Command::new(env!("CARGO_BIN_EXE_powerplane"))
}

fn redis_store(server: &RedisServer) -> Store {
    Store::new(Box::new(
        RedisBackend::connect(&server.url(), "serve-outage").expect("connect to the test redis"),
    ))
}

/// Log lines of decisions (serve logs each with its rule, target and action).
fn decisions_logged(log: &str) -> usize {
    log.lines()
        .filter(|l| l.contains(" rule=") && l.contains(" target=") && l.contains(" action="))
        .count()
}

/// Per rack, the watts of the last cap decision serve logged.
fn last_caps(log: &str) -> std::collections::BTreeMap<String, i64> {
    let mut last = std::collections::BTreeMap::new();
    for l in log.lines() {
        let Some((_, rest)) = l.split_once("GPUs of rack/") else {
            continue;
        };
        let Some((rack, action)) = rest.split_once(" action=cap at ") else {
            continue;
        };
        let Some(w) = action.strip_suffix(" W").and_then(|w| w.parse().ok()) else {
            continue;
        };
        last.insert(rack.to_string(), w);
    }
    last
}

fn wait_for(what: &str, within: Duration, mut done: impl FnMut() -> bool, log: &Path) {
    let t = Instant::now();
    while !done() {
        assert!(
            t.elapsed() < within,
            "{what} within {within:?}; serve's log:\n{}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn write_config(d: &Path, url: &str, port: u16) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace");
    std::fs::copy(root.join("examples/demo/site.toml"), d.join("site.toml")).expect("site");
    std::fs::copy(
        root.join("examples/demo/policy.toml"),
        d.join("policy.toml"),
    )
    .expect("policy");
    // no telemetry: the budget rule assumes the worst of every stale GPU and caps all
    std::fs::write(
        d.join("powerplane.toml"),
        format!(
            "[controller]\nsite = \"site.toml\"\npolicy = \"policy.toml\"\ntick_s = 0.5\npolicy_reload_s = 0.5\n\n[store]\nkind = \"redis\"\nurl = \"{url}\"\nprefix = \"serve-outage\"\n\n[http]\nlisten = \"127.0.0.1:{port}\"\n[[http.tokens]]\nname = \"grafana\"\nrole = \"viewer\"\ntoken = \"{}\"\n",
            common::VIEWER
        ),
    )
    .expect("config");
}

#[test]
fn serve_stopped_during_a_30_s_redis_outage_loses_nothing_it_decided() {
    let mut server = RedisServer::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    write_config(d, &server.url(), port);
    let config = d.join("powerplane.toml");
    let log1 = d.join("serve1.log");
    let mut serve = powerplane()
        .args(["serve", "--run-for-s", "120", "--config"])
        .arg(&config)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log1).expect("log"))
        .spawn()
        .expect("serve");
    wait_for(
        "every GPU capped in Redis",
        Duration::from_secs(30),
        || {
            let mut s = redis_store(&server);
            s.state().map(|st| st.caps.len() == 192).unwrap_or(false)
        },
        &log1,
    );

    server.kill9();
    let died = Instant::now();
    let read_log1 = || std::fs::read_to_string(&log1).unwrap_or_default();
    let caps_before = read_log1().matches("action=cap at").count();
    // during the outage the operator edits the policy (a reload, audited) and the
    // caps move (they rise at raise_w_per_min)
    let policy = std::fs::read_to_string(d.join("policy.toml")).expect("policy");
    std::fs::write(
        d.join("policy.toml"),
        policy.replace("[budget]\n", "[budget]\nenabled = false\n"),
    )
    .expect("edit policy");
    wait_for(
        "the caps moved during the outage",
        Duration::from_secs(20),
        || read_log1().matches("action=cap at").count() >= caps_before + 6,
        &log1,
    );
    std::thread::sleep(Duration::from_secs(2));
    // the outage on /metrics, in a form promtool accepts
    let (code, _, metrics) = common::http(port, "GET", "/metrics", None, b"");
    assert_eq!(code, 200, "{metrics}");
    common::promtool_check(&metrics);
    let value = |name: &str| -> f64 {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{name} missing in:\n{metrics}"))
    };
    assert_eq!(value("powerplane_store_reachable"), 0.0);
    assert!(value("powerplane_store_journal_depth") >= 5.0);
    assert!(value("powerplane_store_journaled_total") >= 5.0);
    assert!(value("powerplane_store_commits_ok_total") >= 1.0);
    assert_eq!(value("powerplane_store_journal_full_total"), 0.0);
    assert_eq!(
        value("powerplane_store_errors_total"),
        0.0,
        "every tick's batch journaled"
    );
    // the loop kept its cadence through the outage (the figure is printed; the bound
    // is far below any lease)
    let delay = value("powerplane_tick_delay_max_seconds");
    eprintln!(
        "largest tick delay with Redis killed: {:.1} ms",
        delay * 1000.0
    );
    assert!(
        delay < 1.0,
        "the loop fell {delay} s behind during the outage"
    );
    let term = Command::new("kill")
        .args(["-TERM", &serve.id().to_string()])
        .status()
        .expect("kill -TERM");
    assert!(term.success());
    let stopped = Instant::now();
    let status = loop {
        if let Some(s) = serve.try_wait().expect("wait") {
            break s;
        }
        assert!(
            stopped.elapsed() < Duration::from_secs(20),
            "serve did not stop within 20 s of SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let first = read_log1();
    assert!(status.success(), "serve stopped cleanly: {status}\n{first}");
    assert!(
        first.contains("store did not take the batch; journaled"),
        "{first}"
    );
    assert!(
        died.elapsed() < Duration::from_secs(30),
        "serve was stopped during the outage"
    );
    std::thread::sleep(Duration::from_secs(30).saturating_sub(died.elapsed()));
    server.restart();

    // the next start replays the journal before it reads its state
    let second = powerplane()
        .args(["serve", "--run-for-s", "0", "--config"])
        .arg(&config)
        .output()
        .expect("serve again");
    let log2 = String::from_utf8_lossy(&second.stderr).to_string();
    assert!(second.status.success(), "{log2}");
    assert!(
        log2.contains("replaying the store journal left by the last run"),
        "{log2}"
    );
    assert!(
        log2.contains("restored from the store store=\"redis\" caps=192"),
        "{log2}"
    );
    let mut store = redis_store(&server);
    let last = last_caps(&first);
    assert_eq!(last.len(), 6, "a cap per rack in the log: {last:?}");
    let caps = store.state().expect("state").caps;
    assert_eq!(caps.len(), 192);
    for (gpu, cap) in &caps {
        let rack = gpu.to_string();
        let rack = rack
            .trim_start_matches("gpu/")
            .split('-')
            .next()
            .expect("rack part");
        assert_eq!(
            Some(&(cap.watts.round() as i64)),
            last.get(rack),
            "{gpu}: the cap serve last actuated (during the outage), not an older one"
        );
    }
    let audit = store.audit(1, 100_000).expect("audit");
    assert_eq!(
        audit.iter().map(|a| a.0).collect::<Vec<_>>(),
        (1..=audit.len() as u64).collect::<Vec<_>>()
    );
    assert_eq!(
        audit.len(),
        decisions_logged(&first) + decisions_logged(&log2),
        "every decision serve logged is in the audit log, once"
    );
    assert!(
        audit.iter().any(|a| a.1.rule == "policy.reload"),
        "the reload during the outage is audited"
    );
}

const OPERATOR: &str = "operator-token-0123456789abcdef";

fn post_event(port: u16, job: &str) -> u16 {
    let body = format!(
        r#"{{"event":"submitted","scheduler":"lsf","job":"{job}","class":"training","gpus":1,"est_duration_s":600}}"#
    );
    common::http(
        port,
        "POST",
        "/api/v1/events",
        Some(OPERATOR),
        body.as_bytes(),
    )
    .0
}

fn metric(port: u16, name: &str) -> Option<f64> {
    let (_, _, m) = common::http(port, "GET", "/metrics", None, b"");
    m.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .and_then(|v| v.parse().ok())
}

#[test]
fn job_events_get_503_only_while_neither_redis_nor_the_journal_takes_them() {
    let mut server = RedisServer::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let free = || {
        std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port()
    };
    let (port, receiver) = (free(), free());
    write_config(d, &server.url(), port);
    std::fs::write(d.join("webhook.key"), format!("{}\n", "ab".repeat(32))).expect("key");
    let mut config = std::fs::read_to_string(d.join("powerplane.toml")).expect("config");
    config = config.replace(
        "prefix = \"serve-outage\"\n",
        "prefix = \"serve-outage\"\njournal_max_batches = 6\n",
    );
    config.push_str(&format!(
        "[[http.tokens]]\nname = \"sre\"\nrole = \"operator\"\ntoken = \"{OPERATOR}\"\n[schedulers.webhook]\nkey_file = \"webhook.key\"\nurl = \"http://127.0.0.1:{receiver}/hook\"\nack_wait_s = 3\n"
    ));
    std::fs::write(d.join("powerplane.toml"), config).expect("config");
    let log = d.join("serve.log");
    let mut serve = powerplane()
        .args(["serve", "--run-for-s", "120", "--config"])
        .arg(d.join("powerplane.toml"))
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log"))
        .spawn()
        .expect("serve");
    wait_for(
        "serve answering",
        Duration::from_secs(20),
        || metric(port, "powerplane_store_reachable") == Some(1.0),
        &log,
    );
    assert_eq!(post_event(port, "a"), 202, "redis up");
    server.kill9();
    assert_eq!(
        post_event(port, "b"),
        202,
        "redis down, the journal takes it"
    );
    wait_for(
        "the journal full",
        Duration::from_secs(20),
        || metric(port, "powerplane_store_journal_full_total").is_some_and(|n| n >= 1.0),
        &log,
    );
    assert_eq!(
        post_event(port, "c"),
        503,
        "neither redis nor the journal takes it"
    );
    server.restart();
    wait_for(
        "the journal replayed",
        Duration::from_secs(20),
        || metric(port, "powerplane_store_journal_depth") == Some(0.0),
        &log,
    );
    assert_eq!(post_event(port, "d"), 202, "redis back");
    let _ = serve.kill();
    let _ = serve.wait();
    let mut store = redis_store(&server);
    for job in ["lsf:a", "lsf:b", "lsf:c", "lsf:d"] {
        assert!(
            store.job(job).expect("read job").is_some(),
            "{job} in Redis (c: taken, stored once Redis was back)"
        );
    }
}
