//! The fake Kubernetes API server (`powerplane_tests::kube_api`) against the real
//! Kubernetes client, kube-rs: what the client sends, the fake answers as a real API
//! server would, over HTTPS with the cluster's CA and a bearer token.

use std::path::Path;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Client, Config};
use powerplane_tests::kube_api::FakeKubeApi;
use serde_json::{json, Value};

/// A client as `kubectl` would make one: from the kubeconfig the fake wrote.
async fn kubeconfig_config(api: &FakeKubeApi) -> Config {
    let kc = Kubeconfig::read_from(api.kubeconfig()).expect("kubeconfig");
    Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .expect("config from kubeconfig")
}

async fn kubeconfig_client(api: &FakeKubeApi) -> Client {
    Client::try_from(kubeconfig_config(api).await).expect("client")
}

/// A client as one in a pod makes it: the service account's token file, CA and
/// namespace (what `Config::incluster` reads, at the fake's address).
fn service_account_config(api: &FakeKubeApi) -> Config {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::CertificateDer;
    let sa = api.service_account_dir();
    let mut c = Config::new(api.url().parse().expect("url"));
    let ca = sa.join("ca.crt");
    c.root_cert = Some(
        CertificateDer::pem_file_iter(&ca)
            .expect("ca.crt")
            .map(|c| c.expect("a certificate").to_vec())
            .collect(),
    );
    c.root_cert_file = Some(ca);
    c.auth_info.token_file = Some(sa.join("token").display().to_string());
    c.default_namespace = std::fs::read_to_string(sa.join("namespace")).expect("namespace");
    c
}

fn pod(name: &str, labels: Value) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": labels},
        "spec": {"containers": [{"name": "main", "image": "train:1"}]},
        "status": {"phase": "Pending"},
    })
}

fn names(pods: &[Pod]) -> Vec<String> {
    let mut n: Vec<String> = pods
        .iter()
        .map(|p| p.metadata.name.clone().unwrap_or_default())
        .collect();
    n.sort();
    n
}

fn api_error(e: kube::Error) -> (u16, String) {
    match e {
        kube::Error::Api(s) => (s.code, s.reason),
        other => panic!("expected an API error (a Status), got {other:?}"),
    }
}

/// Waits (up to `limit`) for `cond`; answers whether it came.
async fn until(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let t = Instant::now();
    while t.elapsed() < limit {
        if cond() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    cond()
}

/// A reflector over the pods, driven on a task of its own; its store.
async fn reflect(client: Client, wc: watcher::Config) -> Store<Pod> {
    let (reader, writer) = reflector::store::<Pod>();
    let pods: Api<Pod> = Api::all(client);
    let stream =
        reflector::reflector(writer, watcher(pods, wc).default_backoff()).applied_objects();
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while stream.next().await.is_some() {}
    });
    tokio::time::timeout(Duration::from_secs(10), reader.wait_until_ready())
        .await
        .expect("the reflector's first list in time")
        .expect("the reflector's first list");
    reader
}

fn has(store: &Store<Pod>, name: &str) -> bool {
    store.get(&ObjectRef::new(name).within("default")).is_some()
}

fn label(store: &Store<Pod>, name: &str, key: &str) -> Option<String> {
    store
        .get(&ObjectRef::new(name).within("default"))?
        .metadata
        .labels
        .as_ref()?
        .get(key)
        .cloned()
}

fn start(dir: &Path) -> FakeKubeApi {
    FakeKubeApi::start(dir)
}

