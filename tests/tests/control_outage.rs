//! The deterministic control loop over the simulated facility, run twice with a Redis
//! store behind its journal: once with Redis up throughout, once with Redis killed
//! (`kill -9`) mid-run and restarted, and once more with the controller itself
//! stopped during the outage and started again. What Redis holds at the end is the
//! same: no decision, ledger entry, job or hold lost or written twice.

use std::time::{Duration, Instant};

use integrations::store::journal::{Journaled, Limits};
use integrations::store::redis::RedisBackend;
use integrations::store::{Conditions, LedgerEntry, Store};
use orchestrator::control::{ControlLoop, Telemetry};
use orchestrator::demo::{DEFAULT_POLICY, DEFAULT_PRICES, DEFAULT_SITE, DEFAULT_START};
use orchestrator::sim::workload::Workload;
use orchestrator::sim::Facility;
use policies::{Decision, Policy, State};
use powerplane_tests::redis_server::RedisServer;
use telemetry::prices::Series;
use telemetry::{Job, Site, Timestamp};

const TICKS: usize = 40;
const KILL_AT: usize = 10;
const RESTART_AT: usize = 25;

fn site() -> Site {
    Site::parse("site.toml", DEFAULT_SITE).expect("demo site")
}

fn facility() -> Facility {
    let prices = Series::from_csv("prices.csv", DEFAULT_PRICES, "price_per_kwh").expect("prices");
    let carbon =
        Series::from_csv("prices.csv", DEFAULT_PRICES, "carbon_g_per_kwh").expect("carbon");
    let start = Timestamp::parse_rfc3339(DEFAULT_START).expect("start") + 2.0 * 3600.0;
    Facility::new(site(), prices, carbon, Workload::default(), 3, start)
}

fn open(server: &RedisServer, journal: &std::path::Path) -> Store {
    let redis = RedisBackend::connect(&server.url(), "control").expect("connect to the test redis");
    Store::new(Box::new(
        Journaled::open(Box::new(redis), journal, Limits::default()).expect("journal"),
    ))
}

fn control(store: Store) -> ControlLoop {
    let policy = Policy::parse("policy.toml", DEFAULT_POLICY).expect("demo policy");
    ControlLoop::restore(site(), policy, store, 60.0).expect("restore")
}

fn tick(control: &mut ControlLoop, fac: &mut Facility) {
    fac.step(15.0);
    let now = fac.now();
    let samples = fac.poll(now);
    let jobs = fac.jobs();
    let report = control.tick(now, samples, jobs, fac);
    assert_eq!(
        report.store_error, None,
        "every tick's batch is committed or journaled"
    );
}

/// Everything the run left in Redis.
#[derive(Debug, PartialEq)]
struct Stored {
    audit: Vec<(u64, Decision)>,
    ledger: Vec<(u64, LedgerEntry)>,
    conditions: Vec<(u64, Conditions)>,
    jobs: Vec<Job>,
    state: State,
}

fn stored(server: &RedisServer) -> Stored {
    let mut s = Store::new(Box::new(
        RedisBackend::connect(&server.url(), "control").expect("connect"),
    ));
    Stored {
        audit: s.audit(1, 100_000).expect("audit"),
        ledger: s.ledger(1, 100_000).expect("ledger"),
        conditions: s.conditions(1, 100_000).expect("conditions"),
        jobs: s.jobs().expect("jobs"),
        state: s.state().expect("state"),
    }
}

/// Commits the loop's last writes (as serve does at shutdown) once Redis takes them.
fn finish(control: &mut ControlLoop, fac: &Facility) {
    control.finish(fac.now()).expect("finish");
    let t = Instant::now();
    while control.store().audit_len().is_err() {
        assert!(
            t.elapsed() < Duration::from_secs(15),
            "the journal was not replayed within 15 s of the restart"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn normal_run() -> Stored {
    let server = RedisServer::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut fac = facility();
    let mut c = control(open(&server, &dir.path().join("journal.redb")));
    for _ in 0..TICKS {
        tick(&mut c, &mut fac);
    }
    finish(&mut c, &fac);
    let s = stored(&server);
    assert!(
        !s.state.caps.is_empty() && !s.state.holds.is_empty() && s.audit.len() > 10,
        "the scenario caps, holds and decides: {} caps, {} holds, {} decisions",
        s.state.caps.len(),
        s.state.holds.len(),
        s.audit.len()
    );
    s
}

#[test]
fn a_redis_killed_mid_run_and_restarted_ends_with_what_a_run_without_outage_has() {
    let expected = normal_run();
    let mut server = RedisServer::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut fac = facility();
    let mut c = control(open(&server, &dir.path().join("journal.redb")));
    for i in 0..TICKS {
        if i == KILL_AT {
            server.kill9();
        }
        if i == RESTART_AT {
            server.restart();
        }
        tick(&mut c, &mut fac);
    }
    let health = c.store().health().expect("health");
    finish(&mut c, &fac);
    let got = stored(&server);
    assert_eq!(got.audit.len(), expected.audit.len(), "audit length");
    assert_eq!(
        got, expected,
        "the same audit, ledger, jobs, caps and holds"
    );
    assert!(health.journaled.load(std::sync::atomic::Ordering::Relaxed) >= 15);
}

#[test]
fn a_controller_stopped_during_the_outage_resumes_from_its_journal() {
    let expected = normal_run();
    let mut server = RedisServer::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let journal = dir.path().join("journal.redb");
    let mut fac = facility();
    let mut c = control(open(&server, &journal));
    for i in 0..RESTART_AT {
        if i == KILL_AT {
            server.kill9();
        }
        tick(&mut c, &mut fac);
    }
    // SIGTERM during the outage: serve closes the ledger interval and stops
    drop(c);
    server.restart();
    let mut c = control(open(&server, &journal));
    assert_eq!(
        c.state(),
        &expected_state_at(RESTART_AT),
        "restore brings back what was last actuated, not what Redis had before the outage"
    );
    for _ in RESTART_AT..TICKS {
        tick(&mut c, &mut fac);
    }
    finish(&mut c, &fac);
    let got = stored(&server);
    assert_eq!(got.audit, expected.audit, "the same audit log");
    assert_eq!(got.jobs, expected.jobs, "the same jobs");
    assert_eq!(got.state, expected.state, "the same caps and holds");
}

/// The loop's state after `ticks` ticks of a run with Redis up throughout.
fn expected_state_at(ticks: usize) -> State {
    let server = RedisServer::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut fac = facility();
    let mut c = control(open(&server, &dir.path().join("journal.redb")));
    for _ in 0..ticks {
        tick(&mut c, &mut fac);
    }
    // as the store gives it back: through JSON, whose parser may differ in the last bit
    let json = serde_json::to_vec(c.state()).expect("state to json");
    serde_json::from_slice(&json).expect("state from json")
}
