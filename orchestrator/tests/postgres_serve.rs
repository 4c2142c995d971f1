//! `powerplane serve` with `[store] kind = "postgres"` on the machine's PostgreSQL
//! (127.0.0.1:5432, user postgres; a database of the test's own): its state survives a
//! restart, the audit log is rows a DBA can query, and `powerplane report --config`
//! reads from there. (Without telemetry serve accounts no energy: the ledger's rows
//! are the store contract's, tests/tests/store.rs.)

use std::path::Path;
use std::process::Command;

fn powerplane() -> Command {
    Command::new(env!("CARGO_BIN_EXE_powerplane"))
}

fn psql(db: &str, sql: &str) -> String {
    let out = Command::new("psql")
        .args(["-h", "127.0.0.1", "-U", "postgres", "-d", db])
        .args(["-v", "ON_ERROR_STOP=1", "-qtAc", sql])
        .output()
        .expect("psql (PostgreSQL's client) runs");
    assert!(
        out.status.success(),
        "psql -d {db} -c {sql:?} (PostgreSQL must run on 127.0.0.1:5432 and let the user \
         postgres in; scripts/openadr3-vtn starts it): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

struct Db(String);

impl Drop for Db {
    fn drop(&mut self) {
        let _ = Command::new("psql")
            .args(["-h", "127.0.0.1", "-U", "postgres", "-d", "postgres", "-qc"])
            .arg(format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.0))
            .output();
    }
}

#[test]
fn serve_keeps_its_state_and_audit_in_postgres_and_reports_from_there() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace");
    let db = Db(format!("pp_serve_{}", std::process::id()));
    psql("postgres", &format!("CREATE DATABASE {}", db.0));
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    std::fs::copy(root.join("examples/demo/site.toml"), d.join("site.toml")).expect("site");
    std::fs::copy(
        root.join("examples/demo/policy.toml"),
        d.join("policy.toml"),
    )
    .expect("policy");
    // the URL from a file, as a site keeps its password
    std::fs::write(
        d.join("store.url"),
        format!("postgres://postgres@127.0.0.1:5432/{}\n", db.0),
    )
    .expect("url");
    let config = d.join("powerplane.toml");
    // no telemetry at all: the budget rule assumes the worst of every stale GPU and caps
    std::fs::write(
        &config,
        "[controller]\nsite = \"site.toml\"\npolicy = \"policy.toml\"\ntick_s = 0.5\nledger_interval_s = 1\n\n[store]\nkind = \"postgres\"\nurl_file = \"store.url\"\nschema = \"powerplane\"\n",
    )
    .expect("config");
    let check = powerplane()
        .args(["serve", "--check", "--config"])
        .arg(&config)
        .output()
        .expect("check");
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stderr)
    );

    let first = powerplane()
        .args(["serve", "--run-for-s", "2.5", "--config"])
        .arg(&config)
        .output()
        .expect("serve");
    assert!(
        first.status.success(),
        "{}",
        String::from_utf8_lossy(&first.stderr)
    );

    // rows a DBA can query
    let audit: u64 = psql(
        &db.0,
        "SELECT count(*) FROM powerplane.logs WHERE log = 'audit'",
    )
    .parse()
    .expect("count");
    assert!(audit > 0, "no audit rows");
    let heads = psql(
        &db.0,
        "SELECT log || '=' || len FROM powerplane.log_heads ORDER BY log",
    );
    assert!(heads.contains("audit="), "{heads}");
    let state = psql(
        &db.0,
        "SELECT count(*) FROM powerplane.collections WHERE collection <> ''",
    );
    assert_ne!(state, "0");

    // a restart restores what the first run left
    let again = powerplane()
        .args(["serve", "--run-for-s", "0.5", "--config"])
        .arg(&config)
        .output()
        .expect("serve again");
    let log = String::from_utf8_lossy(&again.stderr);
    assert!(again.status.success(), "{log}");
    assert!(
        log.contains("restored from the store store=\"postgres\" caps=192"),
        "{log}"
    );

    // the report reads the ledger from PostgreSQL through the config
    let report = powerplane()
        .args(["report", "--format", "json", "--config"])
        .arg(&config)
        .output()
        .expect("report");
    assert!(
        report.status.success(),
        "{}",
        String::from_utf8_lossy(&report.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&report.stdout).expect("json");
    assert!(v.is_object(), "{v}");
}
