//! The HTTP edge of `serve`: HTTP/1.1 (hyper) on the tokio runtime `serve` owns, in
//! front of [`Api::handle`]. The accept loop gives each connection a slot (see
//! [`super::slots`]) and a task; a connection must send its headers within
//! `header_timeout_s` and its body within `body_timeout_s`, headers are limited to
//! `max_header_bytes` (`431`) and bodies to [`super::MAX_BODY`] (`413`); when every
//! slot is in a request a new connection gets a quick `503`. An accept that fails (at
//! the fd limit) is counted, logged at most every 10 s, and retried after a pause. At
//! shutdown it stops accepting, lets requests in flight finish for `drain_s`, then
//! closes what is left.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tracing::{debug, info, warn};

use super::service::Ctx;
use super::session::Sessions;
use super::slots::{Admit, Slot, Slots};
use super::stats::{bump, HttpStats};
use super::tls::{Tls, TlsError};
use super::{Api, HttpSection};
use runtime::Runtime;

pub fn default_max_connections() -> usize {
    512
}
pub fn default_timeout_s() -> f64 {
    10.0
}
pub fn default_max_header_bytes() -> usize {
    32 * 1024
}
pub fn default_drain_s() -> f64 {
    5.0
}
pub fn default_session_s() -> f64 {
    8.0 * 3600.0
}
pub fn default_ready_stale_s() -> f64 {
    60.0
}
pub fn default_ready_stall_ticks() -> f64 {
    3.0
}

/// Connections refused at once at most while others are being written their `503`;
/// beyond, a refused connection is closed without an answer.
const MAX_REFUSING: usize = 64;
/// The pause after a failed accept (EMFILE: until a connection closes).
const ACCEPT_PAUSE: Duration = Duration::from_millis(100);
/// The listen backlog.
const BACKLOG: u32 = 1024;

/// Why the HTTP edge could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("[http] cannot listen on {listen}")]
    Listen {
        listen: String,
        #[source]
        source: std::io::Error,
    },
    #[error("[http] {0}")]
    Invalid(String),
    #[error(transparent)]
    Tls(#[from] TlsError),
}

fn positive(name: &str, v: f64) -> Result<Duration, ServeError> {
    if v.is_finite() && v > 0.0 && v <= 86_400.0 * 365.0 {
        Ok(Duration::from_secs_f64(v))
    } else {
        Err(ServeError::Invalid(format!(
            "{name} must be a positive number of seconds, got {v}"
        )))
    }
}

/// The `[http]` durations, checked: (header, body, session, drain).
fn limits(sec: &HttpSection) -> Result<(Duration, Duration, Duration, Duration), ServeError> {
    if sec.max_connections == 0 {
        return Err(ServeError::Invalid(
            "max_connections must be at least 1, got 0".into(),
        ));
    }
    if !(1024..=1024 * 1024).contains(&sec.max_header_bytes) {
        return Err(ServeError::Invalid(format!(
            "max_header_bytes must be within 1024..=1048576, got {}",
            sec.max_header_bytes
        )));
    }
    if sec.tls_reload_s != 0.0 {
        positive("tls_reload_s", sec.tls_reload_s)?;
    }
    let drain = if sec.drain_s == 0.0 {
        Duration::ZERO
    } else {
        positive("drain_s", sec.drain_s)?
    };
    Ok((
        positive("header_timeout_s", sec.header_timeout_s)?,
        positive("body_timeout_s", sec.body_timeout_s)?,
        positive("session_s", sec.session_s)?,
        drain,
    ))
}

/// The certificate pair of `[http]`, if any (relative paths from the config's folder).
fn tls(sec: &HttpSection, base: &Path) -> Result<Option<Arc<Tls>>, ServeError> {
    let resolve = |p: &Path| {
        if p.is_absolute() {
            p.to_path_buf()
        } else {
            base.join(p)
        }
    };
    match (&sec.tls_cert_file, &sec.tls_key_file) {
        (None, None) => Ok(None),
        (Some(c), Some(k)) => Ok(Some(Arc::new(Tls::load(&resolve(c), &resolve(k))?))),
        _ => Err(TlsError::Half.into()),
    }
}

