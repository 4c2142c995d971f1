//! Two `powerplane serve` replicas with `[ha]` and `[store] kind = "postgres"` on a
//! PostgreSQL of the test's own (tests/src/pg_server.rs): the lease lives in the
//! database. One leads (never two: every replica's `/metrics` sampled every 100 ms);
//! its `kill -9` hands the lead to the other with a larger epoch; a crash of the
//! database leaves nobody leading while the lease cannot be read, and one leads again
//! once it is back, with a larger epoch still.

mod common;
#[path = "../../tests/src/pg_server.rs"]
#[allow(dead_code)]
mod pg_server;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::http;
use pg_server::PgServer;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("port")
        .local_addr()
        .expect("addr")
        .port()
}

/// (leads, epoch) as a replica's `/metrics` says.
fn role(port: u16) -> Option<(bool, u64)> {
    let (code, _, body) = http(port, "GET", "/metrics", None, b"");
    if code != 200 {
        return None;
    }
    let value = |name: &str| {
        body.lines()
            .find(|l| l.starts_with(name) && !l.starts_with('#'))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<f64>().ok())
    };
    Some((
        value("powerplane_leader{replica=\"")? == 1.0,
        value("powerplane_leader_epoch ")? as u64,
    ))
}

fn start(d: &Path, i: usize, url: &str, port: u16) -> Child {
    let r = d.join(format!("r{i}"));
    std::fs::create_dir_all(&r).expect("dir");
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace");
    let site = root.join("examples/demo/site.toml");
    let policy = root.join("examples/demo/policy.toml");
    std::fs::write(
        r.join("powerplane.toml"),
        format!(
            "[controller]\nsite = \"{}\"\npolicy = \"{}\"\ntick_s = 0.5\n[store]\nkind = \"postgres\"\nurl = \"{url}\"\njournal = \"journal.redb\"\ntimeout_s = 0.5\n[ha]\nenabled = true\nlease_s = 3\nrenew_s = 0.5\ninstance = \"r{i}\"\n[http]\nlisten = \"127.0.0.1:{port}\"\nmetrics_public = true\n[[http.tokens]]\nname = \"v\"\nrole = \"viewer\"\ntoken = \"viewer-token-0123456789abcdef\"\n",
            site.display(),
            policy.display()
        ),
    )
    .expect("config");
    Command::new(env!("CARGO_BIN_EXE_powerplane"))
        .args(["serve", "--run-for-s", "120", "--config"])
        .arg(r.join("powerplane.toml"))
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(r.join("serve.log")).expect("log"))
        .spawn()
        .expect("serve")
}

/// The replicas' logs without their decisions (the election's and the store's lines).
fn logs(d: &Path, n: usize) -> String {
    (0..n)
        .map(|i| {
            std::fs::read_to_string(d.join(format!("r{i}/serve.log")))
                .unwrap_or_default()
                .lines()
                .filter(|l| !l.contains(" rule="))
                .collect::<Vec<_>>()
                .join("\n")
        })
        .collect::<Vec<_>>()
        .join("\n----\n")
}

/// The replica that leads (index, epoch), once one does within `within`.
fn leader(d: &Path, ports: &[u16], above: u64, within: Duration) -> (usize, u64) {
    let t0 = Instant::now();
    loop {
        for (i, p) in ports.iter().enumerate() {
            if let Some((true, epoch)) = role(*p) {
                if epoch > above {
                    return (i, epoch);
                }
            }
        }
        assert!(
            t0.elapsed() < within,
            "no leader above epoch {above} within {within:?}; the replicas' logs:\n{}",
            logs(d, ports.len())
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn one_leader_at_a_time_through_a_kill_and_a_database_crash() {
    let mut db = PgServer::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let ports = [free_port(), free_port()];
    let mut replicas: Vec<Option<Child>> = (0..2)
        .map(|i| Some(start(dir.path(), i, &db.url(), ports[i])))
        .collect();
    // every replica's role, every 100 ms: never two leaders
    let stop = Arc::new(AtomicBool::new(false));
    let most = Arc::new(Mutex::new(0usize));
    let sampler = {
        let (stop, most, ports) = (stop.clone(), most.clone(), ports.to_vec());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let n = ports
                    .iter()
                    .filter(|p| role(**p).is_some_and(|r| r.0))
                    .count();
                let mut m = most.lock().expect("most");
                *m = (*m).max(n);
                drop(m);
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };

    let (first, e1) = leader(dir.path(), &ports, 0, Duration::from_secs(30));
    let mut child = replicas[first].take().expect("running");
    let _ = child.kill();
    let _ = child.wait();
    let (second, e2) = leader(dir.path(), &ports, e1, Duration::from_secs(20));
    assert_ne!(second, first);
    assert!(e2 > e1);

    // the database crashes for longer than a lease: the leader's term runs out (it
    // stops acting by the lease's end less its margin), nobody leads
    db.crash();
    std::thread::sleep(Duration::from_secs(4));
    for p in ports {
        assert!(
            !role(p).is_some_and(|r| r.0),
            "a replica leads without the database:\n{}",
            logs(dir.path(), ports.len())
        );
    }
    db.restart();
    let (_, e3) = leader(dir.path(), &ports, e2, Duration::from_secs(30));
    assert!(e3 > e2, "a new term after the crash: {e3} after {e2}");

    stop.store(true, Ordering::Relaxed);
    sampler.join().expect("sampler");
    assert_eq!(*most.lock().expect("most"), 1, "two leaders at once");
    for c in replicas.iter_mut().flatten() {
        let _ = c.kill();
        let _ = c.wait();
    }
}
