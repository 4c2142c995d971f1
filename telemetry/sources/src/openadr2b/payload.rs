//! The payloads the VEN sends, written as OpenADR 2.0b XML (`oadrPayload` /
//! `oadrSignedObject`; signed, when asked, by [`super::sign`]). Pure: ids and times are
//! arguments. Every text is escaped; element order follows the 2.0b schema, which the
//! VTN validates.

use std::fmt::Write as _;

use telemetry::Timestamp;

use super::iso::{format_datetime, format_duration};

pub const NS_OADR: &str = "http://openadr.org/oadr-2.0b/2012/07";
pub const NS_EI: &str = "http://docs.oasis-open.org/ns/energyinterop/201110";
pub const NS_PYLD: &str = "http://docs.oasis-open.org/ns/energyinterop/201110/payloads";
pub const NS_EMIX: &str = "http://docs.oasis-open.org/ns/emix/2011/06";
pub const NS_XCAL: &str = "urn:ietf:params:xml:ns:icalendar-2.0";
pub const NS_STRM: &str = "urn:ietf:params:xml:ns:icalendar-2.0:stream";
pub const NS_POWER: &str = "http://docs.oasis-open.org/ns/emix/2011/06/power";
pub const NS_SCALE: &str = "http://docs.oasis-open.org/ns/emix/2011/06/siscale";

/// Every namespace a payload declares, by prefix: on the envelope and again on the
/// signed object, so that the signed object's canonical form (for an XML signature) is
/// the same in place and copied out.
pub const NAMESPACES: [(&str, &str); 8] = [
    ("oadr", NS_OADR),
    ("ei", NS_EI),
    ("pyld", NS_PYLD),
    ("emix", NS_EMIX),
    ("xcal", NS_XCAL),
    ("strm", NS_STRM),
    ("power", NS_POWER),
    ("scale", NS_SCALE),
];

/// The report the VEN offers: TELEMETRY_USAGE, one data point (real power at the
/// meter, W).
pub const REPORT_SPECIFIER_ID: &str = "powerplane-meter";
pub const METER_RID: &str = "meter-power-w";
pub const METER_RESOURCE: &str = "meter";

/// Text and attribute escaping (`& < > " '`).
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c => out.push(c),
        }
    }
    out
}

fn envelope(name: &str, inner: &str) -> String {
    let mut decls = String::new();
    for (prefix, uri) in NAMESPACES {
        let _ = write!(decls, " xmlns:{prefix}=\"{uri}\"");
    }
    format!(
        "<?xml version=\"1.0\" encoding=\"utf-8\"?>\n\
         <oadr:oadrPayload{decls}>\
         <oadr:oadrSignedObject{decls} oadr:Id=\"oadrSignedObject\">\
         <oadr:{name} ei:schemaVersion=\"2.0b\">{inner}</oadr:{name}>\
         </oadr:oadrSignedObject></oadr:oadrPayload>"
    )
}

fn el(out: &mut String, name: &str, text: &str) {
    let _ = write!(out, "<{name}>{}</{name}>", esc(text));
}

fn ei_response(out: &mut String, code: u16, description: &str, request_id: &str) {
    out.push_str("<ei:eiResponse>");
    el(out, "ei:responseCode", &code.to_string());
    el(out, "ei:responseDescription", description);
    el(out, "pyld:requestID", request_id);
    out.push_str("</ei:eiResponse>");
}

/// `oadrQueryRegistration`: what the VTN supports, and (for some VTNs) whether it
/// knows this VEN.
pub fn query_registration(request_id: &str) -> String {
    let mut b = String::new();
    el(&mut b, "pyld:requestID", request_id);
    envelope("oadrQueryRegistration", &b)
}

/// `oadrCreatePartyRegistration`: profile 2.0b, simpleHttp, pull model, not report-only,
/// no XML signatures. With the ids of a registration, it re-registers.
pub fn create_party_registration(
    request_id: &str,
    registration_id: Option<&str>,
    ven_id: Option<&str>,
    ven_name: &str,
    xml_signature: bool,
) -> String {
    let mut b = String::new();
    el(&mut b, "pyld:requestID", request_id);
    if let Some(r) = registration_id {
        el(&mut b, "ei:registrationID", r);
    }
    if let Some(v) = ven_id {
        el(&mut b, "ei:venID", v);
    }
    el(&mut b, "oadr:oadrProfileName", "2.0b");
    el(&mut b, "oadr:oadrTransportName", "simpleHttp");
    el(&mut b, "oadr:oadrReportOnly", "false");
    el(
        &mut b,
        "oadr:oadrXmlSignature",
        if xml_signature { "true" } else { "false" },
    );
    el(&mut b, "oadr:oadrVenName", ven_name);
    el(&mut b, "oadr:oadrHttpPullModel", "true");
    envelope("oadrCreatePartyRegistration", &b)
}