#[tokio::test]
async fn a_kubeconfig_client_lists_pods_by_label_and_field_and_in_consistent_pages() {
    let dir = tempfile::tempdir().expect("tempdir");
    let api = start(dir.path());
    for (name, labels) in [
        ("a", json!({"app": "train", "tier": "batch"})),
        ("b", json!({"app": "train", "tier": "online"})),
        ("c", json!({"app": "serve"})),
        ("d", json!({"app": "train"})),
        ("e", json!({})),
    ] {
        api.put_pod(pod(name, labels));
    }
    let mut running = pod("f", json!({"app": "train"}));
    running["status"]["phase"] = json!("Running");
    api.put_pod(running);

    let pods: Api<Pod> = Api::default_namespaced(kubeconfig_client(&api).await);
    let list = |s: &str| ListParams::default().labels(s);
    let got = |l: kube::core::ObjectList<Pod>| names(&l.items);
    assert_eq!(
        got(pods.list(&list("app=train")).await.expect("list")),
        ["a", "b", "d", "f"]
    );
    assert_eq!(
        got(pods
            .list(&list("app=train,tier!=batch"))
            .await
            .expect("list")),
        ["b", "d", "f"],
        "key!=value also matches pods without the key"
    );
    assert_eq!(got(pods.list(&list("!app")).await.expect("list")), ["e"]);
    assert_eq!(
        got(pods.list(&list("tier")).await.expect("list")),
        ["a", "b"]
    );
    assert_eq!(
        got(pods
            .list(&list("app in (serve,other)"))
            .await
            .expect("list")),
        ["c"]
    );
    let by_field = |s: &str| ListParams::default().fields(s);
    assert_eq!(
        got(pods
            .list(&by_field("status.phase=Running"))
            .await
            .expect("list")),
        ["f"]
    );
    assert_eq!(
        got(pods
            .list(&by_field("status.phase!=Running,metadata.name!=a"))
            .await
            .expect("list")),
        ["b", "c", "d", "e"]
    );
    let (code, reason) = api_error(
        pods.list(&by_field("spec.nope=x"))
            .await
            .expect_err("an unsupported field"),
    );
    assert_eq!((code, reason.as_str()), (400, "BadRequest"));

    // pages: a real continue token, and the later pages at the first page's version
    let first = pods
        .list(&ListParams::default().limit(4))
        .await
        .expect("page 1");
    assert_eq!(names(&first.items), ["a", "b", "c", "d"]);
    let token = first.metadata.continue_.clone().expect("a continue token");
    assert_eq!(first.metadata.remaining_item_count, Some(2));
    let rv = first.metadata.resource_version.clone().expect("version");
    assert_eq!(rv, api.resource_version().to_string());
    api.put_pod(pod("da", json!({}))); // sorts after d: not in this list
    api.delete_pod("default", "f"); // still in it
    let second = pods
        .list(&ListParams::default().limit(4).continue_token(&token))
        .await
        .expect("page 2");
    assert_eq!(names(&second.items), ["e", "f"]);
    assert_eq!(
        second.metadata.resource_version.as_deref(),
        Some(rv.as_str())
    );
    assert!(second.metadata.continue_.is_none());

    // once the history is compacted, the token is too old
    api.compact();
    let (code, reason) = api_error(
        pods.list(&ListParams::default().limit(4).continue_token(&token))
            .await
            .expect_err("an expired continue token"),
    );
    assert_eq!((code, reason.as_str()), (410, "Expired"));

    let all: Api<Pod> = Api::all(kubeconfig_client(&api).await);
    assert_eq!(
        all.list(&ListParams::default())
            .await
            .expect("list")
            .items
            .len(),
        6
    );
    assert!(api.requests().iter().all(|r| r.authorized));
}