/// Checks `[http]` as `serve --check` does: limits and the certificate pair.
pub fn check(sec: &HttpSection, base: &Path) -> Result<(), ServeError> {
    limits(sec)?;
    tls(sec, base).map(|_| ())
}

/// Listens on `[http] listen` and serves `api` on `runtime` until its shutdown token
/// is cancelled; returns once listening.
pub fn serve(
    sec: &HttpSection,
    base: &Path,
    api: Api,
    runtime: &Runtime,
) -> Result<(), ServeError> {
    let (header_timeout, body_timeout, session, drain) = limits(sec)?;
    let tls = tls(sec, base)?;
    let listener = {
        let _in_runtime = runtime.handle().enter();
        bind(&sec.listen).map_err(|source| ServeError::Listen {
            listen: sec.listen.clone(),
            source,
        })?
    };
    info!(listen = %sec.listen, tls = tls.is_some(), max_connections = sec.max_connections, "http api listening");
    let ctx = Arc::new(Ctx {
        stats: api.stats.clone(),
        api,
        sessions: Sessions::new(session),
        tls: tls.is_some(),
        header_timeout,
        body_timeout,
        max_header_bytes: sec.max_header_bytes,
        events_waiting: Arc::new(Semaphore::new(super::service::MAX_WAITING_EVENTS)),
        tracker: runtime.tracker.clone(),
        shutdown: runtime.shutdown.clone(),
    });
    if let Some(t) = &tls {
        runtime.spawn(super::tls::reload_on_sighup(
            t.clone(),
            ctx.stats.clone(),
            ctx.shutdown.clone(),
            (sec.tls_reload_s > 0.0).then(|| Duration::from_secs_f64(sec.tls_reload_s)),
        ));
    }
    let slots = Slots::new(sec.max_connections);
    runtime.spawn(accept_loop(listener, ctx, slots, tls, drain));
    Ok(())
}

/// A listener with a backlog deep enough for bursts of connections.
fn bind(listen: &str) -> std::io::Result<TcpListener> {
    use std::net::ToSocketAddrs;
    let addr = listen
        .to_socket_addrs()?
        .next()
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidInput, "no address"))?;
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(BACKLOG)
}

/// A warning at most once per period, with the count of those suppressed.
struct Every {
    period: Duration,
    last: Option<Instant>,
    suppressed: u64,
}

impl Every {
    /// `Some(suppressed since the last one)` when a warning is due.
    fn due(&mut self, now: Instant) -> Option<u64> {
        if self
            .last
            .is_some_and(|t| now.duration_since(t) < self.period)
        {
            self.suppressed += 1;
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.suppressed))
    }
}

