use super::*;

fn logs(tx: &Tx) -> Vec<(String, String)> {
    tx.batch()
        .ops
        .iter()
        .map(|op| match op {
            Op::Put {
                collection, key, ..
            } => (format!("put {collection}"), key.clone()),
            Op::Delete { collection, key } => (format!("delete {collection}"), key.clone()),
            Op::Append { log, value } => (
                format!("append {log}"),
                String::from_utf8_lossy(value).into_owned(),
            ),
            Op::Fence { epoch } => ("fence".into(), epoch.to_string()),
        })
        .collect()
}

#[test]
fn compacting_keeps_the_last_write_of_each_key_and_every_append_in_order() {
    let mut tx = Tx::new();
    tx.put_record(JOBS, "a", &1)
        .append_record(AUDIT, &"x")
        .put_record(JOBS, "b", &2)
        .put_record(JOBS, "a", &3)
        .append_record(LEDGER, &"y")
        .delete_record(JOBS, "b")
        .put_record(CAPS, "b", &4);
    tx.compact();
    assert_eq!(
        logs(&tx),
        vec![
            ("append audit".into(), "\"x\"".into()),
            ("put jobs".into(), "a".into()),
            ("append ledger".into(), "\"y\"".into()),
            ("delete jobs".into(), "b".into()),
            ("put caps".into(), "b".into()),
        ]
    );
}

#[test]
fn shedding_drops_the_oldest_conditions_then_audit_and_the_ledger_last() {
    let mut tx = Tx::new();
    for i in 0..10 {
        tx.append_record(CONDITIONS, &format!("c{i:02}"))
            .append_record(AUDIT, &format!("a{i:02}"))
            .append_record(LEDGER, &format!("l{i:02}"));
    }
    tx.put_record(JOBS, "j", &"kept");
    let full = tx.bytes();
    let one = full / 31; // about one record
                         // room for all but about 12 records: the 10 conditions and the 2 oldest audits go
    let dropped = tx.shed(full - 12 * one);
    assert_eq!(dropped.get(CONDITIONS), Some(&10));
    assert!(dropped.get(AUDIT).is_some_and(|n| (1..=3).contains(n)));
    assert_eq!(dropped.get(LEDGER), None);
    assert!(tx.bytes() <= full - 12 * one);
    let left = logs(&tx);
    assert!(left.contains(&("append audit".into(), "\"a09\"".into())));
    assert!(!left.contains(&("append audit".into(), "\"a00\"".into())));
    assert_eq!(left.iter().filter(|l| l.0 == "append ledger").count(), 10);
    // a bound below what the puts hold: every append goes, the put stays
    let dropped = tx.shed(0);
    assert!(dropped.get(LEDGER) == Some(&10));
    assert_eq!(logs(&tx), vec![("put jobs".into(), "j".into())]);
    // within the bound: nothing dropped
    assert!(tx.shed(usize::MAX).is_empty());
}
