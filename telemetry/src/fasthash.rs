//! FNV-1a hashing for the hot maps keyed by entity ids and job ids: the keys are short
//! and come from the site file or the schedulers, so a simple hash beats SipHash there.

use std::hash::{BuildHasherDefault, Hasher};

/// FNV-1a, 64 bits.
#[derive(Default, Clone, Copy)]
pub struct Fnv(u64);

impl Hasher for Fnv {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        let mut h = if self.0 == 0 {
            0xcbf2_9ce4_8422_2325
        } else {
            self.0
        };
        for b in bytes {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        self.0 = h;
    }
}

pub type FnvBuild = BuildHasherDefault<Fnv>;
pub type FnvMap<K, V> = std::collections::HashMap<K, V, FnvBuild>;
pub type FnvSet<K> = std::collections::HashSet<K, FnvBuild>;
