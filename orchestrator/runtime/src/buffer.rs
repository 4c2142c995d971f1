//! The sample buffer between the sources and the tick: bounded, keeps the newest,
//! counts what it drops.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use telemetry::{EntityId, Sample};

/// Samples waiting for the next tick: bounded, keeps the newest, counts what it drops.
#[derive(Debug)]
pub struct Buffer {
    cap: usize,
    items: Mutex<(VecDeque<Sample>, Vec<EntityId>)>,
    pub dropped: AtomicU64,
}

impl Buffer {
    pub fn new(cap: usize) -> Self {
        Buffer {
            cap: cap.max(1),
            items: Mutex::new((VecDeque::new(), Vec::new())),
            dropped: AtomicU64::new(0),
        }
    }

    pub fn push(&self, samples: Vec<Sample>, dead: Vec<EntityId>) {
        let mut g = self.items.lock().unwrap_or_else(|p| p.into_inner());
        for s in samples {
            if g.0.len() == self.cap {
                g.0.pop_front();
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
            g.0.push_back(s);
        }
        g.1.extend(dead);
    }

    pub fn drain(&self) -> (Vec<Sample>, Vec<EntityId>) {
        let mut g = self.items.lock().unwrap_or_else(|p| p.into_inner());
        (g.0.drain(..).collect(), std::mem::take(&mut g.1))
    }
}
