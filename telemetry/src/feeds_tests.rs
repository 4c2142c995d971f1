use super::*;

fn ts(s: &str) -> Timestamp {
    Timestamp::parse_rfc3339(s).expect("time")
}

/// The layout of netztransparenz.de's DE-LU day-ahead file (values made up): naive
/// local times, the zone in force, prices in ct/kWh; the repeated 02:00 of 2024-10-27
/// told apart by the zone, the skipped 02:00 of 2024-03-31 absent.
const DE_LU: &str = "\
time,sdate,stimestart,zone_start,stimeend,zone_end,price
2024-03-31 01:00:00,31.03.2024,01:00,CET,03:00,CEST,5.0
2024-03-31 03:00:00,31.03.2024,03:00,CEST,04:00,CEST,6.0
2024-10-27 01:00:00,27.10.2024,01:00,CEST,02:00,CEST,8.4
2024-10-27 02:00:00,27.10.2024,02:00,CEST,02:00,CET,8.223
2024-10-27 02:00:00,27.10.2024,02:00,CET,03:00,CET,8.043
2024-10-27 03:00:00,27.10.2024,03:00,CET,04:00,CET,-1.5
";

fn de_lu() -> CsvFormat {
    CsvFormat {
        time_column: "time".into(),
        value_column: "price".into(),
        unit: Unit::CentsPerKwh,
        time_format: Some("%Y-%m-%d %H:%M:%S".into()),
        timezone: Some("Europe/Berlin".into()),
        zone_column: Some("zone_start".into()),
        delimiter: ',',
        decimal_comma: false,
    }
}

#[test]
fn local_times_are_placed_right_across_both_dst_changes() {
    let s = parse_csv("de.csv", DE_LU, &de_lu()).expect("parses");
    let p = s.points();
    assert_eq!(p.len(), 6);
    // spring: 01:00 CET then 03:00 CEST are one hour apart
    assert_eq!(p[0].0, ts("2024-03-31T00:00:00Z"));
    assert_eq!(p[1].0, ts("2024-03-31T01:00:00Z"));
    // autumn: the two 02:00 are 00:00Z (CEST) and 01:00Z (CET)
    assert_eq!(p[3].0, ts("2024-10-27T00:00:00Z"));
    assert_eq!(p[4].0, ts("2024-10-27T01:00:00Z"));
    assert!((p[3].1 - 0.08223).abs() < 1e-12, "ct/kWh to per kWh");
    assert!(
        (p[5].1 + 0.015).abs() < 1e-12,
        "negative prices stay negative"
    );
}

#[test]
fn ambiguous_or_impossible_local_times_are_errors_with_their_line() {
    let mut f = de_lu();
    f.zone_column = None;
    let e = parse_csv("de.csv", DE_LU, &f).expect_err("ambiguous");
    assert!(
        e.to_string().starts_with("de.csv:5: ") && e.to_string().contains("happens twice"),
        "{e}"
    );
    let gap = "time,price\n2024-03-31 02:30:00,1\n";
    let e = parse_csv("g.csv", gap, &f).expect_err("skipped");
    assert!(e.to_string().contains("does not exist"), "{e}");
    let bad = "time,price\n2024-01-01 00:00:00,1\n2024-01-01 01:00:00,lots\n";
    assert_eq!(
        parse_csv("b.csv", bad, &f).expect_err("bad").to_string(),
        "b.csv:3: \"lots\" is not a number"
    );
    let mut tzless = de_lu();
    tzless.timezone = Some("Mars/Olympus".into());
    assert!(parse_csv("t.csv", DE_LU, &tzless)
        .expect_err("tz")
        .to_string()
        .contains("unknown time zone"));
    assert!("per_gallon".parse::<Unit>().is_err());
}

