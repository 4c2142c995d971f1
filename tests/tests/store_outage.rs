//! The Redis store through its server's outages: `kill -9` and restart, a server that
//! stops answering, a SIGTERM during the outage, a full journal. Each test runs its
//! own `redis-server` (never the shared one) and kills only that.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use integrations::store::journal::{Journaled, Limits};
use integrations::store::redis::RedisBackend;
use integrations::store::{Backend, Store, Tx};
use powerplane_tests::fixtures::{decision, job};
use powerplane_tests::redis_server::RedisServer;
use telemetry::JobState;

const PREFIX: &str = "outage";

fn open(server: &RedisServer, journal: &Path, limits: Limits) -> Store {
    let redis = RedisBackend::connect(&server.url(), PREFIX).expect("connect to the test redis");
    Store::new(Box::new(
        Journaled::open(Box::new(redis), journal, limits).expect("open the journal"),
    ))
}

/// Commits batch `i`: one audit record, one job. Returns how long it took.
fn commit(store: &mut Store, i: i64) -> Duration {
    let mut tx = Tx::new();
    tx.audit(&decision(i))
        .put_job(&job(&format!("slurm:{i}"), JobState::Pending));
    let t = Instant::now();
    store
        .commit(tx)
        .unwrap_or_else(|e| panic!("batch {i} neither committed nor journaled: {e}"));
    t.elapsed()
}

