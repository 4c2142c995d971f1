//! `serve` fetching its price feed over HTTP, keeping the last series when the feed
//! fails, and falling back to the site's tariff once the series is stale; and live
//! feeds behind the tokens their APIs want (ENTSO-E's `securityToken` in the query,
//! Electricity Maps' `auth-token` header), their ages and fetches on `/metrics`.

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
    assert!(log.contains("feed fetched feed=\"price\""), "{log}");
    assert!(
        log.contains("feed fetch failed; keeping the last series feed=\"price\""),
        "{log}"
    );
    assert!(log.contains("the price feed is stale or empty"), "{log}");
}

/// An ENTSO-E A44 document of hourly prices (EUR/MWh) from the hour before `now`.
fn a44(now: chrono::DateTime<chrono::Utc>, prices: &[f64]) -> String {
    use chrono::{DurationRound, TimeDelta};
    let start = now.duration_trunc(TimeDelta::hours(1)).expect("hour") - TimeDelta::hours(1);
    let end = start + TimeDelta::hours(prices.len() as i64);
    let points: String = prices
        .iter()
        .enumerate()
        .map(|(i, p)| {
            format!(
                "<Point><position>{}</position><price.amount>{p}</price.amount></Point>",
                i + 1
            )
        })
        .collect();
    format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Publication_MarketDocument xmlns=\"urn:iec62325.351:tc57wg16:451-3:publicationdocument:7:3\"><TimeSeries><Period><timeInterval><start>{}</start><end>{}</end></timeInterval><resolution>PT60M</resolution>{points}</Period></TimeSeries></Publication_MarketDocument>",
        start.format("%Y-%m-%dT%H:%MZ"),
        end.format("%Y-%m-%dT%H:%MZ")
    )
}

