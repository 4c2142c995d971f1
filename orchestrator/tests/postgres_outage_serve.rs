//! `powerplane serve` with a PostgreSQL store through an outage of the database: the
//! test's own PostgreSQL (tests/src/pg_server.rs) is stopped as a crash would
//! (`pg_ctl stop -m immediate`), the policy changes during the outage (the caps move),
//! serve is stopped with SIGTERM during the outage, the database comes back and serve
//! starts again: PostgreSQL then holds what serve decided and actuated during the
//! outage, every decision once, the audit log numbered without gaps.

#[path = "../../tests/src/pg_server.rs"]
#[allow(dead_code)]
mod pg_server;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use integrations::store::postgres::PostgresBackend;
use integrations::store::Store;
use pg_server::PgServer;

fn powerplane() -> Command {
    Command::new(env!("CARGO_BIN_EXE_powerplane"))
}

fn pg_store(server: &PgServer) -> Store {
    Store::new(Box::new(
        PostgresBackend::connect(&server.url(), "powerplane")
            .expect("connect to the test's postgres"),
    ))
}

/// Log lines of decisions (serve logs each with its rule, target and action).
fn decisions_logged(log: &str) -> usize {
    log.lines()
        .filter(|l| l.contains(" rule=") && l.contains(" target=") && l.contains(" action="))
        .count()
}

fn wait_for(what: &str, within: Duration, mut done: impl FnMut() -> bool, log: &Path) {
    let t = Instant::now();
    while !done() {
        assert!(
            t.elapsed() < within,
            "{what} within {within:?}; serve's log:\n{}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn serve_stopped_during_a_postgres_outage_loses_nothing_it_decided() {
    let mut server = PgServer::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace");
    std::fs::copy(root.join("examples/demo/site.toml"), d.join("site.toml")).expect("site");
    std::fs::copy(
        root.join("examples/demo/policy.toml"),
        d.join("policy.toml"),
    )
    .expect("policy");
    // no telemetry: the budget rule assumes the worst of every stale GPU and caps all
    let config = d.join("powerplane.toml");
    std::fs::write(
        &config,
        format!(
            "[controller]\nsite = \"site.toml\"\npolicy = \"policy.toml\"\ntick_s = 0.5\npolicy_reload_s = 0.5\n\n[store]\nkind = \"postgres\"\nurl = \"{}\"\ntimeout_s = 0.5\n",
            server.url()
        ),
    )
    .expect("config");
    let log1 = d.join("serve1.log");
    let mut serve = powerplane()
        .args(["serve", "--run-for-s", "120", "--config"])
        .arg(&config)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log1).expect("log"))
        .spawn()
        .expect("serve");
    wait_for(
        "every GPU capped in PostgreSQL",
        Duration::from_secs(30),
        || {
            pg_store(&server)
                .state()
                .map(|st| st.caps.len() == 192)
                .unwrap_or(false)
        },
        &log1,
    );

    server.crash();
    let read_log1 = || std::fs::read_to_string(&log1).unwrap_or_default();
    let decided = decisions_logged(&read_log1());
    // during the outage the operator edits the policy (a reload, audited) and the
    // caps move
    let policy = std::fs::read_to_string(d.join("policy.toml")).expect("policy");
    std::fs::write(
        d.join("policy.toml"),
        policy.replace("[budget]\n", "[budget]\nenabled = false\n"),
    )
    .expect("edit policy");
    wait_for(
        "decisions during the outage, journaled",
        Duration::from_secs(20),
        || {
            let l = read_log1();
            decisions_logged(&l) >= decided + 6
                && l.contains("store did not take the batch; journaled")
        },
        &log1,
    );
    let term = Command::new("kill")
        .args(["-TERM", &serve.id().to_string()])
        .status()
        .expect("kill -TERM");
    assert!(term.success());
    let stopped = Instant::now();
    let status = loop {
        if let Some(s) = serve.try_wait().expect("wait") {
            break s;
        }
        assert!(
            stopped.elapsed() < Duration::from_secs(30),
            "serve did not stop within 30 s of SIGTERM:\n{}",
            read_log1()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let first = read_log1();
    assert!(status.success(), "serve stopped cleanly: {status}\n{first}");
    assert!(first.contains("postgres store unreachable"), "{first}");

    server.restart();
    // the next start replays the journal before it reads its state
    let second = powerplane()
        .args(["serve", "--run-for-s", "0", "--config"])
        .arg(&config)
        .output()
        .expect("serve again");
    let log2 = String::from_utf8_lossy(&second.stderr).to_string();
    assert!(second.status.success(), "{log2}");
    assert!(
        log2.contains("replaying the store journal left by the last run"),
        "{log2}"
    );
    let mut store = pg_store(&server);
    let audit = store.audit(1, 100_000).expect("audit");
    assert_eq!(
        audit.iter().map(|a| a.0).collect::<Vec<_>>(),
        (1..=audit.len() as u64).collect::<Vec<_>>(),
        "numbered without gaps"
    );
    assert_eq!(
        audit.len(),
        decisions_logged(&first) + decisions_logged(&log2),
        "every decision serve logged is in the audit log, once"
    );
    assert!(
        audit.iter().any(|a| a.1.rule == "policy.reload"),
        "the reload during the outage is audited"
    );
}
