//! The OpenADR 2.0b VEN against a real VTN: OpenLEADR's `OpenADRServer`
//! (tests/openadr/vtn.py, run by the `.venv` Python that scripts/test provisions).
//! Events are added, modified and cancelled on the VTN; what the VEN answered and
//! reported is read back from the VTN's log; the VTN is killed and restarted with fresh
//! state, and hung (SIGSTOP) and resumed.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use powerplane_tests::workspace_root;
use serde_json::{json, Value};
use sources::openadr2b::{Opt, Ven, VenConfig};
use sources::source::{CancellationToken, Stats};
use telemetry::grid::{EventStatus, GridEvent, GridTarget};
use telemetry::Timestamp;
use tokio::sync::watch;

fn now() -> Timestamp {
    Timestamp::from(chrono::Utc::now())
}

fn python() -> std::path::PathBuf {
    let py = workspace_root().join(".venv/bin/python");
    let ok = Command::new(&py)
        .args(["-c", "import openleadr"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        ok,
        "these tests need OpenLEADR importable by {} (scripts/test installs it: \
         .venv/bin/pip install openleadr)",
        py.display()
    );
    py
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("free port")
        .local_addr()
        .expect("addr")
        .port()
}

/// The VTN process, its command pipe and every JSON line it printed.
struct Vtn {
    port: u16,
    child: Child,
    stdin: ChildStdin,
    lines: Arc<Mutex<Vec<Value>>>,
    /// Lines before this index were already taken by a `wait` or `send`.
    seen: usize,
}

impl Vtn {
    /// On a free port (another tried if the port was taken meanwhile), or on `port`.
    fn start(port: Option<u16>) -> Vtn {
        Vtn::start_with(port, &[])
    }

    /// With more arguments for vtn.py (`--cert`, `--key`, `--ca`).
    fn start_with(port: Option<u16>, args: &[&std::ffi::OsStr]) -> Vtn {
        for _ in 0..5 {
            if let Some(v) = Vtn::try_start(port.unwrap_or_else(free_port), args) {
                return v;
            }
        }
        panic!("the OpenLEADR VTN did not start on any of 5 ports");
    }

    fn try_start(port: u16, args: &[&std::ffi::OsStr]) -> Option<Vtn> {
        let script = workspace_root().join("tests/openadr/vtn.py");
        let mut child = Command::new(python())
            .arg(&script)
            .args(["--port", &port.to_string(), "--poll-s", "1"])
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", script.display()));
        let stdin = child.stdin.take().expect("stdin");
        let stdout = child.stdout.take().expect("stdout");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Ok(v) = serde_json::from_str::<Value>(&line) {
                    if v.is_object() {
                        sink.lock().expect("lines").push(v);
                    }
                }
            }
        });
        let mut v = Vtn {
            port,
            child,
            stdin,
            lines,
            seen: 0,
        };
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(30) {
            if v.child.try_wait().ok().flatten().is_some() {
                return None; // the port was taken
            }
            if v.lines
                .lock()
                .expect("lines")
                .iter()
                .any(|l| l.get("ready").is_some())
            {
                return Some(v);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("the OpenLEADR VTN did not come up on port {port} within 30 s");
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}/OpenADR2/Simple/2.0b", self.port)
    }

    /// The first line from now on that `want` accepts, within `secs`.
    async fn wait(&mut self, secs: f64, what: &str, want: impl Fn(&Value) -> bool) -> Value {
        let from = self.seen;
        self.wait_from(from, secs, what, want).await
    }

    /// The first line from line `from` on that `want` accepts, within `secs`.
    async fn wait_from(
        &mut self,
        from: usize,
        secs: f64,
        what: &str,
        want: impl Fn(&Value) -> bool,
    ) -> Value {
        let t0 = Instant::now();
        loop {
            let (found, printed) = {
                let lines = self.lines.lock().expect("lines");
                let found = (from..lines.len()).find(|&i| want(&lines[i]));
                (found.map(|i| (i, lines[i].clone())), lines[from..].to_vec())
            };
            if let Some((i, line)) = found {
                self.seen = self.seen.max(i + 1);
                return line;
            }
            assert!(
                t0.elapsed().as_secs_f64() < secs,
                "the VTN printed no {what} within {secs} s; it printed: {printed:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Lines of a kind printed so far (from the start).
    fn count(&self, key: &str) -> usize {
        self.lines
            .lock()
            .expect("lines")
            .iter()
            .filter(|l| l.get(key).is_some())
            .count()
    }

    async fn send(&mut self, cmd: Value) {
        writeln!(self.stdin, "{cmd}").expect("write to the VTN");
        self.stdin.flush().expect("flush");
        let line = self
            .wait(10.0, "answer to a command", |l| {
                l.get("done").is_some() || l.get("error").is_some()
            })
            .await;
        assert!(line.get("error").is_none(), "{cmd}: {line}");
    }

    fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([sig, &self.child.id().to_string()])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "kill {sig} the VTN");
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Vtn {
    fn drop(&mut self) {
        self.signal_quiet("-CONT");
        self.kill();
    }
}

impl Vtn {
    fn signal_quiet(&self, sig: &str) {
        let _ = Command::new("kill")
            .args([sig, &self.child.id().to_string()])
            .status();
    }
}

struct Running {
    cancel: CancellationToken,
    events: watch::Receiver<Vec<GridEvent>>,
    stats: Stats,
    task: tokio::task::JoinHandle<()>,
}

fn start_ven(url: &str, timeout_s: f64, opt: Option<sources::openadr2b::OptFn>) -> Running {
    let mut cfg = VenConfig::new(url, "powerplane-site-a");
    cfg.timeout_s = timeout_s;
    cfg.backoff_max_s = 1.0;
    start_ven_with(cfg, opt)
}

fn start_ven_with(cfg: VenConfig, opt: Option<sources::openadr2b::OptFn>) -> Running {
    let opt = opt.unwrap_or_else(|| Arc::new(|_: &GridEvent| Opt::In));
    let ven = Ven::new(cfg, opt, Arc::new(|| Some(4321.5))).expect("ven");
    let stats = ven.stats();
    let (tx, rx) = watch::channel(Vec::new());
    let cancel = CancellationToken::new();
    let task = tokio::spawn(ven.task(cancel.clone(), tx));
    Running {
        cancel,
        events: rx,
        stats,
        task,
    }
}

fn counter(stats: &Stats, name: &str, label: Option<&str>) -> u64 {
    stats
        .read()
        .iter()
        .filter(|c| c.name == name)
        .filter(|c| label.is_none_or(|l| c.labels.iter().any(|(_, v)| v == l)))
        .map(|c| c.value)
        .sum()
}

/// The events once `want` holds of them, within `secs`.
async fn events_when(
    rx: &mut watch::Receiver<Vec<GridEvent>>,
    secs: f64,
    what: &str,
    want: impl Fn(&[GridEvent]) -> bool,
) -> Vec<GridEvent> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs_f64(secs);
    loop {
        {
            let e = rx.borrow_and_update();
            if want(&e) {
                return e.clone();
            }
        }
        match tokio::time::timeout_at(deadline, rx.changed()).await {
            Ok(Ok(())) => {}
            _ => panic!(
                "no {what} within {secs} s; the VEN holds {:#?}",
                *rx.borrow()
            ),
        }
    }
}

fn event<'a>(events: &'a [GridEvent], id: &str) -> Option<&'a GridEvent> {
    events.iter().find(|e| e.id == id)
}

