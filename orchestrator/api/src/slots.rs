//! The HTTP edge's connection slots, between the accept loop and each connection's
//! task. At most `max` connections are open; when all slots are taken, a new
//! connection takes the slot of the one idle the longest (connected but not in a
//! request: an idle keep-alive, a client that has not sent its headers yet), and is
//! refused only when every slot is serving a request. So idle connections, however
//! many, cannot lock out a client that asks something.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use tokio_util::sync::CancellationToken;

#[derive(Debug)]
struct Entry {
    /// In a request (headers read, answer not yet given).
    busy: bool,
    /// When it last became idle, in slot events (smaller: idle longer).
    idle_since: u64,
    /// Cancelled to close the connection (evicted, or drain time is up).
    close: CancellationToken,
}

#[derive(Debug, Default)]
struct Inner {
    next: u64,
    open: BTreeMap<u64, Entry>,
}

/// The slots; shared by the accept loop and the connections.
#[derive(Debug)]
pub struct Slots {
    max: usize,
    inner: Mutex<Inner>,
}

/// What [`Slots::admit`] decided for a new connection.
#[derive(Debug)]
pub enum Admit {
    /// A slot, and whether an idle connection was closed to free it.
    Open { slot: Slot, evicted: bool },
    /// Every slot serves a request.
    Full,
}

/// A connection's slot; freed when dropped.
#[derive(Debug)]
pub struct Slot {
    id: u64,
    slots: Arc<Slots>,
    /// Cancelled when the connection must close at once.
    pub close: CancellationToken,
}

/// Marks its connection busy while it lives (one request).
#[derive(Debug)]
pub struct Busy {
    id: u64,
    slots: Arc<Slots>,
}

impl Slots {
    pub fn new(max: usize) -> Arc<Self> {
        Arc::new(Slots {
            max: max.max(1),
            inner: Mutex::new(Inner::default()),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Connections open now.
    pub fn open(&self) -> usize {
        self.lock().open.len()
    }

    /// A slot for a new connection, closing the longest-idle one when all are taken.
    pub fn admit(self: &Arc<Self>) -> Admit {
        let mut g = self.lock();
        let mut evicted = false;
        if g.open.len() >= self.max {
            let oldest = g
                .open
                .iter()
                .filter(|(_, e)| !e.busy)
                .min_by_key(|(_, e)| e.idle_since)
                .map(|(id, _)| *id);
            let Some(id) = oldest else {
                return Admit::Full;
            };
            if let Some(e) = g.open.remove(&id) {
                e.close.cancel();
            }
            evicted = true;
        }
        g.next += 1;
        let id = g.next;
        let close = CancellationToken::new();
        g.open.insert(
            id,
            Entry {
                busy: false,
                idle_since: id,
                close: close.clone(),
            },
        );
        Admit::Open {
            slot: Slot {
                id,
                slots: self.clone(),
                close,
            },
            evicted,
        }
    }

    /// Closes every connection at once (drain time is up).
    pub fn close_all(&self) {
        for e in self.lock().open.values() {
            e.close.cancel();
        }
    }

    fn set_busy(&self, id: u64, busy: bool) {
        let mut g = self.lock();
        g.next += 1;
        let now = g.next;
        if let Some(e) = g.open.get_mut(&id) {
            e.busy = busy;
            if !busy {
                e.idle_since = now;
            }
        }
    }
}

impl Slot {
    /// A handle that can mark the connection busy from its service.
    pub fn marker(&self) -> Marker {
        Marker {
            id: self.id,
            slots: self.slots.clone(),
        }
    }
}

/// Marks a connection busy from within its service: [`Marker::busy`] gives a guard
/// that marks it idle again when dropped (the answer is given).
#[derive(Debug, Clone)]
pub struct Marker {
    id: u64,
    slots: Arc<Slots>,
}

impl Marker {
    pub fn busy(&self) -> Busy {
        self.slots.set_busy(self.id, true);
        Busy {
            id: self.id,
            slots: self.slots.clone(),
        }
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.slots.set_busy(self.id, false);
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.slots.lock().open.remove(&self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open(s: &Arc<Slots>) -> (Slot, bool) {
        match s.admit() {
            Admit::Open { slot, evicted } => (slot, evicted),
            Admit::Full => panic!("full"),
        }
    }

    #[test]
    fn at_the_cap_the_longest_idle_connection_makes_room() {
        let s = Slots::new(3);
        let (a, _) = open(&s);
        let (b, _) = open(&s);
        let (c, _) = open(&s);
        let _in_request = a.marker().busy();
        // b became idle before c did
        drop(c.marker().busy());
        let (d, evicted) = open(&s);
        assert!(evicted);
        assert!(b.close.is_cancelled(), "b idled longest");
        assert!(!c.close.is_cancelled() && !a.close.is_cancelled());
        assert_eq!(s.open(), 3);
        drop(b);
        assert_eq!(s.open(), 3, "an evicted slot is already free");
        let _c_busy = c.marker().busy();
        let _d_busy = d.marker().busy();
        assert!(matches!(s.admit(), Admit::Full), "every slot in a request");
        drop(_c_busy);
        assert!(matches!(s.admit(), Admit::Open { evicted: true, .. }));
    }

    #[test]
    fn a_dropped_slot_is_freed_and_close_all_closes_each() {
        let s = Slots::new(2);
        let (a, _) = open(&s);
        let (b, evicted) = open(&s);
        assert!(!evicted);
        drop(a);
        assert_eq!(s.open(), 1);
        s.close_all();
        assert!(b.close.is_cancelled());
    }
}
