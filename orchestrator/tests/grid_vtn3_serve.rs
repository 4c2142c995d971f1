//! `powerplane serve` as a VEN of a real OpenADR 3 VTN (`openleadr-vtn` 0.2.8 from
//! crates.io on the machine's PostgreSQL; tests/src/openadr3_vtn.rs):
//! `[demand_response] protocol = "openadr3"`, the client secret from a file. The
//! utility's SIMPLE level-2 event reaches the grid controller (the target is 25% under
//! the meter as the event began, as the default levels say), the VEN reports the meter
//! the controller reads, the event is on `/metrics` and `/api/v1/grid`; deleting it on
//! the VTN ends it and the rebound limit follows. A VTN that hangs (SIGSTOP) delays no
//! tick, and the event in force stays.

mod common;
#[path = "../../tests/src/openadr3_vtn.rs"]
#[allow(dead_code)]
mod openadr3_vtn;

use std::process::Command;
use std::time::Duration;

use common::{grid_metrics as metrics, grid_status as grid, metric_value, wait_until as wait_for};
use openadr3_vtn::{event_request, free_port, Vtn, VEN_CLIENT, VEN_SECRET};

fn check(config: &std::path::Path) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_powerplane"))
        .args(["serve", "--check", "--config"])
        .arg(config)
        .output()
        .expect("check")
}

#[test]
fn a_vtns_event_is_met_reported_and_deleted_and_a_hung_vtn_delays_no_tick() {
    let vtn = Vtn::start();
    vtn.add_ven_client();
    let program = vtn.program("ers-10");
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let port = free_port();
    let config = common::write_grid_config(
        d,
        port,
        &format!(
            "protocol = \"openadr3\"\nvtn_url = \"{}\"\nven_name = \"powerplane-demo-hall\"\nclient_id = \"{VEN_CLIENT}\"\nclient_secret_file = \"ven.secret\"\nprograms = [\"ers-10\"]\ntimeout_s = 2\npoll_s = 1\nreport_s = 2\n",
            vtn.url()
        ),
    );

    // the secret file is read when the configuration is checked: missing, it is named
    let out = check(&config);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "checked without its secret");
    assert!(
        err.contains("client_secret_file") && err.contains("ven.secret"),
        "{err}"
    );
    std::fs::write(d.join("ven.secret"), format!("{VEN_SECRET}\n")).expect("secret");
    let out = check(&config);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let _serve = common::serve(&config, 120);
    wait_for("the VEN's VEN object", Duration::from_secs(30), &mut || {
        vtn.knows_ven("powerplane-demo-hall").then_some(())
    });
    wait_for("serve answering", Duration::from_secs(20), &mut || {
        grid(port)
    });

    // a SIMPLE level-2 event, in force now for 10 minutes
    let start = (chrono::Utc::now() - chrono::Duration::seconds(2))
        .format("%Y-%m-%dT%H:%M:%S%.3fZ")
        .to_string();
    let e = vtn.bl_ok(
        "POST",
        "/events",
        Some(event_request(&program, &start, 10, "SIMPLE", &[2.0])),
    );
    let id = e["id"].as_str().expect("id").to_string();
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
            .any(|e| e["id"] == id.as_str() && e["source"] == "openadr3")),
        "{g}"
    );
    // the meter the controller reads, reported as the event asked
    let report = wait_for(
        "a report of the meter",
        Duration::from_secs(20),
        &mut || {
            let r = vtn.bl_ok("GET", &format!("/reports?eventID={id}"), None);
            r.as_array().and_then(|a| a.first().cloned())
        },
    );
    let kw = report["resources"][0]["intervals"][0]["payloads"][0]["values"][0]
        .as_f64()
        .expect("a number");
    assert!(kw > 0.0 && kw < 10_000.0, "reported {kw} kW: {report}");
    let text = metrics(port);
    assert_eq!(
        metric_value(&text, "powerplane_dr_event_active"),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        metric_value(
            &text,
            "powerplane_dr_events{source=\"openadr3\",status=\"active\"}"
        ),
        Some(1.0)
    );
    assert!(metric_value(&text, "powerplane_openadr_polls_total").is_some_and(|n| n >= 1.0));
    // the VEN's counters (the tick's render of /metrics is cached a few seconds)
    wait_for(
        "the report counted on /metrics",
        Duration::from_secs(15),
        &mut || {
            metric_value(&metrics(port), "powerplane_openadr_reports_sent_total")
                .filter(|n| *n >= 1.0)
        },
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
    assert!(
        metric_value(&text, "powerplane_openadr_errors_total{reason=\"timeout\"}")
            .is_some_and(|n| n >= 1.0),
        "{text}"
    );
    vtn.signal("-CONT");

    // deleted by the utility: the event ends, the rebound limit holds the baseline
    vtn.delete_event(&id);
    wait_for(
        "the rebound after the VTN's delete",
        Duration::from_secs(30),
        &mut || {
            let t = metrics(port);
            (metric_value(&t, "powerplane_dr_event_active") == Some(0.0)
                && metric_value(&t, "powerplane_dr_rebound_active") == Some(1.0))
            .then_some(())
        },
    );
}