/// `oadrPoll`.
pub fn poll(ven_id: &str) -> String {
    let mut b = String::new();
    el(&mut b, "ei:venID", ven_id);
    envelope("oadrPoll", &b)
}

/// `oadrRequestEvent`: every event the VTN holds for this VEN (sent after registering).
pub fn request_event(request_id: &str, ven_id: &str) -> String {
    let mut b = String::from("<pyld:eiRequestEvent>");
    el(&mut b, "pyld:requestID", request_id);
    el(&mut b, "ei:venID", ven_id);
    b.push_str("</pyld:eiRequestEvent>");
    envelope("oadrRequestEvent", &b)
}

/// What the VEN says of one event.
#[derive(Debug, Clone, PartialEq)]
pub struct EventReply {
    pub event_id: String,
    pub modification: u32,
    pub opt_in: bool,
    /// Why it opted out (sent as the response description).
    pub reason: Option<String>,
}

/// `oadrCreatedEvent`: the answer to an `oadrDistributeEvent` (whose `requestID` is
/// `request_id`), one `eventResponse` per event answered.
pub fn created_event(request_id: &str, ven_id: &str, replies: &[EventReply]) -> String {
    let mut b = String::from("<pyld:eiCreatedEvent>");
    ei_response(&mut b, 200, "OK", request_id);
    if !replies.is_empty() {
        b.push_str("<ei:eventResponses>");
        for r in replies {
            b.push_str("<ei:eventResponse>");
            el(&mut b, "ei:responseCode", "200");
            if let Some(reason) = &r.reason {
                el(&mut b, "ei:responseDescription", reason);
            }
            el(&mut b, "pyld:requestID", request_id);
            b.push_str("<ei:qualifiedEventID>");
            el(&mut b, "ei:eventID", &r.event_id);
            el(&mut b, "ei:modificationNumber", &r.modification.to_string());
            b.push_str("</ei:qualifiedEventID>");
            el(
                &mut b,
                "ei:optType",
                if r.opt_in { "optIn" } else { "optOut" },
            );
            b.push_str("</ei:eventResponse>");
        }
        b.push_str("</ei:eventResponses>");
    }
    el(&mut b, "ei:venID", ven_id);
    b.push_str("</pyld:eiCreatedEvent>");
    envelope("oadrCreatedEvent", &b)
}

/// `oadrRegisterReport`: the VEN's one METADATA_TELEMETRY_USAGE report (real power at
/// the meter, W, sampled every `min_s`..`max_s`), with reportRequestID 0 as the spec
/// asks of a VEN's own registration.
pub fn register_report(
    request_id: &str,
    ven_id: &str,
    now: Timestamp,
    min_s: f64,
    max_s: f64,
) -> String {
    let mut b = String::new();
    el(&mut b, "pyld:requestID", request_id);
    b.push_str("<oadr:oadrReport>");
    b.push_str("<xcal:duration>");
    el(&mut b, "xcal:duration", "PT3600S");
    b.push_str("</xcal:duration>");
    b.push_str("<oadr:oadrReportDescription>");
    el(&mut b, "ei:rID", METER_RID);
    b.push_str("<ei:reportDataSource>");
    el(&mut b, "ei:resourceID", METER_RESOURCE);
    b.push_str("</ei:reportDataSource>");
    el(&mut b, "ei:reportType", "usage");
    b.push_str("<power:powerReal>");
    el(&mut b, "power:itemDescription", "RealPower");
    el(&mut b, "power:itemUnits", "W");
    el(&mut b, "scale:siScaleCode", "none");
    b.push_str("<power:powerAttributes>");
    el(&mut b, "power:hertz", "50");
    el(&mut b, "power:voltage", "230");
    el(&mut b, "power:ac", "true");
    b.push_str("</power:powerAttributes></power:powerReal>");
    el(&mut b, "ei:readingType", "Direct Read");
    b.push_str("<oadr:oadrSamplingRate>");
    el(&mut b, "oadr:oadrMinPeriod", &format_duration(min_s));
    el(&mut b, "oadr:oadrMaxPeriod", &format_duration(max_s));
    el(&mut b, "oadr:oadrOnChange", "false");
    b.push_str("</oadr:oadrSamplingRate></oadr:oadrReportDescription>");
    el(&mut b, "ei:reportRequestID", "0");
    el(&mut b, "ei:reportSpecifierID", REPORT_SPECIFIER_ID);
    el(&mut b, "ei:reportName", "METADATA_TELEMETRY_USAGE");
    el(&mut b, "ei:createdDateTime", &format_datetime(now));
    b.push_str("</oadr:oadrReport>");
    el(&mut b, "ei:venID", ven_id);
    envelope("oadrRegisterReport", &b)
}

