//! The reconcilers' store writes, carried to the control loop that owns the store: a
//! bounded channel of transactions, each answered once the loop has committed it.
//!
//! A reconciler that must know a write is durable before it calls its scheduler (a
//! Slurm hold's intent) waits for the answer, up to a deadline; the loop commits what
//! is waiting between ticks, so the wait is short and the tick never waits on it.
//! Overflow: the channel holds [`CAPACITY`] transactions; a reconciler that finds it
//! full waits (the writes never drop) until its deadline, and then reports the write
//! as failed, which the adapters treat as any store failure (not acted on, retried).

use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::time::{Duration, Instant};

use integrations::scheduler::Commit;
use integrations::store::{Store, StoreError, Tx};
use tracing::warn;

/// Transactions waiting for the loop at most.
pub const CAPACITY: usize = 256;

/// How long a reconciler waits for its write to be committed.
pub const DEADLINE: Duration = Duration::from_secs(30);

struct Write {
    tx: Tx,
    done: SyncSender<Result<(), StoreError>>,
}

/// The reconciler's end: a [`Commit`] that hands the write to the loop.
#[derive(Clone)]
pub struct StoreLink {
    to_loop: SyncSender<Write>,
    deadline: Duration,
}

/// The loop's end.
pub struct StoreWrites {
    from_reconcilers: Receiver<Write>,
    /// Transactions committed, and those the store refused.
    pub committed: u64,
    pub failed: u64,
}

/// A link with the default capacity and deadline.
pub fn link() -> (StoreLink, StoreWrites) {
    let (to_loop, from_reconcilers) = sync_channel(CAPACITY);
    (
        StoreLink {
            to_loop,
            deadline: DEADLINE,
        },
        StoreWrites {
            from_reconcilers,
            committed: 0,
            failed: 0,
        },
    )
}

fn not_committed(message: String) -> StoreError {
    StoreError::Backend {
        backend: "control loop",
        message,
        source: None,
    }
}

impl Commit for StoreLink {
    fn commit(&mut self, tx: Tx) -> Result<(), StoreError> {
        if tx.is_empty() {
            return Ok(());
        }
        let end = Instant::now() + self.deadline;
        let (done, answer) = sync_channel(1);
        let mut write = Write { tx, done };
        loop {
            match self.to_loop.try_send(write) {
                Ok(()) => break,
                Err(TrySendError::Full(w)) if Instant::now() < end => {
                    write = w;
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(TrySendError::Full(_)) => {
                    return Err(not_committed(format!(
                        "{CAPACITY} writes wait for the control loop; not taken within {:?}",
                        self.deadline
                    )))
                }
                Err(TrySendError::Disconnected(_)) => {
                    return Err(not_committed("the control loop has stopped".into()))
                }
            }
        }
        match answer.recv_timeout(end.saturating_duration_since(Instant::now())) {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(StoreError::Backend {
                backend: "control loop",
                message: e.to_string(),
                source: Some(Box::new(e)),
            }),
            Err(_) => Err(not_committed(format!(
                "the control loop did not commit the write within {:?}",
                self.deadline
            ))),
        }
    }
}

impl StoreWrites {
    /// Commits every write waiting, each on its own (as the reconciler asked), after
    /// waiting up to `wait` for the first one. Returns how many it committed.
    pub fn commit_waiting(&mut self, store: &mut Store, wait: Duration) -> usize {
        let mut n = 0;
        let first = match self.from_reconcilers.recv_timeout(wait) {
            Ok(w) => Some(w),
            Err(RecvTimeoutError::Timeout) => None,
            Err(RecvTimeoutError::Disconnected) => {
                // no reconciler (none configured, or all stopped): just the wait
                std::thread::sleep(wait);
                None
            }
        };
        let rest = std::iter::from_fn(|| self.from_reconcilers.try_recv().ok());
        let waiting: Vec<Write> = first.into_iter().chain(rest).collect();
        for w in waiting {
            let result = store.commit(w.tx).inspect_err(|e| {
                warn!(error = %e, "cannot store a scheduler reconciler's write");
            });
            match &result {
                Ok(()) => self.committed += 1,
                Err(_) => self.failed += 1,
            }
            // the reconciler may have given up waiting: nobody to answer then
            let _ = w.done.send(result);
            n += 1;
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_is_answered_once_the_loop_commits_it_and_fails_when_nobody_does() {
        let (link, mut writes) = link();
        let dir = tempfile::tempdir().expect("tmp");
        let backend =
            integrations::store::embedded::EmbeddedBackend::open(&dir.path().join("s.redb"));
        let mut store = Store::new(Box::new(backend.expect("store")));
        let mut l = link.clone();
        let t = std::thread::spawn(move || {
            let mut tx = Tx::new();
            tx.put_record("c", "k", &1u32);
            l.commit(tx)
        });
        let end = Instant::now() + Duration::from_secs(5);
        while writes.commit_waiting(&mut store, Duration::from_millis(20)) == 0 {
            assert!(Instant::now() < end, "the write never reached the loop");
        }
        assert!(t.join().expect("thread").is_ok());
        assert_eq!(
            store.records::<u32>("c").expect("records").get("k"),
            Some(&1)
        );
        let mut late = StoreLink {
            deadline: Duration::from_millis(50),
            ..link
        };
        let mut tx = Tx::new();
        tx.put_record("c", "k", &2u32);
        let e = late.commit(tx).expect_err("nobody commits");
        assert!(e.to_string().contains("did not commit"), "{e}");
        drop(writes);
        let mut tx = Tx::new();
        tx.put_record("c", "k", &3u32);
        assert!(late.commit(tx).is_err(), "the loop has stopped");
    }
}
