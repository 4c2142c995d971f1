use std::collections::BTreeMap;

use proptest::prelude::*;
use telemetry::agent_proto::{AckStatus, Action, Command, Desired, GpuSel, Key, VERSION};
use telemetry::gpu_backend::{GpuBackend, GpuError, GpuReading};
use telemetry::{GpuModel, Timestamp};

use super::*;
use crate::{Fault, Faulty, Shared, SimGpus};

const T0: i64 = 1_790_000_000;

fn key() -> Key {
    Key::from_text(&"5a".repeat(32)).expect("key")
}

fn at(s: f64) -> Timestamp {
    Timestamp::from_secs(T0).plus_secs(s)
}

fn a40() -> GpuModel {
    GpuModel::builtin("A40").expect("a40")
}

/// Counts setter calls and fails the test on any value outside the constraints.
struct Checked {
    inner: SimGpus,
    sets: u32,
}

impl GpuBackend for Checked {
    fn name(&self) -> &'static str {
        "checked"
    }
    fn count(&mut self) -> Result<u32, GpuError> {
        self.inner.count()
    }
    fn read(&mut self, index: u32) -> Result<GpuReading, GpuError> {
        self.inner.read(index)
    }
    fn set_power_limit(&mut self, index: u32, watts: f64) -> Result<f64, GpuError> {
        self.sets += 1;
        assert!(
            (100.0..=300.0).contains(&watts),
            "a setter was called with {watts} W, outside the A40's 100..=300 W"
        );
        self.inner.set_power_limit(index, watts)
    }
    fn reset_power_limit(&mut self, index: u32) -> Result<f64, GpuError> {
        self.sets += 1;
        self.inner.reset_power_limit(index)
    }
    fn lock_sm_clocks(&mut self, index: u32, lo: f64, hi: f64) -> Result<(f64, f64), GpuError> {
        self.sets += 1;
        assert!(
            (210.0..=1740.0).contains(&lo) && (lo..=1740.0).contains(&hi),
            "clocks {lo}..{hi} outside the supported range"
        );
        self.inner.lock_sm_clocks(index, lo, hi)
    }
    fn reset_sm_clocks(&mut self, index: u32) -> Result<(), GpuError> {
        self.sets += 1;
        self.inner.reset_sm_clocks(index)
    }
}

fn gpus(n: u32) -> Shared<Checked> {
    Shared::new(Checked {
        inner: SimGpus::new(n, a40(), 7),
        sets: 0,
    })
}

fn core_with(b: Shared<Checked>, fs: FailSafe, dry: bool, file: Option<PathBuf>) -> Core {
    let mut r = Rules::new("n1", key());
    r.fail_safe = fs;
    r.dry_run = dry;
    Core::start(r, Box::new(b), file, at(0.0))
}

fn cmd(id: &str, t: f64, lease_s: f64, action: Action) -> Command {
    Command {
        v: VERSION,
        id: id.into(),
        node: "n1".into(),
        issued_at: at(t),
        lease_s,
        action,
        epoch: None,
    }
}

fn watts(gpus: Vec<u32>, w: f64) -> Action {
    Action::SetPowerLimit {
        gpus: GpuSel::List(gpus),
        watts: Some(w),
        percent: None,
    }
}

fn limit(b: &Shared<Checked>, i: u32) -> f64 {
    b.lock().read(i).expect("read").power_limit_w
}

#[test]
fn a_signed_command_is_applied_clamped_and_acknowledged() {
    let b = gpus(4);
    let mut c = core_with(b.clone(), FailSafe::RestoreDefault, false, None);
    let ack = c.handle(
        &cmd("a", 0.0, 60.0, watts(vec![0, 1], 200.0)).seal(&key()),
        at(0.5),
    );
    assert_eq!(ack.status, AckStatus::Applied);
    // the first command is as old as nothing newer says: its lease runs from arrival
    assert_eq!(ack.lease_until, Some(at(60.5)));
    assert_eq!(
        ack.gpus.iter().map(|o| o.applied_w).collect::<Vec<_>>(),
        vec![Some(200.0), Some(200.0)]
    );
    assert_eq!(
        (limit(&b, 0), limit(&b, 1), limit(&b, 2)),
        (200.0, 200.0, 300.0)
    );

    // below the A40's 100 W minimum: clamped, and the ack says so
    let ack = c.handle(
        &cmd("b", 1.0, 60.0, watts(vec![2], 40.0)).seal(&key()),
        at(1.0),
    );
    assert_eq!(ack.status, AckStatus::Applied);
    assert!(ack.gpus[0].clamped);
    assert_eq!(limit(&b, 2), 100.0);

    // percent of the default limit, on every GPU
    let pct = Action::SetPowerLimit {
        gpus: GpuSel::all(),
        watts: None,
        percent: Some(70.0),
    };
    let ack = c.handle(&cmd("c", 2.0, 60.0, pct).seal(&key()), at(2.0));
    assert_eq!(ack.gpus.len(), 4);
    assert!((0..4).all(|i| (limit(&b, i) - 210.0).abs() < 1e-9));
    let report = c.tick(at(3.0));
    assert!(
        matches!(report.gpus[3].desired, Some(Desired::Limit { watts, .. }) if (watts - 210.0).abs() < 1e-9)
    );
    assert_eq!(report.gpus[3].reading.power_limit_w, 210.0);
}

