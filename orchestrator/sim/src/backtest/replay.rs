//! The backtest's replay: the three facilities stepped together on the same ticks, the
//! policy's under the control loop that `serve` runs, with its node power decisions.

use std::collections::BTreeSet;

use anyhow::Result;
use integrations::store::{Backend, Batch, Op, Store, StoreError};
use policies::node_power::NodePowerRule;
use policies::{Action, Policy, Target};
use telemetry::{Site, Timestamp};

use super::facility::{self, Facility, Point};
use super::inputs::Inputs;
use super::scenario::Scenario;
use crate::events::{dt_s, ReplayEvents, Stop};
use control::{ControlLoop, Telemetry};

/// A store that keeps nothing: the backtest reads its results from the facility and
/// the tick reports, and a long replay should not grow a database.
struct Discard {
    seq: std::collections::BTreeMap<String, u64>,
}

impl Backend for Discard {
    fn commit(&mut self, batch: &Batch) -> Result<Vec<u64>, StoreError> {
        let mut out = Vec::new();
        for op in &batch.ops {
            if let Op::Append { log, .. } = op {
                let n = self.seq.entry(log.clone()).or_default();
                *n += 1;
                out.push(*n);
            }
        }
        Ok(out)
    }
    fn get(&mut self, _: &str, _: &str) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(None)
    }
    fn list(&mut self, _: &str) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        Ok(Vec::new())
    }
    fn read_log(&mut self, _: &str, _: u64, _: usize) -> Result<Vec<(u64, Vec<u8>)>, StoreError> {
        Ok(Vec::new())
    }
    fn log_len(&mut self, log: &str) -> Result<u64, StoreError> {
        Ok(self.seq.get(log).copied().unwrap_or(0))
    }
    fn name(&self) -> &'static str {
        "discard"
    }
}

/// The runs' charts.
pub(crate) struct Series2 {
    pub baseline: Vec<Point>,
    pub policy: Vec<Point>,
    pub power_save: Vec<Point>,
}

/// Where the node power decision's inputs come from in the policy's replay: the nodes,
/// and the GPUs the work needs and when (see `policies::node_power::due_at`).
fn node_needs(
    f: &Facility,
    planned: &std::collections::BTreeMap<String, Timestamp>,
    now: Timestamp,
) -> Vec<policies::node_power::Need> {
    f.waiting_jobs()
        .filter_map(|j| {
            let at = policies::node_power::due_at(&j.job, planned.get(&j.job.id).copied(), now)?;
            Some(policies::node_power::Need {
                at,
                gpus: j.job.gpus,
                model: j.gpu_model.clone(),
            })
        })
        .collect()
}

/// The three replays stepped together: the baseline, the policy's and the power-saving
/// one (only the policy's is evaluated).
pub(super) struct Runs {
    pub base: Facility,
    pub pol: Facility,
    pub psave: Facility,
}

impl Runs {
    /// One step of all three; `cycle`: with the scheduler's cycle (the first step of a
    /// tick interval), else the physics only.
    fn step(&mut self, dt_s: f64, cycle: bool) {
        for f in [&mut self.base, &mut self.pol, &mut self.psave] {
            if cycle {
                f.step(dt_s);
            } else {
                f.advance(dt_s);
            }
        }
    }

