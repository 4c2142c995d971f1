//! Kubernetes: golden tests of the admission webhook and the scheduler extender against
//! AdmissionReview and ExtenderArgs JSON (tests/fixtures/kubernetes), and the gate
//! keeper through kube-rs against the fake API server over HTTPS (its watch, relists,
//! stalls, token rotation and CA).

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use integrations::kubernetes::{
    filter, prioritize, Access, Kube, KubeApi, KubePods, KubeSync, NodeCondition, PodMapping,
};
use policies::Hold;
use powerplane_tests::kube_api::FakeKubeApi;
use serde_json::{json, Value};
use telemetry::{JobState, Timestamp};

fn fixture(name: &str) -> Value {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/kubernetes")
        .join(name);
    serde_json::from_str(&std::fs::read_to_string(&p).expect("fixture")).expect("json")
}

fn unbase64(s: &str) -> Vec<u8> {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD
        .decode(s)
        .expect("base64 with padding")
}

/// The answer with its base64 patch decoded, to compare with a fixture.
fn decoded(mut answer: Value) -> Value {
    if let Some(p) = answer["response"]["patch"].as_str() {
        let patch: Value = serde_json::from_slice(&unbase64(p)).expect("patch is base64 JSON");
        answer["response"]["patch"] = patch;
    }
    answer
}

#[test]
fn the_admission_webhook_gates_deferrable_pods_and_only_those() {
    let m = PodMapping::default();
    let review = fixture("admission-review-pod-create.json");
    let answer = m.admit(&review).expect("answer");
    assert_eq!(
        decoded(answer),
        fixture("admission-review-pod-create.response.json")
    );
    // a class that is not deferrable: allowed, untouched (its own gate stays)
    let review = fixture("admission-review-inference-pod.json");
    let answer = m.admit(&review).expect("answer");
    assert_eq!(
        answer,
        fixture("admission-review-inference-pod.response.json")
    );
    // a deferrable pod that already has another gate: ours is appended
    let mut review = fixture("admission-review-inference-pod.json");
    review["request"]["object"]["metadata"]["annotations"] =
        json!({ "powerplane.io/deferrable": "true" });
    let answer = decoded(m.admit(&review).expect("answer"));
    assert_eq!(
        answer["response"]["patch"],
        json!([{ "op": "add", "path": "/spec/schedulingGates/-", "value": { "name": "powerplane.io/hold" } }])
    );
    // a pod deferrable for its annotation alone, without the class label: gated, and
    // labelled so that the watch (on the class label) follows it
    let mut bare = fixture("admission-review-pod-create.json");
    bare["request"]["object"]["metadata"]["labels"] = json!({ "app": "x" });
    bare["request"]["object"]["metadata"]["annotations"] =
        json!({ "powerplane.io/deferrable": "true" });
    let answer = decoded(m.admit(&bare).expect("answer"));
    assert_eq!(
        answer["response"]["patch"][1],
        json!({ "op": "add", "path": "/metadata/labels/powerplane.io~1class", "value": "default" })
    );
    bare["request"]["object"]["metadata"]
        .as_object_mut()
        .expect("metadata")
        .remove("labels");
    let answer = decoded(m.admit(&bare).expect("answer"));
    assert_eq!(
        answer["response"]["patch"][1],
        json!({ "op": "add", "path": "/metadata/labels", "value": { "powerplane.io/class": "default" } })
    );
    // an update is never patched (gates can only be set at creation)
    let mut review = fixture("admission-review-pod-create.json");
    review["request"]["operation"] = json!("UPDATE");
    assert!(m.admit(&review).expect("answer")["response"]
        .get("patch")
        .is_none());
    // a request without a uid is an error, not an answer
    assert!(m.admit(&json!({ "request": {} })).is_err());
    // the pod maps to a job with its class, deadline, duration and GPUs
    let job = m.job(&review["request"]["object"], Timestamp::from_secs(0));
    assert_eq!(job.id, "k8s:vision/resnet-train-0");
    assert_eq!(
        (job.class.as_str(), job.gpus, job.est_duration_s),
        ("training", 2, 7200.0)
    );
    assert_eq!(
        job.deadline,
        Some(Timestamp::parse_rfc3339("2030-01-01T06:00:00Z").expect("t"))
    );
    assert!(job.deferrable);
}