#[test]
fn semicolons_decimal_commas_offsets_and_gaps() {
    let text = "Zeit;Preis [EUR/MWh]\n2024-06-01T00:00:00+02:00;1.234,5\n2024-06-01T01:00:00+02:00;\n2024-06-01T02:00:00+02:00;-3,25\n";
    let f = CsvFormat {
        time_column: "Zeit".into(),
        value_column: "Preis [EUR/MWh]".into(),
        unit: Unit::PerMwh,
        time_format: None,
        timezone: None,
        zone_column: None,
        delimiter: ';',
        decimal_comma: true,
    };
    let s = parse_csv("smard.csv", text, &f).expect("parses");
    assert_eq!(
        s.points().len(),
        2,
        "an empty cell is a gap: the previous price holds"
    );
    assert!((s.at(ts("2024-05-31T23:30:00Z")).expect("in force") - 1.2345).abs() < 1e-12);
    assert!((s.points()[1].1 + 0.00325).abs() < 1e-12);
}

fn smard() -> CsvFormat {
    CsvFormat {
        time_column: "Zeit".into(),
        value_column: "Preis [EUR/MWh]".into(),
        unit: Unit::PerMwh,
        time_format: None,
        timezone: None,
        zone_column: None,
        delimiter: ';',
        decimal_comma: true,
    }
}

#[test]
fn a_quoted_field_may_hold_the_delimiter_and_decimal_commas_may_be_quoted() {
    let text = "Zeit;Quelle;\"Preis [EUR/MWh]\"\n2024-06-01T00:00:00+02:00;\"EPEX; DE-LU\";\"1.234,5\"\n2024-06-01T02:00:00+02:00;x;-3,25\n";
    let s = parse_csv("smard.csv", text, &smard()).expect("parses");
    assert_eq!(s.points().len(), 2);
    assert!((s.points()[0].1 - 1.2345).abs() < 1e-12);
    let mut f = smard();
    f.delimiter = ',';
    f.time_column = "time".into();
    f.value_column = "price".into();
    let text = "time,region,price\n2024-06-01T00:00:00Z,\"DE, LU\",80\n";
    let s = parse_csv("c.csv", text, &f).expect("parses");
    assert_eq!(s.points(), &[(ts("2024-06-01T00:00:00Z"), 0.08)]);
    // the old reading of a quote not right after the delimiter stays
    let text = "time, \"price\"\n2024-06-01T00:00:00Z, \"80\"\n";
    let s = parse_csv("c.csv", text, &f).expect("parses");
    assert_eq!(s.points(), &[(ts("2024-06-01T00:00:00Z"), 0.08)]);
}

#[test]
fn a_byte_order_mark_and_crlf_line_ends_are_read_as_plain_text() {
    let text = "\u{feff}Zeit;Preis [EUR/MWh]\r\n2024-06-01T00:00:00+02:00;1.234,5\r\n\r\n2024-06-01T01:00:00+02:00;\r\n2024-06-01T02:00:00+02:00;-3,25\r\n";
    let s = parse_csv("smard.csv", text, &smard()).expect("parses");
    assert_eq!(s.points().len(), 2);
    assert!((s.points()[1].1 + 0.00325).abs() < 1e-12);
    let bad = "\u{feff}Zeit;Preis [EUR/MWh]\r\n# c\r\n2024-06-01T00:00:00+02:00;viel\r\n";
    assert_eq!(
        parse_csv("smard.csv", bad, &smard())
            .expect_err("bad")
            .to_string(),
        "smard.csv:3: \"viel\" is not a number"
    );
    let mut f = de_lu();
    f.zone_column = None;
    let e = parse_csv("de.csv", &DE_LU.replace('\n', "\r\n"), &f).expect_err("ambiguous");
    assert!(e.to_string().starts_with("de.csv:5: "), "{e}");
    assert_eq!(
        parse_csv("de.csv", &DE_LU.replace('\n', "\r\n"), &de_lu()),
        parse_csv("de.csv", DE_LU, &de_lu())
    );
    let e = parse_csv("x.csv", "\u{feff}when,price\r\n", &de_lu()).expect_err("no column");
    assert_eq!(
        e.to_string(),
        "x.csv:1: no column \"time\" in the header \"when,price\""
    );
}

