//! The check against the damage an operator meets: an empty file, a truncated one,
//! garbage in the middle, a crash; the file's bytes are never changed.

use std::path::Path;

use super::*;
use crate::store::embedded::EmbeddedBackend;
use crate::store::{Backend, Batch, Op};

/// A store of 1,200 records and a 1,200-entry log, closed cleanly.
fn real_store(path: &Path) {
    let mut b = EmbeddedBackend::open(path).expect("a new store");
    for chunk in 0..12 {
        let mut ops = Vec::new();
        for i in 0..100 {
            let n = chunk * 100 + i;
            ops.push(Op::Put {
                collection: "jobs".into(),
                key: format!("slurm:{n}"),
                value: format!("{{\"id\":\"slurm:{n}\",\"pad\":\"{}\"}}", "x".repeat(300))
                    .into_bytes(),
            });
            ops.push(Op::Append {
                log: "audit".into(),
                value: vec![n as u8; 200],
            });
        }
        b.commit(&Batch { ops }).expect("commit");
    }
}

fn refused(path: &Path, says: &str) {
    let before = std::fs::read(path).expect("file");
    let e = check(path)
        .expect_err("a damaged file is refused")
        .to_string();
    assert!(e.contains(says), "{e}");
    assert!(e.contains(&path.display().to_string()), "{e}");
    assert!(e.contains("Move it aside"), "{e}");
    let e = EmbeddedBackend::open(path)
        .err()
        .expect("open refuses it too")
        .to_string();
    assert!(e.contains(says), "{e}");
    assert_eq!(
        std::fs::read(path).expect("file"),
        before,
        "the file is untouched"
    );
}

#[test]
fn a_sound_store_checks_ok_and_a_missing_one_is_to_be_created() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = dir.path().join("s.redb");
    assert_eq!(check(&p).expect("check"), Checked::Missing);
    real_store(&p);
    let before = std::fs::read(&p).expect("file");
    let checked = check(&p).expect("check");
    assert_eq!(
        checked,
        Checked::Sound {
            tables: 2,
            rows: 2400,
            recovers: false
        }
    );
    assert_eq!(std::fs::read(&p).expect("file"), before);
    let mut b = EmbeddedBackend::open(&p).expect("open");
    assert_eq!(b.list("jobs").expect("jobs").len(), 1200);
    // while it is open, the check does not take it from its owner
    assert_eq!(check(&p).expect("check"), Checked::InUse);
}

#[test]
fn an_empty_file_is_refused_not_taken_for_a_new_store() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = dir.path().join("s.redb");
    std::fs::write(&p, b"").expect("file");
    refused(&p, "is empty (0 bytes)");
}

#[test]
fn a_truncated_file_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = dir.path().join("s.redb");
    real_store(&p);
    let bytes = std::fs::read(&p).expect("file");
    std::fs::write(&p, &bytes[..bytes.len() / 2]).expect("truncate");
    refused(&p, "is damaged");
}

#[test]
fn garbage_in_the_middle_is_refused_without_a_panic() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = dir.path().join("s.redb");
    real_store(&p);
    let mut bytes = std::fs::read(&p).expect("file");
    let mid = bytes.len() / 2 - 32 * 1024;
    let mut x = 0x2545_f491_4f6c_dd1d_u64;
    for b in &mut bytes[mid..mid + 64 * 1024] {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
    std::fs::write(&p, &bytes).expect("garbage");
    refused(&p, "its pages are corrupted");
}

#[test]
fn a_header_overwritten_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = dir.path().join("s.redb");
    real_store(&p);
    let mut bytes = std::fs::read(&p).expect("file");
    bytes[..4096].fill(0);
    std::fs::write(&p, &bytes).expect("zeros");
    refused(&p, "does not start with redb's header");
}

#[test]
fn a_store_a_crash_left_is_checked_on_a_shadow_then_recovered() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = dir.path().join("s.redb");
    let crashed = dir.path().join("crashed.redb");
    real_store(&p);
    {
        // a copy taken while it is open for writing is the file a kill -9 leaves
        let mut b = EmbeddedBackend::open(&p).expect("open");
        b.commit(&Batch {
            ops: vec![Op::Put {
                collection: "jobs".into(),
                key: "slurm:last".into(),
                value: b"{}".to_vec(),
            }],
        })
        .expect("commit");
        std::fs::copy(&p, &crashed).expect("copy");
    }
    let before = std::fs::read(&crashed).expect("file");
    let checked = check(&crashed).expect("check");
    assert!(
        matches!(checked, Checked::Sound { recovers: true, .. }),
        "{checked:?}"
    );
    assert_eq!(
        std::fs::read(&crashed).expect("file"),
        before,
        "the check repairs the shadow, never the file"
    );
    let mut b = EmbeddedBackend::open(&crashed).expect("recovered");
    assert_eq!(b.list("jobs").expect("jobs").len(), 1201);
}
