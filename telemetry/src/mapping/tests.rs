use super::*;
use crate::Quality;

const MAPPING: &str = r#"
version = 1

[[json]]
topic = "dc1/{room}/{rack}/inlet"
entity = "rack/{rack}"
metric = "inlet_temp_c"
value = "/value"
unit = "degF"
timestamp = "/ts"

[[json]]
topic = "dc1/cdu/{cdu}/state"
entity = "cooling/{cdu}"
timestamp = "/ts"
quality = "/status"
readings = [
  { metric = "supply_temp_c", value = "/supply/temp", unit_pointer = "/supply/unit" },
  { metric = "heat_load_kw", value = "/heat", unit = "W" },
  { metric = "flow_lpm", value = "/flow", unit = "GPM" },
]

[[json]]
topic = "dc1/pdu/{pdu}/outlets"
each = "/outlets"
entity = "outlet/{pdu}.{/name}"
metric = "power_w"
value = "/watts"
parse_strings = true                  # this gateway sends some numbers as strings

[[json]]
topic = "dc1/raw/{rack}/power"
entity = "rack/{rack}"
metric = "power_w"
value = ""
unit = "kW"
"#;

fn mapping() -> Mapping {
    Mapping::parse("m.toml", MAPPING).expect("valid mapping")
}

fn now() -> Timestamp {
    Timestamp::parse_rfc3339("2024-06-03T12:00:00Z").expect("ts")
}

#[test]
fn a_rack_inlet_in_fahrenheit_becomes_celsius_with_its_own_time() {
    let d = mapping().decode(
        "dc1/hall1/a01/inlet",
        br#"{"value": 89.6, "ts": 1717416000}"#,
        "mqtt",
        now(),
    );
    assert!(d.rejects.is_empty(), "{:?}", d.rejects);
    assert_eq!(d.samples.len(), 1);
    let s = &d.samples[0];
    assert_eq!(s.entity.to_string(), "rack/a01");
    assert_eq!(s.metric.as_str(), "inlet_temp_c");
    assert!((s.value - 32.0).abs() < 1e-9);
    assert_eq!(s.unit, "°C");
    assert_eq!(s.ts, now());
    assert_eq!(s.source, "mqtt");
}

#[test]
fn one_cdu_message_gives_many_readings_with_their_quality() {
    let payload = br#"{"ts": "2024-06-03T11:59:50Z", "status": "Warning",
        "supply": {"temp": 86.0, "unit": "degF"}, "heat": 42000, "flow": 100}"#;
    let d = mapping().decode("dc1/cdu/cdu-1/state", payload, "mqtt", now());
    assert!(d.rejects.is_empty(), "{:?}", d.rejects);
    let got: Vec<(String, f64)> = d
        .samples
        .iter()
        .map(|s| (s.metric.to_string(), (s.value * 1000.0).round() / 1000.0))
        .collect();
    assert_eq!(
        got,
        vec![
            ("supply_temp_c".into(), 30.0),
            ("heat_load_kw".into(), 42.0),
            ("flow_lpm".into(), 378.541)
        ]
    );
    assert!(d
        .samples
        .iter()
        .all(|s| s.quality == Quality::Uncertain && s.entity.to_string() == "cooling/cdu-1"));
}

#[test]
fn an_array_payload_gives_one_entity_per_element() {
    let payload = br#"{"outlets": [{"name": "A1", "watts": 197.4}, {"name": "A2", "watts": "12.5"}, {"watts": 3}]}"#;
    let d = mapping().decode("dc1/pdu/pdu-a/outlets", payload, "mqtt", now());
    let got: Vec<(String, f64)> = d
        .samples
        .iter()
        .map(|s| (s.entity.to_string(), s.value))
        .collect();
    assert_eq!(
        got,
        vec![
            ("outlet/pdu-a.A1".into(), 197.4),
            ("outlet/pdu-a.A2".into(), 12.5)
        ]
    );
    assert_eq!(d.rejects.len(), 1);
    assert_eq!(d.rejects[0].reason, "bad_entity");
    assert!(
        d.samples.iter().all(|s| s.ts == now()),
        "stamped on receipt"
    );
}

#[test]
fn a_bare_number_payload_is_a_value() {
    let d = mapping().decode("dc1/raw/b02/power", b"7.25", "mqtt", now());
    assert_eq!(
        d.samples.iter().map(|s| s.value).collect::<Vec<_>>(),
        vec![7250.0]
    );
}

