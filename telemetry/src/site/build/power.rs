//! The power path: feeds, and PDUs with their branches and outlets.

use super::*;

/// The feeds, and their ids for the PDUs' references.
pub(super) fn build_feeds(raw: &[RawFeed], c: &mut Collector) -> (BTreeSet<String>, Vec<Feed>) {
    let mut feed_ids = BTreeSet::new();
    let mut feeds = Vec::new();
    for f in raw {
        check_id(c, &mut feed_ids, "feed", &f.id);
        let what = format!("feed {:?}: rating_kw", f.id.get_ref());
        feeds.push(Feed {
            id: f.id.get_ref().clone(),
            rating_kw: check_range(c, &f.rating_kw, &what, 0.001, 1_000_000.0),
            derate: opt_range(
                c,
                &f.derate,
                &format!("feed {:?}: derate", f.id.get_ref()),
                0.01,
                1.0,
                DEFAULT_DERATE,
            ),
        });
    }
    if raw.is_empty() {
        c.at(
            0..0,
            "the site needs at least one [[feeds]] entry (its utility supply)",
        );
    }
    (feed_ids, feeds)
}

/// The PDUs, and their ids for the racks' references.
pub(super) fn build_pdus(
    raw: &[RawPdu],
    feed_ids: &BTreeSet<String>,
    c: &mut Collector,
) -> (BTreeSet<String>, Vec<Pdu>) {
    let mut pdu_ids = BTreeSet::new();
    let mut pdus = Vec::new();
    for p in raw {
        check_id(c, &mut pdu_ids, "pdu", &p.id);
        let pid = p.id.get_ref().clone();
        check_ref(c, feed_ids, "feed", &format!("pdu {pid:?}"), &p.feed);
        let rating_kw = check_range(
            c,
            &p.rating_kw,
            &format!("pdu {pid:?}: rating_kw"),
            0.001,
            10_000.0,
        );
        let (branch_ids, branches) = build_branches(p, &pid, rating_kw, c);
        let outlets = build_outlets(p, &pid, &branch_ids, c);
        pdus.push(Pdu {
            id: pid.clone(),
            feed: p.feed.get_ref().clone(),
            rating_kw,
            derate: opt_range(
                c,
                &p.derate,
                &format!("pdu {pid:?}: derate"),
                0.01,
                1.0,
                DEFAULT_DERATE,
            ),
            branches,
            outlets,
        });
    }
    (pdu_ids, pdus)
}

/// A PDU's branches, none rated above the PDU itself.
fn build_branches(
    p: &RawPdu,
    pid: &str,
    rating_kw: f64,
    c: &mut Collector,
) -> (BTreeSet<String>, Vec<Branch>) {
    let mut branch_ids = BTreeSet::new();
    let mut branches = Vec::new();
    for b in &p.branches {
        check_id(c, &mut branch_ids, &format!("pdu {pid:?} branch"), &b.id);
        let r = check_range(
            c,
            &b.rating_kw,
            &format!("pdu {pid:?} branch {:?}: rating_kw", b.id.get_ref()),
            0.001,
            10_000.0,
        );
        if r > rating_kw {
            c.at(
                span(&b.rating_kw),
                format!(
                    "pdu {pid:?} branch {:?}: rating_kw {r} exceeds the pdu's own {rating_kw}",
                    b.id.get_ref()
                ),
            );
        }
        branches.push(Branch {
            id: b.id.get_ref().clone(),
            rating_kw: r,
        });
    }
    (branch_ids, branches)
}

/// A PDU's outlets, each on a branch of the PDU when it names one.
fn build_outlets(
    p: &RawPdu,
    pid: &str,
    branch_ids: &BTreeSet<String>,
    c: &mut Collector,
) -> Vec<Outlet> {
    let mut outlet_ids = BTreeSet::new();
    let mut outlets = Vec::new();
    for o in &p.outlets {
        let oid = o.id.get_ref();
        check_id(c, &mut outlet_ids, &format!("pdu {pid:?} outlet"), &o.id);
        let r = check_range(
            c,
            &o.rating_kw,
            &format!("pdu {pid:?} outlet {oid:?}: rating_kw"),
            0.001,
            100.0,
        );
        if let Some(b) = &o.branch {
            check_ref(
                c,
                branch_ids,
                "branch",
                &format!("pdu {pid:?} outlet {oid:?}"),
                b,
            );
        }
        outlets.push(Outlet {
            id: oid.clone(),
            branch: o.branch.as_ref().map(|b| b.get_ref().clone()),
            rating_kw: r,
        });
    }
    outlets
}