#[test]
fn bad_commands_are_rejected_with_their_reason_and_change_nothing() {
    let b = gpus(2);
    let mut c = core_with(b.clone(), FailSafe::RestoreDefault, false, None);
    // the controller's clock, as the agent learns it from the stamps: a command
    // stamped 0 s arrived at 0 s
    let first = c.handle(
        &cmd("r", 0.0, 60.0, watts(vec![1], 250.0)).seal(&key()),
        at(0.0),
    );
    assert_eq!(first.status, AckStatus::Applied);
    let sets = b.lock().sets;
    let good = cmd("g", 0.0, 60.0, watts(vec![0], 200.0));
    let other_key = Key::from_text("a different site key, long enough").expect("key");
    let unsigned = format!(
        "{{\"body\":{}}}",
        serde_json::to_string(&good).expect("json")
    );
    let mut wrong_node = good.clone();
    wrong_node.node = "n2".into();
    let mut old_version = good.clone();
    old_version.v = 9;
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (b"{\"body\": ".to_vec(), "malformed"),
        (unsigned.into_bytes(), "unsigned"),
        (good.seal(&other_key), "bad_signature"),
        (wrong_node.seal(&key()), "wrong_node"),
        (old_version.seal(&key()), "unsupported_version"),
        (
            cmd("e", -120.0, 60.0, watts(vec![0], 200.0)).seal(&key()),
            "expired",
        ),
        (
            cmd("o1", 0.0, 60.0, watts(vec![0], -5.0)).seal(&key()),
            "out_of_range",
        ),
        (
            cmd("o2", 0.0, 60.0, watts(vec![0], 1e9)).seal(&key()),
            "out_of_range",
        ),
        (
            cmd("o3", 0.0, 0.0, watts(vec![0], 200.0)).seal(&key()),
            "out_of_range",
        ),
        (
            cmd(
                "o4",
                0.0,
                60.0,
                Action::LockSmClocks {
                    gpus: GpuSel::all(),
                    min_mhz: 1500.0,
                    max_mhz: 900.0,
                },
            )
            .seal(&key()),
            "out_of_range",
        ),
        (
            cmd(
                "o5",
                0.0,
                60.0,
                Action::SetPowerLimit {
                    gpus: GpuSel::all(),
                    watts: Some(200.0),
                    percent: Some(50.0),
                },
            )
            .seal(&key()),
            "out_of_range",
        ),
        (
            cmd("n", 0.0, 60.0, watts(vec![7], 200.0)).seal(&key()),
            "no_such_gpu",
        ),
        (
            cmd("late", -50.0, 20.0, watts(vec![0], 200.0)).seal(&key()),
            "expired",
        ),
    ];
    for (bytes, reason) in cases {
        let ack = c.handle(&bytes, at(1.0));
        assert_eq!(ack.status, AckStatus::Rejected, "{reason}");
        assert_eq!(ack.reason.as_deref(), Some(reason));
        assert!(
            ack.detail.as_deref().is_some_and(|d| !d.is_empty()),
            "{reason}: a detail says why"
        );
        if ["malformed", "unsigned", "bad_signature"].contains(&reason) {
            assert_eq!(
                ack.id, None,
                "an unauthenticated id is never echoed in a signed ack"
            );
        }
    }
    assert_eq!(b.lock().sets, sets, "no rejected command reached a setter");
    assert_eq!(limit(&b, 0), 300.0);

    // the good one applies once; its replay is refused
    assert_eq!(
        c.handle(&good.seal(&key()), at(1.0)).status,
        AckStatus::Applied
    );
    let again = c.handle(&good.seal(&key()), at(2.0));
    assert_eq!(
        (again.status, again.reason.as_deref()),
        (AckStatus::Rejected, Some("replayed"))
    );
    assert_eq!(c.counters.get("rejected_replayed"), Some(&1));
    assert_eq!(c.counters.get("rejected_out_of_range"), Some(&5));
}

