//! What the VTN sends, read from OpenADR 2.0b XML: registrations, poll answers
//! (nothing, events, report requests, re-registration, cancelled registration) and the
//! answers to the VEN's own calls. Pure; elements are matched by namespace and local
//! name, so any prefixes the VTN chooses are read alike.

use roxmltree::{Document, Node};
use telemetry::grid::{EventStatus, GridEvent, GridInterval, GridTarget};
use telemetry::Timestamp;
use thiserror::Error;

use super::iso::{parse_datetime, parse_duration};
use super::payload::{NS_EI, NS_EMIX, NS_OADR, NS_POWER, NS_PYLD, NS_SCALE, NS_STRM, NS_XCAL};

/// The most intervals an event may carry (a week of 5-minute intervals): a signal
/// with more is skipped (`too_many_intervals`), so what the VEN holds stays bounded.
pub const MAX_INTERVALS: usize = 2_016;

/// The source name of the events the VEN publishes.
pub const SOURCE: &str = "openadr2b";

/// Why a payload from the VTN was not read.
#[derive(Debug, Error)]
pub enum ParseError {
    #[error("payload is not XML: {0}")]
    Xml(#[from] roxmltree::Error),
    #[error("payload root is {0:?}, not an oadrPayload with an oadrSignedObject")]
    NotOadr(String),
    #[error("{message}: no {what}")]
    Missing {
        message: &'static str,
        what: &'static str,
    },
    #[error("{message}: {what} {value:?} cannot be read")]
    Bad {
        message: &'static str,
        what: &'static str,
        value: String,
    },
}

impl ParseError {
    /// The `reason` label of the rejected-payload counter.
    pub fn reason(&self) -> &'static str {
        match self {
            ParseError::Xml(_) => "xml",
            ParseError::NotOadr(_) => "not_oadr",
            ParseError::Missing { .. } => "missing_element",
            ParseError::Bad { .. } => "bad_value",
        }
    }
}

/// The `eiResponse` of an answer.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Status {
    pub code: u16,
    pub description: String,
}

impl Status {
    pub fn ok(&self) -> bool {
        (200..300).contains(&self.code)
    }
}

/// An `oadrCreatedPartyRegistration`.
#[derive(Debug, Clone, PartialEq)]
pub struct Registration {
    pub status: Status,
    pub ven_id: Option<String>,
    pub registration_id: Option<String>,
    /// `oadrRequestedOadrPollFreq`, seconds.
    pub poll_s: Option<f64>,
}

/// One event of an `oadrDistributeEvent`.
#[derive(Debug, Clone, PartialEq)]
pub struct Distributed {
    pub event: GridEvent,
    /// `oadrResponseRequired` is `always` (the default).
    pub response_required: bool,
}

/// An `oadrDistributeEvent`: the VTN's whole list of events for this VEN.
#[derive(Debug, Clone, PartialEq)]
pub struct Distribute {
    pub request_id: String,
    pub events: Vec<Distributed>,
    /// The signals not read, each by why (`signal_name`, `signal_type`, `level`,
    /// `units`, `interval`, `too_many_intervals`).
    pub skipped: Vec<&'static str>,
}

/// One `oadrReportRequest`.
#[derive(Debug, Clone, PartialEq)]
pub struct ReportRequest {
    pub report_request_id: String,
    pub specifier_id: String,
    /// How often to sample (`granularity`), seconds.
    pub granularity_s: Option<f64>,
    /// How often to send (`reportBackDuration`), seconds.
    pub report_back_s: Option<f64>,
    pub r_ids: Vec<String>,
}

/// A payload from the VTN.
#[derive(Debug, Clone, PartialEq)]
pub enum Inbound {
    /// An empty body (OpenLEADR's answer to an `oadrResponse`).
    Empty,
    Response(Status),
    CreatedPartyRegistration(Registration),
    DistributeEvent(Distribute),
    CreateReport {
        request_id: String,
        requests: Vec<ReportRequest>,
    },
    /// The answer to the VEN's `oadrRegisterReport`, with the reports the VTN wants
    /// (OpenLEADR asks for them here rather than with a later `oadrCreateReport`).
    RegisteredReport {
        status: Status,
        requests: Vec<ReportRequest>,
    },
    /// The VTN offers reports of its own.
    RegisterReport {
        request_id: String,
    },
    RequestReregistration,
    CancelPartyRegistration {
        request_id: String,
        registration_id: String,
    },
    /// Anything else that is well formed (`oadrUpdatedReport`, `oadrCanceledReport`):
    /// its status, where it has one.
    Other {
        name: String,
        status: Option<Status>,
    },
}

