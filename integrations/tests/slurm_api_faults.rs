//! The slurmrestd client against a fake slurmrestd that misbehaves on purpose: a
//! server offering only versions powerplane does not speak, a job list that is not
//! JSON or not a job list, an error page without JSON.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::atomic::Ordering;

use integrations::slurm_api::{ApiVersion, SlurmApiConfig, SlurmApiError};

/// A fake slurmrestd on 127.0.0.1: answers each request with `answer(path)`
/// (status, body), one connection per request.
fn fake(answer: fn(&str) -> (u16, String)) -> String {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let at = format!("http://{}", l.local_addr().expect("addr"));
    std::thread::spawn(move || {
        for mut s in l.incoming().flatten() {
            let mut req = Vec::new();
            let mut buf = [0u8; 4096];
            while !req.windows(4).any(|w| w == b"\r\n\r\n") {
                match s.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => req.extend_from_slice(&buf[..n]),
                }
            }
            let text = String::from_utf8_lossy(&req);
            let path = text.split_whitespace().nth(1).unwrap_or("/").to_string();
            let (status, body) = answer(&path);
            let _ = write!(
                s,
                "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    at
}

const OPENAPI_42: &str = r#"{"paths": {"/slurm/v0.0.42/jobs/": {}, "/slurm/v0.0.42/ping/": {}}}"#;

#[test]
fn a_server_offering_only_newer_versions_is_refused_naming_both_lists() {
    let at = fake(|path| match path {
        "/openapi/v3" => (
            200,
            r#"{"paths": {"/slurm/v0.0.43/jobs/": {}, "/slurm/v0.0.44/jobs/": {}}}"#.into(),
        ),
        _ => (404, "Unable find requested URL.".into()),
    });
    let e = SlurmApiConfig::new(&at).build().err().expect("unsupported");
    let text = e.to_string();
    assert!(matches!(e, SlurmApiError::Unsupported { .. }), "{text}");
    assert!(
        text.contains("v0.0.43") && text.contains("v0.0.44"),
        "{text}"
    );
    assert!(
        text.contains("v0.0.42") && text.contains("v0.0.38"),
        "{text}"
    );
}

#[test]
fn without_an_openapi_document_the_version_is_found_by_pinging_newest_first() {
    let at = fake(|path| match path {
        "/slurm/v0.0.41/ping" | "/slurm/v0.0.40/ping" => {
            (200, r#"{"pings": [], "errors": []}"#.into())
        }
        _ => (404, "Unable find requested URL.".into()),
    });
    let c = SlurmApiConfig::new(&at).build().expect("a version by ping");
    assert_eq!(c.version(), ApiVersion::V0041);
}

#[test]
fn a_job_list_that_is_not_json_is_a_decode_error_and_counted() {
    let at = fake(|path| match path {
        "/openapi/v3" => (200, OPENAPI_42.into()),
        _ => (200, "<html>proxy error</html>".into()),
    });
    let c = SlurmApiConfig::new(&at).build().expect("client");
    let e = c.jobs().expect_err("not JSON");
    assert!(matches!(e, SlurmApiError::Decode { .. }), "{e}");
    assert!(e.to_string().contains("/slurm/v0.0.42/jobs"), "{e}");
    assert_eq!(c.counters.malformed_total.load(Ordering::Relaxed), 1);
}

#[test]
fn a_job_without_a_numeric_id_or_state_is_a_decode_error_and_counted() {
    let at = fake(|path| match path {
        "/openapi/v3" => (200, OPENAPI_42.into()),
        "/slurm/v0.0.42/jobs" => (
            200,
            r#"{"jobs": [{"job_id": "seven", "job_state": ["PENDING"]}], "errors": []}"#.into(),
        ),
        _ => (200, r#"{"jobs": [{"job_id": 7}], "errors": []}"#.into()),
    });
    let c = SlurmApiConfig::new(&at).build().expect("client");
    let e = c.jobs().expect_err("a string id");
    assert!(e.to_string().contains("numeric job_id"), "{e}");
    let e = c.job(7).expect_err("no state");
    assert!(e.to_string().contains("job 7: no job_state"), "{e}");
    assert_eq!(c.counters.malformed_total.load(Ordering::Relaxed), 2);
}

#[test]
fn an_error_page_without_json_keeps_its_status_and_text() {
    let at = fake(|path| match path {
        "/openapi/v3" => (200, OPENAPI_42.into()),
        _ => (502, "bad gateway".into()),
    });
    let c = SlurmApiConfig::new(&at).build().expect("client");
    let e = c.jobs().expect_err("502");
    assert!(
        matches!(&e, SlurmApiError::Http { status: 502, body, .. } if body == "bad gateway"),
        "{e}"
    );
}