fn conditions() -> BTreeMap<String, NodeCondition> {
    BTreeMap::from([
        (
            "node-a01-1".to_string(),
            NodeCondition {
                capped: 0.5,
                hot: false,
            },
        ),
        (
            "node-a02-1".to_string(),
            NodeCondition {
                capped: 0.0,
                hot: false,
            },
        ),
        (
            "node-b01-1".to_string(),
            NodeCondition {
                capped: 0.0,
                hot: true,
            },
        ),
    ])
}

#[test]
fn the_extender_steers_pods_away_from_hot_and_capped_nodes() {
    let args = fixture("extender-args-nodenames.json");
    assert_eq!(
        filter(&args, &conditions()),
        fixture("extender-filter-nodenames.response.json")
    );
    assert_eq!(
        prioritize(&args, &conditions()),
        fixture("extender-prioritize-nodenames.response.json")
    );
    // full Node objects in, full Node objects out
    let args = fixture("extender-args-nodes.json");
    let out = filter(&args, &conditions());
    let kept: Vec<&str> = out["Nodes"]["items"]
        .as_array()
        .expect("items")
        .iter()
        .filter_map(|n| n["metadata"]["name"].as_str())
        .collect();
    assert_eq!(kept, vec!["node-a01-1"]);
    assert_eq!(out["Nodes"]["items"][0], args["Nodes"]["items"][0]);
    assert!(out["FailedNodes"]["node-b01-1"].is_string());
    // when every candidate is hot, none is filtered: the pod must still run somewhere
    let all_hot = json!({ "Pod": args["Pod"], "NodeNames": ["node-b01-1"] });
    assert_eq!(
        filter(&all_hot, &conditions())["NodeNames"],
        json!(["node-b01-1"])
    );
    // malformed arguments get an error in the answer
    assert!(filter(&json!({ "Pod": {} }), &conditions())["Error"]
        .as_str()
        .is_some_and(|e| !e.is_empty()));
}

fn pod(name: &str, class: &str, gates: &[&str]) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": { "name": name, "namespace": "vision", "labels": { "powerplane.io/class": class } },
        "spec": { "containers": [{ "name": "c", "image": "x" }],
                  "schedulingGates": gates.iter().map(|g| json!({ "name": g })).collect::<Vec<_>>() },
        "status": { "phase": "Pending" }
    })
}

/// The client as `[schedulers.kubernetes] kubeconfig = …` makes it.
fn kube_of(api: &FakeKubeApi) -> Kube {
    let access = Access {
        kubeconfig: Some(api.kubeconfig().to_path_buf()),
        ..Default::default()
    };
    Kube::new(&access, Duration::from_secs(5)).expect("client")
}

