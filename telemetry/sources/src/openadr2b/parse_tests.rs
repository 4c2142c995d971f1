use super::*;

fn fixture(name: &str) -> Inbound {
    let text = match name {
        "distribute" => include_str!("testdata/distribute.xml"),
        "created_party_registration" => include_str!("testdata/created_party_registration.xml"),
        "request_reregistration" => include_str!("testdata/request_reregistration.xml"),
        "response" => include_str!("testdata/response.xml"),
        "registered_report" => include_str!("testdata/registered_report.xml"),
        "create_report" => include_str!("testdata/create_report.xml"),
        "cancel_party_registration" => include_str!("testdata/cancel_party_registration.xml"),
        "register_report" => include_str!("testdata/register_report.xml"),
        _ => panic!("no fixture {name}"),
    };
    parse(text).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn at(min: i64) -> Timestamp {
    Timestamp::from_secs(1_796_407_200 + 60 * min)
}

#[test]
fn a_registration_gives_the_ids_and_the_poll_frequency() {
    let Inbound::CreatedPartyRegistration(r) = fixture("created_party_registration") else {
        panic!("not a registration");
    };
    assert!(r.status.ok());
    assert_eq!(r.ven_id.as_deref(), Some("ven1"));
    assert_eq!(r.registration_id.as_deref(), Some("reg1"));
    assert_eq!(r.poll_s, Some(10.0));
}

#[test]
fn simple_levels_are_read_with_their_times() {
    let Inbound::DistributeEvent(d) = fixture("distribute") else {
        panic!("not a distribute");
    };
    assert_eq!(d.request_id, "req-7");
    assert_eq!(d.events.len(), 3);
    let e = &d.events[0];
    assert!(e.response_required);
    assert_eq!(e.event.id, "ev-simple");
    assert_eq!(e.event.source, "openadr2b");
    assert_eq!(e.event.modification, 2);
    assert_eq!(e.event.status, EventStatus::Active);
    assert_eq!(e.event.program, "http://utility.example/dr");
    assert_eq!(
        e.event.intervals,
        vec![
            GridInterval {
                start: at(0),
                duration_s: 600.0,
                target: GridTarget::Level(2)
            },
            GridInterval {
                start: at(10),
                duration_s: 1200.0,
                target: GridTarget::Level(1)
            },
        ]
    );
}

#[test]
fn load_dispatch_takes_its_scale_and_a_negative_delta_is_a_shed() {
    let Inbound::DistributeEvent(d) = fixture("distribute") else {
        panic!("not a distribute");
    };
    let e = &d.events[1].event;
    assert_eq!(e.status, EventStatus::Pending);
    let targets: Vec<GridTarget> = e.intervals.iter().map(|i| i.target).collect();
    assert_eq!(
        targets,
        vec![GridTarget::ShedW(50_000.0), GridTarget::CapW(1_500_000.0)]
    );
    // the price signal is skipped and counted
    assert_eq!(d.skipped, vec!["signal_name"]);
}

#[test]
fn load_control_capacity_offset_and_setpoint() {
    let Inbound::DistributeEvent(d) = fixture("distribute") else {
        panic!("not a distribute");
    };
    let e = &d.events[2].event;
    assert_eq!(e.status, EventStatus::Cancelled);
    let mut got: Vec<(Timestamp, GridTarget)> =
        e.intervals.iter().map(|i| (i.start, i.target)).collect();
    got.sort_by(|a, b| {
        a.0.cmp(&b.0)
            .then(format!("{:?}", a.1).cmp(&format!("{:?}", b.1)))
    });
    let close = |t: &GridTarget, want: f64| match t {
        GridTarget::ShedFraction(f) => (f - want).abs() < 1e-9,
        _ => false,
    };
    assert_eq!(got.len(), 4);
    assert!(
        got.iter().any(|(t, g)| *t == at(0) && close(g, 0.2)),
        "{got:?}"
    );
    assert!(
        got.iter().any(|(t, g)| *t == at(10) && close(g, 0.5)),
        "{got:?}"
    );
    assert!(got.contains(&(at(0), GridTarget::CapW(900.0))));
}

#[test]
fn poll_answers_of_every_kind() {
    assert!(matches!(fixture("response"), Inbound::Response(s) if s.ok()));
    assert_eq!(parse("").ok(), Some(Inbound::Empty));
    assert_eq!(
        fixture("request_reregistration"),
        Inbound::RequestReregistration
    );
    assert_eq!(
        fixture("cancel_party_registration"),
        Inbound::CancelPartyRegistration {
            request_id: "c1".into(),
            registration_id: "reg1".into()
        }
    );
    assert_eq!(
        fixture("register_report"),
        Inbound::RegisterReport {
            request_id: "vr1".into()
        }
    );
    let want = vec![ReportRequest {
        report_request_id: "rr1".into(),
        specifier_id: "powerplane-meter".into(),
        granularity_s: Some(2.0),
        report_back_s: Some(4.0),
        r_ids: vec!["meter-power-w".into()],
    }];
    assert_eq!(
        fixture("create_report"),
        Inbound::CreateReport {
            request_id: "cr1".into(),
            requests: want.clone()
        }
    );
    let Inbound::RegisteredReport { status, requests } = fixture("registered_report") else {
        panic!("not a registered report");
    };
    assert!(status.ok());
    assert_eq!(requests, want);
}

#[test]
fn broken_payloads_are_rejected_by_reason_never_panicking() {
    let r = |s: &str| parse(s).err().map(|e| e.reason());
    assert_eq!(r("<oadrPayload"), Some("xml"));
    assert_eq!(r("<a/>"), Some("not_oadr"));
    // the right names in the wrong namespace are not OpenADR
    assert_eq!(
        r("<oadrPayload><oadrSignedObject><oadrPoll/></oadrSignedObject></oadrPayload>"),
        Some("not_oadr")
    );
    let d = include_str!("testdata/distribute.xml");
    assert_eq!(
        r(&d.replace("<ei:modificationNumber>2<", "<ei:modificationNumber>two<")),
        Some("bad_value")
    );
    assert_eq!(
        r(&d.replace("ei:eventStatus>", "ei:eventState>")),
        Some("missing_element")
    );
    assert_eq!(r(&d.replace(">active<", ">sleeping<")), Some("bad_value"));
    // a SIMPLE level out of range skips that signal, not the event
    let Ok(Inbound::DistributeEvent(x)) =
        parse(&d.replace("<ei:value>2</ei:value>", "<ei:value>7</ei:value>"))
    else {
        panic!("distribute");
    };
    assert!(x.events[0].event.intervals.is_empty());
    assert!(x.skipped.contains(&"level"));
}

#[test]
fn a_signal_with_more_intervals_than_the_bound_is_skipped() {
    let d = include_str!("testdata/distribute.xml");
    // the first interval of the first signal, repeated past the bound
    let a = d.find("<ei:interval>").expect("an interval");
    let b = d[a..].find("</ei:interval>").expect("its end") + a + "</ei:interval>".len();
    let one = &d[a..b];
    let count = |n: usize| {
        let many = format!("{}{}{}", &d[..a], one.repeat(n), &d[b..]);
        let Ok(Inbound::DistributeEvent(x)) = parse(&many) else {
            panic!("distribute");
        };
        x
    };
    // the fixture's other intervals (9 in all) come on top
    let within = count(MAX_INTERVALS - 9);
    assert!(!within.skipped.contains(&"too_many_intervals"));
    assert!(within.events[0].event.intervals.len() >= MAX_INTERVALS - 9);
    let over = count(MAX_INTERVALS + 1);
    assert!(
        over.skipped.contains(&"too_many_intervals"),
        "{:?}",
        over.skipped
    );
    assert!(over
        .events
        .iter()
        .all(|e| e.event.intervals.len() <= MAX_INTERVALS));
}

#[test]
fn intervals_without_a_start_follow_each_other_from_the_active_period() {
    let d = include_str!("testdata/distribute.xml");
    // drop every interval dtstart: the 2.0b form (intervals in sequence)
    let mut s = String::new();
    let mut rest = d;
    while let Some(i) = rest.find("<xcal:dtstart>") {
        s.push_str(&rest[..i]);
        let j = rest[i..].find("</xcal:dtstart>").expect("end") + i + "</xcal:dtstart>".len();
        rest = &rest[j..];
    }
    s.push_str(rest);
    let Ok(Inbound::DistributeEvent(x)) = parse(&s) else {
        panic!("distribute");
    };
    let i = &x.events[0].event.intervals;
    assert_eq!((i[0].start, i[1].start), (at(0), at(10)));
}

proptest::proptest! {
    /// Cut, spliced or doubled, a payload is read or rejected, never a panic.
    #[test]
    fn no_payload_makes_the_reader_panic(
        at in 0usize..20_000,
        len in 0usize..400,
        junk in "[<>/=\"a-zA-Z0-9:. -]{0,40}",
    ) {
        let d = include_str!("testdata/distribute.xml");
        let at = at.min(d.len());
        let end = (at + len).min(d.len());
        proptest::prop_assume!(d.is_char_boundary(at) && d.is_char_boundary(end));
        let _ = parse(&format!("{}{junk}{}", &d[..at], &d[end..]));
        let _ = parse(&format!("{}{}", &d[..end], &d[at..]));
    }
}
