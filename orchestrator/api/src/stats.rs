//! Counters of the HTTP edge (connections, limits hit, logins, TLS), written by the
//! server tasks and rendered on `/metrics` after the board's families.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};

use telemetry::histogram::Histogram;

/// Every count is since start.
#[derive(Debug, Default)]
pub struct HttpStats {
    /// Connections given a slot.
    pub accepted: AtomicU64,
    /// Connections refused with `503` (every slot was in a request).
    pub refused: AtomicU64,
    /// Idle connections closed to make room for a new one.
    pub evicted: AtomicU64,
    /// `accept` failures (for example EMFILE at the fd limit).
    pub accept_errors: AtomicU64,
    /// Connections open now.
    pub open: AtomicU64,
    pub header_timeouts: AtomicU64,
    pub headers_too_large: AtomicU64,
    pub body_timeouts: AtomicU64,
    pub bodies_too_large: AtomicU64,
    pub tls_handshake_errors: AtomicU64,
    pub tls_reloads_ok: AtomicU64,
    pub tls_reloads_error: AtomicU64,
    pub logins_ok: AtomicU64,
    pub logins_refused: AtomicU64,
    /// How long each request took, from its head read to its answer, by [`ROUTES`].
    pub request_seconds: [Histogram; ROUTES.len()],
}

/// The `route` label of the request histogram: the API's own routes, so that the
/// label stays bounded whatever paths clients send (any other is `other`).
pub const ROUTES: [&str; 21] = [
    "/",
    "/login",
    "/logout",
    "/metrics",
    "/healthz",
    "/readyz",
    "/api/v1/openapi.json",
    "/api/v1/events",
    "/api/v1/status",
    "/api/v1/racks",
    "/api/v1/gpus",
    "/api/v1/holds",
    "/api/v1/jobs",
    "/api/v1/policy",
    "/api/v1/decisions",
    "/api/v1/schedulers",
    "/api/v1/agents",
    "/api/v1/overrides",
    "/api/v1/k8s/admission",
    "/api/v1/k8s/filter",
    "other",
];

/// The index in [`ROUTES`] of a request's path (`/api/v1/overrides/...` is
/// `/api/v1/overrides`; `/api/v1/k8s/prioritize` shares `/api/v1/k8s/filter`, the
/// scheduler extender's).
pub fn route_index(path: &str) -> usize {
    let path = if path.starts_with("/api/v1/overrides/") {
        "/api/v1/overrides"
    } else if path == "/api/v1/k8s/prioritize" {
        "/api/v1/k8s/filter"
    } else {
        path
    };
    ROUTES
        .iter()
        .position(|r| *r == path)
        .unwrap_or(ROUTES.len() - 1)
}

/// Adds one to a counter.
pub fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

impl HttpStats {
    /// Appends the families in the text exposition format 0.0.4.
    pub fn render_into(&self, out: &mut String) {
        self.render_connections(out);
        self.render_requests(out);
        // the routes requested since start (a scrape of a quiet API stays small)
        let rows: Vec<(&str, telemetry::histogram::Snapshot)> = ROUTES
            .iter()
            .zip(&self.request_seconds)
            .map(|(r, h)| (*r, h.snapshot()))
            .filter(|(_, h)| h.count > 0)
            .collect();
        out.push_str(&crate::metrics::histogram_family(
            "http_request_duration_seconds",
            "HTTP requests by route, from the head read to the answer written (a job event's wait for the store included)",
            "route",
            &rows,
        ));
    }

    /// The connection families: accepted and refused, evicted, open, accept errors.
    fn render_connections(&self, out: &mut String) {
        family(
            out,
            "http_connections_total",
            "counter",
            "HTTP connections by outcome: accepted into a slot, or refused with 503 when every slot was in a request",
            &[
                ("{outcome=\"accepted\"}", v(&self.accepted)),
                ("{outcome=\"refused\"}", v(&self.refused)),
            ],
        );
        family(
            out,
            "http_connections_evicted_total",
            "counter",
            "Idle HTTP connections closed to make room for a new one at max_connections",
            &[("", v(&self.evicted))],
        );
        family(
            out,
            "http_connections_open",
            "gauge",
            "HTTP connections open now",
            &[("", v(&self.open))],
        );
        family(
            out,
            "http_accept_errors_total",
            "counter",
            "Failed accepts of the HTTP listener (such as EMFILE at the fd limit); it keeps listening",
            &[("", v(&self.accept_errors))],
        );
    }

    /// The request families: limits hit, TLS handshakes and reloads, logins.
    fn render_requests(&self, out: &mut String) {
        family(
            out,
            "http_limit_hits_total",
            "counter",
            "HTTP requests cut off by a limit: headers too slow (dropped) or too large (431), body too slow (408) or too large (413)",
            &[
                ("{limit=\"header_timeout\"}", v(&self.header_timeouts)),
                ("{limit=\"header_size\"}", v(&self.headers_too_large)),
                ("{limit=\"body_timeout\"}", v(&self.body_timeouts)),
                ("{limit=\"body_size\"}", v(&self.bodies_too_large)),
            ],
        );
        family(
            out,
            "http_tls_handshake_errors_total",
            "counter",
            "TLS handshakes that failed or timed out",
            &[("", v(&self.tls_handshake_errors))],
        );
        family(
            out,
            "http_tls_reloads_total",
            "counter",
            "Rereads of the TLS certificate and key (SIGHUP, or the files changed), by outcome; on error the previous pair stays",
            &[
                ("{outcome=\"ok\"}", v(&self.tls_reloads_ok)),
                ("{outcome=\"error\"}", v(&self.tls_reloads_error)),
            ],
        );
        family(
            out,
            "http_logins_total",
            "counter",
            "Status page logins by outcome",
            &[
                ("{outcome=\"ok\"}", v(&self.logins_ok)),
                ("{outcome=\"refused\"}", v(&self.logins_refused)),
            ],
        );
    }
}

fn v(c: &AtomicU64) -> u64 {
    c.load(Ordering::Relaxed)
}

/// One family in the text exposition format: its help, its type, its rows.
fn family(out: &mut String, name: &str, kind: &str, help: &str, rows: &[(&str, u64)]) {
    let _ = writeln!(out, "# HELP powerplane_{name} {help}");
    let _ = writeln!(out, "# TYPE powerplane_{name} {kind}");
    for (labels, value) in rows {
        let _ = writeln!(out, "powerplane_{name}{labels} {value}");
    }
}
