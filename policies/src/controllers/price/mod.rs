//! Price deferral: deferrable jobs wait while electricity costs more than the threshold
//! (threshold mode), or until the start the planner gave them in the cheapest slots of
//! the price forecast that have room (plan mode); either way they are always released
//! by their latest start (deadline − duration − margin).

pub(crate) mod controller;
mod plan_mode;
pub mod planner;

use std::collections::BTreeMap;

use crate::index::{Held, JobTable};
use telemetry::metric::names::{DAY_PEAK_W, PERIOD_PEAK_W, PRICE_PER_KWH};
use telemetry::{Job, JobState, Site, Snapshot, Timestamp};

use self::plan_mode::evaluate_plan;
pub use crate::plan::hold_limit;
use crate::plan::round3;
use crate::plan::Hold;
use crate::policy::{OnStale, PriceMode, PriceRule};
pub use crate::stage::{Pacing, Verdict};
use crate::{Forecast, State};

/// The last moment a job may still be held under the price rule.
pub fn release_by(job: &Job, rule: &PriceRule) -> Timestamp {
    hold_limit(job, rule.margin_s, rule.max_defer_s)
}

/// The peak target released and planned work is paced under, and why it applies.
#[derive(Debug, Clone, PartialEq)]
pub struct PeakTarget {
    pub kw: f64,
    /// Why: the policy's `peak_target_kw`, or the automatic target's source.
    pub why: String,
    /// The readings the automatic target came from (kW): the billing period's peak so
    /// far and the last 24 hours' (see [`peak_target`]).
    pub period_peak_kw: Option<f64>,
    pub day_peak_kw: Option<f64>,
    /// Set by the tariff, not the policy: it paces releases only (see [`peak_target`]).
    pub automatic: bool,
}

/// The peak target in force: the policy's `peak_target_kw` when it gives one; else,
/// when the site's tariff has a demand charge, the billing period's peak so far (the
/// site reading `period_peak_w`: the highest demand-interval average of IT power this
/// period), floored by the highest demand interval of the last 24 hours (`day_peak_w`),
/// which only matters in a period's first day, when its own peak has seen less than a
/// day. Released work is then never what raises the billed peak. Neither reading: no
/// target (nothing measured yet to hold to). The automatic target paces the release of
/// held jobs only; plan mode still plans under its budget share: a plan under the
/// period's peak so far finds no room for most deferred work, and a job that fits
/// nowhere is released at once, unpaced, which raises the peak rather than shaving it.
pub fn peak_target(
    site: &Site,
    snapshot: &Snapshot,
    rule: &PriceRule,
    now: Timestamp,
) -> Option<PeakTarget> {
    if let Some(kw) = rule.peak_target_kw {
        return Some(PeakTarget {
            kw,
            why: "peak_target_kw of the policy".into(),
            period_peak_kw: None,
            day_peak_kw: None,
            automatic: false,
        });
    }
    let charge = site.tariff.as_ref().and_then(|t| t.demand_charge_per_kw);
    if !charge.is_some_and(|c| c > 0.0) {
        return None;
    }
    let read = |m: &str| {
        snapshot
            .observe(&site.site_entity(), m, now)
            .filter(|o| o.usable())
            .map(|o| o.value / 1000.0)
    };
    let (period, day) = (read(PERIOD_PEAK_W), read(DAY_PEAK_W));
    let why = match (period, day) {
        (Some(p), Some(d)) if d > p => format!(
            "automatic: the last 24 hours' peak {d:.1} kW, above the billing period's so far ({p:.1} kW) early in the period"
        ),
        (Some(p), _) => format!("automatic: the billing period's peak so far {p:.1} kW"),
        (None, Some(d)) => format!(
            "automatic: the last 24 hours' peak {d:.1} kW (no demand interval of this billing period closed yet)"
        ),
        (None, None) => return None,
    };
    Some(PeakTarget {
        kw: period.unwrap_or(0.0).max(day.unwrap_or(0.0)),
        why,
        period_peak_kw: period,
        day_peak_kw: day,
        automatic: true,
    })
}

/// The planned start of every job the price rule holds for a planned start.
pub type PlannedStarts = BTreeMap<String, Timestamp>;

