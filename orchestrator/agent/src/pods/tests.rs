use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use prost::Message;
use telemetry::agent_proto::{Key, NodeReport};
use telemetry::{GpuModel, Timestamp};

use super::fake::{answer, pod, FakeKubelet, Mode};
use super::grpc::{unary, CallError};
use super::proto::{ListPodResourcesRequest, ListPodResourcesResponse};
use super::*;
use crate::core::{Core, Rules};
use crate::SimGpus;

fn config(socket: &std::path::Path, refresh_s: f64, timeout_s: f64) -> KubernetesConfig {
    KubernetesConfig {
        pod_resources_socket: socket.to_path_buf(),
        resource_names: vec!["nvidia.com/gpu".into(), "nvidia.com/mig-1g.10gb".into()],
        refresh_s,
        timeout_s,
    }
}

fn list(
    socket: &std::path::Path,
    deadline: Duration,
) -> Result<ListPodResourcesResponse, CallError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(unary(socket, LIST, &ListPodResourcesRequest {}, deadline))
}

/// Waits (at most `within`) until `ok` holds.
fn wait_until(within: Duration, what: &str, mut ok: impl FnMut() -> bool) {
    let start = Instant::now();
    while !ok() {
        assert!(start.elapsed() < within, "{what}: not within {within:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Four simulated A40s, `GPU-sim-0000` to `GPU-sim-0003`.
fn core() -> Core {
    let model = GpuModel::builtin("A40").expect("a40");
    let key = Key::from_text(&"5a".repeat(32)).expect("key");
    Core::start(
        Rules::new("n1", key),
        Box::new(SimGpus::new(4, model, 7)),
        None,
        Timestamp::from_secs(1_790_000_000),
    )
}

fn tick(c: &mut Core) -> NodeReport {
    c.tick(Timestamp::from_secs(1_790_000_001))
}

fn pods_of(r: &NodeReport) -> Vec<Vec<String>> {
    r.gpus.iter().map(|g| g.pods.clone()).collect()
}

fn s(v: &[&str]) -> Vec<String> {
    v.iter().map(|x| x.to_string()).collect()
}

/// The protobuf of the kubelet's answer, by hand, field by field as `api.proto`
/// numbers them, with the fields the agent does not declare (cpu_ids, memory,
/// topology, a field from the future) in between.
#[test]
fn answers_decode_by_the_kubelets_field_numbers_skipping_the_rest() {
    fn ld(field: u8, bytes: &[u8]) -> Vec<u8> {
        let mut out = vec![field << 3 | 2, bytes.len() as u8];
        out.extend_from_slice(bytes);
        out
    }
    let topology = ld(1, &[1 << 3, 1]); // TopologyInfo { nodes: [NUMANode { ID: 1 }] }
    let devices = [
        ld(1, b"nvidia.com/gpu"),
        ld(2, b"GPU-a"),
        ld(2, b"GPU-b"),
        ld(3, &topology),
    ]
    .concat();
    let container = [
        ld(1, b"main"),
        ld(2, &devices),
        vec![3 << 3, 4],          // cpu_ids = 3 (varint)
        ld(4, &ld(1, b"memory")), // memory = 4
    ]
    .concat();
    let pod = [
        ld(1, b"train-0"),
        ld(2, b"ml"),
        ld(3, &container),
        vec![9 << 3, 1], // a field no kubelet sends yet
    ]
    .concat();
    let answer = ld(1, &pod);
    let a = ListPodResourcesResponse::decode(answer.as_slice()).expect("decodes");
    assert_eq!(
        a,
        ListPodResourcesResponse {
            pod_resources: vec![fake::pod(
                "ml",
                "train-0",
                &[("main", &[("nvidia.com/gpu", &["GPU-a", "GPU-b"])])]
            )],
        }
    );
}

#[test]
fn the_client_sends_a_well_formed_call_and_reads_the_answer() {
    let a = answer(vec![pod(
        "ml",
        "train-0",
        &[("main", &[("nvidia.com/gpu", &["GPU-sim-0000"])])],
    )]);
    let k = FakeKubelet::start(a.clone());
    let got = list(&k.socket, Duration::from_secs(2)).expect("an answer");
    let Mode::Answer(want) = a else {
        unreachable!()
    };
    assert_eq!(got, want);
    assert_eq!(
        k.well_formed(),
        1,
        "path, content-type, te and the framed request"
    );
}

#[test]
fn every_failure_is_an_error_that_names_it() {
    let k = FakeKubelet::start(Mode::Status(14, "kubelet%20is%20restarting"));
    let d = Duration::from_secs(2);
    match list(&k.socket, d) {
        Err(e @ CallError::Status { code: 14, .. }) => assert_eq!(
            e.to_string(),
            "gRPC status 14 (UNAVAILABLE): kubelet is restarting"
        ),
        other => panic!("{other:?}"),
    }
    k.set(Mode::TrailersOnly(7));
    assert!(matches!(
        list(&k.socket, d),
        Err(CallError::Status { code: 7, .. })
    ));
    k.set(Mode::Garbage);
    assert!(matches!(list(&k.socket, d), Err(CallError::Malformed(_))));
    k.set(Mode::NotProtobuf);
    assert!(matches!(list(&k.socket, d), Err(CallError::Malformed(_))));
    k.set(Mode::NotHttp2);
    assert!(matches!(list(&k.socket, d), Err(CallError::Http(_))));
    // absent
    let dir = tempfile::tempdir().expect("tmp");
    assert!(matches!(
        list(&dir.path().join("kubelet.sock"), d),
        Err(CallError::Missing(_))
    ));
    // a socket nobody listens on any more: refused
    let stale = dir.path().join("stale.sock");
    drop(std::os::unix::net::UnixListener::bind(&stale).expect("bind"));
    assert!(matches!(list(&stale, d), Err(CallError::Connect(_))));
    // hung: the deadline ends the call, and no later than it says
    k.set(Mode::Hang);
    let start = Instant::now();
    let short = Duration::from_millis(300);
    assert!(matches!(list(&k.socket, short), Err(CallError::Timeout(_))));
    let took = start.elapsed();
    assert!(
        took >= short && took < short + Duration::from_millis(500),
        "{took:?}"
    );
}

#[test]
fn only_the_gpu_resources_are_mapped_to_their_pods() {
    let Mode::Answer(a) = answer(vec![
        pod(
            "ml",
            "train-0",
            &[
                ("main", &[("nvidia.com/gpu", &["GPU-a", "GPU-b"])]),
                ("side", &[("nvidia.com/gpu", &["GPU-b"])]),
            ],
        ),
        pod("web", "front", &[("nginx", &[])]),
        pod(
            "net",
            "router",
            &[("r", &[("example.com/nic", &["GPU-c"])])],
        ),
        pod(
            "ml",
            "small",
            &[("m", &[("nvidia.com/mig-1g.10gb", &["MIG-GPU-c/1/0"])])],
        ),
    ]) else {
        unreachable!()
    };
    let m = Mapping::from_answer(
        &a,
        &["nvidia.com/gpu".into(), "nvidia.com/mig-1g.10gb".into()],
    );
    let want: Vec<(&str, Vec<&str>)> = vec![
        ("GPU-a", vec!["ml/train-0"]),
        ("GPU-b", vec!["ml/train-0"]),
        ("MIG-GPU-c/1/0", vec!["ml/small"]),
    ];
    let got: Vec<(&str, Vec<&str>)> = m
        .devices
        .iter()
        .map(|(d, p)| (d.as_str(), p.iter().map(String::as_str).collect()))
        .collect();
    assert_eq!(got, want);
}

#[test]
fn device_ids_find_their_gpu() {
    let uuids: BTreeSet<&str> = ["GPU-8d5e0000-1111-2222-3333-444455556666", "GPU-b"]
        .into_iter()
        .collect();
    let of = |id: &str| gpu_of_device(id, &uuids);
    assert_eq!(
        of("GPU-8d5e0000-1111-2222-3333-444455556666"),
        Some("GPU-8d5e0000-1111-2222-3333-444455556666")
    );
    // a time-sliced replica
    assert_eq!(of("GPU-b::3"), Some("GPU-b"));
    assert_eq!(of("GPU-b::x"), None);
    // a MIG device that names its parent
    assert_eq!(
        of("MIG-GPU-8d5e0000-1111-2222-3333-444455556666/1/0"),
        Some("GPU-8d5e0000-1111-2222-3333-444455556666")
    );
    // a MIG device by its own UUID, and a GPU this node does not have
    assert_eq!(of("MIG-4f1e2d3c-0000-1111-2222-333344445555"), None);
    assert_eq!(of("GPU-elsewhere"), None);
    assert_eq!(of(""), None);
}

#[test]
fn reports_name_the_pods_that_hold_each_gpu() {
    let k = FakeKubelet::start(answer(vec![
        // one pod, two GPUs
        pod(
            "ml",
            "train-0",
            &[(
                "main",
                &[("nvidia.com/gpu", &["GPU-sim-0000", "GPU-sim-0001"])],
            )],
        ),
        // two pods sharing a GPU (time-slicing names replicas)
        pod(
            "ml",
            "infer-a",
            &[("a", &[("nvidia.com/gpu", &["GPU-sim-0002"])])],
        ),
        pod(
            "ml",
            "infer-b",
            &[("b", &[("nvidia.com/gpu", &["GPU-sim-0002::1"])])],
        ),
        // a pod holding no GPU
        pod("web", "front", &[("nginx", &[])]),
        // a resource that is no GPU, whatever its ids look like
        pod(
            "net",
            "router",
            &[("r", &[("example.com/fpga", &["GPU-sim-0003"])])],
        ),
        // a MIG device naming its parent GPU
        pod(
            "ml",
            "small",
            &[(
                "m",
                &[("nvidia.com/mig-1g.10gb", &["MIG-GPU-sim-0003/1/0"])],
            )],
        ),
        // ids no GPU of this node has: a GPU elsewhere, a MIG device by its own UUID
        pod(
            "ml",
            "ghost",
            &[(
                "g",
                &[(
                    "nvidia.com/gpu",
                    &["GPU-00000000-dead-beef-0000-000000000000"],
                )],
            )],
        ),
        pod(
            "ml",
            "mig-new",
            &[(
                "m",
                &[(
                    "nvidia.com/mig-1g.10gb",
                    &["MIG-4f1e2d3c-0000-1111-2222-333344445555"],
                )],
            )],
        ),
    ]));
    let pods = PodResources::start(&config(&k.socket, 10.0, 2.0)).expect("start");
    wait_until(Duration::from_secs(5), "the first answer", || {
        pods.answers() >= 1
    });
    let mut c = core().with_pods(pods);
    let r = tick(&mut c);
    assert_eq!(
        pods_of(&r),
        vec![
            s(&["ml/train-0"]),
            s(&["ml/train-0"]),
            s(&["ml/infer-a", "ml/infer-b"]),
            s(&["ml/small"]),
        ]
    );
    // the ids no GPU has are counted once per answer, not once per read
    tick(&mut c);
    let h = c.health("online", Timestamp::from_secs(1_790_000_002), None);
    assert_eq!(h.counters.get("pod_resources_unmatched_devices"), Some(&2));
    assert_eq!(h.counters.get("pod_resources_errors"), Some(&0));
    assert_eq!(h.counters.get("pod_resources_answers"), Some(&1));
    // on the wire: `pods` where a pod holds the GPU; an old controller's reader (the
    // same type without the member) still reads the report
    let json = serde_json::to_value(&r).expect("json");
    assert_eq!(json["gpus"][0]["pods"], serde_json::json!(["ml/train-0"]));
    let back: NodeReport = serde_json::from_value(json).expect("reads back");
    assert_eq!(back, r);
}

#[test]
fn without_kubernetes_the_report_is_as_before() {
    let mut c = core();
    let r = tick(&mut c);
    let json = serde_json::to_value(&r).expect("json");
    for g in json["gpus"].as_array().expect("gpus") {
        assert!(g.get("pods").is_none(), "{g}");
    }
    let h = c.health("online", Timestamp::from_secs(1_790_000_002), None);
    assert!(!h.counters.contains_key("pod_resources_errors"));
    // an old agent's report (no `pods`) reads as no pods
    let back: NodeReport = serde_json::from_value(json).expect("reads");
    assert!(back.gpus.iter().all(|g| g.pods.is_empty()));
}

/// Reads every 20 ms for `for_`; the longest read.
fn slowest_read(c: &mut Core, for_: Duration) -> Duration {
    let start = Instant::now();
    let mut worst = Duration::ZERO;
    while start.elapsed() < for_ {
        let t = Instant::now();
        tick(c);
        worst = worst.max(t.elapsed());
        std::thread::sleep(Duration::from_millis(20));
    }
    worst
}

#[test]
fn a_hung_kubelet_never_delays_a_read() {
    let mut plain = core();
    let usual = slowest_read(&mut plain, Duration::from_millis(500));
    let k = FakeKubelet::start(Mode::Hang);
    // every call hangs for its whole 1 s deadline, one a second
    let pods = PodResources::start(&config(&k.socket, 1.0, 1.0)).expect("start");
    let mut c = core().with_pods(pods);
    let hung = slowest_read(&mut c, Duration::from_millis(2500));
    assert!(k.calls() >= 2, "the calls reached the kubelet and hung");
    let h = c.health("online", Timestamp::from_secs(1_790_000_002), None);
    assert!(
        h.counters.get("pod_resources_errors").copied().unwrap_or(0) >= 2,
        "the hung calls are counted: {:?}",
        h.counters
    );
    assert!(
        hung < usual + Duration::from_millis(250),
        "a read took {hung:?} while the kubelet hung (usually at most {usual:?})"
    );
    assert!(pods_of(&tick(&mut c)).iter().all(Vec::is_empty));
}

#[test]
fn the_last_answer_is_kept_three_refreshes_then_dropped() {
    let refresh = Duration::from_millis(200);
    let k = FakeKubelet::start(answer(vec![pod(
        "ml",
        "train-0",
        &[("main", &[("nvidia.com/gpu", &["GPU-sim-0001"])])],
    )]));
    let pods = PodResources::start(&config(&k.socket, 0.2, 0.1)).expect("start");
    wait_until(Duration::from_secs(5), "the first answer", || {
        pods.answers() >= 1
    });
    // the kubelet fails from now on: its last answer ages
    k.set(Mode::Status(14, "restarting"));
    wait_until(Duration::from_secs(5), "a failed call", || {
        pods.errors() >= 1
    });
    let now = Instant::now();
    let snap = pods.current(now).expect("the last answer is still young");
    let answered = now - snap.age;
    assert!(pods.current(answered + refresh * 29 / 10).is_some());
    assert!(pods.current(answered + refresh * 31 / 10).is_none());
    assert!(
        pods.current(Instant::now()).is_none(),
        "dropped for good, not kept for a read that comes earlier"
    );
    // a new answer brings it back
    k.set(answer(vec![pod(
        "ml",
        "train-1",
        &[("main", &[("nvidia.com/gpu", &["GPU-sim-0001"])])],
    )]));
    wait_until(Duration::from_secs(5), "a new answer", || {
        pods.current(Instant::now()).is_some()
    });

    // through the read cycle, on the real clock: the pods go from the reports once
    // the answers stop for 3 x refresh_s, and the failures are counted
    let mut c = core().with_pods(pods);
    assert_eq!(pods_of(&tick(&mut c))[1], s(&["ml/train-1"]));
    k.set(Mode::Hang);
    let stopped = Instant::now();
    wait_until(Duration::from_secs(5), "the pods leave the report", || {
        pods_of(&tick(&mut c)).iter().all(Vec::is_empty)
    });
    let gone_after = stopped.elapsed();
    assert!(
        gone_after >= refresh * 3 - refresh - Duration::from_millis(20),
        "dropped {gone_after:?} after the last answers (3 x refresh_s from the last one)"
    );
    let h = c.health("online", Timestamp::from_secs(1_790_000_002), None);
    assert!(h.counters["pod_resources_errors"] >= 2, "{:?}", h.counters);
}

#[test]
fn a_value_out_of_range_is_refused_by_name() {
    let refused = |c: KubernetesConfig| c.check().map_err(|e| e.to_string());
    let socket = std::path::Path::new("/run/kubelet.sock");
    assert_eq!(refused(config(socket, 10.0, 2.0)), Ok(()));
    assert_eq!(
        refused(config(socket, 0.0, 2.0)),
        Err("[kubernetes] refresh_s must be within 0.05..=3600, got 0".into())
    );
    assert_eq!(
        refused(config(socket, 1.5, 2.0)),
        Err("[kubernetes] timeout_s must be above 0 and at most refresh_s (1.5), got 2".into())
    );
    let mut c = config(socket, 10.0, 2.0);
    c.resource_names.push(String::new());
    assert_eq!(
        refused(c),
        Err(r#"[kubernetes] resource_names must name at least one resource ("nvidia.com/gpu"), none empty"#.into())
    );
    assert_eq!(
        refused(config(std::path::Path::new(""), 10.0, 2.0)),
        Err("[kubernetes] pod_resources_socket is empty".into())
    );
}
