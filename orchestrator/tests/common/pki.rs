//! A site's private PKI for the TLS tests, made with the `openssl` command: a CA, a
//! server certificate for 127.0.0.1 and a client certificate it signed, and a second
//! CA that signed nothing of ours; and an HTTPS front (TLS in front of a plain-HTTP
//! server) that may ask for a client certificate the site CA signed.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

pub struct Pki {
    pub ca: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
    /// A CA that signed neither certificate.
    pub other_ca: PathBuf,
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = std::process::Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .output()
        .expect("this test needs the openssl command");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

impl Pki {
    /// # Panics
    /// When `openssl` is missing or fails.
    pub fn new(dir: &Path) -> Pki {
        let ca = |name: &str| {
            openssl(
                dir,
                &[
                    "req",
                    "-x509",
                    "-newkey",
                    "rsa:2048",
                    "-nodes",
                    "-days",
                    "2",
                    "-subj",
                    &format!("/CN={name}"),
                    "-addext",
                    "basicConstraints=critical,CA:TRUE",
                    "-addext",
                    "keyUsage=critical,keyCertSign,cRLSign",
                    "-keyout",
                    &format!("{name}.key"),
                    "-out",
                    &format!("{name}.pem"),
                ],
            );
        };
        ca("site-ca");
        ca("other-ca");
        let leaf = |name: &str, ext: &str| {
            openssl(
                dir,
                &[
                    "req",
                    "-newkey",
                    "rsa:2048",
                    "-nodes",
                    "-subj",
                    &format!("/CN={name}"),
                    "-keyout",
                    &format!("{name}.key"),
                    "-out",
                    &format!("{name}.csr"),
                ],
            );
            std::fs::write(dir.join(format!("{name}.ext")), ext).expect("ext");
            openssl(
                dir,
                &[
                    "x509",
                    "-req",
                    "-in",
                    &format!("{name}.csr"),
                    "-CA",
                    "site-ca.pem",
                    "-CAkey",
                    "site-ca.key",
                    "-CAcreateserial",
                    "-days",
                    "2",
                    "-extfile",
                    &format!("{name}.ext"),
                    "-out",
                    &format!("{name}.pem"),
                ],
            );
        };
        leaf(
            "server",
            "subjectAltName=IP:127.0.0.1\nbasicConstraints=critical,CA:FALSE\nextendedKeyUsage=serverAuth\n",
        );
        leaf(
            "client",
            "basicConstraints=critical,CA:FALSE\nextendedKeyUsage=clientAuth\n",
        );
        Pki {
            ca: dir.join("site-ca.pem"),
            server_cert: dir.join("server.pem"),
            server_key: dir.join("server.key"),
            client_cert: dir.join("client.pem"),
            client_key: dir.join("client.key"),
            other_ca: dir.join("other-ca.pem"),
        }
    }
}

/// HTTPS on a port of its own in front of a plain-HTTP server: each request (head and
/// `Content-Length` body) is passed on, and the answer passed back with a proper
/// `close_notify`. With `client_ca`, a client must show a certificate that CA signed.
pub struct TlsFront {
    pub url: String,
    /// Handshakes that failed (the client refused our certificate, or we its).
    pub refused: Arc<AtomicUsize>,
    /// With a [`SessionGate`]: session logins that succeeded, and requests refused
    /// for want of a valid `X-Auth-Token` or with wrong credentials.
    pub logins: Arc<AtomicUsize>,
    pub unauthorized: Arc<AtomicUsize>,
}

/// What a BMC's Redfish session service asks: a POST to
/// `/redfish/v1/SessionService/Sessions` with `UserName` and `Password` gives an
/// `X-Auth-Token` (and the session's `Location`); every other request needs the token
/// of the last login, which expires after `token_uses` requests.
#[derive(Clone)]
pub struct SessionGate {
    pub username: String,
    pub password: String,
    pub token_uses: usize,
}

impl TlsFront {
    /// # Panics
    /// When the certificate, key or CA cannot be read.
    pub fn start(pki: &Pki, client_ca: Option<&Path>, upstream: &str) -> TlsFront {
        TlsFront::start_gated(pki, client_ca, upstream, None)
    }

