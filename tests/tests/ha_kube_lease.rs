//! `[ha] backend = "kubernetes"`: the leader lease as a `coordination.k8s.io/v1` Lease
//! on the fake API server over HTTPS, through kube-rs: one holder at a time, epochs
//! that only grow (kept in the Lease), writes that lose to a concurrent one (409), a
//! term judged expired on the follower's own clock, and the store's fence (a real
//! `redis-server` on a port of its own) raised to each term so a deposed leader's
//! commits do not land.

use std::time::{Duration, Instant};

use integrations::kubernetes::{Access, Kube, KubeLease};
use integrations::lease::redis::RedisLease;
use integrations::lease::{Change, Election, FencedLease, LeaseStore, Timing};
use integrations::store::redis::RedisBackend;
use integrations::store::{Store, StoreError, Tx};
use powerplane_tests::fixtures::job;
use powerplane_tests::kube_api::FakeKubeApi;
use powerplane_tests::redis_server::RedisServer;
use serde_json::json;
use telemetry::JobState;

const NS: &str = "powerplane";
const NAME: &str = "powerplane-leader";

fn lease(api: &FakeKubeApi) -> KubeLease {
    let access = Access {
        kubeconfig: Some(api.kubeconfig().to_path_buf()),
        ..Default::default()
    };
    let kube = Kube::new(&access, Duration::from_secs(2)).expect("client");
    KubeLease::new(kube, Some(NS), NAME)
}

