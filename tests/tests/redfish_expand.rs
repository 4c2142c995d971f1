//! `$expand` in discovery: a service that advertises `ProtocolFeaturesSupported.ExpandQuery`
//! and honours it gives a collection's members in one GET; one that refuses it, or
//! ignores it (`sushy-static`), is read member by member. The readings are the same
//! either way; the GETs and time of each discovery are printed (docs/performance.md).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use powerplane_tests::Sushy;
use serde_json::Value;
use sources::redfish::{EndpointConfig, Polled, Poller};
use telemetry::Timestamp;

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    /// Honours `$expand=.($levels=1)` on collections.
    Expand,
    /// Answers 400 to any `$expand`.
    Refuse,
}

/// A mockup served by a plain HTTP server (one request per connection) that
/// understands `$expand` on collections (or refuses it); counts the requests.
struct Served {
    url: String,
    expand_requests: Arc<AtomicUsize>,
    requests: Arc<AtomicUsize>,
}

fn read(dir: &Path, path: &str) -> Option<Value> {
    let rel = path.trim_start_matches("/redfish/v1").trim_matches('/');
    let text = std::fs::read_to_string(dir.join(rel).join("index.json")).ok()?;
    serde_json::from_str(&text).ok()
}

/// One request on a connection of its own: read the request line and headers, answer
/// with `Connection: close`.
fn answer(mut conn: std::net::TcpStream, dir: &Path, mode: Mode, expands: &AtomicUsize) {
    use std::io::{Read, Write};
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        match conn.read(&mut chunk) {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    let head = String::from_utf8_lossy(&buf);
    let url = head.split_whitespace().nth(1).unwrap_or("/").to_string();
    let (path, query) = url.split_once('?').unwrap_or((&url, ""));
    let expand = query.contains("$expand") || query.contains("%24expand");
    if expand {
        expands.fetch_add(1, Ordering::Relaxed);
    }
    let body = match (read(dir, path), expand, mode) {
        (_, true, Mode::Refuse) => None,
        (Some(mut v), true, Mode::Expand) => {
            if let Some(members) = v.get_mut("Members").and_then(Value::as_array_mut) {
                for m in members.iter_mut() {
                    let id = m["@odata.id"].as_str().unwrap_or_default().to_string();
                    if let Some(full) = read(dir, &id) {
                        *m = full;
                    }
                }
            }
            Some(v)
        }
        (v, _, _) => v,
    };
    let (status, body) = match body {
        Some(v) => ("200 OK", v.to_string()),
        None if expand => ("400 Bad Request", "{}".to_string()),
        None => ("404 Not Found", "{}".to_string()),
    };
    let _ = write!(
        conn,
        "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
}

fn serve(mockup: &str, mode: Mode) -> Served {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/redfish")
        .join(mockup);
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("listen");
    let port = listener.local_addr().expect("addr").port();
    let expand_requests = Arc::new(AtomicUsize::new(0));
    let requests = Arc::new(AtomicUsize::new(0));
    let (expands, all) = (expand_requests.clone(), requests.clone());
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            all.fetch_add(1, Ordering::Relaxed);
            let (dir, expands) = (dir.clone(), expands.clone());
            std::thread::spawn(move || answer(conn, &dir, mode, &expands));
        }
    });
    Served {
        url: format!("http://127.0.0.1:{port}"),
        expand_requests,
        requests,
    }
}

fn discover(url: &str, expand: bool) -> (Polled, f64) {
    let mut cfg = EndpointConfig::new("e", url);
    cfg.expand = expand;
    let mut p = Poller::new(vec![cfg], 4).expect("poller");
    let t = Instant::now();
    let polled = p.poll(Timestamp::from(chrono::Utc::now())).remove(0);
    (polled, t.elapsed().as_secs_f64())
}

fn readings(p: &Polled) -> Vec<(String, String, String)> {
    let mut v: Vec<_> = p
        .samples
        .iter()
        .map(|s| {
            (
                s.entity.to_string(),
                s.metric.to_string(),
                format!("{:.6}", s.value),
            )
        })
        .collect();
    v.sort();
    v
}

#[test]
fn expand_reads_collections_in_one_get_and_gives_the_same_readings() {
    for mockup in ["public-pdu", "public-rackmount1", "public-cooling-unit"] {
        let expanding = serve(mockup, Mode::Expand);
        let (plain, plain_s) = discover(&expanding.url, false);
        assert_eq!(
            expanding.expand_requests.load(Ordering::Relaxed),
            0,
            "expand = false"
        );
        let (fast, fast_s) = discover(&expanding.url, true);
        assert!(
            plain.error.is_none() && fast.error.is_none(),
            "{mockup}: {:?} {:?} {:?}",
            plain.error,
            fast.error,
            fast.rejects
        );
        assert!(!plain.samples.is_empty(), "{mockup}: no readings");
        assert_eq!(
            readings(&fast),
            readings(&plain),
            "{mockup}: the same readings"
        );
        assert!(
            fast.requests < plain.requests,
            "{mockup}: {} GETs with $expand, {} without",
            fast.requests,
            plain.requests
        );
        println!(
            "{mockup}: discovery {} GETs in {:.3} s member by member, {} GETs in {:.3} s with $expand ({} expanded collections)",
            plain.requests,
            plain_s,
            fast.requests,
            fast_s,
            expanding.expand_requests.load(Ordering::Relaxed)
        );
    }
}

#[test]
fn a_service_that_refuses_or_ignores_expand_is_read_member_by_member() {
    let refusing = serve("public-pdu", Mode::Refuse);
    let (plain, _) = discover(&refusing.url, false);
    let mut cfg = EndpointConfig::new("e", &refusing.url);
    cfg.expand = true;
    let mut p = Poller::with_options(
        vec![cfg],
        sources::redfish::Options {
            rediscover_every: 1,
            ..sources::redfish::Options::default()
        },
    )
    .expect("poller");
    let first = p.poll(Timestamp::from(chrono::Utc::now())).remove(0);
    assert_eq!(readings(&first), readings(&plain));
    assert_eq!(
        refusing.expand_requests.load(Ordering::Relaxed),
        1,
        "asked once"
    );
    assert_eq!(
        first.requests,
        plain.requests + 1,
        "the refused GET, then as before"
    );
    // later discoveries (in the background, beside the re-reads) do not ask again
    let before = refusing.requests.load(Ordering::Relaxed);
    for _ in 0..3 {
        let p = p.poll(Timestamp::from(chrono::Utc::now())).remove(0);
        assert!(p.error.is_none(), "{:?}", p.error);
        std::thread::sleep(std::time::Duration::from_millis(300));
    }
    let walked = refusing.requests.load(Ordering::Relaxed) - before;
    assert!(walked > plain.requests, "a rediscovery ran: {walked} GETs");
    assert_eq!(refusing.expand_requests.load(Ordering::Relaxed), 1);

    // sushy-static advertises ExpandQuery but serves the collection as it is: the
    // member links of that answer are used; were the query refused, it costs one GET
    let sushy = Sushy::start("public-pdu", None);
    let (ignored, _) = discover(&sushy.url, true);
    let (off, _) = discover(&sushy.url, false);
    assert_eq!(readings(&ignored), readings(&off));
    assert!(
        ignored.requests <= off.requests + 1,
        "{} GETs with $expand ignored, {} without",
        ignored.requests,
        off.requests
    );
}