    /// From one tick to the next (`dt` on): with the scenario's `sample_s`, the policy's
    /// facility read between them and its crossings evaluated at once, as `serve`
    /// does; else one step.
    fn between_ticks(
        &mut self,
        dt: f64,
        control: &mut ControlLoop,
        events: &mut ReplayEvents,
        deferred: &mut std::collections::BTreeSet<String>,
    ) {
        let tick_at = self.pol.now() + dt;
        let mut first = true;
        loop {
            let now = self.pol.now();
            match events.next(now, tick_at) {
                // read at the ticks only: one step, as the backtest always took it
                Stop::Tick if first => return self.step(dt, true),
                Stop::Tick => return self.step(dt_s(now, tick_at), false),
                Stop::Sample(t) => {
                    self.step(dt_s(now, t), first);
                    first = false;
                    let samples = self.pol.poll(t);
                    events.sampled(control.snapshot(), samples, t);
                }
                Stop::Evaluate(t) => {
                    self.step(dt_s(now, t), first);
                    first = false;
                    let fc =
                        crate::forecast(self.pol.prices(), self.pol.carbon(), t, 48.0 * 3600.0);
                    control.set_forecast(fc);
                    let jobs = self.pol.take_jobs();
                    let report = control.tick(t, events.take(Vec::new()), jobs, &mut self.pol);
                    events.evaluated(t);
                    note_deferred(&report.decisions, deferred);
                }
            }
        }
    }
}

impl Runs {
    /// The three facilities at `start`: the baseline (every node on, no policy), the
    /// policy's (its nodes managed when the policy manages node power) and the
    /// power-saving one (Slurm-style suspends). `grid`: the policy's facility keeps its
    /// meter and publishes these grid events (none: only the meter and that none is in
    /// force); absent: neither, as without `[[grid_events]]`.
    pub fn new(inputs: &Inputs, grid: Option<Vec<super::grid::DrEvent>>) -> Self {
        let (np, start) = (&inputs.policy.node_power, inputs.start);
        let node_model = facility::NodePowerModel {
            boot_s: np.boot_s,
            boot_s_by_model: np.boot_s_by_model.clone(),
            shutdown_s: np.shutdown_s,
            off_w: np.off_w,
        };
        let facility = || {
            let (scenario, units) = (inputs.scenario.clone(), inputs.cooling_units());
            Facility::new(
                inputs.site.clone(),
                inputs.curves.clone(),
                inputs.prices.clone(),
                inputs.carbon.clone(),
                inputs.jobs.clone(),
                inputs.budget_kw,
                Box::new(move |t: Timestamp| scenario.unit_factors(&units, t)),
                start,
            )
        };
        let psave = facility().with_node_power(
            facility::NodeMode::PowerSave {
                suspend_s: inputs.scenario.suspend_time_s,
            },
            node_model.clone(),
        );
        let base = facility();
        let pol = facility().with_node_power(
            if np.enabled {
                facility::NodeMode::Managed
            } else {
                facility::NodeMode::AlwaysOn
            },
            node_model,
        );
        let pol = match grid {
            Some(events) => pol.with_grid(events),
            None => pol,
        };
        Runs { base, pol, psave }
    }

    fn all_done(&self) -> bool {
        self.base.done() && self.pol.done() && self.psave.done()
    }

    /// Nothing waits and nothing more arrives in any of them.
    fn draining(&self) -> bool {
        self.base.draining() && self.pol.draining() && self.psave.draining()
    }
}

/// What the replay leaves for the summary besides the facilities.
pub(super) struct Outcome {
    /// The jobs the policy held at some point.
    pub deferred: BTreeSet<String>,
    pub series: Series2,
    pub decisions: u64,
    pub event_evaluations: u64,
}