fn is(n: &Node, ns: &str, name: &str) -> bool {
    n.is_element() && n.tag_name().name() == name && n.tag_name().namespace() == Some(ns)
}

fn child<'a, 'i>(n: Node<'a, 'i>, ns: &str, name: &str) -> Option<Node<'a, 'i>> {
    n.children().find(|c| is(c, ns, name))
}

fn children<'a, 'i: 'a>(
    n: Node<'a, 'i>,
    ns: &'a str,
    name: &'a str,
) -> impl Iterator<Item = Node<'a, 'i>> + 'a {
    n.children().filter(move |c| is(c, ns, name))
}

fn text(n: Option<Node>) -> Option<String> {
    n.map(|n| n.text().unwrap_or("").trim().to_string())
}

/// The text of a path of (namespace, name) steps below `n`.
fn path(n: Node, steps: &[(&str, &str)]) -> Option<String> {
    let mut cur = n;
    for (ns, name) in steps {
        cur = child(cur, ns, name)?;
    }
    text(Some(cur))
}

fn required(
    n: Node,
    message: &'static str,
    what: &'static str,
    steps: &[(&str, &str)],
) -> Result<String, ParseError> {
    path(n, steps).ok_or(ParseError::Missing { message, what })
}

fn status(n: Node) -> Option<Status> {
    let r = child(n, NS_EI, "eiResponse")?;
    Some(Status {
        code: path(r, &[(NS_EI, "responseCode")])?.parse().ok()?,
        description: path(r, &[(NS_EI, "responseDescription")]).unwrap_or_default(),
    })
}

fn status_of(n: Node, message: &'static str) -> Result<Status, ParseError> {
    status(n).ok_or(ParseError::Missing {
        message,
        what: "eiResponse/responseCode",
    })
}

/// Reads a payload from the VTN.
pub fn parse(body: &str) -> Result<Inbound, ParseError> {
    if body.trim().is_empty() {
        return Ok(Inbound::Empty);
    }
    let doc = Document::parse(body)?;
    let root = doc.root_element();
    let message = (is(&root, NS_OADR, "oadrPayload"))
        .then(|| child(root, NS_OADR, "oadrSignedObject"))
        .flatten()
        .and_then(|s| s.children().find(Node::is_element))
        .ok_or_else(|| ParseError::NotOadr(root.tag_name().name().to_string()))?;
    if message.tag_name().namespace() != Some(NS_OADR) {
        return Err(ParseError::NotOadr(message.tag_name().name().to_string()));
    }
    let name = message.tag_name().name();
    Ok(match name {
        "oadrResponse" => Inbound::Response(status_of(message, "oadrResponse")?),
        "oadrCreatedPartyRegistration" => Inbound::CreatedPartyRegistration(registration(message)?),
        "oadrDistributeEvent" => Inbound::DistributeEvent(distribute(message)?),
        "oadrCreateReport" => Inbound::CreateReport {
            request_id: required(
                message,
                "oadrCreateReport",
                "requestID",
                &[(NS_PYLD, "requestID")],
            )?,
            requests: report_requests(message)?,
        },
        "oadrRegisteredReport" => Inbound::RegisteredReport {
            status: status_of(message, "oadrRegisteredReport")?,
            requests: report_requests(message)?,
        },
        "oadrRegisterReport" => Inbound::RegisterReport {
            request_id: path(message, &[(NS_PYLD, "requestID")]).unwrap_or_default(),
        },
        "oadrRequestReregistration" => Inbound::RequestReregistration,
        "oadrCancelPartyRegistration" => Inbound::CancelPartyRegistration {
            request_id: path(message, &[(NS_PYLD, "requestID")]).unwrap_or_default(),
            registration_id: path(message, &[(NS_EI, "registrationID")]).unwrap_or_default(),
        },
        other => Inbound::Other {
            name: other.to_string(),
            status: status(message),
        },
    })
}

fn registration(m: Node) -> Result<Registration, ParseError> {
    const M: &str = "oadrCreatedPartyRegistration";
    let poll_s = match path(
        m,
        &[
            (NS_OADR, "oadrRequestedOadrPollFreq"),
            (NS_XCAL, "duration"),
        ],
    ) {
        Some(d) => Some(
            parse_duration(&d)
                .filter(|s| *s > 0.0)
                .ok_or(ParseError::Bad {
                    message: M,
                    what: "oadrRequestedOadrPollFreq",
                    value: d,
                })?,
        ),
        None => None,
    };
    let nonempty = |s: Option<String>| s.filter(|s| !s.is_empty());
    Ok(Registration {
        status: status_of(m, M)?,
        ven_id: nonempty(path(m, &[(NS_EI, "venID")])),
        registration_id: nonempty(path(m, &[(NS_EI, "registrationID")])),
        poll_s,
    })
}

