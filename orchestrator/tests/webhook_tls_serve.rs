//! `powerplane serve` delivering webhook actions over HTTPS to a receiver behind the
//! site's private CA that asks for a client certificate (mutual TLS), through the
//! faults a site meets while setting it up: a `ca_file` that did not sign the
//! receiver's certificate (we refuse it), then no client certificate (the receiver
//! refuses us). Each failure is counted with its cause and the action waits in the
//! outbox, across restarts, until the right settings deliver it, once.

mod common;

#[path = "common/pki.rs"]
mod pki;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{http, schedulers, serve, serve_log, VIEWER};

const OPERATOR: &str = "operator-token-0123456789abcdef";
const KEY: &str = "8f3c1d2e4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0";

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

/// What the plain receiver behind the HTTPS front got: (timestamp, signature, body).
type Got = Arc<Mutex<Vec<(String, String, String)>>>;

fn receiver() -> (String, Got) {
    let server = tiny_http::Server::http("127.0.0.1:0").expect("receiver");
    let url = format!("http://{}", server.server_addr().to_ip().expect("ip"));
    let got: Got = Arc::default();
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
            let (ts, sig) = (h("X-Powerplane-Timestamp"), h("X-Powerplane-Signature"));
            let mut body = String::new();
            let _ = std::io::Read::read_to_string(req.as_reader(), &mut body);
            sink.lock().expect("lock").push((ts, sig, body));
            let _ = req.respond(tiny_http::Response::from_string("ok"));
        }
    });
    (url, got)
}

fn outbound(port: u16) -> serde_json::Value {
    schedulers(port).map_or(serde_json::Value::Null, |s| {
        s["webhook"]["outbound"].clone()
    })
}

