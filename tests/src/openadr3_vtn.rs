//! A real OpenADR 3 VTN for tests: `openleadr-vtn` 0.2.8 from crates.io (OpenADR 3.1,
//! built by scripts/openadr3-vtn with its internal OAuth provider) on the PostgreSQL of
//! the machine, one fresh database per VTN, dropped with it. The business logic (the
//! utility's side) is played through the VTN's own API, with a client whose scopes are
//! a business logic's; the VEN's client is made through that API too.
//!
//! Blocking (its HTTP client is [`sources::http::blocking_client`]): call it from a
//! test's own thread, not from an async runtime's worker. Shared by the VEN's tests
//! (tests/tests/openadr3.rs) and serve's (orchestrator/tests/grid_vtn3_serve.rs, which
//! includes this file by path).

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

pub const BL_CLIENT: &str = "utility-bl";
pub const BL_SECRET: &str = "bl-secret-for-tests";
pub const VEN_CLIENT: &str = "site-a-ven";
pub const VEN_SECRET: &str = "ven secret & more";

/// The workspace (both crates that use this file sit one level below it).
fn root() -> PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace")
        .to_path_buf()
}

/// The VTN binary scripts/openadr3-vtn builds (or `OPENLEADR_VTN`).
pub fn vtn_bin() -> PathBuf {
    let p = std::env::var_os("OPENLEADR_VTN")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("target/openleadr-vtn/bin/openleadr-vtn"));
    assert!(
        p.is_file(),
        "these tests need the OpenADR 3 VTN openleadr-vtn at {} (scripts/openadr3-vtn \
         builds it; scripts/test runs that)",
        p.display()
    );
    p
}

