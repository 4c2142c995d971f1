//! The HTTP under [`super::ApiClient`]: hyper's HTTP/1.1 client over a unix socket
//! (`rest_auth/local`) or TCP, with rustls for `https://` (a CA file), the JWT headers
//! from a token file that is re-read when it changes, one deadline over the whole
//! exchange and a cap on the answer's size. One connection per call (slurmrestd is
//! called a few times a tick at most).

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::header::{HeaderValue, ACCEPT, CONNECTION, CONTENT_LENGTH, CONTENT_TYPE, HOST};
use hyper::{Method, Request};
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncWrite};

use super::SlurmApiError;

/// Where slurmrestd listens, and how to reach it.
#[derive(Clone)]
pub enum Transport {
    Unix(PathBuf),
    Tcp {
        host: String,
        port: u16,
    },
    Tls {
        host: String,
        port: u16,
        config: Arc<rustls::ClientConfig>,
    },
}

impl Transport {
    /// `unix:/path` (or a bare path), `http://host:port`, or `https://host:port` (with
    /// `ca_file`, the PEM CA that signed the proxy's certificate).
    pub fn parse(s: &str, ca_file: Option<&Path>) -> Result<Transport, SlurmApiError> {
        let bad = |why: &str| SlurmApiError::Config(format!("endpoint {s:?}: {why}"));
        let host_port = |rest: &str, default: u16| -> Result<(String, u16), SlurmApiError> {
            let rest = rest.trim_end_matches('/');
            if rest.is_empty() || rest.contains('/') {
                return Err(bad("use scheme://host:port with no path"));
            }
            match rest.rsplit_once(':') {
                Some((h, p)) => p
                    .parse::<u16>()
                    .map(|p| (h.to_string(), p))
                    .map_err(|_| bad("the port must be a number")),
                None => Ok((rest.to_string(), default)),
            }
        };
        if let Some(rest) = s.strip_prefix("http://") {
            let (host, port) = host_port(rest, 80)?;
            Ok(Transport::Tcp { host, port })
        } else if let Some(rest) = s.strip_prefix("https://") {
            let (host, port) = host_port(rest, 443)?;
            let ca = ca_file.ok_or_else(|| bad("https needs ca_file (the CA's PEM)"))?;
            Ok(Transport::Tls {
                host,
                port,
                config: tls_config(ca)?,
            })
        } else {
            let path = s.strip_prefix("unix:").unwrap_or(s);
            if path.is_empty() {
                return Err(bad("an empty socket path"));
            }
            Ok(Transport::Unix(PathBuf::from(path)))
        }
    }

    pub fn display(&self) -> String {
        match self {
            Transport::Unix(p) => format!("unix:{}", p.display()),
            Transport::Tcp { host, port } => format!("http://{host}:{port}"),
            Transport::Tls { host, port, .. } => format!("https://{host}:{port}"),
        }
    }
}

