//! A sushy-emulator (`--fake`) of the test's own, on a free port: a Redfish service
//! with ComputerSystem.Reset whose power state changes after a delay; plain, or with
//! its own HTTPS and HTTP Basic auth (a bcrypt htpasswd file, as it takes them).

#![allow(dead_code)]

use std::time::Duration;

pub struct Emulator {
    pub url: String,
    /// How a client gets in: the CA of its certificate and the credentials, when it
    /// was started secured.
    pub access: Option<(sources::tls::Tls, sources::redfish::Auth)>,
    child: std::process::Child,
    /// The fake driver keeps its systems' state under the temporary directory: one of
    /// its own, so that no other run's emulator shares (or left) its power states.
    _state: tempfile::TempDir,
}

/// The emulator's HTTPS and login: its certificate and key, the CA that signed them,
/// and the one user it lets in.
pub struct Secured<'a> {
    pub cert: &'a std::path::Path,
    pub key: &'a std::path::Path,
    pub ca: &'a std::path::Path,
    pub username: &'a str,
    pub password: &'a str,
}

impl Emulator {
    pub fn start() -> Emulator {
        Emulator::start_with(None)
    }

    /// # Panics
    /// When sushy-emulator is missing or does not listen.
    pub fn start_with(secured: Option<Secured<'_>>) -> Emulator {
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
        let mut cmd = std::process::Command::new(&bin);
        cmd.args(["--fake", "-i", "127.0.0.1", "-p", &port.to_string()]);
        let mut access = None;
        if let Some(s) = &secured {
            // the htpasswd line, hashed by the bcrypt sushy-tools itself uses
            let python = bin.with_file_name("python");
            let hashed = std::process::Command::new(&python)
                .args([
                    "-c",
                    "import bcrypt, sys; print(bcrypt.hashpw(sys.argv[1].encode(), bcrypt.gensalt()).decode())",
                    s.password,
                ])
                .output()
                .expect("the emulator's python");
            assert!(
                hashed.status.success(),
                "{}",
                String::from_utf8_lossy(&hashed.stderr)
            );
            let htpasswd = state.path().join("htpasswd");
            std::fs::write(
                &htpasswd,
                format!(
                    "{}:{}",
                    s.username,
                    String::from_utf8_lossy(&hashed.stdout).trim()
                ),
            )
            .expect("htpasswd");
            let conf = state.path().join("emulator.conf");
            std::fs::write(
                &conf,
                format!(
                    "SUSHY_EMULATOR_AUTH_FILE = {:?}\n",
                    htpasswd.display().to_string()
                ),
            )
            .expect("config");
            cmd.arg("--config")
                .arg(&conf)
                .arg("--ssl-certificate")
                .arg(s.cert)
                .arg("--ssl-key")
                .arg(s.key);
            access = Some((
                sources::tls::Tls {
                    ca_file: Some(s.ca.display().to_string()),
                    ..Default::default()
                },
                sources::redfish::Auth::Basic {
                    username: s.username.into(),
                    password: s.password.into(),
                    password_file: None,
                },
            ));
        }
        let child = cmd
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
        let scheme = if secured.is_some() { "https" } else { "http" };
        let e = Emulator {
            url: format!("{scheme}://127.0.0.1:{port}"),
            access,
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
        let mut cfg = sources::redfish::EndpointConfig::new("bmc", &self.url);
        cfg.timeout_s = 10.0;
        if let Some((tls, auth)) = &self.access {
            cfg.tls = tls.clone();
            cfg.auth = auth.clone();
        }
        let r = orchestrator::node_power::RedfishPower::new(cfg).expect("client");
        for _ in 0..100 {
            if let Some(s) = r.systems().ok().and_then(|s| s.into_iter().next()) {
                return (r, s);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("sushy-emulator at {} lists no system", self.url);
    }
}

/// Waits (generously: the fake driver takes seconds, the machine is loaded) until
/// `system` reports `want`.
pub fn wait_for(
    r: &orchestrator::node_power::RedfishPower,
    system: &str,
    want: orchestrator::node_power::PowerState,
    log: &dyn Fn() -> String,
) {
    let start = std::time::Instant::now();
    while start.elapsed() < Duration::from_secs(120) {
        if r.power_state(system).ok() == Some(want) {
            return;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    panic!("{system} never reached {want:?}\n{}", log());
}

impl Drop for Emulator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