#[test]
fn bad_messages_are_rejected_with_a_reason_and_never_panic() {
    let m = mapping();
    let cases: &[(&str, &[u8], &str)] = &[
        ("dc1/hall1/a01/inlet", b"{not json", "bad_json"),
        (
            "dc1/hall1/a01/inlet",
            br#"{"ts": 1717416000}"#,
            "missing_value",
        ),
        (
            "dc1/hall1/a01/inlet",
            br#"{"value": "hot", "ts": 1717416000}"#,
            "wrong_type",
        ),
        (
            "dc1/hall1/a01/inlet",
            br#"{"value": [1], "ts": 1717416000}"#,
            "wrong_type",
        ),
        (
            "dc1/hall1/a01/inlet",
            br#"{"value": true, "ts": 1717416000}"#,
            "wrong_type",
        ),
        (
            "dc1/hall1/a01/inlet",
            br#"{"value": 80, "ts": "yesterday"}"#,
            "bad_timestamp",
        ),
        (
            "dc1/hall1/a01/inlet",
            br#"{"value": 80, "ts": -5}"#,
            "bad_timestamp",
        ),
        (
            "dc1/cdu/c/state",
            br#"{"ts": 1, "supply": {"temp": 1, "unit": "parsecs"}, "heat": 1, "flow": 1}"#,
            "unknown_unit",
        ),
        ("elsewhere/topic", b"{}", "no_mapping"),
        ("dc1/hall1/a01/inlet/extra", b"{}", "no_mapping"),
        ("dc1/pdu/p/outlets", br#"{"outlets": 5}"#, "missing_value"),
        ("dc1/hall1/a01/inlet", &[0xff, 0xfe, 0x00], "bad_json"),
    ];
    for (topic, payload, reason) in cases {
        let d = m.decode(topic, payload, "mqtt", now());
        assert!(
            d.rejects.iter().any(|r| r.reason == *reason),
            "{topic} {:?}: expected {reason}, got {:?}",
            String::from_utf8_lossy(payload),
            d.rejects
        );
    }
}

#[test]
fn subscriptions_follow_the_templates() {
    assert_eq!(
        mapping().topic_filters(),
        vec![
            "dc1/+/+/inlet",
            "dc1/cdu/+/state",
            "dc1/pdu/+/outlets",
            "dc1/raw/+/power"
        ]
    );
}

#[test]
fn a_broken_mapping_reports_every_problem() {
    let src = r#"version = 1
[[json]]
topic = "a/{x}/b"
entity = "rack/{y}"
metric = "inlet_temperature"
value = "value"
unit = "degF"

[[json]]
topic = "c/#/d"
entity = "toaster/1"
metric = "power_w"
value = "/v"
unit = "degC"
"#;
    let err = Mapping::parse("m.toml", src).expect_err("broken");
    let text = err.to_string();
    for expected in [
        "m.toml:2:1: entity \"rack/{y}\" uses {y}, which topic \"a/{x}/b\" does not capture",
        "m.toml:2:1: unknown metric \"inlet_temperature\"",
        "m.toml:2:1: \"value\" is not a JSON pointer (write it /field/sub)",
        "m.toml:9:1: topic \"c/#/d\": '#' must be the last level",
        "m.toml:9:1: entity \"toaster/1\" must start with a kind",
        "m.toml:9:1: metric \"power_w\" is in W, which unit \"degC\" cannot be converted to",
    ] {
        assert!(text.contains(expected), "missing {expected:?} in:\n{text}");
    }
}

mod never_panics {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn on_any_topic_and_payload(topic in "[a-z0-9/{}+#]{0,40}", payload in proptest::collection::vec(any::<u8>(), 0..200)) {
            let d = mapping().decode(&topic, &payload, "fuzz", now());
            prop_assert!(d.samples.iter().all(|s| s.value.is_finite() || s.value.is_nan()));
        }

        #[test]
        fn on_any_json_for_a_known_topic(v in proptest::num::f64::ANY, ts in proptest::num::f64::ANY) {
            let payload = format!(r#"{{"value": {v}, "ts": {ts}}}"#);
            let _ = mapping().decode("dc1/hall/a01/inlet", payload.as_bytes(), "fuzz", now());
        }
    }
}

#[test]
fn a_boolean_is_a_reading_of_a_leak_detector_only() {
    let m = Mapping::parse(
        "leak.toml",
        r#"
version = 1

[[json]]
topic = "dc1/leak/{rack}"
entity = "rack/{rack}"
metric = "leak_detected"
value = "/wet"
"#,
    )
    .expect("valid mapping");
    let d = m.decode("dc1/leak/a01", br#"{"wet": true}"#, "mqtt", now());
    assert!(d.rejects.is_empty(), "{:?}", d.rejects);
    assert_eq!(
        d.samples.iter().map(|s| s.value).collect::<Vec<_>>(),
        vec![1.0]
    );
    let d = mapping().decode(
        "dc1/hall1/a01/inlet",
        br#"{"value": true, "ts": 1717416000}"#,
        "mqtt",
        now(),
    );
    assert!(d.samples.is_empty(), "true is not 1 °F: {:?}", d.samples);
    assert_eq!(d.rejects[0].reason, "wrong_type");
}

#[test]
fn a_string_or_an_object_is_a_number_only_where_the_mapping_says_so() {
    let strict = mapping();
    for payload in [
        &br#"{"value": "80.6", "ts": 1717416000}"#[..],
        br#"{"value": {"v": 80.6}, "ts": 1717416000}"#,
    ] {
        let d = strict.decode("dc1/hall1/a01/inlet", payload, "mqtt", now());
        assert!(d.samples.is_empty(), "{:?}", d.samples);
        assert_eq!(d.rejects[0].reason, "wrong_type", "{:?}", d.rejects);
    }
    let src = r#"version = 1
[[json]]
topic = "gw/{rack}"
entity = "rack/{rack}"
parse_strings = true
readings = [
  { metric = "inlet_temp_c", value = "/t" },
  { metric = "humidity_pct", value = "/h", parse_strings = false },
]
"#;
    let m = Mapping::parse("m.toml", src).expect("mapping");
    let d = m.decode("gw/a01", br#"{"t": " 24.5 ", "h": "40"}"#, "mqtt", now());
    assert_eq!(
        d.samples.iter().map(|s| s.value).collect::<Vec<_>>(),
        vec![24.5]
    );
    assert_eq!(d.rejects.len(), 1);
    assert_eq!(d.rejects[0].reason, "wrong_type");
    let d = m.decode("gw/a01", br#"{"t": "warm"}"#, "mqtt", now());
    assert_eq!(d.rejects[0].reason, "not_a_number");
}
