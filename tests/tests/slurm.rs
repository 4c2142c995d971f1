//! The Slurm adapter against real single-node Slurms, each test on each: 22.05
//! (OpenAPI v0.0.38, rest_auth/local; `scripts/slurm up`) and 24.11 (v0.0.42, with
//! rest_auth/local on its socket and with JWT over TCP; `scripts/slurm up 24.11`).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use integrations::slurm::JobMapping;
use integrations::slurm_api::{SlurmApiError, Update};
use integrations::slurm_sync::SlurmSync;
use integrations::store::Store;
use orchestrator::embedded::EmbeddedBackend;
use policies::Hold;
use powerplane_tests::slurm::Target;
use telemetry::{JobState, Timestamp};

fn now() -> Timestamp {
    Timestamp(chrono::Utc::now().timestamp_millis())
}

fn held(reason: &str) -> bool {
    reason == "JobHeldAdmin" || reason == "JobHeldUser"
}

/// A job that waits (its begin time is an hour away) until released or begun.
fn waiting_job(t: Target, comment: &str) -> u64 {
    t.sbatch(&[
        "-p",
        "batch",
        "--gres=gpu:1",
        "-t",
        "20",
        "--begin=now+3600",
        "--comment",
        comment,
        "--job-name=pp-test",
        "--wrap",
        "sleep 300",
    ])
}

/// Each test on each Slurm: `on::<test>::slurm_22_05`, `slurm_24_11`, `slurm_24_11_jwt`.
macro_rules! on_each_slurm {
    ($($name:ident),* $(,)?) => {
        mod on {
            $(
                pub mod $name {
                    use powerplane_tests::slurm::Target;
                    #[test]
                    fn slurm_22_05() {
                        super::super::$name(Target::Slurm2205);
                    }
                    #[test]
                    fn slurm_24_11() {
                        super::super::$name(Target::Slurm2411);
                    }
                    #[test]
                    fn slurm_24_11_jwt() {
                        super::super::$name(Target::Slurm2411Jwt);
                    }
                }
            )*
        }
    };
}

on_each_slurm!(
    a_pending_job_is_discovered_mapped_held_released_and_a_running_one_requeued,
    holds_are_ours_across_a_restart_and_others_holds_are_never_touched,
    a_running_job_is_suspended_and_resumed_as_the_plan_says_across_a_restart,
    with_begin_time_holds_slurm_itself_lets_a_job_go_when_powerplane_stops_renewing,
);

fn a_pending_job_is_discovered_mapped_held_released_and_a_running_one_requeued(t: Target) {
    let c = t.config().build().expect("client");
    let deadline = chrono::Utc::now() + chrono::Duration::hours(5);
    let a = waiting_job(
        t,
        &format!("class=training est=600 deadline={}", deadline.to_rfc3339()),
    );
    let mut cancel = t.cancel(vec![a]);
    let jobs = c.jobs().expect("jobs");
    let found = jobs
        .iter()
        .find(|j| j.job_id == a)
        .expect("the new job is listed")
        .to_slurm_job();
    assert_eq!((found.state.as_str(), found.gpus), ("PENDING", 1));
    let job = JobMapping::default().map(&found, false, now());
    assert_eq!(job.id, format!("slurm:{a}"));
    assert_eq!(job.class, "training");
    assert_eq!(job.est_duration_s, 600.0);
    assert_eq!(job.deadline.map(|d| d.0 / 1000), Some(deadline.timestamp()));
    assert!(job.deferrable);
    assert_eq!(job.state, JobState::Pending);
    let me = t.user();
    assert!(job.user == me && job.project == me, "{job:?}");

    c.update(a, Update::Hold).expect("hold");
    let (state, reason) = t.squeue(a).expect("queued");
    assert_eq!(state, "PENDING");
    assert!(held(&reason), "squeue shows {reason}");
    assert!(c.job(a).expect("job").expect("known").held);
    c.update(a, Update::Release).expect("release");
    let (_, reason) = t.squeue(a).expect("queued");
    assert!(!held(&reason), "still held: {reason}");
    assert!(!c.job(a).expect("job").expect("known").held);

    // a running job is requeued: back to pending, with a restart counted
    let b = t.sbatch(&[
        "-p",
        "batch",
        "-t",
        "10",
        "--requeue",
        "--job-name=pp-test",
        "--wrap",
        "sleep 300",
    ]);
    cancel.1.push(b);
    t.wait_squeue(b, Duration::from_secs(30), |s, _| s == "RUNNING");
    c.update(b, Update::Requeue).expect("requeue");
    t.wait_squeue(b, Duration::from_secs(30), |s, _| s == "PENDING");
    let again = c.job(b).expect("job").expect("known");
    assert!(again.restarts >= 1, "{again:?}");
    // an unknown job is an error Slurm explains (by its number), not a success
    let err = c
        .update(999_999_999, Update::Hold)
        .expect_err("no such job");
    assert!(
        matches!(&err, SlurmApiError::Api { numbers, .. } if numbers.contains(&2017)),
        "{err}"
    );
    assert!(c.job(999_999_999).expect("asked").is_none());
}