/// A verdict for every job the rule is concerned with, and the values it looked at.
/// `facility_kw` is the facility's budget (the policy's contract limit where it sets
/// one): the planner plans under its `plan_budget_share`.
#[allow(clippy::too_many_arguments)]
pub fn evaluate(
    site: &Site,
    facility_kw: f64,
    snapshot: &Snapshot,
    jobs: &[Job],
    prior: &State,
    rule: &PriceRule,
    pacing: Option<Pacing>,
    forecast: &Forecast,
    now: Timestamp,
) -> (BTreeMap<String, Verdict>, BTreeMap<String, f64>) {
    let (v, values, _) = evaluate_with_starts(
        site,
        facility_kw,
        snapshot,
        jobs,
        &JobTable::new(site, jobs),
        prior,
        rule,
        pacing,
        forecast,
        now,
    );
    (v, values)
}

/// [`evaluate`], with the planned start of each job held for one (plan mode).
#[allow(clippy::too_many_arguments)]
pub fn evaluate_with_starts(
    site: &Site,
    facility_kw: f64,
    snapshot: &Snapshot,
    jobs: &[Job],
    table: &JobTable,
    prior: &State,
    rule: &PriceRule,
    pacing: Option<Pacing>,
    forecast: &Forecast,
    now: Timestamp,
) -> (
    BTreeMap<String, Verdict>,
    BTreeMap<String, f64>,
    PlannedStarts,
) {
    let target = peak_target(site, snapshot, rule, now);
    if rule.mode == PriceMode::Plan {
        return evaluate_plan(
            site,
            facility_kw,
            jobs,
            table,
            prior,
            rule,
            pacing,
            target.as_ref(),
            forecast,
            now,
        );
    }
    let mut values = BTreeMap::new();
    values.insert("defer_above".to_string(), rule.defer_above);
    let obs = snapshot.observe(&site.site_entity(), PRICE_PER_KWH, now);
    let expensive = match obs {
        Some(o) if o.usable() => {
            values.insert("price_per_kwh".to_string(), round3(o.value));
            Some(o.value > rule.defer_above)
        }
        _ => match rule.on_stale {
            OnStale::AssumeWorst => Some(true),
            OnStale::HoldLast => None,
            OnStale::Ignore => Some(false),
        },
    };
    let holds = Held::new(&prior.holds, jobs, table);
    // every held job has the same reason: written once
    let hold_reason = match obs {
        Some(o) if o.usable() => {
            format!("price {:.3} above {:.3} per kWh", o.value, rule.defer_above)
        }
        _ => "price signal stale".to_string(),
    };
    let (verdicts, cheap_again) =
        threshold_verdicts(jobs, &holds, rule, expensive, &hold_reason, now);
    let reason = match obs {
        Some(o) if o.usable() => format!(
            "price {:.3} at or below {:.3} per kWh",
            o.value, rule.defer_above
        ),
        _ => "price signal stale: not deferring on an unknown price".to_string(),
    };
    // a job listed twice keeps its last verdict, as with one insert after another
    let mut out: BTreeMap<String, Verdict> = verdicts.into_iter().collect();
    pace(
        cheap_again,
        &reason,
        rule,
        pacing,
        target.as_ref(),
        now,
        &mut out,
        &mut values,
    );
    (out, values, PlannedStarts::new())
}

/// Threshold mode's verdicts in job order (holds while the price is `expensive`,
/// releases of the holds no longer the rule's), and the held jobs the price no longer
/// holds, to be released paced.
#[allow(clippy::type_complexity)]
fn threshold_verdicts<'j>(
    jobs: &'j [Job],
    holds: &Held<'j>,
    rule: &PriceRule,
    expensive: Option<bool>,
    hold_reason: &str,
    now: Timestamp,
) -> (Vec<(String, Verdict)>, Vec<(Timestamp, &'j Job, &'j Hold)>) {
    // the verdicts in job order, made into a map in one go (one insert per job into
    // a map of large values moves them about)
    let mut verdicts: Vec<(String, Verdict)> = Vec::new();
    let mut cheap_again: Vec<(Timestamp, &Job, &Hold)> = Vec::new();
    for (p, job) in jobs.iter().enumerate() {
        let eligible =
            job.deferrable && (rule.classes.is_empty() || rule.classes.contains(&job.class));
        let waiting = matches!(job.state, JobState::Pending | JobState::Held);
        let held = holds.get(p);
        if !eligible || !waiting {
            if held.is_some() {
                verdicts.push((
                    job.id.clone(),
                    Verdict::Release {
                        reason: "job no longer waiting or not deferrable".into(),
                    },
                ));
            }
            continue;
        }
        let by = release_by(job, rule);
        if now >= by {
            if held.is_some() {
                verdicts.push((
                    job.id.clone(),
                    Verdict::Release {
                        reason: format!("latest start {by} reached"),
                    },
                ));
            }
            continue;
        }
        let hold = match expensive {
            Some(true) => true,
            Some(false) => false,
            None => held.is_some(),
        };
        if hold {
            let lease_until = (now + rule.lease_s).min(by);
            let reason = hold_reason.to_string();
            verdicts.push((
                job.id.clone(),
                Verdict::Hold(Hold {
                    rule: "price.defer".into(),
                    since: held.map_or(now, |h| h.since),
                    lease_until,
                    reason,
                }),
            ));
        } else if let Some(h) = held {
            cheap_again.push((by, job, h));
        }
    }
    (verdicts, cheap_again)
}

