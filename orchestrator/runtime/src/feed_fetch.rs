//! Live price and carbon feeds: a URL fetched on the one outbound HTTP stack with the
//! credentials its API wants, read from files when the config is loaded:
//! - `{ kind = "query", param = "securityToken", token_file = "..." }`: the token as a
//!   query parameter (ENTSO-E's transparency platform);
//! - `{ kind = "header", name = "auth-token", token_file = "..." }`: the token in a
//!   header of that name (Electricity Maps);
//! - `{ kind = "bearer", token_file = "..." }`: `Authorization: Bearer <token>`;
//! - `{ kind = "login", url = "https://api.watttime.org/login", username = "...",
//!   password_file = "..." }`: an HTTP Basic login that answers `{"token": "..."}`,
//!   sent as a bearer and renewed when the API answers 401 (WattTime; its tokens last
//!   30 minutes).
//!
//! The URL may hold `{start:FMT}` and `{end:FMT}` (a chrono format, in UTC): the
//! window from the start of today to two days on, as ENTSO-E's `periodStart` and
//! `periodEnd` want (`{start:%Y%m%d%H%M}`). An answer that is not 2xx is an error
//! that says the status and what the API said (its JSON `message`/`error`, or the
//! `<text>` of an ENTSO-E acknowledgement); no error or log line carries a token.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

/// How a feed's API takes its credentials.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, tag = "kind", rename_all = "snake_case")]
pub enum FeedAuth {
    #[default]
    None,
    Query {
        param: String,
        token_file: PathBuf,
        #[serde(skip)]
        token: String,
    },
    Header {
        name: String,
        token_file: PathBuf,
        #[serde(skip)]
        token: String,
    },
    Bearer {
        token_file: PathBuf,
        #[serde(skip)]
        token: String,
    },
    Login {
        url: String,
        username: String,
        password_file: PathBuf,
        #[serde(skip)]
        password: String,
    },
}

impl FeedAuth {
    /// Reads the token or password from its file (relative to `base`).
    pub fn read_secrets(&mut self, base: &Path) -> Result<(), sources::secret::SecretError> {
        match self {
            FeedAuth::None => {}
            FeedAuth::Query {
                token_file, token, ..
            }
            | FeedAuth::Header {
                token_file, token, ..
            }
            | FeedAuth::Bearer { token_file, token } => {
                *token = sources::secret::read(base, token_file)?;
            }
            FeedAuth::Login {
                password_file,
                password,
                ..
            } => *password = sources::secret::read(base, password_file)?,
        }
        Ok(())
    }
}

/// Why a fetch gave no document.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error(transparent)]
    Client(#[from] sources::http::ClientError),
    #[error("GET {url}: {message}")]
    Get { url: String, message: String },
    #[error("GET {url}: HTTP {status}{}", detail_text(.detail))]
    Status {
        url: String,
        status: u16,
        detail: String,
    },
    #[error("login at {url}: {message}")]
    Login { url: String, message: String },
    #[error("url {0:?}: {1}")]
    Url(String, String),
}

fn detail_text(d: &str) -> String {
    if d.is_empty() {
        String::new()
    } else {
        format!(": {d}")
    }
}

/// Fetches one feed, keeping a login's token between fetches.
pub struct Fetcher {
    url: String,
    auth: FeedAuth,
    client: reqwest::blocking::Client,
    /// The token a login gave.
    session: Option<String>,
}

impl Fetcher {
    pub fn new(
        url: &str,
        auth: FeedAuth,
        tls: &sources::tls::Tls,
        timeout: Duration,
    ) -> Result<Fetcher, FetchError> {
        Ok(Fetcher {
            url: url.to_string(),
            auth,
            client: sources::http::blocking_client(timeout, tls)?,
            session: None,
        })
    }

    /// The URL with its window filled in for `now`, and the query token added.
    fn url_at(&self, now: chrono::DateTime<chrono::Utc>) -> Result<reqwest::Url, FetchError> {
        let shown = window(&self.url, now);
        let mut url = reqwest::Url::parse(&shown)
            .map_err(|e| FetchError::Url(self.url.clone(), e.to_string()))?;
        if let FeedAuth::Query { param, token, .. } = &self.auth {
            url.query_pairs_mut().append_pair(param, token);
        }
        Ok(url)
    }