#[test]
fn an_older_command_never_overrides_a_newer_one() {
    let b = gpus(1);
    let mut c = core_with(b.clone(), FailSafe::RestoreDefault, false, None);
    c.handle(
        &cmd("new", 10.0, 60.0, watts(vec![0], 250.0)).seal(&key()),
        at(10.0),
    );
    let late = c.handle(
        &cmd("old", 5.0, 60.0, watts(vec![0], 120.0)).seal(&key()),
        at(11.0),
    );
    assert_eq!(
        (late.status, late.reason.as_deref()),
        (AckStatus::Rejected, Some("superseded"))
    );
    assert_eq!(limit(&b, 0), 250.0);
}

#[test]
fn a_lease_that_ends_unrenewed_applies_the_fail_safe_and_says_so() {
    for (fs, expect) in [
        (FailSafe::RestoreDefault, 300.0),
        (
            FailSafe::Cap {
                watts: Some(150.0),
                percent: None,
            },
            150.0,
        ),
        (
            FailSafe::Cap {
                watts: None,
                percent: Some(50.0),
            },
            150.0,
        ),
        (FailSafe::Keep, 200.0),
    ] {
        let b = gpus(2);
        let name = fs.name();
        let mut c = core_with(b.clone(), fs, false, None);
        c.handle(
            &cmd("a", 0.0, 30.0, watts(vec![0], 200.0)).seal(&key()),
            at(0.0),
        );
        c.tick(at(29.0));
        assert_eq!(limit(&b, 0), 200.0, "{name}: still leased at 29 s");
        let r = c.tick(at(30.5));
        assert_eq!(limit(&b, 0), expect, "{name}");
        assert!(
            matches!(&r.gpus[0].desired, Some(Desired::FailSafe { fail_safe, after, .. }) if fail_safe == name && after == "a")
        );
        let h = c.health("online", at(31.0), None);
        assert_eq!(
            (h.status.as_str(), h.fail_safe_gpus.clone()),
            ("degraded", vec![0])
        );
        assert_eq!(
            limit(&b, 1),
            300.0,
            "{name}: a GPU never commanded is left alone"
        );
        // a new command ends the fail-safe
        c.handle(
            &cmd("b", 40.0, 30.0, watts(vec![0], 220.0)).seal(&key()),
            at(40.0),
        );
        assert_eq!(limit(&b, 0), 220.0);
        assert_eq!(c.health("online", at(41.0), None).status, "online");
    }
}

#[test]
fn drift_from_a_driver_reload_or_a_manual_change_is_re_applied() {
    let sim = Shared::new(Faulty {
        inner: SimGpus::new(2, a40(), 1),
        faults: BTreeMap::new(),
    });
    let mut c = Core::start(
        Rules::new("n1", key()),
        Box::new(sim.clone()),
        None,
        at(0.0),
    );
    c.handle(
        &cmd("a", 0.0, 60.0, watts(vec![0, 1], 180.0)).seal(&key()),
        at(0.0),
    );
    sim.lock().faults.insert(0, Fault::DriverReload);
    sim.lock()
        .inner
        .set_power_limit(1, 280.0)
        .expect("someone ran nvidia-smi -pl 280");
    let r = c.tick(at(1.0));
    assert_eq!(r.gpus[0].reading.power_limit_w, 180.0);
    assert_eq!(r.gpus[1].reading.power_limit_w, 180.0);
    assert_eq!(c.counters.get("drift_reapplied"), Some(&2));

    // a GPU that refuses is retried with backoff, reported degraded, and does not stop
    // the others
    sim.lock().faults.insert(1, Fault::NoPermission);
    sim.lock().inner.set_power_limit(1, 290.0).expect("set");
    for i in 2..=10 {
        c.tick(at(f64::from(i)));
    }
    assert_eq!(c.health("online", at(10.0), None).status, "degraded");
    assert_eq!(c.tick(at(11.0)).gpus[0].reading.power_limit_w, 180.0);
    sim.lock().faults.remove(&1);
    assert_eq!(c.tick(at(30.0)).gpus[1].reading.power_limit_w, 180.0);
    assert_eq!(c.health("online", at(30.0), None).status, "online");
}

