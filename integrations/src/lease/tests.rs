//! The election's invariants on a fake clock and store: never two replicas acting on
//! an unexpired lease at once; every term's epoch above every earlier one.

use super::*;
use proptest::prelude::*;

/// What the test does next.
#[derive(Debug, Clone)]
enum Move {
    /// Replica `who` runs one round; the request reaches the store `latency_ms` later.
    Step { who: usize, latency_ms: u64 },
    /// Time passes (every replica may be paused meanwhile).
    Wait { ms: u64 },
    /// The store goes down or comes back.
    Flip,
    /// The store's replies start or stop missing their deadline (the calls still run).
    LoseReplies,
    /// Replica `who` shuts down cleanly.
    Resign { who: usize },
}

fn moves() -> impl Strategy<Value = Vec<Move>> {
    let one = prop_oneof![
        6 => (0..3usize, 0..400u64).prop_map(|(who, latency_ms)| Move::Step { who, latency_ms }),
        3 => (0..4000u64).prop_map(|ms| Move::Wait { ms }),
        1 => Just(Move::Flip),
        1 => Just(Move::LoseReplies),
        1 => (0..3usize).prop_map(|who| Move::Resign { who }),
    ];
    proptest::collection::vec(one, 1..300)
}

fn timing() -> Timing {
    Timing::from_secs(5.0, 1.0)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn never_two_leaders_and_epochs_only_grow(moves in moves()) {
        let mut store = FakeLeaseStore::default();
        let mut replicas: Vec<Election> =
            (0..3).map(|i| Election::new(&format!("r{i}"), timing())).collect();
        let mut now = 0u64;
        let mut last_epoch = 0u64;
        for m in moves {
            match m {
                Move::Step { who, latency_ms } => {
                    let sent = now;
                    now += latency_ms;
                    store.now_ms = now;
                    if let Change::Elected { epoch } = replicas[who].step(&mut store, sent) {
                        prop_assert!(epoch > last_epoch, "epoch {epoch} after {last_epoch}");
                        last_epoch = epoch;
                    }
                }
                Move::Wait { ms } => {
                    now += ms;
                    store.now_ms = now;
                }
                Move::Flip => store.down = !store.down,
                Move::LoseReplies => store.replies_lost = !store.replies_lost,
                Move::Resign { who } => {
                    replicas[who].resign(Some(&mut store));
                }
            }
            let acting: Vec<_> = replicas.iter().filter_map(|r| r.acting(now)).collect();
            prop_assert!(acting.len() <= 1, "at {now} ms, acting under epochs {acting:?}");
            // one acting replica holds the store's unexpired lease of its own term
            if let Some(e) = acting.first() {
                if !store.down && !store.replies_lost {
                    prop_assert_eq!(store.current().map(|h| h.epoch), Some(*e));
                }
            }
        }
    }
}

#[test]
fn a_leader_that_cannot_renew_stops_acting_before_its_lease_ends() {
    let mut store = FakeLeaseStore::default();
    let mut a = Election::new("a", timing());
    assert_eq!(a.step(&mut store, 0), Change::Elected { epoch: 1 });
    assert_eq!(a.acting(0), Some(1));
    store.down = true;
    // renewals fail; the term holds until lease minus margin (5 s - 1 s)
    assert_eq!(a.step(&mut store, 1000), Change::None);
    assert_eq!(a.acting(3999), Some(1));
    assert_eq!(
        a.acting(4000),
        None,
        "stopped before the lease's end at 5000 ms"
    );
    assert_eq!(
        a.step(&mut store, 4500),
        Change::Deposed {
            epoch: 1,
            why: "lease_ran_out"
        }
    );
}

#[test]
fn a_paused_leader_finds_itself_deposed_and_the_next_term_has_a_larger_epoch() {
    let mut store = FakeLeaseStore::default();
    let (mut a, mut b) = (Election::new("a", timing()), Election::new("b", timing()));
    assert_eq!(a.step(&mut store, 0), Change::Elected { epoch: 1 });
    assert_eq!(b.step(&mut store, 10), Change::None);
    assert_eq!(
        b.role(),
        &Role::Follower {
            leader: Some(Holder {
                instance: "a".into(),
                epoch: 1
            })
        }
    );
    // a is paused past its lease; b takes over
    store.now_ms = 6000;
    assert_eq!(b.step(&mut store, 6000), Change::Elected { epoch: 2 });
    // a resumes: it does not act (its own clock says the term ran out) and its
    // renewal is refused
    assert_eq!(a.acting(6001), None);
    assert_eq!(
        a.step(&mut store, 6001),
        Change::Deposed {
            epoch: 1,
            why: "renewal_refused"
        }
    );
    assert_eq!(b.acting(6001), Some(2));
}

#[test]
fn a_clean_shutdown_gives_the_lease_back() {
    let mut store = FakeLeaseStore::default();
    let (mut a, mut b) = (Election::new("a", timing()), Election::new("b", timing()));
    a.step(&mut store, 0);
    assert!(matches!(
        a.resign(Some(&mut store)),
        Change::Deposed { epoch: 1, .. }
    ));
    assert_eq!(b.step(&mut store, 1), Change::Elected { epoch: 2 });
    assert_eq!((a.transitions, b.transitions), (2, 1));
}

#[test]
fn a_take_over_whose_reply_was_lost_is_taken_up_at_the_next_round_not_waited_out() {
    let mut store = FakeLeaseStore::default();
    let (mut a, mut b) = (Election::new("a", timing()), Election::new("b", timing()));
    // a stalled store runs a's take-over after a's deadline: the key names a, a
    // does not know it
    store.replies_lost = true;
    assert_eq!(a.step(&mut store, 0), Change::None);
    assert_eq!(a.acting(0), None);
    assert_eq!(store.current().map(|h| h.epoch), Some(1));
    store.replies_lost = false;
    // b finds the term taken; a, one renewal later, reads its own term back and leads
    store.now_ms = 1000;
    assert_eq!(b.step(&mut store, 1000), Change::None);
    assert_eq!(a.step(&mut store, 1000), Change::Elected { epoch: 1 });
    assert_eq!(a.acting(1000), Some(1));
    // its lease counts from that round (renewed then), not from the lost take-over
    assert_eq!(a.acting(4999), Some(1));
    assert_eq!(store.holder.as_ref().map(|(_, exp)| *exp), Some(6000));
}

#[test]
fn a_term_of_its_own_it_already_led_is_not_taken_up_again() {
    let mut store = FakeLeaseStore::default();
    let mut a = Election::new("a", timing());
    assert_eq!(a.step(&mut store, 0), Change::Elected { epoch: 1 });
    // renewals lost until a's own clock ends the term (the store's lease, renewed by
    // the lost calls, still names a)
    store.replies_lost = true;
    assert_eq!(a.step(&mut store, 1000), Change::None);
    assert!(matches!(
        a.step(&mut store, 4500),
        Change::Deposed { epoch: 1, .. }
    ));
    assert_eq!(a.step(&mut store, 5000), Change::None);
    store.replies_lost = false;
    // epoch 1 is not a phantom: a waits, and the next term has a larger epoch
    assert_eq!(a.step(&mut store, 5500), Change::None);
    store.now_ms = 20_000;
    assert_eq!(a.step(&mut store, 20_000), Change::Elected { epoch: 2 });
}