#[test]
fn json_as_objects_or_as_parallel_arrays() {
    let ec = r#"{"license_info": "CC BY 4.0", "unix_seconds": [1717200000, 1717203600, 1717207200], "price": [80.5, null, 95.0], "unit": "EUR / MWh"}"#;
    let s = parse_json(
        "ec.json",
        ec,
        &JsonFormat::Arrays {
            times: "/unix_seconds".into(),
            values: "/price".into(),
            unit: Unit::PerMwh,
        },
    )
    .expect("parses");
    assert_eq!(
        s.points(),
        &[
            (Timestamp(1_717_200_000_000), 0.0805),
            (Timestamp(1_717_207_200_000), 0.095)
        ]
    );
    let objs = r#"{"data": [{"start": "2024-06-01T00:00:00Z", "gco2": 420}, {"start": "2024-06-01T01:00:00Z", "gco2": 380.5}]}"#;
    let f = JsonFormat::Objects {
        items: "/data".into(),
        time_key: "start".into(),
        value_key: "gco2".into(),
        unit: Unit::GPerKwh,
    };
    let s = parse_json("c.json", objs, &f).expect("parses");
    assert_eq!(s.at(ts("2024-06-01T01:30:00Z")), Some(380.5));
    let e = parse_json(
        "c.json",
        r#"{"data": [{"start": "yesterday", "gco2": 1}]}"#,
        &f,
    )
    .expect_err("bad time");
    assert!(e.to_string().contains("item 0"), "{e}");
    let e = parse_json("c.json", "{\n\"data\": [", &f).expect_err("bad json");
    assert!(e.to_string().starts_with("c.json:2: "), "{e}");
}

/// [`ENTSOE`] written another way XML allows: a namespace prefix on every element,
/// attributes and whitespace inside the tags, values on lines of their own, a comment
/// holding a stale period, CDATA and an entity. The old reading by string search found
/// no period in it (and the commented one where it did).
const ENTSOE_PREFIXED: &str = r#"<?xml version="1.0" encoding="utf-8"?>
<md:Publication_MarketDocument xmlns:md="urn:iec62325.351:tc57wg16:451-3:publicationdocument:7:3" >
  <md:mRID>1</md:mRID>
  <md:type>A44</md:type>
  <!-- <Period><timeInterval><start>2024-10-26T22:00Z</start></timeInterval>
       <resolution>PT60M</resolution><Point><position>1</position><price.amount>999</price.amount></Point></Period> -->
  <md:TimeSeries>
    <md:curveType>A03</md:curveType>
    <md:Period xml:lang="en">
      <md:timeInterval>
        <md:start>
          2024-10-26T22:00Z
        </md:start>
        <md:end >2024-10-27T02:00Z</md:end>
      </md:timeInterval>
      <md:resolution><![CDATA[PT60M]]></md:resolution>
      <md:Point>
        <md:position>1</md:position>
        <md:price.amount>92.22</md:price.amount>
      </md:Point>
      <md:Point><md:position>2</md:position><md:price.amount>8&#52;.00</md:price.amount></md:Point>
      <md:Point ><md:position >4</md:position><md:price.amount
        >-5.10</md:price.amount></md:Point>
    </md:Period>
  </md:TimeSeries>
  <md:TimeSeries>
    <md:Period>
      <md:timeInterval><md:start>2024-10-27T02:00Z</md:start><md:end>2024-10-27T03:00Z</md:end></md:timeInterval>
      <md:resolution>PT15M</md:resolution>
      <md:Point><md:position>1</md:position><md:price.amount>70</md:price.amount></md:Point>
      <md:Point><md:position>3</md:position><md:price.amount>71</md:price.amount></md:Point>
    </md:Period>
  </md:TimeSeries>
