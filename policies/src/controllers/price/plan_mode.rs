//! Plan mode: every eligible waiting job gets a planned start in the cheapest slots of
//! the price forecast that have room ([`super::planner`]); jobs whose start is later
//! than now are held, held jobs whose start has come are released (paced).

use std::collections::BTreeMap;

use telemetry::{Job, JobState, Site, Timestamp};

use super::planner::{self, Capacity, Committed, Horizon, PlanJob, Schedule};
use super::{
    eligible, pace, release_by, site_power_model, target_values, Pacing, PeakTarget, PlannedStarts,
    Verdict,
};
use crate::forecast::StepSeries;
use crate::index::{Held, JobTable};
use crate::plan::round3;
use crate::plan::Hold;
use crate::policy::{OnStale, PriceRule};
use crate::{Forecast, State};

/// A job the planner places: it, the last moment it may be held, and its hold in force.
type Candidate<'j> = (&'j Job, Timestamp, Option<&'j Hold>);

/// Plan mode: every eligible waiting job gets a planned start; jobs whose start is
/// later than now are held, held jobs whose start has come are released (paced).
#[allow(clippy::too_many_arguments)]
pub(super) fn evaluate_plan(
    site: &Site,
    facility_kw: f64,
    jobs: &[Job],
    table: &JobTable,
    prior: &State,
    rule: &PriceRule,
    pacing: Option<Pacing>,
    target: Option<&PeakTarget>,
    forecast: &Forecast,
    now: Timestamp,
) -> (
    BTreeMap<String, Verdict>,
    BTreeMap<String, f64>,
    PlannedStarts,
) {
    let mut values = BTreeMap::new();
    let mut out = BTreeMap::new();
    let mut starts = PlannedStarts::new();
    let price_now = forecast.price.at(now).filter(|_| !forecast.stale);
    if let Some(p) = price_now {
        values.insert("price_per_kwh".to_string(), round3(p));
    }
    let (busy_w, floor_w, total_gpus) = site_power_model(site);
    let wpg = pacing.map_or(busy_w, |p| p.watts_per_gpu);
    let holds = Held::new(&prior.holds, jobs, table);
    let sorted = PlanInputs::sort(jobs, &holds, rule, wpg, now, &mut out);
    let Some(price_now) = price_now else {
        let paced = Paced {
            rule,
            pacing,
            target,
            now,
        };
        paced.on_stale_forecast(sorted.candidates, &mut out, &mut values);
        return (out, values, starts);
    };
    // planned load stays under the budget's share, and under the peak target
    let ceiling_kw = plan_ceiling_kw(facility_kw, rule, target, &mut values);
    let capacity = Capacity {
        gpus: total_gpus,
        power_w: ceiling_kw * 1000.0 - floor_w,
    };
    // carbon at a price, when the policy gives one, is part of what a slot costs
    let priced = carbon_priced(forecast, rule);
    let price_series = priced.as_ref().unwrap_or(&forecast.price);
    let schedule = sorted.plan(capacity, price_series, rule, now);
    values.insert("planned_jobs".to_string(), sorted.plan_jobs.len() as f64);
    let (ready, later) = hold_planned(
        sorted.candidates,
        &schedule,
        price_now,
        rule,
        now,
        &mut starts,
        &mut out,
    );
    values.insert("planned_later".to_string(), later as f64);
    let reason = format!("planned start reached (price {price_now:.3} per kWh)");
    pace(
        ready,
        &reason,
        rule,
        pacing,
        target,
        now,
        &mut out,
        &mut values,
    );
    (out, values, starts)
}

/// The waiting and running jobs sorted for the planner: the jobs it places, the load
/// committed already (running jobs, and waiting ones that start as soon as the
/// scheduler finds GPUs), and the candidates in the order of `plan_jobs`.
struct PlanInputs<'j> {
    plan_jobs: Vec<PlanJob>,
    committed: Vec<Committed>,
    candidates: Vec<Candidate<'j>>,
}

