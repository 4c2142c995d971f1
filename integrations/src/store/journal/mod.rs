//! The journal in front of a store's server: a batch the server cannot take is
//! appended to a local file (durably, in order) and the tick goes on; once the server
//! answers again the file is replayed, oldest first, and each batch removed only after
//! the server took it.
//!
//! Each batch carries a sequence number under this journal's writer id; the server
//! records the last one it applied in the same atomic step as the batch
//! ([`Backend::commit_once`]), so a batch replayed after a crash between the server's
//! commit and the journal's removal is skipped, not applied twice. Reads replay the
//! journal first and fail while it cannot be emptied: what is read is what was last
//! committed. The journal is bounded ([`Limits`]): when it is full and the server is
//! down, a commit fails (loudly, counted) and the caller keeps its writes.

mod codec;
mod file;
#[cfg(test)]
mod tests;

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use tracing::{debug, error, info, warn};

pub use file::Limits;
use file::{AppendError, JournalFile};

use super::health::StoreHealth;
use super::{Backend, Batch, StoreError};

/// A backend (Redis) behind a local journal.
pub struct Journaled {
    inner: Box<dyn Backend>,
    journal: JournalFile,
    next_seq: u64,
    health: Arc<StoreHealth>,
    /// Whether the journal has said it is full since it last had room.
    said_full: bool,
}

impl Journaled {
    /// Opens the journal at `path` in front of `inner`, and replays what a previous
    /// run left in it (an error if the server does not take it now).
    pub fn open(
        mut inner: Box<dyn Backend>,
        path: &Path,
        limits: Limits,
    ) -> Result<Self, StoreError> {
        let journal = JournalFile::open(path, limits)?;
        let applied = inner.applied(journal.writer())?;
        let health = inner.health().unwrap_or_default();
        let mut j = Journaled {
            next_seq: applied.max(journal.last_seq()) + 1,
            inner,
            journal,
            health,
            said_full: false,
        };
        j.gauges();
        if j.journal.depth() > 0 {
            info!(
                journal = %path.display(),
                batches = j.journal.depth(),
                "replaying the store journal left by the last run"
            );
            j.replay()?;
        }
        Ok(j)
    }

    /// The id under which the server records which of this journal's batches it took.
    pub fn writer(&self) -> &str {
        self.journal.writer()
    }

    pub fn path(&self) -> PathBuf {
        self.journal.path().to_path_buf()
    }

    /// Batches waiting in the journal.
    pub fn depth(&self) -> u64 {
        self.journal.depth()
    }

    fn gauges(&self) {
        let h = &self.health;
        h.journal_depth
            .store(self.journal.depth(), Ordering::Relaxed);
        h.journal_bytes
            .store(self.journal.bytes(), Ordering::Relaxed);
    }

    /// Hands the journal to the server, oldest first, until it is empty or the server
    /// fails (the rest waits).
    fn replay(&mut self) -> Result<(), StoreError> {
        let mut replayed = 0u64;
        let result = loop {
            let (seq, batch) = match self.journal.front() {
                Ok(Some(next)) => next,
                Ok(None) => break Ok(()),
                Err(e) => break Err(e),
            };
            match self.inner.commit_once(self.journal.writer(), seq, &batch) {
                // written by a leader since deposed: it must not land, now or later
                Err(StoreError::Fenced { epoch, .. }) => {
                    warn!(
                        seq,
                        epoch, "journaled batch of a deposed leader dropped (fenced)"
                    );
                }
                Ok(applied) => {
                    if !applied {
                        StoreHealth::count(&self.health.duplicates_skipped);
                        warn!(
                            seq,
                            "journaled batch was already in the store; not applied again"
                        );
                    }
                }
                Err(e) => break Err(e),
            }
            if let Err(e) = self.journal.remove(seq) {
                break Err(e);
            }
            replayed += 1;
            StoreHealth::count(&self.health.replayed);
        };
        self.gauges();
        if replayed > 0 {
            info!(
                replayed,
                left = self.journal.depth(),
                "replayed journaled batches into the store"
            );
        }
        result
    }

