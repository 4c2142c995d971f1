//! The embedded store: one redb file, the default when no Redis is configured.
//!
//! Each collection is a table `c:{name}` (string key → bytes); each log a table
//! `log:{name}` (sequence number → bytes). A batch is one write transaction, durable
//! when `commit` returns; each table it writes is opened once. Behind a journal
//! (`[store] journal`), the last batch of the journal's writer is recorded in the same
//! transaction (`c:_applied`), so a replay after a crash applies nothing twice. The file is checked before it is opened for writing
//! ([`check`]): a damaged one is refused, untouched.
//!
//! An I/O error (a full disk, a failing device) poisons redb's handle: every later
//! transaction fails with "Previous I/O error occurred". The backend then closes the
//! file and opens it again before the next call, so that once the disk can take
//! writes again the writes that waited are committed; every error names its cause
//! ("No space left on device").

mod check;

use std::path::Path;

use crate::store::{Backend, Batch, Op, StoreError};
use tracing::warn;

use redb::{
    Database, ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition, TableError,
};

pub use check::{check, check_journal, Checked};

const NAME: &str = "embedded";

pub struct EmbeddedBackend {
    /// `None` between an I/O error and the reopening that follows it.
    db: Option<Database>,
    path: std::path::PathBuf,
    /// Times the file was reopened after an I/O error.
    pub reopened: u64,
}

/// The error, its cause in the message (a log line shows the message, and the cause
/// is what the operator acts on).
fn err(what: impl Into<String>) -> impl FnOnce(redb::Error) -> StoreError {
    let what = what.into();
    move |e| {
        let message = format!("{what}: {e}");
        StoreError::backend(NAME, message, e)
    }
}

/// Whether redb's handle is unusable after `e` (an I/O error, or the refusal that
/// follows one): the file must be closed and opened again.
fn poisoned(e: &redb::Error) -> bool {
    matches!(e, redb::Error::Io(_) | redb::Error::PreviousIo)
}

fn already_open(path: &Path) -> StoreError {
    StoreError::Backend {
        backend: NAME,
        message: format!(
            "{} is already open in another process (another powerplane serve?): the embedded store serves one controller; for several replicas use [store] kind = \"redis\" with [ha]",
            path.display()
        ),
        source: None,
    }
}

fn coll_def(name: &str) -> String {
    format!("c:{name}")
}

fn log_def(name: &str) -> String {
    format!("log:{name}")
}

