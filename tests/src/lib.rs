//! End-to-end tests of powerplane against real servers, and what they share.
//!
//! # Layout
//!
//! - [`store_contract`]: the one contract every store backend must keep, run against
//!   the embedded store and a real Redis (`tests/store.rs`).
//! - [`redis_url`] / [`redis_backend`]: the Redis the tests use. A test that needs
//!   Redis fails when it is missing; it never skips.
//! - [`redis_server`]: a `redis-server` of a test's own, to kill and restart.
//! - [`fixtures`]: sample decisions, jobs and states.
//! - [`slurm`]: the real single-node Slurm (`scripts/slurm up`) and its commands.
//! - [`mock_bmc`]: many simulated BMCs (a DMTF mockup, a delay per GET, switchable faults).
//! - [`kube_api`]: a fake Kubernetes API server over HTTPS (pods, events, leases; lists,
//!   watches, patches, optimistic concurrency; switchable faults).
#![forbid(unsafe_code)]

pub mod fixtures;
pub mod kube_api;
pub mod mock_bmc;
pub mod openadr3_vtn;
pub mod pg;
pub mod pg_server;
pub mod redis_server;
pub mod slurm;
pub mod slurm24;
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

/// A private Mosquitto on a free port, for tests that stop and restart the broker, or
/// need a TLS listener.
pub struct Broker {
    pub port: u16,
    /// A second listener with TLS, when started with a certificate.
    pub tls_port: Option<u16>,
    tls: Option<(std::path::PathBuf, std::path::PathBuf)>,
    /// A password file: anonymous clients refused.
    passwords: Option<std::path::PathBuf>,
    child: Option<std::process::Child>,
    dir: tempfile::TempDir,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("free port")
        .local_addr()
        .expect("addr")
        .port()
}

impl Broker {
    /// # Panics
    /// When `mosquitto` cannot be started.
    pub fn start() -> Broker {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut b = Broker {
            port: free_port(),
            tls_port: None,
            tls: None,
            passwords: None,
            child: None,
            dir,
        };
        b.restart();
        b
    }

    /// A broker with a plain listener and a TLS one using this certificate and key.
    ///
    /// # Panics
    /// When `mosquitto` cannot be started.
    pub fn start_tls(cert: &std::path::Path, key: &std::path::Path) -> Broker {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tempdir");
        // mosquitto started as root drops to its own user: it must be able to read these
        let (c, k) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
        std::fs::copy(cert, &c).expect("copy cert");
        std::fs::copy(key, &k).expect("copy key");
        for (p, mode) in [
            (dir.path(), 0o755),
            (c.as_path(), 0o644),
            (k.as_path(), 0o644),
        ] {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).expect("chmod");
        }
        let mut b = Broker {
            port: free_port(),
            tls_port: Some(free_port()),
            tls: Some((c, k)),
            passwords: None,
            child: None,
            dir,
        };
        b.restart();
        b
    }

    /// A broker that wants `user`/`password` from every client.
    ///
    /// # Panics
    /// When `mosquitto` or `mosquitto_passwd` cannot run.
    pub fn start_with_password(user: &str, password: &str) -> Broker {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))
            .expect("chmod");
        let file = dir.path().join("passwords");
        let ok = std::process::Command::new("mosquitto_passwd")
            .args(["-c", "-b"])
            .arg(&file)
            .args([user, password])
            .status()
            .expect("this test needs mosquitto_passwd (Debian mosquitto)");
        assert!(ok.success(), "mosquitto_passwd failed");
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        let mut b = Broker {
            port: free_port(),
            tls_port: None,
            tls: None,
            passwords: Some(file),
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
        let mut text = match &self.passwords {
            Some(f) => format!("per_listener_settings false\nallow_anonymous false\npassword_file {}\npersistence false\nlistener {} 127.0.0.1\n", f.display(), self.port),
            None => format!("per_listener_settings false\nallow_anonymous true\npersistence false\nlistener {} 127.0.0.1\n", self.port),
        };
        if let (Some(p), Some((cert, key))) = (self.tls_port, &self.tls) {
            text.push_str(&format!(
                "listener {p} 127.0.0.1\ncertfile {}\nkeyfile {}\n",
                cert.display(),
                key.display()
            ));
        }
        std::fs::write(&conf, text).expect("write conf");
        let child = std::process::Command::new("mosquitto")
            .args(["-c"])
            .arg(&conf)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("this test needs mosquitto (Debian mosquitto): {e}"));
        self.child = Some(child);
        for _ in 0..100 {
            let tls_up = self
                .tls_port
                .is_none_or(|p| std::net::TcpStream::connect(("127.0.0.1", p)).is_ok());
            if tls_up && std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
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

/// The workspace root (where `.venv/` and `tests/fixtures/` are).
pub fn workspace_root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace")
        .to_path_buf()
}

