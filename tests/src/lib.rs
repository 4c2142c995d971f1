//! End-to-end tests of powerplane against real servers, and what they share.
//!
//! # Layout
//!
//! - [`store_contract`]: the one contract every store backend must keep, run against
//!   the embedded store and a real Redis (`tests/store.rs`).
//! - [`redis_url`] / [`redis_backend`]: the Redis the tests use. A test that needs
//!   Redis fails when it is missing; it never skips.
//! - [`fixtures`]: sample decisions, jobs and states.
#![forbid(unsafe_code)]

pub mod fixtures;
pub mod store_contract;

use integrations::store::redis::RedisBackend;

/// The Redis the tests talk to: `POWERPLANE_TEST_REDIS` or `redis://127.0.0.1:6379/0`.
pub fn redis_url() -> String {
    std::env::var("POWERPLANE_TEST_REDIS")
        .unwrap_or_else(|_| "redis://127.0.0.1:6379/0".to_string())
}

/// A Redis backend under a prefix no other test uses, emptied first.
///
/// # Panics
/// When Redis cannot be reached: the test fails loudly, it does not skip.
pub fn redis_backend(test: &str) -> RedisBackend {
    let prefix = format!("powerplane-test:{}:{}", std::process::id(), test);
    let mut b = RedisBackend::connect(&redis_url(), &prefix).unwrap_or_else(|e| {
        panic!(
            "this test needs a real Redis at {} (scripts/test starts one): {e}",
            redis_url()
        )
    });
    b.clear().expect("clear test prefix");
    b
}
