//! The Redfish source against DMTF's mockups served by the real `sushy-static`, and
//! against BMCs that hang, fail or present a self-signed certificate.

use std::time::{Duration, Instant};

use powerplane_tests::{self_signed, BadBmc, Sushy, TlsBmc};
use sources::redfish::{EndpointConfig, Polled, Poller, Tls};
use telemetry::{Quality, Timestamp};

fn now() -> Timestamp {
    Timestamp::from(chrono::Utc::now())
}

fn poll_one(cfg: EndpointConfig) -> Polled {
    let mut p = Poller::new(vec![cfg], 1).expect("poller");
    p.poll(now()).remove(0)
}

fn value(p: &Polled, entity: &str, metric: &str, from: &str) -> Option<(f64, Quality)> {
    p.samples
        .iter()
        .find(|s| {
            s.entity.to_string() == entity && s.metric.as_str() == metric && s.source.contains(from)
        })
        .map(|s| (s.value, s.quality))
}

#[test]
fn a_rack_pdu_gives_mains_branches_and_outlets() {
    let bmc = Sushy::start("public-pdu", None);
    let mut cfg = EndpointConfig::new("pdu1", &bmc.url);
    cfg.entities
        .insert("RackPDUs/1".into(), "pdu/pdu-a01".into());
    let p = poll_one(cfg);
    assert!(p.error.is_none(), "{:?}", p.error);
    assert_eq!(
        value(&p, "outlet/pdu-a01.A1", "power_w", ""),
        Some((197.4, Quality::Good))
    );
    assert_eq!(
        value(&p, "outlet/pdu-a01.A1", "current_a", ""),
        Some((1.68, Quality::Good))
    );
    assert_eq!(
        value(&p, "outlet/pdu-a01.A1", "energy_j", "").map(|v| v.0),
        Some(36166.0 * 3.6e6)
    );
    assert_eq!(
        value(&p, "branch/pdu-a01.A", "power_w", "").map(|v| v.0),
        Some(937.4)
    );
    let mains = value(&p, "pdu/pdu-a01", "power_w", "")
        .expect("mains power")
        .0;
    assert!(
        (mains - (198.4 + 231.5 + 58.1)).abs() < 1e-9,
        "the three lines to neutral: {mains}"
    );
    assert_eq!(
        p.samples
            .iter()
            .filter(|s| s.entity.kind == telemetry::EntityKind::Outlet
                && s.metric.as_str() == "power_w")
            .count(),
        9
    );
}

#[test]
fn a_rackmount_chassis_gives_power_in_both_models_and_its_inlet() {
    let bmc = Sushy::start("public-rackmount1", None);
    let mut cfg = EndpointConfig::new("bmc7", &bmc.url);
    cfg.entities
        .insert("Chassis/1U".into(), "node/a01-n01".into());
    let p = poll_one(cfg);
    assert!(p.error.is_none(), "{:?}", p.error);
    assert_eq!(
        value(&p, "node/a01-n01", "power_w", "/Power#").map(|v| v.0),
        Some(344.0),
        "legacy Power"
    );
    assert_eq!(
        value(&p, "node/a01-n01", "power_w", "/EnvironmentMetrics#").map(|v| v.0),
        Some(374.0),
        "EnvironmentMetrics"
    );
    assert_eq!(
        value(&p, "node/a01-n01", "inlet_temp_c", "/Thermal#").map(|v| v.0),
        Some(25.0),
        "legacy Thermal intake"
    );
    assert_eq!(
        value(&p, "node/a01-n01", "inlet_temp_c", "/Sensors/").map(|v| v.0),
        Some(24.8),
        "intake Sensor"
    );
    assert_eq!(
        value(&p, "node/a01-n01", "inlet_temp_c", "/ThermalMetrics#").map(|v| v.0),
        Some(24.8),
        "ThermalSubsystem"
    );
    assert_eq!(
        value(&p, "node/a01-n01.psu.Bay1", "power_w", "/PowerSubsystem/"),
        Some((937.4, Quality::Uncertain)),
        "power supply metrics, health Warning"
    );
    // in the snapshot the current model wins over the legacy one
    let mut snap = telemetry::Snapshot::new();
    let t = now();
    for s in p.samples.clone() {
        snap.ingest(s, t).expect("valid sample");
    }
    assert_eq!(
        snap.reading(&"node/a01-n01".parse().expect("id"), "power_w")
            .map(|r| r.value),
        Some(374.0)
    );
}

