//! The store contract, against the embedded store and against a real Redis.

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
