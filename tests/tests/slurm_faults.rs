//! The Slurm adapter against a fake slurmrestd that is unreachable or misbehaves on
//! purpose: down at start (the client is built later, on the next call), answering a
//! job list that is not JSON, one over `max_answer_bytes`, and 401. Each is counted
//! where `/metrics` reads it, and the last good job view stays what the adapter acts
//! on.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

use integrations::scheduler::Scheduler;
use integrations::slurm::JobMapping;
use integrations::slurm_api::SlurmApiConfig;
use integrations::slurm_sync::SlurmSync;
use integrations::store::Store;
use orchestrator::embedded::EmbeddedBackend;
use policies::Hold;
use telemetry::Timestamp;

const DOWN: u8 = 0;
const GOOD: u8 = 1;
const NOT_JSON: u8 = 2;
const HUGE: u8 = 3;
const REFUSED: u8 = 4;

fn fixture(path: &str) -> String {
    let p = format!("{}/fixtures/slurm/{path}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{p}: {e}"))
}

/// A fake Slurm 24.11 slurmrestd whose behaviour is `mode`; returns its address and
/// the paths it was asked for.
fn fake(mode: Arc<AtomicU8>) -> (String, Arc<std::sync::Mutex<Vec<String>>>) {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let at = format!("http://{}", l.local_addr().expect("addr"));
    let asked = Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = asked.clone();
    let (openapi, jobs, hold) = (
        fixture("24.11/openapi.json"),
        fixture("24.11/v0.0.42/jobs.json"),
        fixture("24.11/v0.0.42/update_hold.json"),
    );
    std::thread::spawn(move || {
        for mut s in l.incoming().flatten() {
            let mut req = Vec::new();
            let mut buf = [0u8; 8192];
            while !req.windows(4).any(|w| w == b"\r\n\r\n") {
                match s.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => req.extend_from_slice(&buf[..n]),
                }
            }
            let text = String::from_utf8_lossy(&req).to_string();
            let mut words = text.split_whitespace();
            let (method, path) = (words.next().unwrap_or(""), words.next().unwrap_or("/"));
            log.lock().expect("log").push(format!("{method} {path}"));
            let (status, body) = match (mode.load(Ordering::SeqCst), path) {
                (DOWN, _) => (503, "slurmctld is down".to_string()),
                (REFUSED, _) => (401, "Authentication failure".to_string()),
                (_, "/openapi/v3") => (200, openapi.clone()),
                (NOT_JSON, _) => (200, "<html>proxy error</html>".to_string()),
                (HUGE, _) => (
                    200,
                    format!("{{\"jobs\": [], \"pad\": \"{}\"}}", "x".repeat(2 << 20)),
                ),
                (_, p) if p.starts_with("/slurm/v0.0.42/job/") => (200, hold.clone()),
                _ => (200, jobs.clone()),
            };
            let _ = write!(
                s,
                "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    (at, asked)
}

fn now() -> Timestamp {
    Timestamp(chrono::Utc::now().timestamp_millis())
}

fn counter(sync: &SlurmSync, name: &str) -> f64 {
    sync.counters()
        .into_iter()
        .find(|c| c.0 == name)
        .unwrap_or_else(|| panic!("{name} is not among the adapter's counters"))
        .2
}

#[test]
fn slurmrestd_down_at_start_then_answering_badly_is_counted_and_the_last_view_is_acted_on() {
    let mode = Arc::new(AtomicU8::new(DOWN));
    let (at, asked) = fake(mode.clone());
    let dir = tempfile::tempdir().expect("tmp");
    let mut store = Store::new(Box::new(
        EmbeddedBackend::open(&dir.path().join("s.redb")).expect("store"),
    ));
    let mut api = SlurmApiConfig::new(&at);
    api.max_answer_bytes = 1 << 20;
    api.timeout_s = 2.0;
    // restoring does no IO: a slurmrestd that is down does not stop serve from starting
    let mut sync = SlurmSync::restore(api, JobMapping::default(), &mut store).expect("restore");
    assert!(
        asked.lock().expect("log").is_empty(),
        "restore called slurmrestd"
    );

    let e = sync.poll(now(), &mut store).expect_err("down");
    assert!(e.to_string().contains(&at), "{e}");
    assert_eq!(sync.version(), None);
    assert_eq!(counter(&sync, "slurm_connect_errors_total"), 1.0);
    assert_eq!(counter(&sync, "slurm_poll_errors_total"), 1.0);

    // back: the next call builds the client, finds v0.0.42 and lists the jobs
    mode.store(GOOD, Ordering::SeqCst);
    let jobs = sync.poll(now(), &mut store).expect("poll");
    assert_eq!(sync.version().as_deref(), Some("v0.0.42"));
    assert_eq!(jobs.len(), 3, "{jobs:?}");

    for (bad, name) in [
        (NOT_JSON, "slurm_malformed_total"),
        (HUGE, "slurm_oversized_total"),
        (REFUSED, "slurm_unauthorized_total"),
    ] {
        mode.store(bad, Ordering::SeqCst);
        let e = sync.poll(now(), &mut store).expect_err("a bad answer");
        assert_eq!(counter(&sync, name), 1.0, "{name} after {e}");
    }
    assert_eq!(counter(&sync, "slurm_poll_errors_total"), 4.0);

    // the job list of the last good poll is what the adapter acts on: job 24 is
    // pending there, so a hold is placed
    mode.store(GOOD, Ordering::SeqCst);
    let want = BTreeMap::from([(
        "slurm:24".to_string(),
        Hold {
            rule: "price.defer".into(),
            since: now(),
            lease_until: now().plus_secs(600.0),
            reason: "test".into(),
        },
    )]);
    let done = sync.apply(&want, now(), &mut store);
    assert_eq!(
        done.iter()
            .map(|d| (d.job.as_str(), d.action))
            .collect::<Vec<_>>(),
        [("slurm:24", "hold")]
    );
    assert!(
        asked
            .lock()
            .expect("log")
            .iter()
            .any(|p| p == "POST /slurm/v0.0.42/job/24"),
        "{:?}",
        asked.lock().expect("log")
    );
}