impl<'j> PlanInputs<'j> {
    /// The planner's schedule of the jobs it places, over the rule's horizon.
    fn plan(
        &self,
        capacity: Capacity,
        price: &StepSeries,
        rule: &PriceRule,
        now: Timestamp,
    ) -> Schedule {
        let horizon = Horizon {
            slot_s: rule.plan_slot_s,
            horizon_s: rule.plan_horizon_s,
        };
        planner::plan(
            &self.plan_jobs,
            &self.committed,
            capacity,
            price,
            horizon,
            now,
        )
    }

    /// Sorts the jobs; a held job that is no longer the rule's to hold is released
    /// (in `out`).
    fn sort(
        jobs: &'j [Job],
        holds: &Held<'j>,
        rule: &PriceRule,
        wpg: f64,
        now: Timestamp,
        out: &mut BTreeMap<String, Verdict>,
    ) -> PlanInputs<'j> {
        let mut plan_jobs = Vec::new();
        let mut committed = Vec::new();
        let mut candidates: Vec<Candidate<'j>> = Vec::new();
        for (p, job) in jobs.iter().enumerate() {
            let waiting = matches!(job.state, JobState::Pending | JobState::Held);
            let dur = job.est_duration_s.max(1.0);
            if job.state == JobState::Running {
                let end = job.start_time.map_or(now + dur, |s| s + dur);
                committed.push(Committed {
                    gpus: job.gpus,
                    watts: f64::from(job.gpus) * wpg,
                    until: end.max(now + 1.0),
                });
                continue;
            }
            if !waiting {
                continue;
            }
            let held = holds.get(p);
            // a job the planner does not place starts as soon as the scheduler finds
            // GPUs; its hold, if any, is released
            let mut starts_now = |out: &mut BTreeMap<String, Verdict>,
                                  reason: &dyn Fn() -> String| {
                if held.is_some() {
                    out.insert(job.id.clone(), Verdict::Release { reason: reason() });
                }
                committed.push(Committed {
                    gpus: job.gpus,
                    watts: f64::from(job.gpus) * wpg,
                    until: now + dur,
                });
            };
            if !eligible(job, rule) {
                starts_now(out, &|| "job no longer waiting or not deferrable".into());
                continue;
            }
            let by = release_by(job, rule);
            if now >= by {
                starts_now(out, &|| format!("latest start {by} reached"));
                continue;
            }
            // a planned start never makes the job slower than max_slowdown
            let plan_by = match rule.max_slowdown {
                Some(m) => by.min(job.submit_time + (m - 1.0).max(0.0) * dur),
                None => by,
            };
            if now >= plan_by {
                starts_now(out, &|| {
                    format!("max_slowdown {} reached", rule.max_slowdown.unwrap_or(0.0))
                });
                continue;
            }
            candidates.push((job, by, held));
            plan_jobs.push(PlanJob {
                id: job.id.clone(),
                gpus: job.gpus,
                watts: f64::from(job.gpus) * wpg,
                duration_s: dur,
                latest_start: plan_by,
                delay_cost_per_s: rule.delay_cost_per_gpu_hour * f64::from(job.gpus) / 3600.0,
            });
        }
        PlanInputs {
            plan_jobs,
            committed,
            candidates,
        }
    }
}

/// What releases are paced by.
struct Paced<'a> {
    rule: &'a PriceRule,
    pacing: Option<Pacing>,
    target: Option<&'a PeakTarget>,
    now: Timestamp,
}