/// Replays the trace from `runs`' start until every job in all three has finished:
/// the controller ticks every `tick_s` (hourly once nothing waits), with a progress
/// line each simulated week.
pub(super) fn replay(
    runs: &mut Runs,
    site: &Site,
    policy: Policy,
    scenario: &Scenario,
    progress: &mut dyn std::io::Write,
) -> Result<Outcome> {
    let np = policy.node_power.clone();
    let store = Store::new(Box::new(Discard {
        seq: Default::default(),
    }));
    let mut control = ControlLoop::restore(site.clone(), policy, store, 3600.0)?.without_records();
    let mut deferred = BTreeSet::new();
    let mut series = Series2 {
        baseline: Vec::new(),
        policy: Vec::new(),
        power_save: Vec::new(),
    };
    let mut next_note = runs.pol.now() + 7.0 * 86400.0;
    let mut ticks = 0u64;
    let mut events = ReplayEvents::new(
        control.policy(),
        site,
        scenario.sample_s,
        control::cadence::DEFAULT_EVENT_DEBOUNCE_MS,
        control::cadence::DEFAULT_EVENT_MAX_PER_S,
    );
    loop {
        let now = runs.pol.now();
        let np_tick = (&np, scenario.tick_s);
        control_tick(
            &mut runs.pol,
            &mut control,
            &mut events,
            np_tick,
            &mut deferred,
        );
        if let Some(g) = runs.pol.grid.as_mut() {
            g.note(control.state().grid.as_ref(), now);
        }
        ticks += 1;
        runs.base.forget_changes();
        runs.psave.forget_changes();
        let all_done = runs.all_done();
        if ticks % 12 == 1 || all_done {
            series.baseline.push(runs.base.point());
            series.policy.push(runs.pol.point());
            series.power_save.push(runs.psave.point());
        }
        if all_done {
            break;
        }
        if now >= next_note {
            writeln!(
                progress,
                "  {}: {} waiting, {} running under the policy",
                now.to_datetime()
                    .with_timezone(&site.timezone)
                    .format("%Y-%m-%d"),
                series.policy.last().map_or(0, |p| p.waiting),
                series.policy.last().map_or(0, |p| p.running)
            )?;
            next_note = next_note + 7.0 * 86400.0;
        }
        // nothing waits and nothing more arrives: hourly ticks until the last job ends
        let dt = if runs.draining() {
            let hour = 3_600_000;
            let next = (now.0.div_euclid(hour) + 1) * hour;
            (next - now.0) as f64 / 1000.0
        } else {
            scenario.tick_s
        };
        runs.between_ticks(dt, &mut control, &mut events, &mut deferred);
    }
    Ok(Outcome {
        deferred,
        series,
        decisions: control.counters.decisions,
        event_evaluations: events.evaluations(),
    })
}

/// The controller's tick on the policy's facility, as serve runs it: forecast,
/// telemetry, jobs → plan; then node power, as an actuation beside caps and holds.
fn control_tick(
    pol: &mut Facility,
    control: &mut ControlLoop,
    events: &mut ReplayEvents,
    (np, tick_s): (&NodePowerRule, f64),
    deferred: &mut BTreeSet<String>,
) {
    let now = pol.now();
    let fc = crate::forecast(pol.prices(), pol.carbon(), now, 48.0 * 3600.0);
    // for node power: the price now above the mean of the next 24 h
    let expensive = pol.price_at(now).is_some_and(|p| {
        fc.price
            .window(now, now + 24.0 * 3600.0)
            .is_some_and(|w| p > w.mean)
    });
    control.set_forecast(fc);
    let samples = events.take(pol.poll(now));
    let jobs = pol.take_jobs();
    let report = control.tick(now, samples, jobs, pol);
    events.ticked();
    if np.enabled {
        // nodes with no work and none planned within their boot time go down, come
        // back before
        let actions = policies::node_power::decide(
            &pol.node_views(),
            &node_needs(pol, &report.planned_starts, now),
            np,
            policies::node_power::Inputs {
                expensive,
                grid_event: control
                    .state()
                    .grid
                    .as_ref()
                    .is_some_and(|m| m.event_active()),
                downs_last_min: pol.downs_last_min(now),
                arrivals_gpus_per_s: Some(pol.arrivals_gpus_per_s(now, np.reserve_window_s)),
                // `serve` decides every few seconds: as many power-downs as it would
                // make over the tick
                interval_s: tick_s,
            },
            now,
        );
        pol.apply_node_actions(&actions, now, np.lease_s);
    }
    note_deferred(&report.decisions, deferred);
}

/// The jobs a plan's decisions hold.
fn note_deferred(decisions: &[policies::Decision], deferred: &mut BTreeSet<String>) {
    for d in decisions {
        if let (Action::Hold { .. }, Target::Job { job }) = (&d.action, &d.target) {
            deferred.insert(job.clone());
        }
    }
}