/// Polls until `ok` holds of the jobs (the watch delivers a change in a moment).
fn poll_until<A: KubeApi>(
    sync: &mut KubeSync<A>,
    now: Timestamp,
    what: &str,
    ok: impl Fn(&[telemetry::Job]) -> bool,
) -> Vec<telemetry::Job> {
    let end = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(jobs) = sync.poll(now) {
            if ok(&jobs) {
                return jobs;
            }
        }
        assert!(Instant::now() < end, "{what}: never seen");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn gates_are_removed_through_the_api_when_the_plan_lets_a_pod_run() {
    let dir = tempfile::tempdir().expect("tmp");
    let api = FakeKubeApi::start(dir.path());
    api.put_pod(pod(
        "held",
        "training",
        &["example.com/quota", "powerplane.io/hold"],
    ));
    api.put_pod(pod("kept", "training", &["powerplane.io/hold"]));
    api.put_pod(pod("others", "training", &["example.com/quota"]));
    // a pod without the class label is not watched
    let mut stray = pod("stray", "x", &["powerplane.io/hold"]);
    stray["metadata"]["labels"] = json!({});
    api.put_pod(stray);
    let pods = KubePods::start(kube_of(&api), "powerplane.io/class", None, 290);
    let mut sync = KubeSync::new(pods, PodMapping::default());
    let now = Timestamp::from_secs(1_900_000_000);
    let jobs = poll_until(&mut sync, now, "the first list", |j| j.len() == 3);
    let mut states: Vec<(&str, JobState)> = jobs.iter().map(|j| (j.id.as_str(), j.state)).collect();
    states.sort();
    assert_eq!(
        states,
        vec![
            ("k8s:vision/held", JobState::Held),
            ("k8s:vision/kept", JobState::Held),
            ("k8s:vision/others", JobState::Pending),
        ],
        "pods with powerplane's gate are held; another gate is not powerplane's"
    );
    assert_eq!(sync.gated(), vec!["k8s:vision/held", "k8s:vision/kept"]);
    // the plan keeps holding `kept`; `held` is released
    let desired = BTreeMap::from([(
        "k8s:vision/kept".to_string(),
        Hold {
            rule: "price.defer".into(),
            since: now,
            lease_until: now.plus_secs(600.0),
            reason: "r".into(),
        },
    )]);
    assert_eq!(
        sync.apply(&desired, now),
        vec!["k8s:vision/held".to_string()]
    );
    // one JSON patch under powerplane's field manager, testing the gate's name first
    let patches: Vec<_> = api
        .requests()
        .into_iter()
        .filter(|r| r.method == "PATCH")
        .collect();
    assert_eq!(patches.len(), 1, "{patches:?}");
    assert_eq!(patches[0].path, "/api/v1/namespaces/vision/pods/held");
    assert!(
        patches[0].query.contains("fieldManager=powerplane"),
        "{:?}",
        patches[0]
    );
    let held = api.pod("vision", "held").expect("pod");
    assert_eq!(
        held["spec"]["schedulingGates"],
        json!([{ "name": "example.com/quota" }]),
        "the other gate stays"
    );
    assert_eq!(
        held["metadata"]["managedFields"][0]["manager"], "powerplane",
        "{held}"
    );
    // the pod is told, as an Event
    let events = api.events();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0]["regarding"]["name"], "held");
    assert_eq!(events[0]["reason"], "Released");
    assert_eq!(events[0]["reportingController"], "powerplane.io/controller");
    // at once, before the watch shows it: no second removal
    assert!(sync.apply(&desired, now).is_empty());
    assert_eq!(sync.counters.errors, 0);
    // the lease of `kept` passes without renewal: its gate goes too
    sync.poll(now).expect("poll");
    assert_eq!(
        sync.apply(&desired, now.plus_secs(601.0)),
        vec!["k8s:vision/kept".to_string()]
    );
    assert_eq!(sync.counters.gates_removed, 2);
    poll_until(&mut sync, now, "no gate left", |jobs| {
        jobs.len() == 3 && jobs.iter().all(|j| j.state == JobState::Pending)
    });
    assert!(sync.gated().is_empty());
    // a pod that goes away is reported finished, once
    api.delete_pod("vision", "held");
    let jobs = poll_until(&mut sync, now, "the deleted pod", |jobs| {
        jobs.iter().any(|j| j.id == "k8s:vision/held")
            && jobs.len() == 3
            && jobs
                .iter()
                .find(|j| j.id == "k8s:vision/held")
                .is_some_and(|j| j.state == JobState::Finished)
    });
    assert_eq!(jobs.len(), 3);
    assert!(sync
        .poll(now)
        .expect("poll")
        .iter()
        .all(|j| j.id != "k8s:vision/held"));
    let w = sync.api.watch();
    assert_eq!((w.lists, w.recorded, w.record_errors), (1, 2, 0), "{w:?}");
}

