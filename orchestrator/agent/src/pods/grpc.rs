//! A minimal gRPC unary call over HTTP/2 on a unix socket (hyper, no tonic): one POST
//! to `/{service}/{method}` with `content-type: application/grpc` and `te: trailers`,
//! the request in one length-prefixed message (flag 0: uncompressed, then the length in
//! four big-endian bytes), and the answer read back the same way, its status from the
//! `grpc-status` and `grpc-message` trailers (or from the headers of a trailers-only
//! answer). Every call has a deadline that covers the connect, the handshake, the
//! request and the whole answer.

use std::path::Path;
use std::time::Duration;

use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Bytes;
use hyper::client::conn::http2;
use hyper::header::{HeaderMap, HeaderValue, CONTENT_TYPE, TE, USER_AGENT};
use hyper::{Request, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::UnixStream;

/// The most an answer may carry (the kubelet's own limit for this API is 16 MiB).
pub const MAX_ANSWER_BYTES: usize = 16 << 20;

/// Why a call gave no answer.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    #[error("no socket at {0}")]
    Missing(String),
    #[error("cannot connect: {0}")]
    Connect(std::io::Error),
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    #[error("HTTP/2: {0}")]
    Http(String),
    #[error("gRPC status {code} ({name}): {message}", name = status_name(*.code))]
    Status { code: u32, message: String },
    #[error("malformed answer: {0}")]
    Malformed(String),
}

impl CallError {
    /// A short word for logs and rate limits.
    pub fn reason(&self) -> &'static str {
        match self {
            CallError::Missing(_) => "missing",
            CallError::Connect(_) => "connect",
            CallError::Timeout(_) => "timeout",
            CallError::Http(_) => "http2",
            CallError::Status { .. } => "status",
            CallError::Malformed(_) => "malformed",
        }
    }
}

/// The name gRPC gives a status code.
pub fn status_name(code: u32) -> &'static str {
    match code {
        0 => "OK",
        1 => "CANCELLED",
        2 => "UNKNOWN",
        3 => "INVALID_ARGUMENT",
        4 => "DEADLINE_EXCEEDED",
        5 => "NOT_FOUND",
        6 => "ALREADY_EXISTS",
        7 => "PERMISSION_DENIED",
        8 => "RESOURCE_EXHAUSTED",
        9 => "FAILED_PRECONDITION",
        10 => "ABORTED",
        11 => "OUT_OF_RANGE",
        12 => "UNIMPLEMENTED",
        13 => "INTERNAL",
        14 => "UNAVAILABLE",
        15 => "DATA_LOSS",
        16 => "UNAUTHENTICATED",
        _ => "unknown code",
    }
}

/// One message in gRPC's length-prefixed framing: flag 0 (not compressed), the length
/// in four big-endian bytes, the message.
pub fn frame(message: &impl prost::Message) -> Vec<u8> {
    let len = message.encoded_len();
    let mut out = Vec::with_capacity(5 + len);
    out.push(0);
    out.extend_from_slice(&(len as u32).to_be_bytes());
    message.encode_raw(&mut out);
    out
}

/// The one message of a unary answer's body.
pub fn unframe(data: &[u8]) -> Result<&[u8], CallError> {
    if data.len() < 5 {
        return Err(CallError::Malformed(format!(
            "a gRPC message takes at least 5 bytes, the answer has {}",
            data.len()
        )));
    }
    match data[0] {
        0 => {}
        1 => {
            return Err(CallError::Malformed(
                "a compressed message (none was asked for)".into(),
            ))
        }
        f => return Err(CallError::Malformed(format!("message flag {f}"))),
    }
    let len = u32::from_be_bytes([data[1], data[2], data[3], data[4]]) as usize;
    let body = &data[5..];
    if body.len() != len {
        return Err(CallError::Malformed(format!(
            "the message says {len} bytes, {} came",
            body.len()
        )));
    }
    Ok(body)
}

