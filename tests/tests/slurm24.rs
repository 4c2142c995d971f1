//! The versioned slurmrestd layer (`integrations::slurm_api`) against a real Slurm
//! 24.11 (a Debian 13 chroot: `scripts/slurm up 24.11`; rest_auth/local on a unix
//! socket, rest_auth/jwt on TCP) and the same client against the real 22.05
//! (`scripts/slurm up`). A test that needs a server fails loudly when it is missing.

use std::io::Read;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use integrations::slurm_api::{ApiPin, ApiVersion, SlurmApiConfig, SlurmApiError, Update};
use powerplane_tests::slurm as s22;
use powerplane_tests::slurm24::{self as s24, build, local_config, Cancel};

fn held(reason: &str) -> bool {
    reason == "JobHeldUser" || reason == "JobHeldAdmin"
}

fn unix_now() -> i64 {
    chrono::Utc::now().timestamp()
}

/// A pending job (its begin time an hour away) of the REST user.
fn waiting_job() -> u64 {
    s24::sbatch(&[
        "-p",
        "batch",
        "--gres=gpu:1",
        "-t",
        "20",
        "--begin=now+3600",
        "--comment",
        "class=training est=600",
        "--job-name=pp24-wait",
        "--wrap",
        "sleep 300",
    ])
}

#[test]
fn the_newest_common_version_is_chosen_on_each_server_and_a_pin_is_honoured() {
    let c = build(&local_config());
    assert_eq!(c.version(), ApiVersion::V0042);
    assert_eq!(
        c.offered().expect("offered"),
        ["v0.0.40", "v0.0.41", "v0.0.42"]
    );

    let mut pinned = local_config();
    pinned.api_version = ApiPin::Exact(ApiVersion::V0040);
    assert_eq!(build(&pinned).version(), ApiVersion::V0040);

    pinned.api_version = ApiPin::Exact(ApiVersion::V0038);
    let e = pinned.build().err().expect("24.11 does not serve v0.0.38");
    let text = e.to_string();
    assert!(matches!(e, SlurmApiError::Unsupported { .. }), "{text}");
    assert!(
        text.contains("v0.0.40") && text.contains("v0.0.42") && text.contains("pinned to v0.0.38"),
        "{text}"
    );

    // the same client against 22.05
    let old = SlurmApiConfig::new(&format!("unix:{}", s22::socket()));
    let old = old.build().unwrap_or_else(|e| {
        panic!("this test needs the real Slurm 22.05 (run scripts/slurm up): {e}")
    });
    assert_eq!(old.version(), ApiVersion::V0038);
}

#[test]
fn over_the_unix_socket_jobs_are_listed_held_released_and_begun_later_in_each_version() {
    let a = waiting_job();
    let _cancel = Cancel(vec![a]);
    for v in [ApiVersion::V0042, ApiVersion::V0041, ApiVersion::V0040] {
        let mut config = local_config();
        config.api_version = ApiPin::Exact(v);
        let c = build(&config);
        let jobs = c.jobs().expect("jobs");
        let j = jobs
            .iter()
            .find(|j| j.job_id == a)
            .expect("the new job is listed");
        assert_eq!(
            (j.base_state(), j.gpus, j.held),
            ("PENDING", 1, false),
            "{v}"
        );
        assert_eq!(j.user, s24::rest_user(), "{v}");
        let mapped = integrations::slurm::JobMapping::default().map(
            &j.to_slurm_job(),
            false,
            telemetry::Timestamp::from_secs(unix_now()),
        );
        assert_eq!(
            (mapped.class.as_str(), mapped.est_duration_s),
            ("training", 600.0),
            "{v}"
        );

        c.update(a, Update::Hold).expect("hold");
        let (state, reason) = s24::squeue(a).expect("queued");
        assert!(
            state == "PENDING" && held(&reason),
            "{v}: squeue shows {state} {reason}"
        );
        assert!(c.job(a).expect("job").expect("known").held, "{v}");
        c.update(a, Update::Release).expect("release");
        let (_, reason) = s24::squeue(a).expect("queued");
        assert!(!held(&reason), "{v}: still held: {reason}");

        let begin = unix_now() + 7200;
        c.update(a, Update::BeginAt { unix_s: begin })
            .expect("begin time");
        let j = c.job(a).expect("job").expect("known");
        let eligible = j.eligible.expect("an eligible time").0 / 1000;
        assert!(
            (eligible - begin).abs() <= 2,
            "{v}: eligible {eligible}, asked {begin}"
        );
    }
    let c = build(&local_config());
    assert_eq!(c.job(999_999).expect("an unknown job is no error"), None);
}