#[tokio::test]
async fn a_reflector_sees_pods_added_modified_and_deleted() {
    let dir = tempfile::tempdir().expect("tempdir");
    let api = start(dir.path());
    api.put_pod(pod("before", json!({"app": "train"})));
    api.put_pod(pod("other", json!({"app": "serve"})));
    let client = Client::try_from(service_account_config(&api)).expect("client");
    let store = reflect(client, watcher::Config::default().labels("app=train")).await;
    assert!(has(&store, "before") && !has(&store, "other"));

    api.put_pod(pod("new", json!({"app": "train", "step": "1"})));
    assert!(
        until(Duration::from_secs(5), || has(&store, "new")).await,
        "ADDED"
    );

    api.put_pod(pod("new", json!({"app": "train", "step": "2"})));
    assert!(
        until(Duration::from_secs(5), || label(&store, "new", "step")
            .as_deref()
            == Some("2"))
        .await,
        "MODIFIED"
    );

    api.delete_pod("default", "before");
    assert!(
        until(Duration::from_secs(5), || !has(&store, "before")).await,
        "DELETED"
    );

    // leaving the selector is a DELETED to this watch, entering it an ADDED
    api.put_pod(pod("new", json!({"app": "serve"})));
    assert!(until(Duration::from_secs(5), || !has(&store, "new")).await);
    api.put_pod(pod("other", json!({"app": "train"})));
    assert!(until(Duration::from_secs(5), || has(&store, "other")).await);

    // kube-runtime's default: a paged list at the most recent version, then a watch
    // from the list's version with bookmarks and the server's 290 s timeout
    assert_eq!(api.list_requests(), 1, "one list, then the watch");
    let requests = api.requests();
    let list = requests.iter().find(|r| !r.watch).expect("a list request");
    assert!(list.query.contains("limit=500"), "{}", list.query);
    assert!(!list.query.contains("resourceVersion="), "{}", list.query);
    let watch = requests.iter().find(|r| r.watch).expect("a watch request");
    for part in [
        "allowWatchBookmarks=true",
        "timeoutSeconds=290",
        "labelSelector=app%3Dtrain",
        "resourceVersion=",
    ] {
        assert!(watch.query.contains(part), "{part} in {}", watch.query);
    }
    assert!(watch.authorized);
}

#[tokio::test]
async fn an_expired_watch_makes_the_watcher_list_again() {
    let dir = tempfile::tempdir().expect("tempdir");
    let api = start(dir.path());
    api.put_pod(pod("a", json!({})));
    api.put_pod(pod("b", json!({})));
    let store = reflect(kubeconfig_client(&api).await, watcher::Config::default()).await;
    assert!(until(Duration::from_secs(5), || api.open_watches() == 1).await);
    assert_eq!(api.list_requests(), 1);

    api.expire_watches();
    // a change while the watcher is between its watch and its new list
    api.delete_pod("default", "a");
    api.put_pod(pod("c", json!({})));
    assert!(
        until(Duration::from_secs(10), || api.list_requests() == 2).await,
        "the 410 made the watcher list again"
    );
    assert!(
        until(Duration::from_secs(5), || has(&store, "c")
            && !has(&store, "a"))
        .await
    );
    api.put_pod(pod("d", json!({})));
    assert!(until(Duration::from_secs(5), || has(&store, "d")).await);
    assert_eq!(
        names(
            &store
                .state()
                .iter()
                .map(|p| (**p).clone())
                .collect::<Vec<_>>()
        ),
        ["b", "c", "d"]
    );
}

#[tokio::test]
async fn a_watch_at_a_compacted_version_is_410_and_bookmarks_and_timeouts_are_served() {
    let dir = tempfile::tempdir().expect("tempdir");
    let api = start(dir.path());
    api.put_pod(pod("a", json!({})));
    let old = api.resource_version().to_string();
    api.put_pod(pod("b", json!({})));
    let pods: Api<Pod> = Api::default_namespaced(kubeconfig_client(&api).await);

    // from a version still kept: the change after it, then bookmarks, then the end
    let t = Instant::now();
    let events: Vec<_> = pods
        .watch(&WatchParams::default().timeout(2), &old)
        .await
        .expect("watch")
        .collect()
        .await;
    let elapsed = t.elapsed();
    assert!(
        elapsed >= Duration::from_millis(1900) && elapsed < Duration::from_secs(5),
        "timeoutSeconds=2 closed it after {elapsed:?}"
    );
    let events: Vec<WatchEvent<Pod>> = events.into_iter().map(|e| e.expect("event")).collect();
    assert!(matches!(&events[0], WatchEvent::Added(p) if p.metadata.name.as_deref() == Some("b")));
    let bookmarks = events
        .iter()
        .filter(|e| matches!(e, WatchEvent::Bookmark(b) if b.metadata.resource_version == api.resource_version().to_string()))
        .count();
    assert!(bookmarks >= 1, "{} events", events.len());

    // once compacted, that version is gone: the ERROR event with a 410 Status
    api.compact();
    let events: Vec<_> = pods
        .watch(&WatchParams::default().timeout(5), &old)
        .await
        .expect("watch")
        .collect()
        .await;
    assert_eq!(events.len(), 1, "the error, then the end");
    match events.into_iter().next().expect("one").expect("event") {
        WatchEvent::Error(s) => assert_eq!((s.code, s.reason.as_str()), (410, "Expired")),
        other => panic!("expected a 410 ERROR event, got {other:?}"),
    }
}

