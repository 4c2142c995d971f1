//! Renders kept per board version: `/metrics`, `/api/v1/status` and the status page are
//! rendered once per tick, not once per request, from a copy of the board taken in
//! moments (its large parts are shared), so that neither the loop's publish nor
//! `/readyz` waits on a render of a large site.
//!
//! A request that finds a new version renders it; requests that arrive meanwhile get
//! the last render (at most a tick old) instead of waiting, unless there is none yet.
//! A render is also kept at most [`MAX_AGE`]: the views carry live figures (how long
//! ago the last tick ran, the store's reachability, the leader), which must keep moving
//! while the loop is stalled.

use std::sync::{Mutex, TryLockError};
use std::time::{Duration, Instant};

use hyper::body::Bytes;

/// How long a render is served before it is made again, even without a new tick (a
/// stalled loop's `tick_age_seconds` still moves; `/readyz`, never cached, tells at
/// once).
pub const MAX_AGE: Duration = Duration::from_secs(5);

/// A render: the board version it is of, when it was made, the bytes.
type Render = (u64, Instant, Bytes);

/// The last render of one view, by board version.
pub struct RenderCache {
    last: Mutex<Option<Render>>,
    rendering: Mutex<()>,
    max_age: Duration,
}

impl Default for RenderCache {
    fn default() -> Self {
        RenderCache::with_max_age(MAX_AGE)
    }
}

impl RenderCache {
    /// A cache whose renders are made again after `max_age` even without a new tick.
    pub fn with_max_age(max_age: Duration) -> Self {
        RenderCache {
            last: Mutex::new(None),
            rendering: Mutex::new(()),
            max_age,
        }
    }

    fn cached(&self, version: u64, any: bool) -> Option<Bytes> {
        let last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        last.as_ref()
            .filter(|(v, at, _)| any || (*v == version && at.elapsed() < self.max_age))
            .map(|(_, _, body)| body.clone())
    }

    /// The render of `version`, made by `render` unless it is kept; while another
    /// request renders, the last render kept.
    pub fn get(&self, version: u64, render: impl FnOnce() -> Vec<u8>) -> Bytes {
        if let Some(body) = self.cached(version, false) {
            return body;
        }
        let _guard = match self.rendering.try_lock() {
            Ok(g) => g,
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
            Err(TryLockError::WouldBlock) => {
                if let Some(body) = self.cached(version, true) {
                    return body;
                }
                // the first render of all: wait for it
                self.rendering.lock().unwrap_or_else(|p| p.into_inner())
            }
        };
        // rendered by the request that held the lock before this one?
        if let Some(body) = self.cached(version, false) {
            return body;
        }
        let body = Bytes::from(render());
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        if last.as_ref().is_none_or(|(v, _, _)| *v <= version) {
            *last = Some((version, Instant::now(), body.clone()));
        }
        body
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    #[test]
    fn each_version_is_rendered_once_and_others_get_the_last_render_meanwhile() {
        let max_age = Duration::from_millis(300);
        let cache = Arc::new(RenderCache::with_max_age(max_age));
        let renders = Arc::new(AtomicUsize::new(0));
        let render = |v: u64| {
            let renders = renders.clone();
            move || {
                renders.fetch_add(1, Ordering::SeqCst);
                format!("v{v}").into_bytes()
            }
        };
        assert_eq!(cache.get(1, render(1)), &b"v1"[..]);
        assert_eq!(cache.get(1, render(1)), &b"v1"[..]);
        assert_eq!(renders.load(Ordering::SeqCst), 1, "kept");
        // while version 2 renders (slowly), a request for it gets version 1 at once
        let (started_tx, started_rx) = std::sync::mpsc::channel();
        let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
        let slow = {
            let cache = cache.clone();
            std::thread::spawn(move || {
                cache.get(2, move || {
                    started_tx.send(()).expect("started");
                    go_rx.recv().expect("go");
                    b"v2".to_vec()
                })
            })
        };
        started_rx.recv().expect("the render started");
        assert_eq!(
            cache.get(2, render(2)),
            &b"v1"[..],
            "the last render, not a wait"
        );
        go_tx.send(()).expect("go");
        assert_eq!(slow.join().expect("render"), &b"v2"[..]);
        assert_eq!(cache.get(2, render(2)), &b"v2"[..]);
        assert_eq!(renders.load(Ordering::SeqCst), 1, "version 2 rendered once");
        // no new tick, but the live figures move: rendered again after MAX_AGE
        std::thread::sleep(max_age + Duration::from_millis(50));
        cache.get(2, render(2));
        assert_eq!(renders.load(Ordering::SeqCst), 2);
    }
}
