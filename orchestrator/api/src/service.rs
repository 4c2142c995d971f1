//! One HTTP request, from hyper to [`Api`] and back: the body read under its size
//! limit and deadline, the status-page login and its session cookie, and the answer
//! computed on the blocking pool (it takes the board's and the fleet's locks; a job
//! event waits until it is stored), so that no request holds up the runtime.

use std::sync::Arc;
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::header::{self, HeaderMap, HeaderName, HeaderValue};
use hyper::{Request, Response, StatusCode};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{info, warn};

use super::session::Sessions;
use super::slots::Marker;
use super::stats::{bump, HttpStats};
use super::{error, query, session, Api, Reply, MAX_BODY};

/// What every connection shares.
pub(super) struct Ctx {
    pub api: Api,
    pub sessions: Sessions,
    pub stats: Arc<HttpStats>,
    /// Served over TLS (the session cookie is then `Secure`).
    pub tls: bool,
    pub header_timeout: Duration,
    pub body_timeout: Duration,
    pub max_header_bytes: usize,
    /// Job events waiting to be stored (beyond, `503`).
    pub events_waiting: Arc<Semaphore>,
    pub tracker: TaskTracker,
    pub shutdown: CancellationToken,
}

/// Job events waiting for their answer at most (beyond, `503`).
pub const MAX_WAITING_EVENTS: usize = 64;

type Body = Full<Bytes>;

/// What reading a request's body gave.
enum Got {
    Whole(Vec<u8>),
    TooLarge,
    TooSlow,
    Broken,
}

/// Answers one request; never fails (errors are answers). Its duration counts in the
/// route's histogram.
pub(super) async fn answer(
    req: Request<Incoming>,
    ctx: Arc<Ctx>,
    marker: Marker,
) -> Response<Body> {
    let started = Instant::now();
    let route = super::stats::route_index(req.uri().path());
    let stats = ctx.stats.clone();
    let response = answer_timed(req, ctx, marker).await;
    stats.request_seconds[route].observe(started.elapsed());
    response
}

async fn answer_timed(req: Request<Incoming>, ctx: Arc<Ctx>, marker: Marker) -> Response<Body> {
    let _busy = marker.busy();
    let (parts, body) = req.into_parts();
    let method = parts.method.as_str().to_string();
    let path = parts.uri.path().to_string();
    let query = parts.uri.query().unwrap_or("").to_string();
    let auth = text(&parts.headers, header::AUTHORIZATION);
    let cookie = text(&parts.headers, header::COOKIE);
    let body = match read_body(body, &parts.headers, &ctx).await {
        Got::Whole(b) => Some(b),
        Got::TooLarge => None,
        Got::TooSlow => {
            let why = format!(
                "the request body did not arrive within {} s",
                ctx.body_timeout.as_secs_f64()
            );
            return closing(respond(error(408, &why), Vec::new()));
        }
        Got::Broken => {
            return closing(respond(
                error(400, "the request body broke off"),
                Vec::new(),
            ))
        }
    };
    match path.as_str() {
        "/login" => return login(&method, body.as_deref(), &ctx),
        "/logout" => return logout(cookie.as_deref(), &ctx),
        "/api/v1/events" => return event(method, &parts.headers, auth, body, &ctx).await,
        "/" if method == "GET"
            && !ctx.api.status_page_public
            && ctx.api.role(auth.as_deref()).is_none()
            && ctx
                .sessions
                .check(cookie.as_deref(), Instant::now())
                .is_some() =>
        {
            return blocking(&ctx, Api::status_page).await;
        }
        _ => {}
    }
    let Some(body) = body else {
        let why = format!("request bodies are limited to {MAX_BODY} bytes");
        return closing(respond(error(413, &why), Vec::new()));
    };
    blocking(&ctx, move |api| {
        api.handle(&method, &path, &query, auth.as_deref(), &body)
    })
    .await
}

fn text<K: header::AsHeaderName>(headers: &HeaderMap, name: K) -> Option<String> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

/// The body, at most [`MAX_BODY`] bytes, within the body deadline.
async fn read_body(body: Incoming, headers: &HeaderMap, ctx: &Ctx) -> Got {
    let declared = text(headers, header::CONTENT_LENGTH).and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > MAX_BODY as u64) {
        bump(&ctx.stats.bodies_too_large);
        return Got::TooLarge;
    }
    match tokio::time::timeout(ctx.body_timeout, Limited::new(body, MAX_BODY).collect()).await {
        Err(_) => {
            bump(&ctx.stats.body_timeouts);
            Got::TooSlow
        }
        Ok(Err(e)) if e.downcast_ref::<LengthLimitError>().is_some() => {
            bump(&ctx.stats.bodies_too_large);
            Got::TooLarge
        }
        Ok(Err(_)) => Got::Broken,
        Ok(Ok(collected)) => Got::Whole(collected.to_bytes().to_vec()),
    }
}