#[tokio::test]
async fn a_streaming_list_watcher_gets_the_initial_events_and_the_end_bookmark() {
    let dir = tempfile::tempdir().expect("tempdir");
    let api = start(dir.path());
    api.put_pod(pod("a", json!({"app": "train"})));
    api.put_pod(pod("b", json!({"app": "serve"})));
    let store = reflect(
        kubeconfig_client(&api).await,
        watcher::Config::default()
            .streaming_lists()
            .labels("app=train"),
    )
    .await;
    assert!(has(&store, "a") && !has(&store, "b"));
    assert_eq!(api.list_requests(), 0, "no list: the watch streamed it");
    let first = api.requests().into_iter().find(|r| r.watch).expect("watch");
    assert!(
        first.query.contains("sendInitialEvents=true"),
        "{}",
        first.query
    );
    assert!(first.query.contains("resourceVersionMatch=NotOlderThan"));
    api.put_pod(pod("c", json!({"app": "train"})));
    assert!(until(Duration::from_secs(5), || has(&store, "c")).await);
}

#[tokio::test]
async fn a_stalled_watch_is_left_after_its_timeout_and_the_idle_margin() {
    let dir = tempfile::tempdir().expect("tempdir");
    let api = start(dir.path());
    api.put_pod(pod("a", json!({})));
    // the server closes each watch after 3 s; the watcher gives up on a silent one
    // after 3 s + its 5 s margin
    let store = reflect(
        kubeconfig_client(&api).await,
        watcher::Config::default().timeout(3),
    )
    .await;
    assert!(until(Duration::from_secs(5), || api.open_watches() == 1).await);
    let started = api.watch_requests();

    api.stall_watches(true);
    api.put_pod(pod("b", json!({})));
    tokio::time::sleep(Duration::from_millis(300)).await;
    api.stall_watches(false); // new watches are served again; the stalled one is dead
    let t = Instant::now();
    tokio::time::sleep(Duration::from_millis(3700)).await;
    assert!(
        !has(&store, "b"),
        "the stalled watch delivered nothing, and the server did not close it at 3 s"
    );
    assert_eq!(
        api.watch_requests(),
        started,
        "the watcher still waits on it"
    );
    assert!(until(Duration::from_secs(10), || has(&store, "b")).await);
    assert!(api.watch_requests() > started, "a new watch");
    assert!(t.elapsed() >= Duration::from_secs(4), "{:?}", t.elapsed());
    assert_eq!(api.list_requests(), 1, "resumed at its version, no list");

    // a watch started while stalled gets its headers, then nothing
    api.stall_watches(true);
    let pods: Api<Pod> = Api::default_namespaced(kubeconfig_client(&api).await);
    let stream = tokio::time::timeout(
        Duration::from_secs(3),
        pods.watch(&WatchParams::default().timeout(1), "0"),
    )
    .await
    .expect("the headers came")
    .expect("a watch");
    let mut stream = std::pin::pin!(stream);
    assert!(
        tokio::time::timeout(Duration::from_millis(1500), stream.next())
            .await
            .is_err(),
        "no event, and not closed at its 1 s timeout"
    );
}