fn simple(id: &str, level: u8, start_s: i64, duration_s: i64) -> Value {
    json!({"cmd": "add", "id": id, "signal": "SIMPLE", "type": "level",
           "intervals": [{"start_s": start_s, "duration_s": duration_s, "value": level}]})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_is_answered_then_modified_and_cancelled() {
    let mut vtn = Vtn::start(None);
    let mut ven = start_ven(&vtn.url(), 5.0, None);
    let reg = vtn
        .wait(20.0, "registration", |l| l.get("registered").is_some())
        .await;
    assert_eq!(reg["ven_name"], "powerplane-site-a");
    let t0 = now();
    vtn.send(simple("ev1", 2, -5, 600)).await;
    let mark = vtn.seen;
    let got = events_when(&mut ven.events, 10.0, "ev1", |e| event(e, "ev1").is_some()).await;
    let e = event(&got, "ev1").expect("ev1");
    assert_eq!(e.source, "openadr2b");
    assert_eq!(e.program, "http://utility.example/dr");
    assert_eq!(e.modification, 0);
    assert_eq!(e.status, EventStatus::Active);
    assert_eq!(e.intervals.len(), 1);
    assert_eq!(e.intervals[0].target, GridTarget::Level(2));
    assert_eq!(e.intervals[0].duration_s, 600.0);
    let start_off = e.intervals[0].start.secs_since(t0);
    assert!(
        (-7.0..=-3.0).contains(&start_off),
        "started {start_off} s from now"
    );
    assert!(e.interval_at(now()).is_some(), "in force now");
    let answer = vtn
        .wait(10.0, "oadrCreatedEvent", |l| {
            l.get("created_event").is_some()
        })
        .await;
    assert_eq!(
        answer["created_event"],
        json!([{"event_id": "ev1", "modification_number": 0, "opt_type": "optIn",
                "request_id": answer["created_event"][0]["request_id"], "description": null}])
    );
    let opted = vtn
        .wait_from(mark, 5.0, "opt callback", |l| l.get("opted").is_some())
        .await;
    assert_eq!(opted["opt_type"], "optIn");

    // modified: a new level, answered again at the new modification number
    vtn.send(json!({"cmd": "modify", "id": "ev1",
                    "intervals": [{"start_s": -5, "duration_s": 300, "value": 3}]}))
        .await;
    let got = events_when(&mut ven.events, 10.0, "ev1 modified", |e| {
        event(e, "ev1").is_some_and(|e| e.modification == 1)
    })
    .await;
    let e = event(&got, "ev1").expect("ev1");
    assert_eq!(e.intervals[0].target, GridTarget::Level(3));
    assert_eq!(e.intervals[0].duration_s, 300.0);
    let answer = vtn
        .wait(10.0, "second oadrCreatedEvent", |l| {
            l.get("created_event").is_some()
        })
        .await;
    assert_eq!(answer["created_event"][0]["modification_number"], 1);
    assert_eq!(answer["created_event"][0]["opt_type"], "optIn");

    // cancelled: held as cancelled (no longer in force), answered once more
    vtn.send(json!({"cmd": "cancel", "id": "ev1"})).await;
    let got = events_when(&mut ven.events, 10.0, "ev1 cancelled", |e| {
        event(e, "ev1").is_some_and(|e| e.status == EventStatus::Cancelled)
    })
    .await;
    let e = event(&got, "ev1").expect("ev1 stays until its end");
    assert_eq!(e.modification, 2);
    assert!(e.interval_at(now()).is_none());
    let answer = vtn
        .wait(10.0, "third oadrCreatedEvent", |l| {
            l.get("created_event").is_some()
        })
        .await;
    assert_eq!(answer["created_event"][0]["modification_number"], 2);

    // no answer twice for the same version, and no errors along the way
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(vtn.count("created_event"), 3);
    assert_eq!(
        counter(&ven.stats, "openadr_events_received_total", None),
        3
    );
    assert_eq!(
        counter(&ven.stats, "openadr_errors_total", None),
        0,
        "{:?}",
        ven.stats.read()
    );
    assert!(counter(&ven.stats, "openadr_polls_total", None) >= 3);
    ven.cancel.cancel();
    ven.task.await.expect("ven task");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_dispatch_and_load_control_are_read_and_the_caller_can_opt_out() {
    let mut vtn = Vtn::start(None);
    let opt: sources::openadr2b::OptFn = Arc::new(|e: &GridEvent| {
        if e.intervals
            .iter()
            .any(|i| matches!(i.target, GridTarget::ShedW(_)))
        {
            Opt::Out {
                reason: "mustRun".into(),
            }
        } else {
            Opt::In
        }
    });
    let mut ven = start_ven(&vtn.url(), 5.0, Some(opt));
    vtn.wait(20.0, "registration", |l| l.get("registered").is_some())
        .await;
    vtn.send(
        json!({"cmd": "add", "id": "ev-d", "signal": "LOAD_DISPATCH", "type": "delta",
                    "scale": "k",
                    "intervals": [{"start_s": 60, "duration_s": 900, "value": -50.0}]}),
    )
    .await;
    let got = events_when(&mut ven.events, 10.0, "ev-d", |e| {
        event(e, "ev-d").is_some()
    })
    .await;
    let e = event(&got, "ev-d").expect("ev-d");
    assert_eq!(e.intervals[0].target, GridTarget::ShedW(50_000.0));
    assert_eq!(e.status, EventStatus::Pending);
    assert!(e.interval_at(now()).is_none(), "not started yet");
    let answer = vtn
        .wait(10.0, "oadrCreatedEvent", |l| {
            l.get("created_event").is_some()
        })
        .await;
    assert_eq!(answer["created_event"][0]["opt_type"], "optOut");
    assert_eq!(answer["created_event"][0]["description"], "mustRun");
    assert_eq!(counter(&ven.stats, "openadr_opt_outs_total", None), 1);

    // LOAD_CONTROL capacity: what is left, so the shed is the rest
    vtn.send(json!({"cmd": "add", "id": "ev-c", "signal": "LOAD_CONTROL",
                    "type": "x-loadControlCapacity",
                    "intervals": [{"start_s": -1, "duration_s": 600, "value": 0.7}]}))
        .await;
    let got = events_when(&mut ven.events, 10.0, "ev-c", |e| {
        event(e, "ev-c").is_some()
    })
    .await;
    match event(&got, "ev-c").expect("ev-c").intervals[0].target {
        GridTarget::ShedFraction(f) => assert!((f - 0.3).abs() < 1e-9, "{f}"),
        other => panic!("{other:?}"),
    }
    // a price signal is skipped and counted; its event is still held and answered
    vtn.send(
        json!({"cmd": "add", "id": "ev-p", "signal": "ELECTRICITY_PRICE", "type": "price",
                    "intervals": [{"start_s": -1, "duration_s": 600, "value": 0.42}]}),
    )
    .await;
    let got = events_when(&mut ven.events, 10.0, "ev-p", |e| {
        event(e, "ev-p").is_some()
    })
    .await;
    assert!(event(&got, "ev-p").expect("ev-p").intervals.is_empty());
    let answer = vtn
        .wait(10.0, "answer to ev-p", |l| {
            l["created_event"]
                .as_array()
                .is_some_and(|a| a.iter().any(|r| r["event_id"] == "ev-p"))
        })
        .await;
    assert_eq!(
        answer["created_event"].as_array().map(Vec::len),
        Some(1),
        "{answer}"
    );
    assert!(
        counter(
            &ven.stats,
            "openadr_signals_skipped_total",
            Some("signal_name")
        ) >= 1
    );
    assert_eq!(
        counter(&ven.stats, "openadr_errors_total", None),
        0,
        "{:?}",
        ven.stats.read()
    );
    ven.cancel.cancel();
    ven.task.await.expect("ven task");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reports_carry_the_meter_value_when_the_vtn_asks() {
    let mut vtn = Vtn::start(None);
    let ven = start_ven(&vtn.url(), 5.0, None);
    let offered = vtn
        .wait(20.0, "report registration", |l| {
            l.get("report_offered").is_some()
        })
        .await;
    assert_eq!(offered["unit"], "W");
    assert_eq!(offered["measurement"], "RealPower");
    for _ in 0..2 {
        let r = vtn
            .wait(10.0, "report", |l| l.get("report").is_some())
            .await;
        let values = r["report"].as_array().expect("values");
        assert!(!values.is_empty());
        assert!(values.iter().all(|v| v.as_f64() == Some(4321.5)), "{r}");
    }
    assert!(counter(&ven.stats, "openadr_reports_sent_total", None) >= 2);
    ven.cancel.cancel();
    ven.task.await.expect("ven task");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vtn_restarted_with_fresh_state_gets_the_ven_again() {
    let mut vtn = Vtn::start(None);
    let mut ven = start_ven(&vtn.url(), 2.0, None);
    let first = vtn
        .wait(20.0, "registration", |l| l.get("registered").is_some())
        .await;
    vtn.send(simple("ev1", 1, -5, 600)).await;
    events_when(&mut ven.events, 10.0, "ev1", |e| event(e, "ev1").is_some()).await;
    vtn.wait(10.0, "oadrCreatedEvent", |l| {
        l.get("created_event").is_some()
    })
    .await;
    let port = vtn.port;
    vtn.kill();
    drop(vtn);
    // down for a while: the event stays in force
    tokio::time::sleep(Duration::from_secs(3)).await;
    let held = ven.events.borrow().clone();
    assert!(
        event(&held, "ev1").is_some_and(|e| e.interval_at(now()).is_some()),
        "{held:#?}"
    );
    assert!(counter(&ven.stats, "openadr_errors_total", None) >= 1);
    let mut vtn = Vtn::start(Some(port));
    let again = vtn
        .wait(20.0, "registration again", |l| {
            l.get("registered").is_some()
        })
        .await;
    assert_eq!(
        again["had_registration_id"], first["registration_id"],
        "re-registration names the old registration: {again} after {first}"
    );
    assert!(counter(&ven.stats, "openadr_reregistrations_total", None) >= 1);
    vtn.send(simple("ev2", 3, -1, 600)).await;
    let got = events_when(&mut ven.events, 10.0, "ev2", |e| event(e, "ev2").is_some()).await;
    assert_eq!(
        event(&got, "ev2").expect("ev2").intervals[0].target,
        GridTarget::Level(3)
    );
    // the new VTN's list leaves ev1 out: cancelled
    assert_eq!(
        event(&got, "ev1").map(|e| e.status),
        Some(EventStatus::Cancelled)
    );
    let answer = vtn
        .wait(10.0, "oadrCreatedEvent", |l| {
            l.get("created_event").is_some()
        })
        .await;
    assert_eq!(answer["created_event"][0]["event_id"], "ev2");
    // the fresh VTN numbers anew: its ev1 (modification 0) replaces the old one
    vtn.send(simple("ev1", 2, -1, 600)).await;
    let got = events_when(&mut ven.events, 10.0, "the new ev1", |e| {
        event(e, "ev1").is_some_and(|e| e.status == EventStatus::Active)
    })
    .await;
    let e = event(&got, "ev1").expect("ev1");
    assert_eq!(
        (e.modification, e.intervals[0].target),
        (0, GridTarget::Level(2))
    );
    let answer = vtn
        .wait(10.0, "answer to the new ev1", |l| {
            l["created_event"]
                .as_array()
                .is_some_and(|a| a.iter().any(|r| r["event_id"] == "ev1"))
        })
        .await;
    assert_eq!(answer["created_event"][0]["opt_type"], "optIn");
    ven.cancel.cancel();
    ven.task.await.expect("ven task");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vtn_that_forgets_the_ven_asks_it_to_register_again() {
    let mut vtn = Vtn::start(None);
    let mut ven = start_ven(&vtn.url(), 2.0, None);
    let first = vtn
        .wait(20.0, "registration", |l| l.get("registered").is_some())
        .await;
    vtn.send(simple("ev1", 2, -5, 600)).await;
    events_when(&mut ven.events, 10.0, "ev1", |e| event(e, "ev1").is_some()).await;
    vtn.wait(10.0, "oadrCreatedEvent", |l| {
        l.get("created_event").is_some()
    })
    .await;
    vtn.send(json!({"cmd": "forget"})).await;
    let again = vtn
        .wait(10.0, "registration again", |l| {
            l.get("registered").is_some()
        })
        .await;
    assert_eq!(again["registered"], first["registered"], "the same venID");
    assert_eq!(again["had_registration_id"], first["registration_id"]);
    assert_eq!(
        counter(&ven.stats, "openadr_reregistrations_total", None),
        1
    );
    assert_eq!(
        counter(&ven.stats, "openadr_errors_total", None),
        0,
        "{:?}",
        ven.stats.read()
    );
    // the VTN still holds ev1 and sends it again (oadrRequestEvent): the same
    // modification, not answered twice
    let polls = vtn.count("polled");
    let t0 = Instant::now();
    while vtn.count("polled") < polls + 2 {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "no polls after registering again"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(vtn.count("created_event"), 1);
    let held = ven.events.borrow().clone();
    assert_eq!(
        event(&held, "ev1").map(|e| e.status),
        Some(EventStatus::Active)
    );
    ven.cancel.cancel();
    ven.task.await.expect("ven task");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_vtn_ends_each_call_by_its_deadline_and_polling_resumes() {
    let mut vtn = Vtn::start(None);
    let mut ven = start_ven(&vtn.url(), 1.0, None);
    vtn.wait(20.0, "registration", |l| l.get("registered").is_some())
        .await;
    vtn.send(simple("ev1", 2, -5, 600)).await;
    events_when(&mut ven.events, 10.0, "ev1", |e| event(e, "ev1").is_some()).await;
    vtn.wait(10.0, "oadrCreatedEvent", |l| {
        l.get("created_event").is_some()
    })
    .await;

    vtn.signal("-STOP");
    let before = counter(&ven.stats, "openadr_errors_total", Some("timeout"));
    tokio::time::sleep(Duration::from_secs(6)).await;
    let timeouts = counter(&ven.stats, "openadr_errors_total", Some("timeout")) - before;
    // each call ends after 1 s, then waits at most 1 s: at least 2 in 6 s
    assert!(timeouts >= 2, "{timeouts} timeouts; {:?}", ven.stats.read());
    let held = ven.events.borrow().clone();
    let e = event(&held, "ev1").expect("held through the outage");
    assert_eq!(e.status, EventStatus::Active);
    assert_eq!(
        e.interval_at(now()).map(|i| i.target),
        Some(GridTarget::Level(2))
    );

    let polls = vtn.count("polled");
    vtn.signal("-CONT");
    vtn.wait(15.0, "poll after SIGCONT", |l| l.get("polled").is_some())
        .await;
    let t0 = Instant::now();
    while vtn.count("polled") < polls + 3 {
        assert!(
            t0.elapsed() < Duration::from_secs(15),
            "polling did not resume"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // hung again: cancelling ends the task at once, not at the call's deadline
    vtn.signal("-STOP");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let t = Instant::now();
    ven.cancel.cancel();
    tokio::time::timeout(Duration::from_millis(500), &mut ven.task)
        .await
        .expect("the VEN task ends within 0.5 s of cancellation")
        .expect("ven task");
    assert!(t.elapsed() < Duration::from_millis(500));
    vtn.signal("-CONT");
}

/// A VTN over HTTPS that asks for a client certificate (and checks it against the
/// one made here), with `extra` arguments; a VEN configuration that trusts it and shows
/// that certificate (its files also returned); the directories holding the files.
fn tls_vtn(extra: &[&str]) -> (Vtn, VenConfig, (String, String), [tempfile::TempDir; 2]) {
    let (server_dir, client_dir) = (
        tempfile::tempdir().expect("dir"),
        tempfile::tempdir().expect("dir"),
    );
    let (server_cert, server_key, server_pin) = powerplane_tests::self_signed(server_dir.path());
    let (client_cert, client_key, _) = powerplane_tests::self_signed(client_dir.path());
    let mut args: Vec<&std::ffi::OsStr> = vec![
        "--cert".as_ref(),
        server_cert.as_os_str(),
        "--key".as_ref(),
        server_key.as_os_str(),
        "--ca".as_ref(),
        client_cert.as_os_str(),
    ];
    args.extend(extra.iter().map(|a| std::ffi::OsStr::new(*a)));
    let vtn = Vtn::start_with(None, &args);
    let url = vtn.url().replace("http://", "https://");
    let mut cfg = VenConfig::new(&url, "powerplane-site-a");
    cfg.timeout_s = 2.0;
    cfg.backoff_max_s = 1.0;
    cfg.tls.pinned_sha256 = Some(server_pin);
    let client = (
        client_cert.display().to_string(),
        client_key.display().to_string(),
    );
    cfg.tls.client_cert_file = Some(client.0.clone());
    cfg.tls.client_key_file = Some(client.1.clone());
    (vtn, cfg, client, [server_dir, client_dir])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_shows_the_client_certificate_from_files() {
    let (mut vtn, mut cfg, client, _dirs) = tls_vtn(&[]);
    let (client_cert, client_key) = client;
    cfg.tls.client_cert_file = None;
    cfg.tls.client_key_file = None;

    // without a client certificate the VTN refuses the handshake
    let anonymous = start_ven_with(cfg.clone(), None);
    let t0 = Instant::now();
    while counter(&anonymous.stats, "openadr_errors_total", Some("tls")) == 0 {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "no TLS error without a client certificate: {:?}",
            anonymous.stats.read()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    anonymous.cancel.cancel();
    anonymous.task.await.expect("ven task");
    assert_eq!(vtn.count("registered"), 0);

    // with one, it registers (the VTN takes its fingerprint) and gets events
    cfg.tls.client_cert_file = Some(client_cert);
    cfg.tls.client_key_file = Some(client_key);
    let mut ven = start_ven_with(cfg, None);
    let reg = vtn
        .wait(20.0, "registration", |l| l.get("registered").is_some())
        .await;
    assert!(reg["fingerprint"].is_string(), "{reg}");
    vtn.send(simple("ev1", 1, -5, 600)).await;
    events_when(&mut ven.events, 10.0, "ev1", |e| event(e, "ev1").is_some()).await;
    vtn.wait(10.0, "oadrCreatedEvent", |l| {
        l.get("created_event").is_some()
    })
    .await;
    ven.cancel.cancel();
    ven.task.await.expect("ven task");
}

/// A VTN that checks XML signatures (OpenLEADR's default over TLS): the VEN that signs
/// registers, polls, gets its event and answers it; the same VEN unsigned registers
/// (a first registration carries no venID, so nothing is checked) and then has every
/// call refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vtn_that_checks_xml_signatures_takes_the_signed_ven_and_refuses_the_unsigned_one() {
    let (mut vtn, mut cfg, _, _dirs) = tls_vtn(&["--verify-signatures"]);

    // unsigned: registered, then nothing it sends with its venID is taken
    let unsigned = start_ven_with(cfg.clone(), None);
    vtn.wait(20.0, "registration", |l| l.get("registered").is_some())
        .await;
    let t0 = Instant::now();
    while counter(&unsigned.stats, "openadr_errors_total", None) < 2 {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "the unsigned VEN's calls are refused: {:?}",
            unsigned.stats.read()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    unsigned.cancel.cancel();
    unsigned.task.await.expect("ven task");
    assert_eq!(vtn.count("polled"), 0, "no unsigned poll taken");

    // signed: polls, gets the event, answers it
    cfg.xml_signature = true;
    let mut ven = start_ven_with(cfg, None);
    vtn.wait(20.0, "a signed poll", |l| l.get("polled").is_some())
        .await;
    vtn.send(simple("ev1", 1, -5, 600)).await;
    events_when(&mut ven.events, 10.0, "ev1", |e| event(e, "ev1").is_some()).await;
    let answer = vtn
        .wait(10.0, "oadrCreatedEvent", |l| {
            l.get("created_event").is_some()
        })
        .await;
    assert_eq!(answer["created_event"][0]["event_id"], "ev1", "{answer}");
    ven.cancel.cancel();
    ven.task.await.expect("ven task");
}

/// A VTN that signs its messages (OpenLEADR with a signing certificate, RSA or P-256):
/// the VEN pinned to that certificate takes them (registers, gets and answers an
/// event); pinned to another, it refuses every answer as not signed by the VTN it
/// trusts, and counts it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_vtns_signed_messages_are_taken_only_with_the_pinned_certificate() {
    for kind in ["rsa", "ec"] {
        let dir = tempfile::tempdir().expect("dir");
        let (cert, key, sha256) = identity(dir.path(), kind);
        let args = [
            "--sign-cert".as_ref(),
            std::ffi::OsStr::new(&cert),
            "--sign-key".as_ref(),
            std::ffi::OsStr::new(&key),
        ];
        let mut vtn = Vtn::start_with(None, &args);
        let mut cfg = VenConfig::new(&vtn.url(), "powerplane-site-a");
        cfg.timeout_s = 2.0;
        cfg.backoff_max_s = 1.0;

        // pinned to another certificate: nothing the VTN says is taken
        cfg.vtn_signing_sha256 = Some("00".repeat(32));
        let wrong = start_ven_with(cfg.clone(), None);
        let t0 = Instant::now();
        while counter(&wrong.stats, "openadr_errors_total", Some("signature")) < 2 {
            assert!(
                t0.elapsed() < Duration::from_secs(20),
                "{kind}: refused as another's signature: {:?}",
                wrong.stats.read()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(
            counter(
                &wrong.stats,
                "openadr_payloads_rejected_total",
                Some("signature")
            ) >= 2
        );
        assert_eq!(
            counter(&wrong.stats, "openadr_registrations_total", None),
            0
        );
        wrong.cancel.cancel();
        wrong.task.await.expect("ven task");

        // pinned to the VTN's: registers, gets the event, answers it
        cfg.vtn_signing_sha256 = Some(sha256);
        let mut ven = start_ven_with(cfg, None);
        vtn.wait(20.0, "a poll", |l| l.get("polled").is_some())
            .await;
        vtn.send(simple("ev1", 1, -5, 600)).await;
        events_when(&mut ven.events, 10.0, "ev1", |e| event(e, "ev1").is_some()).await;
        vtn.wait(10.0, "oadrCreatedEvent", |l| {
            l.get("created_event").is_some()
        })
        .await;
        assert_eq!(
            counter(&ven.stats, "openadr_errors_total", Some("signature")),
            0,
            "{kind}"
        );
        ven.cancel.cancel();
        ven.task.await.expect("ven task");
    }
}

/// A key pair and self-signed certificate of `kind` (`rsa`, `ec`) in `dir`.
fn identity(dir: &std::path::Path, kind: &str) -> (String, String, String) {
    let newkey: &[&str] = match kind {
        "rsa" => &["rsa:2048"],
        _ => &["ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"],
    };
    let (c, k, sha256) = powerplane_tests::self_signed_key(dir, newkey);
    (c.display().to_string(), k.display().to_string(), sha256)
}

/// Every payload signed with an RSA and with an ECDSA P-256 key passes the 2.0b XSD and
/// OpenLEADR's own signature check (signxml: both references' digests, the signature
/// over the canonical SignedInfo, the certificate's fingerprint, the replay
/// protection, its window widened from 5 s to 2 min: Python's start alone can take
/// longer on a loaded machine; the VTN test below keeps the 5 s); a payload changed after
/// signing, or signed by another certificate, does not.
#[test]
fn signed_payloads_pass_openleadrs_signature_check_and_tampered_ones_fail() {
    use sources::openadr2b::payload;
    use sources::openadr2b::sign::{self, Signer};
    let dir = tempfile::tempdir().expect("dir");
    let check = "import sys\n\
                 from openleadr import utils\n\
                 from datetime import timedelta\n\
                 from openleadr import messaging\n\
                 messaging.REPLAY_PROTECT_MAX_TIME_DELTA = timedelta(seconds=120)\n\
                 from openleadr.messaging import validate_xml_schema, validate_xml_signature\n\
                 fp = utils.certificate_fingerprint(open(sys.argv[1]).read())\n\
                 for f in sys.argv[2:]:\n\
                 \x20   try:\n\
                 \x20       tree = validate_xml_schema(open(f, 'rb').read())\n\
                 \x20       validate_xml_signature(tree, cert_fingerprint=fp)\n\
                 \x20       print('valid')\n\
                 \x20   except Exception as e:\n\
                 \x20       print('invalid', type(e).__name__, str(e).replace('\\n', ' '))\n";
    for kind in ["rsa", "ec"] {
        let sub = dir.path().join(kind);
        std::fs::create_dir_all(&sub).expect("dir");
        let (cert, key, sha256) = identity(&sub, kind);
        let signer = Signer::from_files(&cert, &key).expect("signer");
        let t = now();
        let payloads = [
            payload::create_party_registration(
                "q3",
                Some("reg1"),
                Some("ven1"),
                "site <a> & 'b'",
                true,
            ),
            payload::poll("ven1"),
            payload::update_report("q10", "ven1", "rr1", t, &[(t, 1234.5), (t, 0.0)]),
        ];
        let mut files = Vec::new();
        for (i, p) in payloads.iter().enumerate() {
            let signed = signer
                .sign(p, now(), &format!("{kind}-{i}"))
                .expect("signed");
            let f = sub.join(format!("{i}.xml"));
            std::fs::write(&f, &signed).expect("write");
            files.push(f);
            if i == 1 {
                // the same poll for another VEN, the signature kept
                let tampered = signed.replace(">ven1<", ">ven2<");
                assert_ne!(tampered, signed);
                let f = sub.join("tampered.xml");
                std::fs::write(&f, tampered).expect("write");
                files.push(f);
            }
        }
        let other = sub.join("other");
        std::fs::create_dir_all(&other).expect("dir");
        let (other_cert, _, _) = identity(&other, kind);
        let out = Command::new(python())
            .arg("-c")
            .arg(check)
            .arg(&cert)
            .args(&files)
            .output()
            .expect("python");
        let said = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let lines: Vec<&str> = said.lines().collect();
        assert_eq!(lines.len(), 4, "{said}");
        assert_eq!(lines[0], "valid", "{kind}: {said}");
        assert_eq!(lines[1], "valid", "{kind}: {said}");
        assert!(
            lines[2].starts_with("invalid"),
            "{kind}: the tampered poll: {said}"
        );
        assert_eq!(lines[3], "valid", "{kind}: {said}");
        // and the VEN's own check of a signed message takes them, pinned to the
        // certificate, and refuses the tampered one and another pin
        let pin = sources::tls::parse_fingerprint(&sha256).expect("pin");
        for (k, f) in files.iter().enumerate() {
            let text = std::fs::read_to_string(f).expect("read");
            let got = sign::verify(&text, &pin);
            if k == 2 {
                assert!(matches!(got, Err(sign::VerifyError::Digest(_))), "{got:?}");
            } else {
                assert_eq!(got, Ok(()), "{kind} {k}");
            }
        }
        let text = std::fs::read_to_string(&files[0]).expect("read");
        assert!(matches!(
            sign::verify(&text, &[0; 32]),
            Err(sign::VerifyError::Certificate(_))
        ));
        assert_eq!(
            sign::verify(&payload::poll("ven1"), &pin),
            Err(sign::VerifyError::Unsigned)
        );
        // checked against another certificate's fingerprint: refused
        let out = Command::new(python())
            .arg("-c")
            .arg(check)
            .arg(&other_cert)
            .arg(&files[0])
            .output()
            .expect("python");
        let said = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(
            said.starts_with("invalid FingerprintMismatch"),
            "{kind}: {said}"
        );
    }
}

#[test]
fn every_payload_the_ven_sends_passes_the_2_0b_schema() {
    use sources::openadr2b::payload::{self, EventReply};
    let t = now();
    let reply = |opt_in| EventReply {
        event_id: "ev & 1".into(),
        modification: 3,
        opt_in,
        reason: (!opt_in).then(|| "x-<reason>".into()),
    };
    let payloads = [
        payload::query_registration("q1"),
        payload::create_party_registration("q2", None, None, "site <a> & 'b'", false),
        payload::create_party_registration("q3", Some("reg1"), Some("ven1"), "a", true),
        payload::poll("ven1"),
        payload::request_event("q4", "ven1"),
        payload::created_event("q5", "ven1", &[reply(true), reply(false)]),
        payload::created_event("q6", "ven1", &[]),
        payload::register_report("q7", "ven1", t, 1.0, 3600.0),
        payload::created_report("q8", "ven1", &["rr1".into()]),
        payload::created_report("q9", "ven1", &[]),
        payload::update_report("q10", "ven1", "rr1", t, &[(t, 1234.5), (t, 0.0)]),
        payload::registered_report("q11", "ven1"),
        payload::canceled_party_registration("q12", "reg1", "ven1"),
        payload::response("q13", "ven1"),
    ];
    let dir = tempfile::tempdir().expect("dir");
    let mut files = Vec::new();
    for (i, p) in payloads.iter().enumerate() {
        let f = dir.path().join(format!("{i}.xml"));
        std::fs::write(&f, p).expect("write");
        files.push(f);
    }
    // OpenLEADR's own check: the 2.0b XSD (lxml), then its parser
    let check = "import sys\n\
                 from openleadr.messaging import validate_xml_schema, parse_message\n\
                 for f in sys.argv[1:]:\n\
                 \x20   x = open(f, 'rb').read()\n\
                 \x20   validate_xml_schema(x)\n\
                 \x20   print(parse_message(x)[0])\n";
    let out = Command::new(python())
        .arg("-c")
        .arg(check)
        .args(&files)
        .output()
        .expect("python");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let names: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect();
    assert_eq!(names.len(), payloads.len());
    assert_eq!(names[5], "oadrCreatedEvent");
    assert_eq!(names[12], "oadrCanceledPartyRegistration");
}