impl Paced<'_> {
    /// No usable forecast: what `on_stale` says, for every candidate.
    fn on_stale_forecast(
        &self,
        candidates: Vec<Candidate<'_>>,
        out: &mut BTreeMap<String, Verdict>,
        values: &mut BTreeMap<String, f64>,
    ) {
        let Paced {
            rule,
            pacing,
            target,
            now,
        } = *self;
        let reason = "price forecast stale or missing".to_string();
        let mut ready = Vec::new();
        for (job, by, held) in candidates {
            let hold = match rule.on_stale {
                OnStale::AssumeWorst => true,
                OnStale::HoldLast => held.is_some(),
                OnStale::Ignore => false,
            };
            if hold {
                out.insert(
                    job.id.clone(),
                    Verdict::Hold(Hold {
                        rule: "price.defer".into(),
                        since: held.map_or(now, |h| h.since),
                        lease_until: (now + rule.lease_s).min(by),
                        reason: reason.clone(),
                    }),
                );
            } else if let Some(h) = held {
                ready.push((by, job, h));
            }
        }
        let why = format!("{reason}: not deferring on an unknown price");
        pace(ready, &why, rule, pacing, target, now, out, values);
    }
}

/// The most the planned load may draw, in kW: the budget's share, and under the peak
/// target (its figures in `values`) unless that is automatic.
fn plan_ceiling_kw(
    facility_kw: f64,
    rule: &PriceRule,
    target: Option<&PeakTarget>,
    values: &mut BTreeMap<String, f64>,
) -> f64 {
    match target {
        Some(t) => {
            target_values(t, values);
            if t.automatic {
                facility_kw * rule.plan_budget_share
            } else {
                (facility_kw * rule.plan_budget_share).min(t.kw)
            }
        }
        None => facility_kw * rule.plan_budget_share,
    }
}

/// The price with carbon at the policy's price added, where it gives one and there is
/// a carbon forecast; `None`: the price alone.
fn carbon_priced(forecast: &Forecast, rule: &PriceRule) -> Option<StepSeries> {
    match rule.carbon_price_per_kg {
        Some(cp) if cp > 0.0 && !forecast.carbon.points.is_empty() => {
            let pts = forecast
                .price
                .points
                .iter()
                .map(|&(t, v)| (t, v + forecast.carbon.at(t).unwrap_or(0.0) / 1000.0 * cp))
                .collect();
            Some(StepSeries::new(pts, forecast.price.last_step_s))
        }
        _ => None,
    }
}

/// Holds the candidates planned to start later (their starts in `starts`); returns the
/// held ones whose planned start has come, to be released paced, and how many wait.
#[allow(clippy::type_complexity)]
fn hold_planned<'j>(
    candidates: Vec<Candidate<'j>>,
    schedule: &Schedule,
    price_now: f64,
    rule: &PriceRule,
    now: Timestamp,
    starts: &mut PlannedStarts,
    out: &mut BTreeMap<String, Verdict>,
) -> (Vec<(Timestamp, &'j Job, &'j Hold)>, usize) {
    let mut ready = Vec::new();
    let mut later = 0usize;
    // many jobs share a planned start: its text is made once
    let mut start_text: BTreeMap<Timestamp, String> = BTreeMap::new();
    for ((job, by, held), placed) in candidates.into_iter().zip(&schedule.placements) {
        if placed.start > now {
            later += 1;
            starts.insert(job.id.clone(), placed.start);
            let start = start_text
                .entry(placed.start)
                .or_insert_with(|| placed.start.to_string());
            let worth = if placed.fits_now {
                format!(
                    "expected saving {:.3} > delay cost {:.3}",
                    placed.saving, placed.delay_cost
                )
            } else {
                format!(
                    "no room to start now; expected saving {:.3}, delay cost {:.3}",
                    placed.saving, placed.delay_cost
                )
            };
            out.insert(
                job.id.clone(),
                Verdict::Hold(Hold {
                    rule: "price.defer".into(),
                    since: held.map_or(now, |h| h.since),
                    lease_until: (now + rule.lease_s).min(by),
                    reason: format!(
                        "planned start {start} in the cheapest slot with room: {:.3} per kWh over its run, {price_now:.3} now; {worth}",
                        placed.mean_price
                    ),
                }),
            );
        } else if let Some(h) = held {
            ready.push((by, job, h));
        }
    }
    (ready, later)
}
