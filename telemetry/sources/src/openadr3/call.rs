//! One call to the VTN as the OpenADR 3 VEN's task makes it: why it failed (the
//! `reason` label of `openadr_errors_total`), its method and body, and what an error
//! answer says.

use super::parse::ParseError;

/// Why one call failed: the `reason` label of `openadr_errors_total`.
#[derive(Debug, thiserror::Error)]
pub(super) enum CallError {
    #[error("{what}: {reason}: {detail}")]
    Transport {
        what: &'static str,
        reason: &'static str,
        detail: String,
    },
    #[error("{what}: HTTP {status}: {detail}")]
    Status {
        what: &'static str,
        status: u16,
        detail: String,
    },
    #[error("{what}: {0}", what = .1)]
    Payload(#[source] ParseError, &'static str),
    #[error("cancelled")]
    Cancelled,
}

impl CallError {
    pub(super) fn reason(&self) -> &'static str {
        match self {
            CallError::Transport { reason, .. } => reason,
            CallError::Status {
                status: 401 | 403, ..
            } => "unauthorized",
            // a token endpoint refuses a client with 400 (RFC 6749 §5.2) as well
            CallError::Status {
                what: "token",
                status: 400,
                ..
            } => "unauthorized",
            CallError::Status { .. } => "http_status",
            CallError::Payload(..) => "payload",
            CallError::Cancelled => "cancelled",
        }
    }
}

/// A call's method and body.
pub(super) enum Req<'a> {
    Get,
    Json(&'a serde_json::Value),
    Form(String),
}

/// The detail of an error answer: RFC 7807's `title` and `detail`, else the start of
/// the body.
pub(super) fn problem(body: &[u8]) -> String {
    if let Ok(v) = serde_json::from_slice::<serde_json::Value>(body) {
        let part = |k| v.get(k).and_then(serde_json::Value::as_str).unwrap_or("");
        let s = format!("{} {}", part("title"), part("detail"));
        if !s.trim().is_empty() {
            return s.trim().to_string();
        }
    }
    String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned()
}

/// `application/x-www-form-urlencoded` (and a query's value): unreserved characters as
/// they are, every other byte as `%XX`.
pub fn form_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn form_values_are_escaped() {
        assert_eq!(form_escape("a b&c=d/é"), "a%20b%26c%3Dd%2F%C3%A9");
        assert_eq!(form_escape("site-a_1.x~"), "site-a_1.x~");
    }

    #[test]
    fn an_error_answer_is_told_by_its_problem() {
        assert_eq!(
            problem(br#"{"type":"about:blank","title":"Forbidden","status":403,"detail":"Missing scope"}"#),
            "Forbidden Missing scope"
        );
        assert_eq!(problem(b"plain"), "plain");
    }
}