#[test]
fn a_job_of_another_user_is_refused_with_slurms_own_reason() {
    let b = s24::sbatch_as_root(&[
        "--begin=now+3600",
        "--job-name=pp24-root",
        "--wrap",
        "sleep 1",
    ]);
    let _cancel = Cancel(vec![b]);
    let c = build(&local_config());
    let e = c
        .update(b, Update::Hold)
        .expect_err("not the REST user's job");
    assert!(
        matches!(&e, SlurmApiError::Api { numbers, .. } if numbers.contains(&2010)),
        "{e}"
    );
    assert!(e.to_string().contains("Invalid user id"), "{e}");
}

#[test]
fn a_running_job_is_requeued_through_scontrol_in_the_chroot() {
    let r = s24::sbatch(&[
        "-p",
        "urgent",
        "--gres=gpu:1",
        "--requeue",
        "-t",
        "10",
        "--job-name=pp24-run",
        "--wrap",
        "sleep 300",
    ]);
    let _cancel = Cancel(vec![r]);
    s24::wait_squeue(r, Duration::from_secs(20), |s, _| s == "RUNNING");
    let c = build(&local_config());
    c.update(r, Update::Requeue).expect("requeue");
    s24::wait_squeue(r, Duration::from_secs(20), |s, _| s == "PENDING");
    let j = c.job(r).expect("job").expect("known");
    assert_eq!((j.base_state(), j.restarts), ("PENDING", 1));
}

fn jwt_config(token_file: &std::path::Path) -> SlurmApiConfig {
    let mut c = SlurmApiConfig::new(&format!("http://{}", s24::tcp()));
    c.user = Some(s24::rest_user());
    c.token_file = Some(token_file.to_path_buf());
    c.scontrol = s24::scontrol_command();
    c
}

#[test]
fn over_tcp_with_jwt_calls_work_a_rotated_token_is_picked_up_and_a_wrong_one_is_explained() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("token");
    std::fs::write(&file, format!("SLURM_JWT={}\n", s24::token(600))).expect("write token");
    let c = build(&jwt_config(&file));
    assert_eq!(c.version(), ApiVersion::V0042);
    let a = waiting_job();
    let _cancel = Cancel(vec![a]);
    assert!(c.jobs().expect("jobs").iter().any(|j| j.job_id == a));
    c.update(a, Update::Hold).expect("hold");
    assert!(held(&s24::squeue(a).expect("queued").1));
    c.update(a, Update::Release).expect("release");

    // a wrong token: the clear error, counted
    std::fs::write(&file, "not-a-token\n").expect("write");
    let e = c.jobs().expect_err("a wrong token is refused");
    let text = e.to_string();
    assert!(matches!(e, SlurmApiError::Unauthorized { .. }), "{text}");
    assert!(
        text.contains("expired or is wrong")
            && text.contains("scontrol token username=")
            && text.contains(&file.display().to_string()),
        "{text}"
    );
    assert_eq!(c.counters.unauthorized_total.load(Ordering::Relaxed), 1);

    // an expired one: the same
    std::fs::write(&file, s24::token(1)).expect("write");
    std::thread::sleep(Duration::from_millis(2500));
    let e = c.jobs().expect_err("an expired token is refused");
    assert!(e.to_string().contains("expired or is wrong"), "{e}");

    // rotated: the same client reads the new file on its next call
    std::fs::write(&file, s24::token(600)).expect("write");
    assert!(c
        .jobs()
        .expect("jobs with the rotated token")
        .iter()
        .any(|j| j.job_id == a));
}

#[test]
fn with_slurmusers_token_another_users_job_is_held_and_released() {
    let b = s24::sbatch_as_root(&[
        "--begin=now+3600",
        "--job-name=pp24-root",
        "--wrap",
        "sleep 1",
    ]);
    let _cancel = Cancel(vec![b]);
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("token");
    std::fs::write(&file, s24::token_for("slurm", 600)).expect("write token");
    let mut config = jwt_config(&file);
    config.user = Some("slurm".into());
    let c = build(&config);
    c.update(b, Update::Hold)
        .expect("SlurmUser may hold root's job");
    assert_eq!(s24::squeue(b).expect("queued").1, "JobHeldAdmin");
    c.update(b, Update::Release).expect("release");
    assert!(!held(&s24::squeue(b).expect("queued").1));
}

