//! The report built from the ledger and the audit log: the entries grouped, held and
//! capped time from the decisions, the total, and the caps over time.

use std::collections::BTreeMap;

use chrono_tz::Tz;
use integrations::store::{Account, LedgerEntry};
use policies::plan::{Action, Target};
use policies::Decision;
use telemetry::Timestamp;

use super::{EnergyReport, GroupBy, Row};

pub(super) fn key_of(e: &LedgerEntry, by: GroupBy, tz: Tz) -> String {
    let acct = |f: &dyn Fn(&str, &str, &str) -> String| match &e.account {
        Account::Job { job, project, user } => f(job, project, user),
        Account::Idle => "(idle)".to_string(),
        Account::Overhead => "(overhead)".to_string(),
    };
    match by {
        GroupBy::Job => acct(&|j, _, _| j.to_string()),
        GroupBy::Project => acct(&|_, p, _| p.to_string()),
        GroupBy::User => acct(&|_, _, u| u.to_string()),
        GroupBy::Rack => e.rack.clone().unwrap_or_else(|| "(facility)".into()),
        GroupBy::Day => e
            .start
            .to_datetime()
            .with_timezone(&tz)
            .format("%Y-%m-%d")
            .to_string(),
    }
}

/// Seconds between a start and an end decision per target, from the audit log, clipped
/// to the period. `start`/`end` say which actions open and close.
pub(super) fn spans(
    audit: &[Decision],
    from: Timestamp,
    to: Timestamp,
    open: fn(&Action) -> bool,
    close: fn(&Action) -> bool,
    key: impl Fn(&Target) -> Vec<String>,
) -> BTreeMap<String, f64> {
    let mut since: BTreeMap<String, Timestamp> = BTreeMap::new();
    let mut total: BTreeMap<String, f64> = BTreeMap::new();
    for d in audit.iter().filter(|d| !d.observe_only) {
        for k in key(&d.target) {
            if open(&d.action) {
                since.entry(k).or_insert(d.time);
            } else if close(&d.action) {
                if let Some(s) = since.remove(&k) {
                    let (a, b) = (s.max(from), d.time.min(to));
                    *total.entry(k).or_default() += b.secs_since(a).max(0.0);
                }
            }
        }
    }
    for (k, s) in since {
        let a = s.max(from);
        *total.entry(k).or_default() += to.secs_since(a).max(0.0);
    }
    total
}

/// Builds the report of `[from, to)` from the ledger and the audit log. `gpu_racks`
/// names the rack of each GPU (`gpu/a01-n01:0` → `a01`).
#[allow(clippy::too_many_arguments)]
pub fn build(
    gpu_racks: &BTreeMap<String, String>,
    ledger: &[LedgerEntry],
    audit: &[Decision],
    by: GroupBy,
    tz: Tz,
    currency: &str,
    from: Timestamp,
    to: Timestamp,
) -> EnergyReport {
    let entries: Vec<&LedgerEntry> = ledger
        .iter()
        .filter(|e| e.start >= from && e.start < to)
        .collect();
    let Groups {
        mut rows,
        facility,
        job_groups,
    } = Groups::of(&entries, by, tz);
    let held = held_spans(audit, from, to);
    let capped = capped_spans(audit, from, to);
    let unplaced_held = place_spans(by, &held, &capped, &job_groups, gpu_racks, &mut rows);
    let total = total_of(&rows, &facility, &capped, &held);
    let capped_over_time = capped_over_time(audit, from, to);
    let mut rows: Vec<Row> = rows.into_values().collect();
    rows.sort_by(|a, b| {
        b.energy_kwh
            .total_cmp(&a.energy_kwh)
            .then(a.key.cmp(&b.key))
    });
    if by == GroupBy::Day {
        rows.sort_by(|a, b| a.key.cmp(&b.key));
    }
    let overhead: f64 = entries
        .iter()
        .filter(|e| e.account == Account::Overhead)
        .map(|e| e.energy_kwh)
        .sum();
    let it = total.energy_kwh - overhead;
    let pue = (overhead > 0.0 && it > 0.0).then(|| total.energy_kwh / it);
    EnergyReport {
        site: String::new(),
        pue,
        from,
        to,
        group_by: format!("{by:?}").to_lowercase(),
        currency: currency.to_string(),
        rows,
        total,
        intervals: facility
            .into_iter()
            .map(|((s, e), (k, c))| (s, e, k, c))
            .collect(),
        capped_over_time,
        inlets: Vec::new(),
        unplaced_held,
        demand_charge: None,
        total_cost: None,
        demand_periods: Vec::new(),
        demand_response: Vec::new(),
    }
}

/// The ledger entries added up per group (with each group's peak over one ledger
/// interval) and per ledger interval for the whole facility.
struct Groups {
    rows: BTreeMap<String, Row>,
    /// Per ledger interval: the facility's kWh and cost.
    facility: BTreeMap<(Timestamp, Timestamp), (f64, f64)>,
    /// The group of each job.
    job_groups: BTreeMap<String, String>,
}

