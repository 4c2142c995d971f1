//! The control loop over the simulated facility: restarts lose nothing, a failing store
//! does not stop it, bad telemetry is counted and survived.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use integrations::store::{Backend, Batch, Store, StoreError};
use orchestrator::control::{ControlLoop, Telemetry};
use orchestrator::demo::{DEFAULT_POLICY, DEFAULT_PRICES, DEFAULT_SITE, DEFAULT_START};
use orchestrator::embedded::EmbeddedBackend;
use orchestrator::sim::workload::Workload;
use orchestrator::sim::Facility;
use policies::{Action, Policy};
use telemetry::metric::names::*;
use telemetry::prices::Series;
use telemetry::{EntityId, Sample, Site, Timestamp};

fn site() -> Site {
    Site::parse("site.toml", DEFAULT_SITE).expect("demo site")
}

fn facility(seed: u64) -> Facility {
    let prices = Series::from_csv("prices.csv", DEFAULT_PRICES, "price_per_kwh").expect("prices");
    let carbon =
        Series::from_csv("prices.csv", DEFAULT_PRICES, "carbon_g_per_kwh").expect("carbon");
    // start in the expensive morning so that holds and caps are both in force
    let start = Timestamp::parse_rfc3339(DEFAULT_START).expect("start") + 2.0 * 3600.0;
    Facility::new(site(), prices, carbon, Workload::default(), seed, start)
}

fn control(store: Store) -> ControlLoop {
    let policy = Policy::parse("policy.toml", DEFAULT_POLICY).expect("demo policy");
    ControlLoop::restore(site(), policy, store, 60.0).expect("restore")
}

/// Runs `ticks` ticks of 15 s; returns the number of decisions made.
fn run(control: &mut ControlLoop, fac: &mut Facility, ticks: usize) -> usize {
    let mut decisions = 0;
    for _ in 0..ticks {
        fac.step(15.0);
        let now = fac.now();
        let samples = fac.poll(now);
        let jobs = fac.jobs();
        decisions += control.tick(now, samples, jobs, fac).decisions.len();
    }
    decisions
}

fn restart_keeps_everything(open: &mut dyn FnMut() -> Store) {
    let mut fac = facility(3);
    let mut first = control(open());
    let made = run(&mut first, &mut fac, 40);
    let state = first.state().clone();
    let jobs: Vec<_> = first.registry().all().cloned().collect();
    assert!(
        !state.caps.is_empty() && !state.holds.is_empty(),
        "the scenario puts caps and holds in force: {} caps, {} holds",
        state.caps.len(),
        state.holds.len()
    );
    drop(first);

    let mut second = control(open());
    assert_eq!(
        second.state(),
        &state,
        "caps, holds and thermal levels with their leases come back"
    );
    assert_eq!(
        second.registry().all().cloned().collect::<Vec<_>>(),
        jobs,
        "the job registry comes back"
    );
    assert_eq!(
        second.store().audit_len().expect("audit"),
        made as u64,
        "every decision is in the audit log"
    );
    // the restored loop carries on without re-deciding what is already in force
    fac.step(15.0);
    let now = fac.now();
    let samples = fac.poll(now);
    let report = second.tick(now, samples, fac.jobs(), &mut fac);
    let repeated_holds = report
        .decisions
        .iter()
        .filter(|d| matches!(d.action, Action::Hold { .. }))
        .filter(|d| match &d.target {
            policies::Target::Job { job } => state.holds.contains_key(job),
            _ => false,
        });
    assert_eq!(
        repeated_holds.count(),
        0,
        "no hold is placed twice after a restart"
    );
}

#[test]
fn a_restart_loses_nothing_with_the_embedded_store() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("state.redb");
    restart_keeps_everything(&mut || {
        Store::new(Box::new(EmbeddedBackend::open(&path).expect("open")))
    });
}

#[test]
fn a_restart_loses_nothing_with_redis() {
    let mut first = true;
    restart_keeps_everything(&mut || {
        let backend = if first {
            first = false;
            powerplane_tests::redis_backend("control_restart")
        } else {
            let prefix = format!("powerplane-test:{}:control_restart", std::process::id());
            integrations::store::redis::RedisBackend::connect(
                &powerplane_tests::redis_url(),
                &prefix,
            )
            .expect("reconnect")
        };
        Store::new(Box::new(backend))
    });
}

/// A backend that fails while `down` is set.
struct Flaky {
    inner: EmbeddedBackend,
    down: Arc<AtomicBool>,
}

impl Flaky {
    fn check(&self) -> Result<(), StoreError> {
        if self.down.load(Ordering::SeqCst) {
            return Err(StoreError::Backend {
                backend: "flaky",
                message: "injected outage".into(),
                source: None,
            });
        }
        Ok(())
    }
}