/// psql against the machine's PostgreSQL (127.0.0.1:5432, user postgres).
pub fn psql(db: &str, sql: &str) {
    let out = Command::new("psql")
        .args(["-h", "127.0.0.1", "-U", "postgres", "-d", db])
        .args(["-v", "ON_ERROR_STOP=1", "-qc", sql])
        .output()
        .expect("psql (PostgreSQL's client) runs");
    assert!(
        out.status.success(),
        "psql -d {db} -c {sql:?} failed (PostgreSQL must run on 127.0.0.1:5432 and let \
         the user postgres in; scripts/openadr3-vtn starts it): {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// An argon2id hash of `secret`, as the VTN keeps its clients' secrets (argon2-cffi in
/// the `.venv` that scripts/test provisions).
pub fn argon2(secret: &str) -> String {
    let py = root().join(".venv/bin/python");
    let out = Command::new(&py)
        .args([
            "-c",
            "import sys, argon2; print(argon2.PasswordHasher(time_cost=2, memory_cost=1024, parallelism=1).hash(sys.argv[1]))",
            secret,
        ])
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", py.display()));
    assert!(
        out.status.success(),
        "argon2-cffi must be importable by {} (scripts/test installs it): {}",
        py.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .expect("utf-8")
        .trim()
        .to_string()
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("free port")
        .local_addr()
        .expect("addr")
        .port()
}

static DB_SEQ: AtomicU32 = AtomicU32::new(0);

/// A fresh database (dropped with the VTN that runs on it).
pub fn fresh_db() -> String {
    let db = format!(
        "pp_vtn_{}_{}",
        std::process::id(),
        DB_SEQ.fetch_add(1, Ordering::Relaxed)
    );
    psql("postgres", &format!("CREATE DATABASE {db}"));
    db
}

/// One openleadr-vtn process on its own database.
pub struct Vtn {
    pub port: u16,
    pub db: String,
    child: Child,
    http: reqwest::blocking::Client,
}

impl Vtn {
    /// On a fresh database and a free port, with the business logic's client made.
    pub fn start() -> Vtn {
        Vtn::start_on(free_port(), fresh_db())
    }

    /// On a fresh database and a free port, notifying over MQTT through the broker on
    /// `broker_port` (127.0.0.1; anonymous).
    pub fn start_with_mqtt(broker_port: u16) -> Vtn {
        let url = format!("mqtt://127.0.0.1:{broker_port}");
        Vtn::start_with(
            free_port(),
            fresh_db(),
            &[
                ("MQTT_URL", url.as_str()),
                ("MQTT_USERNAME", "vtn"),
                ("MQTT_PASSWORD", "vtn"),
            ],
        )
    }

    /// On `port` and `db` (a database it ran on before keeps its state).
    pub fn start_on(port: u16, db: String) -> Vtn {
        Vtn::start_with(port, db, &[])
    }

    fn start_with(port: u16, db: String, env: &[(&str, &str)]) -> Vtn {
        let http =
            sources::http::blocking_client(Duration::from_secs(10), &sources::tls::Tls::default())
                .expect("client");
        let child = Command::new(vtn_bin())
            .env("PORT", port.to_string())
            .env(
                "DATABASE_URL",
                format!("postgres://postgres@127.0.0.1:5432/{db}"),
            )
            .env("OAUTH_TYPE", "INTERNAL")
            // 32 bytes, base64: the key the VTN signs its tokens with
            .env(
                "OAUTH_BASE64_SECRET",
                "cG93ZXJwbGFuZS10ZXN0cy1vcGVuYWRyMy1obWFjLWtleQ==",
            )
            .env(
                "OAUTH_TOKEN_URL",
                format!("http://127.0.0.1:{port}/auth/token"),
            )
            .env("RUST_LOG", "warn")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("openleadr-vtn starts");
        let mut v = Vtn {
            port,
            db,
            child,
            http,
        };
        let t0 = Instant::now();
        loop {
            assert!(
                v.child.try_wait().ok().flatten().is_none(),
                "openleadr-vtn exited at start (port {port}, database {})",
                v.db
            );
            let health = v.http.get(format!("{}/health", v.url())).send();
            if health.is_ok_and(|r| r.status().is_success()) {
                break;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "openleadr-vtn did not answer /health on port {port} within 60 s"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        // its migrations ran: the business logic's client is put in as an operator would
        let hash = argon2(BL_SECRET);
        psql(
            &v.db,
            &format!(
                "INSERT INTO \"user\" (id, reference, description, scopes, created, modified) \
                 VALUES ('{BL_CLIENT}', 'bl', 'the utility', '{{\"read_all\",\"write_vens_bl\",\"write_programs\",\"write_events\",\"write_users\",\"write_reports_bl\"}}', now(), now()) \
                 ON CONFLICT DO NOTHING; \
                 INSERT INTO user_credentials (user_id, client_id, client_secret) \
                 VALUES ('{BL_CLIENT}', '{BL_CLIENT}', '{hash}') ON CONFLICT DO NOTHING"
            ),
        );
        v
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn bl_token(&self) -> String {
        let r = self
            .http
            .post(format!("{}/auth/token", self.url()))
            .basic_auth(BL_CLIENT, Some(BL_SECRET))
            .header("content-type", "application/x-www-form-urlencoded")
            .body("grant_type=client_credentials")
            .send()
            .expect("token");
        let v: Value = r.json().expect("token json");
        v["access_token"]
            .as_str()
            .unwrap_or_else(|| panic!("no access_token: {v}"))
            .to_string()
    }

    /// A call of the business logic (`GET`, `POST`, `PUT`, `DELETE`): status and body.
    pub fn bl(&self, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        let method = reqwest::Method::from_bytes(method.as_bytes()).expect("method");
        let mut rb = self
            .http
            .request(method, format!("{}{path}", self.url()))
            .bearer_auth(self.bl_token());
        if let Some(b) = body {
            rb = rb
                .header("content-type", "application/json")
                .body(b.to_string());
        }
        let r = rb.send().expect("the VTN answers");
        let status = r.status().as_u16();
        let text = r.text().expect("body");
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    /// [`Vtn::bl`], which must succeed.
    pub fn bl_ok(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let (status, v) = self.bl(method, path, body);
        assert!(
            (200..300).contains(&status),
            "{method} {path}: {status} {v}"
        );
        v
    }

    /// The VEN's client ([`VEN_CLIENT`], [`VEN_SECRET`]), made through the VTN's user
    /// API with a VEN's scopes.
    pub fn add_ven_client(&self) {
        let user = self.bl_ok(
            "POST",
            "/users",
            Some(
                json!({"reference": "site-a", "description": "powerplane at site A",
                        "scope": ["read_targets", "read_ven_objects", "write_reports_ven",
                                  "write_subscriptions_ven", "write_vens_ven"]}),
            ),
        );
        let id = user["id"].as_str().expect("user id").to_string();
        self.bl_ok(
            "POST",
            &format!("/users/{id}"),
            Some(json!({"client_id": VEN_CLIENT, "client_secret": VEN_SECRET})),
        );
    }

    /// A program; its id.
    pub fn program(&self, name: &str) -> String {
        let p = self.bl_ok(
            "POST",
            "/programs",
            Some(json!({"objectType": "PROGRAM", "programName": name})),
        );
        p["id"].as_str().expect("program id").to_string()
    }

    /// Deletes an event as a utility cancels it. openleadr-vtn refuses to delete an
    /// event that reports name (409): its reports go first (a VEN may report again
    /// meanwhile: tried up to 5 times).
    pub fn delete_event(&self, id: &str) {
        for _ in 0..5 {
            let reports = self.bl_ok("GET", &format!("/reports?eventID={id}"), None);
            for r in reports.as_array().into_iter().flatten() {
                let rid = r["id"].as_str().expect("report id");
                self.bl_ok("DELETE", &format!("/reports/{rid}"), None);
            }
            let (status, body) = self.bl("DELETE", &format!("/events/{id}"), None);
            match status {
                200..=299 => return,
                409 => continue,
                _ => panic!("DELETE /events/{id}: {status} {body}"),
            }
        }
        panic!("DELETE /events/{id}: refused 5 times");
    }

    /// Whether the VTN lists a VEN object of this name.
    pub fn knows_ven(&self, name: &str) -> bool {
        self.bl_ok("GET", "/vens", None)
            .as_array()
            .is_some_and(|a| a.iter().any(|v| v["venName"] == name))
    }

    pub fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([sig, &self.child.id().to_string()])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "kill {sig} the VTN");
    }

    pub fn kill(&mut self) {
        let _ = Command::new("kill")
            .args(["-CONT", &self.child.id().to_string()])
            .stderr(Stdio::null())
            .status();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Vtn {
    fn drop(&mut self) {
        self.kill();
        let _ = Command::new("psql")
            .args(["-h", "127.0.0.1", "-U", "postgres", "-d", "postgres", "-qc"])
            .arg(format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.db))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// An event of `program`: one interval per value of `kind` (in kW where it has units),
/// `minutes` long each, from `start` (RFC 3339); reports of the meter asked (`DEMAND`).
pub fn event_request(
    program: &str,
    start: &str,
    minutes: u32,
    kind: &str,
    values: &[f64],
) -> Value {
    let intervals: Vec<Value> = values
        .iter()
        .enumerate()
        .map(|(i, &v)| {
            // SIMPLE levels are integers
            let v = if kind == "SIMPLE" {
                json!(v as i64)
            } else {
                json!(v)
            };
            json!({"id": i, "payloads": [{"type": kind, "values": [v]}]})
        })
        .collect();
    json!({
        "objectType": "EVENT",
        "programID": program,
        "eventName": "peak",
        "payloadDescriptors": [{"objectType": "EVENT_PAYLOAD_DESCRIPTOR", "payloadType": kind, "units": "KW"}],
        "reportDescriptors": [{"payloadType": "DEMAND", "readingType": "DIRECT_READ", "units": "KW"}],
        "intervalPeriod": {"start": start, "duration": format!("PT{minutes}M")},
        "intervals": intervals,
    })
}