#[test]
fn dry_run_never_calls_a_setter() {
    let b = gpus(2);
    let mut c = core_with(
        b.clone(),
        FailSafe::Cap {
            watts: Some(150.0),
            percent: None,
        },
        true,
        None,
    );
    let ack = c.handle(
        &cmd("a", 0.0, 10.0, watts(vec![0, 1], 200.0)).seal(&key()),
        at(0.0),
    );
    assert_eq!(ack.status, AckStatus::DryRun);
    assert_eq!(
        ack.gpus[0].applied_w,
        Some(200.0),
        "the ack says what would be set"
    );
    let clocks = Action::LockSmClocks {
        gpus: GpuSel::all(),
        min_mhz: 900.0,
        max_mhz: 1400.0,
    };
    assert_eq!(
        c.handle(&cmd("b", 1.0, 10.0, clocks).seal(&key()), at(1.0))
            .status,
        AckStatus::DryRun
    );
    c.tick(at(5.0));
    c.tick(at(20.0)); // lease over: the fail-safe, dry
    c.shutdown(OnExit::RestoreDefault, at(21.0));
    assert_eq!(b.lock().sets, 0);
    assert_eq!((limit(&b, 0), limit(&b, 1)), (300.0, 300.0));
    assert!(c.health("online", at(21.0), None).dry_run);
}

#[test]
fn clocks_lock_within_the_supported_range_and_unlock_on_reset() {
    let b = gpus(1);
    let mut c = core_with(b.clone(), FailSafe::RestoreDefault, false, None);
    b.lock().inner.set_load(0, 1.0);
    let lock = Action::LockSmClocks {
        gpus: GpuSel::all(),
        min_mhz: 100.0,
        max_mhz: 1200.0,
    };
    let ack = c.handle(&cmd("a", 0.0, 60.0, lock).seal(&key()), at(0.0));
    assert_eq!(ack.gpus[0].applied_mhz, Some((210.0, 1200.0)));
    assert!(ack.gpus[0].clamped);
    assert!(c.tick(at(1.0)).gpus[0].reading.sm_clock_mhz <= 1200.0);
    c.handle(
        &cmd(
            "b",
            2.0,
            60.0,
            Action::Reset {
                gpus: GpuSel::all(),
            },
        )
        .seal(&key()),
        at(2.0),
    );
    assert!(c.tick(at(3.0)).gpus[0].reading.sm_clock_mhz > 1200.0);
}

#[test]
fn a_restarted_agent_restores_the_desired_state_on_rebooted_gpus() {
    let dir = tempfile::tempdir().expect("tmp");
    let file = dir.path().join("agent-state.json");
    let b = gpus(2);
    let mut c = core_with(
        b.clone(),
        FailSafe::RestoreDefault,
        false,
        Some(file.clone()),
    );
    c.handle(
        &cmd("a", 0.0, 120.0, watts(vec![1], 160.0)).seal(&key()),
        at(0.0),
    );
    c.shutdown(OnExit::Keep, at(10.0));
    drop(c);

    // the node rebooted: limits back at default
    let rebooted = gpus(2);
    let mut c = core_with(
        rebooted.clone(),
        FailSafe::RestoreDefault,
        false,
        Some(file.clone()),
    );
    assert_eq!(
        limit(&rebooted, 1),
        160.0,
        "restored at start, before any command"
    );
    // and the replay of the old command is still refused after the restart
    let again = c.handle(
        &cmd("a", 0.0, 120.0, watts(vec![1], 160.0)).seal(&key()),
        at(20.0),
    );
    assert_eq!(again.reason.as_deref(), Some("replayed"));

    // a restart after the lease ended applies the fail-safe instead
    c.shutdown(OnExit::Keep, at(30.0));
    let late = gpus(2);
    late.lock().set_power_limit(1, 160.0).expect("set");
    let mut r = Rules::new("n1", key());
    r.fail_safe = FailSafe::RestoreDefault;
    let c = Core::start(r, Box::new(late.clone()), Some(file.clone()), at(500.0));
    assert_eq!(limit(&late, 1), 300.0);
    assert!(matches!(
        c.desired().get(&1),
        Some(Desired::FailSafe { .. })
    ));

    // a corrupt state file is set aside, not fatal
    std::fs::write(&file, b"{ not json").expect("write");
    let c = core_with(gpus(1), FailSafe::RestoreDefault, false, Some(file.clone()));
    assert!(c.desired().is_empty());
    assert!(file.with_extension("corrupt").exists());
}