impl EmbeddedBackend {
    /// Opens the store file, creating it if it does not exist. An existing file is
    /// checked first ([`check`]): an empty, truncated or corrupted one is refused with
    /// what is wrong, and nothing is written to it. The file is locked while open: a
    /// second controller on the same file is refused (the embedded store serves one
    /// controller; several replicas share Redis, see `[ha]`).
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        match check(path)? {
            Checked::InUse => return Err(already_open(path)),
            Checked::Sound { recovers: true, .. } => warn!(
                path = %path.display(),
                "the embedded store was not shut down cleanly; rolling it back to its last commit, which checked sound"
            ),
            Checked::Missing | Checked::Sound { .. } => {}
        }
        Ok(EmbeddedBackend {
            db: Some(Self::open_db(path)?),
            path: path.to_path_buf(),
            reopened: 0,
        })
    }

    /// Opens the file for writing, a panic of redb's caught (after an I/O error the
    /// file is reopened without the whole check: it was this process's a moment ago,
    /// and a full read at every retry of an outage would cost more than it tells).
    fn open_db(path: &Path) -> Result<Database, StoreError> {
        let opened =
            check::guarded(|| Database::create(path)).map_err(|p| StoreError::Backend {
                backend: NAME,
                message: format!("opening {} panicked: {p}", path.display()),
                source: None,
            })?;
        opened.map_err(|e| match e {
            redb::DatabaseError::DatabaseAlreadyOpen => already_open(path),
            e => err(format!("cannot open {}", path.display()))(e.into()),
        })
    }

    /// The open database; after an I/O error, the file opened again (an error while
    /// it cannot be).
    fn db(&mut self) -> Result<&Database, StoreError> {
        if self.db.is_none() {
            let db = Self::open_db(&self.path)?;
            self.reopened += 1;
            warn!(file = %self.path.display(), reopened = self.reopened, "embedded store reopened after an I/O error");
            self.db = Some(db);
        }
        Ok(self.db.as_ref().expect("just opened"))
    }

    /// `e`, after which the handle is dropped when it is poisoned (the file is
    /// reopened on the next call).
    fn failed(&mut self, e: redb::Error) -> redb::Error {
        if poisoned(&e) {
            self.db = None;
        }
        e
    }

    fn commit_inner(
        db: &Database,
        batch: &Batch,
        once: Option<(&str, u64)>,
    ) -> Result<Option<Vec<u64>>, redb::Error> {
        let txn = db.begin_write()?;
        if let Some((writer, seq)) = once {
            let mut t = txn.open_table(TableDefinition::<&str, &[u8]>::new(APPLIED))?;
            let last = t.get(writer)?.map(|v| applied_seq(v.value())).unwrap_or(0);
            if last >= seq {
                // this batch (or a later one of the same writer) is in the file already
                drop(t);
                txn.abort()?;
                return Ok(None);
            }
            t.insert(writer, seq.to_le_bytes().as_slice())?;
        }
        let seqs = Self::apply(&txn, batch)?;
        txn.commit()?;
        Ok(Some(seqs))
    }

    /// The batch's ops in `txn`, each table opened once (a tick that changes 100,000
    /// caps opens the caps table once, not 100,000 times).
    fn apply(txn: &redb::WriteTransaction, batch: &Batch) -> Result<Vec<u64>, redb::Error> {
        use std::collections::HashMap;
        let mut colls: HashMap<&str, redb::Table<&str, &[u8]>> = HashMap::new();
        let mut logs: HashMap<&str, (redb::Table<u64, &[u8]>, u64)> = HashMap::new();
        let mut seqs = Vec::new();
        for op in &batch.ops {
            match op {
                Op::Put {
                    collection,
                    key,
                    value,
                } => {
                    let t = match colls.entry(collection.as_str()) {
                        std::collections::hash_map::Entry::Occupied(o) => o.into_mut(),
                        std::collections::hash_map::Entry::Vacant(v) => v.insert(txn.open_table(
                            TableDefinition::<&str, &[u8]>::new(&coll_def(collection)),
                        )?),
                    };
                    t.insert(key.as_str(), value.as_slice())?;
                }
                Op::Delete { collection, key } => {
                    let t = match colls.entry(collection.as_str()) {
                        std::collections::hash_map::Entry::Occupied(o) => o.into_mut(),
                        std::collections::hash_map::Entry::Vacant(v) => v.insert(txn.open_table(
                            TableDefinition::<&str, &[u8]>::new(&coll_def(collection)),
                        )?),
                    };
                    t.remove(key.as_str())?;
                }
                // one controller per file (the file is locked): nothing to fence
                Op::Fence { .. } => {}
                Op::Append { log, value } => {
                    let (t, len) = match logs.entry(log.as_str()) {
                        std::collections::hash_map::Entry::Occupied(o) => o.into_mut(),
                        std::collections::hash_map::Entry::Vacant(v) => {
                            let t =
                                txn.open_table(TableDefinition::<u64, &[u8]>::new(&log_def(log)))?;
                            let len = t.len()?;
                            v.insert((t, len))
                        }
                    };
                    *len += 1;
                    t.insert(*len, value.as_slice())?;
                    seqs.push(*len);
                }
            }
        }
        Ok(seqs)
    }
}

/// The collection that records, per journal writer, the last batch applied with
/// [`Backend::commit_once`] (8 bytes, little-endian), in the same transaction as the
/// batch.
const APPLIED: &str = "c:_applied";

fn applied_seq(v: &[u8]) -> u64 {
    v.try_into().map(u64::from_le_bytes).unwrap_or(0)
}

impl Backend for EmbeddedBackend {
    fn commit(&mut self, batch: &Batch) -> Result<Vec<u64>, StoreError> {
        let r = Self::commit_inner(self.db()?, batch, None);
        r.map(Option::unwrap_or_default)
            .map_err(|e| self.failed(e))
            .map_err(err("commit batch"))
    }