#[test]
fn a_cdu_gives_its_loops_pumps_and_leak_detectors_with_health() {
    let bmc = Sushy::start("public-cooling-unit", None);
    let mut cfg = EndpointConfig::new("cdu", &bmc.url);
    cfg.entities.insert("CDUs/1".into(), "cooling/cdu-1".into());
    let p = poll_one(cfg);
    assert!(p.error.is_none(), "{:?}", p.error);
    assert_eq!(
        value(&p, "cooling/cdu-1.primary", "supply_temp_c", ""),
        Some((30.0, Quality::Good))
    );
    assert_eq!(
        value(&p, "cooling/cdu-1.primary", "return_temp_c", "").map(|v| v.0),
        Some(40.0)
    );
    assert_eq!(
        value(&p, "cooling/cdu-1.primary", "flow_lpm", "").map(|v| v.0),
        Some(42.0)
    );
    assert_eq!(
        value(&p, "cooling/cdu-1.primary", "heat_load_kw", "").map(|v| v.0),
        Some(25.48)
    );
    assert!(value(&p, "cooling/cdu-1.secondary", "supply_temp_c", "").is_some());
    let failed_pump = value(&p, "cooling/cdu-1.pump2", "fan_speed_pct", "");
    assert!(
        matches!(failed_pump, Some((_, Quality::Bad)) | None),
        "pump 2 has failed: {failed_pump:?}"
    );
    let leaks: Vec<f64> = p
        .samples
        .iter()
        .filter(|s| s.metric.as_str() == "leak_detected")
        .map(|s| s.value)
        .collect();
    assert_eq!(leaks.len(), 2, "moisture and overflow detectors");
}

#[test]
fn a_hanging_and_a_failing_bmc_do_not_slow_the_others_and_back_off() {
    let good = Sushy::start("public-pdu", None);
    let hang = BadBmc::hanging();
    let fail = BadBmc::failing();
    let mut hanging = EndpointConfig::new("hang", &hang.url);
    hanging.timeout_s = 1.0;
    let mut poller = Poller::new(
        vec![
            hanging,
            EndpointConfig::new("fail", &fail.url),
            EndpointConfig::new("good", &good.url),
        ],
        3,
    )
    .expect("poller");
    let started = Instant::now();
    let r = poller.poll(now());
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(3),
        "bounded by the 1 s timeout, in parallel: {took:?}"
    );
    assert_eq!(r[0].rejects[0].reason, "timeout", "{:?}", r[0]);
    assert_eq!(r[1].rejects[0].reason, "http_status", "{:?}", r[1]);
    assert!(
        r[1].error
            .as_deref()
            .is_some_and(|e| e.contains("HTTP 500")),
        "{:?}",
        r[1].error
    );
    assert!(r[2].error.is_none() && !r[2].samples.is_empty());
    // the next poll skips the two dead ones (backing off) and still reads the good one
    let r = poller.poll(now());
    assert!(r[0].skipped && r[1].skipped && !r[2].skipped);
    assert!(!r[2].samples.is_empty());
}

