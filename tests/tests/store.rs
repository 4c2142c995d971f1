//! The store contract, against the embedded store, a real Redis and a real PostgreSQL.

use integrations::store::Store;
use orchestrator::embedded::EmbeddedBackend;
use powerplane_tests::{redis_backend, store_contract as contract};

fn embedded(dir: &tempfile::TempDir) -> Store {
    Store::new(Box::new(
        EmbeddedBackend::open(&dir.path().join("state.redb")).expect("open embedded store"),
    ))
}

fn redis(test: &str) -> Store {
    Store::new(Box::new(redis_backend(test)))
}

#[test]
fn embedded_starts_empty() {
    let dir = tempfile::tempdir().expect("tempdir");
    contract::starts_empty(&mut embedded(&dir));
}

#[test]
fn embedded_reads_back_what_it_commits() {
    let dir = tempfile::tempdir().expect("tempdir");
    contract::reads_back_what_it_commits(&mut embedded(&dir));
}

#[test]
fn embedded_survives_a_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    contract::survives_a_restart(|| embedded(&dir));
}

#[test]
fn embedded_empty_commit_is_a_no_op() {
    let dir = tempfile::tempdir().expect("tempdir");
    contract::empty_commit_is_a_no_op(&mut embedded(&dir));
}

#[test]
fn redis_starts_empty() {
    contract::starts_empty(&mut redis("starts_empty"));
}

#[test]
fn redis_reads_back_what_it_commits() {
    contract::reads_back_what_it_commits(&mut redis("reads_back"));
}

#[test]
fn redis_survives_a_restart() {
    let mut first = true;
    contract::survives_a_restart(|| {
        if first {
            first = false;
            redis("restart")
        } else {
            // reconnect without clearing: a new process finding what the old one left
            let prefix = format!("powerplane-test:{}:restart", std::process::id());
            Store::new(Box::new(
                integrations::store::redis::RedisBackend::connect(
                    &powerplane_tests::redis_url(),
                    &prefix,
                )
                .expect("reconnect"),
            ))
        }
    });
}

#[test]
fn redis_empty_commit_is_a_no_op() {
    contract::empty_commit_is_a_no_op(&mut redis("empty_commit"));
}

#[test]
fn an_unreachable_redis_is_a_clear_error() {
    let err = integrations::store::redis::RedisBackend::connect("redis://127.0.0.1:1/0", "x")
        .err()
        .expect("nothing listens on port 1");
    let text = err.to_string();
    assert!(
        text.starts_with("redis store: cannot connect to redis://127.0.0.1:1/0"),
        "{text}"
    );
}

/// Redis of the test's own behind a journal in `dir`: the contract holds through it.
fn journaled(
    server: &powerplane_tests::redis_server::RedisServer,
    dir: &tempfile::TempDir,
) -> Store {
    use integrations::store::journal::{Journaled, Limits};
    let redis = integrations::store::redis::RedisBackend::connect(&server.url(), "contract")
        .expect("connect to the test redis");
    Store::new(Box::new(
        Journaled::open(
            Box::new(redis),
            &dir.path().join("journal.redb"),
            Limits::default(),
        )
        .expect("journal"),
    ))
}

#[test]
fn journaled_redis_starts_empty() {
    let server = powerplane_tests::redis_server::RedisServer::start();
    let dir = tempfile::tempdir().expect("tempdir");
    contract::starts_empty(&mut journaled(&server, &dir));
}

#[test]
fn journaled_redis_reads_back_what_it_commits() {
    let server = powerplane_tests::redis_server::RedisServer::start();
    let dir = tempfile::tempdir().expect("tempdir");
    contract::reads_back_what_it_commits(&mut journaled(&server, &dir));
}

#[test]
fn journaled_redis_survives_a_restart() {
    let server = powerplane_tests::redis_server::RedisServer::start();
    let dir = tempfile::tempdir().expect("tempdir");
    contract::survives_a_restart(|| journaled(&server, &dir));
}

#[test]
fn journaled_redis_empty_commit_is_a_no_op() {
    let server = powerplane_tests::redis_server::RedisServer::start();
    let dir = tempfile::tempdir().expect("tempdir");
    contract::empty_commit_is_a_no_op(&mut journaled(&server, &dir));
}

fn postgres(db: &powerplane_tests::pg::Db) -> Store {
    Store::new(Box::new(
        integrations::store::postgres::PostgresBackend::connect(&db.url(), "powerplane")
            .expect("connect to the test's database"),
    ))
}

#[test]
fn postgres_starts_empty() {
    let db = powerplane_tests::pg::Db::new();
    contract::starts_empty(&mut postgres(&db));
}

#[test]
fn postgres_reads_back_what_it_commits() {
    let db = powerplane_tests::pg::Db::new();
    contract::reads_back_what_it_commits(&mut postgres(&db));
}

#[test]
fn postgres_survives_a_restart() {
    let db = powerplane_tests::pg::Db::new();
    contract::survives_a_restart(|| postgres(&db));
}

#[test]
fn postgres_empty_commit_is_a_no_op() {
    let db = powerplane_tests::pg::Db::new();
    contract::empty_commit_is_a_no_op(&mut postgres(&db));
}

#[test]
fn postgres_stays_behind_a_journal_and_applies_each_batch_once() {
    use integrations::store::{Backend, Batch, Op};
    let db = powerplane_tests::pg::Db::new();
    let mut b = integrations::store::postgres::PostgresBackend::connect(&db.url(), "powerplane")
        .expect("connect");
    let batch = Batch {
        ops: vec![Op::Append {
            log: "audit".into(),
            value: b"one".to_vec(),
        }],
    };
    assert!(b.commit_once("w1", 1, &batch).expect("first"));
    assert!(
        !b.commit_once("w1", 1, &batch).expect("again"),
        "applied twice"
    );
    assert_eq!(b.applied("w1").expect("applied"), 1);
    assert_eq!(b.log_len("audit").expect("len"), 1);
    // fencing: a batch of an older epoch than one committed is refused whole
    let fenced = |epoch, value: &[u8]| Batch {
        ops: vec![
            Op::Fence { epoch },
            Op::Append {
                log: "audit".into(),
                value: value.to_vec(),
            },
        ],
    };
    b.commit(&fenced(7, b"leader 7")).expect("epoch 7");
    let e = b.commit(&fenced(6, b"deposed 6")).expect_err("fenced");
    assert!(
        matches!(e, integrations::store::StoreError::Fenced { epoch: 6, .. }),
        "{e}"
    );
    b.commit(&fenced(8, b"leader 8")).expect("epoch 8");
    let log: Vec<Vec<u8>> = b
        .read_log("audit", 1, 10)
        .expect("read")
        .into_iter()
        .map(|r| r.1)
        .collect();
    assert_eq!(
        log,
        vec![b"one".to_vec(), b"leader 7".to_vec(), b"leader 8".to_vec()]
    );
}

#[test]
fn an_unreachable_postgres_is_a_clear_error() {
    let err = integrations::store::postgres::PostgresBackend::connect(
        "postgres://pp:s3cret@127.0.0.1:1/x",
        "powerplane",
    )
    .err()
    .expect("nothing listens on port 1");
    let text = err.to_string();
    assert!(
        text.starts_with("postgres store: cannot connect to postgres://pp:***@127.0.0.1:1/x"),
        "{text}"
    );
    assert!(!text.contains("s3cret"), "{text}");
}