fn hold(lease_s: f64) -> Hold {
    Hold {
        rule: "price.defer".into(),
        since: now(),
        lease_until: now().plus_secs(lease_s),
        reason: "test".into(),
    }
}

fn holds_are_ours_across_a_restart_and_others_holds_are_never_touched(t: Target) {
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("s.redb");
    let open = || Store::new(Box::new(EmbeddedBackend::open(&path).expect("store")));
    let a = waiting_job(t, "class=batch");
    let admins = waiting_job(t, "class=batch");
    let d = waiting_job(t, "class=batch");
    let _cancel = t.cancel(vec![a, admins, d]);
    t.scontrol(&["hold", &admins.to_string()]);
    let want = |ids: &[u64], lease_s: f64| -> BTreeMap<String, Hold> {
        ids.iter()
            .map(|i| (format!("slurm:{i}"), hold(lease_s)))
            .collect()
    };

    let mut store = open();
    let mut sync =
        SlurmSync::restore(t.config(), JobMapping::default(), &mut store).expect("restore");
    let jobs = sync.poll(now(), &mut store).expect("poll");
    let admin_job = jobs
        .iter()
        .find(|j| j.id == format!("slurm:{admins}"))
        .expect("listed");
    assert!(
        !admin_job.deferrable,
        "a job held by an admin is never deferrable"
    );
    let done = sync.apply(&want(&[a, admins, d], 600.0), now(), &mut store);
    let acted: Vec<_> = done.iter().map(|x| (x.job.clone(), x.action)).collect();
    assert_eq!(
        acted,
        vec![
            (format!("slurm:{a}"), "hold"),
            (format!("slurm:{d}"), "hold")
        ]
    );
    for id in [a, d] {
        assert!(held(&t.squeue(id).expect("queued").1));
    }
    assert_eq!(sync.counters.skipped, 1);
    drop(sync);
    drop(store);

    // restarted: the holds are still ours, and nothing is held twice
    let mut store = open();
    let mut sync =
        SlurmSync::restore(t.config(), JobMapping::default(), &mut store).expect("restore");
    let ours: BTreeSet<String> = sync.ours().into_keys().collect();
    assert_eq!(
        ours,
        BTreeSet::from([format!("slurm:{a}"), format!("slurm:{d}")])
    );
    let jobs = sync.poll(now(), &mut store).expect("poll");
    let a_job = jobs
        .iter()
        .find(|j| j.id == format!("slurm:{a}"))
        .expect("listed");
    assert_eq!(a_job.state, JobState::Held);
    assert!(sync
        .apply(&want(&[a, admins, d], 600.0), now(), &mut store)
        .is_empty());
    assert_eq!(sync.counters.holds, 0);

    // an admin releases one of ours: powerplane lets go and never holds it again
    t.scontrol(&["release", &d.to_string()]);
    sync.poll(now(), &mut store).expect("poll");
    assert_eq!(sync.counters.released_externally, 1);
    assert!(sync
        .apply(&want(&[a, admins, d], 600.0), now(), &mut store)
        .is_empty());
    assert!(!held(&t.squeue(d).expect("queued").1));

    // the plan lets go of `a`: released; the admin's hold stays
    let done = sync.apply(&BTreeMap::new(), now(), &mut store);
    assert_eq!(done.len(), 1, "{done:?}");
    assert_eq!(
        (done[0].job.as_str(), done[0].action),
        (format!("slurm:{a}").as_str(), "release")
    );
    assert!(!held(&t.squeue(a).expect("queued").1));
    assert!(
        held(&t.squeue(admins).expect("queued").1),
        "the admin's hold stays"
    );

    // a hold whose lease has passed is released even if the plan still lists it
    let done = sync.apply(&want(&[a], 2.0), now(), &mut store);
    assert_eq!(done.len(), 1);
    assert!(held(&t.squeue(a).expect("queued").1));
    std::thread::sleep(Duration::from_millis(2100));
    let stale = want(&[a], 2.0)
        .into_iter()
        .map(|(k, mut h)| {
            h.lease_until = now().plus_secs(-0.1);
            (k, h)
        })
        .collect();
    let done = sync.apply(&stale, now(), &mut store);
    assert_eq!(
        done.iter().map(|x| x.action).collect::<Vec<_>>(),
        vec!["release"]
    );
    assert!(!held(&t.squeue(a).expect("queued").1));
    assert!(sync.ours().is_empty());
}

