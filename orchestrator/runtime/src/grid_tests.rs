use super::*;

const SITE: &str = "version = 1\n[site]\nname = \"t\"\n[[feeds]]\nid = \"f\"\nrating_kw = 30\n[[cooling]]\nid = \"c\"\ncapacity_kw = 30\nracks = [\"r1\"]\n[[rooms]]\nid = \"h\"\n[[rows]]\nid = \"w\"\nroom = \"h\"\n[[racks]]\nid = \"r1\"\nrow = \"w\"\npower_budget_kw = 10\nnodes = 1\ngpus_per_node = 2\ngpu_model = \"A40\"\n";

fn section(toml: &str) -> DemandResponseSection {
    toml::from_str(toml).expect("section")
}

#[test]
fn an_event_under_the_reachable_floor_is_opted_out_with_the_reason() {
    use sources::openadr2b::Opt;
    let e = GridEvent {
        id: "e".into(),
        source: "openadr2b".into(),
        modification: 0,
        status: telemetry::grid::EventStatus::Pending,
        intervals: vec![telemetry::grid::GridInterval {
            start: Timestamp::from_secs(0),
            duration_s: 3600.0,
            target: telemetry::grid::GridTarget::ShedFraction(0.5),
        }],
        program: String::new(),
    };
    let levels = [(1, 0.1)];
    // 100 kW now, half asked: 50 kW against a floor of 60 kW
    match opt_for(&e, true, Some(100_000.0), Some(60_000.0), &levels) {
        Opt::Out { reason } => assert!(reason.contains("60.0 kW at best"), "{reason}"),
        Opt::In => panic!("opted in under the floor"),
    }
    assert_eq!(
        opt_for(&e, true, Some(100_000.0), Some(40_000.0), &levels),
        Opt::In
    );
    assert_eq!(
        opt_for(&e, false, Some(100_000.0), Some(60_000.0), &levels),
        Opt::In
    );
    assert_eq!(opt_for(&e, true, Some(100_000.0), None, &levels), Opt::In);
}

#[test]
fn the_section_says_every_problem() {
    let s = section("protocol = \"openadr2b\"\ntimeout_s = 0\nlevels = { 4 = 10, 1 = 150 }\n");
    let p = s.problems();
    assert_eq!(p.len(), 4, "{p:?}");
    assert!(p.contains(&SectionError::Vtn("openadr2b")));
    assert!(section("ven_name = \"v\"\n").problems() == vec![SectionError::NoProtocol]);
    assert!(section("").problems().is_empty());
    assert_eq!(
        section("").level_table(),
        vec![(1, 0.1), (2, 0.25), (3, 0.5)]
    );
}

#[test]
fn an_openadr3_section_needs_its_client_and_reads_its_secret_file() {
    let base =
        "protocol = \"openadr3\"\nvtn_url = \"https://vtn/openadr3\"\nven_name = \"site-a\"\n";
    assert_eq!(
        section(base).problems(),
        vec![SectionError::Openadr3Credentials]
    );
    let dir = tempfile::tempdir().expect("dir");
    std::fs::write(dir.path().join("secret"), "s3cret\n").expect("secret");
    let mut s = section(&format!(
        "{base}client_id = \"site-a\"\nclient_secret_file = \"secret\"\nprograms = [\"ers-10\"]\npoll_s = 5\nreport_s = 30\nnotifications = false\n"
    ));
    s.read_secrets(dir.path()).expect("read");
    assert!(s.problems().is_empty(), "{:?}", s.problems());
    let c = s.ven3_config().expect("openadr3");
    assert_eq!(
        (c.client_id.as_str(), c.client_secret.as_str()),
        ("site-a", "s3cret")
    );
    assert_eq!((c.poll_s, c.report_s, c.notifications), (5.0, 30.0, false));
    assert_eq!(c.programs, vec!["ers-10".to_string()]);
    assert!(s.ven_config().is_none(), "no 2.0b VEN");
    // a missing secret file is named
    let mut m = section(&format!(
        "{base}client_id = \"a\"\nclient_secret_file = \"nope\"\n"
    ));
    let e = m.read_secrets(dir.path()).expect_err("missing");
    assert!(e.to_string().contains("nope"), "{e}");
    // OpenADR 3's keys with another protocol, and a bad report period
    let p = section(
        "protocol = \"openadr2b\"\nvtn_url = \"https://vtn\"\nven_name = \"v\"\nclient_id = \"c\"\n",
    )
    .problems();
    assert_eq!(p, vec![SectionError::Openadr3Only]);
    // XML signatures: 2.0b's, with the TLS identity that signs
    let signed = section(
        "protocol = \"openadr2b\"\nvtn_url = \"https://vtn\"\nven_name = \"v\"\nxml_signature = true\n[tls]\nclient_cert_file = \"ven.pem\"\nclient_key_file = \"ven.key\"\n",
    );
    assert!(signed.problems().is_empty(), "{:?}", signed.problems());
    assert!(signed.ven_config().expect("2.0b").xml_signature);
    let p = section(
        "protocol = \"openadr2b\"\nvtn_url = \"https://vtn\"\nven_name = \"v\"\nxml_signature = true\n",
    )
    .problems();
    assert!(
        matches!(p.as_slice(), [SectionError::Ven(m)] if m.contains("xml_signature")),
        "{p:?}"
    );
    assert!(section(&format!("{base}xml_signature = true\n"))
        .problems()
        .contains(&SectionError::Openadr2bOnly));
    let mut r = section(&format!(
        "{base}client_id = \"site-a\"\nclient_secret_file = \"secret\"\nreport_s = 0\n"
    ));
    r.read_secrets(dir.path()).expect("read");
    let p = r.problems();
    assert!(
        matches!(p.as_slice(), [SectionError::Ven(m)] if m.contains("report_s")),
        "{p:?}"
    );
}