    fn commit_once(&mut self, writer: &str, seq: u64, batch: &Batch) -> Result<bool, StoreError> {
        let r = Self::commit_inner(self.db()?, batch, Some((writer, seq)));
        r.map(|applied| applied.is_some())
            .map_err(|e| self.failed(e))
            .map_err(err("commit batch"))
    }

    fn applied(&mut self, writer: &str) -> Result<u64, StoreError> {
        let db = self.db()?;
        let inner = || -> Result<u64, redb::Error> {
            let txn = db.begin_read()?;
            let t = match txn.open_table(TableDefinition::<&str, &[u8]>::new(APPLIED)) {
                Ok(t) => t,
                Err(TableError::TableDoesNotExist(_)) => return Ok(0),
                Err(e) => return Err(e.into()),
            };
            Ok(t.get(writer)?.map(|v| applied_seq(v.value())).unwrap_or(0))
        };
        let r = inner();
        r.map_err(|e| self.failed(e))
            .map_err(err(format!("applied batches of {writer}")))
    }

    fn get(&mut self, collection: &str, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let db = self.db()?;
        let inner = || -> Result<Option<Vec<u8>>, redb::Error> {
            let txn = db.begin_read()?;
            let name = coll_def(collection);
            let t = match txn.open_table(TableDefinition::<&str, &[u8]>::new(&name)) {
                Ok(t) => t,
                Err(TableError::TableDoesNotExist(_)) => return Ok(None),
                Err(e) => return Err(e.into()),
            };
            Ok(t.get(key)?.map(|v| v.value().to_vec()))
        };
        let r = inner();
        r.map_err(|e| self.failed(e))
            .map_err(err(format!("get {collection}/{key}")))
    }

    fn list(&mut self, collection: &str) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        let db = self.db()?;
        let inner = || -> Result<Vec<(String, Vec<u8>)>, redb::Error> {
            let txn = db.begin_read()?;
            let name = coll_def(collection);
            let t = match txn.open_table(TableDefinition::<&str, &[u8]>::new(&name)) {
                Ok(t) => t,
                Err(TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
                Err(e) => return Err(e.into()),
            };
            let mut out = Vec::new();
            for row in t.iter()? {
                let (k, v) = row?;
                out.push((k.value().to_string(), v.value().to_vec()));
            }
            Ok(out)
        };
        let r = inner();
        r.map_err(|e| self.failed(e))
            .map_err(err(format!("list {collection}")))
    }

    fn read_log(
        &mut self,
        log: &str,
        from: u64,
        limit: usize,
    ) -> Result<Vec<(u64, Vec<u8>)>, StoreError> {
        let db = self.db()?;
        let inner = || -> Result<Vec<(u64, Vec<u8>)>, redb::Error> {
            let txn = db.begin_read()?;
            let name = log_def(log);
            let t = match txn.open_table(TableDefinition::<u64, &[u8]>::new(&name)) {
                Ok(t) => t,
                Err(TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
                Err(e) => return Err(e.into()),
            };
            let mut out = Vec::new();
            for row in t.range(from.max(1)..)?.take(limit) {
                let (k, v) = row?;
                out.push((k.value(), v.value().to_vec()));
            }
            Ok(out)
        };
        let r = inner();
        r.map_err(|e| self.failed(e))
            .map_err(err(format!("read log {log}")))
    }

    fn log_len(&mut self, log: &str) -> Result<u64, StoreError> {
        let db = self.db()?;
        let inner = || -> Result<u64, redb::Error> {
            let txn = db.begin_read()?;
            let name = log_def(log);
            match txn.open_table(TableDefinition::<u64, &[u8]>::new(&name)) {
                Ok(t) => Ok(t.len()?),
                Err(TableError::TableDoesNotExist(_)) => Ok(0),
                Err(e) => Err(e.into()),
            }
        };
        let r = inner();
        r.map_err(|e| self.failed(e))
            .map_err(err(format!("length of log {log}")))
    }

    fn name(&self) -> &'static str {
        NAME
    }
}
