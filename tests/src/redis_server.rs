//! A real `redis-server` of the test's own, on a free port, that the test may kill
//! (`kill -9`) and start again on the same port and data directory. It never touches
//! the shared Redis on 6379.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A `redis-server` with AOF (`appendfsync always`), so that what it acknowledged
/// survives a `kill -9`. Killed when dropped.
pub struct RedisServer {
    child: Option<Child>,
    port: u16,
    dir: tempfile::TempDir,
}

impl RedisServer {
    /// Starts one on a free port.
    ///
    /// # Panics
    /// When `redis-server` is missing or does not answer: the test needs it.
    pub fn start() -> RedisServer {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let mut server = RedisServer {
            child: None,
            port,
            dir: tempfile::tempdir().expect("tempdir"),
        };
        server.restart();
        server
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// `kill -9`: no shutdown, no last save.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// `kill -STOP`: the server keeps its connections and answers nothing.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// `kill -CONT` after [`RedisServer::pause`].
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, sig: &str) {
        let pid = self.child.as_ref().expect("redis-server running").id();
        let ok = Command::new("kill")
            .args([sig, &pid.to_string()])
            .status()
            .expect("kill")
            .success();
        assert!(ok, "kill {sig} {pid}");
    }

    /// Starts the server (again) on the same port and data, and waits until it answers.
    pub fn restart(&mut self) {
        self.kill9();
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args([
                "--save",
                "",
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
            ])
            .arg("--dir")
            .arg(self.dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("this test needs redis-server (apt redis-server): {e}"));
        self.child = Some(child);
        let t = Instant::now();
        while !self.answers() {
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "redis-server on port {} did not answer PING within 10 s",
                self.port
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Whether it answers PING now.
    pub fn answers(&self) -> bool {
        let Ok(mut s) = TcpStream::connect(("127.0.0.1", self.port)) else {
            return false;
        };
        let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
        let mut buf = [0u8; 7];
        s.write_all(b"PING\r\n").is_ok() && s.read_exact(&mut buf).is_ok() && &buf == b"+PONG\r\n"
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill9();
    }
}