/// A DMTF mockup served by the real `sushy-static`, on a free port.
pub struct Sushy {
    pub url: String,
    child: std::process::Child,
}

impl Sushy {
    /// Serves `tests/fixtures/redfish/{mockup}`; with `tls`, over HTTPS with that
    /// certificate and key.
    ///
    /// # Panics
    /// When `sushy-static` is missing (scripts/test installs it into `.venv/`).
    pub fn start(mockup: &str, tls: Option<(&std::path::Path, &std::path::Path)>) -> Sushy {
        // a free port can be taken by another test's server between our probe and the
        // server's bind: a server that exits, or a port that answers as another
        // server, is tried again on another port
        for _ in 0..5 {
            if let Some(s) = Sushy::try_start(mockup, tls) {
                return s;
            }
        }
        panic!("sushy-static did not serve {mockup} on any of 5 ports");
    }

    fn try_start(mockup: &str, tls: Option<(&std::path::Path, &std::path::Path)>) -> Option<Sushy> {
        let bin = std::env::var("POWERPLANE_SUSHY_STATIC")
            .map(std::path::PathBuf::from)
            .unwrap_or_else(|_| workspace_root().join(".venv/bin/sushy-static"));
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .expect("free port")
            .local_addr()
            .expect("addr")
            .port();
        let dir = workspace_root().join("tests/fixtures/redfish").join(mockup);
        let mut cmd = std::process::Command::new(&bin);
        cmd.args(["-i", "127.0.0.1", "-p", &port.to_string(), "-m"])
            .arg(&dir);
        if let Some((cert, key)) = tls {
            cmd.arg("-c").arg(cert).arg("-k").arg(key);
        }
        let child = cmd
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "this test needs sushy-static at {} (scripts/test installs it): {e}",
                    bin.display()
                )
            });
        let scheme = if tls.is_some() { "https" } else { "http" };
        let mut s = Sushy {
            url: format!("{scheme}://127.0.0.1:{port}"),
            child,
        };
        for _ in 0..200 {
            if s.child.try_wait().ok().flatten().is_some() {
                return None; // it could not bind: the port was taken
            }
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                // ours, and serving: still running a moment later, and (plain HTTP)
                // answering with this mockup's service root
                std::thread::sleep(std::time::Duration::from_millis(100));
                if s.child.try_wait().ok().flatten().is_some() {
                    return None;
                }
                if tls.is_some() || serves_redfish(port) {
                    return Some(s);
                }
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        panic!("sushy-static did not listen on port {port}");
    }
}

/// Whether `GET /redfish/v1` on the port answers 200.
fn serves_redfish(port: u16) -> bool {
    use std::io::{Read, Write};
    let Ok(mut c) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = c.set_read_timeout(Some(std::time::Duration::from_secs(5)));
    if c.write_all(b"GET /redfish/v1 HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut head = [0u8; 12];
    c.read_exact(&mut head).is_ok() && head.starts_with(b"HTTP/1.") && &head[9..12] == b"200"
}

impl Drop for Sushy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A fake BMC for failure modes: it accepts connections and then hangs, or answers
/// every request with HTTP 500.
pub struct BadBmc {
    pub url: String,
}

impl BadBmc {
    pub fn hanging() -> BadBmc {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let url = format!("http://{}", l.local_addr().expect("addr"));
        std::thread::spawn(move || {
            let mut held = Vec::new();
            for s in l.incoming().flatten() {
                held.push(s); // never answer, never close
            }
        });
        BadBmc { url }
    }

    pub fn failing() -> BadBmc {
        use std::io::{Read, Write};
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let url = format!("http://{}", l.local_addr().expect("addr"));
        std::thread::spawn(move || {
            for mut s in l.incoming().flatten() {
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf);
                let _ = s.write_all(b"HTTP/1.1 500 Internal Server Error\r\ncontent-length: 5\r\nconnection: close\r\n\r\noops!");
            }
        });
        BadBmc { url }
    }
}

