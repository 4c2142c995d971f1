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
use std::process::Child;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{free_port, pg_replica, replica_leading as leader, replica_logs as logs, role};
use pg_server::PgServer;

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

fn start(d: &Path, i: usize, url: &str, port: u16) -> Child {
    pg_replica(
        d,
        i,
        url,
        port,
        0.5,
        "[[http.tokens]]\nname = \"v\"\nrole = \"viewer\"\ntoken = \"viewer-token-0123456789abcdef\"\n",
    )
}
