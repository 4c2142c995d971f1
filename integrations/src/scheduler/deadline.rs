//! A deadline for a whole request of the Kubernetes adapter's blocking HTTP client (the
//! webhook receiver is posted to by the one outbound client stack, whose deadline is
//! reqwest's): a socket's read timeout bounds one read,
//! so a server that trickles a byte now and then would hold a call for ever; here the
//! whole exchange (the request written, the answer read) ends by its deadline.

use std::io::{self, Read, Write};
use std::time::{Duration, Instant};

pub use super::error::ResponseError;

/// The largest answer read (a job list of a large cluster fits many times).
pub const MAX_ANSWER: usize = 128 * 1024 * 1024;

/// A stream whose reads and writes can be given a timeout.
pub trait Timed: Read + Write {
    fn timeouts(&self, t: Duration) -> io::Result<()>;
}

impl Timed for std::net::TcpStream {
    fn timeouts(&self, t: Duration) -> io::Result<()> {
        self.set_read_timeout(Some(t))?;
        self.set_write_timeout(Some(t))
    }
}

impl Timed for std::os::unix::net::UnixStream {
    fn timeouts(&self, t: Duration) -> io::Result<()> {
        self.set_read_timeout(Some(t))?;
        self.set_write_timeout(Some(t))
    }
}

fn left(deadline: Instant, what: &str) -> io::Result<Duration> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("{what} not done by the call's deadline"),
        ));
    }
    Ok(left)
}

/// Writes `request` and reads until the server closes, or `stop` says enough was read,
/// all by `deadline`.
pub fn exchange<S: Timed>(
    s: &mut S,
    request: &[u8],
    deadline: Instant,
    stop: impl Fn(&[u8]) -> bool,
) -> io::Result<Vec<u8>> {
    s.timeouts(left(deadline, "the request")?)?;
    s.write_all(request)?;
    let mut out = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    while !stop(&out) {
        s.timeouts(left(deadline, "the answer")?)?;
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
        if out.len() > MAX_ANSWER {
            return Err(io::Error::other(format!(
                "the answer is larger than {MAX_ANSWER} bytes"
            )));
        }
    }
    Ok(out)
}

/// Reads to the end (the server closes: `Connection: close`).
pub fn to_end(_: &[u8]) -> bool {
    false
}

/// Status and body of an HTTP/1.1 response (Content-Length, chunked, or to the end).
pub fn parse_response(raw: &[u8]) -> Result<(u16, Vec<u8>), ResponseError> {
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or(ResponseError::NoHeaderEnd)?;
    let head = String::from_utf8_lossy(&raw[..split]);
    let body = &raw[split + 4..];
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse::<u16>().ok())
        .ok_or_else(|| ResponseError::StatusLine(head.lines().next().map(str::to_string)))?;
    let mut length = None;
    let mut chunked = false;
    for l in lines {
        if let Some((k, v)) = l.split_once(':') {
            let (k, v) = (k.trim().to_ascii_lowercase(), v.trim());
            if k == "content-length" {
                length = v.parse::<usize>().ok();
            } else if k == "transfer-encoding" && v.eq_ignore_ascii_case("chunked") {
                chunked = true;
            }
        }
    }
    if chunked {
        let mut out = Vec::new();
        let mut rest = body;
        loop {
            let eol = rest
                .windows(2)
                .position(|w| w == b"\r\n")
                .ok_or(ResponseError::TruncatedChunk)?;
            let size = usize::from_str_radix(
                String::from_utf8_lossy(&rest[..eol])
                    .split(';')
                    .next()
                    .unwrap_or("")
                    .trim(),
                16,
            )
            .map_err(ResponseError::ChunkSize)?;
            rest = &rest[eol + 2..];
            if size == 0 {
                break;
            }
            if rest.len() < size {
                return Err(ResponseError::TruncatedChunk);
            }
            out.extend_from_slice(&rest[..size]);
            rest = rest.get(size + 2..).unwrap_or(&[]);
        }
        return Ok((status, out));
    }
    match length {
        Some(n) if body.len() >= n => Ok((status, body[..n].to_vec())),
        Some(n) => Err(ResponseError::CutShort {
            got: body.len(),
            expected: n,
        }),
        None => Ok((status, body.to_vec())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kubernetes::{KubeApi, KubeHttp};
    use crate::slurm_api::SlurmApiConfig;

    /// A server that answers one byte every 500 ms, for ever.
    fn trickler() -> u16 {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = l.local_addr().expect("addr").port();
        std::thread::spawn(move || {
            for s in l.incoming().flatten() {
                std::thread::spawn(move || {
                    let mut s = s;
                    while s.write_all(b"H").is_ok() {
                        std::thread::sleep(Duration::from_millis(500));
                    }
                });
            }
        });
        port
    }

    #[test]
    fn a_server_that_trickles_its_answer_is_cut_off_at_the_deadline() {
        let port = trickler();
        let timeout = Duration::from_secs(1);
        let took = |f: &dyn Fn() -> bool| {
            let t = Instant::now();
            assert!(f(), "the call must fail");
            t.elapsed()
        };
        let mut slurm = SlurmApiConfig::new(&format!("http://127.0.0.1:{port}"));
        slurm.timeout_s = timeout.as_secs_f64();
        // the build asks for the version: the first call
        let t = took(&|| slurm.build().is_err());
        assert!(t < Duration::from_secs(3), "slurmrestd call took {t:?}");
        let kube = std::sync::Mutex::new(KubeHttp {
            base: format!("http://127.0.0.1:{port}"),
            token: None,
            timeout,
        });
        let t = took(&|| kube.lock().expect("lock").pods("x").is_err());
        // two lists, each by its own deadline
        assert!(t < Duration::from_secs(3), "Kubernetes call took {t:?}");
        let client =
            sources::http::blocking_client(timeout, &sources::tls::Tls::default()).expect("client");
        let t = took(&|| {
            client
                .post(format!("http://127.0.0.1:{port}/"))
                .body("{}")
                .send()
                .is_err()
        });
        assert!(t < Duration::from_secs(3), "webhook POST took {t:?}");
    }

    #[test]
    fn chunked_and_sized_answers_are_read() {
        let raw = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\n{\"a\r\n4\r\n\":1}\r\n0\r\n\r\n";
        assert_eq!(parse_response(raw), Ok((200, b"{\"a\":1}".to_vec())));
        let raw = b"HTTP/1.1 400 BAD REQUEST\r\nContent-Length: 2\r\n\r\nnoEXTRA";
        assert_eq!(parse_response(raw), Ok((400, b"no".to_vec())));
        assert!(parse_response(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nab").is_err());
    }
}
