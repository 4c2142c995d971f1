//! End-to-end tests of powerplane against real servers, and what they share.
//!
//! # Layout
//!
//! - [`store_contract`]: the one contract every store backend must keep, run against
//!   the embedded store and a real Redis (`tests/store.rs`).
//! - [`redis_url`] / [`redis_backend`]: the Redis the tests use. A test that needs
//!   Redis fails when it is missing; it never skips.
//! - [`fixtures`]: sample decisions, jobs and states.
#![forbid(unsafe_code)]

pub mod fixtures;
pub mod store_contract;

use integrations::store::redis::RedisBackend;

/// The Redis the tests talk to: `POWERPLANE_TEST_REDIS` or `redis://127.0.0.1:6379/0`.
pub fn redis_url() -> String {
    std::env::var("POWERPLANE_TEST_REDIS")
        .unwrap_or_else(|_| "redis://127.0.0.1:6379/0".to_string())
}

/// A Redis backend under a prefix no other test uses, emptied first.
///
/// # Panics
/// When Redis cannot be reached: the test fails loudly, it does not skip.
pub fn redis_backend(test: &str) -> RedisBackend {
    let prefix = format!("powerplane-test:{}:{}", std::process::id(), test);
    let mut b = RedisBackend::connect(&redis_url(), &prefix).unwrap_or_else(|e| {
        panic!(
            "this test needs a real Redis at {} (scripts/test starts one): {e}",
            redis_url()
        )
    });
    b.clear().expect("clear test prefix");
    b
}

/// Publishes one message with the real `mosquitto_pub` client.
///
/// # Panics
/// When `mosquitto_pub` is missing or fails: the test needs it (scripts/test installs it).
pub fn mosquitto_pub(port: u16, topic: &str, payload: &[u8], extra: &[&str]) {
    use std::io::Write;
    let mut child = std::process::Command::new("mosquitto_pub")
        .args([
            "-h",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "-t",
            topic,
            "-s",
        ])
        .args(extra)
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| {
            panic!("this test needs mosquitto_pub (Debian mosquitto-clients): {e}")
        });
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(payload)
        .expect("write payload");
    let status = child.wait().expect("mosquitto_pub");
    assert!(status.success(), "mosquitto_pub to port {port} failed");
}

/// The broker the tests use: `POWERPLANE_TEST_MQTT_PORT` or 1883 on 127.0.0.1.
pub fn mqtt_port() -> u16 {
    std::env::var("POWERPLANE_TEST_MQTT_PORT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(1883)
}

/// A private Mosquitto on a free port, for tests that stop and restart the broker.
pub struct Broker {
    pub port: u16,
    child: Option<std::process::Child>,
    dir: tempfile::TempDir,
}

impl Broker {
    /// # Panics
    /// When `mosquitto` cannot be started.
    pub fn start() -> Broker {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .expect("free port")
            .local_addr()
            .expect("addr")
            .port();
        let dir = tempfile::tempdir().expect("tempdir");
        let mut b = Broker {
            port,
            child: None,
            dir,
        };
        b.restart();
        b
    }

    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn restart(&mut self) {
        self.stop();
        let conf = self.dir.path().join("mosquitto.conf");
        std::fs::write(
            &conf,
            format!(
                "listener {} 127.0.0.1\nallow_anonymous true\npersistence false\n",
                self.port
            ),
        )
        .expect("write conf");
        let child = std::process::Command::new("mosquitto")
            .args(["-c"])
            .arg(&conf)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("this test needs mosquitto (Debian mosquitto): {e}"));
        self.child = Some(child);
        for _ in 0..100 {
            if std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        panic!("mosquitto did not listen on port {}", self.port);
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        self.stop();
    }
}
