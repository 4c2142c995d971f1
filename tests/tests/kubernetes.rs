//! Kubernetes: golden tests of the admission webhook and the scheduler extender against
//! AdmissionReview and ExtenderArgs JSON (tests/fixtures/kubernetes), and the gate
//! keeper against a fake API server speaking HTTP.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use integrations::kubernetes::{filter, prioritize, KubeHttp, KubeSync, NodeCondition, PodMapping};
use policies::Hold;
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

/// The fake API server's pods, and the patches it took (URL, patch).
type Pods = Arc<Mutex<Vec<Value>>>;
type Patches = Arc<Mutex<Vec<(String, Value)>>>;

/// A fake API server: lists pending pods, applies JSON patches to their gates.
fn fake_api(pods: Vec<Value>) -> (String, Pods, Patches) {
    let server = tiny_http::Server::http("127.0.0.1:0").expect("fake api");
    let base = format!(
        "http://127.0.0.1:{}",
        server.server_addr().to_ip().expect("ip").port()
    );
    let state = Arc::new(Mutex::new(pods));
    let patches = Arc::new(Mutex::new(Vec::new()));
    let (st, pa) = (state.clone(), patches.clone());
    std::thread::spawn(move || {
        for mut req in server.incoming_requests() {
            let url = req.url().to_string();
            let mut body = String::new();
            let _ = std::io::Read::read_to_string(req.as_reader(), &mut body);
            let resp = match req.method().as_str() {
                "GET" if url == "/api/v1/pods?fieldSelector=status.phase%3DPending" => {
                    let items: Vec<Value> = st
                        .lock()
                        .expect("lock")
                        .iter()
                        .filter(|p| p["status"]["phase"] == "Pending")
                        .cloned()
                        .collect();
                    json!({ "apiVersion": "v1", "kind": "PodList", "items": items }).to_string()
                }
                "GET" if url == "/api/v1/pods?labelSelector=powerplane.io%2Fclass" => {
                    let items: Vec<Value> = st
                        .lock()
                        .expect("lock")
                        .iter()
                        .filter(|p| p["metadata"]["labels"]["powerplane.io/class"].is_string())
                        .cloned()
                        .collect();
                    json!({ "apiVersion": "v1", "kind": "PodList", "items": items }).to_string()
                }
                "PATCH" => {
                    let ctype = req
                        .headers()
                        .iter()
                        .find(|h| h.field.equiv("Content-Type"))
                        .map(|h| h.value.as_str().to_string());
                    assert_eq!(ctype.as_deref(), Some("application/json-patch+json"));
                    let patch: Value = serde_json::from_str(&body).expect("patch");
                    pa.lock().expect("lock").push((url.clone(), patch.clone()));
                    // apply: test the gate's name, then remove it
                    let name = url.rsplit('/').next().unwrap_or("").to_string();
                    let mut pods = st.lock().expect("lock");
                    let pod = pods
                        .iter_mut()
                        .find(|p| p["metadata"]["name"] == name.as_str())
                        .expect("pod");
                    let i: usize = patch[1]["path"]
                        .as_str()
                        .and_then(|p| p.rsplit('/').next())
                        .and_then(|i| i.parse().ok())
                        .expect("index");
                    let gates = pod["spec"]["schedulingGates"]
                        .as_array_mut()
                        .expect("gates");
                    assert_eq!(
                        gates[i]["name"], patch[0]["value"],
                        "the test op guards the removal"
                    );
                    gates.remove(i);
                    pod.to_string()
                }
                _ => {
                    let _ =
                        req.respond(tiny_http::Response::from_string("{}").with_status_code(404));
                    continue;
                }
            };
            let _ = req.respond(tiny_http::Response::from_string(resp));
        }
    });
    (base, state, patches)
}

fn pod(name: &str, class: &str, gates: &[&str]) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": { "name": name, "namespace": "vision", "labels": { "powerplane.io/class": class },
                      "creationTimestamp": "2030-01-01T00:00:00Z" },
        "spec": { "containers": [{ "name": "c", "image": "x" }],
                  "schedulingGates": gates.iter().map(|g| json!({ "name": g })).collect::<Vec<_>>() },
        "status": { "phase": "Pending" }
    })
}

#[test]
fn gates_are_removed_through_the_api_when_the_plan_lets_a_pod_run() {
    let (base, pods, patches) = fake_api(vec![
        pod(
            "held",
            "training",
            &["example.com/quota", "powerplane.io/hold"],
        ),
        pod("kept", "training", &["powerplane.io/hold"]),
        pod("others", "training", &["example.com/quota"]),
    ]);
    let api = KubeHttp {
        base,
        token: None,
        timeout: Duration::from_secs(5),
    };
    let mut sync = KubeSync::new(api, PodMapping::default());
    let now = Timestamp::from_secs(1_900_000_000);
    let jobs = sync.poll(now).expect("poll");
    let states: Vec<(&str, JobState)> = jobs.iter().map(|j| (j.id.as_str(), j.state)).collect();
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
    let p = patches.lock().expect("lock").clone();
    assert_eq!(p.len(), 1);
    assert_eq!(p[0].0, "/api/v1/namespaces/vision/pods/held");
    assert_eq!(
        p[0].1,
        json!([
            { "op": "test", "path": "/spec/schedulingGates/1/name", "value": "powerplane.io/hold" },
            { "op": "remove", "path": "/spec/schedulingGates/1" }
        ])
    );
    let gates = pods.lock().expect("lock")[0]["spec"]["schedulingGates"].clone();
    assert_eq!(
        gates,
        json!([{ "name": "example.com/quota" }]),
        "the other gate stays"
    );
    // the lease of `kept` passes without renewal: its gate goes too
    sync.poll(now).expect("poll");
    assert_eq!(
        sync.apply(&desired, now.plus_secs(601.0)),
        vec!["k8s:vision/kept".to_string()]
    );
    assert_eq!(sync.counters.gates_removed, 2);
    let jobs = sync.poll(now).expect("poll");
    assert!(
        jobs.iter().all(|j| j.state == JobState::Pending),
        "{jobs:?}"
    );
    assert!(sync.gated().is_empty());
    // a pod that goes away is reported finished, once
    pods.lock()
        .expect("lock")
        .retain(|p| p["metadata"]["name"] != "held");
    let jobs = sync.poll(now).expect("poll");
    let gone = jobs
        .iter()
        .find(|j| j.id == "k8s:vision/held")
        .expect("reported");
    assert_eq!(gone.state, JobState::Finished);
    assert!(sync
        .poll(now)
        .expect("poll")
        .iter()
        .all(|j| j.id != "k8s:vision/held"));
}