    /// The front, letting in only the holders of a session token when `gate` is set.
    ///
    /// # Panics
    /// When the certificate, key or CA cannot be read.
    pub fn start_gated(
        pki: &Pki,
        client_ca: Option<&Path>,
        upstream: &str,
        gate: Option<SessionGate>,
    ) -> TlsFront {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&pki.server_cert)
            .expect("cert file")
            .collect::<Result<_, _>>()
            .expect("certs");
        let key = PrivateKeyDer::from_pem_file(&pki.server_key).expect("key file");
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .expect("protocols");
        let builder = match client_ca {
            Some(ca) => {
                let mut roots = rustls::RootCertStore::empty();
                for c in CertificateDer::pem_file_iter(ca).expect("ca file") {
                    roots.add(c.expect("ca")).expect("ca");
                }
                let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                    roots.into(),
                    provider,
                )
                .build()
                .expect("client verifier");
                builder.with_client_cert_verifier(verifier)
            }
            None => builder.with_no_client_auth(),
        };
        let config = Arc::new(builder.with_single_cert(certs, key).expect("server config"));
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let url = format!("https://{}", l.local_addr().expect("addr"));
        let upstream = upstream.trim_start_matches("http://").to_string();
        let refused = Arc::new(AtomicUsize::new(0));
        let logins = Arc::new(AtomicUsize::new(0));
        let unauthorized = Arc::new(AtomicUsize::new(0));
        let uses = Arc::new(AtomicUsize::new(0));
        let count = refused.clone();
        let (logged, denied) = (logins.clone(), unauthorized.clone());
        std::thread::spawn(move || {
            for tcp in l.incoming().flatten() {
                let (config, upstream, count) = (config.clone(), upstream.clone(), count.clone());
                let (gate, logged, denied, uses) =
                    (gate.clone(), logged.clone(), denied.clone(), uses.clone());
                std::thread::spawn(move || {
                    let _ = tcp.set_read_timeout(Some(std::time::Duration::from_secs(10)));
                    let Ok(conn) = rustls::ServerConnection::new(config) else {
                        return;
                    };
                    let mut tls = rustls::StreamOwned::new(conn, tcp);
                    let Some(req) = read_request(&mut tls) else {
                        count.fetch_add(1, Ordering::Relaxed);
                        return;
                    };
                    if let Some(g) = &gate {
                        let answer = |status: &str, extra: &str| {
                            format!("HTTP/1.1 {status}\r\n{extra}Content-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{{}}")
                        };
                        let text = String::from_utf8_lossy(&req).to_string();
                        let reply = if text.starts_with("POST /redfish/v1/SessionService/Sessions ")
                        {
                            let body = text.split("\r\n\r\n").nth(1).unwrap_or("");
                            let v: serde_json::Value =
                                serde_json::from_str(body).unwrap_or_default();
                            if v["UserName"] == g.username.as_str()
                                && v["Password"] == g.password.as_str()
                            {
                                let n = logged.fetch_add(1, Ordering::SeqCst) + 1;
                                uses.store(0, Ordering::SeqCst);
                                Some(answer(
                                    "201 Created",
                                    &format!("X-Auth-Token: token-{n}\r\nLocation: /redfish/v1/SessionService/Sessions/{n}\r\n"),
                                ))
                            } else {
                                denied.fetch_add(1, Ordering::SeqCst);
                                Some(answer("401 Unauthorized", ""))
                            }
                        } else {
                            let current = format!("token-{}", logged.load(Ordering::SeqCst));
                            let token = text.lines().find_map(|l| {
                                let (k, v) = l.split_once(':')?;
                                k.trim()
                                    .eq_ignore_ascii_case("x-auth-token")
                                    .then(|| v.trim().to_string())
                            });
                            let valid = token.as_deref() == Some(current.as_str())
                                && uses.fetch_add(1, Ordering::SeqCst) < g.token_uses;
                            if valid {
                                None
                            } else {
                                denied.fetch_add(1, Ordering::SeqCst);
                                Some(answer("401 Unauthorized", ""))
                            }
                        };
                        if let Some(r) = reply {
                            let _ = tls.write_all(r.as_bytes());
                            tls.conn.send_close_notify();
                            let _ = tls.flush();
                            return;
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
        TlsFront {
            url,
            refused,
            logins,
            unauthorized,
        }
    }
}

/// One request, its head rewritten to close the upstream connection after the answer;
/// `None` when the handshake or the read fails.
fn read_request(s: &mut impl Read) -> Option<Vec<u8>> {
    let mut req = Vec::new();
    let mut buf = [0u8; 4096];
    let head_end = loop {
        if let Some(i) = req.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        match s.read(&mut buf) {
            Ok(0) | Err(_) => return None,
            Ok(n) => req.extend_from_slice(&buf[..n]),
        }
    };
    let head = String::from_utf8_lossy(&req[..head_end]).to_string();
    let length: usize = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim()
                .eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse().ok())?
        })
        .unwrap_or(0);
    while req.len() < head_end + length {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => return None,
            Ok(n) => req.extend_from_slice(&buf[..n]),
        }
    }
    let mut out: Vec<u8> = head
        .lines()
        .filter(|l| !l.to_ascii_lowercase().starts_with("connection:") && !l.is_empty())
        .flat_map(|l| format!("{l}\r\n").into_bytes())
        .collect();
    out.extend_from_slice(b"Connection: close\r\n\r\n");
    out.extend_from_slice(&req[head_end..head_end + length]);
    Some(out)
}
