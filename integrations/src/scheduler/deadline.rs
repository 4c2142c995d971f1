//! A deadline for a whole request of the adapters' blocking HTTP clients (slurmrestd,
//! the Kubernetes API, the webhook receiver): a socket's read timeout bounds one read,
//! so a server that trickles a byte now and then would hold a call for ever; here the
//! whole exchange (the request written, the answer read) ends by its deadline.

use std::io::{self, Read, Write};
use std::time::{Duration, Instant};

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kubernetes::{KubeApi, KubeHttp};
    use crate::slurm::{Client, Endpoint};

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
        let mut slurm = Client::new(Endpoint::Tcp(format!("127.0.0.1:{port}")));
        slurm.timeout = timeout;
        let t = took(&|| slurm.jobs().is_err());
        assert!(t < Duration::from_secs(3), "slurmrestd call took {t:?}");
        let kube = std::sync::Mutex::new(KubeHttp {
            base: format!("http://127.0.0.1:{port}"),
            token: None,
            timeout,
        });
        let t = took(&|| kube.lock().expect("lock").pods("x").is_err());
        // two lists, each by its own deadline
        assert!(t < Duration::from_secs(3), "Kubernetes call took {t:?}");
        let t = took(&|| {
            crate::webhook::http_post(&format!("http://127.0.0.1:{port}/"), &[], b"{}", timeout)
                .is_err()
        });
        assert!(t < Duration::from_secs(3), "webhook POST took {t:?}");
    }
}
