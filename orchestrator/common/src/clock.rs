//! The time now, for the edges and the loop of both binaries: [`wall_clock`] reads the
//! system clock; code that takes a [`Clock`] can be given another one in tests.

use telemetry::Timestamp;

/// Where the time now comes from.
pub trait Clock: Send + Sync {
    fn now(&self) -> Timestamp;
}

/// The system clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct WallClock;

impl Clock for WallClock {
    fn now(&self) -> Timestamp {
        wall_clock()
    }
}

/// The time now, from the system clock.
pub fn wall_clock() -> Timestamp {
    Timestamp::from(chrono::Utc::now())
}