/// Releases held jobs whose time has come, most urgent first, as far as the facility's
/// headroom allows; the rest stay held a tick longer.
#[allow(clippy::too_many_arguments)]
fn pace(
    mut cheap_again: Vec<(Timestamp, &Job, &Hold)>,
    reason: &str,
    rule: &PriceRule,
    pacing: Option<Pacing>,
    target: Option<&PeakTarget>,
    now: Timestamp,
    out: &mut BTreeMap<String, Verdict>,
    values: &mut BTreeMap<String, f64>,
) {
    cheap_again.sort_by(|a, b| (a.0, &a.1.id).cmp(&(b.0, &b.1.id)));
    // the headroom already counts queued jobs that are free to start; under a peak
    // target, released work also keeps the facility at or under it
    let mut room = pacing.map_or(f64::INFINITY, |p| p.headroom_w);
    let mut wait = "waiting for power headroom".to_string();
    if let Some(p) = pacing {
        values.insert("headroom_kw".to_string(), round3(p.headroom_w / 1000.0));
        if let Some(t) = target {
            let under = t.kw * 1000.0 - p.demand_w;
            if under < room {
                wait = format!(
                    "waiting for room under the peak target {:.1} kW ({})",
                    t.kw, t.why
                );
            }
            room = room.min(under);
            target_values(t, values);
        }
    }
    for (by, job, h) in cheap_again {
        let need = pacing.map_or(0.0, |p| p.watts_per_gpu * f64::from(job.gpus));
        if need <= room {
            room -= need;
            out.insert(
                job.id.clone(),
                Verdict::Release {
                    reason: reason.to_string(),
                },
            );
        } else {
            out.insert(
                job.id.clone(),
                Verdict::Hold(Hold {
                    rule: "price.defer".into(),
                    since: h.since,
                    lease_until: (now + rule.lease_s).min(by),
                    reason: format!("{reason}; {wait}"),
                }),
            );
        }
    }
}

/// The peak target's figures, for `policy explain` and the audit record.
fn target_values(t: &PeakTarget, values: &mut BTreeMap<String, f64>) {
    values.insert("peak_target_kw".to_string(), round3(t.kw));
    if let Some(p) = t.period_peak_kw {
        values.insert("period_peak_kw".to_string(), round3(p));
    }
    if let Some(d) = t.day_peak_kw {
        values.insert("day_peak_kw".to_string(), round3(d));
    }
}

/// Whether a job is the rule's to defer, and waiting.
fn eligible(job: &Job, rule: &PriceRule) -> bool {
    job.deferrable && (rule.classes.is_empty() || rule.classes.contains(&job.class))
}

/// What a busy GPU of this site may draw (its default limit plus its share of its
/// node's base power), and the site's idle floor (every GPU idle, every node at half
/// its base power), in W.
fn site_power_model(site: &Site) -> (f64, f64, u32) {
    // by node, not by GPU: this runs every tick and a site may have thousands of GPUs
    let (mut busy, mut floor, mut n) = (0.0, 0.0, 0u32);
    for node in &site.nodes {
        let Some(model) = site.gpu_models.get(&node.gpu_model) else {
            continue;
        };
        let g = f64::from(node.gpus);
        busy += g * model.default_w + if node.gpus > 0 { node.base_w } else { 0.0 };
        floor += g * model.idle_w + 0.5 * node.base_w;
        n += node.gpus;
    }
    (busy / f64::from(n.max(1)), floor, n)
}

#[cfg(test)]
mod plan_tests;
