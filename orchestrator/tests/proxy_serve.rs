//! `powerplane serve` fetching a live price feed over HTTPS through the site's
//! forward proxy, as a controller in a network without direct egress does: with
//! `HTTPS_PROXY` set, the fetch goes through the proxy (an HTTP `CONNECT` tunnel, the
//! TLS handshake with the feed's server inside it, the site's CA trusted); with the
//! feed's host in `NO_PROXY`, it goes straight to the server and the proxy sees
//! nothing.

mod common;

#[path = "common/pki.rs"]
mod pki;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{http, VIEWER};

/// A forward proxy that takes `CONNECT host:port` and tunnels the bytes both ways;
/// it keeps each tunnel's target.
struct Proxy {
    url: String,
    tunnels: Arc<Mutex<Vec<String>>>,
}

impl Proxy {
    fn start() -> Proxy {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let url = format!("http://{}", l.local_addr().expect("addr"));
        let tunnels: Arc<Mutex<Vec<String>>> = Arc::default();
        let seen = tunnels.clone();
        std::thread::spawn(move || {
            for mut client in l.incoming().flatten() {
                let seen = seen.clone();
                std::thread::spawn(move || {
                    let mut head = Vec::new();
                    let mut byte = [0u8; 1];
                    while !head.ends_with(b"\r\n\r\n") {
                        match client.read(&mut byte) {
                            Ok(1) => head.push(byte[0]),
                            _ => return,
                        }
                    }
                    let head = String::from_utf8_lossy(&head).to_string();
                    let mut words = head.split_whitespace();
                    let (Some("CONNECT"), Some(target)) = (words.next(), words.next()) else {
                        let _ = client.write_all(
                            b"HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 0\r\n\r\n",
                        );
                        return;
                    };
                    seen.lock().expect("lock").push(target.to_string());
                    let Ok(upstream) = TcpStream::connect(target) else {
                        let _ = client
                            .write_all(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n");
                        return;
                    };
                    let _ = client.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n");
                    let (mut c2, mut u2) = (
                        client.try_clone().expect("clone"),
                        upstream.try_clone().expect("clone"),
                    );
                    let (mut c1, mut u1) = (client, upstream);
                    std::thread::spawn(move || {
                        let _ = std::io::copy(&mut c2, &mut u2);
                        let _ = u2.shutdown(std::net::Shutdown::Write);
                    });
                    let _ = std::io::copy(&mut u1, &mut c1);
                    let _ = c1.shutdown(std::net::Shutdown::Write);
                });
            }
        });
        Proxy { url, tunnels }
    }

    fn tunnels(&self) -> Vec<String> {
        self.tunnels.lock().expect("lock").clone()
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .expect("port")
        .local_addr()
        .expect("addr")
        .port()
}

/// A plain price feed (CSV, one price for the hour around now) behind an HTTPS front
/// whose certificate the site's CA signed; it counts the requests that reached it.
fn feed(pki: &pki::Pki, price: f64) -> (pki::TlsFront, Arc<Mutex<usize>>) {
    let server = tiny_http::Server::http("127.0.0.1:0").expect("feed");
    let plain = format!("http://{}", server.server_addr().to_ip().expect("ip"));
    let now = chrono::Utc::now();
    let csv = format!(
        "start,price_per_kwh\n{},{price}\n{},{price}\n",
        (now - chrono::Duration::minutes(30)).to_rfc3339(),
        (now + chrono::Duration::minutes(30)).to_rfc3339()
    );
    let served: Arc<Mutex<usize>> = Arc::default();
    let count = served.clone();
    std::thread::spawn(move || {
        for req in server.incoming_requests() {
            *count.lock().expect("lock") += 1;
            let _ = req.respond(tiny_http::Response::from_string(csv.clone()));
        }
    });
    (pki::TlsFront::start(pki, None, &plain), served)
}

fn write_config(d: &Path, port: u16, feed_url: &str, ca: &Path) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace");
    std::fs::copy(root.join("examples/demo/site.toml"), d.join("site.toml")).expect("site");
    std::fs::copy(
        root.join("examples/demo/policy.toml"),
        d.join("policy.toml"),
    )
    .expect("policy");
    std::fs::write(
        d.join("powerplane.toml"),
        format!(
            "[controller]\nsite = \"site.toml\"\npolicy = \"policy.toml\"\ntick_s = 0.5\n[store]\nkind = \"embedded\"\npath = \"s.redb\"\n[prices]\nurl = \"{feed_url}/prices.csv\"\nrefresh_s = 600\n[prices.tls]\nca_file = \"{}\"\n[http]\nlisten = \"127.0.0.1:{port}\"\n[[http.tokens]]\nname = \"v\"\nrole = \"viewer\"\ntoken = \"{VIEWER}\"\n",
            ca.display()
        ),
    )
    .expect("config");
}

/// Runs serve with the proxy settings in its environment until the status shows the
/// feed's price, or panics with its log.
fn serve_until_priced(d: &Path, port: u16, env: &[(&str, &str)], price: f64) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_powerplane"));
    cmd.args(["serve", "--run-for-s", "30", "--config"])
        .arg(d.join("powerplane.toml"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    for k in [
        "HTTPS_PROXY",
        "https_proxy",
        "HTTP_PROXY",
        "http_proxy",
        "ALL_PROXY",
        "all_proxy",
        "NO_PROXY",
        "no_proxy",
    ] {
        cmd.env_remove(k);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut serve = cmd.spawn().expect("serve");
    let end = Instant::now() + Duration::from_secs(20);
    loop {
        let (code, _, body) = http(port, "GET", "/api/v1/status", Some(VIEWER), b"");
        let st: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
        if code == 200
            && st["price_per_kwh"].as_f64() == Some(price)
            && st["price_source"] == "feed"
        {
            break;
        }
        if Instant::now() > end {
            let _ = serve.kill();
            let out = serve.wait_with_output().expect("serve");
            panic!(
                "the feed's price never came ({env:?}): {st}\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    // SIGTERM: serve closes its store, the next run opens it as it was left
    let _ = Command::new("kill")
        .args(["-TERM", &serve.id().to_string()])
        .status();
    let _ = serve.wait();
}

#[test]
fn a_live_feed_goes_through_https_proxy_and_straight_to_hosts_in_no_proxy() {
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path();
    let pki = pki::Pki::new(d);
    let (front, served) = feed(&pki, 0.123);
    let target = front.url.trim_start_matches("https://").to_string();
    let proxy = Proxy::start();
    let port = free_port();
    write_config(d, port, &front.url, &pki.ca);

    // 1. HTTPS_PROXY: one CONNECT tunnel to the feed's server, the fetch inside it
    serve_until_priced(d, port, &[("HTTPS_PROXY", proxy.url.as_str())], 0.123);
    assert_eq!(proxy.tunnels(), vec![target.clone()], "through the proxy");
    let through = *served.lock().expect("lock");
    assert!(through >= 1, "the feed answered the tunnelled fetch");

    // 2. the same proxy, the feed's host in NO_PROXY: straight to the server
    serve_until_priced(
        d,
        port,
        &[
            ("HTTPS_PROXY", proxy.url.as_str()),
            ("NO_PROXY", "localhost,127.0.0.1"),
        ],
        0.123,
    );
    assert_eq!(
        proxy.tunnels(),
        vec![target],
        "NO_PROXY: no further tunnel through the proxy"
    );
    assert!(*served.lock().expect("lock") > through, "fetched directly");
}
