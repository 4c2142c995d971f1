use super::*;

#[test]
fn offsets_and_times() {
    assert_eq!(parse_offset("+30s"), Ok(30.0));
    assert_eq!(parse_offset("-1h30m"), Ok(-5400.0));
    assert_eq!(parse_offset("90"), Ok(90.0));
    assert_eq!(parse_offset("2d"), Ok(172_800.0));
    assert!(parse_offset("soon").is_err());
    assert!(parse_offset("1h30").is_err());
    let base = Timestamp::from_secs(1_000);
    assert_eq!(parse_time("+5m", base), Ok(Timestamp::from_secs(1_300)));
    assert_eq!(
        parse_time("1970-01-01T00:00:10Z", base),
        Ok(Timestamp::from_secs(10))
    );
}

#[test]
fn globs() {
    assert!(glob("gpu/*", "gpu/a01-n01:0"));
    assert!(glob("gpu/a01-*:3", "gpu/a01-n02:3"));
    assert!(!glob("gpu/a01-*:3", "gpu/a01-n02:4"));
    assert!(glob("rack/a01", "rack/a01"));
    assert!(!glob("rack/a0", "rack/a01"));
}
