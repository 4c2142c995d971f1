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
#[path = "parse_tests.rs"]
mod tests;
