//! Access to the HTTP side of the real `powerplane serve`: `/healthz` and `/readyz`
//! with a Redis store that goes away, bearer tokens only in the header (any case of
//! the scheme), the status page's login cookie, decoded query strings, and TLS with a
//! certificate reread on SIGHUP.

mod common;
mod http_serve;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{http, VIEWER};
use http_serve::{config, free_port, header, json, request, split_answer, start};

/// A private `redis-server` on a free port, killed when dropped.
struct RedisServer {
    child: Child,
    port: u16,
}

impl RedisServer {
    fn start() -> RedisServer {
        let port = free_port();
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .spawn()
            .expect("this test needs redis-server (Debian redis-server)");
        let end = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < end, "redis-server did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
        RedisServer { child, port }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn readyz_fails_when_the_store_goes_away_while_healthz_stays_alive() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().expect("tmp");
    let port = free_port();
    let store = format!(
        "[store]\nkind = \"redis\"\nurl = \"redis://127.0.0.1:{}/0\"\nprefix = \"powerplane-http-faults\"\n",
        redis.port
    );
    let cfg = config(dir.path(), port, "", &store);
    let serve = start(&cfg, port, None, false);
    let end = Instant::now() + Duration::from_secs(10);
    let ready = loop {
        let (code, _, body) = http(port, "GET", "/readyz", None, b"");
        if code == 200 {
            break json(&body);
        }
        assert!(Instant::now() < end, "never ready: {body}\n{}", serve.log());
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(ready["role"], "leader");
    assert_eq!(ready["checks"]["store"]["ok"], true);
    assert_eq!(ready["checks"]["policy"]["ok"], true);
    assert_eq!(
        ready["checks"]["sources"]["ok"], true,
        "no source is configured"
    );
    drop(redis);
    let end = Instant::now() + Duration::from_secs(10);
    let not_ready = loop {
        let (code, _, body) = http(port, "GET", "/readyz", None, b"");
        if code == 503 {
            break json(&body);
        }
        assert!(
            Instant::now() < end,
            "still ready without its store: {body}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(not_ready["ready"], false);
    assert_eq!(not_ready["failing"], serde_json::json!(["store"]));
    // the journal takes the tick's writes, so the tick has no error: the store is not
    // ready because Redis does not answer, and what waits for it is shown
    assert_eq!(
        not_ready["checks"]["store"]["reachable"], false,
        "{not_ready}"
    );
    assert!(
        not_ready["checks"]["store"]["journal_depth"].is_u64(),
        "{not_ready}"
    );
    let (code, _, body) = http(port, "GET", "/healthz", None, b"");
    assert_eq!(code, 200, "alive all the same: {body}");
}

#[test]
fn bearer_only_in_the_header_the_login_cookie_and_decoded_queries() {
    let dir = tempfile::tempdir().expect("tmp");
    let port = free_port();
    let cfg = config(dir.path(), port, "", "");
    let _serve = start(&cfg, port, None, false);
    // the scheme is case-insensitive; the token only counts in the header
    for auth in [format!("bearer {VIEWER}"), format!("BEARER  {VIEWER}")] {
        let (code, _, body) = request(
            port,
            "GET",
            "/api/v1/status",
            &[("Authorization", &auth)],
            b"",
        );
        assert_eq!(code, 200, "{auth}: {body}");
    }
    let basic = format!("Basic {VIEWER}");
    assert_eq!(
        request(
            port,
            "GET",
            "/api/v1/status",
            &[("Authorization", &basic)],
            b""
        )
        .0,
        401
    );
    for path in [
        format!("/api/v1/status?token={VIEWER}"),
        format!("/?token={VIEWER}"),
    ] {
        assert_eq!(http(port, "GET", &path, None, b"").0, 401, "{path}");
    }

    // the login: a form post, a cookie for the status page
    let form = [("Content-Type", "application/x-www-form-urlencoded")];
    let (code, _, page) = request(
        port,
        "POST",
        "/login",
        &form,
        b"token=not-a-token-of-ours-at-all",
    );
    assert_eq!(code, 401);
    assert!(page.contains("Unknown token"), "{page}");
    let (code, head, _) = request(
        port,
        "POST",
        "/login",
        &form,
        format!("token={VIEWER}").as_bytes(),
    );
    assert_eq!(code, 303, "{head}");
    assert_eq!(header(&head, "location"), Some("/"));
    let set = header(&head, "set-cookie").expect("Set-Cookie");
    for attr in ["HttpOnly", "SameSite=Strict", "Path=/"] {
        assert!(set.contains(attr), "{attr}: {set}");
    }
    assert!(!set.contains("Secure"), "plain HTTP: {set}");
    let cookie = set.split(';').next().expect("cookie").to_string();
    let with_cookie = [("Cookie", cookie.as_str())];
    let (code, _, html) = request(port, "GET", "/", &with_cookie, b"");
    assert_eq!(code, 200);
    assert!(html.contains("— powerplane</h1>"), "{html}");
    assert_eq!(
        request(port, "GET", "/api/v1/status", &with_cookie, b"").0,
        401,
        "the cookie opens the page, not the API"
    );
    assert_eq!(request(port, "POST", "/logout", &with_cookie, b"").0, 303);
    assert_eq!(
        request(port, "GET", "/", &with_cookie, b"").0,
        401,
        "logged out"
    );

    // decisions since a time with an offset: encoded, or with its `+` typed as is
    let end = Instant::now() + Duration::from_secs(10);
    while json(&http(port, "GET", "/api/v1/decisions?limit=1", Some(VIEWER), b"").2)["decisions"]
        .as_array()
        .is_none_or(Vec::is_empty)
    {
        assert!(Instant::now() < end, "no decisions yet");
        std::thread::sleep(Duration::from_millis(100));
    }
    for (since, some) in [
        ("2000-01-01T00:00:00%2B01:00", true),
        ("2000-01-01T00:00:00+01:00", true),
        ("2999-01-01T00%3A00%3A00%2B01%3A00", false),
        ("2999-01-01T00:00:00+01:00", false),
    ] {
        let (code, _, body) = http(
            port,
            "GET",
            &format!("/api/v1/decisions?since={since}&limit=5"),
            Some(VIEWER),
            b"",
        );
        assert_eq!(code, 200, "{since}: {body}");
        let n = json(&body)["decisions"].as_array().map_or(0, Vec::len);
        assert_eq!(n > 0, some, "{since}: {n} decisions");
    }
    let (code, _, body) = http(
        port,
        "GET",
        "/api/v1/decisions?since=yesterday",
        Some(VIEWER),
        b"",
    );
    assert_eq!(code, 400, "{body}");
}

/// A self-signed certificate for 127.0.0.1 in `dir`: (cert, key, SHA-256 hex).
fn self_signed(dir: &Path) -> (PathBuf, PathBuf, String) {
    std::fs::create_dir_all(dir).expect("dir");
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    let ok = Command::new("openssl")
        .args([
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
        ])
        .args([
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
        ])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output()
        .expect("this test needs the openssl command");
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    let fp = Command::new("openssl")
        .args(["x509", "-noout", "-fingerprint", "-sha256", "-in"])
        .arg(&cert)
        .output()
        .expect("openssl");
    let text = String::from_utf8_lossy(&fp.stdout).to_string();
    let hex = text
        .trim()
        .rsplit('=')
        .next()
        .expect("fingerprint")
        .to_string();
    (cert, key, hex)
}

/// `GET path` over TLS, trusting only the certificate with SHA-256 `pin`.
fn https(
    port: u16,
    pin: &str,
    path: &str,
    token: Option<&str>,
) -> Result<(u16, String, String), String> {
    let tls = sources::tls::Tls {
        pinned_sha256: Some(pin.to_string()),
        ..Default::default()
    };
    let config = sources::tls::client_config(&tls).map_err(|e| e.to_string())?;
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").map_err(|e| e.to_string())?;
    let conn = rustls::ClientConnection::new(std::sync::Arc::new(config), name.to_owned())
        .map_err(|e| e.to_string())?;
    let sock = TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string())?;
    sock.set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(|e| e.to_string())?;
    let mut s = rustls::StreamOwned::new(conn, sock);
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{auth}Connection: close\r\n\r\n"
    )
    .map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    match s.read_to_end(&mut out) {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && !out.is_empty() => {}
        Err(e) => return Err(e.to_string()),
    }
    Ok(split_answer(&out))
}

#[test]
fn tls_serves_the_api_and_a_certificate_reread_on_sighup_takes_effect() {
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path();
    let (cert_a, key_a, pin_a) = self_signed(&d.join("a"));
    let (cert_b, key_b, pin_b) = self_signed(&d.join("b"));
    std::fs::copy(&cert_a, d.join("cert.pem")).expect("cert");
    std::fs::copy(&key_a, d.join("key.pem")).expect("key");
    let port = free_port();
    // SIGHUP alone (the files are not watched here)
    let cfg = config(
        d,
        port,
        "tls_cert_file = \"cert.pem\"\ntls_key_file = \"key.pem\"\ntls_reload_s = 0\n",
        "",
    );
    let serve = start(&cfg, port, None, true);
    let end = Instant::now() + Duration::from_secs(20);
    loop {
        match https(port, &pin_a, "/healthz", None) {
            Ok((200, _, _)) => break,
            other => assert!(
                Instant::now() < end,
                "no TLS answer: {other:?}\n{}",
                serve.log()
            ),
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let (code, _, body) = https(port, &pin_a, "/api/v1/status", Some(VIEWER)).expect("status");
    assert_eq!(code, 200, "{body}");
    assert_eq!(
        http(port, "GET", "/healthz", None, b"").0,
        0,
        "no plain HTTP on a TLS listener"
    );
    assert!(
        https(port, &pin_b, "/healthz", None).is_err(),
        "not yet the second certificate"
    );

    // the second pair, then SIGHUP
    std::fs::copy(&cert_b, d.join("cert.pem")).expect("cert");
    std::fs::copy(&key_b, d.join("key.pem")).expect("key");
    serve.signal("-HUP");
    let end = Instant::now() + Duration::from_secs(10);
    while !matches!(https(port, &pin_b, "/healthz", None), Ok((200, _, _))) {
        assert!(
            Instant::now() < end,
            "the new certificate never served:\n{}",
            serve.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        https(port, &pin_a, "/healthz", None).is_err(),
        "the old certificate is gone"
    );

    // a broken file: the pair in force stays, the error is counted
    std::fs::write(d.join("cert.pem"), "not a certificate\n").expect("break");
    serve.signal("-HUP");
    std::thread::sleep(Duration::from_millis(500));
    let (_, _, metrics) = https(port, &pin_b, "/metrics", None).expect("metrics");
    assert!(
        metrics.contains("powerplane_http_tls_reloads_total{outcome=\"ok\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("powerplane_http_tls_reloads_total{outcome=\"error\"} 1"),
        "{metrics}"
    );
    assert!(serve.log().contains("not reread"), "{}", serve.log());
}

/// Points `dir/..data` at a new folder holding `cert.pem` and `key.pem`, as the kubelet
/// updates a Secret volume (the files are links through `..data`, swapped at once).
fn secret_volume(dir: &Path, version: &str, cert: &Path, key: &Path) {
    let data = dir.join(format!("..{version}"));
    std::fs::create_dir_all(&data).expect("data");
    std::fs::copy(cert, data.join("tls.crt")).expect("cert");
    std::fs::copy(key, data.join("tls.key")).expect("key");
    let tmp = dir.join("..data_tmp");
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(format!("..{version}"), &tmp).expect("link");
    std::fs::rename(&tmp, dir.join("..data")).expect("swap");
    for f in ["tls.crt", "tls.key"] {
        if std::fs::symlink_metadata(dir.join(f)).is_err() {
            std::os::unix::fs::symlink(format!("..data/{f}"), dir.join(f)).expect("file link");
        }
    }
}

#[test]
fn a_certificate_renewed_in_a_secret_volume_is_served_without_a_signal() {
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path();
    let (cert_a, key_a, pin_a) = self_signed(&d.join("a"));
    let (cert_b, key_b, pin_b) = self_signed(&d.join("b"));
    let vol = d.join("tls");
    std::fs::create_dir_all(&vol).expect("volume");
    secret_volume(&vol, "2026_12_07_1", &cert_a, &key_a);
    let port = free_port();
    let cfg = config(
        d,
        port,
        "tls_cert_file = \"tls/tls.crt\"\ntls_key_file = \"tls/tls.key\"\ntls_reload_s = 0.5\n",
        "",
    );
    let serve = start(&cfg, port, None, true);
    let end = Instant::now() + Duration::from_secs(20);
    while !matches!(https(port, &pin_a, "/healthz", None), Ok((200, _, _))) {
        assert!(Instant::now() < end, "no TLS answer:\n{}", serve.log());
        std::thread::sleep(Duration::from_millis(100));
    }
    // cert-manager renews: the kubelet swaps the volume's data; no signal is sent
    secret_volume(&vol, "2026_12_07_2", &cert_b, &key_b);
    let end = Instant::now() + Duration::from_secs(10);
    while !matches!(https(port, &pin_b, "/healthz", None), Ok((200, _, _))) {
        assert!(
            Instant::now() < end,
            "the renewed certificate never served:\n{}",
            serve.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        https(port, &pin_a, "/healthz", None).is_err(),
        "the old certificate is gone"
    );
    // nothing changes after: one reread, not one per look
    std::thread::sleep(Duration::from_millis(1500));
    let (_, _, metrics) = https(port, &pin_b, "/metrics", None).expect("metrics");
    assert!(
        metrics.contains("powerplane_http_tls_reloads_total{outcome=\"ok\"} 1"),
        "{metrics}"
    );
    assert!(serve.log().contains("the files changed"), "{}", serve.log());
}