/// A BMC with its own (self-signed) certificate: TLS in front of a plain-HTTP server,
/// closing each response properly (`close_notify`), as a BMC does. `sushy-static`'s own
/// HTTPS closes HTTP/1.0 responses without `close_notify`, which rustls rightly treats
/// as a possible truncation.
pub struct TlsBmc {
    pub url: String,
}

impl TlsBmc {
    /// # Panics
    /// When the certificate or key cannot be read.
    pub fn start(cert: &std::path::Path, key: &std::path::Path, upstream: &str) -> TlsBmc {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        use std::io::{Read, Write};
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
            .expect("cert file")
            .collect::<Result<_, _>>()
            .expect("certs");
        let key = PrivateKeyDer::from_pem_file(key).expect("key file");
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let config = std::sync::Arc::new(
            rustls::ServerConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .expect("protocols")
                .with_no_client_auth()
                .with_single_cert(certs, key)
                .expect("server config"),
        );
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let url = format!("https://{}", l.local_addr().expect("addr"));
        let upstream = upstream.trim_start_matches("http://").to_string();
        std::thread::spawn(move || {
            for tcp in l.incoming().flatten() {
                let (config, upstream) = (config.clone(), upstream.clone());
                std::thread::spawn(move || {
                    let Ok(conn) = rustls::ServerConnection::new(config) else {
                        return;
                    };
                    let mut tls = rustls::StreamOwned::new(conn, tcp);
                    let mut req = Vec::new();
                    let mut buf = [0u8; 4096];
                    while !req.windows(4).any(|w| w == b"\r\n\r\n") {
                        match tls.read(&mut buf) {
                            Ok(0) | Err(_) => return, // the client refused the certificate
                            Ok(n) => req.extend_from_slice(&buf[..n]),
                        }
                    }
                    let Ok(mut up) = std::net::TcpStream::connect(&upstream) else {
                        return;
                    };
                    let mut resp = Vec::new();
                    if up.write_all(&req).is_err() || up.read_to_end(&mut resp).is_err() {
                        return;
                    }
                    let _ = tls.write_all(&resp);
                    tls.conn.send_close_notify();
                    let _ = tls.flush();
                });
            }
        });
        TlsBmc { url }
    }
}

/// A certificate for 127.0.0.1 that signs itself (not a CA), its key, and its SHA-256.
///
/// # Panics
/// When the `openssl` command is missing or fails.
pub fn self_signed(dir: &std::path::Path) -> (std::path::PathBuf, std::path::PathBuf, String) {
    self_signed_key(dir, &["rsa:2048"])
}

/// [`self_signed`] with the key `openssl req -newkey` makes of `newkey` (`["rsa:2048"]`,
/// `["ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"]`).
///
/// # Panics
/// When the `openssl` command is missing or fails.
pub fn self_signed_key(
    dir: &std::path::Path,
    newkey: &[&str],
) -> (std::path::PathBuf, std::path::PathBuf, String) {
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    let ok = std::process::Command::new("openssl")
        .args(["req", "-x509", "-newkey"])
        .args(newkey)
        .args([
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-addext",
            "basicConstraints=critical,CA:FALSE",
            "-keyout",
        ])
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output()
        .expect("this test needs the openssl command");
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    let fp = std::process::Command::new("openssl")
        .args(["x509", "-noout", "-fingerprint", "-sha256", "-in"])
        .arg(&cert)
        .output()
        .expect("openssl");
    let text = String::from_utf8_lossy(&fp.stdout).to_string();
    let hex = text
        .trim()
        .rsplit('=')
        .next()
        .expect("fingerprint")
        .to_string();
    (cert, key, hex)
}