#[test]
fn on_exit_restores_defaults_or_keeps_as_configured() {
    let b = gpus(2);
    let mut c = core_with(
        b.clone(),
        FailSafe::Cap {
            watts: Some(120.0),
            percent: None,
        },
        false,
        None,
    );
    c.handle(
        &cmd("a", 0.0, 60.0, watts(vec![0, 1], 200.0)).seal(&key()),
        at(0.0),
    );
    c.shutdown(OnExit::FailSafe, at(1.0));
    assert_eq!((limit(&b, 0), limit(&b, 1)), (120.0, 120.0));
    let b = gpus(1);
    let mut c = core_with(b.clone(), FailSafe::Keep, false, None);
    c.handle(
        &cmd("a", 0.0, 60.0, watts(vec![0], 200.0)).seal(&key()),
        at(0.0),
    );
    c.shutdown(OnExit::RestoreDefault, at(1.0));
    assert_eq!(limit(&b, 0), 300.0);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    /// Safety invariant 1 on the agent: whatever arrives, no setter is ever called
    /// outside the GPU's constraints (the `Checked` backend fails the test if one is).
    #[test]
    fn no_command_sets_a_value_outside_the_constraints(
        values in proptest::collection::vec((-1e4f64..1e4, 0u8..4, 0.0f64..2.5), 1..12)
    ) {
        let b = gpus(2);
        let mut c = core_with(b.clone(), FailSafe::Cap { watts: Some(5000.0), percent: None }, false, None);
        for (n, (v, kind, lease)) in values.into_iter().enumerate() {
            let action = match kind {
                0 => watts(vec![0, 1], v),
                1 => Action::SetPowerLimit { gpus: GpuSel::all(), watts: None, percent: Some(v / 50.0) },
                2 => Action::LockSmClocks { gpus: GpuSel::all(), min_mhz: v.abs() / 3.0, max_mhz: v.abs() },
                _ => Action::Reset { gpus: GpuSel::List(vec![1]) },
            };
            c.handle(&cmd(&format!("p{n}"), n as f64, lease, action).seal(&key()), at(n as f64));
            c.tick(at(n as f64 + 0.5));
            for i in 0..2 {
                let l = limit(&b, i);
                prop_assert!((100.0..=300.0).contains(&l), "limit {l}");
            }
        }
    }
}

#[test]
fn a_gpu_the_node_does_not_have_fails_alone() {
    let b = gpus(2);
    let mut c = core_with(b.clone(), FailSafe::RestoreDefault, false, None);
    let ack = c.handle(
        &cmd("a", 0.0, 60.0, watts(vec![0, 7], 200.0)).seal(&key()),
        at(0.0),
    );
    assert_eq!(ack.status, AckStatus::Partial);
    let seven = ack.gpus.iter().find(|o| o.index == 7).expect("gpu 7");
    assert!(seven
        .error
        .as_deref()
        .is_some_and(|e| e.contains("no_such_gpu")));
    assert_eq!(
        limit(&b, 0),
        200.0,
        "the GPU that exists is capped and leased"
    );
}

#[test]
fn a_fail_safe_that_cannot_be_set_at_first_is_retried_until_it_holds() {
    let sim = Shared::new(Faulty {
        inner: SimGpus::new(1, a40(), 1),
        faults: BTreeMap::new(),
    });
    let mut r = Rules::new("n1", key());
    r.fail_safe = FailSafe::Cap {
        watts: Some(150.0),
        percent: None,
    };
    let mut c = Core::start(r, Box::new(sim.clone()), None, at(0.0));
    c.handle(
        &cmd(
            "a",
            0.0,
            10.0,
            Action::Reset {
                gpus: GpuSel::all(),
            },
        )
        .seal(&key()),
        at(0.0),
    );
    sim.lock().faults.insert(0, Fault::NoPermission);
    c.tick(at(11.0));
    assert_eq!(c.counters.get("fail_safe_errors"), Some(&1));
    assert!(
        matches!(c.desired().get(&0), Some(Desired::FailSafe { watts: Some(w), .. }) if *w == 150.0)
    );
    sim.lock().faults.clear();
    let r = c.tick(at(13.0));
    assert_eq!(
        r.gpus[0].reading.power_limit_w, 150.0,
        "the drift check applied the fail-safe"
    );
}

