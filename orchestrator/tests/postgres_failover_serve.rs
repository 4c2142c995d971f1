//! Failover of the database itself: two `powerplane serve` replicas with `[ha]` on a
//! PostgreSQL primary with a synchronous standby (streaming replication, both clusters
//! the test's own: initdb, pg_basebackup), through a multi-host URL with
//! `target_session_attrs=read-write`. A scheduler sends jobs throughout, resending on
//! anything but 202. The primary is killed with -9 and the standby promoted once the
//! lease has run out: a replica leads again on the promoted database under a larger
//! epoch (the epoch row came over synchronously), no replica's `leader_epoch` ever
//! moves backwards, and every job answered 202, before the kill and after, is in the
//! promoted database.

mod common;
#[path = "../../tests/src/pg_server.rs"]
#[allow(dead_code)]
mod pg_server;

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Child;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{free_port, pg_replica, replica_leading as leader, replica_logs as logs, role};
use integrations::store::postgres::PostgresBackend;
use integrations::store::Store;
use pg_server::PgServer;

const OPERATOR: &str = "operator-token-0123456789abcdef";
const WEBHOOK_KEY: &str = "8f3c1d2e4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0";

fn start(d: &Path, i: usize, url: &str, port: u16) -> Child {
    std::fs::write(d.join("webhook.key"), format!("{WEBHOOK_KEY}\n")).expect("key");
    let extra = format!(
        "[[http.tokens]]\nname = \"o\"\nrole = \"operator\"\ntoken = \"{OPERATOR}\"\n\
         [schedulers.webhook]\nkey_file = \"{}\"\nurl = \"http://127.0.0.1:9/hook\"\nack_wait_s = 5\n",
        d.join("webhook.key").display()
    );
    pg_replica(d, i, url, port, 1.0, &extra)
}

/// The jobs in the store at `url`.
fn stored_jobs(url: &str) -> BTreeSet<String> {
    let mut store = Store::new(Box::new(
        PostgresBackend::connect(url, "powerplane").expect("connect to the test's postgres"),
    ));
    store
        .jobs()
        .expect("jobs")
        .into_iter()
        .map(|j| j.id)
        .collect()
}

#[test]
fn the_primary_killed_and_the_standby_promoted_loses_no_job_answered_202() {
    let mut primary = PgServer::start_primary();
    let standby = PgServer::standby_of(&primary);
    let url = format!(
        "postgres://postgres@127.0.0.1:{},127.0.0.1:{}/postgres?target_session_attrs=read-write&connect_timeout=1",
        primary.port, standby.port
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let ports = [free_port(), free_port()];
    let mut replicas: Vec<Child> = (0..2).map(|i| start(d, i, &url, ports[i])).collect();
    let (_, e1) = leader(d, &ports, 0, Duration::from_secs(60));

    // every replica's leader_epoch, every 100 ms: it never moves backwards
    let stop = Arc::new(AtomicBool::new(false));
    let watcher = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut last = [0u64; 2];
            let mut backwards = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                for (i, p) in ports.iter().enumerate() {
                    if let Some((_, e)) = role(*p) {
                        if e < last[i] {
                            backwards.push((i, last[i], e));
                        }
                        last[i] = last[i].max(e);
                    }
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            backwards
        })
    };
    let sender = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let (mut accepted, mut unanswered) = (Vec::new(), Vec::new());
            for n in 0.. {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let job = format!("fo-{n}");
                match common::send_until_accepted(&ports, OPERATOR, &job, Duration::from_secs(90)) {
                    Some(id) => accepted.push(id),
                    None => unanswered.push(job),
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            (accepted, unanswered)
        })
    };
    std::thread::sleep(Duration::from_secs(5));
    let before_kill = stored_jobs(&primary.url());
    assert!(!before_kill.is_empty(), "{}", logs(d, 2));
    primary.kill9();
    let killed = Instant::now();
    // promoted once the lease (3 s) has run out by the database's clock too: the next
    // term is taken on the promoted database, whose epoch came over synchronously
    std::thread::sleep(Duration::from_secs(5));
    standby.promote();
    let (_, e2) = leader(d, &ports, e1, Duration::from_secs(60));
    let back = killed.elapsed();
    std::thread::sleep(Duration::from_secs(5));
    stop.store(true, Ordering::Relaxed);
    let (accepted, unanswered) = sender.join().expect("sender");
    let backwards = watcher.join().expect("watcher");
    assert!(unanswered.is_empty(), "never accepted: {unanswered:?}");
    assert!(
        backwards.is_empty(),
        "leader_epoch moved backwards: {backwards:?}"
    );
    assert!(e2 > e1, "epoch {e2} after {e1}");
    // the promoted database holds every job answered 202, and every job the
    // primary had committed
    let stored = stored_jobs(&standby.url());
    let lost: Vec<&String> = accepted.iter().filter(|id| !stored.contains(*id)).collect();
    assert!(
        lost.is_empty(),
        "{} of {} jobs answered 202 are not in the promoted database: {lost:?}\n{}",
        lost.len(),
        accepted.len(),
        logs(d, 2)
    );
    let missing: Vec<&String> = before_kill.difference(&stored).collect();
    assert!(
        missing.is_empty(),
        "committed on the primary, gone: {missing:?}"
    );
    let after = accepted
        .iter()
        .filter(|id| !before_kill.contains(*id))
        .count();
    assert!(after > 0, "no job accepted after the kill");
    eprintln!(
        "{} jobs answered 202 ({after} after the kill); a leader again {back:?} after the kill (standby promoted at 5 s); epoch {e1} → {e2}",
        accepted.len()
    );
    for c in &mut replicas {
        let _ = c.kill();
        let _ = c.wait();
    }
}
