//! `powerplane serve` with signed webhook events that try to do harm: a replay of a
//! signed `submitted` event within the timestamp tolerance, events that would bring a
//! finished job back, an over-long field, a burst over the per-minute limit and a
//! `time` far ahead of the clock. Each is refused with its status and counted by
//! reason on `/metrics`; the finished job stays finished and no hold is sent for it,
//! and a job sent a future `time` still starts and finishes.

mod common;

use std::io::{Read, Write};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{http, schedulers, serve, serve_log, VIEWER};
use integrations::webhook::WebhookKey;

const KEY: &str = "8f3c1d2e4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0";
const PER_MINUTE: u32 = 12;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("port")
        .local_addr()
        .expect("addr")
        .port()
}

/// POSTs an event signed at `ts` (or with `sig`); the status and the body.
fn post(port: u16, body: &str, ts: i64, sig: Option<&str>) -> (u16, String) {
    let key = WebhookKey::from_text(KEY).expect("key");
    let sig = sig.map_or_else(
        || key.sign(&ts.to_string(), body.as_bytes()),
        str::to_string,
    );
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let head = format!(
        "POST /api/v1/events HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nX-Powerplane-Timestamp: {ts}\r\nX-Powerplane-Signature: {sig}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).expect("write");
    s.write_all(body.as_bytes()).expect("write");
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    let code = out
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (code, out)
}

/// A webhook receiver that answers 200 to everything and keeps the bodies.
fn receiver(port: u16) -> Arc<Mutex<Vec<String>>> {
    let got = Arc::new(Mutex::new(Vec::new()));
    let listener = std::net::TcpListener::bind(("127.0.0.1", port)).expect("receiver");
    let sink = got.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let mut conn = conn;
            let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
            let mut buf = Vec::new();
            let mut chunk = [0u8; 4096];
            // the head, then as much body as it announces
            let body = loop {
                let Ok(n) = conn.read(&mut chunk) else {
                    break None;
                };
                if n == 0 {
                    break None;
                }
                buf.extend_from_slice(&chunk[..n]);
                let text = String::from_utf8_lossy(&buf).to_string();
                let Some((head, body)) = text.split_once("\r\n\r\n") else {
                    continue;
                };
                let len: usize = head
                    .lines()
                    .find_map(|l| {
                        let (k, v) = l.split_once(':')?;
                        k.eq_ignore_ascii_case("content-length")
                            .then(|| v.trim().parse().ok())?
                    })
                    .unwrap_or(0);
                if body.len() >= len {
                    break Some(body.to_string());
                }
            };
            if let Some(b) = body {
                sink.lock().expect("lock").push(b);
            }
            let _ = conn
                .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok");
        }
    });
    got
}

fn holds_for(got: &Mutex<Vec<String>>, job: &str) -> usize {
    got.lock()
        .expect("lock")
        .iter()
        .filter(|b| b.contains(&format!("\"job\":\"{job}\"")) && b.contains("\"hold\""))
        .count()
}

