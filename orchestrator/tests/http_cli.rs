//! `powerplane serve` with `[http]`: the JSON API with bearer-token roles, and
//! `/metrics` checked by the real `promtool check metrics` (Debian's `prometheus`).

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{http, promtool_check};

fn powerplane() -> Command {
    Command::new(env!("CARGO_BIN_EXE_powerplane"))
}

const VIEWER: &str = "viewer-token-0123456789abcdef";

/// `serve` on the demo site with `[http]` on a free port: (dir, port, child).
fn start_serve(run_for_s: &str) -> (tempfile::TempDir, u16, std::process::Child) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace");
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    for f in ["site.toml", "policy.toml", "prices.csv"] {
        std::fs::copy(root.join("examples/demo").join(f), d.join(f)).expect("copy");
    }
    let viewer = VIEWER;
    let operator = "operator-token-0123456789abcdef";
    std::fs::write(d.join("viewer.token"), format!("{viewer}\n")).expect("token");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("port")
        .local_addr()
        .expect("addr")
        .port();
    // no telemetry: the budget rule assumes the worst of every stale GPU and caps
    std::fs::write(
        d.join("powerplane.toml"),
        format!(
            "[controller]\nsite = \"site.toml\"\npolicy = \"policy.toml\"\ntick_s = 0.5\n\n[store]\nkind = \"embedded\"\npath = \"state.redb\"\n\n[prices]\nfile = \"prices.csv\"\n\n[http]\nlisten = \"127.0.0.1:{port}\"\n[[http.tokens]]\nname = \"grafana\"\nrole = \"viewer\"\ntoken_file = \"viewer.token\"\n[[http.tokens]]\nname = \"sre\"\nrole = \"operator\"\ntoken = \"{operator}\"\n"
        ),
    )
    .expect("config");
    let check = powerplane()
        .args(["serve", "--check", "--config"])
        .arg(d.join("powerplane.toml"))
        .output()
        .expect("check");
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stderr)
    );
    let serve = powerplane()
        .args(["serve", "--run-for-s", run_for_s, "--config"])
        .arg(d.join("powerplane.toml"))
        .stderr(Stdio::null())
        .spawn()
        .expect("serve");
    (dir, port, serve)
}

