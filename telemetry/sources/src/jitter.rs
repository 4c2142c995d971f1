//! Jitter for retries and reconnects: a number in [0, 1) that differs between calls
//! and processes, so that the clients one outage dropped together do not all come back
//! in the same instant (no more is asked of it than that).

use std::hash::{BuildHasher, Hasher};

/// A number in [0, 1).
pub fn unit() -> f64 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    (h.finish() >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    #[test]
    fn within_zero_and_one_and_not_always_the_same() {
        let v: Vec<f64> = (0..64).map(|_| super::unit()).collect();
        assert!(v.iter().all(|x| (0.0..1.0).contains(x)));
        assert!(v.iter().any(|x| (x - v[0]).abs() > 1e-12));
    }
}
