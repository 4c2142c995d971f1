//! `powerplane serve` with `[node_power]` against a BMC as a site has one: the real
//! sushy-emulator (`--fake`) with its own HTTPS (a certificate the site's CA signed) and
//! HTTP Basic auth. A wrong password is refused with a clear, counted error and powers
//! nothing; the right one (from a file, the CA from `tls.ca_file`) powers the node up
//! on take-over and down when it is idle. And a BMC that takes Redfish sessions (an
//! HTTPS front with a session service before the emulator, whose tokens expire): the
//! power actions go with the session's token, and a login again when it expires.

mod common;

#[path = "common/pki.rs"]
mod pki;

use std::time::{Duration, Instant};

use common::{http, metric_value as value, serve, serve_log, VIEWER};
use orchestrator::node_power::{PowerState, RedfishPower};

#[path = "common/sushy_emulator.rs"]
mod sushy_emulator;
use sushy_emulator::{wait_for, Emulator, Secured};

fn metrics(port: u16) -> String {
    let (code, _, body) = http(port, "GET", "/metrics", None, b"");
    if code == 200 {
        body
    } else {
        String::new()
    }
}

/// The site, a deferral policy with node power (nodes idle 10 s go off), and a free
/// port for the API; the config's path.
fn node_power_setup(d: &std::path::Path) -> (u16, std::path::PathBuf) {
    common::write_site_and_deferral_policy(d);
    let mut policy = std::fs::read_to_string(d.join("policy.toml")).expect("policy");
    policy.push_str(
        "[node_power]\nenabled = true\nreserve_gpus = 0\nreserve_share = 0.0\nidle_s = 10\nmin_off_s = 3600\nboot_s = 60\nshutdown_s = 10\n",
    );
    std::fs::write(d.join("policy.toml"), policy).expect("policy");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("port")
        .local_addr()
        .expect("addr")
        .port();
    (port, d.join("powerplane.toml"))
}

/// `[node_power]` over Redfish at `url` for node a01-n01 (`system`), with `auth` of
/// `kind` and the password in a file, the site's CA trusted.
fn write_config(
    d: &std::path::Path,
    port: u16,
    url: &str,
    system: &str,
    kind: &str,
    password: &str,
) {
    std::fs::write(d.join("bmc.password"), format!("{password}\n")).expect("password");
    std::fs::write(
        d.join("powerplane.toml"),
        format!(
            "[controller]\nsite = \"site.toml\"\npolicy = \"policy.toml\"\ntick_s = 0.5\n[store]\nkind = \"embedded\"\npath = \"s.redb\"\n[node_power]\nurl = \"{url}\"\ntimeout_s = 5\npoll_s = 1\nsystems = {{ \"a01-n01\" = \"{system}\" }}\nauth = {{ kind = \"{kind}\", username = \"powerplane\", password_file = \"bmc.password\" }}\ntls = {{ ca_file = \"site-ca.pem\" }}\n[http]\nlisten = \"127.0.0.1:{port}\"\n[[http.tokens]]\nname = \"v\"\nrole = \"viewer\"\ntoken = \"{VIEWER}\"\n"
        ),
    )
    .expect("config");
}

