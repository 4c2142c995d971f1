//! The leader lease and the fenced store in a PostgreSQL of the test's own
//! (tests/src/pg_server.rs, never the shared one): one holder at a time, epochs that
//! only grow, compare-and-set renewal, an election that survives a crash of the
//! database, and commits of a deposed leader that do not land, directly or replayed
//! from its journal.

use std::time::Duration;

use integrations::lease::postgres::PostgresLease;
use integrations::lease::{Change, Election, LeaseStore, Timing};
use integrations::store::journal::{Journaled, Limits};
use integrations::store::postgres::PostgresBackend;
use integrations::store::{Store, StoreError, Tx};
use powerplane_tests::fixtures::{decision, job};
use powerplane_tests::pg_server::PgServer;
use telemetry::JobState;

const SCHEMA: &str = "powerplane";

fn lease(server: &PgServer) -> PostgresLease {
    PostgresLease::new(&server.url(), SCHEMA, Duration::from_secs(2)).expect("lease")
}

#[test]
fn one_holder_at_a_time_epochs_grow_and_renewal_checks_the_term() {
    let server = PgServer::start();
    let (mut a, mut b) = (lease(&server), lease(&server));
    assert_eq!(a.holder().expect("holder"), None, "free at first");
    let e1 = a
        .acquire("a", 800)
        .expect("acquire")
        .expect("free lease taken");
    assert_eq!(b.acquire("b", 800).expect("acquire"), None, "held by a");
    assert_eq!(
        b.holder().expect("holder").map(|h| (h.instance, h.epoch)),
        Some(("a".into(), e1))
    );
    assert!(a.renew("a", e1, 800).expect("renew"));
    assert!(
        !b.renew("b", e1, 800).expect("renew"),
        "b does not hold term e1"
    );
    // a stops renewing: the lease ends, b's term has a larger epoch
    std::thread::sleep(Duration::from_millis(1200));
    let e2 = b
        .acquire("b", 800)
        .expect("acquire")
        .expect("expired lease taken");
    assert!(e2 > e1);
    assert!(!a.renew("a", e1, 800).expect("renew"), "a's term is over");
    b.release("b", e2).expect("release");
    assert_eq!(a.holder().expect("holder"), None);
    let e3 = a
        .acquire("a", 800)
        .expect("acquire")
        .expect("released lease taken");
    assert!(e3 > e2);
}

#[test]
fn an_election_survives_a_crash_of_the_database_with_a_new_term() {
    let mut server = PgServer::start();
    let timing = Timing::from_secs(1.0, 0.2);
    let mut store =
        PostgresLease::new(&server.url(), SCHEMA, Duration::from_millis(300)).expect("lease");
    let mut e = Election::new("a", timing);
    let t0 = std::time::Instant::now();
    let ms = || t0.elapsed().as_millis() as u64;
    assert_eq!(e.step(&mut store, ms()), Change::Elected { epoch: 1 });
    server.crash();
    // renewals fail; the term ends by lease minus margin
    let deposed = loop {
        match e.step(&mut store, ms()) {
            Change::Deposed { why, .. } => break why,
            _ => std::thread::sleep(Duration::from_millis(100)),
        }
    };
    assert_eq!(deposed, "lease_ran_out");
    assert!(ms() < 2000, "deposed after {} ms", ms());
    server.restart();
    let elected = loop {
        if let Change::Elected { epoch } = e.step(&mut store, ms()) {
            break epoch;
        }
        assert!(ms() < 30_000, "no term after the restart");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(elected, 2, "a new term; the epoch survived the crash (WAL)");
}

fn fenced_store(server: &PgServer, journal: Option<&std::path::Path>) -> Store {
    let pg =
        PostgresBackend::connect(&server.url(), SCHEMA).expect("connect to the test's postgres");
    match journal {
        Some(p) => Store::new(Box::new(
            Journaled::open(Box::new(pg), p, Limits::default()).expect("journal"),
        )),
        None => Store::new(Box::new(pg)),
    }
}

#[test]
fn a_deposed_leaders_commits_do_not_land_directly_or_from_its_journal() {
    let mut server = PgServer::start();
    let dir = tempfile::tempdir().expect("tmp");
    let mut l = lease(&server);
    let old = l.acquire("old", 60_000).expect("acquire").expect("taken");
    let mut deposed = fenced_store(&server, Some(&dir.path().join("journal.redb")));
    deposed.set_fence(Some(old));
    let mut tx = Tx::new();
    tx.put_job(&job("lsf:1", JobState::Pending));
    deposed.commit(tx).expect("commit under the current epoch");

    // the database goes away; the old leader journals a batch
    server.crash();
    let mut tx = Tx::new();
    tx.audit(&decision(1))
        .put_job(&job("lsf:2", JobState::Pending));
    deposed.commit(tx).expect("journaled");
    server.restart();
    // meanwhile a new leader took over (the old lease released by hand here)
    let mut l = lease(&server);
    l.release("old", old).expect("release");
    let new = l.acquire("new", 60_000).expect("acquire").expect("taken");
    assert!(new > old);

    // the old leader's next commit is refused (while its connection comes back, the
    // backend journals: that is no landing either, as the reader shows below)
    let t = std::time::Instant::now();
    let refused = loop {
        let mut tx = Tx::new();
        tx.put_job(&job("lsf:3", JobState::Pending));
        match deposed.commit(tx) {
            Err(e @ StoreError::Fenced { .. }) => break e,
            _ if t.elapsed() < Duration::from_secs(30) => {
                std::thread::sleep(Duration::from_millis(300))
            }
            other => panic!("no fenced refusal within 30 s: {other:?}"),
        }
    };
    assert!(
        refused.to_string().contains(&format!("epoch {old}")),
        "{refused}"
    );
    // ...and so was its journaled batch (dropped on replay)
    let mut reader = fenced_store(&server, None);
    let ids: Vec<String> = reader
        .jobs()
        .expect("jobs")
        .into_iter()
        .map(|j| j.id)
        .collect();
    assert_eq!(ids, vec!["lsf:1".to_string()]);
    assert_eq!(reader.audit_len().expect("audit"), 0);
    // the new leader writes
    let mut leader = fenced_store(&server, None);
    leader.set_fence(Some(new));
    let mut tx = Tx::new();
    tx.put_job(&job("lsf:4", JobState::Pending));
    leader.commit(tx).expect("the leader's commit");
}
