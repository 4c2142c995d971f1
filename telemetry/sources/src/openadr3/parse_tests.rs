use super::*;

fn at(s: &str) -> Timestamp {
    Timestamp::parse_rfc3339(s).expect("time")
}

fn seen(_: &str) -> Timestamp {
    at("2026-12-07T10:00:00Z")
}

fn one(json: &str) -> Result<WireEvent, Refused> {
    let v: Value = serde_json::from_str(json).expect("json");
    event(&v, &seen)
}

#[test]
fn an_event_with_a_default_period_lays_its_intervals_end_to_end() {
    let e = one(
        r#"{"id":"7","programID":"3","eventName":"peak","objectType":"EVENT",
            "createdDateTime":"2026-12-07T09:00:00Z","modificationDateTime":"2026-12-07T09:30:00Z",
            "priority":null,"targets":["site-a"],
            "payloadDescriptors":[{"payloadType":"IMPORT_CAPACITY_LIMIT","units":"KW"}],
            "intervalPeriod":{"start":"2026-12-07T12:00:00Z","duration":"PT30M"},
            "intervals":[
              {"id":1,"payloads":[{"type":"IMPORT_CAPACITY_LIMIT","values":[700.5]}]},
              {"id":0,"payloads":[{"type":"IMPORT_CAPACITY_LIMIT","values":[800]}]},
              {"id":2,"intervalPeriod":{"start":"2026-12-07T14:00:00Z","duration":"PT1H"},
               "payloads":[{"type":"SIMPLE","values":[2]}]}]}"#,
    )
    .expect("read");
    assert_eq!((e.id.as_str(), e.program_id.as_str()), ("7", "3"));
    assert_eq!(e.modified, "2026-12-07T09:30:00Z");
    let got: Vec<(Timestamp, f64, GridTarget)> = e
        .intervals
        .iter()
        .map(|i| (i.start, i.duration_s, i.target))
        .collect();
    assert_eq!(
        got,
        vec![
            (
                at("2026-12-07T12:00:00Z"),
                1800.0,
                GridTarget::CapW(800_000.0)
            ),
            (
                at("2026-12-07T12:30:00Z"),
                1800.0,
                GridTarget::CapW(700_500.0)
            ),
            (at("2026-12-07T14:00:00Z"), 3600.0, GridTarget::Level(2)),
        ]
    );
    assert!(e.skipped.is_empty(), "{:?}", e.skipped);
}

#[test]
fn relative_setpoints_shed_in_kw_or_percent_and_an_increase_asks_nothing() {
    let e = one(
        r#"{"id":"e","programID":"p",
            "payloadDescriptors":[{"payloadType":"DISPATCH_SETPOINT_RELATIVE","units":"PERCENT"}],
            "intervalPeriod":{"start":"2026-12-07T12:00:00Z","duration":"PT15M"},
            "intervals":[
              {"id":0,"payloads":[{"type":"DISPATCH_SETPOINT_RELATIVE","values":[-25]}]},
              {"id":1,"payloads":[{"type":"DISPATCH_SETPOINT_RELATIVE","values":[10]}]},
              {"id":2,"payloads":[{"type":"PRICE","values":[0.31]},{"type":"DISPATCH_SETPOINT_RELATIVE","values":[-150]}]}]}"#,
    )
    .expect("read");
    assert_eq!(e.intervals.len(), 2);
    assert_eq!(e.intervals[0].target, GridTarget::ShedFraction(0.25));
    // the third interval starts after the second, which asked nothing
    assert_eq!(e.intervals[1].start, at("2026-12-07T12:30:00Z"));
    assert_eq!(e.intervals[1].target, GridTarget::ShedFraction(1.0));
    assert_eq!(e.skipped, vec!["increase"]);
    let kw = one(
        r#"{"id":"e","programID":"p","intervalPeriod":{"start":"2026-12-07T12:00:00Z","duration":"PT15M"},
            "intervals":[{"id":0,"payloads":[{"type":"DISPATCH_SETPOINT_RELATIVE","values":[-150]}]}]}"#,
    )
    .expect("read");
    assert_eq!(kw.intervals[0].target, GridTarget::ShedW(150_000.0));
}