#[tokio::test]
async fn patches_follow_the_server_rules() {
    let dir = tempfile::tempdir().expect("tempdir");
    let api = start(dir.path());
    let mut gated = pod("job-1", json!({"app": "train"}));
    gated["spec"]["schedulingGates"] =
        json!([{"name": "powerplane.io/hold"}, {"name": "other/gate"}]);
    api.put_pod(gated);
    let pods: Api<Pod> = Api::default_namespaced(kubeconfig_client(&api).await);
    let rv = api.resource_version();
    let pp = PatchParams {
        field_manager: Some("powerplane".into()),
        ..Default::default()
    };

    // a failed test op: 422 Invalid, nothing written
    let failing: Patch<()> = Patch::Json(
        serde_json::from_value(json!([
            {"op": "test", "path": "/spec/schedulingGates/0/name", "value": "someone/else"},
            {"op": "remove", "path": "/spec/schedulingGates/0"},
        ]))
        .expect("json patch"),
    );
    let (code, reason) = api_error(
        pods.patch("job-1", &pp, &failing)
            .await
            .expect_err("test fails"),
    );
    assert_eq!((code, reason.as_str()), (422, "Invalid"));
    let bad_path: Patch<()> = Patch::Json(
        serde_json::from_value(json!([{"op": "remove", "path": "/spec/nothing/here"}]))
            .expect("json patch"),
    );
    let (code, _) = api_error(
        pods.patch("job-1", &pp, &bad_path)
            .await
            .expect_err("bad path"),
    );
    assert_eq!(code, 422);
    assert_eq!(api.resource_version(), rv, "nothing written");

    // test and remove: the gate goes, a new version, who did it recorded
    let release: Patch<()> = Patch::Json(
        serde_json::from_value(json!([
            {"op": "test", "path": "/spec/schedulingGates/0/name", "value": "powerplane.io/hold"},
            {"op": "remove", "path": "/spec/schedulingGates/0"},
        ]))
        .expect("json patch"),
    );
    let p = pods.patch("job-1", &pp, &release).await.expect("patched");
    let gates = p
        .spec
        .as_ref()
        .and_then(|s| s.scheduling_gates.clone())
        .expect("gates");
    assert_eq!(gates.len(), 1);
    assert_eq!(p.metadata.resource_version, Some((rv + 1).to_string()));
    let managers: Vec<_> = p
        .metadata
        .managed_fields
        .unwrap_or_default()
        .into_iter()
        .filter_map(|m| m.manager)
        .collect();
    assert_eq!(managers, ["powerplane"]);
    assert!(api
        .requests()
        .iter()
        .any(|r| r.method == "PATCH" && r.query.contains("fieldManager=powerplane")));

    // the gate cannot come back, by any patch
    let back = Patch::Merge(
        json!({"spec": {"schedulingGates": [{"name": "other/gate"}, {"name": "powerplane.io/hold"}]}}),
    );
    let (code, reason) = api_error(
        pods.patch("job-1", &pp, &back)
            .await
            .expect_err("no new gate"),
    );
    assert_eq!((code, reason.as_str()), (422, "Invalid"));
    let strategic =
        Patch::Strategic(json!({"metadata": {"annotations": {"powerplane.io/slot": "3"}}}));
    let p = pods.patch("job-1", &pp, &strategic).await.expect("merged");
    assert_eq!(
        p.metadata
            .annotations
            .unwrap_or_default()
            .get("powerplane.io/slot")
            .map(String::as_str),
        Some("3")
    );
    // the same patch again changes nothing: no new version
    let rv = api.resource_version();
    pods.patch("job-1", &pp, &strategic).await.expect("merged");
    assert_eq!(api.resource_version(), rv);
    // an old resourceVersion in the patch is a conflict
    let stale = Patch::Merge(json!({"metadata": {"resourceVersion": "2", "labels": {"x": "y"}}}));
    let (code, reason) = api_error(pods.patch("job-1", &pp, &stale).await.expect_err("stale"));
    assert_eq!((code, reason.as_str()), (409, "Conflict"));

    let (code, reason) = api_error(
        pods.patch("nope", &pp, &strategic)
            .await
            .expect_err("no such pod"),
    );
    assert_eq!((code, reason.as_str()), (404, "NotFound"));
    let (code, reason) = api_error(pods.get("nope").await.expect_err("no such pod"));
    assert_eq!((code, reason.as_str()), (404, "NotFound"));
}

fn lease(name: &str, holder: &str) -> Lease {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15},
    }))
    .expect("lease")
}