#[test]
fn through_a_tls_proxy_with_a_ca_file_the_calls_work_and_a_wrong_ca_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (cert, key, _) = powerplane_tests::self_signed(dir.path());
    let proxy = powerplane_tests::TlsBmc::start(&cert, &key, &s24::tcp());
    let file = dir.path().join("token");
    std::fs::write(&file, s24::token(600)).expect("write token");
    let mut config = jwt_config(&file);
    config.endpoint = proxy.url.clone();
    config.ca_file = Some(cert.clone());
    let c = build(&config);
    assert_eq!(c.version(), ApiVersion::V0042);
    let a = waiting_job();
    let _cancel = Cancel(vec![a]);
    assert!(c
        .jobs()
        .expect("jobs over TLS")
        .iter()
        .any(|j| j.job_id == a));

    // a CA that did not sign the proxy's certificate
    let other = tempfile::tempdir().expect("tempdir");
    let (wrong, _, _) = powerplane_tests::self_signed(other.path());
    config.ca_file = Some(wrong);
    let e = config.build().err().expect("an unknown certificate");
    assert!(matches!(e, SlurmApiError::Io { .. }), "{e}");
    assert!(
        e.to_string().contains("tls") && e.to_string().contains(&proxy.url),
        "{e}"
    );
}

#[test]
fn without_a_token_the_jwt_listener_answers_401_and_the_error_says_what_to_do() {
    let mut c = SlurmApiConfig::new(&format!("http://{}", s24::tcp()));
    c.user = Some(s24::rest_user());
    let e = c.build().err().expect("no token");
    assert!(
        matches!(e, SlurmApiError::Unauthorized { status: 401, .. }),
        "{e}"
    );
    assert!(e.to_string().contains("use JWT"), "{e}");
}

#[test]
fn an_answer_over_the_cap_is_refused_and_counted() {
    let _keep = Cancel(vec![waiting_job()]);
    let mut config = local_config();
    config.max_answer_bytes = 1024;
    // the OpenAPI document is far over 1 KiB: the version comes from the pings
    let c = build(&config);
    assert_eq!(c.version(), ApiVersion::V0042);
    let e = c.jobs().expect_err("the job list is over 1 KiB");
    assert!(
        matches!(e, SlurmApiError::TooLarge { limit: 1024, .. }),
        "{e}"
    );
    assert!(e.to_string().contains("max_answer_bytes"), "{e}");
    assert!(c.counters.oversized_total.load(Ordering::Relaxed) >= 1);
}

#[test]
fn a_server_that_accepts_and_never_answers_is_given_up_at_the_deadline() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let hold = std::thread::spawn(move || {
        // accept, read, never answer
        if let Ok((mut s, _)) = listener.accept() {
            let mut buf = [0u8; 1024];
            let _ = s.read(&mut buf);
            std::thread::sleep(Duration::from_secs(3));
        }
    });
    let mut config = SlurmApiConfig::new(&format!("http://127.0.0.1:{port}"));
    config.timeout_s = 0.5;
    let started = Instant::now();
    let e = config.build().err().expect("no answer");
    assert!(matches!(e, SlurmApiError::Timeout { .. }), "{e}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    let _ = hold.join();
}

#[test]
fn a_missing_socket_names_it() {
    let e = SlurmApiConfig::new("unix:/nonexistent/slurmrestd.sock")
        .build()
        .err()
        .expect("no server");
    assert!(
        e.to_string().contains("/nonexistent/slurmrestd.sock"),
        "{e}"
    );
}

#[test]
fn on_22_05_the_same_client_holds_releases_and_sets_a_begin_time() {
    let old = SlurmApiConfig::new(&format!("unix:{}", s22::socket()));
    let c = old.build().unwrap_or_else(|e| {
        panic!("this test needs the real Slurm 22.05 (run scripts/slurm up): {e}")
    });
    assert_eq!(c.version(), ApiVersion::V0038);
    let a = s22::sbatch(&[
        "-p",
        "batch",
        "--gres=gpu:1",
        "-t",
        "20",
        "--begin=now+3600",
        "--job-name=pp24-old",
        "--wrap",
        "sleep 300",
    ]);
    let _cancel = s22::Cancel(vec![a]);
    let j = c
        .jobs()
        .expect("jobs")
        .into_iter()
        .find(|j| j.job_id == a)
        .expect("listed");
    assert_eq!((j.base_state(), j.gpus), ("PENDING", 1));
    c.update(a, Update::Hold).expect("hold");
    assert!(held(&s22::squeue(a).expect("queued").1));
    c.update(a, Update::Release).expect("release");
    assert!(!held(&s22::squeue(a).expect("queued").1));
    let begin = unix_now() + 7200;
    c.update(a, Update::BeginAt { unix_s: begin })
        .expect("begin time");
    let eligible = c
        .job(a)
        .expect("job")
        .expect("known")
        .eligible
        .expect("eligible")
        .0
        / 1000;
    assert!(
        (eligible - begin).abs() <= 2,
        "eligible {eligible}, asked {begin}"
    );
}
