//! systemd's notify protocol for `serve` and `agent` (`Type=notify`): `READY=1` once
//! the process does its job, `WATCHDOG=1` from the loop itself (so a stalled loop is
//! restarted by systemd after `WatchdogSec`), `STATUS=...` lines for `systemctl
//! status`, and `STOPPING=1` at shutdown.
//!
//! Without `NOTIFY_SOCKET` (not started by systemd) every call does nothing. The socket
//! is a unix datagram socket, a path or an abstract name (`@...`); a send that fails is
//! logged once and never stops the caller.

use std::os::unix::net::UnixDatagram;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use tracing::{debug, warn};

/// Where notifications go, and when the watchdog is due.
#[derive(Debug)]
pub struct Notifier {
    target: Option<Target>,
    /// Half of `WATCHDOG_USEC`: pings go out at least this often.
    watchdog_every: Option<Duration>,
    last_ping: Option<Instant>,
    warned: bool,
}

#[derive(Debug, Clone)]
enum Target {
    Path(PathBuf),
    Abstract(Vec<u8>),
}

impl Notifier {
    /// From the environment systemd sets (`NOTIFY_SOCKET`, `WATCHDOG_USEC`,
    /// `WATCHDOG_PID`).
    pub fn from_env() -> Self {
        let socket = std::env::var_os("NOTIFY_SOCKET");
        let usec = std::env::var("WATCHDOG_USEC").ok();
        // the watchdog is ours unless WATCHDOG_PID names another process
        let ours = std::env::var("WATCHDOG_PID")
            .ok()
            .and_then(|p| p.parse::<u32>().ok())
            .is_none_or(|p| p == std::process::id());
        Self::new(
            socket.map(PathBuf::from),
            usec.filter(|_| ours).and_then(|u| u.parse::<u64>().ok()),
        )
    }

    /// A notifier for `socket` (None: a no-op) with a watchdog of `watchdog_usec`.
    pub fn new(socket: Option<PathBuf>, watchdog_usec: Option<u64>) -> Self {
        let target = socket.map(|p| {
            let s = p.to_string_lossy();
            match s.strip_prefix('@') {
                Some(name) => Target::Abstract(name.as_bytes().to_vec()),
                None => Target::Path(p),
            }
        });
        Notifier {
            target,
            watchdog_every: watchdog_usec
                .filter(|u| *u > 0)
                .map(|u| Duration::from_micros(u / 2)),
            last_ping: None,
            warned: false,
        }
    }

    /// Whether systemd listens (`NOTIFY_SOCKET` set).
    pub fn enabled(&self) -> bool {
        self.target.is_some()
    }

    /// How often the watchdog wants a ping, if it is on.
    pub fn watchdog_every(&self) -> Option<Duration> {
        self.watchdog_every
    }

    /// `READY=1` with a status line.
    pub fn ready(&mut self, status: &str) {
        self.send(&format!("READY=1\nSTATUS={status}"));
        self.last_ping = Some(Instant::now());
    }

    /// A `STATUS=` line.
    pub fn status(&mut self, status: &str) {
        self.send(&format!("STATUS={status}"));
    }

    /// `WATCHDOG=1` when one is due; cheap to call often.
    pub fn watchdog(&mut self) {
        let Some(every) = self.watchdog_every else {
            return;
        };
        if self.last_ping.is_none_or(|t| t.elapsed() >= every) {
            self.send("WATCHDOG=1");
            self.last_ping = Some(Instant::now());
        }
    }

    /// `STOPPING=1`.
    pub fn stopping(&mut self) {
        self.send("STOPPING=1\nSTATUS=stopping");
    }

    fn send(&mut self, msg: &str) {
        let Some(target) = &self.target else {
            return;
        };
        let sent = UnixDatagram::unbound().and_then(|sock| match target {
            Target::Path(p) => sock.send_to(msg.as_bytes(), p),
            Target::Abstract(name) => {
                use std::os::linux::net::SocketAddrExt;
                let addr = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
                sock.send_to_addr(msg.as_bytes(), &addr)
            }
        });
        match sent {
            Ok(_) => debug!(msg, "notified systemd"),
            Err(e) if !self.warned => {
                self.warned = true;
                warn!(error = %e, "cannot notify systemd (NOTIFY_SOCKET); going on without it");
            }
            Err(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn received(sock: &UnixDatagram) -> Vec<String> {
        sock.set_nonblocking(true).expect("nonblocking");
        let mut out = Vec::new();
        let mut buf = [0u8; 512];
        while let Ok(n) = sock.recv(&mut buf) {
            out.push(String::from_utf8_lossy(&buf[..n]).into_owned());
        }
        out
    }

    #[test]
    fn ready_watchdog_and_stopping_reach_the_socket() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("notify.sock");
        let sock = UnixDatagram::bind(&path).expect("bind");
        let mut n = Notifier::new(Some(path), Some(20_000));
        assert!(n.enabled());
        assert_eq!(n.watchdog_every(), Some(Duration::from_millis(10)));
        n.ready("3 racks");
        n.watchdog(); // not due yet: READY counts as a ping
        std::thread::sleep(Duration::from_millis(15));
        n.watchdog();
        n.stopping();
        assert_eq!(
            received(&sock),
            [
                "READY=1\nSTATUS=3 racks",
                "WATCHDOG=1",
                "STOPPING=1\nSTATUS=stopping"
            ]
        );
    }

    #[test]
    fn abstract_sockets_are_reached_too() {
        let name = format!("powerplane-notify-test-{}", std::process::id());
        use std::os::linux::net::SocketAddrExt;
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())
            .expect("abstract name");
        let sock = UnixDatagram::bind_addr(&addr).expect("bind");
        let mut n = Notifier::new(Some(PathBuf::from(format!("@{name}"))), None);
        n.status("hello");
        assert_eq!(received(&sock), ["STATUS=hello"]);
    }

    #[test]
    fn without_a_socket_nothing_is_sent_and_nothing_fails() {
        let mut n = Notifier::new(None, Some(1));
        assert!(!n.enabled());
        n.ready("x");
        n.watchdog();
        n.stopping();
    }
}
