//! `powerplane serve` as a VEN of a real OpenADR 2.0b VTN (OpenLEADR's, from PyPI, in
//! `.venv`; `tests/openadr/vtn.py`): `[demand_response] protocol = "openadr2b"`. The
//! VTN's SIMPLE level-2 event reaches the grid controller (the target is 25% under the
//! meter as the event began, as the default levels say), the VEN opts in and reports
//! the meter the controller reads, the event is on `/metrics` and `/api/v1/grid`; the
//! VTN's cancel ends it and the rebound limit follows. A VTN that hangs (SIGSTOP)
//! delays no tick, and the event in force stays.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{grid_metrics as metrics, grid_status as grid, metric_value, wait_until as wait_for};
use serde_json::Value;

fn root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace")
        .to_path_buf()
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("port")
        .local_addr()
        .expect("addr")
        .port()
}

/// The VTN: its command pipe and every JSON line it printed.
struct Vtn {
    port: u16,
    child: Child,
    stdin: ChildStdin,
    lines: Arc<Mutex<Vec<Value>>>,
}

impl Drop for Vtn {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-CONT", &self.child.id().to_string()])
            .status();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Vtn {
    fn start() -> Vtn {
        let py = root().join(".venv/bin/python");
        let ok = Command::new(&py)
            .args(["-c", "import openleadr"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        assert!(
            ok,
            "this test needs OpenLEADR importable by {} (scripts/test installs it)",
            py.display()
        );
        for _ in 0..5 {
            let port = free_port();
            let mut child = Command::new(&py)
                .arg(root().join("tests/openadr/vtn.py"))
                .args(["--port", &port.to_string(), "--poll-s", "1"])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .expect("vtn.py");
            let stdin = child.stdin.take().expect("stdin");
            let stdout = child.stdout.take().expect("stdout");
            let lines = Arc::new(Mutex::new(Vec::new()));
            let sink = lines.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                    if let Ok(v) = serde_json::from_str::<Value>(&line) {
                        sink.lock().expect("lines").push(v);
                    }
                }
            });
            let mut v = Vtn {
                port,
                child,
                stdin,
                lines,
            };
            let t0 = Instant::now();
            while t0.elapsed() < Duration::from_secs(30) {
                if v.child.try_wait().ok().flatten().is_some() {
                    break; // the port was taken: another one
                }
                if v.has(|l| l.get("ready").is_some()) {
                    return v;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        panic!("the OpenLEADR VTN did not start");
    }

    fn has(&self, want: impl Fn(&Value) -> bool) -> bool {
        self.lines.lock().expect("lines").iter().any(want)
    }

    fn find(&self, want: impl Fn(&Value) -> bool) -> Option<Value> {
        self.lines
            .lock()
            .expect("lines")
            .iter()
            .find(|l| want(l))
            .cloned()
    }

    fn send(&mut self, cmd: Value) {
        writeln!(self.stdin, "{cmd}").expect("vtn command");
        self.stdin.flush().expect("flush");
    }

    fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([sig, &self.child.id().to_string()])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "kill {sig}");
    }
}

#[test]
fn a_vtns_event_is_met_reported_and_cancelled_and_a_hung_vtn_delays_no_tick() {
    let mut vtn = Vtn::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let port = free_port();
    let config = common::write_grid_config(
        dir.path(),
        port,
        &format!(
            "protocol = \"openadr2b\"\nvtn_url = \"http://127.0.0.1:{}/OpenADR2/Simple/2.0b\"\nven_name = \"powerplane-demo-hall\"\ntimeout_s = 2\n",
            vtn.port
        ),
    );
    let check = Command::new(env!("CARGO_BIN_EXE_powerplane"))
        .args(["serve", "--check", "--config"])
        .arg(&config)
        .output()
        .expect("check");
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stderr)
    );
    let _serve = common::serve(&config, 120);
    wait_for("the VEN registered", Duration::from_secs(30), &mut || {
        vtn.find(|l| l["ven_name"] == "powerplane-demo-hall" || l.get("registered").is_some())
    });
    wait_for("serve answering", Duration::from_secs(20), &mut || {
        grid(port)
    });

    // a SIMPLE level-2 event, in force now for 10 minutes
    vtn.send(
        serde_json::json!({"cmd": "add", "id": "ev1", "signal": "SIMPLE", "type": "level",
        "intervals": [{"start_s": -2, "duration_s": 600, "value": 2}]}),
    );
    let g = wait_for(
        "the VTN's event in force",
        Duration::from_secs(20),
        &mut || {
            let g = grid(port)?;
            g["in_force"]["target_w"].as_f64().map(|_| g)
        },
    );
    let m = &g["in_force"];
    let (baseline, target) = (
        m["baseline_w"].as_f64().expect("baseline"),
        m["target_w"].as_f64().expect("target"),
    );
    assert!(baseline > 0.0, "{g}");
    assert!(
        (target - 0.75 * baseline).abs() < 1e-6 * baseline,
        "level 2 sheds 25%: {g}"
    );
    assert!(
        g["events"].as_array().is_some_and(|e| e
            .iter()
            .any(|e| e["id"] == "ev1" && e["source"] == "openadr2b")),
        "{g}"
    );
    // opted in, and the meter reported
    wait_for("the VEN's optIn", Duration::from_secs(10), &mut || {
        vtn.find(|l| l.to_string().contains("optIn"))
    });
    let report = wait_for(
        "a report with the meter",
        Duration::from_secs(20),
        &mut || {
            vtn.find(|l| {
                l.get("report")
                    .and_then(|r| r.as_array())
                    .is_some_and(|r| !r.is_empty())
            })
        },
    );
    assert!(
        report.to_string().chars().any(|c| c.is_ascii_digit()),
        "{report}"
    );
    let text = metrics(port);
    assert_eq!(
        metric_value(&text, "powerplane_dr_event_active"),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        metric_value(
            &text,
            "powerplane_dr_events{source=\"openadr2b\",status=\"active\"}"
        ),
        Some(1.0)
    );

    // the VTN hangs: ticks go on (the tick counter keeps rising) and the event stays
    let ticks = |t: &str| metric_value(t, "powerplane_ticks_total").unwrap_or(0.0);
    let before = ticks(&metrics(port));
    vtn.signal("-STOP");
    std::thread::sleep(Duration::from_secs(5));
    let text = metrics(port);
    assert!(
        ticks(&text) >= before + 3.0,
        "ticks stalled behind a hung VTN: {before} -> {}",
        ticks(&text)
    );
    assert_eq!(metric_value(&text, "powerplane_dr_event_active"), Some(1.0));
    vtn.signal("-CONT");

    // cancelled by the VTN: the event ends, the rebound limit holds the baseline
    vtn.send(serde_json::json!({"cmd": "cancel", "id": "ev1"}));
    wait_for(
        "the rebound after the VTN's cancel",
        Duration::from_secs(30),
        &mut || {
            let t = metrics(port);
            (metric_value(&t, "powerplane_dr_event_active") == Some(0.0)
                && metric_value(&t, "powerplane_dr_rebound_active") == Some(1.0))
            .then_some(())
        },
    );
}