#[test]
fn one_holder_at_a_time_epochs_grow_in_the_lease_and_expiry_is_on_the_followers_clock() {
    let dir = tempfile::tempdir().expect("tmp");
    let api = FakeKubeApi::start(dir.path());
    let (mut a, mut b) = (lease(&api), lease(&api));
    assert_eq!(a.epoch().expect("epoch"), 0, "no Lease yet");
    let e1 = a.acquire("a", 2000).expect("acquire").expect("created");
    assert_eq!(e1, 1);
    let l = api.lease(NS, NAME).expect("the Lease exists");
    assert_eq!(l["spec"]["holderIdentity"], "a");
    assert_eq!(l["spec"]["leaseDurationSeconds"], 2);
    assert_eq!(l["spec"]["leaseTransitions"], 1);
    assert_eq!(l["metadata"]["annotations"]["powerplane.io/epoch"], "1");
    assert_eq!(b.acquire("b", 2000).expect("acquire"), None, "held by a");
    assert_eq!(
        b.holder().expect("holder").map(|h| (h.instance, h.epoch)),
        Some(("a".into(), 1))
    );
    // a renews: b sees the record change and keeps waiting, whatever the time says
    let t = Instant::now();
    while t.elapsed() < Duration::from_millis(3000) {
        assert!(a.renew("a", e1, 2000).expect("renew"), "a's own term");
        assert_eq!(b.acquire("b", 2000).expect("acquire"), None);
        std::thread::sleep(Duration::from_millis(300));
    }
    assert!(
        !b.renew("b", e1, 2000).expect("renew"),
        "b does not hold term 1"
    );
    // a stops: b takes the Lease once the record has not changed for a term
    let stopped = Instant::now();
    let e2 = loop {
        if let Some(e) = b.acquire("b", 2000).expect("acquire") {
            break e;
        }
        assert!(stopped.elapsed() < Duration::from_secs(6), "never taken");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(
        stopped.elapsed() >= Duration::from_millis(1700),
        "taken {:?} after the last renewal: before the term ran out",
        stopped.elapsed()
    );
    assert_eq!(e2, 2);
    let l = api.lease(NS, NAME).expect("lease");
    assert_eq!(l["spec"]["leaseTransitions"], 2);
    assert!(!a.renew("a", e1, 2000).expect("renew"), "a's term is over");
    // a release frees it at once
    b.release("b", e2).expect("release");
    assert_eq!(a.holder().expect("holder"), None);
    assert_eq!(a.acquire("a", 2000).expect("acquire"), Some(3));
}

#[test]
fn two_replicas_taking_the_free_lease_at_once_make_one_leader() {
    let dir = tempfile::tempdir().expect("tmp");
    let api = FakeKubeApi::start(dir.path());
    for round in 0..5 {
        let stores: Vec<KubeLease> = (0..4).map(|_| lease(&api)).collect();
        let barrier = std::sync::Arc::new(std::sync::Barrier::new(stores.len()));
        let won: Vec<Option<u64>> = std::thread::scope(|s| {
            let handles: Vec<_> = stores
                .into_iter()
                .enumerate()
                .map(|(i, mut l)| {
                    let b = barrier.clone();
                    s.spawn(move || {
                        b.wait();
                        l.acquire(&format!("r{i}"), 60_000).expect("acquire")
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("thread"))
                .collect()
        });
        let winners: Vec<u64> = won.iter().flatten().copied().collect();
        assert_eq!(winners.len(), 1, "round {round}: {won:?}");
        assert_eq!(winners[0], round + 1, "round {round}: one new epoch");
        // the holder gives it back for the next round
        let l = api.lease(NS, NAME).expect("lease");
        let holder = l["spec"]["holderIdentity"].as_str().expect("holder");
        lease(&api).release(holder, winners[0]).expect("release");
    }
    let conflicts = api
        .requests()
        .iter()
        .filter(|r| r.method == "PUT" || r.method == "POST")
        .count();
    assert!(
        conflicts > 5,
        "the losers wrote and lost: {conflicts} writes"
    );
}

#[test]
fn a_lease_made_anew_never_goes_below_an_epoch_seen() {
    let dir = tempfile::tempdir().expect("tmp");
    let api = FakeKubeApi::start(dir.path());
    let mut a = lease(&api);
    // the Lease as an earlier installation left it: epoch 41, released
    api.set_lease(json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": { "name": NAME, "namespace": NS, "annotations": { "powerplane.io/epoch": "41" } },
        "spec": { "leaseTransitions": 41 }
    }));
    assert_eq!(a.acquire("a", 60_000).expect("acquire"), Some(42));
    // someone deletes it: the next term starts above what this replica has seen
    api.delete_lease(NS, NAME);
    a.release("a", 42).expect("release (gone: nothing to do)");
    assert_eq!(a.acquire("a", 60_000).expect("acquire"), Some(43));
}

#[test]
fn an_election_on_the_lease_survives_the_api_server_going_away_with_a_new_term() {
    let dir = tempfile::tempdir().expect("tmp");
    let mut api = FakeKubeApi::start(dir.path());
    let timing = Timing::from_secs(2.0, 0.4);
    let mut store = lease(&api);
    let mut e = Election::new("a", timing);
    let t0 = Instant::now();
    let ms = || t0.elapsed().as_millis() as u64;
    assert_eq!(e.step(&mut store, ms()), Change::Elected { epoch: 1 });
    api.hang(true);
    // renewals get no answer: the term ends by lease minus margin, each call by its
    // deadline
    let deposed = loop {
        let before = Instant::now();
        let change = e.step(&mut store, ms());
        assert!(
            before.elapsed() < Duration::from_millis(2500),
            "a round took {:?}",
            before.elapsed()
        );
        if let Change::Deposed { why, .. } = change {
            break why;
        }
    };
    assert_eq!(deposed, "lease_ran_out");
    assert!(ms() < 6000, "deposed after {} ms", ms());
    api.hang(false);
    api.restart();
    let elected = loop {
        if let Change::Elected { epoch } = e.step(&mut store, ms()) {
            break epoch;
        }
        assert!(ms() < 30_000, "no term after the API server came back");
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(elected, 2, "a new term, above the last");
}

fn fenced_store(server: &RedisServer, prefix: &str) -> Store {
    Store::new(Box::new(
        RedisBackend::connect(&server.url(), prefix).expect("connect to the test redis"),
    ))
}

#[test]
fn each_term_raises_the_stores_fence_so_a_deposed_leaders_commits_do_not_land() {
    let dir = tempfile::tempdir().expect("tmp");
    let api = FakeKubeApi::start(dir.path());
    let server = RedisServer::start();
    let prefix = "ha-kube-lease";
    let fenced = |api: &FakeKubeApi| FencedLease {
        lease: lease(api),
        fence: RedisLease::new(&server.url(), prefix, Duration::from_secs(2)).expect("fence"),
    };
    let (mut a, mut b) = (fenced(&api), fenced(&api));
    let old = a.acquire("a", 1000).expect("acquire").expect("taken");
    let mut deposed = fenced_store(&server, prefix);
    deposed.set_fence(Some(old));
    let mut tx = Tx::new();
    tx.put_job(&job("k8s:ml/one", JobState::Pending));
    deposed
        .commit(tx)
        .expect("the leader's commit under its term");
    // a stops renewing; b takes the Lease, and with it the store's fence
    let t = Instant::now();
    let new = loop {
        if let Some(e) = b.acquire("b", 1000).expect("acquire") {
            break e;
        }
        assert!(t.elapsed() < Duration::from_secs(5), "never taken");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(new, old + 1);
    let mut tx = Tx::new();
    tx.put_job(&job("k8s:ml/two", JobState::Pending));
    match deposed.commit(tx) {
        Err(StoreError::Fenced { .. }) => {}
        other => panic!("the deposed leader's commit landed: {other:?}"),
    }
    let mut leader = fenced_store(&server, prefix);
    leader.set_fence(Some(new));
    let mut tx = Tx::new();
    tx.put_job(&job("k8s:ml/three", JobState::Pending));
    leader.commit(tx).expect("the new leader's commit");
    let ids: Vec<String> = leader
        .jobs()
        .expect("jobs")
        .into_iter()
        .map(|j| j.id)
        .collect();
    assert_eq!(ids, vec!["k8s:ml/one", "k8s:ml/three"]);
    // the fence only rises: an old term's renewal (refused anyway) cannot lower it
    assert!(!a.renew("a", old, 1000).expect("renew"));
    let mut check = RedisLease::new(&server.url(), prefix, Duration::from_secs(2)).expect("read");
    assert_eq!(check.epoch().expect("epoch"), new);
}

#[test]
fn a_store_that_cannot_be_fenced_makes_no_leader() {
    let dir = tempfile::tempdir().expect("tmp");
    let api = FakeKubeApi::start(dir.path());
    let mut server = RedisServer::start();
    let prefix = "ha-kube-nofence";
    let mut l = FencedLease {
        lease: lease(&api),
        fence: RedisLease::new(&server.url(), prefix, Duration::from_millis(500)).expect("fence"),
    };
    let timing = Timing::from_secs(2.0, 0.4);
    let mut e = Election::new("a", timing);
    server.kill9();
    let t0 = Instant::now();
    let ms = || t0.elapsed().as_millis() as u64;
    // the Lease is taken but the store cannot be fenced: no term counts
    for _ in 0..5 {
        assert_eq!(e.step(&mut l, ms()), Change::None);
    }
    assert!(
        !matches!(e.role(), integrations::lease::Role::Leader { .. }),
        "{:?}",
        e.role()
    );
    // the store comes back: the replica's own term is picked up and fenced
    server.restart();
    let elected = loop {
        if let Change::Elected { epoch } = e.step(&mut l, ms()) {
            break epoch;
        }
        assert!(ms() < 20_000, "no leader once the store is back");
        std::thread::sleep(Duration::from_millis(200));
    };
    let mut check = RedisLease::new(&server.url(), prefix, Duration::from_secs(2)).expect("read");
    assert_eq!(check.epoch().expect("epoch"), elected);
}

#[test]
fn moving_from_the_stores_own_lease_the_first_term_starts_above_the_stores_epoch() {
    let dir = tempfile::tempdir().expect("tmp");
    let api = FakeKubeApi::start(dir.path());
    let server = RedisServer::start();
    let prefix = "ha-kube-move";
    // replicas led on the store's own lease up to term 57
    let mut own = RedisLease::new(&server.url(), prefix, Duration::from_secs(2)).expect("lease");
    let mut last = 0;
    for _ in 0..57 {
        last = own.acquire("old", 60_000).expect("acquire").expect("taken");
        own.release("old", last).expect("release");
    }
    assert_eq!(last, 57);
    // all stopped; they come back on the Lease
    let mut l = FencedLease {
        lease: lease(&api),
        fence: RedisLease::new(&server.url(), prefix, Duration::from_secs(2)).expect("fence"),
    };
    let first = l.acquire("r0", 60_000).expect("acquire").expect("taken");
    assert_eq!(first, 58, "above every term the store has fenced");
    let mut store = fenced_store(&server, prefix);
    store.set_fence(Some(first));
    let mut tx = Tx::new();
    tx.put_job(&job("k8s:ml/after", JobState::Pending));
    store.commit(tx).expect("the first Lease term commits");
}