/// `oadrCreatedReport`: the reports the VEN now sends (their reportRequestIDs).
pub fn created_report(request_id: &str, ven_id: &str, pending: &[String]) -> String {
    let mut b = String::new();
    ei_response(&mut b, 200, "OK", request_id);
    b.push_str("<oadr:oadrPendingReports>");
    for p in pending {
        el(&mut b, "ei:reportRequestID", p);
    }
    b.push_str("</oadr:oadrPendingReports>");
    el(&mut b, "ei:venID", ven_id);
    envelope("oadrCreatedReport", &b)
}

/// `oadrUpdateReport`: TELEMETRY_USAGE with the metered power (W) at each time.
pub fn update_report(
    request_id: &str,
    ven_id: &str,
    report_request_id: &str,
    now: Timestamp,
    values: &[(Timestamp, f64)],
) -> String {
    let mut b = String::new();
    el(&mut b, "pyld:requestID", request_id);
    b.push_str("<oadr:oadrReport><strm:intervals>");
    for (t, w) in values {
        b.push_str("<ei:interval><xcal:dtstart>");
        el(&mut b, "xcal:date-time", &format_datetime(*t));
        b.push_str("</xcal:dtstart><oadr:oadrReportPayload>");
        el(&mut b, "ei:rID", METER_RID);
        b.push_str("<ei:payloadFloat>");
        el(&mut b, "ei:value", &w.to_string());
        b.push_str("</ei:payloadFloat>");
        el(
            &mut b,
            "oadr:oadrDataQuality",
            "Quality Good - Non Specific",
        );
        b.push_str("</oadr:oadrReportPayload></ei:interval>");
    }
    b.push_str("</strm:intervals>");
    el(
        &mut b,
        "ei:eiReportID",
        &format!("{report_request_id}-{}", now.as_millis()),
    );
    el(&mut b, "ei:reportRequestID", report_request_id);
    el(&mut b, "ei:reportSpecifierID", REPORT_SPECIFIER_ID);
    el(&mut b, "ei:reportName", "TELEMETRY_USAGE");
    el(&mut b, "ei:createdDateTime", &format_datetime(now));
    b.push_str("</oadr:oadrReport>");
    el(&mut b, "ei:venID", ven_id);
    envelope("oadrUpdateReport", &b)
}

/// `oadrRegisteredReport`: the answer to a VTN's own `oadrRegisterReport` (the VEN
/// requests none of its reports).
pub fn registered_report(request_id: &str, ven_id: &str) -> String {
    let mut b = String::new();
    ei_response(&mut b, 200, "OK", request_id);
    el(&mut b, "ei:venID", ven_id);
    envelope("oadrRegisteredReport", &b)
}

/// `oadrCanceledPartyRegistration`: the answer to the VTN's
/// `oadrCancelPartyRegistration`.
pub fn canceled_party_registration(
    request_id: &str,
    registration_id: &str,
    ven_id: &str,
) -> String {
    let mut b = String::new();
    ei_response(&mut b, 200, "OK", request_id);
    el(&mut b, "ei:registrationID", registration_id);
    el(&mut b, "ei:venID", ven_id);
    envelope("oadrCanceledPartyRegistration", &b)
}