/// Runs `f` on the blocking pool (tracked for shutdown).
async fn blocking<F>(ctx: &Arc<Ctx>, f: F) -> Response<Body>
where
    F: FnOnce(&Api) -> Reply + Send + 'static,
{
    let c = ctx.clone();
    match ctx.tracker.spawn_blocking(move || f(&c.api)).await {
        Ok(reply) => respond(reply, Vec::new()),
        Err(e) => {
            warn!(error = %e, "an http answer failed");
            respond(error(500, "the answer failed; see the log"), Vec::new())
        }
    }
}

/// `POST /api/v1/events`: waits until the event is stored, with at most
/// [`MAX_WAITING_EVENTS`] waiting.
async fn event(
    method: String,
    headers: &HeaderMap,
    auth: Option<String>,
    body: Option<Vec<u8>>,
    ctx: &Arc<Ctx>,
) -> Response<Body> {
    let Ok(permit) = ctx.events_waiting.clone().try_acquire_owned() else {
        return respond(
            error(503, "too many events waiting to be stored; retry"),
            Vec::new(),
        );
    };
    let ts = text(headers, integrations::webhook::TIMESTAMP_HEADER);
    let sig = text(headers, integrations::webhook::SIGNATURE_HEADER);
    let too_large = body.is_none();
    let r = blocking(ctx, move |api| {
        let _permit = permit;
        api.event(
            &method,
            ts.as_deref(),
            sig.as_deref(),
            auth.as_deref(),
            body.as_deref(),
        )
    })
    .await;
    if too_large {
        closing(r)
    } else {
        r
    }
}

/// `POST /login` (a form with `token`): a session cookie and back to `/`;
/// `GET /login`: the form.
fn login(method: &str, body: Option<&[u8]>, ctx: &Ctx) -> Response<Body> {
    if method != "POST" {
        return respond(session::login_page(200, None), Vec::new());
    }
    let token = body.and_then(|b| query::form_field(b, "token"));
    let who = token
        .as_deref()
        .and_then(|t| ctx.api.token_role(t.trim()))
        .map(|(role, name)| (role, name.to_string()));
    let Some((role, name)) = who else {
        bump(&ctx.stats.logins_refused);
        return respond(session::login_page(401, Some("Unknown token.")), Vec::new());
    };
    match ctx.sessions.open(&name, role, Instant::now()) {
        Ok(id) => {
            bump(&ctx.stats.logins_ok);
            info!(token = %name, "status page login");
            let cookie = session::set_cookie(&id, ctx.sessions.ttl(), ctx.tls);
            see_root(cookie)
        }
        Err(e) => {
            warn!(error = %e, "status page login failed");
            respond(error(500, "cannot open a session; see the log"), Vec::new())
        }
    }
}

/// `POST /logout`: ends the session and clears the cookie.
fn logout(cookie: Option<&str>, ctx: &Ctx) -> Response<Body> {
    ctx.sessions.close(cookie);
    see_root(session::clear_cookie(ctx.tls))
}

/// `303 See Other` to `/`, setting a cookie.
fn see_root(cookie: String) -> Response<Body> {
    let mut r = respond(
        Reply {
            status: 303,
            content_type: "text/plain; charset=utf-8",
            body: Bytes::from_static(b"see /\n"),
            challenge: false,
        },
        vec![
            (header::LOCATION, "/".to_string()),
            (header::SET_COOKIE, cookie),
        ],
    );
    r.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

/// Asks hyper to close the connection after this answer (its body was not read).
fn closing(mut r: Response<Body>) -> Response<Body> {
    r.headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    r
}

/// A [`Reply`] as a response (bodies are in memory: a Content-Length, never chunks).
fn respond(reply: Reply, extra: Vec<(HeaderName, String)>) -> Response<Body> {
    let mut r = Response::new(Full::new(reply.body));
    *r.status_mut() =
        StatusCode::from_u16(reply.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(reply.content_type),
    );
    if reply.challenge {
        h.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    }
    for (name, value) in extra {
        if let Ok(v) = HeaderValue::from_str(&value) {
            h.append(name, v);
        }
    }
    r
}
