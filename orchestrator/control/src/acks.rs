//! With `[ha]`: an operator's change (an override, a posted grid target) is answered
//! only once the store's server holds it, where the next leader reads it. A book
//! counts its changes; the loop marks how many of them a commit carried to the server;
//! the API waits for its own.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The key of the one record that holds a book's whole list in its collection (a later
/// commit always wins over an earlier one).
const LIST_KEY: &str = "list";

/// Writes a book's whole list with `tx`, in `collection`.
pub fn write_list<T: serde::Serialize>(tx: &mut store::Tx, collection: &str, list: &[T]) {
    tx.put_record(collection, LIST_KEY, &list);
}

/// The list the store holds in `collection` (`None`: none was ever written).
pub fn read_list<T: serde::de::DeserializeOwned>(
    store: &mut store::Store,
    collection: &str,
) -> Result<Option<Vec<T>>, store::StoreError> {
    Ok(store.records::<Vec<T>>(collection)?.remove(LIST_KEY))
}

/// How long a change waits to be stored before it is undone and answered 503.
pub const WAIT: Duration = Duration::from_secs(5);

/// A book's changes through the API, and how many of them the store's server holds.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Acks {
    pub changes: u64,
    pub stored: u64,
    /// With `[ha]`: a change is answered only once stored (else at once).
    pub durable: bool,
}

impl Acks {
    /// Counts a change; its number, to wait for.
    pub fn changed(&mut self) -> u64 {
        self.changes += 1;
        self.changes
    }

    /// A commit carried the changes up to `seen` to the store's server.
    pub fn stored_up_to(&mut self, seen: u64) {
        self.stored = self.stored.max(seen);
    }
}

/// Waits (at most [`WAIT`]) until the book behind `book` holds change `mine` in the
/// store; true at once without `[ha]`.
pub fn wait_stored<B>(book: &Mutex<B>, acks: impl Fn(&B) -> Acks, mine: u64) -> bool {
    let t0 = Instant::now();
    loop {
        let a = acks(&book.lock().unwrap_or_else(|p| p.into_inner()));
        if !a.durable || a.stored >= mine {
            return true;
        }
        if t0.elapsed() >= WAIT {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_change_waits_for_the_store_only_with_ha() {
        let book = Mutex::new(Acks::default());
        let mine = book.lock().expect("lock").changed();
        assert!(wait_stored(&book, |a| *a, mine), "without [ha]: at once");
        book.lock().expect("lock").durable = true;
        let t = Instant::now();
        assert!(!wait_stored(&book, |a| *a, mine), "never stored");
        assert!(t.elapsed() >= WAIT);
        book.lock().expect("lock").stored_up_to(mine);
        assert!(wait_stored(&book, |a| *a, mine));
    }
}