/// A GPU held at 250 W by something else (a BMC power brake): setting 300 W never holds.
struct Braked(SimGpus);

impl GpuBackend for Braked {
    fn name(&self) -> &'static str {
        "braked"
    }
    fn count(&mut self) -> Result<u32, GpuError> {
        self.0.count()
    }
    fn read(&mut self, index: u32) -> Result<GpuReading, GpuError> {
        let mut r = self.0.read(index)?;
        r.power_limit_w = r.power_limit_w.min(250.0);
        Ok(r)
    }
    fn set_power_limit(&mut self, index: u32, watts: f64) -> Result<f64, GpuError> {
        self.0.set_power_limit(index, watts)
    }
    fn reset_power_limit(&mut self, index: u32) -> Result<f64, GpuError> {
        self.0.reset_power_limit(index)
    }
}

#[test]
fn a_limit_that_does_not_hold_is_retried_with_backoff_not_every_read() {
    let mut c = Core::start(
        Rules::new("n1", key()),
        Box::new(Braked(SimGpus::new(1, a40(), 1))),
        None,
        at(0.0),
    );
    c.handle(
        &cmd(
            "a",
            0.0,
            600.0,
            Action::Reset {
                gpus: GpuSel::all(),
            },
        )
        .seal(&key()),
        at(0.0),
    );
    let before = c.counters.get("setter_calls").copied().unwrap_or(0);
    for i in 1..=60 {
        c.tick(at(f64::from(i)));
    }
    let sets = c.counters.get("setter_calls").copied().unwrap_or(0) - before;
    assert!(
        (3..=7).contains(&sets),
        "{sets} re-applies in 60 reads (1, 2, 4, 8, 16, 32 s apart)"
    );
    assert_eq!(c.health("online", at(60.0), None).status, "degraded");
}

#[test]
fn a_dry_run_leaves_nothing_for_a_real_run_to_apply() {
    let dir = tempfile::tempdir().expect("tmp");
    let file = dir.path().join("agent-state.json");
    let b = gpus(1);
    let mut c = core_with(
        b.clone(),
        FailSafe::RestoreDefault,
        true,
        Some(file.clone()),
    );
    c.handle(
        &cmd("a", 0.0, 600.0, watts(vec![0], 120.0)).seal(&key()),
        at(0.0),
    );
    c.shutdown(OnExit::Keep, at(1.0));
    let _real = core_with(b.clone(), FailSafe::RestoreDefault, false, Some(file));
    assert_eq!(limit(&b, 0), 300.0);
    assert_eq!(b.lock().sets, 0);
}

#[test]
fn a_message_that_fails_its_signature_check_gets_no_answer_but_is_counted() {
    let b = gpus(2);
    let mut c = core_with(b.clone(), FailSafe::RestoreDefault, false, None);
    let other = Key::from_text("somebody else's key, long enough").expect("key");
    let forged = cmd("f", 0.0, 60.0, watts(vec![0], 150.0)).seal(&other);
    let unsigned = format!(
        "{{\"body\":{}}}",
        serde_json::to_string(&cmd("u", 0.0, 60.0, watts(vec![0], 150.0))).expect("json")
    );
    for _ in 0..100 {
        assert_eq!(c.answer(&forged, at(1.0)), None);
        assert_eq!(c.answer(unsigned.as_bytes(), at(1.0)), None);
        assert_eq!(c.answer(b"\xff not json", at(1.0)), None);
    }
    assert_eq!(c.counters.get("rejected_bad_signature"), Some(&100));
    assert_eq!(c.counters.get("rejected_unsigned"), Some(&100));
    assert_eq!(c.counters.get("rejected_malformed"), Some(&100));
    assert_eq!(c.counters.get("commands_unanswered"), Some(&300));
    assert_eq!(b.lock().sets, 0, "nothing reached a setter");
    // an authentic command is still answered, a rejected one too (it names its id)
    let good = c
        .answer(
            &cmd("g", 1.0, 60.0, watts(vec![0], 150.0)).seal(&key()),
            at(1.0),
        )
        .expect("an ack");
    assert_eq!(good.status, AckStatus::Applied);
    let late = c
        .answer(
            &cmd("late", -50.0, 20.0, watts(vec![0], 150.0)).seal(&key()),
            at(1.0),
        )
        .expect("an ack");
    assert_eq!(
        (late.status, late.id.as_deref()),
        (AckStatus::Rejected, Some("late"))
    );
}