</md:Publication_MarketDocument>
"#;

#[test]
fn entsoe_documents_read_the_same_in_any_namespace_prefix_and_whitespace() {
    let plain = parse_entsoe("a44.xml", ENTSOE).expect("parses");
    assert_eq!(parse_entsoe("a44.xml", ENTSOE_PREFIXED), Ok(plain.clone()));
    let crlf = ENTSOE
        .replace('\n', "\r\n")
        .replace("<Period>", "<Period >");
    assert_eq!(parse_entsoe("a44.xml", &crlf), Ok(plain));
}

/// The shape of an ENTSO-E A44 document (values made up), with a left-out position (A03).
const ENTSOE: &str = r#"<?xml version="1.0" encoding="utf-8"?>
<Publication_MarketDocument xmlns="urn:iec62325.351:tc57wg16:451-3:publicationdocument:7:3">
  <mRID>1</mRID>
  <type>A44</type>
  <TimeSeries>
    <mRID>1</mRID>
    <currency_Unit.name>EUR</currency_Unit.name>
    <price_Measure_Unit.name>MWH</price_Measure_Unit.name>
    <curveType>A03</curveType>
    <Period>
      <timeInterval>
        <start>2024-10-26T22:00Z</start>
        <end>2024-10-27T02:00Z</end>
      </timeInterval>
      <resolution>PT60M</resolution>
      <Point><position>1</position><price.amount>92.22</price.amount></Point>
      <Point><position>2</position><price.amount>84.00</price.amount></Point>
      <Point><position>4</position><price.amount>-5.10</price.amount></Point>
    </Period>
  </TimeSeries>
  <TimeSeries>
    <Period>
      <timeInterval><start>2024-10-27T02:00Z</start><end>2024-10-27T03:00Z</end></timeInterval>
      <resolution>PT15M</resolution>
      <Point><position>1</position><price.amount>70</price.amount></Point>
      <Point><position>3</position><price.amount>71</price.amount></Point>
    </Period>
  </TimeSeries>
</Publication_MarketDocument>
"#;

#[test]
fn entsoe_day_ahead_documents_read_per_kwh_with_left_out_points_held() {
    let s = parse_entsoe("a44.xml", ENTSOE).expect("parses");
    let at = |t: &str| s.at(ts(t)).expect("in force");
    let near = |a: f64, b: f64| (a - b).abs() < 1e-12;
    assert!(near(at("2024-10-26T22:30:00Z"), 0.09222));
    // position 3 was left out: position 2's price holds through it
    assert!(near(at("2024-10-27T00:30:00Z"), 0.084));
    assert!(near(at("2024-10-27T01:00:00Z"), -0.0051));
    assert!(near(at("2024-10-27T02:20:00Z"), 0.07), "15-minute steps");
    assert!(near(at("2024-10-27T02:30:00Z"), 0.071));
    assert!(parse_entsoe("x.xml", "<Acknowledgement_MarketDocument/>")
        .expect_err("not a44")
        .to_string()
        .contains("not an ENTSO-E"));
    assert!(parse_entsoe("x.xml", "<Acknowledgement_MarketDocument><Reason>Publication_MarketDocument</Reason></Acknowledgement_MarketDocument>")
        .expect_err("not a44")
        .to_string()
        .contains("not an ENTSO-E"));
    let e = parse_entsoe(
        "x.xml",
        "<Publication_MarketDocument>\n<Period>\n</Publication_MarketDocument>",
    )
    .expect_err("not closed");
    assert!(
        e.to_string().starts_with("x.xml:3: not well-formed XML"),
        "{e}"
    );
    let past_end = ENTSOE.replace("<position>4</position>", "<position>9</position>");
    assert!(parse_entsoe("x.xml", &past_end)
        .expect_err("past end")
        .to_string()
        .contains("after the period's end"));
}