impl Groups {
    fn of(entries: &[&LedgerEntry], by: GroupBy, tz: Tz) -> Self {
        // per group, per interval: kWh (for the peak)
        let mut rows: BTreeMap<String, Row> = BTreeMap::new();
        let mut per_interval: BTreeMap<(String, Timestamp, Timestamp), f64> = BTreeMap::new();
        let mut facility: BTreeMap<(Timestamp, Timestamp), (f64, f64)> = BTreeMap::new();
        let mut job_groups: BTreeMap<String, String> = BTreeMap::new();
        for e in entries {
            let k = key_of(e, by, tz);
            let r = rows.entry(k.clone()).or_insert_with(|| Row {
                key: k.clone(),
                ..Row::default()
            });
            r.energy_kwh += e.energy_kwh;
            r.estimated_kwh += e.integrated_kwh;
            r.cost += e.cost;
            r.carbon_kg += e.carbon_kg;
            *per_interval.entry((k.clone(), e.start, e.end)).or_default() += e.energy_kwh;
            let f = facility.entry((e.start, e.end)).or_default();
            f.0 += e.energy_kwh;
            f.1 += e.cost;
            if let Account::Job { job, .. } = &e.account {
                job_groups.insert(job.clone(), k);
            }
        }
        for ((k, s, e), kwh) in per_interval {
            let h = e.secs_since(s) / 3600.0;
            if h > 0.0 {
                if let Some(r) = rows.get_mut(&k) {
                    r.peak_kw = r.peak_kw.max(kwh / h);
                }
            }
        }
        Groups {
            rows,
            facility,
            job_groups,
        }
    }
}

/// Held time per job, from hold/release decisions.
fn held_spans(audit: &[Decision], from: Timestamp, to: Timestamp) -> BTreeMap<String, f64> {
    spans(
        audit,
        from,
        to,
        |a| matches!(a, Action::Hold { .. }),
        |a| matches!(a, Action::Release),
        |t| match t {
            Target::Job { job } => vec![job.clone()],
            _ => Vec::new(),
        },
    )
}

/// Capped time per GPU, from cap/uncap decisions.
fn capped_spans(audit: &[Decision], from: Timestamp, to: Timestamp) -> BTreeMap<String, f64> {
    spans(
        audit,
        from,
        to,
        |a| matches!(a, Action::Cap { .. }),
        |a| matches!(a, Action::Uncap),
        |t| match t {
            Target::Gpus { gpus, .. } => gpus.iter().map(|g| g.to_string()).collect(),
            _ => Vec::new(),
        },
    )
}

/// Held hours under their job's group (by job, project or user), capped GPU-hours
/// under their rack (by rack). Returns the held hours of jobs that never ran in the
/// period (placed by `with_jobs`).
fn place_spans(
    by: GroupBy,
    held: &BTreeMap<String, f64>,
    capped: &BTreeMap<String, f64>,
    job_groups: &BTreeMap<String, String>,
    gpu_racks: &BTreeMap<String, String>,
    rows: &mut BTreeMap<String, Row>,
) -> BTreeMap<String, f64> {
    let mut unplaced_held: BTreeMap<String, f64> = BTreeMap::new();
    let rack_of = |gpu: &str| gpu_racks.get(gpu).cloned();
    match by {
        GroupBy::Job | GroupBy::Project | GroupBy::User => {
            for (job, s) in held {
                let k = match by {
                    GroupBy::Job => Some(job.clone()),
                    _ => job_groups.get(job).cloned(),
                };
                match k.and_then(|k| rows.get_mut(&k)) {
                    Some(r) => *r.held_hours.get_or_insert(0.0) += s / 3600.0,
                    // held and never run in the period: placed by `with_jobs`
                    None => {
                        unplaced_held.insert(job.clone(), s / 3600.0);
                    }
                }
            }
        }
        GroupBy::Rack => {
            for (gpu, s) in capped {
                if let Some(r) = rack_of(gpu).and_then(|k| rows.get_mut(&k)) {
                    *r.capped_gpu_hours.get_or_insert(0.0) += s / 3600.0;
                }
            }
        }
        GroupBy::Day => {}
    }
    unplaced_held
}

/// The total row: the groups' sums, the facility's peak over one ledger interval, and
/// the capped and held hours of the period.
fn total_of(
    rows: &BTreeMap<String, Row>,
    facility: &BTreeMap<(Timestamp, Timestamp), (f64, f64)>,
    capped: &BTreeMap<String, f64>,
    held: &BTreeMap<String, f64>,
) -> Row {
    let mut total = Row {
        key: "total".into(),
        ..Row::default()
    };
    for r in rows.values() {
        total.energy_kwh += r.energy_kwh;
        total.estimated_kwh += r.estimated_kwh;
        total.cost += r.cost;
        total.carbon_kg += r.carbon_kg;
    }
    for ((s, e), (kwh, _)) in facility {
        let h = e.secs_since(*s) / 3600.0;
        if h > 0.0 {
            total.peak_kw = total.peak_kw.max(kwh / h);
        }
    }
    total.capped_gpu_hours = Some(capped.values().sum::<f64>() / 3600.0);
    total.held_hours = Some(held.values().sum::<f64>() / 3600.0);
    total
}

/// GPUs capped over time in the period, replaying the audit log.
fn capped_over_time(audit: &[Decision], from: Timestamp, to: Timestamp) -> Vec<(Timestamp, usize)> {
    let mut now_capped: std::collections::BTreeSet<String> = Default::default();
    let mut capped_over_time = Vec::new();
    for d in audit.iter().filter(|d| !d.observe_only && d.time < to) {
        if let Target::Gpus { gpus, .. } = &d.target {
            match d.action {
                Action::Cap { .. } => now_capped.extend(gpus.iter().map(|g| g.to_string())),
                Action::Uncap => {
                    for g in gpus {
                        now_capped.remove(&g.to_string());
                    }
                }
                _ => continue,
            }
            if d.time >= from {
                capped_over_time.push((d.time, now_capped.len()));
            }
        }
    }
    capped_over_time
}
