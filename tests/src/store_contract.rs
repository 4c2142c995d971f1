//! What every store backend must do. Each function takes a way to open the same store
//! again (a restart) and panics with a message that names the broken promise.

use integrations::store::{Store, Tx};
use policies::State;
use telemetry::JobState;

use crate::fixtures::{decision, job, ledger, state_a, state_b};

/// A new store holds nothing.
pub fn starts_empty(store: &mut Store) {
    assert_eq!(store.audit_len().expect("audit_len"), 0);
    assert_eq!(store.ledger_len().expect("ledger_len"), 0);
    assert!(store.jobs().expect("jobs").is_empty());
    assert_eq!(store.state().expect("state"), State::default());
    assert!(store.audit(1, 10).expect("audit").is_empty());
}

/// What one commit writes reads back the same, logs numbered from 1 in order.
pub fn reads_back_what_it_commits(store: &mut Store) {
    let mut tx = Tx::new();
    for i in 0..5 {
        tx.audit(&decision(i));
    }
    tx.ledger(&ledger(0)).ledger(&ledger(1));
    tx.put_job(&job("slurm:7", JobState::Held))
        .put_job(&job("slurm:8", JobState::Pending));
    tx.state(&State::default(), &state_a());
    store.commit(tx).expect("commit");

    let audit = store.audit(1, 100).expect("audit");
    assert_eq!(
        audit.iter().map(|a| a.0).collect::<Vec<_>>(),
        vec![1, 2, 3, 4, 5]
    );
    assert_eq!(
        audit.iter().map(|a| a.1.clone()).collect::<Vec<_>>(),
        (0..5).map(decision).collect::<Vec<_>>()
    );
    let page = store.audit(3, 2).expect("audit page");
    assert_eq!(
        page.iter().map(|a| a.0).collect::<Vec<_>>(),
        vec![3, 4],
        "from 3, at most 2"
    );
    assert_eq!(page[0].1, decision(2));
    assert!(store.audit(6, 10).expect("past the end").is_empty());
    assert_eq!(
        store
            .ledger(1, 10)
            .expect("ledger")
            .iter()
            .map(|e| e.1.clone())
            .collect::<Vec<_>>(),
        vec![ledger(0), ledger(1)]
    );
    assert_eq!(
        store.job("slurm:7").expect("job"),
        Some(job("slurm:7", JobState::Held))
    );
    assert_eq!(store.job("slurm:9").expect("job"), None);
    assert_eq!(
        store
            .jobs()
            .expect("jobs")
            .iter()
            .map(|j| j.id.as_str())
            .collect::<Vec<_>>(),
        vec!["slurm:7", "slurm:8"]
    );
    assert_eq!(store.state().expect("state"), state_a());

    // a second commit appends after the first and changes only what changed
    let mut tx = Tx::new();
    tx.audit(&decision(5));
    tx.put_job(&job("slurm:7", JobState::Running));
    tx.delete_job("slurm:8");
    tx.state(&state_a(), &state_b());
    store.commit(tx).expect("second commit");
    assert_eq!(store.audit_len().expect("len"), 6);
    assert_eq!(store.audit(6, 1).expect("audit")[0], (6, decision(5)));
    assert_eq!(
        store.state().expect("state"),
        state_b(),
        "removed caps and holds are gone"
    );
    assert_eq!(
        store.jobs().expect("jobs"),
        vec![job("slurm:7", JobState::Running)]
    );
}

/// Everything survives closing the store and opening it again.
pub fn survives_a_restart(mut open: impl FnMut() -> Store) {
    {
        let mut store = open();
        let mut tx = Tx::new();
        tx.audit(&decision(0))
            .audit(&decision(1))
            .ledger(&ledger(0))
            .put_job(&job("slurm:7", JobState::Held));
        tx.state(&State::default(), &state_a());
        store.commit(tx).expect("commit");
    }
    let mut store = open();
    assert_eq!(store.audit_len().expect("len"), 2);
    assert_eq!(
        store
            .audit(1, 10)
            .expect("audit")
            .into_iter()
            .map(|a| a.1)
            .collect::<Vec<_>>(),
        vec![decision(0), decision(1)]
    );
    assert_eq!(store.ledger(1, 10).expect("ledger")[0].1, ledger(0));
    assert_eq!(
        store.jobs().expect("jobs"),
        vec![job("slurm:7", JobState::Held)]
    );
    assert_eq!(
        store.state().expect("state"),
        state_a(),
        "caps, holds and leases restored"
    );
    // and appending continues the numbering
    let mut tx = Tx::new();
    tx.audit(&decision(2));
    store.commit(tx).expect("commit after restart");
    assert_eq!(store.audit(3, 1).expect("audit")[0], (3, decision(2)));
}

/// An empty transaction is a no-op.
pub fn empty_commit_is_a_no_op(store: &mut Store) {
    store.commit(Tx::new()).expect("empty commit");
    assert_eq!(store.audit_len().expect("len"), 0);
}