    /// Replays the journal; fails while batches are left in it (a read would miss them).
    fn caught_up(&mut self) -> Result<(), StoreError> {
        if self.journal.depth() == 0 {
            return Ok(());
        }
        self.replay()?;
        match self.journal.depth() {
            0 => Ok(()),
            n => Err(StoreError::Backend {
                backend: "journal",
                message: format!(
                    "{} holds {n} batches the {} store has not taken yet",
                    self.journal.path().display(),
                    self.inner.name()
                ),
                source: None,
            }),
        }
    }

    fn journal(&mut self, seq: u64, batch: &Batch, why: &StoreError) -> Result<(), StoreError> {
        match self.journal.append(seq, batch) {
            Ok(()) => {
                StoreHealth::count(&self.health.journaled);
                self.said_full = false;
                self.gauges();
                let depth = self.journal.depth();
                // once when the outage starts, then every 100 batches
                if depth % 100 == 1 {
                    warn!(seq, depth, error = %why, "store did not take the batch; journaled");
                } else {
                    debug!(seq, depth, error = %why, "store did not take the batch; journaled");
                }
                Ok(())
            }
            Err(AppendError::Full { depth, bytes }) => {
                StoreHealth::count(&self.health.journal_full);
                if !self.said_full {
                    error!(
                        journal = %self.journal.path().display(),
                        depth,
                        bytes,
                        "store journal full while the store is down; writes wait in memory"
                    );
                    self.said_full = true;
                }
                Err(StoreError::Backend {
                    backend: "journal",
                    message: format!(
                        "{} is full ({depth} batches, {bytes} bytes) and the store is down: {why}",
                        self.journal.path().display()
                    ),
                    source: None,
                })
            }
            Err(AppendError::Io(e)) => {
                error!(error = %e, "cannot write the store journal");
                Err(e)
            }
        }
    }
}

impl Backend for Journaled {
    fn commit(&mut self, batch: &Batch) -> Result<Vec<u64>, StoreError> {
        let seq = self.next_seq;
        // the server may be back: the older batches go first
        let older = match self.journal.depth() {
            0 => Ok(()),
            _ => self.replay(),
        };
        let taken = older.and_then(|()| self.inner.commit_once(self.journal.writer(), seq, batch));
        match taken {
            Ok(_) => {
                self.health.set_reachable(true);
            }
            // a newer leader holds the store: nothing to keep for later
            Err(e @ StoreError::Fenced { .. }) => {
                self.next_seq += 1;
                return Err(e);
            }
            Err(failed) => {
                // the store takes nothing (a Redis that does not answer, a file on a
                // full disk): shown, and `/readyz` fails on it, though the journal
                // keeps the batch
                self.health.set_reachable(false);
                self.journal(seq, batch, &failed)?
            }
        }
        self.next_seq += 1;
        Ok(Vec::new())
    }

    fn commit_once(&mut self, _writer: &str, _seq: u64, batch: &Batch) -> Result<bool, StoreError> {
        self.commit(batch).map(|_| true)
    }

    fn get(&mut self, collection: &str, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        self.caught_up()?;
        self.inner.get(collection, key)
    }

    fn list(&mut self, collection: &str) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        self.caught_up()?;
        self.inner.list(collection)
    }

    fn read_log(
        &mut self,
        log: &str,
        from: u64,
        limit: usize,
    ) -> Result<Vec<(u64, Vec<u8>)>, StoreError> {
        self.caught_up()?;
        self.inner.read_log(log, from, limit)
    }

    fn log_len(&mut self, log: &str) -> Result<u64, StoreError> {
        self.caught_up()?;
        self.inner.log_len(log)
    }

    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn health(&self) -> Option<Arc<StoreHealth>> {
        Some(self.health.clone())
    }
}
