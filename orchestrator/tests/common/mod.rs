//! Helpers shared by the CLI tests.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::time::Duration;

/// One HTTP/1.1 request: (status, headers, body).
pub fn http(
    port: u16,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: &[u8],
) -> (u16, String, String) {
    // status 0: nothing listens (yet)
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return (0, String::new(), String::new());
    };
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{auth}Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).expect("write");
    let _ = s.write_all(body);
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out).to_string();
    let (h, b) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = h
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (status, h.to_string(), b.to_string())
}

/// Fails the test unless `promtool check metrics` accepts the text.
pub fn promtool_check(metrics: &str) {
    let mut promtool = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("this test needs promtool (Debian package prometheus)");
    promtool
        .stdin
        .take()
        .expect("stdin")
        .write_all(metrics.as_bytes())
        .expect("pipe");
    let out = promtool.wait_with_output().expect("promtool");
    assert!(
        out.status.success(),
        "promtool check metrics: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
