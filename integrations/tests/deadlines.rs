//! Every outbound call of a scheduler adapter ends by its deadline, whatever the server
//! does: one that trickles its answer a byte at a time (a socket's read timeout alone
//! would wait for ever), and one that takes the request and never answers.

use std::io::Write;
use std::time::{Duration, Instant};

use integrations::kubernetes::{Access, Kube, KubeLease};
use integrations::lease::LeaseStore;
use integrations::slurm_api::SlurmApiConfig;

/// A server that answers one byte every 500 ms, for ever.
fn trickler() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = l.local_addr().expect("addr").port();
    std::thread::spawn(move || {
        for s in l.incoming().flatten() {
            std::thread::spawn(move || {
                let mut s = s;
                while s.write_all(b"H").is_ok() {
                    std::thread::sleep(Duration::from_millis(500));
                }
            });
        }
    });
    port
}

/// A server that reads requests and never answers.
fn silent() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = l.local_addr().expect("addr").port();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for s in l.incoming().flatten() {
            held.push(s);
        }
    });
    port
}

fn took(f: &dyn Fn() -> bool) -> Duration {
    let t = Instant::now();
    assert!(f(), "the call must fail");
    t.elapsed()
}

#[test]
fn a_server_that_trickles_its_answer_is_cut_off_at_the_deadline() {
    let port = trickler();
    let timeout = Duration::from_secs(1);
    let mut slurm = SlurmApiConfig::new(&format!("http://127.0.0.1:{port}"));
    slurm.timeout_s = timeout.as_secs_f64();
    // the build asks for the version: the first call
    let t = took(&|| slurm.build().is_err());
    assert!(t < Duration::from_secs(3), "slurmrestd call took {t:?}");
    let client =
        sources::http::blocking_client(timeout, &sources::tls::Tls::default()).expect("client");
    let t = took(&|| {
        client
            .post(format!("http://127.0.0.1:{port}/"))
            .body("{}")
            .send()
            .is_err()
    });
    assert!(t < Duration::from_secs(3), "webhook POST took {t:?}");
}

#[test]
fn a_kubernetes_api_server_that_never_answers_costs_one_deadline_per_call() {
    let port = silent();
    let timeout = Duration::from_secs(1);
    let access = Access {
        api: Some(format!("http://127.0.0.1:{port}")),
        ..Default::default()
    };
    let kube = Kube::new(&access, timeout).expect("client");
    let lease = std::sync::Mutex::new(KubeLease::new(kube, Some("powerplane"), "leader"));
    for _ in 0..2 {
        let t = took(&|| lease.lock().expect("lock").epoch().is_err());
        assert!(
            t >= timeout && t < Duration::from_secs(3),
            "Kubernetes call took {t:?}"
        );
    }
    let e = lease.lock().expect("lock").epoch().expect_err("no answer");
    assert!(e.to_string().contains("no answer within 1000 ms"), "{e}");
}
