//! `serve` fetching its price feed over HTTP, keeping the last series when the feed
//! fails, and falling back to the site's tariff once the series is stale.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::http;

const VIEWER: &str = "viewer-token-0123456789abcdef";

fn status(port: u16) -> Option<serde_json::Value> {
    let (code, _, body) = http(port, "GET", "/api/v1/status", Some(VIEWER), b"");
    (code == 200)
        .then(|| serde_json::from_str(&body).ok())
        .flatten()
}

#[test]
fn a_fetched_feed_is_used_while_fresh_then_the_tariff_takes_over() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace");
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path();
    let site = std::fs::read_to_string(root.join("examples/demo/site.toml")).expect("site");
    std::fs::write(
        d.join("site.toml"),
        format!("{site}\n[tariff]\ndefault_per_kwh = 0.333\ndemand_charge_per_kw = 9.5\n"),
    )
    .expect("site");
    std::fs::copy(
        root.join("examples/demo/policy.toml"),
        d.join("policy.toml"),
    )
    .expect("policy");

    // the feed: served once, then failing; its last point is 8 s from now
    let server = tiny_http::Server::http("127.0.0.1:0").expect("server");
    let feed_port = server.server_addr().to_ip().expect("ip").port();
    let now = chrono::Utc::now();
    let csv = format!(
        "start,price_per_kwh\n{},0.111\n{},0.222\n",
        (now - chrono::Duration::seconds(60)).to_rfc3339(),
        (now + chrono::Duration::seconds(8)).to_rfc3339()
    );
    let served = Arc::new(AtomicUsize::new(0));
    let count = served.clone();
    std::thread::spawn(move || {
        for req in server.incoming_requests() {
            let n = count.fetch_add(1, Ordering::Relaxed);
            let resp = if n == 0 {
                tiny_http::Response::from_string(csv.clone())
            } else {
                tiny_http::Response::from_string("down for maintenance").with_status_code(500)
            };
            let _ = req.respond(resp);
        }
    });
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("port")
        .local_addr()
        .expect("addr")
        .port();
    std::fs::write(
        d.join("powerplane.toml"),
        format!(
            "[controller]\nsite = \"site.toml\"\npolicy = \"policy.toml\"\ntick_s = 0.5\n[store]\nkind = \"embedded\"\npath = \"s.redb\"\n[prices]\nurl = \"http://127.0.0.1:{feed_port}/prices.csv\"\nrefresh_s = 10\nstale_after_s = 3\n[http]\nlisten = \"127.0.0.1:{port}\"\n[[http.tokens]]\nname = \"v\"\nrole = \"viewer\"\ntoken = \"{VIEWER}\"\n"
        ),
    )
    .expect("config");
    let mut serve = Command::new(env!("CARGO_BIN_EXE_powerplane"))
        .args(["serve", "--run-for-s", "40", "--config"])
        .arg(d.join("powerplane.toml"))
        .stderr(Stdio::piped())
        .spawn()
        .expect("serve");
    let wait_for = |want: f64, source: &str, within: Duration| {
        let end = Instant::now() + within;
        loop {
            if let Some(s) = status(port) {
                if s["price_per_kwh"].as_f64() == Some(want) && s["price_source"] == source {
                    return;
                }
            }
            assert!(
                Instant::now() < end,
                "price never became {want} from {source}: {:?}",
                status(port)
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    wait_for(0.111, "feed", Duration::from_secs(7));
    let st = status(port).expect("status");
    assert_eq!(
        (
            st["tariff_period"].as_str(),
            st["demand_charge_per_kw"].as_f64()
        ),
        (Some("default"), Some(9.5))
    );
    let (_, _, metrics) = http(port, "GET", "/metrics", None, b"");
    assert!(
        metrics.contains("powerplane_demand_charge_per_kw 9.5\n"),
        "{metrics}"
    );
    common::promtool_check(&metrics);
    wait_for(0.222, "feed", Duration::from_secs(12));
    // 3 s after the last point: stale, and the fetch that refreshes it fails
    wait_for(0.333, "tariff", Duration::from_secs(15));
    // the next fetch (after refresh_s) fails: the last series is kept, still stale
    let end = Instant::now() + Duration::from_secs(12);
    while served.load(Ordering::Relaxed) < 2 {
        assert!(Instant::now() < end, "never fetched again after refresh_s");
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_millis(1200));
    wait_for(0.333, "tariff", Duration::from_secs(2));
    let _ = serve.kill();
    let out = serve.wait_with_output().expect("serve");
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(log.contains("price feed fetched"), "{log}");
    assert!(
        log.contains("price feed fetch failed; keeping the last series"),
        "{log}"
    );
    assert!(log.contains("the price feed is stale or empty"), "{log}");
}
