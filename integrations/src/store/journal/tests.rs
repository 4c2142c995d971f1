//! The journal's promises against a fake server that fails on demand: order kept,
//! nothing applied twice, a full journal refuses, a reopened journal replays.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use super::{Journaled, Limits};
use crate::store::{Backend, Batch, Op, StoreError};

/// What the fake server holds: the batches applied, in order, and per writer the last
/// sequence number.
#[derive(Default)]
struct Server {
    applied: Vec<Batch>,
    last: BTreeMap<String, u64>,
}

#[derive(Clone, Default)]
struct Fake {
    server: Arc<Mutex<Server>>,
    down: Arc<AtomicBool>,
}

impl Fake {
    fn check(&self) -> Result<(), StoreError> {
        if self.down.load(Ordering::SeqCst) {
            return Err(StoreError::Backend {
                backend: "fake",
                message: "down".into(),
                source: None,
            });
        }
        Ok(())
    }

    fn applied(&self) -> Vec<Batch> {
        self.server.lock().expect("lock").applied.clone()
    }
}

impl Backend for Fake {
    fn commit(&mut self, batch: &Batch) -> Result<Vec<u64>, StoreError> {
        self.check()?;
        self.server
            .lock()
            .expect("lock")
            .applied
            .push(batch.clone());
        Ok(Vec::new())
    }

    fn commit_once(&mut self, writer: &str, seq: u64, batch: &Batch) -> Result<bool, StoreError> {
        self.check()?;
        let mut s = self.server.lock().expect("lock");
        if s.last.get(writer).is_some_and(|&l| l >= seq) {
            return Ok(false);
        }
        s.last.insert(writer.to_string(), seq);
        s.applied.push(batch.clone());
        Ok(true)
    }

    fn applied(&mut self, writer: &str) -> Result<u64, StoreError> {
        self.check()?;
        Ok(self
            .server
            .lock()
            .expect("lock")
            .last
            .get(writer)
            .copied()
            .unwrap_or(0))
    }

    fn get(&mut self, _: &str, _: &str) -> Result<Option<Vec<u8>>, StoreError> {
        self.check().map(|_| None)
    }

    fn list(&mut self, _: &str) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        self.check().map(|_| Vec::new())
    }

    fn read_log(&mut self, _: &str, _: u64, _: usize) -> Result<Vec<(u64, Vec<u8>)>, StoreError> {
        self.check().map(|_| Vec::new())
    }

    fn log_len(&mut self, _: &str) -> Result<u64, StoreError> {
        self.check().map(|_| 0)
    }

    fn name(&self) -> &'static str {
        "fake"
    }
}

fn batch(i: u8) -> Batch {
    Batch {
        ops: vec![Op::Append {
            log: "audit".into(),
            value: vec![i],
        }],
    }
}

/// A journal path of its own, removed when dropped.
struct Path(PathBuf);

impl Path {
    fn new(test: &str) -> Path {
        let p = std::env::temp_dir().join(format!(
            "powerplane-journal-{}-{test}.redb",
            std::process::id()
        ));
        let _ = std::fs::remove_file(&p);
        Path(p)
    }
}