#[test]
fn a_command_from_a_deposed_leader_is_refused_unanswered_and_the_epoch_survives_a_restart() {
    let dir = tempfile::tempdir().expect("tmp");
    let file = dir.path().join("state.json");
    let b = gpus(2);
    let mut c = core_with(
        b.clone(),
        FailSafe::RestoreDefault,
        false,
        Some(file.clone()),
    );
    let fenced = |id: &str, t: f64, w: f64, epoch: u64| {
        let mut k = cmd(id, t, 60.0, watts(vec![0], w));
        k.epoch = Some(epoch);
        k.seal(&key())
    };
    let ack = c
        .answer(&fenced("new", 0.0, 200.0, 7), at(0.1))
        .expect("answered");
    assert_eq!(ack.status, AckStatus::Applied);
    // the leader of epoch 6 was deposed: its command is refused, not answered
    assert_eq!(c.answer(&fenced("old", 1.0, 150.0, 6), at(1.1)), None);
    assert_eq!(limit(&b, 0), 200.0, "a stale command changes nothing");
    assert_eq!(c.counters.get("rejected_stale_epoch"), Some(&1));
    assert_eq!(c.counters.get("commands_unanswered"), Some(&1));
    // the same epoch, and a later one, are taken
    let ack = c
        .answer(&fenced("same", 2.0, 180.0, 7), at(2.1))
        .expect("answered");
    assert_eq!(ack.status, AckStatus::Applied);
    drop(c);
    // after a restart the agent still knows epoch 7
    let mut c = core_with(b.clone(), FailSafe::RestoreDefault, false, Some(file));
    assert_eq!(c.answer(&fenced("old2", 3.0, 150.0, 6), at(3.1)), None);
    assert_eq!(limit(&b, 0), 180.0);
    // a controller without [ha] sends no epoch: refused once a leader's epoch is
    // known, answered with the reason, counted
    let ack = c
        .answer(
            &cmd("plain", 4.0, 60.0, watts(vec![0], 170.0)).seal(&key()),
            at(4.1),
        )
        .expect("answered");
    assert_eq!(ack.status, AckStatus::Rejected, "{ack:?}");
    assert_eq!(ack.reason.as_deref(), Some("no_epoch"));
    assert!(
        ack.detail.as_deref().is_some_and(|d| d.contains("epoch 7")),
        "{ack:?}"
    );
    assert_eq!(limit(&b, 0), 180.0, "an epoch-less command changes nothing");
    assert_eq!(c.counters.get("rejected_no_epoch"), Some(&1));
}

#[test]
fn an_agent_that_never_saw_an_epoch_takes_epoch_less_commands() {
    // a site without [ha]: its one controller sends no epoch
    let b = gpus(2);
    let mut c = core_with(b.clone(), FailSafe::RestoreDefault, false, None);
    let ack = c
        .answer(
            &cmd("plain", 0.0, 60.0, watts(vec![0], 170.0)).seal(&key()),
            at(0.1),
        )
        .expect("answered");
    assert_eq!(ack.status, AckStatus::Applied);
    assert_eq!(limit(&b, 0), 170.0);
}

