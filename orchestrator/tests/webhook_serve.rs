//! `powerplane serve` with a generic scheduler over signed webhooks: job events in
//! (signed or with an operator token; bad signatures, stale timestamps, oversized and
//! malformed events refused and counted), actions out through a durable outbox to a
//! receiver that is down for a while (and serve restarted meanwhile): every action
//! arrives once, signed, in order per job.

mod common;

use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{http, schedulers, serve, VIEWER};

const OPERATOR: &str = "operator-token-0123456789abcdef";
const KEY: &str = "8f3c1d2e4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0";

/// HMAC-SHA256 with `openssl dgst`, as docs/schedulers.md shows a receiver doing it.
fn openssl_hmac(data: &[u8]) -> String {
    let mut child = Command::new("openssl")
        .args([
            "dgst",
            "-sha256",
            "-mac",
            "HMAC",
            "-macopt",
            &format!("hexkey:{KEY}"),
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("this test needs openssl");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(data)
        .expect("pipe");
    let out = child.wait_with_output().expect("openssl");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    text.rsplit(' ').next().unwrap_or("").trim().to_string()
}

fn signed_post(port: u16, body: &str, ts: i64, sig: Option<String>) -> u16 {
    let sig = sig
        .unwrap_or_else(|| format!("sha256={}", openssl_hmac(format!("{ts}.{body}").as_bytes())));
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
    let _ = std::io::Read::read_to_string(&mut s, &mut out);
    out.split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

fn wait(what: &str, within: Duration, ok: &dyn Fn() -> bool) {
    let end = Instant::now() + within;
    while !ok() {
        assert!(Instant::now() < end, "{what}: not within {within:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("port")
        .local_addr()
        .expect("addr")
        .port()
}

/// What the receiver got: (idempotency key header, timestamp, signature, body).
type Got = Arc<Mutex<Vec<(String, String, String, String)>>>;

#[test]
fn events_in_and_signed_actions_out_survive_a_receiver_outage_and_a_restart() {
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path();
    common::write_site_and_deferral_policy(d);
    let now = chrono::Utc::now();
    let cheap_at = common::write_price_step(d, 30);
    std::fs::write(d.join("webhook.key"), format!("{KEY}\n")).expect("key");
    let (port, rport) = (free_port(), free_port());
    std::fs::write(
        d.join("powerplane.toml"),
        format!(
            "[controller]\nsite = \"site.toml\"\npolicy = \"policy.toml\"\ntick_s = 0.5\n[store]\nkind = \"embedded\"\npath = \"s.redb\"\n[prices]\nfile = \"prices.csv\"\n[http]\nlisten = \"127.0.0.1:{port}\"\n[[http.tokens]]\nname = \"v\"\nrole = \"viewer\"\ntoken = \"{VIEWER}\"\n[[http.tokens]]\nname = \"o\"\nrole = \"operator\"\ntoken = \"{OPERATOR}\"\n[schedulers.webhook]\nkey_file = \"webhook.key\"\nurl = \"http://127.0.0.1:{rport}/hook\"\nbackoff_s = 0.5\nmax_backoff_s = 2\n"
        ),
    )
    .expect("config");
    let config = d.join("powerplane.toml");
    let first = serve(&config, 120);
    wait("serve answering", Duration::from_secs(20), &|| {
        schedulers(port).is_some()
    });

    let ts = chrono::Utc::now().timestamp();
    let far = (now + chrono::Duration::hours(6)).to_rfc3339();
    let near = (now + chrono::Duration::minutes(5)).to_rfc3339();
    let a = format!(
        r#"{{"event":"submitted","scheduler":"lsf","job":"a","class":"batch","project":"p","user":"u","gpus":2,"deadline":"{far}","est_duration_s":600}}"#
    );
    let b = format!(
        r#"{{"event":"submitted","scheduler":"lsf","job":"b","class":"batch","gpus":1,"deadline":"{near}","est_duration_s":600}}"#
    );
    // refused, each counted
    assert_eq!(signed_post(port, &a, ts, Some("sha256=00".into())), 401);
    assert_eq!(
        signed_post(
            port,
            &a.replace("\"a\"", "\"x\""),
            ts,
            Some(format!(
                "sha256={}",
                openssl_hmac(format!("{ts}.{a}").as_bytes())
            ))
        ),
        401
    );
    assert_eq!(
        signed_post(port, &a, ts - 1000, None),
        401,
        "a stale timestamp"
    );
    assert_eq!(signed_post(port, "{\"event\":\"exploded\"}", ts, None), 400);
    let big = format!("{{\"pad\":\"{}\"}}", "x".repeat(70 * 1024));
    assert_eq!(signed_post(port, &big, ts, None), 413);
    let (code, _, _) = http(port, "POST", "/api/v1/events", None, a.as_bytes());
    assert_eq!(code, 401, "unsigned");
    let (code, _, _) = http(port, "POST", "/api/v1/events", Some(VIEWER), a.as_bytes());
    assert_eq!(code, 403, "a viewer may not post events");
    // the API shows the counters as of the last tick
    wait("the refusals counted", Duration::from_secs(5), &|| {
        schedulers(port).is_some_and(|s| s["webhook"]["inbound"]["rejected"]["bad_token"] == 1)
    });
    let st = schedulers(port).expect("schedulers");
    assert_eq!(st["webhook"]["inbound"]["accepted"], 0, "{st}");
    let rejected = &st["webhook"]["inbound"]["rejected"];
    assert_eq!(rejected["bad_signature"], 2, "{st}");
    assert_eq!(rejected["stale_timestamp"], 1, "{st}");
    assert_eq!(rejected["bad_event"], 1, "{st}");
    assert_eq!(rejected["too_large"], 1, "{st}");
    assert_eq!(rejected["unsigned"], 1, "{st}");
    assert_eq!(rejected["bad_token"], 1, "{st}");
    // accepted: signed, and with an operator token
    assert_eq!(signed_post(port, &a, ts, None), 202);
    let (code, _, _) = http(port, "POST", "/api/v1/events", Some(OPERATOR), b.as_bytes());
    assert_eq!(code, 202);

    // the receiver is down: the hold waits in the outbox, retried
    wait(
        "the hold of lsf:a retried",
        Duration::from_secs(20),
        &|| {
            schedulers(port).is_some_and(|s| {
                s["webhook"]["holds"]["lsf:a"].is_string()
                    && s["webhook"]["outbound"]["counters"]["failed_attempts"].as_u64() >= Some(2)
            })
        },
    );
    let st = schedulers(port).expect("schedulers");
    assert!(
        st["webhook"]["holds"]["lsf:b"].is_null(),
        "a near deadline is never held: {st}"
    );
    assert_eq!(st["lifecycle"]["lsf:a"], "held", "{st}");
    // killed with the action undelivered, then restarted: the outbox is in the store
    drop(first);
    let _second = serve(&config, 120);
    wait(
        "the restarted serve answering",
        Duration::from_secs(20),
        &|| schedulers(port).is_some(),
    );
    let st = schedulers(port).expect("schedulers");
    let waiting = st["webhook"]["outbound"]["waiting"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(waiting.len(), 1, "{st}");
    assert_eq!(waiting[0]["job"], "lsf:a", "{st}");

    // the receiver comes up
    let got: Got = Arc::default();
    let server = tiny_http::Server::http(("127.0.0.1", rport)).expect("receiver");
    let sink = got.clone();
    std::thread::spawn(move || {
        for mut req in server.incoming_requests() {
            let h = |n: &'static str| {
                req.headers()
                    .iter()
                    .find(|x| x.field.equiv(n))
                    .map(|x| x.value.as_str().to_string())
                    .unwrap_or_default()
            };
            let (key, ts, sig) = (
                h("Idempotency-Key"),
                h("X-Powerplane-Timestamp"),
                h("X-Powerplane-Signature"),
            );
            let mut body = String::new();
            let _ = std::io::Read::read_to_string(req.as_reader(), &mut body);
            sink.lock().expect("lock").push((key, ts, sig, body));
            let _ = req.respond(tiny_http::Response::from_string("ok"));
        }
    });
    wait(
        "the release of lsf:a delivered",
        Duration::from_secs(60),
        &|| {
            got.lock()
                .expect("lock")
                .iter()
                .any(|(_, _, _, b)| b.contains("\"release\""))
        },
    );
    assert!(
        chrono::Utc::now() >= cheap_at,
        "released before the price fell"
    );
    std::thread::sleep(Duration::from_secs(2));
    let got = got.lock().expect("lock").clone();
    let mut actions = Vec::new();
    let mut ids = std::collections::BTreeSet::new();
    for (key, ts, sig, body) in &got {
        let v: serde_json::Value = serde_json::from_str(body).expect("json body");
        assert_eq!(
            v["id"].as_str(),
            Some(key.as_str()),
            "the idempotency key is the body's id"
        );
        assert!(ids.insert(key.clone()), "delivered twice: {key}");
        assert_eq!(
            sig,
            &format!("sha256={}", openssl_hmac(format!("{ts}.{body}").as_bytes())),
            "signature of {body}"
        );
        actions.push((
            v["job"].as_str().unwrap_or("").to_string(),
            v["action"].as_str().unwrap_or("").to_string(),
        ));
    }
    assert_eq!(
        actions,
        vec![
            ("lsf:a".to_string(), "hold".to_string()),
            ("lsf:a".to_string(), "release".to_string())
        ],
        "{got:?}"
    );
    let st = schedulers(port).expect("schedulers");
    assert_eq!(
        st["webhook"]["outbound"]["waiting"]
            .as_array()
            .map(Vec::len),
        Some(0),
        "{st}"
    );
    assert_eq!(
        st["webhook"]["dead_letters"].as_array().map(Vec::len),
        Some(0),
        "{st}"
    );
    let (_, _, metrics) = http(port, "GET", "/metrics", None, b"");
    assert!(
        metrics.contains("powerplane_webhook_actions_delivered_total 2\n"),
        "{metrics}"
    );
    common::promtool_check(&metrics);
}