#[test]
fn a_wrong_bmc_password_powers_nothing_and_is_counted_and_the_right_one_powers_over_https() {
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path();
    let pki = pki::Pki::new(d);
    let emu = Emulator::start_with(Some(Secured {
        cert: &pki.server_cert,
        key: &pki.server_key,
        ca: &pki.ca,
        username: "powerplane",
        password: "correct horse battery",
    }));
    let (r, system) = emu.first_system();
    assert_eq!(r.power_state(&system).expect("state"), PowerState::Off);
    // without credentials the emulator refuses, as a BMC does
    let mut anonymous = sources::redfish::EndpointConfig::new("anon", &emu.url);
    anonymous.tls = emu.access.as_ref().expect("secured").0.clone();
    let anon = RedfishPower::new(anonymous).expect("client");
    let e = anon.power_state(&system).expect_err("no credentials");
    assert!(format!("{e:#}").contains("401"), "{e:#}");

    let (port, config) = node_power_setup(d);
    let write = |password: &str| write_config(d, port, &emu.url, &system, "basic", password);
    let log = || serve_log(&config);

    // a wrong password: every call refused, counted; the node stays off
    write("wrong");
    let first = serve(&config, 300);
    let start = Instant::now();
    let m = loop {
        let m = metrics(port);
        if value(&m, "powerplane_node_power_auth_failures_total").is_some_and(|n| n >= 3.0) {
            break m;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "no auth failure counted:\n{m}\n{}",
            log()
        );
        std::thread::sleep(Duration::from_millis(300));
    };
    assert!(
        value(&m, "powerplane_node_power_poll_errors_total").is_some_and(|n| n >= 2.0),
        "{m}"
    );
    assert!(
        value(&m, "powerplane_node_power_errors_total").is_some_and(|n| n >= 1.0),
        "the take-over's refusal is counted: {m}"
    );
    assert_eq!(
        value(&m, "powerplane_node_power_ups_total"),
        Some(0.0),
        "{m}"
    );
    assert_eq!(r.power_state(&system).expect("state"), PowerState::Off);
    let text = log();
    assert!(
        text.contains("auth") && text.contains("401") && text.contains("credentials were refused"),
        "the log says why: {text}"
    );
    drop(first);
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(
        r.power_state(&system).expect("state"),
        PowerState::Off,
        "nothing powered with the wrong password"
    );

    // the right password: take-over powers the node up, then idle powers it down
    write("correct horse battery");
    let _second = serve(&config, 300);
    wait_for(&r, &system, PowerState::On, &log);
    wait_for(&r, &system, PowerState::Off, &log);
    let start = Instant::now();
    loop {
        let m = metrics(port);
        if value(&m, "powerplane_node_power_downs_total") == Some(1.0) {
            assert_eq!(
                value(&m, "powerplane_node_power_auth_failures_total"),
                Some(0.0),
                "{m}"
            );
            common::promtool_check(&m);
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the power-down not counted:\n{m}\n{}",
            log()
        );
        std::thread::sleep(Duration::from_millis(300));
    }
}

#[test]
fn node_power_logs_in_to_a_bmcs_session_service_and_again_when_the_token_expires() {
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path();
    let pki = pki::Pki::new(d);
    let emu = Emulator::start();
    let (r, system) = emu.first_system();
    assert_eq!(r.power_state(&system).expect("state"), PowerState::Off);
    let front = pki::TlsFront::start_gated(
        &pki,
        None,
        &emu.url,
        Some(pki::SessionGate {
            username: "powerplane".into(),
            password: "correct horse battery".into(),
            token_uses: 15,
        }),
    );
    let (port, config) = node_power_setup(d);
    let write = |password: &str| write_config(d, port, &front.url, &system, "session", password);
    let log = || serve_log(&config);

    // a wrong password: the session login refused, counted, nothing powered
    write("wrong");
    let first = serve(&config, 300);
    let start = Instant::now();
    while !value(&metrics(port), "powerplane_node_power_auth_failures_total")
        .is_some_and(|n| n >= 2.0)
    {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "no auth failure counted:\n{}",
            log()
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    drop(first);
    assert_eq!(front.logins.load(std::sync::atomic::Ordering::SeqCst), 0);
    assert_eq!(r.power_state(&system).expect("state"), PowerState::Off);

    // the right password: the take-over's power-up and the idle power-down go with
    // the session's token, through as many logins as the tokens' expiry asks
    write("correct horse battery");
    let _second = serve(&config, 300);
    wait_for(&r, &system, PowerState::On, &log);
    wait_for(&r, &system, PowerState::Off, &log);
    let start = Instant::now();
    loop {
        let m = metrics(port);
        if value(&m, "powerplane_node_power_downs_total") == Some(1.0) {
            assert_eq!(
                value(&m, "powerplane_node_power_errors_total"),
                Some(0.0),
                "{m}"
            );
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the power-down not counted:\n{m}\n{}",
            log()
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    let logins = front.logins.load(std::sync::atomic::Ordering::SeqCst);
    assert!(
        logins >= 2,
        "a token that expired was renewed by a login: {logins} logins\n{}",
        log()
    );
}