/// Waits until the store reads again (the journal replayed); returns how long it took.
fn caught_up(store: &mut Store, within: Duration) -> Duration {
    let t = Instant::now();
    loop {
        match store.audit_len() {
            Ok(_) => return t.elapsed(),
            Err(e) => assert!(
                t.elapsed() < within,
                "the store did not read again within {within:?} of the restart: {e}"
            ),
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The audit log holds decisions 0..n exactly once, in order, numbered 1..=n.
fn assert_audit(store: &mut Store, n: i64) {
    let audit = store.audit(1, 10_000).expect("read the audit log");
    assert_eq!(
        audit.iter().map(|a| a.0).collect::<Vec<_>>(),
        (1..=n as u64).collect::<Vec<_>>(),
        "audit sequence numbers contiguous"
    );
    assert_eq!(
        audit.into_iter().map(|a| a.1).collect::<Vec<_>>(),
        (0..n).map(decision).collect::<Vec<_>>(),
        "every decision exactly once, in order"
    );
    assert_eq!(store.jobs().expect("jobs").len(), n as usize, "every job");
}

#[test]
fn a_killed_and_restarted_redis_loses_nothing_and_duplicates_nothing() {
    let mut server = RedisServer::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut store = open(&server, &dir.path().join("journal.redb"), Limits::default());
    let health = store.health().expect("the redis store has health");
    let up = (0..10).map(|i| commit(&mut store, i)).max();
    server.kill9();
    let mut worst = Duration::ZERO;
    // an hour of 15 s ticks
    for i in 10..250 {
        let took = commit(&mut store, i);
        assert!(took < Duration::from_secs(3), "batch {i} took {took:?}");
        worst = worst.max(took);
    }
    eprintln!("slowest commit: {up:?} with redis up, {worst:?} with it killed (journaled)");
    assert!(!health.is_reachable(), "the outage is visible");
    assert_eq!(health.journal_depth.load(Ordering::Relaxed), 240);
    assert_eq!(health.journaled.load(Ordering::Relaxed), 240);
    assert!(
        store.audit_len().is_err(),
        "a read during the outage is an error"
    );

    std::thread::sleep(Duration::from_secs(3));
    server.restart();
    let took = caught_up(&mut store, Duration::from_secs(10));
    eprintln!("store read again {took:?} after the restart (240 batches replayed)");
    commit(&mut store, 250);
    assert_audit(&mut store, 251);
    assert!(health.is_reachable());
    assert_eq!(health.journal_depth.load(Ordering::Relaxed), 0);
    assert_eq!(health.replayed.load(Ordering::Relaxed), 240);
    assert!(health.reconnects.load(Ordering::Relaxed) >= 1);
    assert!(health.commits_failed.load(Ordering::Relaxed) >= 1);
}

#[test]
fn a_server_that_stops_answering_costs_each_call_no_more_than_its_deadline() {
    let server = RedisServer::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut store = open(&server, &dir.path().join("journal.redb"), Limits::default());
    commit(&mut store, 0);
    server.pause();
    let mut worst = Duration::ZERO;
    for i in 1..6 {
        worst = worst.max(commit(&mut store, i));
    }
    let t = Instant::now();
    assert!(store.audit_len().is_err());
    worst = worst.max(t.elapsed());
    eprintln!("slowest call with redis stopped (SIGSTOP): {worst:?}");
    assert!(
        worst < Duration::from_millis(2_500),
        "a call waited {worst:?} on a server that does not answer (deadline 2 s)"
    );
    server.resume();
    caught_up(&mut store, Duration::from_secs(10));
    assert_audit(&mut store, 6);
}

#[test]
fn a_sigterm_during_the_outage_keeps_the_journal_and_the_next_start_replays_it() {
    let mut server = RedisServer::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let journal = dir.path().join("journal.redb");
    {
        let mut store = open(&server, &journal, Limits::default());
        for i in 0..3 {
            commit(&mut store, i);
        }
        server.kill9();
        for i in 3..8 {
            commit(&mut store, i);
        }
        // the process ends here, with the store down
    }
    assert!(journal.exists(), "the journal stays on disk");
    server.restart();
    let mut store = open(&server, &journal, Limits::default());
    let health = store.health().expect("health");
    assert_eq!(
        health.replayed.load(Ordering::Relaxed),
        5,
        "the start replays it"
    );
    assert_audit(&mut store, 8);
    commit(&mut store, 8);
    assert_audit(&mut store, 9);
}

#[test]
fn a_batch_the_server_took_before_a_crash_is_not_applied_again_on_replay() {
    let mut server = RedisServer::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let journal = dir.path().join("journal.redb");
    let mut direct = RedisBackend::connect(&server.url(), "direct").expect("connect");
    let mut tx = Tx::new();
    tx.audit(&decision(0));
    assert!(direct.commit_once("w", 1, tx.batch()).expect("first"));
    assert!(!direct.commit_once("w", 1, tx.batch()).expect("again"));
    assert_eq!(direct.applied("w").expect("applied"), 1);
    assert_eq!(direct.log_len("audit").expect("len"), 1, "applied once");

    // through the journal: batch 4 is journaled, then the server takes it (as if a
    // replay committed it and the process died before removing it from the journal)
    let writer = {
        let redis = RedisBackend::connect(&server.url(), PREFIX).expect("connect");
        let journaled =
            Journaled::open(Box::new(redis), &journal, Limits::default()).expect("journal");
        let writer = journaled.writer().to_string();
        let mut store = Store::new(Box::new(journaled));
        for i in 0..3 {
            commit(&mut store, i);
        }
        server.kill9();
        commit(&mut store, 3);
        writer
    };
    server.restart();
    let mut tx = Tx::new();
    tx.audit(&decision(3))
        .put_job(&job("slurm:3", JobState::Pending));
    let mut redis = RedisBackend::connect(&server.url(), PREFIX).expect("connect");
    assert!(redis
        .commit_once(&writer, 4, tx.batch())
        .expect("take batch 4"));
    let mut store = open(&server, &journal, Limits::default());
    let health = store.health().expect("health");
    assert_eq!(health.replayed.load(Ordering::Relaxed), 1);
    assert_eq!(health.duplicates_skipped.load(Ordering::Relaxed), 1);
    assert_audit(&mut store, 4);
}

#[test]
fn a_full_journal_refuses_loudly_and_counts_while_what_it_took_survives() {
    let mut server = RedisServer::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let limits = Limits {
        max_batches: 2,
        ..Limits::default()
    };
    let mut store = open(&server, &dir.path().join("journal.redb"), limits);
    let health = store.health().expect("health");
    commit(&mut store, 0);
    server.kill9();
    commit(&mut store, 1);
    commit(&mut store, 2);
    let mut tx = Tx::new();
    tx.audit(&decision(3));
    let err = store.commit(tx).expect_err("a third batch does not fit");
    assert!(err.to_string().contains("is full (2 batches"), "{err}");
    assert_eq!(health.journal_full.load(Ordering::Relaxed), 1);
    server.restart();
    caught_up(&mut store, Duration::from_secs(10));
    let audit = store.audit(1, 10).expect("audit");
    assert_eq!(
        audit.into_iter().map(|a| a.1).collect::<Vec<_>>(),
        (0..3).map(decision).collect::<Vec<_>>(),
        "what was journaled is in the store; the refused batch is the caller's to keep"
    );
}

#[test]
fn a_killed_client_connection_is_replaced_within_the_same_call() {
    let server = RedisServer::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut store = open(&server, &dir.path().join("journal.redb"), Limits::default());
    let health = store.health().expect("health");
    commit(&mut store, 0);
    let out = std::process::Command::new("redis-cli")
        .args([
            "-p",
            &server.port().to_string(),
            "client",
            "kill",
            "type",
            "normal",
        ])
        .output()
        .expect("this test needs redis-cli");
    assert!(
        String::from_utf8_lossy(&out.stdout).trim() != "0",
        "redis-cli killed our connection: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    for i in 1..4 {
        commit(&mut store, i);
    }
    assert_eq!(
        health.journaled.load(Ordering::Relaxed),
        0,
        "the connection was replaced at once: nothing had to wait in the journal"
    );
    assert_audit(&mut store, 4);
}