fn value(metrics: &str, series: &str) -> Option<f64> {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

fn wait(what: &str, within: Duration, config: &std::path::Path, ok: &dyn Fn() -> bool) {
    let end = Instant::now() + within;
    while !ok() {
        assert!(
            Instant::now() < end,
            "{what}: not within {within:?}\n{}",
            serve_log(config)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The demo site, a policy that defers batch jobs, a price high for the next hour,
/// and `serve` with signed webhooks to the receiver at `rport`: the config's path.
fn write_config(d: &std::path::Path, port: u16, rport: u16) -> std::path::PathBuf {
    common::write_site_and_deferral_policy(d);
    common::write_price_step(d, 3600);
    std::fs::write(d.join("webhook.key"), format!("{KEY}\n")).expect("key");
    std::fs::write(
        d.join("powerplane.toml"),
        format!(
            "[controller]\nsite = \"site.toml\"\npolicy = \"policy.toml\"\ntick_s = 0.5\n[store]\nkind = \"embedded\"\npath = \"s.redb\"\n[prices]\nfile = \"prices.csv\"\n[http]\nlisten = \"127.0.0.1:{port}\"\nmetrics_public = true\n[[http.tokens]]\nname = \"v\"\nrole = \"viewer\"\ntoken = \"{VIEWER}\"\n[schedulers.webhook]\nkey_file = \"webhook.key\"\nurl = \"http://127.0.0.1:{rport}/hook\"\nevents_per_minute = {PER_MINUTE}\n"
        ),
    )
    .expect("config");
    d.join("powerplane.toml")
}

/// As many new jobs' events as the per-minute limit, as fast as they are answered.
fn burst(port: u16) -> Vec<u16> {
    (0..PER_MINUTE)
        .map(|i| {
            let e = format!(
                r#"{{"event":"submitted","scheduler":"lsf","job":"burst-{i}","class":"interactive"}}"#
            );
            post(port, &e, chrono::Utc::now().timestamp(), None).0
        })
        .collect()
}

#[test]
fn replayed_stale_over_long_and_bursting_events_are_refused_and_a_finished_job_stays_finished() {
    let dir = tempfile::tempdir().expect("tmp");
    let (port, rport) = (free_port(), free_port());
    let got = receiver(rport);
    let config = write_config(dir.path(), port, rport);
    let _serve = serve(&config, 180);
    wait("serve answering", Duration::from_secs(30), &config, &|| {
        schedulers(port).is_some()
    });

    // a batch job is submitted and held
    let far = (chrono::Utc::now() + chrono::Duration::hours(6)).to_rfc3339();
    let submitted = format!(
        r#"{{"event":"submitted","scheduler":"lsf","job":"r","class":"batch","gpus":1,"deadline":"{far}","est_duration_s":600}}"#
    );
    let ts = chrono::Utc::now().timestamp();
    let key = WebhookKey::from_text(KEY).expect("key");
    let sig = key.sign(&ts.to_string(), submitted.as_bytes());
    assert_eq!(post(port, &submitted, ts, Some(&sig)).0, 202);
    wait(
        "the hold of lsf:r sent",
        Duration::from_secs(30),
        &config,
        &|| holds_for(&got, "lsf:r") >= 1,
    );
    // ... and finishes
    let finished = r#"{"event":"finished","scheduler":"lsf","job":"r"}"#;
    assert_eq!(post(port, finished, ts + 1, None).0, 202);
    wait("lsf:r finished", Duration::from_secs(10), &config, &|| {
        schedulers(port).is_some_and(|s| {
            s["lifecycle"]["lsf:r"].is_null() && s["webhook"]["holds"]["lsf:r"].is_null()
        })
    });
    let holds = holds_for(&got, "lsf:r");

    // the signed submitted event again, as captured: a replay
    let (code, body) = post(port, &submitted, ts, Some(&sig));
    assert_eq!(code, 409, "{body}");
    // signed anew, or any other event: older than the job's end, or for a finished job
    // (each a second apart, so that no two share a timestamp and a body)
    let (code, body) = post(port, &submitted, ts + 3, None);
    assert_eq!(code, 409, "{body}");
    assert!(body.contains("does not change it"), "{body}");
    let started = r#"{"event":"started","scheduler":"lsf","job":"r"}"#;
    assert_eq!(post(port, started, ts + 3, None).0, 409);
    // a repeat of the end is harmless
    assert_eq!(post(port, finished, ts + 5, None).0, 202);
    // an over-long field is named
    let long = format!(
        r#"{{"event":"submitted","scheduler":"lsf","job":"long","project":"{}"}}"#,
        "p".repeat(200)
    );
    let (code, body) = post(port, &long, ts + 3, None);
    assert_eq!(code, 400, "{body}");
    assert!(
        body.contains("project: at most 128 characters, got 200"),
        "{body}"
    );

    // ticks later, the finished job is still finished and was not held again
    std::thread::sleep(Duration::from_secs(3));
    let st = schedulers(port).expect("schedulers");
    assert!(st["lifecycle"]["lsf:r"].is_null(), "{st}");
    assert!(st["webhook"]["holds"]["lsf:r"].is_null(), "{st}");
    assert_eq!(
        holds_for(&got, "lsf:r"),
        holds,
        "no hold sent for a finished job"
    );

    // a burst over the per-minute limit
    let codes = burst(port);
    assert!(codes.contains(&202), "{codes:?}");
    assert!(codes.contains(&429), "{codes:?}");
    let limited = codes.iter().filter(|c| **c == 429).count() as f64;

    let series = |r: &str| format!("powerplane_events_rejected_total{{reason=\"{r}\"}}");
    wait(
        "the refusals on /metrics",
        Duration::from_secs(10),
        &config,
        &|| {
            let (_, _, m) = http(port, "GET", "/metrics", None, b"");
            value(&m, &series("rate_limited")) == Some(limited)
        },
    );
    let (_, _, m) = http(port, "GET", "/metrics", None, b"");
    assert_eq!(value(&m, &series("replay")), Some(1.0), "{m}");
    assert_eq!(value(&m, &series("stale")), Some(2.0), "{m}");
    assert_eq!(value(&m, &series("field_too_long")), Some(1.0), "{m}");
    assert_eq!(value(&m, &series("bad_signature")), Some(0.0), "{m}");
    common::promtool_check(&m);
}

#[test]
fn a_job_that_finished_before_a_restart_stays_finished_after_it() {
    use integrations::store::{Store, Tx};
    use orchestrator::schedulers::{Schedulers, SchedulersSection};
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path();
    std::fs::write(d.join("webhook.key"), KEY).expect("key");
    let mut store = Store::new(Box::new(
        orchestrator::embedded::EmbeddedBackend::open(&d.join("s.redb")).expect("store"),
    ));
    // what a run before the restart stored: lsf:old submitted, started and finished
    let now = ::common::wall_clock();
    let e = |json: &str| integrations::webhook::JobEvent::parse(json.as_bytes()).expect("event");
    let job = e(r#"{"event":"submitted","scheduler":"lsf","job":"old","class":"batch"}"#).apply(
        None,
        &[],
        now.plus_secs(-60.0),
    );
    let job = e(r#"{"event":"started","scheduler":"lsf","job":"old"}"#).apply(
        Some(&job),
        &[],
        now.plus_secs(-50.0),
    );
    let job = e(r#"{"event":"finished","scheduler":"lsf","job":"old"}"#).apply(
        Some(&job),
        &[],
        now.plus_secs(-10.0),
    );
    let mut tx = Tx::new();
    tx.put_job(&job);
    store.commit(tx).expect("commit");

    let section: SchedulersSection =
        toml::from_str("[webhook]\nkey_file = \"webhook.key\"\nack_wait_s = 0.2\n")
            .expect("section");
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let mut schedulers = Schedulers::open(
        Some(&section),
        d,
        &mut store,
        1.0,
        rt.handle().clone(),
        tokio_util::sync::CancellationToken::new(),
    )
    .expect("open");
    let inbox = schedulers.inbox().expect("inbox");
    let submitted = br#"{"event":"submitted","scheduler":"lsf","job":"old","class":"batch"}"#;
    let (status, why) = inbox
        .receive(true, None, None, submitted, now)
        .expect_err("a finished job does not come back");
    assert_eq!(status, 409, "{why}");
    // a new job is taken (503: nobody stores it in this test), the old one is not
    let new = br#"{"event":"submitted","scheduler":"lsf","job":"new","class":"batch"}"#;
    assert_eq!(
        inbox.receive(true, None, None, new, now).map_err(|e| e.0),
        Err(503)
    );
    let jobs = schedulers.jobs();
    let ids: Vec<&str> = jobs.iter().map(|j| j.id.as_str()).collect();
    assert_eq!(ids, vec!["lsf:new"]);
    assert_eq!(
        schedulers
            .events_rejected()
            .and_then(|r| r.get("stale").copied()),
        Some(1)
    );
}

#[test]
fn an_event_dated_beyond_the_tolerance_ahead_is_refused_counted_and_the_job_still_finishes() {
    let dir = tempfile::tempdir().expect("tmp");
    let (port, rport) = (free_port(), free_port());
    let _got = receiver(rport);
    let config = write_config(dir.path(), port, rport);
    let _serve = serve(&config, 120);
    wait("serve answering", Duration::from_secs(30), &config, &|| {
        schedulers(port).is_some()
    });
    let ts = chrono::Utc::now().timestamp();
    let event = |kind: &str, time: &str| {
        format!(
            r#"{{"event":"{kind}","scheduler":"lsf","job":"f","class":"interactive","time":"{time}"}}"#
        )
    };
    let at = |secs: i64| {
        chrono::DateTime::from_timestamp(ts + secs, 0)
            .expect("time")
            .to_rfc3339()
    };
    assert_eq!(post(port, &event("submitted", &at(0)), ts, None).0, 202);
    // signed, and dated 2999 or 10 minutes ahead: refused, the job as it was
    for time in ["2999-01-01T00:00:00Z".to_string(), at(600)] {
        let (code, body) = post(port, &event("started", &time), ts + 1, None);
        assert_eq!(code, 400, "{body}");
        assert!(body.contains("ahead of the controller's clock"), "{body}");
    }
    // its later events still apply: it starts and finishes
    let state = || {
        let (_, _, body) = http(port, "GET", "/api/v1/jobs", Some(VIEWER), b"");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
        let jobs = v["jobs"].as_array().cloned().unwrap_or_default();
        jobs.iter()
            .find(|j| j["job"]["id"] == "lsf:f")
            .map(|j| j["job"]["state"].as_str().unwrap_or("").to_string())
    };
    let (code, body) = post(port, &event("started", &at(2)), ts + 2, None);
    assert_eq!(code, 202, "{body}");
    wait("lsf:f running", Duration::from_secs(10), &config, &|| {
        state().as_deref() == Some("running")
    });
    let (code, body) = post(port, &event("finished", &at(3)), ts + 3, None);
    assert_eq!(code, 202, "{body}");
    // (a finished job leaves the list of pending and running ones)
    wait("lsf:f finished", Duration::from_secs(10), &config, &|| {
        state().is_none_or(|s| s == "finished")
    });
    let (_, _, m) = http(port, "GET", "/metrics", None, b"");
    assert_eq!(
        value(
            &m,
            "powerplane_events_rejected_total{reason=\"time_out_of_window\"}"
        ),
        Some(2.0),
        "{m}"
    );
    common::promtool_check(&m);
}
