//! The check of an embedded store file before anything writes to it: at `serve`'s start
//! (in [`super::EmbeddedBackend::open`]) and for `serve --check`.
//!
//! redb trusts the file it opens: a zero-length file becomes a new empty store, and a
//! file damaged in its middle can panic inside redb after redb has already written to
//! it (an open for writing marks the file and, after an unclean shutdown, repairs it in
//! place). So the file is first opened read-only (which refuses a file that needs
//! recovery rather than repair it), and then checked whole on a [`Shadow`] of it, a
//! storage whose writes stay in memory: redb verifies the checksum of every page of the
//! committed trees and rebuilds its allocator there, and every row of every table is
//! read. A panic of redb's on the way is caught and reported as damage. The file itself
//! is only ever read here.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::sync::Mutex;

use redb::{
    Builder, DatabaseError, ReadTransaction, ReadableDatabase, ReadableTable,
    ReadableTableMetadata, StorageBackend, TableDefinition, TableError, TableHandle,
};

use crate::store::StoreError;

/// The first bytes of every redb file.
const MAGIC: [u8; 9] = [b'r', b'e', b'd', b'b', 0x1A, 0x0A, 0xA9, 0x0D, 0x0A];

/// redb's page cache while checking (its default is 1 GiB).
const CACHE: usize = 16 << 20;

/// What the check of a store file found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Checked {
    /// No file: `serve` creates an empty store there.
    Missing,
    /// Open in another process (a running `serve`), which checked it when it opened it:
    /// not checked again.
    InUse,
    /// A sound store.
    Sound {
        /// Its tables, and the rows in them.
        tables: usize,
        rows: u64,
        /// It was not shut down cleanly (a crash, a power loss, `kill -9`): opening it
        /// for writing rolls it back to its last commit, which the check found sound.
        recovers: bool,
    },
}

impl std::fmt::Display for Checked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Checked::Missing => write!(f, "does not exist yet: serve will create it"),
            Checked::InUse => write!(
                f,
                "open in another process (a running serve, which checked it at its start): not checked"
            ),
            Checked::Sound {
                tables,
                rows,
                recovers,
            } => {
                write!(f, "ok ({tables} tables, {rows} rows)")?;
                if *recovers {
                    write!(
                        f,
                        "; it was not shut down cleanly: serve will roll it back to its last commit"
                    )?;
                }
                Ok(())
            }
        }
    }
}

/// Which file is checked: the advice for a damaged one differs.
#[derive(Debug, Clone, Copy)]
enum Kind {
    /// The embedded store.
    Store,
    /// A Redis store's journal (`[store] journal`).
    Journal,
}

/// The error for a damaged file: what is wrong, and what the operator can do.
fn damaged(path: &Path, kind: Kind, what: impl std::fmt::Display) -> StoreError {
    let (backend, advice) = match kind {
        Kind::Store => (
            super::NAME,
            "Move it aside (keep it for inspection) and restore the store from a backup, or \
             start without one: serve then creates an empty store (caps, holds and jobs are \
             re-learned from the schedulers and telemetry; the audit and ledger history stays \
             in the moved file)",
        ),
        Kind::Journal => (
            "journal",
            "Move it aside (keep it for inspection) and start again: serve creates a new \
             journal; the batches in the moved file that Redis had not taken are not replayed",
        ),
    };
    StoreError::Backend {
        backend,
        message: format!(
            "{} is damaged: {what}. Nothing was written to it. {advice}",
            path.display()
        ),
        source: None,
    }
}

fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic".to_string())
}

/// Checks the store file at `path` without writing to it.
pub fn check(path: &Path) -> Result<Checked, StoreError> {
    check_file(path, Kind::Store)
}

/// Checks a Redis store's journal file at `path` without writing to it.
pub fn check_journal(path: &Path) -> Result<Checked, StoreError> {
    check_file(path, Kind::Journal)
}