/// rustls with ring, trusting only the CAs in the PEM file.
fn tls_config(ca_file: &Path) -> Result<Arc<rustls::ClientConfig>, SlurmApiError> {
    let bad = |why: String| SlurmApiError::Config(format!("ca_file {}: {why}", ca_file.display()));
    let pem = std::fs::read(ca_file).map_err(|e| bad(e.to_string()))?;
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(&pem) {
        let cert = cert.map_err(|e| bad(format!("not PEM: {e}")))?;
        roots.add(cert).map_err(|e| bad(e.to_string()))?;
    }
    if roots.is_empty() {
        return Err(bad("no certificate in it".into()));
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| bad(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

/// A JWT in a file (what `scontrol token` printed, with or without `SLURM_JWT=`),
/// read again whenever the file's modification time, length or inode changes (a
/// rotation by `mv` is a new inode), and after slurmrestd refused it.
pub struct TokenFile {
    pub path: PathBuf,
    cached: Mutex<Option<(Stamp, String)>>,
}

type Stamp = (Option<SystemTime>, u64, u64);

impl TokenFile {
    pub fn new(path: PathBuf) -> TokenFile {
        TokenFile {
            path,
            cached: Mutex::new(None),
        }
    }

    /// The current token.
    pub fn token(&self) -> Result<String, SlurmApiError> {
        let bad = |why: String| {
            SlurmApiError::Config(format!("token_file {}: {why}", self.path.display()))
        };
        let meta = std::fs::metadata(&self.path).map_err(|e| bad(e.to_string()))?;
        let stamp: Stamp = (meta.modified().ok(), meta.len(), meta.ino());
        let mut cached = self
            .cached
            .lock()
            .map_err(|_| bad("lock poisoned".into()))?;
        if let Some((s, t)) = cached.as_ref() {
            if *s == stamp {
                return Ok(t.clone());
            }
        }
        let text = std::fs::read_to_string(&self.path).map_err(|e| bad(e.to_string()))?;
        let token = text.trim();
        let token = token
            .strip_prefix("SLURM_JWT=")
            .unwrap_or(token)
            .to_string();
        if token.is_empty() || token.contains(char::is_whitespace) {
            return Err(bad(
                "empty, or more than one word: write the token alone".into()
            ));
        }
        tracing::debug!(path = %self.path.display(), "read the slurmrestd token");
        *cached = Some((stamp, token.clone()));
        Ok(token)
    }

    /// Read the file again on the next call (slurmrestd refused the token).
    pub fn forget(&self) {
        if let Ok(mut c) = self.cached.lock() {
            *c = None;
        }
    }
}

/// Who the calls are made as.
pub enum Auth {
    /// `rest_auth/local`: the socket's peer uid; `X-SLURM-USER-NAME` if set (root only).
    Local { user: Option<String> },
    /// `rest_auth/jwt`: `X-SLURM-USER-NAME` and `X-SLURM-USER-TOKEN`.
    Jwt { user: String, token: TokenFile },
}

/// An answer: its status and its (capped) body.
pub struct Answer {
    pub status: u16,
    pub body: Bytes,
}

/// One slurmrestd, its auth, deadline and answer cap.
pub struct Http {
    pub transport: Transport,
    pub auth: Auth,
    pub timeout: Duration,
    pub max_answer_bytes: usize,
}

enum Fail {
    Io(String),
    TooLarge,
}

impl Http {
    /// One exchange within the deadline (connect, TLS, request, whole answer).
    pub async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Answer, SlurmApiError> {
        let at = self.transport.display();
        let req = self.request(method.clone(), path, body)?;
        let fut = self.exchange(req);
        match tokio::time::timeout(self.timeout, fut).await {
            Err(_) => Err(SlurmApiError::Timeout {
                at,
                method: method.to_string(),
                path: path.into(),
                timeout_s: self.timeout.as_secs_f64(),
            }),
            Ok(Err(Fail::TooLarge)) => Err(SlurmApiError::TooLarge {
                at,
                path: path.into(),
                limit: self.max_answer_bytes,
            }),
            Ok(Err(Fail::Io(message))) => Err(SlurmApiError::Io { at, message }),
            Ok(Ok(a)) => Ok(a),
        }
    }

    fn request(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Request<Full<Bytes>>, SlurmApiError> {
        let host = match &self.transport {
            Transport::Unix(_) => "localhost".to_string(),
            Transport::Tcp { host, port } | Transport::Tls { host, port, .. } => {
                format!("{host}:{port}")
            }
        };
        let bytes = body.map(|b| Bytes::from(b.to_string())).unwrap_or_default();
        let mut b = Request::builder()
            .method(method)
            .uri(path)
            .header(HOST, host)
            .header(ACCEPT, "application/json")
            // one connection per call: slurmrestd (or a proxy) closes it after the answer
            .header(CONNECTION, "close");
        if body.is_some() {
            b = b
                .header(CONTENT_TYPE, "application/json")
                .header(CONTENT_LENGTH, bytes.len());
        }
        let header = |v: &str| {
            HeaderValue::from_str(v)
                .map_err(|_| SlurmApiError::Config(format!("{v:?} is not a valid header value")))
        };
        match &self.auth {
            Auth::Local { user: Some(u) } => b = b.header("X-SLURM-USER-NAME", header(u)?),
            Auth::Local { user: None } => {}
            Auth::Jwt { user, token } => {
                b = b
                    .header("X-SLURM-USER-NAME", header(user)?)
                    .header("X-SLURM-USER-TOKEN", header(&token.token()?)?);
            }
        }
        b.body(Full::new(bytes))
            .map_err(|e| SlurmApiError::Config(format!("request {path:?}: {e}")))
    }

    async fn exchange(&self, req: Request<Full<Bytes>>) -> Result<Answer, Fail> {
        let io = |e: std::io::Error| Fail::Io(e.to_string());
        match &self.transport {
            Transport::Unix(p) => {
                let s = tokio::net::UnixStream::connect(p).await.map_err(io)?;
                send(s, req, self.max_answer_bytes).await
            }
            Transport::Tcp { host, port } => {
                let s = tokio::net::TcpStream::connect((host.as_str(), *port))
                    .await
                    .map_err(io)?;
                send(s, req, self.max_answer_bytes).await
            }
            Transport::Tls { host, port, config } => {
                let name = ServerName::try_from(host.clone())
                    .map_err(|e| Fail::Io(format!("tls server name {host:?}: {e}")))?;
                let s = tokio::net::TcpStream::connect((host.as_str(), *port))
                    .await
                    .map_err(io)?;
                let tls = tokio_rustls::TlsConnector::from(config.clone())
                    .connect(name, s)
                    .await
                    .map_err(|e| Fail::Io(format!("tls: {e}")))?;
                send(tls, req, self.max_answer_bytes).await
            }
        }
    }
}

/// The request on a fresh connection; the answer read frame by frame up to `cap`.
async fn send<S>(io: S, req: Request<Full<Bytes>>, cap: usize) -> Result<Answer, Fail>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let h = |e: hyper::Error| Fail::Io(e.to_string());
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(h)?;
    // the connection is driven beside the request; it ends with this call
    let driver = tokio::spawn(conn);
    let _abort = AbortOnDrop(driver);
    let resp = sender.send_request(req).await.map_err(h)?;
    let status = resp.status().as_u16();
    let declared = resp
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|n| n > cap) {
        return Err(Fail::TooLarge);
    }
    let mut body = resp.into_body();
    let mut buf = Vec::new();
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame.map_err(h)?.into_data() {
            if buf.len() + data.len() > cap {
                return Err(Fail::TooLarge);
            }
            buf.extend_from_slice(&data);
        }
    }
    Ok(Answer {
        status,
        body: Bytes::from(buf),
    })
}

struct AbortOnDrop(tokio::task::JoinHandle<Result<(), hyper::Error>>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_parse_and_https_needs_a_ca_file() {
        assert!(matches!(
            Transport::parse("unix:/run/slurmrestd.sock", None),
            Ok(Transport::Unix(p)) if p == Path::new("/run/slurmrestd.sock")
        ));
        assert!(matches!(
            Transport::parse("http://127.0.0.1:6820", None),
            Ok(Transport::Tcp { host, port: 6820 }) if host == "127.0.0.1"
        ));
        let e = Transport::parse("https://slurm.example:443", None)
            .err()
            .expect("refused");
        assert!(e.to_string().contains("ca_file"), "{e}");
        let e = Transport::parse("http://h:80/slurm", None)
            .err()
            .expect("refused");
        assert!(e.to_string().contains("no path"), "{e}");
    }

    #[test]
    fn a_token_file_is_reread_when_it_changes() {
        let path = std::env::temp_dir().join(format!("pp-slurm-token-{}", std::process::id()));
        std::fs::write(&path, "SLURM_JWT=first\n").expect("write");
        let t = TokenFile::new(path.clone());
        assert_eq!(t.token().expect("token"), "first");
        std::fs::write(&path, "second-token\n").expect("write");
        assert_eq!(t.token().expect("token"), "second-token");
        // rotated by rename, the same length: a new inode
        let next = path.with_extension("new");
        std::fs::write(&next, "third-token!\n").expect("write");
        std::fs::rename(&next, &path).expect("rename");
        assert_eq!(t.token().expect("token"), "third-token!");
        // refused by slurmrestd: read again even if nothing seems changed
        t.forget();
        assert_eq!(t.token().expect("token"), "third-token!");
        std::fs::write(&path, "\n").expect("write");
        let e = t.token().expect_err("empty");
        assert!(e.to_string().contains("token_file"), "{e}");
        let _ = std::fs::remove_file(&path);
    }
}
