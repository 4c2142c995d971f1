//! A sushy-emulator (`--fake`) of the test's own, on a free port: a Redfish service
//! with ComputerSystem.Reset whose power state changes after a delay.

use std::time::Duration;

pub struct Emulator {
    pub url: String,
    child: std::process::Child,
    /// The fake driver keeps its systems' state under the temporary directory: one of
    /// its own, so that no other run's emulator shares (or left) its power states.
    _state: tempfile::TempDir,
}

impl Emulator {
    pub fn start() -> Emulator {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .expect("workspace")
            .to_path_buf();
        let bin = std::env::var("POWERPLANE_SUSHY_EMULATOR")
            .map(std::path::PathBuf::from)
            .unwrap_or_else(|_| root.join(".venv/bin/sushy-emulator"));
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .expect("free port")
            .local_addr()
            .expect("addr")
            .port();
        let state = tempfile::tempdir().expect("state dir");
        let child = std::process::Command::new(&bin)
            .args(["--fake", "-i", "127.0.0.1", "-p", &port.to_string()])
            .env("TMPDIR", state.path())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "this test needs sushy-emulator at {} (sushy-tools, scripts/test installs it): {e}",
                    bin.display()
                )
            });
        let e = Emulator {
            url: format!("http://127.0.0.1:{port}"),
            child,
            _state: state,
        };
        for _ in 0..400 {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return e;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("sushy-emulator did not listen on port {port}");
    }
}

impl Emulator {
    /// A client of the emulator, and the `@odata.id` of its first system, once the
    /// emulator answers (it may take a moment after it listens).
    pub fn first_system(&self) -> (orchestrator::node_power::RedfishPower, String) {
        let r =
            orchestrator::node_power::RedfishPower::new(&self.url, Duration::from_secs(10), None)
                .expect("client");
        for _ in 0..100 {
            if let Some(s) = r.systems().ok().and_then(|s| s.into_iter().next()) {
                return (r, s);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("sushy-emulator at {} lists no system", self.url);
    }
}

impl Drop for Emulator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