/// A BMC that wants credentials: HTTP Basic (`user`/`pass`) or a Redfish session
/// (POST `/redfish/v1/SessionService/Sessions` gives an `X-Auth-Token`, which expires
/// after `token_uses` requests), in front of a plain-HTTP server.
pub struct AuthBmc {
    pub url: String,
    /// Session logins so far.
    pub logins: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl AuthBmc {
    pub fn start(upstream: &str, session: bool, token_uses: usize) -> AuthBmc {
        use std::io::{BufRead, BufReader, Read, Write};
        use std::sync::atomic::{AtomicUsize, Ordering};
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let url = format!("http://{}", l.local_addr().expect("addr"));
        let upstream = upstream.trim_start_matches("http://").to_string();
        let logins = std::sync::Arc::new(AtomicUsize::new(0));
        let uses = std::sync::Arc::new(AtomicUsize::new(0));
        let counter = logins.clone();
        std::thread::spawn(move || {
            for s in l.incoming().flatten() {
                let (upstream, logins, uses) = (upstream.clone(), counter.clone(), uses.clone());
                std::thread::spawn(move || {
                    let mut r = BufReader::new(s.try_clone().expect("clone"));
                    let mut w = s;
                    loop {
                        let mut line = String::new();
                        if r.read_line(&mut line).unwrap_or(0) == 0 {
                            return;
                        }
                        let (mut auth, mut token, mut len) = (None, None, 0usize);
                        let mut head = line.clone();
                        loop {
                            let mut h = String::new();
                            if r.read_line(&mut h).unwrap_or(0) == 0 || h == "\r\n" {
                                break;
                            }
                            let lower = h.to_ascii_lowercase();
                            if let Some(v) = lower.strip_prefix("authorization: ") {
                                auth = Some(v.trim().to_string());
                            }
                            if let Some(v) = lower.strip_prefix("x-auth-token: ") {
                                token = Some(v.trim().to_string());
                            }
                            if let Some(v) = lower.strip_prefix("content-length: ") {
                                len = v.trim().parse().unwrap_or(0);
                            }
                            head.push_str(&h);
                        }
                        let mut body = vec![0u8; len];
                        let _ = r.read_exact(&mut body);
                        let reply = |w: &mut std::net::TcpStream,
                                     status: &str,
                                     extra: &str,
                                     body: &[u8]| {
                            let _ = w.write_all(
                                format!(
                                    "HTTP/1.1 {status}\r\n{extra}content-length: {}\r\n\r\n",
                                    body.len()
                                )
                                .as_bytes(),
                            );
                            let _ = w.write_all(body);
                        };
                        if line.starts_with("POST /redfish/v1/SessionService/Sessions") {
                            let ok = String::from_utf8_lossy(&body)
                                .contains("\"UserName\":\"user\"")
                                && String::from_utf8_lossy(&body).contains("\"Password\":\"pass\"");
                            if ok {
                                let n = logins.fetch_add(1, Ordering::SeqCst) + 1;
                                uses.store(0, Ordering::SeqCst);
                                reply(
                                    &mut w,
                                    "201 Created",
                                    &format!("x-auth-token: token-{n}\r\n"),
                                    b"{}",
                                );
                            } else {
                                reply(&mut w, "401 Unauthorized", "", b"{}");
                            }
                            continue;
                        }
                        let allowed = if session {
                            let current = format!("token-{}", logins.load(Ordering::SeqCst));
                            token.as_deref() == Some(current.as_str())
                                && uses.fetch_add(1, Ordering::SeqCst) < token_uses
                        } else {
                            auth.as_deref() == Some("basic dxnlcjpwyxnz") // user:pass, lowercased
                        };
                        if !allowed {
                            reply(&mut w, "401 Unauthorized", "", b"{}");
                            continue;
                        }
                        let path = line.split_whitespace().nth(1).unwrap_or("/");
                        let Ok(mut up) = std::net::TcpStream::connect(&upstream) else {
                            return;
                        };
                        let mut resp = Vec::new();
                        if up
                            .write_all(format!("GET {path} HTTP/1.0\r\n\r\n").as_bytes())
                            .is_err()
                            || up.read_to_end(&mut resp).is_err()
                        {
                            return;
                        }
                        let split = resp
                            .windows(4)
                            .position(|w| w == b"\r\n\r\n")
                            .map_or(0, |i| i + 4);
                        let status_ok =
                            resp.starts_with(b"HTTP/1.0 200") || resp.starts_with(b"HTTP/1.1 200");
                        reply(
                            &mut w,
                            if status_ok { "200 OK" } else { "404 Not Found" },
                            "content-type: application/json\r\n",
                            &resp[split..],
                        );
                    }
                });
            }
        });
        AuthBmc { url, logins }
    }
}
