//! `powerplane serve` with a PostgreSQL store over TLS, as a DBA hands one out: a
//! server of the test's own that takes TCP connections over TLS only, with a password
//! (`hostssl ... scram-sha-256`), its certificate signed by the site's CA (made with
//! `openssl`, tests/common/pki.rs). Serve connects with `tls = { ca_file }` and the
//! password from `password_file` or `password_env`, and stores there; a CA that did not
//! sign the server's certificate, a URL without TLS and a wrong password are each
//! refused at start, with the reason.

#[path = "../../tests/src/pg_server.rs"]
#[allow(dead_code)]
mod pg_server;
#[path = "common/pki.rs"]
mod pki;

use std::path::Path;
use std::process::{Command, Output};
use std::sync::Arc;

use integrations::store::postgres::{PostgresBackend, Target};
use integrations::store::Store;
use pg_server::PgServer;
use pki::Pki;

const PASSWORD: &str = "correct horse battery staple";

fn serve(d: &Path, store: &str, env: &[(&str, &str)]) -> Output {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace");
    let config = d.join("powerplane.toml");
    std::fs::write(
        &config,
        format!(
            "[controller]\nsite = \"{}\"\npolicy = \"{}\"\ntick_s = 0.5\n[store]\nkind = \"postgres\"\njournal = \"journal.redb\"\ntimeout_s = 2\n{store}",
            root.join("examples/demo/site.toml").display(),
            root.join("examples/demo/policy.toml").display(),
        ),
    )
    .expect("config");
    let _ = std::fs::remove_file(d.join("journal.redb"));
    Command::new(env!("CARGO_BIN_EXE_powerplane"))
        .args(["serve", "--run-for-s", "2", "--config"])
        .arg(&config)
        .envs(env.iter().copied())
        .output()
        .expect("serve")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).to_string()
}

#[test]
fn serve_stores_over_tls_with_a_password_and_refuses_what_it_must_not_trust() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let pki = Pki::new(d);
    let db = PgServer::start_tls(&pki.server_cert, &pki.server_key, PASSWORD);
    std::fs::write(d.join("pg.password"), format!("{PASSWORD}\n")).expect("password");
    let url = format!("postgres://postgres@127.0.0.1:{}/postgres", db.port);
    let ca = pki.ca.display().to_string();

    // the site's CA and the password from a file: serve runs and stores
    let ok = serve(
        d,
        &format!(
            "url = \"{url}\"\npassword_file = \"pg.password\"\ntls = {{ ca_file = \"{ca}\" }}\n"
        ),
        &[],
    );
    assert!(ok.status.success(), "{}", stderr(&ok));
    let tls = sources::tls::client_config(&sources::tls::Tls {
        ca_file: Some(ca.clone()),
        ..Default::default()
    })
    .expect("client config");
    let target = Target {
        url: url.clone(),
        password: Some(PASSWORD.into()),
        tls: Some(Arc::new(tls)),
    };
    let mut store = Store::new(Box::new(
        PostgresBackend::connect_to(&target, "powerplane").expect("connect over TLS"),
    ));
    let caps = store.state().expect("state").caps.len();
    assert_eq!(caps, 192, "serve's caps are in the database");
    // the connection over TCP (the store's, above) is TLS, as the server sees it
    assert_eq!(
        db.sql(
            "SELECT bool_and(s.ssl) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) \
             WHERE a.client_addr IS NOT NULL"
        ),
        "t"
    );

    // the password from the environment
    let env = serve(
        d,
        &format!("url = \"{url}\"\npassword_env = \"PP_TEST_PG_PASSWORD\"\ntls = {{ ca_file = \"{ca}\" }}\n"),
        &[("PP_TEST_PG_PASSWORD", PASSWORD)],
    );
    assert!(env.status.success(), "{}", stderr(&env));

    // a CA that did not sign the server's certificate: refused, the certificate named
    let other = serve(
        d,
        &format!(
            "url = \"{url}\"\npassword_file = \"pg.password\"\ntls = {{ ca_file = \"{}\" }}\n",
            pki.other_ca.display()
        ),
        &[],
    );
    assert!(!other.status.success(), "an untrusted server was taken");
    let e = stderr(&other);
    assert!(e.to_lowercase().contains("certificate"), "{e}");
    eprintln!("an untrusted CA: {}", e.trim().lines().last().unwrap_or(""));

    // no TLS: the server has no entry for a connection in the clear
    let clear = serve(
        d,
        &format!("url = \"{url}\"\npassword_file = \"pg.password\"\n"),
        &[],
    );
    assert!(
        !clear.status.success(),
        "a connection in the clear was taken"
    );
    let e = stderr(&clear);
    assert!(
        e.contains("no encryption") || e.contains("pg_hba.conf"),
        "{e}"
    );
    eprintln!("in the clear: {}", e.trim().lines().last().unwrap_or(""));

    // a wrong password
    std::fs::write(d.join("wrong.password"), "not it\n").expect("password");
    let wrong = serve(
        d,
        &format!(
            "url = \"{url}\"\npassword_file = \"wrong.password\"\ntls = {{ ca_file = \"{ca}\" }}\n"
        ),
        &[],
    );
    assert!(!wrong.status.success(), "a wrong password was taken");
    let e = stderr(&wrong);
    assert!(e.contains("password authentication failed"), "{e}");
    eprintln!(
        "a wrong password: {}",
        e.trim().lines().last().unwrap_or("")
    );
}