#[test]
fn the_api_answers_each_role_as_it_may_and_metrics_pass_promtool() {
    let (_dir, port, mut serve) = start_serve("8");
    let (viewer, operator) = (VIEWER, "operator-token-0123456789abcdef");

    // wait for the first decisions
    let end = Instant::now() + Duration::from_secs(8);
    let status = loop {
        let (code, _, body) = http(port, "GET", "/api/v1/status", Some(viewer), b"");
        if code == 200 {
            let v: serde_json::Value = serde_json::from_str(&body).expect("json");
            if v["caps_in_force"].as_u64().unwrap_or(0) > 0 {
                break v;
            }
        }
        assert!(
            Instant::now() < end,
            "serve never answered with caps in force"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(status["site"], "demo-hall");
    assert_eq!(status["facility"]["budget_w"], 44000.0);
    assert!(status["price_per_kwh"].is_number());

    // authentication and roles
    let (code, head, _) = http(port, "GET", "/api/v1/status", None, b"");
    assert_eq!(code, 401);
    // header names are case-insensitive (hyper writes them in lowercase)
    assert!(
        head.to_lowercase().contains("www-authenticate: bearer"),
        "{head}"
    );
    assert_eq!(
        http(
            port,
            "GET",
            "/api/v1/status",
            Some("not-a-token-of-ours-at-all"),
            b""
        )
        .0,
        401
    );
    assert_eq!(
        http(port, "POST", "/api/v1/overrides", Some(viewer), b"{}").0,
        403,
        "a viewer may not write"
    );
    let (code, _, body) = http(port, "POST", "/api/v1/overrides", Some(operator), b"{}");
    assert_eq!(
        code, 400,
        "an operator passes the role check; an empty override is refused: {body}"
    );
    let pin = br#"{"kind": "pin_rack_cap", "rack": "a01", "watts_per_gpu": 120, "for_s": 600, "reason": "PDU maintenance"}"#;
    let (code, _, body) = http(port, "POST", "/api/v1/overrides", Some(operator), pin);
    assert_eq!(code, 201, "{body}");
    let set: serde_json::Value = serde_json::from_str(&body).expect("json");
    assert_eq!(set["by"], "sre");
    let id = set["id"].as_str().expect("id").to_string();
    let end = Instant::now() + Duration::from_secs(5);
    loop {
        let (_, _, body) = http(port, "GET", "/api/v1/racks", Some(viewer), b"");
        let v: serde_json::Value = serde_json::from_str(&body).expect("json");
        if v["racks"][0]["lowest_cap_w"].as_f64() == Some(120.0) {
            break;
        }
        assert!(
            Instant::now() < end,
            "the pin never reached rack a01: {body}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let (_, _, body) = http(
        port,
        "GET",
        "/api/v1/decisions?rule=override",
        Some(viewer),
        b"",
    );
    assert!(
        body.contains("PDU maintenance") && body.contains("rack/a01"),
        "audited: {body}"
    );
    assert_eq!(
        http(
            port,
            "DELETE",
            &format!("/api/v1/overrides/{id}"),
            Some(viewer),
            b""
        )
        .0,
        403
    );
    assert_eq!(
        http(
            port,
            "DELETE",
            &format!("/api/v1/overrides/{id}"),
            Some(operator),
            b""
        )
        .0,
        200
    );
    assert_eq!(
        http(
            port,
            "DELETE",
            &format!("/api/v1/overrides/{id}"),
            Some(operator),
            b""
        )
        .0,
        404
    );
    assert_eq!(
        http(port, "GET", "/api/v1/nothing", Some(viewer), b"").0,
        404
    );
    let big = vec![b'x'; 100 * 1024];
    assert_eq!(
        http(port, "POST", "/api/v1/overrides", Some(operator), &big).0,
        413
    );

    let (code, _, body) = http(port, "GET", "/api/v1/jobs", Some(viewer), b"");
    assert_eq!(code, 200);
    assert!(serde_json::from_str::<serde_json::Value>(&body).expect("json")["jobs"].is_array());
    let (code, _, body) = http(port, "GET", "/api/v1/policy", Some(viewer), b"");
    assert_eq!(code, 200);
    let policy: serde_json::Value = serde_json::from_str(&body).expect("json");
    assert!(
        policy["text"]
            .as_str()
            .is_some_and(|t| t.contains("version = 1")),
        "{body}"
    );

    // racks, GPUs and filtered decisions
    let (code, _, body) = http(port, "GET", "/api/v1/racks", Some(viewer), b"");
    assert_eq!(code, 200);
    let racks: serde_json::Value = serde_json::from_str(&body).expect("json");
    assert_eq!(racks["racks"].as_array().map(Vec::len), Some(6));
    assert!(racks["racks"][0]["budget_w"].is_number());
    let (_, _, body) = http(port, "GET", "/api/v1/gpus", Some(viewer), b"");
    let gpus: serde_json::Value = serde_json::from_str(&body).expect("json");
    assert_eq!(gpus["gpus"].as_array().map(Vec::len), Some(192));
    assert!(gpus["gpus"]
        .as_array()
        .expect("gpus")
        .iter()
        .any(|g| g["cap"]["watts"].is_number()));
    let (code, _, body) = http(
        port,
        "GET",
        "/api/v1/decisions?rule=budget&action=cap&limit=3",
        Some(viewer),
        b"",
    );
    assert_eq!(code, 200, "{body}");
    let dec: serde_json::Value = serde_json::from_str(&body).expect("json");
    let list = dec["decisions"].as_array().expect("list");
    assert!(!list.is_empty() && list.len() <= 3, "{body}");
    assert!(
        list.iter()
            .all(|d| d["rule"].as_str().is_some_and(|r| r.starts_with("budget"))),
        "{body}"
    );
    assert_eq!(
        http(
            port,
            "GET",
            "/api/v1/decisions?limit=lots",
            Some(viewer),
            b""
        )
        .0,
        400
    );
    let (_, _, body) = http(port, "GET", "/api/v1/openapi.json", None, b"");
    let doc: serde_json::Value = serde_json::from_str(&body).expect("openapi");
    assert_eq!(doc["openapi"], "3.0.3");
    assert!(doc["paths"]["/api/v1/decisions"]["get"]["parameters"].is_array());

    // metrics: public by default, and valid for promtool
    let (code, head, metrics) = http(port, "GET", "/metrics", None, b"");
    assert_eq!(code, 200);
    assert!(head.contains("text/plain; version=0.0.4"), "{head}");
    for needle in [
        "powerplane_caps_in_force ",
        "powerplane_decisions_total{rule=\"budget",
        "powerplane_budget_watts{entity=\"rack/a01\"",
        "powerplane_price_per_kwh{",
        "powerplane_ticks_total ",
    ] {
        assert!(metrics.contains(needle), "{needle} missing in:\n{metrics}");
    }
    promtool_check(&metrics);
    let _ = serve.kill();
    let _ = serve.wait();
}

#[test]
fn short_or_missing_tokens_are_refused_at_start() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace");
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    for f in ["site.toml", "policy.toml"] {
        std::fs::copy(root.join("examples/demo").join(f), d.join(f)).expect("copy");
    }
    let base = "[controller]\nsite = \"site.toml\"\npolicy = \"policy.toml\"\n[store]\nkind = \"embedded\"\npath = \"s.redb\"\n[http]\nlisten = \"127.0.0.1:0\"\n";
    for (extra, says) in [
        ("tokens = []\n", "at least one"),
        (
            "[[http.tokens]]\nname = \"x\"\nrole = \"viewer\"\ntoken = \"short\"\n",
            "shorter than 16",
        ),
        (
            "[[http.tokens]]\nname = \"x\"\nrole = \"king\"\ntoken = \"0123456789abcdef0\"\n",
            "unknown variant",
        ),
    ] {
        std::fs::write(d.join("p.toml"), format!("{base}{extra}")).expect("cfg");
        let out = powerplane()
            .args(["serve", "--check", "--config"])
            .arg(d.join("p.toml"))
            .output()
            .expect("check");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains(says),
            "{extra}: {err}"
        );
    }
}

#[test]
fn the_status_page_renders_in_chromium_with_its_headings() {
    let (dir, port, mut serve) = start_serve("20");
    let end = Instant::now() + Duration::from_secs(10);
    while http(port, "GET", "/api/v1/status", Some(VIEWER), b"").0 != 200 {
        assert!(Instant::now() < end, "serve never answered");
        std::thread::sleep(Duration::from_millis(200));
    }
    std::thread::sleep(Duration::from_millis(1200));
    let (code, head, form) = http(port, "GET", "/", None, b"");
    assert_eq!(
        code, 401,
        "the page needs a viewer token unless status_page_public"
    );
    assert!(head.to_lowercase().contains("www-authenticate"), "{head}");
    assert!(
        form.contains("action=\"/login\"") && form.contains("name=\"token\""),
        "a login form instead: {form}"
    );
    assert_eq!(
        http(port, "GET", &format!("/?token={VIEWER}"), None, b"").0,
        401,
        "a token in the URL grants nothing"
    );
    let cookie = login(port, VIEWER);
    let (code, head, html) = get_with_cookie(port, "/", &cookie);
    assert_eq!(code, 200);
    assert!(head.contains("text/html"), "{head}");
    assert!(
        html.contains("http-equiv=\"refresh\""),
        "it refreshes itself"
    );
    assert!(
        !html.contains("<script") && !html.contains("src=\"http") && !html.contains("href=\"http"),
        "no script, no external asset"
    );

    // Chromium sees the page through a proxy that adds the session cookie, as the
    // browser of an operator who logged in sends it
    let url = format!("http://127.0.0.1:{}/", cookie_proxy(port, cookie));
    let shot = dir.path().join("status.png");
    let chromium = |args: &[&str]| {
        Command::new("chromium")
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--hide-scrollbars",
                "--window-size=1200,1800",
            ])
            .args(args)
            .arg(&url)
            .output()
            .expect("this test needs Debian's chromium")
    };
    let out = chromium(&[&format!("--screenshot={}", shot.display())]);
    assert!(
        shot.exists(),
        "no screenshot: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dom = String::from_utf8_lossy(&chromium(&["--dump-dom"]).stdout).to_string();
    for heading in [
        "demo-hall — powerplane",
        "Power against budget",
        "Price now and the next 24 hours",
        "Racks",
        "Predicted inlet headroom",
        "Held jobs",
        "Caps in force",
    ] {
        assert!(
            dom.contains(heading),
            "{heading} missing from the rendered page:\n{dom}"
        );
    }
    for rack in ["a01", "b03"] {
        assert!(
            dom.contains(&format!("<b>{rack}</b>")),
            "rack {rack} on the page"
        );
    }

    // the picture is not blank: many non-white pixels, and the price line is drawn
    let pixels = common::png_pixels(&shot);
    let blue = pixels
        .iter()
        .filter(|p| {
            (i32::from(p[0]) - 26).abs() < 40
                && (i32::from(p[1]) - 115).abs() < 40
                && (i32::from(p[2]) - 232).abs() < 30
        })
        .count();
    assert!(
        blue > 50,
        "the price line is not on the screenshot ({blue} blue pixels)"
    );
    let _ = serve.kill();
    let _ = serve.wait();
}