#[test]
fn a_stalled_watch_never_delays_a_poll_and_an_expired_one_is_listed_again() {
    let dir = tempfile::tempdir().expect("tmp");
    let api = FakeKubeApi::start(dir.path());
    api.put_pod(pod("a", "batch", &["powerplane.io/hold"]));
    // the server ends each watch after 2 s; kube drops a silent one 5 s after that
    let pods = KubePods::start(kube_of(&api), "powerplane.io/class", None, 2);
    let mut sync = KubeSync::new(pods, PodMapping::default());
    let now = Timestamp::from_secs(1_900_000_000);
    poll_until(&mut sync, now, "the first list", |j| j.len() == 1);
    assert_eq!(api.list_requests(), 1);

    // the watch stalls: polls answer at once from memory, the whole time
    api.stall_watches(true);
    std::thread::sleep(Duration::from_millis(2500));
    api.put_pod(pod("b", "batch", &["powerplane.io/hold"]));
    let mut slowest = Duration::ZERO;
    let stalled_for = Instant::now();
    while stalled_for.elapsed() < Duration::from_secs(3) {
        let t = Instant::now();
        let jobs = sync
            .poll(now)
            .expect("a poll answers while the watch stalls");
        slowest = slowest.max(t.elapsed());
        assert_eq!(jobs.len(), 1, "nothing new comes through a stalled watch");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        slowest < Duration::from_millis(50),
        "a poll took {slowest:?} while the watch stalled"
    );
    // the stall ends; the silent watch is dropped after its idle timeout and resumed
    api.stall_watches(false);
    poll_until(&mut sync, now, "the pod made during the stall", |j| {
        j.len() == 2
    });
    assert_eq!(
        api.list_requests(),
        1,
        "resumed at its version, not listed again"
    );

    // the API server's history is compacted: the watch's version has expired (410)
    api.expire_watches();
    api.delete_pod("vision", "a");
    api.put_pod(pod("c", "batch", &["powerplane.io/hold"]));
    let jobs = poll_until(&mut sync, now, "the relist", |j| {
        j.iter().any(|j| j.id == "k8s:vision/c")
    });
    assert!(api.list_requests() >= 2, "listed again after 410");
    let live: Vec<&str> = jobs
        .iter()
        .filter(|j| !j.state.is_done())
        .map(|j| j.id.as_str())
        .collect();
    assert_eq!(live.len(), 2, "{jobs:?}");
    assert!(
        jobs.iter()
            .any(|j| j.id == "k8s:vision/a" && j.state == JobState::Finished),
        "the pod deleted while the watch was expired is reported finished: {jobs:?}"
    );
    let w = sync.api.watch();
    assert!(w.lists >= 2 && w.listed, "{w:?}");
}