impl Backend for Flaky {
    fn commit(&mut self, batch: &Batch) -> Result<Vec<u64>, StoreError> {
        self.check()?;
        self.inner.commit(batch)
    }
    fn get(&mut self, c: &str, k: &str) -> Result<Option<Vec<u8>>, StoreError> {
        self.check()?;
        self.inner.get(c, k)
    }
    fn list(&mut self, c: &str) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        self.check()?;
        self.inner.list(c)
    }
    fn read_log(
        &mut self,
        l: &str,
        from: u64,
        limit: usize,
    ) -> Result<Vec<(u64, Vec<u8>)>, StoreError> {
        self.check()?;
        self.inner.read_log(l, from, limit)
    }
    fn log_len(&mut self, l: &str) -> Result<u64, StoreError> {
        self.check()?;
        self.inner.log_len(l)
    }
    fn name(&self) -> &'static str {
        "flaky"
    }
    fn commit_once(&mut self, writer: &str, seq: u64, batch: &Batch) -> Result<bool, StoreError> {
        self.check()?;
        self.inner.commit_once(writer, seq, batch)
    }
    fn applied(&mut self, writer: &str) -> Result<u64, StoreError> {
        self.check()?;
        self.inner.applied(writer)
    }
}

#[test]
fn a_store_outage_does_not_stop_the_loop_and_loses_no_record() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("state.redb");
    let down = Arc::new(AtomicBool::new(false));
    let store = Store::new(Box::new(Flaky {
        inner: EmbeddedBackend::open(&path).expect("open"),
        down: down.clone(),
    }));
    let mut fac = facility(5);
    let mut ctl = control(store);
    let mut made = run(&mut ctl, &mut fac, 10);
    down.store(true, Ordering::SeqCst);
    made += run(&mut ctl, &mut fac, 20);
    assert_eq!(
        ctl.counters.store_errors, 20,
        "every tick of the outage was counted"
    );
    assert!(
        !ctl.state().caps.is_empty() || !ctl.state().holds.is_empty(),
        "the loop kept deciding during the outage"
    );
    down.store(false, Ordering::SeqCst);
    made += run(&mut ctl, &mut fac, 5);
    let state = ctl.state().clone();
    assert_eq!(
        ctl.store().audit_len().expect("audit"),
        made as u64,
        "decisions made during the outage were written afterwards"
    );
    assert_eq!(
        ctl.store().state().expect("state"),
        state,
        "the store holds the state in force"
    );
}

#[test]
fn a_shutdown_the_store_refuses_says_exactly_what_it_could_not_keep() {
    let dir = tempfile::tempdir().expect("tempdir");
    let down = Arc::new(AtomicBool::new(false));
    let store = Store::new(Box::new(Flaky {
        inner: EmbeddedBackend::open(&dir.path().join("state.redb")).expect("open"),
        down: down.clone(),
    }));
    let mut fac = facility(5);
    let mut ctl = control(store);
    run(&mut ctl, &mut fac, 5);
    down.store(true, Ordering::SeqCst);
    let made = run(&mut ctl, &mut fac, 10);
    let e = ctl
        .finish(fac.now())
        .expect_err("the store refuses the shutdown's commit");
    let text = e.to_string();
    assert!(text.contains("writes not kept ("), "{text}");
    assert!(
        text.contains("ledger: "),
        "the closing interval is named: {text}"
    );
    if made > 0 {
        assert!(
            text.contains(&format!("audit: {made}")),
            "{made} decisions: {text}"
        );
    }
    assert!(text.contains("injected outage"), "the cause: {text}");
}