async fn accept_loop(
    listener: TcpListener,
    ctx: Arc<Ctx>,
    slots: Arc<Slots>,
    tls: Option<Arc<Tls>>,
    drain: Duration,
) {
    let refusing = Arc::new(Semaphore::new(MAX_REFUSING));
    let mut warn_every = Every {
        period: Duration::from_secs(10),
        last: None,
        suppressed: 0,
    };
    loop {
        let stream = tokio::select! {
            _ = ctx.shutdown.cancelled() => break,
            got = listener.accept() => match got {
                Ok((stream, _peer)) => stream,
                Err(e) => {
                    bump(&ctx.stats.accept_errors);
                    if let Some(suppressed) = warn_every.due(Instant::now()) {
                        warn!(error = %e, suppressed, open = slots.open(), "http accept failed; pausing, then accepting again");
                    }
                    tokio::time::sleep(ACCEPT_PAUSE).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        match slots.admit() {
            Admit::Open { slot, evicted } => {
                if evicted {
                    bump(&ctx.stats.evicted);
                }
                bump(&ctx.stats.accepted);
                ctx.tracker
                    .spawn(connection(stream, slot, ctx.clone(), tls.clone()));
            }
            Admit::Full => {
                bump(&ctx.stats.refused);
                // TLS clients could not read a plain answer: they are just closed
                if tls.is_none() {
                    if let Ok(permit) = refusing.clone().try_acquire_owned() {
                        ctx.tracker.spawn(refuse(stream, permit));
                    }
                }
            }
        }
    }
    drop(listener);
    info!(
        open = slots.open(),
        drain_s = drain.as_secs_f64(),
        "http: stopped accepting; draining"
    );
    let deadline = Instant::now() + drain;
    while slots.open() > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    if slots.open() > 0 {
        warn!(
            open = slots.open(),
            "http drain time is up; closing the connections left"
        );
        slots.close_all();
    }
}

/// The quick `503` for a connection over the cap, then close.
async fn refuse(mut stream: TcpStream, _permit: OwnedSemaphorePermit) {
    let body = r#"{"error": "every connection is in a request; retry"}"#;
    let answer = format!(
        "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        stream.write_all(answer.as_bytes()).await?;
        stream.shutdown().await?;
        // read a little of what the client sent, so that closing does not reset the answer
        let mut buf = [0u8; 4096];
        let mut seen = 0;
        while seen < 64 * 1024 {
            match stream.read(&mut buf).await? {
                0 => break,
                n => seen += n,
            }
        }
        Ok::<(), std::io::Error>(())
    })
    .await;
}

/// Counts a connection open while it lives.
struct Open(Arc<HttpStats>);

impl Drop for Open {
    fn drop(&mut self) {
        self.0
            .open
            .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

async fn connection(stream: TcpStream, slot: Slot, ctx: Arc<Ctx>, tls: Option<Arc<Tls>>) {
    bump(&ctx.stats.open);
    let _open = Open(ctx.stats.clone());
    let Some(tls) = tls else {
        return serve_http(stream, slot, ctx).await;
    };
    let handshake = tokio::select! {
        _ = slot.close.cancelled() => return,
        _ = ctx.shutdown.cancelled() => return,
        r = tokio::time::timeout(ctx.header_timeout, tls.acceptor().accept(stream)) => r,
    };
    match handshake {
        Ok(Ok(s)) => serve_http(s, slot, ctx).await,
        Ok(Err(e)) => {
            bump(&ctx.stats.tls_handshake_errors);
            debug!(error = %e, "tls handshake failed");
        }
        Err(_) => {
            bump(&ctx.stats.tls_handshake_errors);
            debug!("tls handshake timed out");
        }
    }
}

/// One connection's requests until it closes, is evicted, or drains at shutdown.
async fn serve_http<S>(io: S, slot: Slot, ctx: Arc<Ctx>)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (c, marker) = (ctx.clone(), slot.marker());
    let svc = hyper::service::service_fn(move |req| {
        let (c, m) = (c.clone(), marker.clone());
        async move { Ok::<_, std::convert::Infallible>(super::service::answer(req, c, m).await) }
    });
    let mut b = http1::Builder::new();
    b.timer(TokioTimer::new())
        .header_read_timeout(ctx.header_timeout)
        .max_header_size(ctx.max_header_bytes)
        .max_buf_size(ctx.max_header_bytes.max(8192))
        .keep_alive(true);
    let conn = b.serve_connection(TokioIo::new(io), svc);
    tokio::pin!(conn);
    let done = tokio::select! {
        r = conn.as_mut() => r,
        _ = slot.close.cancelled() => return,
        _ = ctx.shutdown.cancelled() => {
            conn.as_mut().graceful_shutdown();
            tokio::select! {
                r = conn.as_mut() => r,
                _ = slot.close.cancelled() => return,
            }
        }
    };
    if let Err(e) = done {
        if e.is_timeout() {
            bump(&ctx.stats.header_timeouts);
        } else if e.is_parse_too_large() {
            bump(&ctx.stats.headers_too_large);
        }
        debug!(error = %e, "http connection ended with an error");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_repeated_warning_is_let_through_once_per_period_with_the_count() {
        let mut e = Every {
            period: Duration::from_secs(10),
            last: None,
            suppressed: 0,
        };
        let t0 = Instant::now();
        assert_eq!(e.due(t0), Some(0));
        assert_eq!(e.due(t0 + Duration::from_secs(1)), None);
        assert_eq!(e.due(t0 + Duration::from_secs(2)), None);
        assert_eq!(e.due(t0 + Duration::from_secs(11)), Some(2));
    }
}