fn a_running_job_is_suspended_and_resumed_as_the_plan_says_across_a_restart(t: Target) {
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("s.redb");
    let open = || Store::new(Box::new(EmbeddedBackend::open(&path).expect("store")));
    let b = t.sbatch(&[
        "-p",
        "batch",
        "-t",
        "10",
        "--job-name=pp-test",
        "--wrap",
        "sleep 300",
    ]);
    let _cancel = t.cancel(vec![b]);
    t.wait_squeue(b, Duration::from_secs(30), |s, _| s == "RUNNING");
    let want: BTreeMap<String, Hold> = BTreeMap::from([(format!("slurm:{b}"), hold(600.0))]);

    let mut store = open();
    let mut sync =
        SlurmSync::restore(t.config(), JobMapping::default(), &mut store).expect("restore");
    sync.poll(now(), &mut store).expect("poll");
    let done = sync.apply_suspensions(&want, now(), &mut store);
    assert_eq!(
        done.iter().map(|d| d.action).collect::<Vec<_>>(),
        vec!["suspend"]
    );
    t.wait_squeue(b, Duration::from_secs(10), |s, _| s == "SUSPENDED");
    let jobs = sync.poll(now(), &mut store).expect("poll");
    let job = jobs
        .iter()
        .find(|j| j.id == format!("slurm:{b}"))
        .expect("listed");
    assert_eq!(job.state, JobState::Suspended);
    drop(sync);
    drop(store);

    // restarted: the suspension is still ours, not applied twice, and resumed when
    // the plan lets go
    let mut store = open();
    let mut sync =
        SlurmSync::restore(t.config(), JobMapping::default(), &mut store).expect("restore");
    assert!(sync.suspended().contains_key(&format!("slurm:{b}")));
    sync.poll(now(), &mut store).expect("poll");
    assert!(sync.apply_suspensions(&want, now(), &mut store).is_empty());
    let done = sync.apply_suspensions(&BTreeMap::new(), now(), &mut store);
    assert_eq!(
        done.iter().map(|d| d.action).collect::<Vec<_>>(),
        vec!["resume"]
    );
    t.wait_squeue(b, Duration::from_secs(10), |s, _| s == "RUNNING");
    assert!(sync.suspended().is_empty());
    assert_eq!((sync.counters.suspends, sync.counters.resumes), (0, 1));
}

fn with_begin_time_holds_slurm_itself_lets_a_job_go_when_powerplane_stops_renewing(t: Target) {
    let dir = tempfile::tempdir().expect("tmp");
    let mut store = Store::new(Box::new(
        EmbeddedBackend::open(&dir.path().join("s.redb")).expect("store"),
    ));
    let a = t.sbatch(&[
        "-p",
        "batch",
        "-t",
        "5",
        "--begin=now+3600",
        "--job-name=pp-test",
        "--wrap",
        "sleep 60",
    ]);
    let _cancel = t.cancel(vec![a]);
    let mut sync =
        SlurmSync::restore(t.config(), JobMapping::default(), &mut store).expect("restore");
    sync.hold_with = integrations::slurm_sync::HoldWith::BeginTime;
    let want = |lease_s: f64| -> BTreeMap<String, Hold> {
        BTreeMap::from([(format!("slurm:{a}"), hold(lease_s))])
    };
    sync.poll(now(), &mut store).expect("poll");
    let done = sync.apply(&want(4.0), now(), &mut store);
    assert_eq!(
        done.iter().map(|d| d.action).collect::<Vec<_>>(),
        vec!["hold"]
    );
    let jobs = sync.poll(now(), &mut store).expect("poll");
    let job = jobs
        .iter()
        .find(|j| j.id == format!("slurm:{a}"))
        .expect("listed");
    assert_eq!(job.state, JobState::Held, "powerplane's begin-time hold");
    // renewed while the plan wants it: still waiting well after the first lease
    // (Slurm's scheduler looks every 2 s here)
    let start = std::time::Instant::now();
    std::thread::sleep(Duration::from_millis(2600));
    sync.poll(now(), &mut store).expect("poll");
    sync.apply(&want(8.0), now(), &mut store);
    std::thread::sleep(Duration::from_secs(8).saturating_sub(start.elapsed()));
    assert_eq!(
        t.squeue(a).expect("queued").0,
        "PENDING",
        "the renewed lease holds"
    );
    // the controller goes silent: Slurm starts the job when the lease ends
    drop(sync);
    t.wait_squeue(a, Duration::from_secs(20), |s, _| {
        s == "RUNNING" || s == "COMPLETED"
    });
}