#[test]
fn a_long_outage_keeps_what_waits_in_memory_bounded_and_names_what_it_dropped() {
    const BOUND: usize = 128 << 10;
    let dir = tempfile::tempdir().expect("tempdir");
    let down = Arc::new(AtomicBool::new(false));
    let store = Store::new(Box::new(Flaky {
        inner: EmbeddedBackend::open(&dir.path().join("state.redb")).expect("open"),
        down: down.clone(),
    }));
    let mut fac = facility(5);
    let mut ctl = control(store);
    ctl.set_max_waiting_bytes(BOUND);
    let mut made = run(&mut ctl, &mut fac, 5);
    let ledger_before = ctl.store().ledger_len().expect("ledger");
    down.store(true, Ordering::SeqCst);
    let mut peak = 0;
    let mut ledger_made = 0;
    for _ in 0..60 {
        fac.step(15.0);
        let now = fac.now();
        let samples = fac.poll(now);
        let jobs = fac.jobs();
        let r = ctl.tick(now, samples, jobs, &mut fac);
        made += r.decisions.len();
        ledger_made += r.ledger.len() as u64;
        let (writes, bytes) = ctl.waiting();
        peak = peak.max(bytes);
        assert!(bytes <= BOUND, "{bytes} bytes wait, over the bound");
        assert_eq!(ctl.counters.store_waiting_writes, writes as u64);
        assert_eq!(ctl.counters.store_waiting_bytes, bytes as u64);
    }
    assert!(peak > BOUND / 2, "the outage reached the bound: {peak}");
    let dropped = ctl.counters.store_writes_dropped.clone();
    // the energy ledger goes last: conditions and audit records were dropped too
    assert!(
        dropped.get("conditions").is_some_and(|n| *n > 0)
            && dropped.get("audit").is_some_and(|n| *n > 0),
        "rack conditions and audit records went first: {dropped:?}"
    );
    let ledger_dropped = dropped.get("ledger").copied().unwrap_or(0);
    assert!(
        ledger_dropped < ledger_made,
        "the newest ledger entries are kept: {dropped:?} of {ledger_made}"
    );
    down.store(false, Ordering::SeqCst);
    let r = {
        fac.step(15.0);
        let now = fac.now();
        let samples = fac.poll(now);
        let jobs = fac.jobs();
        ctl.tick(now, samples, jobs, &mut fac)
    };
    made += r.decisions.len();
    ledger_made += r.ledger.len() as u64;
    assert!(r.store_error.is_none(), "{:?}", r.store_error);
    assert_eq!(ctl.waiting(), (0, 0), "everything left was committed");
    let audit_dropped = dropped.get("audit").copied().unwrap_or(0);
    assert_eq!(
        ctl.store().audit_len().expect("audit") + audit_dropped,
        made as u64,
        "each decision is in the audit log or counted as dropped"
    );
    assert_eq!(
        ctl.store().ledger_len().expect("ledger") - ledger_before + ledger_dropped,
        ledger_made,
        "each ledger entry of the outage is in the store or counted as dropped"
    );
    assert_eq!(ctl.store().state().expect("state"), ctl.state().clone());
    // the shutdown names what was dropped, though its own commit succeeds
    ctl.finish(fac.now())
        .expect("the store takes the shutdown's commit");
}

#[test]
fn the_embedded_store_behind_a_journal_keeps_an_outage_on_disk_not_in_memory() {
    use integrations::store::journal::{Journaled, Limits};
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("state.redb");
    let journal = dir.path().join("journal.redb");
    let down = Arc::new(AtomicBool::new(false));
    let open = |down: Arc<AtomicBool>| {
        let flaky = Flaky {
            inner: EmbeddedBackend::open(&file).expect("open"),
            down,
        };
        Store::new(Box::new(
            Journaled::open(Box::new(flaky), &journal, Limits::default()).expect("journal"),
        ))
    };
    let mut fac = facility(5);
    let mut ctl = control(open(down.clone()));
    let health = ctl.store().health().expect("the journal's health");
    let mut made = run(&mut ctl, &mut fac, 5);
    down.store(true, Ordering::SeqCst);
    made += run(&mut ctl, &mut fac, 30);
    assert_eq!(ctl.counters.store_errors, 0, "the journal took every batch");
    assert_eq!(ctl.waiting(), (0, 0), "nothing waits in memory");
    let depth = health
        .journal_depth
        .load(std::sync::atomic::Ordering::Relaxed);
    assert!(
        depth >= 20,
        "the outage's batches are in the journal: {depth}"
    );
    assert!(!health.is_reachable(), "the store is shown unreachable");
    down.store(false, Ordering::SeqCst);
    made += run(&mut ctl, &mut fac, 3);
    assert_eq!(
        health
            .journal_depth
            .load(std::sync::atomic::Ordering::Relaxed),
        0,
        "the journal was replayed"
    );
    assert!(health.is_reachable());
    assert_eq!(
        ctl.store().audit_len().expect("audit"),
        made as u64,
        "every decision is in the audit log, once"
    );
    let state = ctl.state().clone();
    assert_eq!(ctl.store().state().expect("state"), state);
    ctl.finish(fac.now()).expect("shutdown");
    let jobs: Vec<_> = ctl.registry().all().cloned().collect();
    drop(ctl);
    // a restart over both files finds it all
    let mut again = control(open(Arc::new(AtomicBool::new(false))));
    assert_eq!(again.state(), &state);
    assert_eq!(again.registry().all().cloned().collect::<Vec<_>>(), jobs);
    assert_eq!(again.store().audit_len().expect("audit"), made as u64);
}

