//! One exchange with the VTN, as the VEN's task sees it: why it failed (the `reason`
//! label of `openadr_errors_total`), whether an answer is an error, and the VEN's
//! counters.

use std::collections::BTreeMap;
use std::sync::Mutex;

use super::parse::{Inbound, ParseError};
use crate::source::Counter;

/// The VEN's counters by name and (at most one) label, read in a fixed order.
#[derive(Default)]
pub(crate) struct Counters(Mutex<BTreeMap<(&'static str, &'static str, &'static str), u64>>);

impl Counters {
    pub(crate) fn add(&self, name: &'static str, label: (&'static str, &'static str), n: u64) {
        if let Ok(mut m) = self.0.lock() {
            *m.entry((name, label.0, label.1)).or_default() += n;
        }
    }

    pub(crate) fn inc(&self, name: &'static str) {
        self.add(name, ("", ""), 1);
    }

    pub(crate) fn read(&self) -> Vec<Counter> {
        let Ok(m) = self.0.lock() else {
            return Vec::new();
        };
        m.iter()
            .map(|(&(name, key, value), &n)| Counter {
                name,
                labels: if key.is_empty() {
                    Vec::new()
                } else {
                    vec![(key, value.to_string())]
                },
                value: n,
            })
            .collect()
    }
}

/// Why one exchange with the VTN failed: the `reason` label of
/// `openadr_errors_total`.
#[derive(Debug, thiserror::Error)]
pub(super) enum CallError {
    #[error("{service}: {reason}: {detail}")]
    Transport {
        service: &'static str,
        reason: &'static str,
        detail: String,
    },
    #[error("{service}: HTTP {status}")]
    Status { service: &'static str, status: u16 },
    #[error("{service}: {0}", service = .1)]
    Payload(#[source] ParseError, &'static str),
    #[error("{service}: the VTN answered {code} {description}")]
    Refused {
        service: &'static str,
        code: u16,
        description: String,
    },
    #[error("{service}: the VTN answered with {name}")]
    Unexpected { service: &'static str, name: String },
    /// The VTN answered a call with `oadrRequestReregistration`.
    #[error("{0}: the VTN asks the VEN to register again")]
    Reregister(&'static str),
    #[error("cancelled")]
    Cancelled,
    #[error("{service}: {0}", service = .1)]
    Sign(#[source] super::sign::SignError, &'static str),
    #[error("{service}: the VTN's XML signature: {0}", service = .1)]
    Unverified(#[source] super::sign::VerifyError, &'static str),
}

impl CallError {
    pub(super) fn reason(&self) -> &'static str {
        match self {
            CallError::Transport { reason, .. } => reason,
            CallError::Status { .. } => "http_status",
            CallError::Payload(..) => "payload",
            CallError::Refused { .. } => "refused",
            CallError::Unexpected { .. } => "unexpected",
            CallError::Reregister(_) => "reregister",
            CallError::Cancelled => "cancelled",
            CallError::Sign(..) => "sign",
            CallError::Unverified(..) => "signature",
        }
    }

    /// The VTN does not know the VEN (any more): a poll refused as an invalid id or
    /// as not registered.
    pub(super) fn unknown_ven(&self) -> bool {
        matches!(
            self,
            CallError::Refused {
                service: "OadrPoll",
                code: 452 | 463,
                ..
            }
        )
    }
}

/// An answer that is no error: empty, or a status of 2xx.
pub(super) fn check(service: &'static str, answer: &Inbound) -> Result<(), CallError> {
    let status = match answer {
        Inbound::Empty => return Ok(()),
        Inbound::Response(s) => Some(s),
        Inbound::RegisteredReport { status, .. } => Some(status),
        Inbound::Other { status, .. } => status.as_ref(),
        Inbound::RequestReregistration => return Err(CallError::Reregister(service)),
        other => return Err(unexpected(service, other)),
    };
    match status {
        Some(s) if !s.ok() => Err(CallError::Refused {
            service,
            code: s.code,
            description: s.description.clone(),
        }),
        _ => Ok(()),
    }
}

pub(super) fn unexpected(service: &'static str, answer: &Inbound) -> CallError {
    let name = match answer {
        Inbound::Empty => "an empty body",
        Inbound::Response(_) => "oadrResponse",
        Inbound::CreatedPartyRegistration(_) => "oadrCreatedPartyRegistration",
        Inbound::DistributeEvent(_) => "oadrDistributeEvent",
        Inbound::CreateReport { .. } => "oadrCreateReport",
        Inbound::RegisteredReport { .. } => "oadrRegisteredReport",
        Inbound::RegisterReport { .. } => "oadrRegisterReport",
        Inbound::RequestReregistration => "oadrRequestReregistration",
        Inbound::CancelPartyRegistration { .. } => "oadrCancelPartyRegistration",
        Inbound::Other { name, .. } => name,
    };
    CallError::Unexpected {
        service,
        name: name.to_string(),
    }
}

pub(super) fn transport(service: &'static str, e: &reqwest::Error) -> CallError {
    CallError::Transport {
        service,
        reason: crate::http::classify(e),
        detail: crate::http::chain(e),
    }
}
