//! The reconciler against a fake adapter: it applies only a plan computed on its
//! latest poll, the newest desired state wins over one it had no time for, a failed
//! pass is retried after the backoff, and a requeue is carried out once.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use integrations::scheduler::{
    Commit, Counter, Desired, JobId, Pass, Requeue, Requeues, Scheduler, SchedulerError,
    SchedulerId, View, SLURM,
};
use policies::Hold;
use telemetry::{Job, Timestamp};

use super::{Reconciler, Settings};
use crate::schedulers::store_link;

#[derive(Default)]
struct Seen {
    /// Per pass: when, and the holds it was asked for.
    passes: Vec<(Instant, Vec<String>)>,
    requeued: Vec<String>,
}

struct Fake {
    seen: Arc<Mutex<Seen>>,
    apply_takes: Duration,
    /// Passes still to fail.
    failing: Arc<AtomicU32>,
}

impl Scheduler for Fake {
    fn id(&self) -> SchedulerId {
        SLURM.id
    }

    fn requeues(&self) -> Requeues {
        Requeues::Reconciler
    }

    fn poll(
        &mut self,
        _: Timestamp,
        _: &mut dyn Commit,
    ) -> Result<Option<Vec<Job>>, SchedulerError> {
        Ok(Some(Vec::new()))
    }

    fn apply(&mut self, desired: &Desired, _: Timestamp, _: &mut dyn Commit) -> Pass {
        std::thread::sleep(self.apply_takes);
        let holds = desired.holds.keys().cloned().collect();
        self.seen
            .lock()
            .expect("lock")
            .passes
            .push((Instant::now(), holds));
        let failed = match self.failing.load(Ordering::SeqCst) {
            0 => 0,
            n => {
                self.failing.store(n - 1, Ordering::SeqCst);
                1
            }
        };
        Pass {
            applied: Vec::new(),
            failed,
        }
    }

    fn requeue(&mut self, job: &JobId) -> Result<(), SchedulerError> {
        self.seen
            .lock()
            .expect("lock")
            .requeued
            .push(job.to_string());
        Ok(())
    }

    fn view(&self) -> View {
        View::default()
    }

    fn status(&self) -> serde_json::Value {
        serde_json::Value::Null
    }

    fn counters(&self) -> Vec<Counter> {
        Vec::new()
    }
}

struct Rig {
    _rt: crate::Runtime,
    reconciler: Reconciler,
    seen: Arc<Mutex<Seen>>,
    _writes: store_link::StoreWrites,
}

fn rig(apply_takes: Duration, failing: u32) -> Rig {
    let rt = crate::Runtime::new(2).expect("runtime");
    let seen = Arc::new(Mutex::new(Seen::default()));
    let (link, writes) = store_link::link();
    let fake = Fake {
        seen: seen.clone(),
        apply_takes,
        failing: Arc::new(AtomicU32::new(failing)),
    };
    let reconciler = Reconciler::start(
        Box::new(fake),
        Settings {
            poll_every: Some(Duration::from_secs(60)),
            handle: rt.handle(),
            shutdown: rt.shutdown.clone(),
            store: link,
        },
    )
    .expect("start");
    Rig {
        _rt: rt,
        reconciler,
        seen,
        _writes: writes,
    }
}

fn desired(holds: &[&str], poll: u64, requeues: Vec<Requeue>) -> Arc<Desired> {
    let hold = Hold {
        rule: "r".into(),
        since: Timestamp::from_secs(0),
        lease_until: Timestamp::from_secs(4_000_000_000),
        reason: "test".into(),
    };
    Arc::new(Desired {
        holds: holds
            .iter()
            .map(|h| (h.to_string(), hold.clone()))
            .collect(),
        suspended: BTreeMap::new(),
        requeues,
        polls: [(SLURM.id, poll)].into(),
        limits: Default::default(),
    })
}

fn until(what: &str, within: Duration, ok: impl Fn() -> bool) {
    let end = Instant::now() + within;
    while !ok() {
        assert!(Instant::now() < end, "{what}: not within {within:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn only_a_plan_on_the_latest_poll_is_applied() {
    let r = rig(Duration::ZERO, 0);
    until("the first poll", Duration::from_secs(5), || {
        r.reconciler.reported().poll_seq == 1
    });
    r.reconciler.want(desired(&["slurm:1"], 0, Vec::new()));
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        r.seen.lock().expect("lock").passes.is_empty(),
        "a plan that has not seen the poll was applied"
    );
    r.reconciler.want(desired(&["slurm:1"], 1, Vec::new()));
    until("the plan applied", Duration::from_secs(5), || {
        r.seen.lock().expect("lock").passes.len() == 1
    });
}

#[test]
fn the_newest_desired_state_supersedes_one_not_yet_applied() {
    let r = rig(Duration::from_millis(300), 0);
    until("the first poll", Duration::from_secs(5), || {
        r.reconciler.reported().poll_seq == 1
    });
    r.reconciler.want(desired(&["slurm:a"], 1, Vec::new()));
    until("the first pass under way", Duration::from_secs(5), || {
        r.reconciler.reported().busy_since.is_some()
    });
    r.reconciler.want(desired(&["slurm:b"], 1, Vec::new()));
    r.reconciler.want(desired(&["slurm:c"], 1, Vec::new()));
    until("two passes", Duration::from_secs(5), || {
        r.seen.lock().expect("lock").passes.len() >= 2
    });
    std::thread::sleep(Duration::from_millis(400));
    let seen = r.seen.lock().expect("lock");
    let holds: Vec<&Vec<String>> = seen.passes.iter().map(|(_, h)| h).collect();
    assert_eq!(
        holds,
        [&vec!["slurm:a".to_string()], &vec!["slurm:c".to_string()]],
        "the state in between is superseded, the newest applied"
    );
}

#[test]
fn a_failed_pass_is_retried_after_the_backoff_and_a_requeue_runs_once() {
    let r = rig(Duration::ZERO, 1);
    until("the first poll", Duration::from_secs(5), || {
        r.reconciler.reported().poll_seq == 1
    });
    let requeue = Requeue {
        seq: 7,
        job: JobId::slurm(9),
        reason: "hot".into(),
    };
    r.reconciler.want(desired(&[], 1, vec![requeue]));
    until("the retry", Duration::from_secs(5), || {
        r.seen.lock().expect("lock").passes.len() == 2
    });
    let seen = r.seen.lock().expect("lock");
    let gap = seen.passes[1].0 - seen.passes[0].0;
    assert!(
        gap >= super::BACKOFF.mul_f64(0.9),
        "retried after {gap:?}, before the backoff"
    );
    assert_eq!(
        seen.requeued,
        ["slurm:9"],
        "one requeue, however many passes"
    );
    drop(seen);
    assert_eq!(r.reconciler.reported().requeued_up_to, 7);
}