#[test]
fn the_client_takes_the_in_cluster_configuration_and_a_rotated_token() {
    let dir = tempfile::tempdir().expect("tmp");
    let api = FakeKubeApi::start(dir.path());
    api.put_pod(pod("a", "batch", &["powerplane.io/hold"]));
    // as in a pod: the service host and port in the environment, the account mounted
    // (this is the only test of this binary that reads these variables)
    std::env::set_var("KUBERNETES_SERVICE_HOST", "127.0.0.1");
    std::env::set_var("KUBERNETES_SERVICE_PORT", api.port().to_string());
    let access = Access {
        service_account_dir: Some(api.service_account_dir().to_path_buf()),
        ..Default::default()
    };
    let kube = Kube::new(&access, Duration::from_secs(5)).expect("in-cluster client");
    assert_eq!(kube.namespace, api.namespace());
    let pods = KubePods::start(kube, "powerplane.io/class", None, 290);
    let mut sync = KubeSync::new(pods, PodMapping::default());
    let now = Timestamp::from_secs(1_900_000_000);
    poll_until(&mut sync, now, "the first list", |j| j.len() == 1);

    // the kubelet rotates the token and the old one stops being accepted: the client
    // reads the file again (kube keeps a token a minute at most) and goes on
    let rotated = Instant::now();
    api.set_tokens(&["rotated-token-2"]);
    api.expire_watches();
    api.put_pod(pod("b", "batch", &["powerplane.io/hold"]));
    let end = Instant::now() + Duration::from_secs(90);
    loop {
        if sync.poll(now).is_ok_and(|j| j.len() == 2) {
            break;
        }
        assert!(
            Instant::now() < end,
            "the rotated token was never read: {:?}",
            sync.api.watch()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let w = sync.api.watch();
    assert!(w.errors >= 1, "the old token was refused meanwhile: {w:?}");
    assert!(
        api.requests().iter().any(|r| !r.authorized),
        "a request with the old token was refused"
    );
    eprintln!(
        "rotated token in use after {:.1} s",
        rotated.elapsed().as_secs_f64()
    );
}

#[test]
fn the_api_server_is_spoken_to_over_https_with_its_ca_only() {
    let dir = tempfile::tempdir().expect("tmp");
    let api = FakeKubeApi::start(dir.path());
    api.put_pod(pod("a", "batch", &["powerplane.io/hold"]));
    // another CA: the handshake fails, nothing is listed
    let other = tempfile::tempdir().expect("tmp");
    let (foreign, _, _) = powerplane_tests::self_signed(other.path());
    let token = dir.path().join("token");
    std::fs::write(&token, api.tokens()[0].as_str()).expect("token");
    let wrong = Access {
        api: Some(api.url()),
        ca_file: Some(foreign),
        token_file: Some(token.clone()),
        ..Default::default()
    };
    let pods = KubePods::start(
        Kube::new(&wrong, Duration::from_secs(2)).expect("client"),
        "powerplane.io/class",
        None,
        290,
    );
    let mut sync = KubeSync::new(pods, PodMapping::default());
    std::thread::sleep(Duration::from_secs(2));
    let e = sync
        .poll(Timestamp::from_secs(0))
        .expect_err("an API server the CA does not vouch for is not believed");
    assert!(e.to_string().contains("not listed yet"), "{e}");
    assert!(sync.api.watch().errors >= 1);
    // its own CA: listed
    let right = Access {
        ca_file: Some(api.ca_file().to_path_buf()),
        ..wrong
    };
    let pods = KubePods::start(
        Kube::new(&right, Duration::from_secs(2)).expect("client"),
        "powerplane.io/class",
        None,
        290,
    );
    let mut sync = KubeSync::new(pods, PodMapping::default());
    poll_until(&mut sync, Timestamp::from_secs(0), "the list", |j| {
        j.len() == 1
    });
    // plain http only to a loopback address
    let far = Access {
        api: Some("http://192.0.2.10:8080".into()),
        ..Default::default()
    };
    let e = Kube::new(&far, Duration::from_secs(1)).expect_err("plain http off the host");
    assert!(e.to_string().contains("loopback"), "{e}");
}

#[test]
fn a_kubeconfig_with_a_client_certificate_and_a_named_context_is_taken() {
    let dir = tempfile::tempdir().expect("tmp");
    let api = FakeKubeApi::start(dir.path());
    api.put_pod(pod("a", "batch", &["powerplane.io/hold"]));
    // the kubeconfig's user is a client certificate of the cluster's CA, no token
    let by_cert = Access {
        kubeconfig: Some(api.kubeconfig_certificate()),
        context: Some("by-certificate".into()),
        ..Default::default()
    };
    let kube = Kube::new(&by_cert, Duration::from_secs(5)).expect("client");
    let pods = KubePods::start(kube, "powerplane.io/class", None, 290);
    let mut sync = KubeSync::new(pods, PodMapping::default());
    poll_until(&mut sync, Timestamp::from_secs(0), "the list", |j| {
        j.len() == 1
    });
    assert!(
        api.requests().iter().all(|r| r.authorized),
        "every request was let in by the certificate"
    );
    // a context the file does not have is a clear error at once
    let missing = Access {
        context: Some("nope".into()),
        ..by_cert
    };
    let e = Kube::new(&missing, Duration::from_secs(5)).expect_err("no such context");
    assert!(e.to_string().contains("kubeconfig"), "{e}");
}

#[test]
fn a_list_that_never_answers_is_dropped_and_made_anew() {
    let dir = tempfile::tempdir().expect("tmp");
    let mut api = FakeKubeApi::start(dir.path());
    api.put_pod(pod("a", "batch", &["powerplane.io/hold"]));
    // the API server takes the first list and never answers it (a connection gone
    // dead without closing); it answers again later, on new connections
    api.hang(true);
    let access = Access {
        kubeconfig: Some(api.kubeconfig().to_path_buf()),
        ..Default::default()
    };
    // as `[schedulers.kubernetes] watch_timeout_s = 1` makes it: silent for 11 s, dropped
    let kube =
        Kube::watching(&access, Duration::from_secs(2), Duration::from_secs(11)).expect("client");
    let pods = KubePods::start(kube, "powerplane.io/class", None, 1);
    let mut sync = KubeSync::new(pods, PodMapping::default());
    let started = Instant::now();
    while api.list_requests() == 0 {
        assert!(started.elapsed() < Duration::from_secs(5), "no list sent");
        std::thread::sleep(Duration::from_millis(50));
    }
    api.hang(false);
    assert!(
        sync.poll(Timestamp::from_secs(0)).is_err(),
        "not listed yet"
    );
    let jobs = poll_until(
        &mut sync,
        Timestamp::from_secs(0),
        "the list made anew",
        |j| j.len() == 1,
    );
    assert_eq!(jobs.len(), 1);
    let took = started.elapsed();
    assert!(
        took >= Duration::from_secs(10) && took < Duration::from_secs(40),
        "listed after {took:?}"
    );
    assert!(api.list_requests() >= 2, "listed again");
    assert!(sync.api.watch().errors >= 1, "{:?}", sync.api.watch());
    api.stop();
}