fn check_file(path: &Path, kind: Kind) -> Result<Checked, StoreError> {
    let io = |what: &str, e: std::io::Error| StoreError::Backend {
        backend: super::NAME,
        message: format!("cannot {what} {}: {e}", path.display()),
        source: Some(Box::new(e)),
    };
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Checked::Missing),
        Err(e) => return Err(io("read", e)),
    };
    if !meta.is_file() {
        return Err(damaged(path, kind, "it is not a regular file"));
    }
    if meta.len() == 0 {
        return Err(damaged(
            path,
            kind,
            "it is empty (0 bytes), where a store holds at least its header",
        ));
    }
    let mut head = [0u8; MAGIC.len()];
    let mut file = File::open(path).map_err(|e| io("open", e))?;
    let got = file.read(&mut head).map_err(|e| io("read", e))?;
    if got < MAGIC.len() || head != MAGIC {
        return Err(damaged(
            path,
            kind,
            format!(
                "it does not start with redb's header ({} bytes, not a redb file or its start overwritten)",
                meta.len()
            ),
        ));
    }
    // read-only first: the clean-shutdown flag, the lock, the header against the length
    let clean = match guarded(|| Builder::new().set_cache_size(CACHE).open_read_only(path)) {
        Ok(Ok(db)) => {
            let rows = guarded(|| scan(&db.begin_read().map_err(redb::Error::from)?));
            drop(db);
            match rows {
                Ok(Ok(rows)) => Some(rows),
                Ok(Err(e)) => return Err(damaged(path, kind, format!("reading it failed: {e}"))),
                Err(p) => {
                    return Err(damaged(
                        path,
                        kind,
                        format!("its pages are corrupted (redb failed reading them: {p})"),
                    ))
                }
            }
        }
        Ok(Err(DatabaseError::DatabaseAlreadyOpen)) => return Ok(Checked::InUse),
        Ok(Err(DatabaseError::RepairAborted)) => None,
        Ok(Err(e)) => return Err(damaged(path, kind, e)),
        Err(p) => {
            return Err(damaged(
                path,
                kind,
                format!("its header is corrupted (redb failed opening it: {p})"),
            ))
        }
    };
    // then whole, with every page's checksum, on a shadow of the file
    let shadow = Shadow::new(file, meta.len());
    let verified = guarded(|| -> Result<(usize, u64), redb::Error> {
        let db = Builder::new()
            .set_cache_size(CACHE)
            .set_check_integrity_on_open(true)
            .create_with_backend(shadow)?;
        let rows = scan(&db.begin_read()?)?;
        Ok(rows)
    });
    let (tables, rows) = match verified {
        Ok(Ok(found)) => found,
        Ok(Err(e)) => return Err(damaged(path, kind, e)),
        Err(p) => {
            return Err(damaged(
                path,
                kind,
                format!("its pages are corrupted (redb failed checking them: {p})"),
            ))
        }
    };
    match clean {
        // a clean file whose check had to fall back to an older commit lost its last one
        Some(read) if read != (tables, rows) => Err(damaged(
            path,
            kind,
            format!(
                "its last commit is damaged ({} tables, {} rows read; {tables} tables, {rows} rows in the commit before)",
                read.0, read.1
            ),
        )),
        _ => Ok(Checked::Sound {
            tables,
            rows,
            recovers: clean.is_none(),
        }),
    }
}

/// The thread [`guarded`] runs redb on: its panics are reported as errors, not printed.
const GUARDED: &str = "embedded store check";

/// Why a [`guarded`] call gave no value.
#[derive(Debug, thiserror::Error)]
pub(super) enum Guarded {
    /// It panicked: the panic's text.
    #[error("{0}")]
    Panicked(String),
    #[error("cannot start the check's thread: {0}")]
    NoThread(#[source] std::io::Error),
}

/// Runs `f`, a redb call on a file that may be damaged, turning a panic into an error
/// with its text. It runs on a thread of its own whose panics the panic hook does not
/// print (the error that names the file says it), other threads' as before.
pub(super) fn guarded<T: Send>(f: impl FnOnce() -> T + Send) -> Result<T, Guarded> {
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if std::thread::current().name() != Some(GUARDED) {
                previous(info);
            }
        }));
    });
    std::thread::scope(|scope| {
        let run = std::thread::Builder::new()
            .name(GUARDED.to_string())
            .spawn_scoped(scope, || catch_unwind(AssertUnwindSafe(f)));
        match run {
            Ok(handle) => handle
                .join()
                .unwrap_or_else(Err)
                .map_err(|p| Guarded::Panicked(panic_text(p.as_ref()))),
            Err(e) => Err(Guarded::NoThread(e)),
        }
    })
}

/// Reads every row of every table; the tables and the rows.
fn scan(txn: &ReadTransaction) -> Result<(usize, u64), redb::Error> {
    let mut tables = 0;
    let mut rows = 0u64;
    for handle in txn.list_tables()? {
        let name = handle.name().to_string();
        tables += 1;
        // the shapes of the store's tables (`c:*`, `log:*`) and of the journal's
        let n = match rows_of::<&'static str, &'static [u8]>(txn, &name)? {
            Some(n) => Some(n),
            None => match rows_of::<u64, &'static [u8]>(txn, &name)? {
                Some(n) => Some(n),
                None => rows_of::<&'static str, &'static str>(txn, &name)?,
            },
        };
        rows += n.ok_or_else(|| {
            redb::StorageError::Corrupted(format!("table {name} is of no known shape"))
        })?;
    }
    Ok((tables, rows))
}