fn report_requests(m: Node) -> Result<Vec<ReportRequest>, ParseError> {
    const M: &str = "oadrReportRequest";
    let mut out = Vec::new();
    for r in children(m, NS_OADR, "oadrReportRequest") {
        let spec = child(r, NS_EI, "reportSpecifier").ok_or(ParseError::Missing {
            message: M,
            what: "reportSpecifier",
        })?;
        let dur = |steps: &[(&str, &str)]| path(spec, steps).and_then(|d| parse_duration(&d));
        out.push(ReportRequest {
            report_request_id: required(r, M, "reportRequestID", &[(NS_EI, "reportRequestID")])?,
            specifier_id: path(spec, &[(NS_EI, "reportSpecifierID")]).unwrap_or_default(),
            granularity_s: dur(&[(NS_XCAL, "granularity"), (NS_XCAL, "duration")]),
            report_back_s: dur(&[(NS_EI, "reportBackDuration"), (NS_XCAL, "duration")]),
            r_ids: children(spec, NS_EI, "specifierPayload")
                .filter_map(|p| path(p, &[(NS_EI, "rID")]))
                .collect(),
        });
    }
    Ok(out)
}

fn distribute(m: Node) -> Result<Distribute, ParseError> {
    let mut d = Distribute {
        request_id: path(m, &[(NS_PYLD, "requestID")]).unwrap_or_default(),
        events: Vec::new(),
        skipped: Vec::new(),
    };
    for e in children(m, NS_OADR, "oadrEvent") {
        let ei = child(e, NS_EI, "eiEvent").ok_or(ParseError::Missing {
            message: "oadrEvent",
            what: "eiEvent",
        })?;
        let event = event(ei, &mut d.skipped)?;
        let response_required =
            path(e, &[(NS_OADR, "oadrResponseRequired")]).is_none_or(|r| r != "never");
        d.events.push(Distributed {
            event,
            response_required,
        });
    }
    Ok(d)
}

fn event(ei: Node, skipped: &mut Vec<&'static str>) -> Result<GridEvent, ParseError> {
    const M: &str = "eiEvent";
    let desc = child(ei, NS_EI, "eventDescriptor").ok_or(ParseError::Missing {
        message: M,
        what: "eventDescriptor",
    })?;
    let id = required(desc, M, "eventID", &[(NS_EI, "eventID")])?;
    let modification = required(
        desc,
        M,
        "modificationNumber",
        &[(NS_EI, "modificationNumber")],
    )?;
    let modification: u32 = modification.parse().map_err(|_| ParseError::Bad {
        message: M,
        what: "modificationNumber",
        value: modification.clone(),
    })?;
    let status = required(desc, M, "eventStatus", &[(NS_EI, "eventStatus")])?;
    let status = match status.as_str() {
        "none" | "far" | "near" => EventStatus::Pending,
        "active" => EventStatus::Active,
        "completed" => EventStatus::Completed,
        "cancelled" => EventStatus::Cancelled,
        _ => {
            return Err(ParseError::Bad {
                message: M,
                what: "eventStatus",
                value: status,
            })
        }
    };
    let program = path(
        desc,
        &[(NS_EI, "eiMarketContext"), (NS_EMIX, "marketContext")],
    )
    .unwrap_or_default();
    let props = child(ei, NS_EI, "eiActivePeriod")
        .and_then(|p| child(p, NS_XCAL, "properties"))
        .ok_or(ParseError::Missing {
            message: M,
            what: "eiActivePeriod/properties",
        })?;
    let dtstart = required(
        props,
        M,
        "eiActivePeriod dtstart",
        &[(NS_XCAL, "dtstart"), (NS_XCAL, "date-time")],
    )?;
    let start = parse_datetime(&dtstart).ok_or(ParseError::Bad {
        message: M,
        what: "eiActivePeriod dtstart",
        value: dtstart,
    })?;
    let mut intervals = Vec::new();
    if let Some(signals) = child(ei, NS_EI, "eiEventSignals") {
        for s in children(signals, NS_EI, "eiEventSignal") {
            match signal(s, start) {
                Ok(is) if intervals.len() + is.len() > MAX_INTERVALS => {
                    skipped.push("too_many_intervals")
                }
                Ok(mut is) => intervals.append(&mut is),
                Err(why) => skipped.push(why),
            }
        }
    }
    intervals.sort_by_key(|i: &GridInterval| i.start);
    Ok(GridEvent {
        id,
        source: SOURCE.to_string(),
        modification,
        status,
        intervals,
        program,
    })
}