#[test]
fn a_batch_replayed_after_a_crash_is_not_applied_twice_by_the_embedded_store() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut b = EmbeddedBackend::open(&dir.path().join("state.redb")).expect("open");
    let mut tx = integrations::store::Tx::new();
    tx.append_record("audit", &"one");
    assert_eq!(b.applied("w").expect("applied"), 0);
    assert!(b.commit_once("w", 1, tx.batch()).expect("commit"));
    assert!(
        !b.commit_once("w", 1, tx.batch()).expect("commit"),
        "a replay is skipped"
    );
    assert_eq!(b.log_len("audit").expect("len"), 1);
    assert_eq!(b.applied("w").expect("applied"), 1);
    assert!(b.commit_once("w", 2, tx.batch()).expect("commit"));
    assert!(
        b.commit_once("other", 1, tx.batch()).expect("commit"),
        "writers are apart"
    );
    assert_eq!(b.log_len("audit").expect("len"), 3);
}

/// Samples that must all be rejected, and one good one.
struct Garbage;

impl Telemetry for Garbage {
    fn poll(&mut self, now: Timestamp) -> Vec<Sample> {
        let rack = EntityId::rack("b01");
        vec![
            Sample::new(rack.clone(), INLET_TEMP_C, f64::NAN, now, "bad"),
            Sample::new(rack.clone(), INLET_TEMP_C, 500.0, now, "bad"),
            Sample::new(rack.clone(), POWER_W, -3.0, now, "bad"),
            Sample::new(rack.clone(), INLET_TEMP_C, 35.0, now + 3600.0, "bad"),
            Sample::new(rack, INLET_TEMP_C, 27.5, now, "good"),
        ]
    }
}

#[test]
fn bad_telemetry_is_counted_by_reason_and_the_last_good_value_kept() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::new(Box::new(
        EmbeddedBackend::open(&dir.path().join("s.redb")).expect("open"),
    ));
    let mut ctl = control(store);
    let mut fac = facility(1);
    let now = fac.now();
    let mut g = Garbage;
    let report = ctl.tick(now, g.poll(now), vec![], &mut fac);
    assert_eq!(report.rejected.len(), 4);
    let c = &ctl.counters.samples_rejected;
    assert_eq!(
        (c["not_finite"], c["out_of_range"], c["future_timestamp"]),
        (1, 2, 1)
    );
    assert_eq!(
        ctl.snapshot()
            .observe(&EntityId::rack("b01"), INLET_TEMP_C, now)
            .map(|o| o.value),
        Some(27.5)
    );
    assert!(
        report
            .rejected
            .iter()
            .any(|r| r.contains("rack/b01 inlet_temp_c: 500 is outside the physical range")),
        "{:?}",
        report.rejected
    );
}

/// The backtest runs the loop without records: it must decide and actuate exactly as the
/// recording loop `serve` runs, and write nothing.
#[test]
fn a_loop_without_records_decides_and_actuates_as_the_recording_loop_and_writes_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let open = |name: &str| {
        Store::new(Box::new(
            EmbeddedBackend::open(&dir.path().join(name)).expect("open"),
        ))
    };
    let mut recording = control(open("a.redb"));
    let mut replay = control(open("b.redb")).without_records();
    let (mut fa, mut fb) = (facility(7), facility(7));
    let (mut caps, mut holds, mut decisions) = (0, 0, 0);
    for tick in 0..240 {
        fa.step(15.0);
        fb.step(15.0);
        let now = fa.now();
        let ra = recording.tick(now, fa.poll(now), fa.jobs(), &mut fa);
        let rb = replay.tick(now, fb.poll(now), fb.jobs(), &mut fb);
        let what = |r: &orchestrator::control::TickReport| {
            r.decisions
                .iter()
                .map(|d| format!("{} {:?} {:?} {}", d.rule, d.target, d.action, d.reason))
                .collect::<Vec<_>>()
        };
        assert_eq!(what(&ra), what(&rb), "tick {tick}: the same decisions");
        assert_eq!(
            recording.state(),
            replay.state(),
            "tick {tick}: the same plan"
        );
        assert_eq!(
            recording.actuated(),
            replay.actuated(),
            "tick {tick}: the same actuation"
        );
        assert!(rb.ledger.is_empty(), "no ledger entries without records");
        caps = caps.max(replay.state().caps.len());
        holds = holds.max(replay.state().holds.len());
        decisions += rb.decisions.len();
    }
    assert!(
        caps > 0 && holds > 0 && decisions > 0,
        "the run puts caps ({caps}) and holds ({holds}) in force, with {decisions} decisions"
    );
    assert!(recording.store().audit_len().expect("audit") > 0);
    assert_eq!(
        replay.store().audit_len().expect("audit"),
        0,
        "nothing audited"
    );
    assert!(
        replay.store().jobs().expect("jobs").is_empty(),
        "no job stored"
    );
}
