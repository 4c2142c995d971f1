//! The journal file: batches the store's server did not take, in order, in one redb
//! file (each append and each removal a durable, fsync'd transaction).
//!
//! Table `batches`: sequence number → encoded batch. Table `meta`: the writer id (made
//! once, when the file is created) under which Redis records what it applied.

use std::path::{Path, PathBuf};

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use sha2::{Digest, Sha256};

use super::super::{Batch, StoreError};
use super::codec;

const NAME: &str = "journal";
const BATCHES: TableDefinition<u64, &[u8]> = TableDefinition::new("batches");
const META: TableDefinition<&str, &str> = TableDefinition::new("meta");

/// How much the journal may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Encoded size of every batch together.
    pub max_bytes: u64,
    pub max_batches: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_bytes: 1 << 30,
            max_batches: 100_000,
        }
    }
}

/// Why a batch could not be appended.
#[derive(Debug)]
pub enum AppendError {
    Full { depth: u64, bytes: u64 },
    Io(StoreError),
}

pub struct JournalFile {
    db: Database,
    path: PathBuf,
    limits: Limits,
    writer: String,
    depth: u64,
    bytes: u64,
    last_seq: u64,
}

fn io(path: &Path, what: &str) -> impl FnOnce(redb::Error) -> StoreError {
    let message = format!("{what} {}", path.display());
    move |e| StoreError::backend(NAME, message, e)
}

impl JournalFile {
    /// Opens the journal, creating it (and its writer id) if it does not exist. An
    /// existing file is checked first, as the embedded store's is: a damaged one is
    /// refused, untouched.
    pub fn open(path: &Path, limits: Limits) -> Result<Self, StoreError> {
        crate::store::embedded::check_journal(path)?;
        let db = Database::create(path).map_err(|e| io(path, "cannot open")(e.into()))?;
        let (writer, depth, bytes, last_seq) =
            Self::load(&db, path).map_err(io(path, "cannot read"))?;
        Ok(JournalFile {
            db,
            path: path.to_path_buf(),
            limits,
            writer,
            depth,
            bytes,
            last_seq,
        })
    }

    fn load(db: &Database, path: &Path) -> Result<(String, u64, u64, u64), redb::Error> {
        let txn = db.begin_write()?;
        let writer = {
            let mut meta = txn.open_table(META)?;
            let found = meta.get("writer")?.map(|v| v.value().to_string());
            match found {
                Some(w) => w,
                None => {
                    let w = new_writer_id(path);
                    meta.insert("writer", w.as_str())?;
                    w
                }
            }
        };
        let (mut depth, mut bytes, mut last_seq) = (0, 0, 0);
        {
            let batches = txn.open_table(BATCHES)?;
            for entry in batches.iter()? {
                let (k, v) = entry?;
                depth += 1;
                bytes += v.value().len() as u64;
                last_seq = k.value();
            }
        }
        txn.commit()?;
        Ok((writer, depth, bytes, last_seq))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn writer(&self) -> &str {
        &self.writer
    }

    pub fn depth(&self) -> u64 {
        self.depth
    }

    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The sequence number of the newest batch ever journaled here (0: none left).
    pub fn last_seq(&self) -> u64 {
        self.last_seq
    }

    /// Appends batch `seq` (after every batch in the journal), durably.
    pub fn append(&mut self, seq: u64, batch: &Batch) -> Result<(), AppendError> {
        let encoded = codec::encode(batch);
        let size = encoded.len() as u64;
        if self.depth + 1 > self.limits.max_batches || self.bytes + size > self.limits.max_bytes {
            return Err(AppendError::Full {
                depth: self.depth,
                bytes: self.bytes,
            });
        }
        let write = || -> Result<(), redb::Error> {
            let txn = self.db.begin_write()?;
            txn.open_table(BATCHES)?.insert(seq, encoded.as_slice())?;
            txn.commit()?;
            Ok(())
        };
        write().map_err(|e| AppendError::Io(io(&self.path, "cannot append to")(e)))?;
        self.depth += 1;
        self.bytes += size;
        self.last_seq = self.last_seq.max(seq);
        Ok(())
    }

    /// The oldest batch, with its sequence number.
    pub fn front(&self) -> Result<Option<(u64, Batch)>, StoreError> {
        let read = || -> Result<Option<(u64, Vec<u8>)>, redb::Error> {
            let txn = self.db.begin_read()?;
            let t = txn.open_table(BATCHES)?;
            let first = t.first()?.map(|(k, v)| (k.value(), v.value().to_vec()));
            Ok(first)
        };
        match read().map_err(io(&self.path, "cannot read"))? {
            None => Ok(None),
            Some((seq, bytes)) => {
                let batch = codec::decode(&bytes).map_err(|e| StoreError::Backend {
                    backend: NAME,
                    message: format!("{}: batch #{seq} is damaged: {e}", self.path.display()),
                    source: Some(Box::new(e)),
                })?;
                Ok(Some((seq, batch)))
            }
        }
    }

    /// Removes batch `seq` (once the server took it), durably.
    pub fn remove(&mut self, seq: u64) -> Result<(), StoreError> {
        let remove = || -> Result<u64, redb::Error> {
            let txn = self.db.begin_write()?;
            let size = {
                let mut t = txn.open_table(BATCHES)?;
                let removed = t.remove(seq)?;
                removed.map(|v| v.value().len() as u64).unwrap_or(0)
            };
            txn.commit()?;
            Ok(size)
        };
        let size = remove().map_err(io(&self.path, "cannot remove a batch from"))?;
        self.depth = self.depth.saturating_sub(1);
        self.bytes = self.bytes.saturating_sub(size);
        Ok(())
    }
}

/// A writer id no other journal has: a hash of the path, the process and the time.
fn new_writer_id(path: &Path) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let mut h = Sha256::new();
    h.update(path.to_string_lossy().as_bytes());
    h.update(std::process::id().to_le_bytes());
    h.update(now.to_le_bytes());
    hex::encode(&h.finalize()[..8])
}