/// `grpc-message` is percent-encoded.
fn percent_decoded(v: &str) -> String {
    let b = v.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%'
            && i + 2 < b.len()
            && b[i + 1].is_ascii_hexdigit()
            && b[i + 2].is_ascii_hexdigit()
        {
            let hex = |c: u8| (c as char).to_digit(16).unwrap_or(0) as u8;
            out.push(hex(b[i + 1]) << 4 | hex(b[i + 2]));
            i += 3;
            continue;
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The status in these headers or trailers, when they carry one.
fn status_in(h: &HeaderMap) -> Result<Option<(u32, String)>, CallError> {
    let Some(code) = h.get("grpc-status") else {
        return Ok(None);
    };
    let code = code
        .to_str()
        .ok()
        .and_then(|c| c.trim().parse::<u32>().ok())
        .ok_or_else(|| CallError::Malformed(format!("grpc-status {code:?}")))?;
    let message = h
        .get("grpc-message")
        .and_then(|m| m.to_str().ok())
        .map(percent_decoded)
        .unwrap_or_default();
    Ok(Some((code, message)))
}

fn checked(status: (u32, String)) -> Result<(), CallError> {
    match status {
        (0, _) => Ok(()),
        (code, message) => Err(CallError::Status { code, message }),
    }
}

/// Calls `path` (`/package.Service/Method`) on the gRPC server at `socket`, with a
/// deadline for all of it.
pub async fn unary<Req, Resp>(
    socket: &Path,
    path: &str,
    request: &Req,
    deadline: Duration,
) -> Result<Resp, CallError>
where
    Req: prost::Message,
    Resp: prost::Message + Default,
{
    match tokio::time::timeout(deadline, call(socket, path, request, deadline)).await {
        Ok(r) => r,
        Err(_) => Err(CallError::Timeout(deadline)),
    }
}

async fn call<Req, Resp>(
    socket: &Path,
    path: &str,
    request: &Req,
    deadline: Duration,
) -> Result<Resp, CallError>
where
    Req: prost::Message,
    Resp: prost::Message + Default,
{
    let stream = UnixStream::connect(socket).await.map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            CallError::Missing(socket.display().to_string())
        } else {
            CallError::Connect(e)
        }
    })?;
    let http = |e: hyper::Error| CallError::Http(e.to_string());
    let (mut send, conn) = http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
        .await
        .map_err(http)?;
    let body = Bytes::from(frame(request));
    // the authority is a placeholder: the socket is the address (as gRPC clients do)
    let uri = format!("http://localhost{path}");
    let timeout_ms = deadline.as_millis().clamp(1, 99_999_999);
    let req = Request::post(uri)
        .header(CONTENT_TYPE, HeaderValue::from_static("application/grpc"))
        .header(TE, HeaderValue::from_static("trailers"))
        .header("grpc-timeout", format!("{timeout_ms}m"))
        .header(
            USER_AGENT,
            concat!("powerplane-agent/", env!("CARGO_PKG_VERSION")),
        )
        .body(Full::new(body))
        .map_err(|e| CallError::Http(e.to_string()))?;
    let exchange = async move {
        send.ready().await.map_err(http)?;
        let resp = send.send_request(req).await.map_err(http)?;
        let (parts, body) = resp.into_parts();
        // a trailers-only answer (how servers answer errors) has its status here
        if let Some(s) = status_in(&parts.headers)? {
            checked(s)?;
        }
        if parts.status != StatusCode::OK {
            return Err(CallError::Http(format!("HTTP status {}", parts.status)));
        }
        let ct = parts
            .headers
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        if !ct.starts_with("application/grpc") {
            return Err(CallError::Malformed(format!(
                "content-type {ct:?}, not application/grpc"
            )));
        }
        let all = Limited::new(body, MAX_ANSWER_BYTES)
            .collect()
            .await
            .map_err(|e| CallError::Http(format!("reading the answer: {e}")))?;
        let status = match all.trailers().map(status_in).transpose()?.flatten() {
            Some(s) => s,
            None => match status_in(&parts.headers)? {
                Some(s) => s,
                None => return Err(CallError::Malformed("no grpc-status".into())),
            },
        };
        checked(status)?;
        let data = all.to_bytes();
        Resp::decode(unframe(&data)?).map_err(|e| CallError::Malformed(e.to_string()))
    };
    tokio::pin!(exchange);
    // the connection is driven here, not spawned: when the call ends (or its deadline
    // drops it), the connection goes with it
    tokio::select! {
        biased;
        r = &mut exchange => return r,
        r = conn => {
            if let Err(e) = r {
                return Err(CallError::Http(e.to_string()));
            }
        }
    }
    // the connection closed cleanly: what reached the stream before is still there
    exchange.await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_framed_with_a_flag_and_a_big_endian_length() {
        let empty = crate::pods::proto::ListPodResourcesRequest {};
        assert_eq!(frame(&empty), vec![0, 0, 0, 0, 0]);
        assert_eq!(unframe(&[0, 0, 0, 0, 2, 8, 1]).expect("a frame"), &[8, 1]);
        assert!(matches!(unframe(&[0, 0, 0]), Err(CallError::Malformed(_))));
        assert!(matches!(
            unframe(&[1, 0, 0, 0, 0]),
            Err(CallError::Malformed(_))
        ));
        // a length that does not match what came
        assert!(matches!(
            unframe(&[0, 0, 0, 1, 0, 8]),
            Err(CallError::Malformed(_))
        ));
        assert!(matches!(
            unframe(b"HTTP/1.1 200 OK"),
            Err(CallError::Malformed(_))
        ));
    }

    #[test]
    fn grpc_messages_are_percent_decoded() {
        assert_eq!(percent_decoded("kubelet%20is%20down"), "kubelet is down");
        assert_eq!(percent_decoded("100%"), "100%");
        assert_eq!(percent_decoded("%zz%4"), "%zz%4");
        assert_eq!(
            CallError::Status {
                code: 14,
                message: "x".into()
            }
            .to_string(),
            "gRPC status 14 (UNAVAILABLE): x"
        );
    }
}