#[test]
fn a_clock_ten_minutes_slow_or_fast_still_takes_the_cap_with_its_lease_from_arrival() {
    // the agent's clock minus the controller's: 10 minutes slow, then 10 minutes fast
    for skew in [-600.0, 600.0] {
        let b = gpus(2);
        let mut c = core_with(b.clone(), FailSafe::RestoreDefault, false, None);
        // stamped 0 s by the controller, arriving 0.2 s later
        let ack = c.handle(
            &cmd("s1", 0.0, 60.0, watts(vec![0], 100.0)).seal(&key()),
            at(skew + 0.2),
        );
        assert_eq!(ack.status, AckStatus::Applied, "skew {skew}: {ack:?}");
        assert_eq!(limit(&b, 0), 100.0, "skew {skew}: the cap holds");
        assert_eq!(
            ack.lease_until,
            Some(at(skew + 60.2)),
            "skew {skew}: the lease runs from the arrival, not from the stamp"
        );
        assert_eq!(c.counters.get("commands_clock_skewed"), Some(&1));
        c.tick(at(skew + 59.0));
        assert_eq!(limit(&b, 0), 100.0, "skew {skew}: still leased");
        c.tick(at(skew + 61.0));
        assert_eq!(
            limit(&b, 0),
            300.0,
            "skew {skew}: unrenewed, the lease ended 60 s after its arrival: the fail-safe"
        );

        // the renewal, 70 s later by both clocks, gets its full lease again
        let ack = c.handle(
            &cmd("s2", 70.0, 60.0, watts(vec![0], 100.0)).seal(&key()),
            at(skew + 70.3),
        );
        assert_eq!(ack.status, AckStatus::Applied, "skew {skew}: {ack:?}");
        assert_eq!(ack.lease_until, Some(at(skew + 130.3)));
        assert_eq!(limit(&b, 0), 100.0);

        // what is truly old is still refused: a replay, and a command issued 120 s
        // before the newest by the controller's clock
        let replay = c.handle(
            &cmd("s2", 70.0, 60.0, watts(vec![0], 100.0)).seal(&key()),
            at(skew + 71.0),
        );
        assert_eq!(replay.reason.as_deref(), Some("replayed"));
        let old = c.handle(
            &cmd("old", -50.0, 600.0, watts(vec![0], 250.0)).seal(&key()),
            at(skew + 72.0),
        );
        assert_eq!(
            (old.status, old.reason.as_deref()),
            (AckStatus::Rejected, Some("expired")),
            "skew {skew}: {old:?}"
        );
        assert_eq!(limit(&b, 0), 100.0);
    }
}

#[test]
fn a_step_of_the_agents_clock_ages_no_command_by_more_than_max_age() {
    let b = gpus(1);
    let mut c = core_with(b.clone(), FailSafe::RestoreDefault, false, None);
    c.handle(
        &cmd("a", 0.0, 90.0, watts(vec![0], 150.0)).seal(&key()),
        at(0.0),
    );
    // the agent's clock jumps an hour ahead; the next renewal (30 s later) is taken
    let ack = c.handle(
        &cmd("b", 30.0, 90.0, watts(vec![0], 140.0)).seal(&key()),
        at(3630.0),
    );
    assert_eq!(ack.status, AckStatus::Applied, "{ack:?}");
    assert_eq!(limit(&b, 0), 140.0);
    // and the one after that has its whole lease
    let ack = c.handle(
        &cmd("c", 60.0, 90.0, watts(vec![0], 130.0)).seal(&key()),
        at(3660.0),
    );
    assert_eq!(ack.lease_until, Some(at(3750.0)));
}

#[test]
fn a_step_of_the_wall_clock_keeps_what_was_left_of_each_lease() {
    // set back an hour 10 s into a 30 s lease: the fail-safe still comes 30 s after
    // the command, by the clock as it now reads
    let b = gpus(1);
    let mut c = core_with(b.clone(), FailSafe::RestoreDefault, false, None);
    c.handle(
        &cmd("a", 0.0, 30.0, watts(vec![0], 150.0)).seal(&key()),
        at(0.0),
    );
    c.tick(at(10.0));
    c.clock_stepped(-3600.0);
    assert_eq!(c.counters.get("clock_steps"), Some(&1));
    c.tick(at(-3600.0 + 29.0));
    assert_eq!(limit(&b, 0), 150.0, "still leased 29 s after the command");
    c.tick(at(-3600.0 + 30.5));
    assert_eq!(
        limit(&b, 0),
        300.0,
        "the lease ended 30 s after the command, not an hour later"
    );

    // set forward ten minutes 10 s into a 30 s lease: the lease is not ended early,
    // and the renewal gets its whole lease from its arrival
    let b = gpus(1);
    let mut c = core_with(b.clone(), FailSafe::RestoreDefault, false, None);
    c.handle(
        &cmd("a", 0.0, 30.0, watts(vec![0], 150.0)).seal(&key()),
        at(0.0),
    );
    c.tick(at(10.0));
    c.clock_stepped(600.0);
    c.tick(at(600.0 + 11.0));
    assert_eq!(limit(&b, 0), 150.0, "not ended by the step");
    let ack = c.handle(
        &cmd("b", 15.0, 30.0, watts(vec![0], 140.0)).seal(&key()),
        at(600.0 + 15.0),
    );
    assert_eq!(ack.status, AckStatus::Applied, "{ack:?}");
    assert_eq!(ack.lease_until, Some(at(600.0 + 45.0)));
    c.tick(at(600.0 + 44.0));
    assert_eq!(limit(&b, 0), 140.0);
    c.tick(at(600.0 + 45.5));
    assert_eq!(limit(&b, 0), 300.0, "and it ends when it should");
}