#[tokio::test]
async fn lease_writes_are_optimistic_as_on_the_server() {
    let dir = tempfile::tempdir().expect("tempdir");
    let api = start(dir.path());
    let leases: Api<Lease> = Api::default_namespaced(kubeconfig_client(&api).await);
    let pp = PostParams::default();

    let (code, reason) = api_error(leases.get("leader").await.expect_err("none yet"));
    assert_eq!((code, reason.as_str()), (404, "NotFound"));
    // as on the server, a PUT of a lease that does not exist creates it
    leases
        .replace("standby", &pp, &lease("standby", "me"))
        .await
        .expect("created by a PUT");
    assert!(api.lease("default", "standby").is_some());
    let mine = leases
        .create(&pp, &lease("leader", "me"))
        .await
        .expect("created");
    let (code, reason) = api_error(
        leases
            .create(&pp, &lease("leader", "rival"))
            .await
            .expect_err("exists"),
    );
    assert_eq!((code, reason.as_str()), (409, "AlreadyExists"));

    // renew with the version read: fine
    let mut renew = mine.clone();
    renew.spec.as_mut().expect("spec").lease_duration_seconds = Some(20);
    let renewed = leases
        .replace("leader", &pp, &renew)
        .await
        .expect("renewed");
    assert_ne!(
        renewed.metadata.resource_version,
        mine.metadata.resource_version
    );

    // someone else takes it: our next write, at the version we read, conflicts
    let mut theirs = api.lease("default", "leader").expect("stored");
    theirs["spec"]["holderIdentity"] = json!("rival");
    api.set_lease(theirs);
    let (code, reason) = api_error(
        leases
            .replace("leader", &pp, &renewed)
            .await
            .expect_err("stale"),
    );
    assert_eq!((code, reason.as_str()), (409, "Conflict"));
    // and a lease write without a version is refused
    let mut blind = renewed.clone();
    blind.metadata.resource_version = None;
    let (code, _) = api_error(
        leases
            .replace("leader", &pp, &blind)
            .await
            .expect_err("no version"),
    );
    assert_eq!(code, 422);

    let now = leases.get("leader").await.expect("get");
    assert_eq!(
        now.spec.as_ref().and_then(|s| s.holder_identity.as_deref()),
        Some("rival")
    );
    let p = leases
        .patch(
            "leader",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"holderIdentity": "me"}})),
        )
        .await
        .expect("merge patch");
    assert_eq!(
        p.spec.and_then(|s| s.holder_identity).as_deref(),
        Some("me")
    );
    assert_eq!(
        api.lease("default", "leader").expect("stored")["spec"]["holderIdentity"],
        json!("me")
    );
}

#[tokio::test]
async fn events_of_both_apis_are_stored() {
    use k8s_openapi::api::core::v1::Event as CoreEvent;
    use k8s_openapi::api::events::v1::Event;
    let dir = tempfile::tempdir().expect("tempdir");
    let api = start(dir.path());
    let client = kubeconfig_client(&api).await;
    let events: Api<Event> = Api::default_namespaced(client.clone());
    let e: Event = serde_json::from_value(json!({
        "metadata": {"name": "job-1.held"},
        "eventTime": "2025-01-01T00:00:00.000000Z",
        "reason": "Held",
        "note": "held for the power cap",
        "type": "Normal",
        "action": "Hold",
        "reportingController": "powerplane.io/controller",
        "reportingInstance": "powerplane-0",
        "regarding": {"kind": "Pod", "name": "job-1", "namespace": "default"},
    }))
    .expect("event");
    let created = events
        .create(&PostParams::default(), &e)
        .await
        .expect("created");
    assert!(created.metadata.uid.is_some() && created.metadata.resource_version.is_some());
    let patched = events
        .patch(
            "job-1.held",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"series": {"count": 2, "lastObservedTime": "2025-01-01T00:01:00.000000Z"}}),
            ),
        )
        .await
        .expect("patched");
    assert_eq!(patched.series.map(|s| s.count), Some(2));
    let core: Api<CoreEvent> = Api::default_namespaced(client);
    let c: CoreEvent = serde_json::from_value(json!({
        "metadata": {"generateName": "job-1."},
        "reason": "Released",
        "message": "released",
        "involvedObject": {"kind": "Pod", "name": "job-1", "namespace": "default"},
    }))
    .expect("event");
    core.create(&PostParams::default(), &c)
        .await
        .expect("created");
    let stored = api.events();
    assert_eq!(stored.len(), 2);
    assert_eq!(stored[0]["note"], json!("held for the power cap"));
    assert_eq!(stored[0]["series"]["count"], json!(2));
    assert_eq!(stored[1]["reason"], json!("Released"));
    assert_eq!(stored[1]["apiVersion"], json!("v1"));
}

