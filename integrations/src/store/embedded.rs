//! The embedded store: one redb file, the default when no Redis is configured.
//!
//! Each collection is a table `c:{name}` (string key → bytes); each log a table
//! `log:{name}` (sequence number → bytes). A batch is one write transaction, durable
//! when `commit` returns. The file is checked before it is opened for writing
//! ([`check`]): a damaged one is refused, untouched.

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
    db: Database,
}

fn err(what: impl Into<String>) -> impl FnOnce(redb::Error) -> StoreError {
    let what = what.into();
    move |e| StoreError::backend(NAME, what, e)
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
        let opened =
            check::guarded(|| Database::create(path)).map_err(|p| StoreError::Backend {
                backend: NAME,
                message: format!("opening {} panicked: {p}", path.display()),
                source: None,
            })?;
        let db = opened.map_err(|e| match e {
            redb::DatabaseError::DatabaseAlreadyOpen => already_open(path),
            e => err(format!("cannot open {}", path.display()))(e.into()),
        })?;
        Ok(EmbeddedBackend { db })
    }

    fn commit_inner(&mut self, batch: &Batch) -> Result<Vec<u64>, redb::Error> {
        let txn = self.db.begin_write()?;
        let mut seqs = Vec::new();
        for op in &batch.ops {
            match op {
                Op::Put {
                    collection,
                    key,
                    value,
                } => {
                    let name = coll_def(collection);
                    let mut t = txn.open_table(TableDefinition::<&str, &[u8]>::new(&name))?;
                    t.insert(key.as_str(), value.as_slice())?;
                }
                Op::Delete { collection, key } => {
                    let name = coll_def(collection);
                    let mut t = txn.open_table(TableDefinition::<&str, &[u8]>::new(&name))?;
                    t.remove(key.as_str())?;
                }
                // one controller per file (the file is locked): nothing to fence
                Op::Fence { .. } => {}
                Op::Append { log, value } => {
                    let name = log_def(log);
                    let mut t = txn.open_table(TableDefinition::<u64, &[u8]>::new(&name))?;
                    let seq = t.len()? + 1;
                    t.insert(seq, value.as_slice())?;
                    seqs.push(seq);
                }
            }
        }
        txn.commit()?;
        Ok(seqs)
    }
}

impl Backend for EmbeddedBackend {
    fn commit(&mut self, batch: &Batch) -> Result<Vec<u64>, StoreError> {
        self.commit_inner(batch).map_err(err("commit batch"))
    }

    fn get(&mut self, collection: &str, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let inner = || -> Result<Option<Vec<u8>>, redb::Error> {
            let txn = self.db.begin_read()?;
            let name = coll_def(collection);
            let t = match txn.open_table(TableDefinition::<&str, &[u8]>::new(&name)) {
                Ok(t) => t,
                Err(TableError::TableDoesNotExist(_)) => return Ok(None),
                Err(e) => return Err(e.into()),
            };
            Ok(t.get(key)?.map(|v| v.value().to_vec()))
        };
        inner().map_err(err(format!("get {collection}/{key}")))
    }

    fn list(&mut self, collection: &str) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        let inner = || -> Result<Vec<(String, Vec<u8>)>, redb::Error> {
            let txn = self.db.begin_read()?;
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
        inner().map_err(err(format!("list {collection}")))
    }

    fn read_log(
        &mut self,
        log: &str,
        from: u64,
        limit: usize,
    ) -> Result<Vec<(u64, Vec<u8>)>, StoreError> {
        let inner = || -> Result<Vec<(u64, Vec<u8>)>, redb::Error> {
            let txn = self.db.begin_read()?;
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
        inner().map_err(err(format!("read log {log}")))
    }

    fn log_len(&mut self, log: &str) -> Result<u64, StoreError> {
        let inner = || -> Result<u64, redb::Error> {
            let txn = self.db.begin_read()?;
            let name = log_def(log);
            match txn.open_table(TableDefinition::<u64, &[u8]>::new(&name)) {
                Ok(t) => Ok(t.len()?),
                Err(TableError::TableDoesNotExist(_)) => Ok(0),
                Err(e) => Err(e.into()),
            }
        };
        inner().map_err(err(format!("length of log {log}")))
    }

    fn name(&self) -> &'static str {
        NAME
    }
}
