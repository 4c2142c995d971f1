//! `powerplane serve` with `[schedulers.kubernetes]` against the fake API server over
//! HTTPS (kube-rs, from a kubeconfig; the pods watched): the
//! admission webhook and the scheduler extender answer on the HTTP API; a gated pod
//! whose deadline is near is let go at once, a deferrable one is kept gated while
//! electricity is expensive and its gate removed when the price falls.

mod common;

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{free_port, http, role, serve, VIEWER};
use serde_json::{json, Value};

fn pod(name: &str, deadline: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": { "name": name, "namespace": "ml", "labels": { "powerplane.io/class": "batch" },
                      "annotations": { "powerplane.io/deadline": deadline, "powerplane.io/est-duration-s": "600" },
                      "creationTimestamp": chrono::Utc::now().to_rfc3339() },
        "spec": { "containers": [{ "name": "c", "image": "x", "resources": { "limits": { "nvidia.com/gpu": "1" } } }],
                  "schedulingGates": [{ "name": "powerplane.io/hold" }] },
        "status": { "phase": "Pending" }
    })
}

/// A private `redis-server` for the replicas' store (never the shared one).
#[allow(dead_code)]
#[path = "../../tests/src/redis_server.rs"]
mod redis_server;

/// The fake Kubernetes API server of the test-support library, over HTTPS.
#[allow(dead_code)]
#[path = "../../tests/src/kube_api.rs"]
mod kube_api;