    /// The document at the URL now (blocking; run it off the tick).
    pub fn fetch(&mut self, now: chrono::DateTime<chrono::Utc>) -> Result<String, FetchError> {
        let url = self.url_at(now)?;
        // shown without the token
        let shown = window(&self.url, now);
        for attempt in 0..2 {
            let mut req = self.client.get(url.clone());
            match &self.auth {
                FeedAuth::None | FeedAuth::Query { .. } => {}
                FeedAuth::Header { name, token, .. } => req = req.header(name.as_str(), token),
                FeedAuth::Bearer { token, .. } => req = req.bearer_auth(token),
                FeedAuth::Login { .. } => {
                    let t = match &self.session {
                        Some(t) => t.clone(),
                        None => self.login()?,
                    };
                    req = req.bearer_auth(t);
                }
            }
            let resp = req.send().map_err(|e| FetchError::Get {
                url: shown.clone(),
                message: sources::http::chain(&e.without_url()),
            })?;
            let status = resp.status().as_u16();
            if status == 401 && attempt == 0 && matches!(self.auth, FeedAuth::Login { .. }) {
                // the token expired: log in again, once
                self.session = None;
                continue;
            }
            let text = resp.text().map_err(|e| FetchError::Get {
                url: shown.clone(),
                message: sources::http::chain(&e.without_url()),
            })?;
            if !(200..300).contains(&status) {
                return Err(FetchError::Status {
                    url: shown,
                    status,
                    detail: what_it_said(&text),
                });
            }
            return Ok(text);
        }
        Err(FetchError::Status {
            url: shown,
            status: 401,
            detail: "refused a fresh login's token".into(),
        })
    }

    fn login(&mut self) -> Result<String, FetchError> {
        let FeedAuth::Login {
            url,
            username,
            password,
            ..
        } = &self.auth
        else {
            return Err(FetchError::Login {
                url: String::new(),
                message: "no login configured".into(),
            });
        };
        let fail = |message: String| FetchError::Login {
            url: url.clone(),
            message,
        };
        let resp = self
            .client
            .get(url)
            .basic_auth(username, Some(password))
            .send()
            .map_err(|e| fail(sources::http::chain(&e.without_url())))?;
        let status = resp.status().as_u16();
        let text = resp
            .text()
            .map_err(|e| fail(sources::http::chain(&e.without_url())))?;
        if !(200..300).contains(&status) {
            return Err(fail(format!(
                "HTTP {status}{}",
                detail_text(&what_it_said(&text))
            )));
        }
        let token = serde_json::from_str::<serde_json::Value>(&text)
            .ok()
            .and_then(|v| v["token"].as_str().map(str::to_string))
            .ok_or_else(|| fail("the answer has no \"token\"".into()))?;
        self.session = Some(token.clone());
        Ok(token)
    }
}

/// `{start:FMT}` and `{end:FMT}` in `url`, for the window from today's start (UTC) to
/// two days on.
fn window(url: &str, now: chrono::DateTime<chrono::Utc>) -> String {
    let start = now
        .date_naive()
        .and_hms_opt(0, 0, 0)
        .map_or(now, |d| d.and_utc());
    let end = start + chrono::Duration::days(2);
    let mut out = String::new();
    let mut rest = url;
    while let Some(i) = rest.find('{') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        let Some(j) = after.find('}') else {
            out.push_str(&rest[i..]);
            rest = "";
            break;
        };
        let inner = &after[..j];
        let filled = match inner.split_once(':') {
            Some(("start", f)) => Some(start.format(f).to_string()),
            Some(("end", f)) => Some(end.format(f).to_string()),
            _ => None,
        };
        match filled {
            Some(v) => out.push_str(&v),
            None => {
                out.push('{');
                out.push_str(inner);
                out.push('}');
            }
        }
        rest = &after[j + 1..];
    }
    out.push_str(rest);
    out
}

/// What an error answer says, short: a JSON `message` / `error` / `detail`, an
/// ENTSO-E acknowledgement's `<text>`, or the start of the body.
fn what_it_said(body: &str) -> String {
    if let Ok(v) = serde_json::from_str::<serde_json::Value>(body) {
        for k in ["message", "error", "detail", "title"] {
            if let Some(s) = v[k].as_str() {
                return clip(s);
            }
        }
    }
    if let (Some(a), Some(b)) = (body.find("<text>"), body.find("</text>")) {
        if a + 6 <= b {
            return clip(body[a + 6..b].trim());
        }
    }
    clip(body.trim())
}