#[test]
fn live_feeds_behind_their_apis_tokens_are_fetched_counted_and_kept_through_errors() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace");
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path();
    std::fs::copy(root.join("examples/demo/site.toml"), d.join("site.toml")).expect("site");
    std::fs::copy(
        root.join("examples/demo/policy.toml"),
        d.join("policy.toml"),
    )
    .expect("policy");
    std::fs::write(d.join("entsoe.token"), "0b6f2f1e-entsoe-token\n").expect("token");
    std::fs::write(d.join("em.token"), "em-token-4711\n").expect("token");
    let now = chrono::Utc::now();
    let doc = a44(now, &[120.0, 95.5, 95.5, 80.0]);
    // both APIs answer twice, then fail as their documentation shows
    let server = tiny_http::Server::http("127.0.0.1:0").expect("server");
    let feed_port = server.server_addr().to_ip().expect("ip").port();
    let calls = Arc::new(AtomicUsize::new(0));
    let count = calls.clone();
    let carbon = format!(
        r#"{{"zone":"DE","forecast":[{{"carbonIntensity":351,"datetime":"{}"}},{{"carbonIntensity":340,"datetime":"{}"}}]}}"#,
        (now - chrono::Duration::minutes(30)).to_rfc3339(),
        (now + chrono::Duration::hours(3)).to_rfc3339()
    );
    std::thread::spawn(move || {
        for req in server.incoming_requests() {
            let url = req.url().to_string();
            let n = count.fetch_add(1, Ordering::Relaxed);
            let token = req
                .headers()
                .iter()
                .find(|h| h.field.equiv("auth-token"))
                .map(|h| h.value.to_string());
            let (status, body) = if url.starts_with("/api?") {
                if !url.contains("securityToken=0b6f2f1e-entsoe-token") {
                    (
                        401,
                        "<html><body><h1>Unauthorized</h1></body></html>".to_string(),
                    )
                } else if n >= 4 {
                    (
                        503,
                        "<html><body>Service Temporarily Unavailable</body></html>".to_string(),
                    )
                } else {
                    (200, doc.clone())
                }
            } else if token.as_deref() != Some("em-token-4711") {
                (
                    401,
                    r#"{"message":"Invalid authentication token"}"#.to_string(),
                )
            } else if n >= 4 {
                (429, r#"{"message":"Rate limit exceeded"}"#.to_string())
            } else {
                (200, carbon.clone())
            };
            let _ = req.respond(tiny_http::Response::from_string(body).with_status_code(status));
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
            "[controller]\nsite = \"site.toml\"\npolicy = \"policy.toml\"\ntick_s = 0.5\n[store]\nkind = \"embedded\"\npath = \"s.redb\"\n[prices]\nurl = \"http://127.0.0.1:{feed_port}/api?documentType=A44&in_Domain=10Y1001A1001A82H&out_Domain=10Y1001A1001A82H&periodStart={{start:%Y%m%d%H%M}}&periodEnd={{end:%Y%m%d%H%M}}\"\nformat = \"entsoe\"\nrefresh_s = 10\nauth = {{ kind = \"query\", param = \"securityToken\", token_file = \"entsoe.token\" }}\n[prices.carbon]\nurl = \"http://127.0.0.1:{feed_port}/v3/carbon-intensity/forecast?zone=DE\"\nrefresh_s = 10\nformat = \"json\"\njson = {{ shape = \"objects\", items = \"/forecast\", time_key = \"datetime\", value_key = \"carbonIntensity\", unit = \"g_per_kwh\" }}\nauth = {{ kind = \"header\", name = \"auth-token\", token_file = \"em.token\" }}\n[http]\nlisten = \"127.0.0.1:{port}\"\n[[http.tokens]]\nname = \"v\"\nrole = \"viewer\"\ntoken = \"{VIEWER}\"\n"
        ),
    )
    .expect("config");
    let mut serve = Command::new(env!("CARGO_BIN_EXE_powerplane"))
        .args(["serve", "--run-for-s", "60", "--config"])
        .arg(d.join("powerplane.toml"))
        .stderr(Stdio::piped())
        .spawn()
        .expect("serve");
    let metrics = || {
        let (code, _, body) = http(port, "GET", "/metrics", None, b"");
        if code == 200 {
            body
        } else {
            String::new()
        }
    };
    let value = |m: &str, series: &str| common::metric_value(m, series);
    let wait = |what: &str, within: Duration, ok: &dyn Fn(&str) -> bool| -> String {
        let end = Instant::now() + within;
        loop {
            let m = metrics();
            if ok(&m) {
                return m;
            }
            assert!(Instant::now() < end, "{what}: not within {within:?}\n{m}");
            std::thread::sleep(Duration::from_millis(200));
        }
    };
    // the price of this hour (95.5 EUR/MWh) and the carbon intensity of now
    let m = wait("both feeds fetched", Duration::from_secs(15), &|m| {
        value(
            m,
            "powerplane_feed_fetches_total{feed=\"price\",result=\"ok\"}",
        ) == Some(1.0)
            && value(
                m,
                "powerplane_feed_fetches_total{feed=\"carbon\",result=\"ok\"}",
            ) == Some(1.0)
            && m.contains("powerplane_price_per_kwh{")
    });
    let st = status(port).expect("status");
    assert_eq!(st["price_per_kwh"].as_f64(), Some(0.0955), "{st}");
    assert_eq!(st["price_source"], "feed", "{st}");
    let carbon_now = m
        .lines()
        .find(|l| l.starts_with("powerplane_carbon_grams_per_kwh{"))
        .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok());
    assert_eq!(carbon_now, Some(351.0), "{m}");
    assert!(
        value(&m, "powerplane_feed_age_seconds{feed=\"price\"}").is_some_and(|a| a < 10.0),
        "{m}"
    );
    common::promtool_check(&m);
    // after two fetches each the APIs fail: counted, the last series kept, ageing
    let m = wait("the failures counted", Duration::from_secs(35), &|m| {
        value(
            m,
            "powerplane_feed_fetches_total{feed=\"price\",result=\"error\"}",
        ) >= Some(1.0)
            && value(
                m,
                "powerplane_feed_fetches_total{feed=\"carbon\",result=\"error\"}",
            ) >= Some(1.0)
    });
    assert!(
        value(&m, "powerplane_feed_age_seconds{feed=\"price\"}").is_some_and(|a| a >= 5.0),
        "{m}"
    );
    let st = status(port).expect("status");
    assert_eq!(
        st["price_per_kwh"].as_f64(),
        Some(0.0955),
        "the last series is kept: {st}"
    );
    assert_eq!(st["price_source"], "feed", "{st}");
    let _ = serve.kill();
    let out = serve.wait_with_output().expect("serve");
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(log.contains("HTTP 503"), "{log}");
    assert!(log.contains("HTTP 429: Rate limit exceeded"), "{log}");
    assert!(
        !log.contains("0b6f2f1e-entsoe-token") && !log.contains("em-token-4711"),
        "a token in the log:\n{log}"
    );
}