/// Watches the fake's pods from the test's side: when each lost powerplane's gate.
type Removed = Arc<Mutex<Vec<(String, chrono::DateTime<chrono::Utc>)>>>;
fn gate_watch(api: Arc<kube_api::FakeKubeApi>, names: &[&str]) -> Removed {
    let removed: Removed = Arc::default();
    let (r, names) = (
        removed.clone(),
        names.iter().map(|n| n.to_string()).collect::<Vec<_>>(),
    );
    std::thread::spawn(move || loop {
        for n in &names {
            let gated = api
                .pod("ml", n)
                .and_then(|p| p["spec"]["schedulingGates"].as_array().cloned())
                .is_some_and(|g| g.iter().any(|g| g["name"] == "powerplane.io/hold"));
            let mut r = r.lock().expect("lock");
            if !gated && !r.iter().any(|(m, _)| m == n) {
                r.push((n.clone(), chrono::Utc::now()));
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    });
    removed
}

#[test]
fn serve_gates_pods_answers_the_scheduler_and_removes_gates_when_cheap() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace");
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path();
    common::write_site_and_deferral_policy(d);
    let now = chrono::Utc::now();
    let cheap_at = common::write_price_step(d, 15);
    let far = (now + chrono::Duration::hours(6)).to_rfc3339();
    let near = (now + chrono::Duration::minutes(5)).to_rfc3339();
    let api = Arc::new(kube_api::FakeKubeApi::start(&d.join("kube")));
    api.put_pod(pod("train", &far));
    api.put_pod(pod("urgent", &near));
    let removed = gate_watch(api.clone(), &["train", "urgent"]);
    let kubeconfig = api.kubeconfig().display().to_string();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("port")
        .local_addr()
        .expect("addr")
        .port();
    std::fs::write(
        d.join("powerplane.toml"),
        format!(
            "[controller]\nsite = \"site.toml\"\npolicy = \"policy.toml\"\ntick_s = 0.5\n[store]\nkind = \"embedded\"\npath = \"s.redb\"\n[prices]\nfile = \"prices.csv\"\n[http]\nlisten = \"127.0.0.1:{port}\"\n[[http.tokens]]\nname = \"v\"\nrole = \"viewer\"\ntoken = \"{VIEWER}\"\n[schedulers.kubernetes]\nkubeconfig = \"{kubeconfig}\"\npoll_s = 0\n[schedulers.kubernetes.node_names]\ngpu-node-1 = \"a01-n01\"\n"
        ),
    )
    .expect("config");
    let _serve = serve(&d.join("powerplane.toml"), 60);
    let end = Instant::now() + Duration::from_secs(20);
    while http(port, "GET", "/api/v1/schedulers", Some(VIEWER), b"").0 != 200 {
        assert!(Instant::now() < end, "serve never answered");
        std::thread::sleep(Duration::from_millis(200));
    }

    // the admission webhook, as the API server calls it
    let review = std::fs::read_to_string(
        root.join("tests/fixtures/kubernetes/admission-review-pod-create.json"),
    )
    .expect("fixture");
    let (code, _, body) = http(
        port,
        "POST",
        "/api/v1/k8s/admission",
        None,
        review.as_bytes(),
    );
    assert_eq!(code, 200, "{body}");
    let answer: Value = serde_json::from_str(&body).expect("json");
    assert_eq!(
        answer["response"]["uid"],
        "705ab4f5-6393-11e8-b7cc-42010a800002"
    );
    assert_eq!(answer["response"]["patchType"], "JSONPatch");
    let (code, _, _) = http(port, "POST", "/api/v1/k8s/admission", None, b"{}");
    assert_eq!(code, 400);
    // the extender, as kube-scheduler calls it: nothing capped or hot here
    let args =
        json!({ "Pod": {}, "NodeNames": ["gpu-node-1", "a02-n01", "elsewhere"] }).to_string();
    let (code, _, body) = http(
        port,
        "POST",
        "/api/v1/k8s/prioritize",
        None,
        args.as_bytes(),
    );
    assert_eq!(code, 200, "{body}");
    assert_eq!(
        serde_json::from_str::<Value>(&body).expect("json"),
        json!([{ "Host": "gpu-node-1", "Score": 10 }, { "Host": "a02-n01", "Score": 10 }, { "Host": "elsewhere", "Score": 5 }])
    );
    let (_, _, body) = http(port, "POST", "/api/v1/k8s/filter", None, args.as_bytes());
    assert_eq!(
        serde_json::from_str::<Value>(&body).expect("json")["NodeNames"],
        json!(["gpu-node-1", "a02-n01", "elsewhere"])
    );

    // the near deadline is let go at once; the deferrable pod waits for the cheap hour
    let end = Instant::now() + Duration::from_secs(45);
    while !removed
        .lock()
        .expect("lock")
        .iter()
        .any(|(n, _)| n == "train")
    {
        assert!(Instant::now() < end, "the gate of train was never removed");
        std::thread::sleep(Duration::from_millis(200));
    }
    let removed = removed.lock().expect("lock").clone();
    let when = |name: &str| {
        removed
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, t)| *t)
            .expect("removed")
    };
    assert!(
        when("urgent") < now + chrono::Duration::seconds(10),
        "urgent waited: {removed:?}"
    );
    assert!(
        when("train") >= cheap_at,
        "train released before the price fell: {removed:?}"
    );
    assert_eq!(removed.len(), 2, "each gate removed once: {removed:?}");
    let patches = api
        .requests()
        .iter()
        .filter(|r| r.method == "PATCH" && r.path.starts_with("/api/v1/namespaces/ml/pods/"))
        .count();
    assert_eq!(patches, 2, "one patch per pod: {:?}", api.requests());
    let events = api.events();
    assert_eq!(events.len(), 2, "each release told on its pod: {events:?}");
    // the API shows the tick after the removal: give it a few ticks
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, _, body) = http(port, "GET", "/api/v1/schedulers", Some(VIEWER), b"");
        let st: Value = serde_json::from_str(&body).expect("json");
        if st["kubernetes"]["counters"]["gates_removed"] == 2 {
            break;
        }
        assert!(
            Instant::now() < end,
            "the API never counted both removals: {st}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// `kill -9` of a replica.
fn kill9(s: &common::Serve) {
    let ok = std::process::Command::new("kill")
        .args(["-9", &s.0.id().to_string()])
        .status()
        .expect("kill");
    assert!(ok.success());
}

#[test]
fn two_replicas_elect_their_leader_on_a_kubernetes_lease_and_both_answer_the_api_server() {
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path();
    common::write_site_and_deferral_policy(d);
    let now = chrono::Utc::now();
    common::write_price_step(d, 3600);
    let redis = redis_server::RedisServer::start();
    let api = Arc::new(kube_api::FakeKubeApi::start(&d.join("kube")));
    let prefix = format!("pptest-kha-{}", std::process::id());
    let ports = [free_port(), free_port()];
    let configs: Vec<std::path::PathBuf> = (0..2)
        .map(|i| {
            let r = d.join(format!("r{i}"));
            std::fs::create_dir_all(&r).expect("replica dir");
            let cfg = r.join("powerplane.toml");
            std::fs::write(
                &cfg,
                format!(
                    "[controller]\nsite = \"{site}\"\npolicy = \"{policy}\"\ntick_s = 0.5\npolicy_reload_s = 0\n\
                     [store]\nkind = \"redis\"\nurl = \"{url}\"\nprefix = \"{prefix}\"\njournal = \"journal.redb\"\ntimeout_s = 2\n\
                     [ha]\nenabled = true\nbackend = \"kubernetes\"\nnamespace = \"powerplane\"\nlease_name = \"powerplane-leader\"\nlease_s = 3\nrenew_s = 0.5\ninstance = \"r{i}\"\n\
                     [prices]\nfile = \"{prices}\"\n\
                     [http]\nlisten = \"127.0.0.1:{port}\"\nmetrics_public = true\n[[http.tokens]]\nname = \"v\"\nrole = \"viewer\"\ntoken = \"{VIEWER}\"\n\
                     [schedulers.kubernetes]\nkubeconfig = \"{kubeconfig}\"\npoll_s = 0\ntimeout_s = 2\n",
                    site = d.join("site.toml").display(),
                    policy = d.join("policy.toml").display(),
                    prices = d.join("prices.csv").display(),
                    url = redis.url(),
                    port = ports[i],
                    kubeconfig = api.kubeconfig().display(),
                ),
            )
            .expect("config");
            cfg
        })
        .collect();
    let mut replicas: Vec<Option<common::Serve>> =
        configs.iter().map(|c| Some(serve(c, 120))).collect();
    let logs = || {
        configs
            .iter()
            .map(|c| common::serve_log(c))
            .collect::<Vec<_>>()
            .join("\n----\n")
    };
    let leader = |above: u64, within: Duration| -> (usize, u64) {
        let end = Instant::now() + within;
        loop {
            for (i, p) in ports.iter().enumerate() {
                if let Some((true, e)) = role(*p) {
                    if e > above {
                        return (i, e);
                    }
                }
            }
            assert!(
                Instant::now() < end,
                "no leader above epoch {above}:\n{}",
                logs()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    let (first, e1) = leader(0, Duration::from_secs(30));
    let other = 1 - first;
    // the Lease names the leader and carries its epoch; the store's fence holds it too
    let lease = api
        .lease("powerplane", "powerplane-leader")
        .expect("the Lease");
    assert_eq!(lease["spec"]["holderIdentity"], format!("r{first}"));
    assert_eq!(
        lease["metadata"]["annotations"]["powerplane.io/epoch"],
        e1.to_string()
    );
    let fence = |redis: &redis_server::RedisServer| -> u64 {
        let mut c = redis::Client::open(redis.url())
            .expect("client")
            .get_connection()
            .expect("connection");
        redis::cmd("GET")
            .arg(format!("{prefix}:ha:epoch"))
            .query::<Option<u64>>(&mut c)
            .expect("get")
            .unwrap_or(0)
    };
    assert_eq!(
        fence(&redis),
        e1,
        "the store's fence holds the Lease's epoch"
    );
    // one leader at a time; the follower still answers the admission webhook
    assert_eq!(role(ports[other]).map(|r| r.0), Some(false));
    let review = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .expect("workspace")
            .join("tests/fixtures/kubernetes/admission-review-pod-create.json"),
    )
    .expect("fixture");
    for p in ports {
        let (code, _, body) = http(p, "POST", "/api/v1/k8s/admission", None, review.as_bytes());
        assert_eq!(code, 200, "replica on {p}: {body}");
        let answer: Value = serde_json::from_str(&body).expect("json");
        assert_eq!(answer["response"]["patchType"], "JSONPatch", "{answer}");
    }

    // the leader dies: the other takes the Lease once its term has run out
    let killed = Instant::now();
    kill9(replicas[first].as_ref().expect("leader"));
    replicas[first] = None;
    let (second, e2) = leader(e1, Duration::from_secs(20));
    let took = killed.elapsed();
    assert_eq!(second, other);
    assert_eq!(e2, e1 + 1);
    assert!(
        took >= Duration::from_secs(2),
        "taken over {took:?} after the kill: before the 3 s term could have run out"
    );
    assert_eq!(fence(&redis), e2, "the fence rose with the new term");
    let lease = api
        .lease("powerplane", "powerplane-leader")
        .expect("the Lease");
    assert_eq!(lease["spec"]["holderIdentity"], format!("r{second}"));
    assert_eq!(lease["spec"]["leaseTransitions"], e2);
    // the new leader drives the gates: a pod whose deadline is near is let go
    let near = (now + chrono::Duration::minutes(5)).to_rfc3339();
    let removed = gate_watch(api.clone(), &["urgent"]);
    api.put_pod(pod("urgent", &near));
    let end = Instant::now() + Duration::from_secs(20);
    while removed.lock().expect("lock").is_empty() {
        assert!(
            Instant::now() < end,
            "the new leader never released the urgent pod:\n{}",
            logs()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    eprintln!("took over in {:.1} s (lease_s = 3)", took.as_secs_f64());
}

/// The agent's fake kubelet (pod-resources over gRPC on a unix socket), from the
/// agent's own sources; its protocol code (`grpc`, `proto`) is the agent's.
#[allow(dead_code)]
#[path = "../agent/src/pods/fake.rs"]
mod fake_kubelet;
use agent::pods::{grpc, proto, LIST};

/// A running pod on the node the agent serves, with a GPU power limit annotation.
fn running_pod(name: &str, class: &str, limit: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": { "name": name, "namespace": "ml", "labels": { "powerplane.io/class": class },
                      "annotations": { "powerplane.io/gpu-power-limit": limit } },
        "spec": { "nodeName": "gpu-node-1",
                  "containers": [{ "name": "c", "image": "x", "resources": { "limits": { "nvidia.com/gpu": "2" } } }] },
        "status": { "phase": "Running" }
    })
}

#[test]
fn a_pods_gpu_power_limit_caps_the_gpus_the_kubelet_says_it_holds_and_the_pod_is_told() {
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path();
    common::write_site_and_deferral_policy(d);
    common::write_price_step(d, 3600);
    std::fs::write(d.join("site.key"), "5c".repeat(32)).expect("key");
    let private = std::os::unix::fs::PermissionsExt::from_mode(0o600);
    std::fs::set_permissions(d.join("site.key"), private).expect("chmod");
    let api = Arc::new(kube_api::FakeKubeApi::start(&d.join("kube")));
    api.put_pod(running_pod("capped", "inference", "200W"));
    api.put_pod(running_pod("bad", "inference", "fast"));
    // the node's kubelet: `capped` holds the agent's first two GPUs (A40s: 300 W by
    // default, 100 W at least)
    let kubelet = fake_kubelet::FakeKubelet::start(fake_kubelet::answer(vec![fake_kubelet::pod(
        "ml",
        "capped",
        &[(
            "c",
            &[("nvidia.com/gpu", &["GPU-sim-0000", "GPU-sim-0001"])],
        )],
    )]));
    let prefix = format!("pptest-klimit-{}", std::process::id());
    let mqtt = common::mqtt_port();
    std::fs::write(
        d.join("agent.toml"),
        format!(
            "node = \"a01-n01\"\nkey_file = \"site.key\"\ninterval_s = 0.5\ntopic_prefix = \"{prefix}/v1\"\n\
             [backend]\nkind = \"sim\"\ngpus = 8\n[mqtt]\nurl = \"mqtt://127.0.0.1:{mqtt}\"\n\
             [kubernetes]\npod_resources_socket = \"{socket}\"\nrefresh_s = 1\ntimeout_s = 0.5\n",
            socket = kubelet.socket.display(),
        ),
    )
    .expect("agent config");
    let agent_log = std::fs::File::create(d.join("agent.log")).expect("log");
    let _agent = common::Serve(
        std::process::Command::new(env!("CARGO_BIN_EXE_powerplane"))
            .args(["agent", "--config"])
            .arg(d.join("agent.toml"))
            .stdout(std::process::Stdio::null())
            .stderr(agent_log)
            .spawn()
            .expect("agent"),
    );
    let port = free_port();
    std::fs::write(
        d.join("powerplane.toml"),
        format!(
            "[controller]\nsite = \"site.toml\"\npolicy = \"policy.toml\"\ntick_s = 0.5\n\
             [store]\nkind = \"embedded\"\npath = \"s.redb\"\n[prices]\nfile = \"prices.csv\"\n\
             [http]\nlisten = \"127.0.0.1:{port}\"\n[[http.tokens]]\nname = \"v\"\nrole = \"viewer\"\ntoken = \"{VIEWER}\"\n\
             [agents]\nkey_file = \"site.key\"\nlease_s = 30\nrenew_s = 5\nretry_s = 1\ntopic_prefix = \"{prefix}/v1\"\n\
             [agents.mqtt]\nurl = \"mqtt://127.0.0.1:{mqtt}\"\nclient_id = \"{prefix}-serve\"\n\
             [schedulers.kubernetes]\nkubeconfig = \"{kubeconfig}\"\npoll_s = 0\n\
             [schedulers.kubernetes.node_names]\ngpu-node-1 = \"a01-n01\"\n",
            kubeconfig = api.kubeconfig().display(),
        ),
    )
    .expect("config");
    let cfg = d.join("powerplane.toml");
    let _serve = serve(&cfg, 120);
    let logs = || {
        format!(
            "{}\n---- agent ----\n{}",
            common::serve_log(&cfg),
            std::fs::read_to_string(d.join("agent.log")).unwrap_or_default()
        )
    };
    let gpu = |i: u32| -> Option<Value> {
        let (code, _, body) = http(port, "GET", "/api/v1/gpus", Some(VIEWER), b"");
        (code == 200).then_some(())?;
        let v: Value = serde_json::from_str(&body).ok()?;
        v["gpus"]
            .as_array()?
            .iter()
            .find(|g| g["id"] == format!("gpu/a01-n01:{i}"))
            .cloned()
    };
    // the cap is planned, commanded, applied by the agent and reported enforced
    let end = Instant::now() + Duration::from_secs(40);
    loop {
        let both = [0, 1].map(|i| {
            gpu(i).is_some_and(|g| {
                g["cap"]["watts"] == 200.0
                    && g["cap"]["rule"] == "limits.job"
                    && g["agent"]["enforced_w"] == 200.0
                    && g["agent"]["pods"] == json!(["k8s:ml/capped"])
            })
        });
        if both == [true, true] {
            break;
        }
        assert!(
            Instant::now() < end,
            "the pod's limit was never enforced: {:?} {:?}\n{}",
            gpu(0),
            gpu(1),
            logs()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // a GPU no pod holds is not capped
    assert!(gpu(2).is_some_and(|g| g["cap"].is_null()), "{:?}", gpu(2));
    // the pods are told: the limit in force, and the annotation that is not one
    let end = Instant::now() + Duration::from_secs(10);
    let told = |name: &str, reason: &str| {
        api.events()
            .into_iter()
            .find(|e| e["regarding"]["name"] == name && e["reason"] == reason)
    };
    while told("capped", "PowerLimitApplied").is_none()
        || told("bad", "PowerLimitRefused").is_none()
    {
        assert!(
            Instant::now() < end,
            "events: {:?}\n{}",
            api.events(),
            logs()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let applied = told("capped", "PowerLimitApplied").expect("event");
    assert_eq!(applied["type"], "Normal");
    assert!(
        applied["note"]
            .as_str()
            .is_some_and(|n| n.contains("200W") && n.contains("2 GPU")),
        "{applied}"
    );
    let refused = told("bad", "PowerLimitRefused").expect("event");
    assert_eq!(refused["type"], "Warning");
    assert!(
        refused["note"]
            .as_str()
            .is_some_and(|n| n.contains("\"fast\"")),
        "{refused}"
    );
    // told once, not every tick
    std::thread::sleep(Duration::from_secs(2));
    let n = api
        .events()
        .iter()
        .filter(|e| e["regarding"]["name"] == "capped")
        .count();
    assert_eq!(n, 1, "{:?}", api.events());
}
