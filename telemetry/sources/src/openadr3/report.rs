//! The reports the OpenADR 3 VEN sends: the meter over a period, as the event asked.

use serde_json::json;

use super::held::DueReport;
use super::parse::ReportKind;
use crate::openadr2b::iso;

/// A report of the meter for one event (OpenADR 3.1 `REPORT`, with the 3.0 `programID`
/// beside): one interval covering the samples, one payload per kind asked.
pub fn report_body(ven_name: &str, r: &DueReport) -> serde_json::Value {
    let kw = r.mean_w / 1000.0;
    let descriptors: Vec<_> = r
        .kinds
        .iter()
        .map(|k| match k {
            ReportKind::Power(t) => json!({"objectType": "REPORT_PAYLOAD_DESCRIPTOR", "payloadType": t, "readingType": "MEAN", "units": "KW"}),
            ReportKind::Usage => json!({"objectType": "REPORT_PAYLOAD_DESCRIPTOR", "payloadType": "USAGE", "readingType": "SUMMED", "units": "KWH"}),
        })
        .collect();
    let payloads: Vec<_> = r
        .kinds
        .iter()
        .map(|k| {
            let v = match k {
                ReportKind::Power(_) => kw,
                ReportKind::Usage => kw * r.seconds / 3600.0,
            };
            json!({"type": k.payload_type(), "values": [(v * 1000.0).round() / 1000.0]})
        })
        .collect();
    json!({
        "objectType": "REPORT",
        "programID": r.program_id,
        "eventID": r.event_id,
        "clientName": ven_name,
        "reportName": format!("powerplane {} {}", r.event_id, iso::format_datetime(r.start)),
        "payloadDescriptors": descriptors,
        "resources": [{
            "resourceName": "AGGREGATED_REPORT",
            "intervalPeriod": {
                "start": iso::format_datetime(r.start),
                "duration": iso::format_duration(r.seconds),
            },
            "intervals": [{"id": 0, "payloads": payloads}],
        }],
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use telemetry::Timestamp;

    #[test]
    fn a_report_carries_each_kind_asked_over_the_samples_period() {
        let r = DueReport {
            event_id: "e1".into(),
            program_id: "p1".into(),
            kinds: vec![ReportKind::Power("DEMAND"), ReportKind::Usage],
            mean_w: 750_000.0,
            start: Timestamp::parse_rfc3339("2026-12-07T12:00:00Z").expect("t"),
            seconds: 60.0,
        };
        let b = report_body("site-a", &r);
        assert_eq!(b["eventID"], "e1");
        assert_eq!(b["clientName"], "site-a");
        let res = &b["resources"][0];
        assert_eq!(res["intervalPeriod"]["start"], "2026-12-07T12:00:00.000Z");
        assert_eq!(res["intervalPeriod"]["duration"], "PT60S");
        let p = &res["intervals"][0]["payloads"];
        assert_eq!(
            (p[0]["type"].as_str(), p[0]["values"][0].as_f64()),
            (Some("DEMAND"), Some(750.0))
        );
        assert_eq!(
            (p[1]["type"].as_str(), p[1]["values"][0].as_f64()),
            (Some("USAGE"), Some(12.5))
        );
        assert_eq!(b["payloadDescriptors"][1]["units"], "KWH");
    }
}
