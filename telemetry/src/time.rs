//! Time as plain data: the engine and the simulator take it as an argument, never read a clock.

use std::fmt;
use std::ops::{Add, Sub};

use chrono::{DateTime, SecondsFormat, Utc};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// An instant, in milliseconds since the Unix epoch (UTC).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Timestamp(pub i64);

impl Timestamp {
    pub fn from_secs(secs: i64) -> Self {
        Timestamp(secs.saturating_mul(1000))
    }
    pub fn as_millis(self) -> i64 {
        self.0
    }
    pub fn as_secs_f64(self) -> f64 {
        self.0 as f64 / 1000.0
    }
    /// Seconds elapsed from `earlier` to `self` (negative when `earlier` is later).
    /// Exact for any two instants (no overflow).
    pub fn secs_since(self, earlier: Timestamp) -> f64 {
        (i128::from(self.0) - i128::from(earlier.0)) as f64 / 1000.0
    }
    /// `self` moved by `secs`, saturating at the ends of the range: a duration read
    /// from outside (a million years, NaN as 0) never panics.
    pub fn plus_secs(self, secs: f64) -> Timestamp {
        // float-to-integer casts saturate (NaN gives 0)
        Timestamp(self.0.saturating_add((secs * 1000.0).round() as i64))
    }
    pub fn to_datetime(self) -> DateTime<Utc> {
        DateTime::from_timestamp_millis(self.0).unwrap_or_default()
    }
    /// Parses RFC 3339 (`2024-06-03T14:00:00Z`, with any offset).
    pub fn parse_rfc3339(s: &str) -> Result<Timestamp, chrono::ParseError> {
        let dt = DateTime::parse_from_rfc3339(s)?;
        Ok(Timestamp(dt.timestamp_millis()))
    }
}

impl From<DateTime<Utc>> for Timestamp {
    fn from(dt: DateTime<Utc>) -> Self {
        Timestamp(dt.timestamp_millis())
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(
            &self
                .to_datetime()
                .to_rfc3339_opts(SecondsFormat::AutoSi, true),
        )
    }
}

impl Add<f64> for Timestamp {
    type Output = Timestamp;
    fn add(self, secs: f64) -> Timestamp {
        self.plus_secs(secs)
    }
}

impl Sub for Timestamp {
    type Output = f64;
    /// The difference in seconds.
    fn sub(self, rhs: Timestamp) -> f64 {
        self.secs_since(rhs)
    }
}

impl Serialize for Timestamp {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl<'de> Deserialize<'de> for Timestamp {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Timestamp::parse_rfc3339(&s)
            .map_err(|e| serde::de::Error::custom(format!("timestamp {s:?}: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_through_rfc3339() {
        let t = Timestamp::parse_rfc3339("2024-06-03T14:00:00+02:00").expect("parses");
        assert_eq!(t.to_string(), "2024-06-03T12:00:00Z");
        let json = serde_json::to_string(&t).expect("serializes");
        assert_eq!(json, "\"2024-06-03T12:00:00Z\"");
        let back: Timestamp = serde_json::from_str(&json).expect("deserializes");
        assert_eq!(back, t);
    }

    #[test]
    fn arithmetic_is_in_seconds() {
        let t = Timestamp::from_secs(100);
        assert_eq!((t + 1.5).as_millis(), 101_500);
        assert_eq!(Timestamp::from_secs(160) - t, 60.0);
    }

    #[test]
    fn arithmetic_far_out_of_range_saturates_instead_of_panicking() {
        let t = Timestamp::from_secs(1_700_000_000);
        // a million years, as a fuzzed duration `P1000000Y` reads
        let far = t.plus_secs(1e6 * 365.25 * 86_400.0 * 1_000.0);
        assert_eq!(far, Timestamp(i64::MAX));
        assert_eq!(
            Timestamp(i64::MIN + 5).plus_secs(-1e30),
            Timestamp(i64::MIN)
        );
        assert!(t.plus_secs(-1e30) < Timestamp(0));
        assert_eq!(t.plus_secs(f64::NAN), t);
        assert_eq!(Timestamp::from_secs(i64::MAX), Timestamp(i64::MAX));
        let span = Timestamp(i64::MAX).secs_since(Timestamp(i64::MIN));
        assert!(span > 1.8e16, "{span}");
        assert!(Timestamp(i64::MIN).secs_since(Timestamp(i64::MAX)) < 0.0);
    }
}
