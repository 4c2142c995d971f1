//! `powerplane serve` with `[redfish]`: the poller runs as a task of serve's runtime and
//! its counters reach `/metrics` per endpoint of the config, passing `promtool`.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{http, promtool_check, serve, serve_log, VIEWER};

/// The DMTF rack-PDU mockup from `tests/fixtures`, served by a plain HTTP server.
fn pdu_bmc(root: &Path) -> u16 {
    let server = tiny_http::Server::http("127.0.0.1:0").expect("server");
    let port = server.server_addr().to_ip().expect("ip").port();
    let dir = root.join("tests/fixtures/redfish/public-pdu");
    std::thread::spawn(move || {
        for req in server.incoming_requests() {
            let rel = req
                .url()
                .trim_start_matches("/redfish/v1")
                .trim_matches('/')
                .to_string();
            let file = dir.join(rel).join("index.json");
            let resp = match std::fs::read(&file) {
                Ok(b) => tiny_http::Response::from_data(b),
                Err(_) => tiny_http::Response::from_data(b"{}".to_vec()).with_status_code(404),
            };
            let _ = req.respond(resp);
        }
    });
    port
}

fn value(metrics: &str, series: &str) -> Option<f64> {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
}

#[test]
fn serve_polls_redfish_on_its_runtime_and_exports_the_counters() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace");
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path();
    common::write_site_and_deferral_policy(d);
    // the site binds the PDU's own power meter to a second PDU of the site, and one
    // reading the mockup does not have
    let mut site = std::fs::read_to_string(d.join("site.toml")).expect("site");
    site.push_str(
        "\n[[redfish]]\nendpoint = \"pdu\"\nresource = \"PowerEquipment/RackPDUs/1/Metrics\"\nproperty = \"PowerWatts\"\nentity = \"pdu/pdu-a02\"\nmetric = \"power_w\"\n\n[[redfish]]\nendpoint = \"pdu\"\nresource = \"PowerEquipment/RackPDUs/1/Metrics\"\nproperty = \"NoSuchReading\"\nentity = \"pdu/pdu-a03\"\nmetric = \"power_w\"\n",
    );
    std::fs::write(d.join("site.toml"), site).expect("site");
    let meter = std::fs::read_to_string(
        root.join("tests/fixtures/redfish/public-pdu/PowerEquipment/RackPDUs/1/Metrics/index.json"),
    )
    .expect("fixture");
    let meter: serde_json::Value = serde_json::from_str(&meter).expect("json");
    let meter_w = meter["PowerWatts"]["Reading"].as_f64().expect("PowerWatts");
    let bmc = pdu_bmc(root);
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr").port()
    };
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("port")
        .local_addr()
        .expect("addr")
        .port();
    let config = d.join("powerplane.toml");
    std::fs::write(
        &config,
        format!(
            "[controller]\nsite = \"site.toml\"\npolicy = \"policy.toml\"\ntick_s = 0.5\n[store]\nkind = \"embedded\"\npath = \"s.redb\"\n[redfish]\ninterval_s = 1\nper_endpoint = 2\n[[redfish.endpoints]]\nname = \"pdu\"\nurl = \"http://127.0.0.1:{bmc}\"\nentities = {{ \"RackPDUs/1\" = \"pdu/pdu-a01\" }}\n[[redfish.endpoints]]\nname = \"dead\"\nurl = \"http://127.0.0.1:{dead}\"\ntimeout_s = 0.5\n[http]\nlisten = \"127.0.0.1:{port}\"\n[[http.tokens]]\nname = \"v\"\nrole = \"viewer\"\ntoken = \"{VIEWER}\"\n"
        ),
    )
    .expect("config");
    let _serve = serve(&config, 30);
    let started = Instant::now();
    let metrics = loop {
        let (code, _, body) = http(port, "GET", "/metrics", None, b"");
        let read = value(
            &body,
            "powerplane_redfish_poll_duration_seconds{endpoint=\"pdu\"}",
        );
        let refused = value(
            &body,
            "powerplane_redfish_failures_total{endpoint=\"dead\",reason=\"connect\"}",
        );
        // the PDU's readings reach the snapshot on the tick after its poll
        let pdu = value(
            &body,
            "powerplane_power_watts{entity=\"pdu/pdu-a01\",kind=\"pdu\"}",
        );
        let bound = value(
            &body,
            "powerplane_power_watts{entity=\"pdu/pdu-a02\",kind=\"pdu\"}",
        );
        if code == 200
            && read.is_some()
            && refused.is_some_and(|n| n >= 2.0)
            && pdu.is_some()
            && bound.is_some()
        {
            break body;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "no Redfish counters on /metrics ({code}):\n{body}\n{}",
            serve_log(&config)
        );
        std::thread::sleep(Duration::from_millis(300));
    };
    // discovery (142 GETs) and re-reads (13 per poll) of the PDU
    let requests = value(
        &metrics,
        "powerplane_redfish_requests_total{endpoint=\"pdu\"}",
    );
    assert!(requests.is_some_and(|n| n >= 142.0), "{requests:?}");
    // the DMTF PDU's every reading has a unit powerplane knows
    assert_eq!(
        value(
            &metrics,
            "powerplane_redfish_not_understood_total{endpoint=\"pdu\"}"
        ),
        Some(0.0)
    );
    assert_eq!(
        value(
            &metrics,
            "powerplane_redfish_backing_off{endpoint=\"dead\"}"
        ),
        Some(1.0)
    );
    assert_eq!(
        value(&metrics, "powerplane_redfish_backing_off{endpoint=\"pdu\"}"),
        Some(0.0)
    );
    assert_eq!(
        value(
            &metrics,
            "powerplane_redfish_failures_total{endpoint=\"pdu\",reason=\"timeout\"}"
        ),
        Some(0.0)
    );
    assert!(
        value(
            &metrics,
            "powerplane_redfish_polls_skipped_total{endpoint=\"dead\"}"
        )
        .is_some_and(|n| n >= 1.0),
        "the dead BMC is backed off"
    );
    // its readings reached the loop's snapshot: the PDU as the site names it; its
    // outlets, which the site does not define, are refused and counted
    assert!(
        value(
            &metrics,
            "powerplane_power_watts{entity=\"pdu/pdu-a01\",kind=\"pdu\"}"
        )
        .is_some_and(|w| w > 0.0),
        "{metrics}"
    );
    assert!(
        !metrics.contains("entity=\"outlet/pdu.1.A1\""),
        "an entity the site does not define reached /metrics"
    );
    assert!(
        value(
            &metrics,
            "powerplane_samples_rejected_total{reason=\"unknown_entity\"}"
        )
        .is_some_and(|n| n > 0.0),
        "{metrics}"
    );
    // the bound reading reached the snapshot as the site's entity; the binding that
    // found nothing is counted
    assert_eq!(
        value(
            &metrics,
            "powerplane_power_watts{entity=\"pdu/pdu-a02\",kind=\"pdu\"}"
        ),
        Some(meter_w),
        "{metrics}"
    );
    assert_eq!(
        value(
            &metrics,
            "powerplane_redfish_bindings_unfilled{endpoint=\"pdu\"}"
        ),
        Some(1.0)
    );
    promtool_check(&metrics);
}