/// The rows of table `name` read one by one, if it is of this shape.
fn rows_of<K: redb::Key + 'static, V: redb::Value + 'static>(
    txn: &ReadTransaction,
    name: &str,
) -> Result<Option<u64>, redb::Error> {
    let t = match txn.open_table(TableDefinition::<K, V>::new(name)) {
        Ok(t) => t,
        Err(TableError::TableTypeMismatch { .. }) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let mut n = 0u64;
    for row in t.iter()? {
        let (k, v) = row?;
        drop((k.value(), v.value()));
        n += 1;
    }
    if n != t.len()? {
        return Err(redb::StorageError::Corrupted(format!(
            "table {name} holds {n} rows where its length says {}",
            t.len()?
        ))
        .into());
    }
    Ok(Some(n))
}

const BLOCK: u64 = 4096;

/// A store file seen through an overlay: reads come from the file (opened read-only),
/// writes stay in memory, so that redb can check and repair it without changing it.
#[derive(Debug)]
pub(super) struct Shadow {
    inner: Mutex<ShadowState>,
}

#[derive(Debug)]
struct ShadowState {
    file: File,
    /// The bytes of the file still visible (a `set_len` below it hides the rest).
    file_len: u64,
    len: u64,
    /// Written blocks, by index.
    blocks: BTreeMap<u64, Vec<u8>>,
}

impl Shadow {
    pub(super) fn new(file: File, len: u64) -> Self {
        Shadow {
            inner: Mutex::new(ShadowState {
                file,
                file_len: len,
                len,
                blocks: BTreeMap::new(),
            }),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, ShadowState> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl ShadowState {
    /// Block `i` as it reads now.
    fn block(&mut self, i: u64) -> std::io::Result<Vec<u8>> {
        if let Some(b) = self.blocks.get(&i) {
            return Ok(b.clone());
        }
        let mut b = vec![0u8; BLOCK as usize];
        let start = i * BLOCK;
        if start < self.file_len {
            let n = (self.file_len - start).min(BLOCK) as usize;
            self.file.seek(SeekFrom::Start(start))?;
            self.file.read_exact(&mut b[..n])?;
        }
        Ok(b)
    }
}

fn out_of_range(offset: u64, len: usize, size: u64) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::UnexpectedEof,
        format!("read of {len} bytes at {offset} past the end of the file ({size} bytes)"),
    )
}

impl StorageBackend for Shadow {
    fn len(&self) -> Result<u64, std::io::Error> {
        Ok(self.state().len)
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), std::io::Error> {
        let mut s = self.state();
        let end = offset + out.len() as u64;
        if end > s.len {
            return Err(out_of_range(offset, out.len(), s.len));
        }
        let mut at = offset;
        while at < end {
            let i = at / BLOCK;
            let within = (at % BLOCK) as usize;
            let n = ((BLOCK as usize) - within).min((end - at) as usize);
            let b = s.block(i)?;
            let o = (at - offset) as usize;
            out[o..o + n].copy_from_slice(&b[within..within + n]);
            at += n as u64;
        }
        Ok(())
    }

    fn set_len(&self, len: u64) -> Result<(), std::io::Error> {
        let mut s = self.state();
        if len < s.len {
            // the bytes cut off read as zeros if the length grows again
            let keep = len.div_ceil(BLOCK);
            s.blocks.retain(|i, _| *i < keep);
            if !len.is_multiple_of(BLOCK) {
                let i = len / BLOCK;
                let mut b = s.block(i)?;
                b[(len % BLOCK) as usize..].fill(0);
                s.blocks.insert(i, b);
            }
            s.file_len = s.file_len.min(len);
        }
        s.len = len;
        Ok(())
    }

    fn sync_data(&self) -> Result<(), std::io::Error> {
        Ok(())
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), std::io::Error> {
        let mut s = self.state();
        let end = offset + data.len() as u64;
        let mut at = offset;
        while at < end {
            let i = at / BLOCK;
            let within = (at % BLOCK) as usize;
            let n = ((BLOCK as usize) - within).min((end - at) as usize);
            let mut b = s.block(i)?;
            let o = (at - offset) as usize;
            b[within..within + n].copy_from_slice(&data[o..o + n]);
            s.blocks.insert(i, b);
            at += n as u64;
        }
        s.len = s.len.max(end);
        Ok(())
    }
}

#[cfg(test)]
#[path = "check_tests.rs"]
mod tests;