/// The multiplier of an `siScaleCode`.
fn scale(code: &str) -> Option<f64> {
    Some(match code {
        "none" | "" => 1.0,
        "p" => 1e-12,
        "n" => 1e-9,
        "micro" => 1e-6,
        "m" => 1e-3,
        "c" => 1e-2,
        "d" => 1e-1,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        _ => return None,
    })
}

/// W per unit of the signal's values, from its itemBase (none: W).
fn watts_per_unit(s: Node) -> Result<f64, &'static str> {
    let base = s
        .children()
        .find(|c| c.is_element() && c.tag_name().namespace() == Some(NS_POWER));
    let Some(base) = base else {
        return Ok(1.0);
    };
    if base.tag_name().name() != "powerReal" {
        return Err("units");
    }
    let units = path(base, &[(NS_POWER, "itemUnits")]).unwrap_or_else(|| "W".into());
    if units != "W" {
        return Err("units");
    }
    scale(&path(base, &[(NS_SCALE, "siScaleCode")]).unwrap_or_default()).ok_or("units")
}

/// A signal's intervals as grid intervals, or why it is skipped.
fn signal(s: Node, event_start: Timestamp) -> Result<Vec<GridInterval>, &'static str> {
    let name = path(s, &[(NS_EI, "signalName")]).unwrap_or_default();
    let kind = path(s, &[(NS_EI, "signalType")]).unwrap_or_default();
    let target: fn(f64, f64) -> Option<GridTarget> = match (name.as_str(), kind.as_str()) {
        ("SIMPLE" | "simple", _) => |v, _| {
            let l = v.round();
            ((0.0..=3.0).contains(&l) && (v - l).abs() < 1e-9).then_some(GridTarget::Level(l as u8))
        },
        ("LOAD_DISPATCH", "delta") => |v, w| Some(GridTarget::ShedW((-v * w).max(0.0))),
        ("LOAD_DISPATCH", "setpoint") => |v, w| Some(GridTarget::CapW(v * w)),
        ("LOAD_CONTROL", "x-loadControlCapacity") => |c, _| {
            (0.0..=1.0)
                .contains(&c)
                .then_some(GridTarget::ShedFraction(1.0 - c))
        },
        ("LOAD_CONTROL", "x-loadControlPercentOffset") => |p, _| {
            (-100.0..=100.0)
                .contains(&p)
                .then_some(GridTarget::ShedFraction(p / 100.0))
        },
        ("LOAD_CONTROL", "x-loadControlSetpoint") => |v, w| Some(GridTarget::CapW(v * w)),
        ("LOAD_DISPATCH" | "LOAD_CONTROL", _) => return Err("signal_type"),
        _ => return Err("signal_name"),
    };
    let w = if name.starts_with("LOAD") {
        watts_per_unit(s)?
    } else {
        1.0
    };
    let list = child(s, NS_STRM, "intervals").ok_or("interval")?;
    let mut cursor = event_start;
    let mut out = Vec::new();
    for i in children(list, NS_EI, "interval") {
        if out.len() == MAX_INTERVALS {
            return Err("too_many_intervals");
        }
        let start = match path(i, &[(NS_XCAL, "dtstart"), (NS_XCAL, "date-time")]) {
            Some(t) => parse_datetime(&t).ok_or("interval")?,
            None => cursor,
        };
        let duration_s = path(i, &[(NS_XCAL, "duration"), (NS_XCAL, "duration")])
            .and_then(|d| parse_duration(&d))
            .filter(|d| d.is_finite() && *d >= 0.0)
            .ok_or("interval")?;
        let value: f64 = path(
            i,
            &[
                (NS_EI, "signalPayload"),
                (NS_EI, "payloadFloat"),
                (NS_EI, "value"),
            ],
        )
        .and_then(|v| v.parse().ok())
        .filter(|v: &f64| v.is_finite())
        .ok_or("interval")?;
        let target = target(value, w).ok_or(if name.starts_with("SIMPLE") || name == "simple" {
            "level"
        } else {
            "value"
        })?;
        cursor = start.plus_secs(duration_s);
        out.push(GridInterval {
            start,
            duration_s,
            target,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
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
}
