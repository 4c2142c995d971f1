//! ISO 8601 / RFC 5545 durations and date-times as OpenADR 2.0b writes them
//! (`PT10S`, `P1DT2H`, `2026-12-04T18:00:00.000Z`).

use telemetry::Timestamp;

/// Seconds in an ISO 8601 duration: `[+-]P[nW][nD][T[nH][nM][n[.f]S]]`; years and
/// months (of no fixed length) are refused, as is anything else.
pub fn parse_duration(s: &str) -> Option<f64> {
    duration(s, false)
}

/// [`parse_duration`] with years and months too (`P0Y0M0DT0H10M0S`, as OpenADR 3
/// VTNs write), a year taken as 365 days and a month as 30.
pub fn parse_duration_calendar(s: &str) -> Option<f64> {
    duration(s, true)
}

fn duration(s: &str, calendar: bool) -> Option<f64> {
    let s = s.trim();
    let (sign, rest) = match s.as_bytes().first()? {
        b'-' => (-1.0, &s[1..]),
        b'+' => (1.0, &s[1..]),
        _ => (1.0, s),
    };
    let rest = rest.strip_prefix('P')?;
    if rest.is_empty() {
        return None;
    }
    let mut total = 0.0;
    let mut in_time = false;
    let mut num = String::new();
    let mut any = false;
    for c in rest.chars() {
        match c {
            'T' if !in_time && num.is_empty() => in_time = true,
            '0'..='9' | '.' => num.push(c),
            _ => {
                let n: f64 = num.parse().ok()?;
                num.clear();
                let unit = match (in_time, c) {
                    (false, 'Y') if calendar => 365.0 * 86_400.0,
                    (false, 'M') if calendar => 30.0 * 86_400.0,
                    (false, 'W') => 7.0 * 86_400.0,
                    (false, 'D') => 86_400.0,
                    (true, 'H') => 3_600.0,
                    (true, 'M') => 60.0,
                    (true, 'S') => 1.0,
                    _ => return None,
                };
                total += n * unit;
                any = true;
            }
        }
    }
    (num.is_empty() && any).then_some(sign * total)
}

/// A duration as `PT<n>S`, whole seconds rounded up (OpenLEADR reads no fractions).
pub fn format_duration(secs: f64) -> String {
    format!("PT{}S", secs.max(0.0).ceil() as u64)
}

/// An xs:dateTime (RFC 3339; `Z` or an offset).
pub fn parse_datetime(s: &str) -> Option<Timestamp> {
    Timestamp::parse_rfc3339(s.trim()).ok()
}

/// UTC with milliseconds and `Z`.
pub fn format_datetime(t: Timestamp) -> String {
    t.to_datetime().format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_as_openadr_writes_them() {
        assert_eq!(parse_duration("PT10S"), Some(10.0));
        assert_eq!(parse_duration("PT1H"), Some(3600.0));
        assert_eq!(parse_duration("P1DT2H30M"), Some(86_400.0 + 9_000.0));
        assert_eq!(parse_duration("PT0.5S"), Some(0.5));
        assert_eq!(parse_duration("P1W"), Some(604_800.0));
        assert_eq!(parse_duration("-PT5M"), Some(-300.0));
        assert_eq!(parse_duration(" PT30M "), Some(1800.0));
        for bad in [
            "", "P", "PT", "10S", "P1Y", "P2M", "PT1X", "PT5", "P1H", "PTT1S",
        ] {
            assert_eq!(parse_duration(bad), None, "{bad}");
        }
        assert_eq!(format_duration(3600.0), "PT3600S");
        assert_eq!(format_duration(0.2), "PT1S");
        assert_eq!(parse_duration(&format_duration(42.0)), Some(42.0));
    }

    #[test]
    fn date_times_round_trip() {
        let t = parse_datetime("2026-12-04T18:00:00.000000Z").expect("date-time");
        assert_eq!(t, Timestamp::from_secs(1_796_407_200));
        assert_eq!(format_datetime(t), "2026-12-04T18:00:00.000Z");
        assert_eq!(parse_datetime("2026-12-04T19:00:00+01:00"), Some(t));
        assert_eq!(parse_datetime("yesterday"), None);
    }
}