#[test]
fn actions_reach_an_https_receiver_with_the_sites_ca_and_a_client_certificate_and_wait_through_wrong_settings(
) {
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path();
    let pki = pki::Pki::new(d);
    common::write_site_and_deferral_policy(d);
    let cheap_at = common::write_price_step(d, 75);
    std::fs::write(d.join("webhook.key"), format!("{KEY}\n")).expect("key");
    let (plain, got) = receiver();
    let front = pki::TlsFront::start(&pki, Some(&pki.ca), &plain);
    let port = free_port();
    let config = d.join("powerplane.toml");
    let write = |tls: &str| {
        std::fs::write(
            &config,
            format!(
                "[controller]\nsite = \"site.toml\"\npolicy = \"policy.toml\"\ntick_s = 0.5\n[store]\nkind = \"embedded\"\npath = \"s.redb\"\n[prices]\nfile = \"prices.csv\"\n[http]\nlisten = \"127.0.0.1:{port}\"\n[[http.tokens]]\nname = \"v\"\nrole = \"viewer\"\ntoken = \"{VIEWER}\"\n[[http.tokens]]\nname = \"o\"\nrole = \"operator\"\ntoken = \"{OPERATOR}\"\n[schedulers.webhook]\nkey_file = \"webhook.key\"\nurl = \"{}/hook\"\nbackoff_s = 0.5\nmax_backoff_s = 1\ntimeout_s = 3\n{tls}",
                front.url
            ),
        )
        .expect("config");
    };
    let failures = |want: u64| {
        move || {
            outbound(port)["counters"]["failed_attempts"]
                .as_u64()
                .is_some_and(|n| n >= want)
        }
    };

    // 1. a CA that did not sign the receiver's certificate: we refuse the receiver
    write("ca_file = \"other-ca.pem\"\nclient_cert_file = \"client.pem\"\nclient_key_file = \"client.key\"\n");
    let first = serve(&config, 120);
    wait("serve answering", Duration::from_secs(20), &|| {
        schedulers(port).is_some()
    });
    let far = (chrono::Utc::now() + chrono::Duration::hours(6)).to_rfc3339();
    let event = format!(
        r#"{{"event":"submitted","scheduler":"lsf","job":"a","class":"batch","gpus":2,"deadline":"{far}","est_duration_s":600}}"#
    );
    let (code, _, _) = http(
        port,
        "POST",
        "/api/v1/events",
        Some(OPERATOR),
        event.as_bytes(),
    );
    assert_eq!(code, 202);
    wait(
        "the hold refused for the receiver's certificate",
        Duration::from_secs(30),
        &failures(2),
    );
    let out = outbound(port);
    let error = out["counters"]["last_error"]
        .as_str()
        .unwrap_or("")
        .to_string();
    assert!(
        error.contains("TLS") && error.to_lowercase().contains("certificate"),
        "the error names the cause: {out}"
    );
    assert_eq!(out["waiting"].as_array().map(Vec::len), Some(1), "{out}");
    let (_, _, metrics) = http(port, "GET", "/metrics", None, b"");
    let failed = common::metric_value(&metrics, "powerplane_webhook_delivery_failures_total")
        .expect("failures on /metrics");
    assert!(failed >= 2.0, "{metrics}");
    assert!(
        got.lock().expect("lock").is_empty(),
        "nothing reached the receiver"
    );
    drop(first);

    // 2. the site's CA but no client certificate: the receiver refuses us
    write("ca_file = \"site-ca.pem\"\n");
    let refused_before = front.refused.load(std::sync::atomic::Ordering::Relaxed);
    let second = serve(&config, 120);
    wait("serve answering again", Duration::from_secs(20), &|| {
        schedulers(port).is_some()
    });
    wait(
        "the hold refused by the receiver",
        Duration::from_secs(30),
        &|| {
            front.refused.load(std::sync::atomic::Ordering::Relaxed) >= refused_before + 2
                && outbound(port)["counters"]["failed_attempts"].as_u64() >= Some(2)
        },
    );
    let out = outbound(port);
    assert_eq!(out["waiting"].as_array().map(Vec::len), Some(1), "{out}");
    assert!(
        got.lock().expect("lock").is_empty(),
        "nothing reached the receiver"
    );
    drop(second);

    // 3. both: the hold, then the release once the price falls, each delivered once
    write("ca_file = \"site-ca.pem\"\nclient_cert_file = \"client.pem\"\nclient_key_file = \"client.key\"\n");
    let _third = serve(&config, 150);
    wait(
        "the release delivered over mutual TLS",
        Duration::from_secs(120),
        &|| {
            got.lock()
                .expect("lock")
                .iter()
                .any(|(_, _, b)| b.contains("\"release\""))
        },
    );
    assert!(
        chrono::Utc::now() >= cheap_at,
        "released before the price fell"
    );
    std::thread::sleep(Duration::from_secs(2));
    let got = got.lock().expect("lock").clone();
    let key = integrations::webhook::WebhookKey::from_text(KEY).expect("key");
    let mut actions: Vec<String> = Vec::new();
    let mut ids = std::collections::BTreeSet::new();
    for (ts, sig, body) in &got {
        let at = telemetry::Timestamp::from_secs(ts.parse().expect("timestamp"));
        key.verify(Some(ts), Some(sig), body.as_bytes(), at, 1.0)
            .unwrap_or_else(|e| panic!("signature of {body}: {e:?}"));
        let v: serde_json::Value = serde_json::from_str(body).expect("json");
        assert!(
            ids.insert(v["id"].as_str().unwrap_or("").to_string()),
            "delivered twice: {body}"
        );
        let action = format!(
            "{} {}",
            v["job"].as_str().unwrap_or(""),
            v["action"].as_str().unwrap_or("")
        );
        // a hold renewed before its lease runs out is sent again, with a new id
        if actions.last() != Some(&action) {
            actions.push(action);
        }
    }
    assert_eq!(
        actions,
        vec!["lsf:a hold", "lsf:a release"],
        "{got:?}\n{}",
        serve_log(&config)
    );
    let out = outbound(port);
    assert_eq!(out["waiting"].as_array().map(Vec::len), Some(0), "{out}");
}

#[test]
fn serve_check_names_a_webhook_tls_file_that_cannot_be_read() {
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path();
    common::write_site_and_deferral_policy(d);
    common::write_price_step(d, 60);
    std::fs::write(d.join("webhook.key"), format!("{KEY}\n")).expect("key");
    std::fs::write(d.join("client.pem"), "not a certificate\n").expect("pem");
    let config = d.join("powerplane.toml");
    std::fs::write(
        &config,
        "[controller]\nsite = \"site.toml\"\npolicy = \"policy.toml\"\n[store]\nkind = \"embedded\"\npath = \"s.redb\"\n[prices]\nfile = \"prices.csv\"\n[schedulers.webhook]\nkey_file = \"webhook.key\"\nurl = \"https://hooks.example/powerplane\"\nca_file = \"missing-ca.pem\"\n",
    )
    .expect("config");
    let check = || {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_powerplane"))
            .args(["serve", "--check", "--config"])
            .arg(&config)
            .output()
            .expect("powerplane");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    let (ok, err) = check();
    assert!(!ok, "a missing CA file passes the check");
    assert!(err.contains("missing-ca.pem"), "{err}");
    // half a client identity
    let text = std::fs::read_to_string(&config).expect("config").replace(
        "ca_file = \"missing-ca.pem\"\n",
        "client_cert_file = \"client.pem\"\n",
    );
    std::fs::write(&config, text).expect("config");
    let (ok, err) = check();
    assert!(!ok);
    assert!(
        err.contains("client_cert_file and client_key_file"),
        "{err}"
    );
}