#[test]
fn scheduled_targets_are_published_in_their_window_and_reread_when_changed() {
    let dir = tempfile::tempdir().expect("dir");
    let file = dir.path().join("targets.toml");
    std::fs::write(
        &file,
        "[[targets]]\nid = \"peak\"\nstart = \"2026-07-01T14:00:00Z\"\nduration_min = 60\nshed_pct = 20\n",
    )
    .expect("write");
    let s = section("targets_file = \"targets.toml\"\n");
    let mut g = Grid::open(Some(&s), dir.path()).expect("open");
    let site = Site::parse("t.toml", SITE).expect("site");
    let start = Timestamp::parse_rfc3339("2026-07-01T14:00:00Z").expect("time");
    let mut out = Vec::new();
    g.tick(&site, 10_000.0, start.plus_secs(-60.0), &mut out);
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].value, 0.0, "before the window: no event");
    out.clear();
    g.schedule_checked = None;
    g.tick(&site, 10_000.0, start.plus_secs(60.0), &mut out);
    let active = out
        .iter()
        .find(|x| x.metric.as_str() == "grid_event_active");
    assert_eq!(active.map(|x| x.value), Some(1.0));
    assert!(out
        .iter()
        .any(|x| x.metric.as_str() == "grid_shed_fraction" && (x.value - 0.2).abs() < 1e-12));
    // a bad edit keeps the last good schedule
    std::fs::write(&file, "[[targets]]\nduration_min = 60\nshed_pct = 20\n").expect("write");
    let later = SystemTime::now() + Duration::from_secs(5);
    let f = std::fs::File::options()
        .write(true)
        .open(&file)
        .expect("open");
    f.set_modified(later).expect("mtime");
    g.schedule_checked = None;
    out.clear();
    g.tick(&site, 10_000.0, start.plus_secs(120.0), &mut out);
    assert!(out
        .iter()
        .any(|x| x.metric.as_str() == "grid_event_active" && x.value == 1.0));
    assert_eq!(g.events(start).len(), 1);
}

#[test]
fn without_a_section_nothing_is_published_until_a_target_is_posted() {
    let dir = tempfile::tempdir().expect("dir");
    let mut g = Grid::open(None, dir.path()).expect("open");
    let site = Site::parse("t.toml", SITE).expect("site");
    let now = Timestamp::from_secs(1_790_000_000);
    let mut out = Vec::new();
    g.tick(&site, 10_000.0, now, &mut out);
    assert!(out.is_empty());
    let spec: targets::TargetSpec =
        serde_json::from_str(r#"{"duration_min": 30, "cap_kw": 7}"#).expect("spec");
    let e = {
        let mut b = g.book.lock().expect("book");
        let id = b.next_id();
        b.post(spec.event("api", id, now, false).expect("valid"))
    };
    assert_eq!(e.id, "t1");
    g.tick(&site, 10_000.0, now.plus_secs(1.0), &mut out);
    assert!(out
        .iter()
        .any(|x| x.metric.as_str() == "grid_cap_w" && x.value == 7000.0));
}
