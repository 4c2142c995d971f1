//! What the HTTP tests of the real `powerplane serve` share: a config on the demo
//! site with `[http]`, serve started (under `prlimit` when asked) and killed when
//! dropped, raw requests with any headers, and reading `/metrics`.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::{http, VIEWER};

pub const OPERATOR: &str = "operator-token-0123456789abcdef";

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("port")
        .local_addr()
        .expect("addr")
        .port()
}

/// A `powerplane serve` started by a test (maybe under `prlimit`), killed when dropped.
pub struct Serve {
    pub child: Child,
    log: PathBuf,
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Serve {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// VmRSS in KiB, from /proc.
    pub fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid()))
            .expect("serve is running");
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .expect("VmRSS")
    }

    pub fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([sig, &self.pid().to_string()])
            .status()
            .expect("kill");
        assert!(ok.success(), "kill {sig}");
    }
}

/// Writes the demo site, policy, prices and a config with `[http]` (plus `http_extra`
/// lines in it) and `extra` sections; returns the config's path.
pub fn config(d: &Path, port: u16, http_extra: &str, extra: &str) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace");
    for f in ["site.toml", "policy.toml", "prices.csv"] {
        std::fs::copy(root.join("examples/demo").join(f), d.join(f)).expect("copy");
    }
    let store = if extra.contains("[store]") {
        ""
    } else {
        "[store]\nkind = \"embedded\"\npath = \"state.redb\"\n"
    };
    let path = d.join("powerplane.toml");
    std::fs::write(
        &path,
        format!(
            "[controller]\nsite = \"site.toml\"\npolicy = \"policy.toml\"\ntick_s = 0.5\n{store}[prices]\nfile = \"prices.csv\"\n{extra}\n[http]\nlisten = \"127.0.0.1:{port}\"\n{http_extra}\n[[http.tokens]]\nname = \"grafana\"\nrole = \"viewer\"\ntoken = \"{VIEWER}\"\n[[http.tokens]]\nname = \"sre\"\nrole = \"operator\"\ntoken = \"{OPERATOR}\"\n"
        ),
    )
    .expect("config");
    path
}

/// Starts serve on `config` (with `prlimit --nofile=N:N` when given) and waits until
/// `/healthz` answers over plain HTTP (unless `tls`).
pub fn start(config: &Path, port: u16, nofile: Option<u32>, tls: bool) -> Serve {
    let log = config.with_extension("log");
    let mut cmd = match nofile {
        Some(n) => {
            let mut c = Command::new("prlimit");
            c.arg(format!("--nofile={n}:{n}"))
                .arg("--")
                .arg(env!("CARGO_BIN_EXE_powerplane"));
            c
        }
        None => Command::new(env!("CARGO_BIN_EXE_powerplane")),
    };
    let child = cmd
        .args(["serve", "--run-for-s", "300", "--config"])
        .arg(config)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log"))
        .spawn()
        .expect("serve (and prlimit, from util-linux)");
    let s = Serve { child, log };
    if !tls {
        let end = Instant::now() + Duration::from_secs(20);
        while http(port, "GET", "/healthz", None, b"").0 != 200 {
            assert!(
                Instant::now() < end,
                "serve never answered /healthz:\n{}",
                s.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    s
}

pub fn admission_review() -> Vec<u8> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace");
    std::fs::read(root.join("tests/fixtures/kubernetes/admission-review-pod-create.json"))
        .expect("fixture")
}

/// `[schedulers.kubernetes]` against an API server nobody runs (the admission
/// webhook does not need it).
pub fn kubernetes() -> String {
    format!(
        "[schedulers.kubernetes]\napi = \"http://127.0.0.1:{}\"\npoll_s = 60\ntimeout_s = 1\n",
        free_port()
    )
}

pub fn metric(port: u16, name: &str) -> f64 {
    let (_, _, text) = http(port, "GET", "/metrics", None, b"");
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("{name} not on /metrics"))
}

/// One HTTP/1.1 request with the given headers: (status, head, body).
pub fn request(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> (u16, String, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let extra: String = headers
        .iter()
        .map(|(k, v)| format!("{k}: {v}\r\n"))
        .collect();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: x\r\n{extra}Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .expect("write");
    s.write_all(body).expect("body");
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    split_answer(&out)
}

pub fn split_answer(out: &[u8]) -> (u16, String, String) {
    let text = String::from_utf8_lossy(out).to_string();
    let (h, b) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let code = h
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (code, h.to_string(), b.to_string())
}

pub fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

pub fn json(body: &str) -> serde_json::Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"))
}
