//! Status-page logins: the login form, and sessions. `POST /login` with a token (any
//! role) gives a random session id in an `HttpOnly`, `SameSite=Strict` cookie; the
//! server keeps only its SHA-256, with the token's name, role and an expiry. Sessions
//! live in memory (a restart logs everyone out) and open the status page only; the
//! API keeps asking for a bearer token in the `Authorization` header.

use std::collections::HashMap;
use std::io::Read;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

use super::{Reply, Role};

/// The cookie's name.
pub const COOKIE: &str = "powerplane_session";

/// Sessions kept at most; beyond, the one that expires first goes.
pub const MAX_SESSIONS: usize = 4096;

#[derive(Debug, Clone)]
struct Session {
    name: String,
    role: Role,
    expires: Instant,
}

/// The sessions of the status page.
#[derive(Debug)]
pub struct Sessions {
    ttl: Duration,
    map: Mutex<HashMap<[u8; 32], Session>>,
}

/// A session id could not be drawn.
#[derive(Debug, thiserror::Error)]
#[error("cannot draw a session id from /dev/urandom")]
pub struct NoRandom(#[source] std::io::Error);

impl Sessions {
    pub fn new(ttl: Duration) -> Self {
        Sessions {
            ttl,
            map: Mutex::new(HashMap::new()),
        }
    }

    /// How long a session lasts.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// Opens a session for a token's owner; returns the id to put in the cookie.
    pub fn open(&self, name: &str, role: Role, now: Instant) -> Result<String, NoRandom> {
        let mut raw = [0u8; 32];
        std::fs::File::open("/dev/urandom")
            .and_then(|mut f| f.read_exact(&mut raw))
            .map_err(NoRandom)?;
        let id: String = raw.iter().map(|b| format!("{b:02x}")).collect();
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        if map.len() >= MAX_SESSIONS {
            map.retain(|_, s| s.expires > now);
        }
        if map.len() >= MAX_SESSIONS {
            if let Some(first) = map.iter().min_by_key(|(_, s)| s.expires).map(|(k, _)| *k) {
                map.remove(&first);
            }
        }
        map.insert(
            digest(&id),
            Session {
                name: name.to_string(),
                role,
                expires: now + self.ttl,
            },
        );
        Ok(id)
    }

    /// The name and role of the live session a `Cookie` header names, if any.
    pub fn check(&self, cookie_header: Option<&str>, now: Instant) -> Option<(String, Role)> {
        let id = cookie_value(cookie_header?)?;
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        let key = digest(id);
        match map.get(&key) {
            Some(s) if s.expires > now => Some((s.name.clone(), s.role)),
            Some(_) => {
                map.remove(&key);
                None
            }
            None => None,
        }
    }

    /// Ends the session a `Cookie` header names.
    pub fn close(&self, cookie_header: Option<&str>) {
        if let Some(id) = cookie_header.and_then(cookie_value) {
            self.map
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&digest(id));
        }
    }
}

fn digest(id: &str) -> [u8; 32] {
    Sha256::digest(id.as_bytes()).into()
}

/// Our cookie's value in a `Cookie` header (`a=1; powerplane_session=...`).
fn cookie_value(header: &str) -> Option<&str> {
    header.split(';').find_map(|kv| {
        let (k, v) = kv.trim().split_once('=')?;
        (k == COOKIE && !v.is_empty()).then_some(v)
    })
}

/// The `Set-Cookie` value for a new session (`Secure` when served over TLS).
pub fn set_cookie(id: &str, ttl: Duration, secure: bool) -> String {
    format!(
        "{COOKIE}={id}; Path=/; Max-Age={}; HttpOnly; SameSite=Strict{}",
        ttl.as_secs(),
        if secure { "; Secure" } else { "" }
    )
}

/// The `Set-Cookie` value that removes the cookie.
pub fn clear_cookie(secure: bool) -> String {
    format!(
        "{COOKIE}=; Path=/; Max-Age=0; HttpOnly; SameSite=Strict{}",
        if secure { "; Secure" } else { "" }
    )
}

/// The login form (no script, no external asset), with a note after a failed try.
pub fn login_page(status: u16, note: Option<&str>) -> Reply {
    let note = note
        .map(|n| format!("<p class=\"err\">{n}</p>"))
        .unwrap_or_default();
    let body = format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>powerplane — log in</title>\
<style>body{{font:16px system-ui,sans-serif;margin:4em auto;max-width:28em}}input{{font:inherit;width:100%;margin:.3em 0}}.err{{color:#b00}}</style></head>\
<body><h1>powerplane</h1><p>The status page needs a token (any role).</p>{note}\
<form method=\"post\" action=\"/login\"><label for=\"token\">Token</label>\
<input id=\"token\" name=\"token\" type=\"password\" autocomplete=\"current-password\" required>\
<input type=\"submit\" value=\"Log in\"></form></body></html>\n"
    );
    Reply {
        status,
        content_type: "text/html; charset=utf-8",
        body: body.into_bytes().into(),
        challenge: status == 401,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_opens_the_page_until_it_expires_or_is_closed() {
        let s = Sessions::new(Duration::from_secs(60));
        let t0 = Instant::now();
        let id = s.open("grafana", Role::Viewer, t0).expect("id");
        assert_eq!(id.len(), 64);
        let header = format!("theme=dark; {COOKIE}={id}");
        assert_eq!(
            s.check(Some(&header), t0),
            Some(("grafana".to_string(), Role::Viewer))
        );
        assert_eq!(s.check(Some(&format!("{COOKIE}=nope")), t0), None);
        assert_eq!(s.check(None, t0), None);
        assert_eq!(s.check(Some(&header), t0 + Duration::from_secs(61)), None);
        let id = s.open("sre", Role::Operator, t0).expect("id");
        let header = format!("{COOKIE}={id}");
        s.close(Some(&header));
        assert_eq!(s.check(Some(&header), t0), None);
        assert_ne!(s.open("a", Role::Viewer, t0).expect("a"), id, "ids differ");
    }

    #[test]
    fn the_cookie_is_http_only_and_same_site_strict() {
        let c = set_cookie("abc", Duration::from_secs(3600), true);
        assert_eq!(
            c,
            "powerplane_session=abc; Path=/; Max-Age=3600; HttpOnly; SameSite=Strict; Secure"
        );
        assert!(!set_cookie("abc", Duration::from_secs(1), false).contains("Secure"));
    }
}
