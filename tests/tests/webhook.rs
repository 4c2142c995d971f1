//! The webhook outbox against a real HTTP receiver: refused actions and actions that
//! run out of attempts go to the dead-letter list, a job's later actions wait for the
//! earlier ones, and the outbox survives reopening the store.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use integrations::store::{Store, Tx};
use integrations::webhook::{Action, Outbox, OutboxConfig, WebhookKey};
use orchestrator::embedded::EmbeddedBackend;
use powerplane_tests::fixtures;
use telemetry::Timestamp;

fn key() -> WebhookKey {
    WebhookKey::from_text("8f3c1d2e4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0")
        .expect("key")
}

/// A receiver answering each request with the status `answer` gives for its body.
fn receiver(answer: fn(&str) -> u16) -> (String, Arc<Mutex<Vec<String>>>) {
    let server = tiny_http::Server::http("127.0.0.1:0").expect("receiver");
    let url = format!(
        "http://127.0.0.1:{}/hook",
        server.server_addr().to_ip().expect("ip").port()
    );
    let got: Arc<Mutex<Vec<String>>> = Arc::default();
    let sink = got.clone();
    std::thread::spawn(move || {
        for mut req in server.incoming_requests() {
            let mut body = String::new();
            let _ = std::io::Read::read_to_string(req.as_reader(), &mut body);
            let status = answer(&body);
            sink.lock().expect("lock").push(body);
            let _ = req.respond(tiny_http::Response::from_string("").with_status_code(status));
        }
    });
    (url, got)
}

fn config(url: &str) -> OutboxConfig {
    OutboxConfig {
        url: url.to_string(),
        client: sources::http::blocking_client(Duration::from_secs(5), &Default::default())
            .expect("client"),
        max_attempts: 3,
        backoff_s: 0.01,
        max_backoff_s: 0.02,
        per_pass: 50,
    }
}

#[test]
fn refused_and_exhausted_actions_are_dead_lettered_and_order_per_job_is_kept() {
    // job-a's hold is refused (400): dead at once, then its release goes through;
    // job-b's hold meets a 503 every time: dead after max_attempts
    let (url, got) = receiver(|body| {
        if body.contains("\"job\":\"lsf:b\"") {
            503
        } else if body.contains("\"action\":\"hold\"") {
            400
        } else {
            200
        }
    });
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("s.redb");
    let open = || Store::new(Box::new(EmbeddedBackend::open(&path).expect("store")));
    let mut store = open();
    let mut outbox = Outbox::restore(config(&url), key(), &mut store).expect("outbox");
    let mut a = fixtures::job("lsf:a", telemetry::JobState::Pending);
    a.scheduler = "lsf".into();
    let mut b = fixtures::job("lsf:b", telemetry::JobState::Pending);
    b.scheduler = "lsf".into();
    let t0 = Timestamp::from_secs(1_900_000_000);
    let mut tx = Tx::new();
    let until = "2030-01-01T00:00:00Z".to_string();
    outbox.enqueue(
        &a,
        &Action::Hold {
            until: until.clone(),
        },
        "r",
        t0,
        &mut tx,
    );
    outbox.enqueue(&b, &Action::Hold { until }, "r", t0, &mut tx);
    outbox.enqueue(&a, &Action::Release, "r", t0, &mut tx);
    store.commit(tx).expect("commit");
    drop(outbox);
    drop(store);

    // reopened: all three wait
    let mut store = open();
    let mut outbox = Outbox::restore(config(&url), key(), &mut store).expect("outbox");
    assert_eq!(outbox.pending().len(), 3);
    let mut at = t0;
    for _ in 0..10 {
        at = at.plus_secs(1.0);
        outbox.deliver(at, &mut store);
    }
    let dead = Outbox::dead(&mut store).expect("dead");
    let dead_jobs: Vec<(&str, u32)> = dead.iter().map(|d| (d.job.as_str(), d.attempts)).collect();
    assert_eq!(dead_jobs, vec![("lsf:a", 1), ("lsf:b", 3)], "{dead:?}");
    assert!(dead.iter().all(|d| d.last_error.is_some()));
    assert!(outbox.pending().is_empty());
    let got = got.lock().expect("lock").clone();
    let a_actions: Vec<bool> = got
        .iter()
        .filter(|b| b.contains("\"job\":\"lsf:a\""))
        .map(|b| b.contains("\"action\":\"hold\""))
        .collect();
    assert_eq!(
        a_actions,
        vec![true, false],
        "job a: the hold, then the release"
    );
    // job b's failures did not hold job a's release back: it went in the first pass
    let first_release = got
        .iter()
        .position(|b| b.contains("\"action\":\"release\""))
        .expect("release");
    assert!(
        first_release < 3,
        "a's release waited for b's retries: {got:?}"
    );
    assert_eq!(
        got.iter()
            .filter(|b| b.contains("\"job\":\"lsf:b\""))
            .count(),
        3
    );
    assert_eq!((outbox.counters.delivered, outbox.counters.dead), (1, 2));
    // a new action after a restart never reuses an id
    drop(outbox);
    let mut outbox = Outbox::restore(config(&url), key(), &mut store).expect("outbox");
    let mut tx = Tx::new();
    outbox.enqueue(&a, &Action::Resume, "r", t0, &mut tx);
    let new_id = outbox.pending()[0].id.clone();
    assert!(
        dead.iter().all(|d| d.id != new_id) && new_id.ends_with("-4"),
        "{new_id}"
    );
}