#[tokio::test]
async fn a_wrong_token_is_401_and_a_rotated_token_file_is_read_by_a_new_client() {
    let dir = tempfile::tempdir().expect("tempdir");
    let api = start(dir.path());
    let mut wrong = kubeconfig_config(&api).await;
    wrong.auth_info.token = Some("not-a-token".to_string().into());
    let pods: Api<Pod> = Api::all(Client::try_from(wrong).expect("client"));
    let (code, reason) = api_error(pods.list(&ListParams::default()).await.expect_err("401"));
    assert_eq!((code, reason.as_str()), (401, "Unauthorized"));
    assert!(!api.requests().last().expect("logged").authorized);

    let before = Client::try_from(service_account_config(&api)).expect("client");
    let pods: Api<Pod> = Api::all(before.clone());
    pods.list(&ListParams::default())
        .await
        .expect("the mounted token");

    api.set_tokens(&["rotated-token-2"]);
    // kube-rs keeps a token file's token for up to a minute: the client made before
    // the rotation still sends the old one, which the server refuses now ...
    let (code, _) = api_error(
        pods.list(&ListParams::default())
            .await
            .expect_err("old token"),
    );
    assert_eq!(code, 401);
    // ... and a client made after it reads the new file
    let after = Client::try_from(service_account_config(&api)).expect("client");
    Api::<Pod>::all(after)
        .list(&ListParams::default())
        .await
        .expect("the rotated token");
    assert_eq!(
        std::fs::read_to_string(api.service_account_dir().join("token")).expect("token"),
        "rotated-token-2"
    );
}

#[tokio::test]
async fn failures_hangs_and_a_restart_with_the_objects_kept() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut api = start(dir.path());
    api.put_pod(pod("a", json!({})));
    let mut config = kubeconfig_config(&api).await;
    config.read_timeout = Some(Duration::from_secs(1));
    let pods: Api<Pod> = Api::all(Client::try_from(config).expect("client"));

    api.fail_next(1, 500);
    let (code, reason) = api_error(pods.list(&ListParams::default()).await.expect_err("500"));
    assert_eq!((code, reason.as_str()), (500, "InternalError"));
    assert_eq!(
        pods.list(&ListParams::default())
            .await
            .expect("then fine")
            .items
            .len(),
        1
    );

    api.hang(true);
    let t = Instant::now();
    let e = pods
        .list(&ListParams::default())
        .await
        .expect_err("no answer");
    assert!(!matches!(e, kube::Error::Api(_)), "{e:?}");
    assert!(t.elapsed() < Duration::from_secs(5));
    api.hang(false);
    assert_eq!(
        pods.list(&ListParams::default())
            .await
            .expect("answered")
            .items
            .len(),
        1
    );

    // a watcher across a restart of the server
    let store = reflect(kubeconfig_client(&api).await, watcher::Config::default()).await;
    api.stop();
    assert!(pods.list(&ListParams::default()).await.is_err(), "stopped");
    api.restart();
    let l = pods
        .list(&ListParams::default())
        .await
        .expect("after the restart");
    assert_eq!(names(&l.items), ["a"]);
    api.put_pod(pod("b", json!({})));
    assert!(
        until(Duration::from_secs(10), || has(&store, "b")).await,
        "the watcher came back"
    );
    assert!(has(&store, "a"));
}