/// `oadrResponse` (200 OK), as to an `oadrRequestReregistration`.
pub fn response(request_id: &str, ven_id: &str) -> String {
    let mut b = String::new();
    ei_response(&mut b, 200, "OK", request_id);
    el(&mut b, "ei:venID", ven_id);
    envelope("oadrResponse", &b)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc(s: &str) -> roxmltree::Document<'_> {
        roxmltree::Document::parse(s).unwrap_or_else(|e| panic!("{e}: {s}"))
    }

    fn find(d: &roxmltree::Document, ns: &str, name: &str) -> Vec<String> {
        d.descendants()
            .filter(|n| n.tag_name().name() == name && n.tag_name().namespace() == Some(ns))
            .map(|n| n.text().unwrap_or("").to_string())
            .collect()
    }

    #[test]
    fn registration_says_2_0b_simple_http_pull_unsigned() {
        let x = create_party_registration("r1", None, None, "site <a> & \"b\"", false);
        let d = doc(&x);
        assert_eq!(find(&d, NS_OADR, "oadrVenName"), vec!["site <a> & \"b\""]);
        assert_eq!(find(&d, NS_OADR, "oadrProfileName"), vec!["2.0b"]);
        assert_eq!(find(&d, NS_OADR, "oadrTransportName"), vec!["simpleHttp"]);
        assert_eq!(find(&d, NS_OADR, "oadrHttpPullModel"), vec!["true"]);
        assert_eq!(find(&d, NS_OADR, "oadrReportOnly"), vec!["false"]);
        assert_eq!(find(&d, NS_OADR, "oadrXmlSignature"), vec!["false"]);
        assert!(find(&d, NS_EI, "venID").is_empty());
        let again = create_party_registration("r2", Some("reg1"), Some("ven1"), "a", true);
        let d = doc(&again);
        assert_eq!(find(&d, NS_EI, "registrationID"), vec!["reg1"]);
        assert_eq!(find(&d, NS_EI, "venID"), vec!["ven1"]);
        assert_eq!(find(&d, NS_OADR, "oadrXmlSignature"), vec!["true"]);
    }

    #[test]
    fn created_event_names_each_event_and_its_modification() {
        let x = created_event(
            "req-7",
            "ven1",
            &[
                EventReply {
                    event_id: "a".into(),
                    modification: 3,
                    opt_in: true,
                    reason: None,
                },
                EventReply {
                    event_id: "b".into(),
                    modification: 0,
                    opt_in: false,
                    reason: Some("mustRun".into()),
                },
            ],
        );
        let d = doc(&x);
        assert_eq!(find(&d, NS_EI, "eventID"), vec!["a", "b"]);
        assert_eq!(find(&d, NS_EI, "modificationNumber"), vec!["3", "0"]);
        assert_eq!(find(&d, NS_EI, "optType"), vec!["optIn", "optOut"]);
        assert_eq!(find(&d, NS_PYLD, "requestID"), vec!["req-7"; 3]);
        assert_eq!(
            find(&d, NS_EI, "responseDescription"),
            vec!["OK", "mustRun"]
        );
    }

    #[test]
    fn reports_offer_and_carry_real_power_in_w() {
        let t = Timestamp::from_secs(1_796_407_200);
        let d = register_report("r", "ven1", t, 1.0, 60.0);
        let d = doc(&d);
        assert_eq!(find(&d, NS_EI, "reportRequestID"), vec!["0"]);
        assert_eq!(
            find(&d, NS_EI, "reportName"),
            vec!["METADATA_TELEMETRY_USAGE"]
        );
        assert_eq!(find(&d, NS_EI, "rID"), vec![METER_RID]);
        assert_eq!(find(&d, NS_POWER, "itemUnits"), vec!["W"]);
        assert_eq!(find(&d, NS_OADR, "oadrMaxPeriod"), vec!["PT60S"]);
        let u = update_report(
            "u",
            "ven1",
            "rr1",
            t,
            &[(t, 1234.5), (t.plus_secs(2.0), 1200.0)],
        );
        let u = doc(&u);
        assert_eq!(find(&u, NS_EI, "value"), vec!["1234.5", "1200"]);
        assert_eq!(find(&u, NS_EI, "reportRequestID"), vec!["rr1"]);
        assert_eq!(
            find(&u, NS_XCAL, "date-time"),
            vec!["2026-12-04T18:00:00.000Z", "2026-12-04T18:00:02.000Z"]
        );
    }

    #[test]
    fn every_payload_is_well_formed() {
        let t = Timestamp::from_secs(0);
        for x in [
            query_registration("q"),
            poll("v&1"),
            request_event("q", "v"),
            created_report("q", "v", &["rr1".into()]),
            registered_report("q", "v"),
            canceled_party_registration("q", "reg", "v"),
            response("q", "v"),
            update_report("q", "v", "rr", t, &[]),
        ] {
            let d = doc(&x);
            assert_eq!(d.root_element().tag_name().name(), "oadrPayload");
        }
        assert_eq!(esc("<&>\"'"), "&lt;&amp;&gt;&quot;&apos;");
    }
}