fn clip(s: &str) -> String {
    let one_line: String = s.split_whitespace().collect::<Vec<_>>().join(" ");
    match one_line.char_indices().nth(200) {
        Some((i, _)) => format!("{}…", &one_line[..i]),
        None => one_line,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    /// A local API: `answer(url, headers)` gives (status, body) for each GET.
    fn api(answer: impl Fn(&str, &[(String, String)]) -> (u16, String) + Send + 'static) -> String {
        let server = tiny_http::Server::http("127.0.0.1:0").expect("server");
        let base = format!("http://{}", server.server_addr().to_ip().expect("ip"));
        std::thread::spawn(move || {
            for req in server.incoming_requests() {
                let headers: Vec<(String, String)> = req
                    .headers()
                    .iter()
                    .map(|h| {
                        (
                            h.field.as_str().as_str().to_ascii_lowercase(),
                            h.value.to_string(),
                        )
                    })
                    .collect();
                let (status, body) = answer(req.url(), &headers);
                let _ =
                    req.respond(tiny_http::Response::from_string(body).with_status_code(status));
            }
        });
        base
    }

    fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
        headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    fn now() -> chrono::DateTime<chrono::Utc> {
        chrono::DateTime::parse_from_rfc3339("2026-12-03T10:20:00Z")
            .expect("time")
            .with_timezone(&chrono::Utc)
    }

    fn fetcher(url: &str, auth: FeedAuth) -> Fetcher {
        Fetcher::new(
            url,
            auth,
            &sources::tls::Tls::default(),
            Duration::from_secs(5),
        )
        .expect("fetcher")
    }

    const A44: &str = r#"<?xml version="1.0" encoding="UTF-8"?>
<Publication_MarketDocument xmlns="urn:iec62325.351:tc57wg16:451-3:publicationdocument:7:3">
  <TimeSeries><Period>
    <timeInterval><start>2026-12-02T23:00Z</start><end>2026-12-03T01:00Z</end></timeInterval>
    <resolution>PT60M</resolution>
    <Point><position>1</position><price.amount>91.50</price.amount></Point>
    <Point><position>2</position><price.amount>84.20</price.amount></Point>
  </Period></TimeSeries>
</Publication_MarketDocument>"#;

    #[test]
    fn an_entsoe_token_goes_in_the_query_and_never_into_an_error() {
        let base = api(|url, _| {
            if !url.contains("periodStart=202612030000&periodEnd=202612050000") {
                return (400, "<Acknowledgement_MarketDocument><Reason><text>Mandatory parameter periodStart missing</text></Reason></Acknowledgement_MarketDocument>".into());
            }
            if url.contains("securityToken=good-token") {
                (200, A44.into())
            } else {
                (
                    401,
                    "<html><body><h1>Unauthorized</h1></body></html>".into(),
                )
            }
        });
        let url = format!(
            "{base}/api?documentType=A44&in_Domain=10Y1001A1001A82H&periodStart={{start:%Y%m%d%H%M}}&periodEnd={{end:%Y%m%d%H%M}}"
        );
        let auth = |token: &str| FeedAuth::Query {
            param: "securityToken".into(),
            token_file: "entsoe.token".into(),
            token: token.into(),
        };
        let e = fetcher(&url, auth("bad-token"))
            .fetch(now())
            .expect_err("refused");
        let text = e.to_string();
        assert!(
            text.contains("HTTP 401") && text.contains("Unauthorized"),
            "{text}"
        );
        assert!(!text.contains("bad-token"), "the token leaked: {text}");
        let doc = fetcher(&url, auth("good-token"))
            .fetch(now())
            .expect("fetched");
        let format = control::feeds::FeedFormat {
            format: Some("entsoe".into()),
            ..Default::default()
        };
        let series = format.read(&url, &doc, "price_per_kwh").expect("A44");
        assert_eq!(series.points().len(), 2);
        assert!((series.points()[0].1 - 0.0915).abs() < 1e-9);
        // the window's placeholders are the API's mandatory parameters
        let e = fetcher(&format!("{base}/api?documentType=A44"), auth("good-token"))
            .fetch(now())
            .expect_err("no window");
        assert!(
            e.to_string()
                .contains("Mandatory parameter periodStart missing"),
            "{e}"
        );
    }

    #[test]
    fn an_electricity_maps_token_goes_in_its_header() {
        let base = api(|_, h| {
            match header(h, "auth-token") {
            Some("em-token") => (
                200,
                r#"{"zone":"DE","forecast":[{"carbonIntensity":412,"datetime":"2026-12-03T10:00:00.000Z"},{"carbonIntensity":398,"datetime":"2026-12-03T11:00:00.000Z"}],"updatedAt":"2026-12-03T09:54:12.000Z"}"#.into(),
            ),
            _ => (401, r#"{"status":"error","message":"Invalid authentication token"}"#.into()),
        }
        });
        let url = format!("{base}/v3/carbon-intensity/forecast?zone=DE");
        let auth = |token: &str| FeedAuth::Header {
            name: "auth-token".into(),
            token_file: "em.token".into(),
            token: token.into(),
        };
        let e = fetcher(&url, auth("stale"))
            .fetch(now())
            .expect_err("refused");
        assert!(
            e.to_string()
                .contains("HTTP 401: Invalid authentication token"),
            "{e}"
        );
        let doc = fetcher(&url, auth("em-token"))
            .fetch(now())
            .expect("fetched");
        let format = control::feeds::FeedFormat {
            format: Some("json".into()),
            json: Some(telemetry::feeds::JsonFormat::Objects {
                items: "/forecast".into(),
                time_key: "datetime".into(),
                value_key: "carbonIntensity".into(),
                unit: telemetry::feeds::Unit::GPerKwh,
            }),
            ..Default::default()
        };
        let series = format
            .read(&url, &doc, "carbon_g_per_kwh")
            .expect("forecast");
        assert_eq!(
            series.points().iter().map(|p| p.1).collect::<Vec<_>>(),
            vec![412.0, 398.0]
        );
    }

    #[test]
    fn a_watttime_login_gives_the_bearer_token_and_is_renewed_when_it_expires() {
        let logins = Arc::new(AtomicUsize::new(0));
        let uses = Arc::new(AtomicUsize::new(0));
        let (l, u) = (logins.clone(), uses.clone());
        let base = api(move |url, h| {
            if url.starts_with("/login") {
                // HTTP Basic of powerplane:pw
                return if header(h, "authorization") == Some("Basic cG93ZXJwbGFuZTpwdw==") {
                    let n = l.fetch_add(1, Ordering::SeqCst) + 1;
                    (200, format!(r#"{{"token":"t{n}"}}"#))
                } else {
                    (403, r#"{"error":"invalid credentials"}"#.into())
                };
            }
            // the first token expires after one use
            let current = format!("Bearer t{}", l.load(Ordering::SeqCst));
            let fresh = header(h, "authorization") == Some(current.as_str());
            if !fresh || (current == "Bearer t1" && u.fetch_add(1, Ordering::SeqCst) >= 1) {
                return (401, r#"{"error":"token expired"}"#.into());
            }
            (200, r#"{"data":[{"point_time":"2026-12-03T10:00:00+00:00","value":870.5}],"meta":{"signal_type":"co2_moer","units":"lbs_co2_per_mwh"}}"#.into())
        });
        let auth = |pw: &str| FeedAuth::Login {
            url: format!("{base}/login"),
            username: "powerplane".into(),
            password_file: "wt.password".into(),
            password: pw.into(),
        };
        let url = format!("{base}/v3/forecast?region=CAISO_NORTH&signal_type=co2_moer");
        let e = fetcher(&url, auth("wrong"))
            .fetch(now())
            .expect_err("refused");
        assert!(
            e.to_string().contains("login at") && e.to_string().contains("invalid credentials"),
            "{e}"
        );
        assert!(!e.to_string().contains("wrong"), "{e}");
        let mut f = fetcher(&url, auth("pw"));
        f.fetch(now()).expect("first fetch");
        // t1 expired: one 401, a new login, the fetch goes through
        let doc = f.fetch(now()).expect("second fetch");
        assert!(doc.contains("870.5"));
        assert_eq!(logins.load(Ordering::SeqCst), 2);
        f.fetch(now()).expect("third fetch, same token");
        assert_eq!(logins.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn the_window_fills_start_and_end_and_leaves_other_braces() {
        let now = chrono::DateTime::parse_from_rfc3339("2026-03-29T13:45:00Z")
            .expect("time")
            .with_timezone(&chrono::Utc);
        assert_eq!(
            window(
                "https://x/api?periodStart={start:%Y%m%d%H%M}&periodEnd={end:%Y%m%d%H%M}&k={other}",
                now
            ),
            "https://x/api?periodStart=202603290000&periodEnd=202603310000&k={other}"
        );
    }

    #[test]
    fn error_answers_are_read_for_what_they_say() {
        assert_eq!(
            what_it_said(r#"{"message":"Invalid auth-token"}"#),
            "Invalid auth-token"
        );
        let ack = "<Acknowledgement_MarketDocument><Reason><code>999</code><text>No matching data found for Data item Day-ahead Prices</text></Reason></Acknowledgement_MarketDocument>";
        assert_eq!(
            what_it_said(ack),
            "No matching data found for Data item Day-ahead Prices"
        );
        assert_eq!(what_it_said("  Unauthorized \n"), "Unauthorized");
        assert!(what_it_said(&"x".repeat(500)).chars().count() <= 201);
    }
}