#[test]
fn start_now_and_no_end_are_read_as_openadr_3_means_them() {
    let e = one(r#"{"id":"e","programID":"p",
            "intervalPeriod":{"start":"0001-01-01T00:00:00Z","duration":"P9999Y"},
            "intervals":[{"id":0,"payloads":[{"type":"SIMPLE","values":[1]}]}]}"#)
    .expect("read");
    assert_eq!(e.intervals[0].start, seen(""));
    assert_eq!(e.intervals[0].duration_s, ENDLESS_S);
}

#[test]
fn what_cannot_be_read_is_refused_by_name_and_the_rest_is_kept() {
    let base = |intervals: &str| {
        format!(
            r#"{{"id":"e","programID":"p","intervalPeriod":{{"start":"2026-12-07T12:00:00Z","duration":"PT1H"}},"intervals":{intervals}}}"#
        )
    };
    // a bad value, unknown units, a level out of range, no payload: passed over by name
    let e = one(
        r#"{"id":"e","programID":"p","payloadDescriptors":[{"payloadType":"DISPATCH_SETPOINT","units":"KVAR"}],
            "intervalPeriod":{"start":"2026-12-07T12:00:00Z","duration":"PT1H"},"intervals":[
            {"id":0,"payloads":[{"type":"IMPORT_CAPACITY_LIMIT","values":["lots"]}]},
            {"id":1,"payloads":[{"type":"DISPATCH_SETPOINT","values":[100]}]},
            {"id":2,"payloads":[{"type":"SIMPLE","values":[7]}]},
            {"id":3,"payloads":[]},
            {"id":4,"payloads":[{"type":"ALERT_GRID_EMERGENCY","values":["now"]}]},
            {"id":5,"payloads":[{"type":"SIMPLE","values":[3]}]}]}"#
    )
    .expect("read");
    assert_eq!(
        e.skipped,
        vec![
            "value",
            "units",
            "simple_level",
            "no_payload",
            "payload_type"
        ]
    );
    assert_eq!(e.intervals.len(), 1);
    assert_eq!(e.intervals[0].start, at("2026-12-07T17:00:00Z"));
    // a bad time or duration refuses the event; no id or program too
    let bad_start =
        one(r#"{"id":"e","programID":"p","intervalPeriod":{"start":"tomorrow"},"intervals":[]}"#);
    assert_eq!(bad_start.expect_err("refused").reason, "bad_start");
    let bad_duration = one(&base(
        r#"[{"id":0,"intervalPeriod":{"duration":"1 hour"},"payloads":[{"type":"SIMPLE","values":[1]}]}]"#,
    ));
    let r = bad_duration.expect_err("refused");
    assert_eq!((r.id.as_deref(), r.reason), (Some("e"), "bad_duration"));
    assert_eq!(
        one(r#"{"programID":"p"}"#).expect_err("refused").reason,
        "no_id"
    );
    assert_eq!(
        one(r#"{"id":"e"}"#).expect_err("refused").reason,
        "no_program"
    );
    assert_eq!(
        one(&base(r#"{"id":0}"#)).expect_err("refused").reason,
        "intervals"
    );
    let many = format!(
        "[{}]",
        vec![r#"{"id":0,"payloads":[{"type":"SIMPLE","values":[1]}]}"#; MAX_INTERVALS + 1]
            .join(",")
    );
    assert_eq!(
        one(&base(&many)).expect_err("refused").reason,
        "too_many_intervals"
    );
    // an interval with no duration anywhere is passed over
    let e = one(
        r#"{"id":"e","programID":"p","intervalPeriod":{"start":"2026-12-07T12:00:00Z"},
            "intervals":[{"id":0,"payloads":[{"type":"SIMPLE","values":[1]}]}]}"#,
    )
    .expect("read");
    assert_eq!(
        (e.intervals.len(), e.skipped.clone()),
        (0, vec!["no_duration"])
    );
}

#[test]
fn a_list_is_read_event_by_event_and_bodies_that_are_no_list_are_refused() {
    let body = br#"[{"id":"a","programID":"p","intervals":[]},{"programID":"p"},{"id":"c","programID":"p","intervalPeriod":{"start":"x"}}]"#;
    let got = events(body, &seen).expect("list");
    assert!(got[0].is_ok());
    assert_eq!(got[1].as_ref().expect_err("no id").reason, "no_id");
    assert_eq!(got[2].as_ref().expect_err("bad").id.as_deref(), Some("c"));
    assert_eq!(
        events(b"{\"id\":1}", &seen).expect_err("no list").reason(),
        "shape"
    );
    assert_eq!(events(b"[{", &seen).expect_err("no json").reason(), "json");
}

#[test]
fn report_descriptors_the_ven_can_measure_are_kept() {
    let e = one(r#"{"id":"e","programID":"p","intervals":[],
            "reportDescriptors":[{"payloadType":"USAGE","readingType":"DIRECT_READ","units":"KWH"},
                                 {"payloadType":"DEMAND"},{"payloadType":"DEMAND"},
                                 {"payloadType":"STORAGE_CHARGE_LEVEL"}]}"#)
    .expect("read");
    assert_eq!(
        e.reports,
        vec![ReportKind::Usage, ReportKind::Power("DEMAND")]
    );
    assert_eq!(e.skipped, vec!["report_type"]);
}

#[test]
fn tokens_programs_and_ven_objects_are_read() {
    let t =
        token(br#"{"access_token":"abc","token_type":"Bearer","expires_in":3600}"#).expect("token");
    assert_eq!(
        (t.access_token.as_str(), t.expires_in_s),
        ("abc", Some(3600.0))
    );
    assert!(token(br#"{"token_type":"Bearer"}"#).is_err());
    assert_eq!(
        token_url(br#"{"tokenURL":"https://vtn/auth/token"}"#).expect("url"),
        "https://vtn/auth/token"
    );
    assert_eq!(
        programs(
            &serde_json::from_str::<Vec<Value>>(
                r#"[{"id":"1","programName":"ers-10"},{"id":"2"},{"programName":"x"}]"#
            )
            .expect("json")
        ),
        vec![("1".into(), "ers-10".into()), ("2".into(), "2".into())]
    );
    let vens = br#"[{"id":"v1","venName":"other"},{"id":"v2","venName":"site-a"}]"#;
    assert_eq!(ven_id(vens, "site-a").expect("vens").as_deref(), Some("v2"));
    assert_eq!(ven_id(vens, "site-b").expect("vens"), None);
    assert_eq!(
        ven_id(br#"{"id":"v3","venName":"site-a"}"#, "site-a")
            .expect("ven")
            .as_deref(),
        Some("v3")
    );
}

#[test]
fn durations_are_read_in_every_form_vtns_write() {
    assert_eq!(duration_s("PT10M"), Some(600.0));
    assert_eq!(duration_s("P0Y0M0DT0H10M0S"), Some(600.0));
    assert_eq!(duration_s("P1DT1H"), Some(90_000.0));
    assert_eq!(duration_s("PT0.5S"), Some(0.5));
    assert_eq!(duration_s("P1W"), Some(604_800.0));
    assert_eq!(duration_s("P9999Y"), Some(ENDLESS_S));
    assert_eq!(duration_s("P2M"), Some(60.0 * 86_400.0));
    for bad in [
        "", "P", "PT", "10M", "-PT1H", "PT1D", "P1H", "PTxM", "P1.2.3D",
    ] {
        assert_eq!(duration_s(bad), None, "{bad:?}");
    }
}