/// Logs in at `POST /login` with a token; returns the `Cookie` header value to send.
fn login(port: u16, token: &str) -> String {
    let (code, head, body) = http(
        port,
        "POST",
        "/login",
        None,
        format!("token={token}").as_bytes(),
    );
    assert_eq!(code, 303, "login: {head}\n{body}");
    let set = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("set-cookie")
                .then(|| v.trim().to_string())
        })
        .unwrap_or_else(|| panic!("no Set-Cookie in {head}"));
    for attr in ["HttpOnly", "SameSite=Strict", "Path=/"] {
        assert!(set.contains(attr), "{attr} missing: {set}");
    }
    set.split(';').next().expect("cookie").to_string()
}

/// `GET path` with a `Cookie` header: (status, head, body).
fn get_with_cookie(port: u16, path: &str, cookie: &str) -> (u16, String, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nCookie: {cookie}\r\nConnection: close\r\n\r\n"
    )
    .expect("write");
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    let (h, b) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    let code = h
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (code, h.to_string(), b.to_string())
}

/// A proxy on a free port that forwards to `port`, adding `Cookie: cookie` to the
/// first request of each connection; returns its port.
fn cookie_proxy(port: u16, cookie: String) -> u16 {
    use std::io::{Read, Write};
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("proxy");
    let proxy_port = l.local_addr().expect("addr").port();
    std::thread::spawn(move || {
        for client in l.incoming().flatten() {
            let cookie = cookie.clone();
            std::thread::spawn(move || {
                let mut client = client;
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") {
                    match client.read(&mut byte) {
                        Ok(1) => head.push(byte[0]),
                        _ => return,
                    }
                }
                let text = String::from_utf8_lossy(&head).to_string();
                let (first, rest) = text.split_once("\r\n").expect("request line");
                let Ok(mut upstream) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
                    return;
                };
                let _ = write!(upstream, "{first}\r\nCookie: {cookie}\r\n{rest}");
                let (mut c2, mut u2) = (
                    client.try_clone().expect("clone"),
                    upstream.try_clone().expect("clone"),
                );
                std::thread::spawn(move || {
                    let _ = std::io::copy(&mut c2, &mut u2);
                });
                let _ = std::io::copy(&mut upstream, &mut client);
            });
        }
    });
    proxy_port
}
