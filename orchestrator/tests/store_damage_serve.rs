//! `powerplane serve` and `serve --check` on a damaged embedded store: a zero-length,
//! a truncated and a garbled file (64 KiB of garbage in its middle) are refused with
//! an error that names the file and what is wrong, without a panic, and the file's
//! bytes are what they were; a missing file is one serve will create.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use integrations::store::embedded::EmbeddedBackend;
use integrations::store::{Store, Tx};
use sha2::{Digest, Sha256};
use telemetry::{Job, JobState, Timestamp};

fn powerplane() -> Command {
    Command::new(env!("CARGO_BIN_EXE_powerplane"))
}

fn config(d: &Path) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace");
    std::fs::copy(root.join("examples/demo/site.toml"), d.join("site.toml")).expect("site");
    std::fs::copy(
        root.join("examples/demo/policy.toml"),
        d.join("policy.toml"),
    )
    .expect("policy");
    let cfg = d.join("powerplane.toml");
    std::fs::write(
        &cfg,
        "[controller]\nsite = \"site.toml\"\npolicy = \"policy.toml\"\ntick_s = 0.2\n\n[store]\nkind = \"embedded\"\npath = \"state.redb\"\n",
    )
    .expect("config");
    cfg
}

fn job(n: usize) -> Job {
    Job {
        id: format!("slurm:{n}"),
        scheduler: "slurm".into(),
        name: format!("train-{n}"),
        user: "ada".into(),
        project: "vision".into(),
        class: "training".into(),
        priority: 5,
        gpus: 8,
        allocated: vec![],
        state: JobState::Pending,
        submit_time: Timestamp::from_secs(1_700_000_000),
        start_time: None,
        end_time: None,
        deadline: None,
        est_duration_s: 7200.0,
        deferrable: true,
        preemptible: false,
        gpu_power_limit: None,
    }
}

/// 1,200 jobs in the store, written as serve writes them.
fn real_store(path: &Path) {
    let mut store = Store::new(Box::new(EmbeddedBackend::open(path).expect("a new store")));
    for chunk in 0..12 {
        let mut tx = Tx::new();
        for i in 0..100 {
            tx.put_job(&job(chunk * 100 + i));
        }
        store.commit(tx).expect("commit");
    }
}

fn serve(cfg: &Path, check: bool) -> Output {
    let mut cmd = powerplane();
    cmd.arg("serve");
    if check {
        cmd.arg("--check");
    } else {
        cmd.args(["--run-for-s", "1"]);
    }
    cmd.arg("--config")
        .arg(cfg)
        .output()
        .expect("powerplane runs")
}

fn sha(path: &Path) -> Vec<u8> {
    Sha256::digest(std::fs::read(path).expect("store file")).to_vec()
}

fn garble(bytes: &mut [u8]) {
    let mid = bytes.len() / 2 - 32 * 1024;
    let mut x = 0x9e37_79b9_7f4a_7c15_u64;
    for b in &mut bytes[mid..mid + 64 * 1024] {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
}

fn refused(out: &Output, db: &Path, says: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "refused, not panicked: {err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(
        err.contains(&format!("{} is damaged", db.display())),
        "{err}"
    );
    assert!(err.contains(says), "{err}");
    assert!(err.contains("Move it aside"), "{err}");
    assert!(!err.contains("restored from the store"), "{err}");
}

#[test]
fn a_damaged_store_is_refused_by_serve_and_its_check_and_left_as_it_was() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let cfg = config(d);
    let db = d.join("state.redb");

    // missing: serve --check says it will be created; serve creates it
    let out = serve(&cfg, true);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert!(
        said.contains("does not exist yet: serve will create it"),
        "{said}"
    );

    real_store(&db);
    let out = serve(&cfg, true);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert!(said.contains("state.redb: ok ("), "{said}");
    let out = serve(&cfg, false);
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{log}");
    assert!(log.contains("jobs=1200"), "{log}");
    // the store as serve left it, stopped cleanly
    let sound = std::fs::read(&db).expect("store");

    let mut garbled = sound.clone();
    garble(&mut garbled);
    let damage: [(&str, Vec<u8>, &str); 3] = [
        ("empty", Vec::new(), "it is empty (0 bytes)"),
        (
            "truncated",
            sound[..sound.len() / 2].to_vec(),
            "truncated below stored layout",
        ),
        ("garbled", garbled, "corrupted"),
    ];
    for (what, bytes, says) in damage {
        std::fs::write(&db, &bytes).expect("damage");
        let before = sha(&db);
        let out = serve(&cfg, true);
        refused(&out, &db, says);
        assert_eq!(sha(&db), before, "{what}: serve --check changed the file");
        let out = serve(&cfg, false);
        refused(&out, &db, says);
        assert_eq!(sha(&db), before, "{what}: serve changed the file");
    }
}