impl Drop for Path {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[test]
fn batches_reach_the_server_in_order_through_an_outage() {
    let path = Path::new("order");
    let fake = Fake::default();
    let mut j = Journaled::open(Box::new(fake.clone()), &path.0, Limits::default()).expect("open");
    j.commit(&batch(0)).expect("up");
    fake.down.store(true, Ordering::SeqCst);
    for i in 1..5 {
        j.commit(&batch(i)).expect("journaled");
    }
    assert_eq!(j.depth(), 4);
    assert!(
        j.log_len("audit").is_err(),
        "no stale read while batches wait"
    );
    fake.down.store(false, Ordering::SeqCst);
    j.commit(&batch(5)).expect("up again");
    assert_eq!(j.depth(), 0);
    assert_eq!(fake.applied(), (0..6).map(batch).collect::<Vec<_>>());
    let h = j.health().expect("health");
    assert_eq!(h.journaled.load(Ordering::Relaxed), 4);
    assert_eq!(h.replayed.load(Ordering::Relaxed), 4);
}

#[test]
fn a_reopened_journal_replays_and_numbers_on_without_duplicates() {
    let path = Path::new("reopen");
    let fake = Fake::default();
    {
        let mut j =
            Journaled::open(Box::new(fake.clone()), &path.0, Limits::default()).expect("open");
        j.commit(&batch(0)).expect("up");
        fake.down.store(true, Ordering::SeqCst);
        j.commit(&batch(1)).expect("journaled");
        j.commit(&batch(2)).expect("journaled");
        // the server took batch 1 (seq 2) already: a replay committed it and the
        // process died before removing it from the journal
        let writer = j.writer().to_string();
        fake.down.store(false, Ordering::SeqCst);
        let mut direct = fake.clone();
        assert!(direct.commit_once(&writer, 2, &batch(1)).expect("direct"));
    }
    let mut j =
        Journaled::open(Box::new(fake.clone()), &path.0, Limits::default()).expect("reopen");
    assert_eq!(j.depth(), 0, "replayed at open");
    j.commit(&batch(3)).expect("after");
    assert_eq!(
        fake.applied(),
        (0..4).map(batch).collect::<Vec<_>>(),
        "batch 1 once, then 2 and 3"
    );
    let h = j.health().expect("health");
    assert_eq!(h.duplicates_skipped.load(Ordering::Relaxed), 1);
}

#[test]
fn a_full_journal_refuses_and_takes_again_once_drained() {
    let path = Path::new("full");
    let fake = Fake::default();
    let limits = Limits {
        max_batches: 2,
        max_bytes: 1 << 20,
    };
    let mut j = Journaled::open(Box::new(fake.clone()), &path.0, limits).expect("open");
    fake.down.store(true, Ordering::SeqCst);
    j.commit(&batch(0)).expect("journaled");
    j.commit(&batch(1)).expect("journaled");
    let err = j.commit(&batch(2)).expect_err("full");
    assert!(err.to_string().contains("is full (2 batches"), "{err}");
    let h = j.health().expect("health");
    assert_eq!(h.journal_full.load(Ordering::Relaxed), 1);
    fake.down.store(false, Ordering::SeqCst);
    // the caller retries the refused batch
    j.commit(&batch(2)).expect("up again");
    assert_eq!(fake.applied(), (0..3).map(batch).collect::<Vec<_>>());
}

#[test]
fn the_size_bound_counts_bytes() {
    let path = Path::new("bytes");
    let fake = Fake::default();
    let limits = Limits {
        max_batches: 1000,
        max_bytes: 40,
    };
    let mut j = Journaled::open(Box::new(fake.clone()), &path.0, limits).expect("open");
    fake.down.store(true, Ordering::SeqCst);
    let mut taken = 0;
    while j.commit(&batch(taken)).is_ok() {
        taken += 1;
        assert!(taken < 100, "never full");
    }
    // each entry: version, tag, two length-prefixed fields (5 + 1 bytes) = 17 bytes
    assert_eq!(taken, 2);
}

#[test]
fn a_damaged_journal_is_refused_and_left_as_it_was() {
    let path = Path::new("damaged");
    let fake = Fake::default();
    {
        let mut j =
            Journaled::open(Box::new(fake.clone()), &path.0, Limits::default()).expect("open");
        fake.down.store(true, Ordering::SeqCst);
        for i in 0..3 {
            j.commit(&batch(i)).expect("journaled");
        }
    }
    let sound = std::fs::read(&path.0).expect("journal");
    let damage: [(Vec<u8>, &str); 2] = [
        (Vec::new(), "it is empty (0 bytes)"),
        (sound[..sound.len() / 2].to_vec(), "truncated"),
    ];
    for (bytes, says) in damage {
        std::fs::write(&path.0, &bytes).expect("damage");
        let e = match Journaled::open(Box::new(fake.clone()), &path.0, Limits::default()) {
            Ok(_) => panic!("a damaged journal must be refused"),
            Err(e) => e.to_string(),
        };
        assert!(
            e.contains(&format!("{} is damaged", path.0.display())),
            "{e}"
        );
        assert!(e.contains(says), "{e}");
        assert!(e.contains("Redis had not taken"), "{e}");
        assert_eq!(std::fs::read(&path.0).expect("journal"), bytes, "untouched");
    }
    // put back, it opens and replays its three batches
    std::fs::write(&path.0, &sound).expect("restore");
    fake.down.store(false, Ordering::SeqCst);
    let j = Journaled::open(Box::new(fake.clone()), &path.0, Limits::default()).expect("open");
    assert_eq!(j.depth(), 0);
    assert_eq!(fake.applied(), (0..3).map(batch).collect::<Vec<_>>());
}