#[test]
fn a_self_signed_bmc_is_refused_unless_pinned_trusted_or_explicitly_insecure() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (cert, key, fingerprint) = self_signed(dir.path());
    let plain = Sushy::start("public-pdu", None);
    let bmc = TlsBmc::start(&cert, &key, &plain.url);
    let base = EndpointConfig::new("tls", &bmc.url);
    let refused = poll_one(base.clone());
    assert_eq!(
        refused.rejects.first().map(|r| r.reason),
        Some("tls"),
        "{:?}",
        refused.rejects
    );
    for tls in [
        Tls {
            pinned_sha256: Some(fingerprint.clone()),
            ..Tls::default()
        },
        Tls {
            ca_file: Some(cert.display().to_string()),
            ..Tls::default()
        },
        Tls {
            insecure: true,
            ..Tls::default()
        },
    ] {
        let mut cfg = base.clone();
        cfg.tls = tls.clone();
        let p = poll_one(cfg);
        assert!(p.error.is_none(), "{tls:?}: {:?}", p.error);
        assert!(p.samples.iter().any(|s| s.value == 197.4), "{tls:?}");
    }
    let mut wrong = base.clone();
    wrong.tls = Tls {
        pinned_sha256: Some("00".repeat(32)),
        ..Tls::default()
    };
    assert_eq!(
        poll_one(wrong).rejects.first().map(|r| r.reason),
        Some("tls")
    );
}

#[test]
fn after_discovery_only_the_resources_with_readings_are_read() {
    for mockup in ["public-pdu", "public-rackmount1", "public-cooling-unit"] {
        let bmc = Sushy::start(mockup, None);
        let mut poller = Poller::new(vec![EndpointConfig::new("e", &bmc.url)], 1).expect("poller");
        let readings = |p: &Polled| {
            let mut v: Vec<(String, String, String, u64)> = p
                .samples
                .iter()
                .map(|s| {
                    (
                        s.entity.to_string(),
                        s.metric.to_string(),
                        s.source.to_string(),
                        s.value.to_bits(),
                    )
                })
                .collect();
            v.sort();
            v
        };
        let first = poller.poll(now()).remove(0);
        let second = poller.poll(now()).remove(0);
        assert!(first.error.is_none() && second.error.is_none());
        assert_eq!(
            readings(&first),
            readings(&second),
            "{mockup}: the same readings"
        );
        assert!(
            second.requests * 2 < first.requests,
            "{mockup}: {} GETs after {} for discovery",
            second.requests,
            first.requests
        );
    }
}

#[test]
fn basic_auth_and_sessions_are_used_as_configured() {
    use sources::redfish::Auth;
    use std::sync::atomic::Ordering;
    let plain = Sushy::start("public-pdu", None);

    let basic = powerplane_tests::AuthBmc::start(&plain.url, false, usize::MAX);
    let anonymous = poll_one(EndpointConfig::new("b", &basic.url));
    assert_eq!(
        anonymous.rejects.first().map(|r| r.reason),
        Some("auth"),
        "no credentials: refused"
    );
    let mut cfg = EndpointConfig::new("b", &basic.url);
    cfg.auth = Auth::Basic {
        username: "user".into(),
        password: "pass".into(),
        password_file: None,
    };
    let p = poll_one(cfg.clone());
    assert!(p.error.is_none(), "{:?}", p.error);
    assert!(p.samples.iter().any(|s| s.value == 197.4));
    cfg.auth = Auth::Basic {
        username: "user".into(),
        password: "wrong".into(),
        password_file: None,
    };
    assert_eq!(
        poll_one(cfg).rejects.first().map(|r| r.reason),
        Some("auth")
    );

    // a session token that expires every 10 requests: logged in again, nothing lost
    let session = powerplane_tests::AuthBmc::start(&plain.url, true, 10);
    let mut cfg = EndpointConfig::new("s", &session.url);
    cfg.auth = Auth::Session {
        username: "user".into(),
        password: "pass".into(),
        password_file: None,
    };
    let p = poll_one(cfg.clone());
    assert!(
        p.error.is_none() && p.rejects.is_empty(),
        "{:?} {:?}",
        p.error,
        p.rejects
    );
    assert!(p.samples.iter().any(|s| s.value == 197.4));
    assert!(
        session.logins.load(Ordering::SeqCst) >= 2,
        "the token expired and the poller logged in again"
    );
    cfg.auth = Auth::Session {
        username: "user".into(),
        password: "nope".into(),
        password_file: None,
    };
    assert_eq!(
        poll_one(cfg).rejects.first().map(|r| r.reason),
        Some("auth")
    );
}
