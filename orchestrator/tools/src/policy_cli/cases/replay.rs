//! One case played tick by tick: its readings held as signals and read again at
//! every tick, its jobs and forecasts, the engine evaluated on them with the state
//! carried from the tick before, and each tick's expectations checked.

use std::collections::BTreeMap;

use policies::{Forecast, Plan, Policy, State};
use telemetry::snapshot::Rejected;
use telemetry::{EntityId, Job, Sample, Site, Snapshot, Timestamp};

use super::super::inputs::{self, parse_time, InputError, RawReading};
use super::{expect, CaseFailure, RawCase, RawTick};

/// Why a tick's inputs cannot be taken in.
#[derive(Debug, Clone, thiserror::Error)]
pub enum TickError {
    /// The tick's `at`.
    #[error("{0}")]
    At(#[source] InputError),
    #[error("ticks must go forward in time")]
    Backwards,
    /// A reading, a job or an entity the tick names.
    #[error("{0}")]
    Input(#[from] InputError),
    #[error("{entity} {metric}: stop names a reading that was never set")]
    StopUnset { entity: String, metric: String },
    /// A reading the snapshot refuses.
    #[error("{0}")]
    Refused(#[from] Rejected),
    #[error("remove_jobs: no job {0:?}")]
    NoJob(String),
    #[error("forecast: {0}")]
    Forecast(#[source] InputError),
}

/// One telemetry signal of a case (one metric of one entity): its value holds,
/// read again at every tick, until it changes or stops.
struct Signal {
    /// Its last sample; re-stamped every tick unless it was given an absolute time.
    sample: Sample,
    age_s: f64,
    fixed_time: bool,
}

/// Runs one case from `prior` at `t0`; the first failure, at its tick.
pub(super) fn run_case(
    file: &str,
    src: &str,
    site: &Site,
    policy: &Policy,
    mut prior: State,
    t0: Timestamp,
    case: &RawCase,
) -> Result<(), CaseFailure> {
    if case.ticks.is_empty() {
        return Err(CaseFailure::NoTicks);
    }
    let mut replay = Replay::new(site);
    let mut last: Option<Timestamp> = None;
    for (i, t) in case.ticks.iter().enumerate() {
        let tick = t.get_ref();
        let (line, col) = telemetry::diag::line_col(src, t.span().start);
        let problem = |source| CaseFailure::Tick {
            file: file.to_string(),
            line,
            col,
            tick: i + 1,
            time: tick.at.clone(),
            source: Box::new(source),
        };
        let now = parse_time(&tick.at, t0).map_err(|e| problem(TickError::At(e)))?;
        if last.is_some_and(|l| now <= l) {
            return Err(problem(TickError::Backwards));
        }
        last = Some(now);
        replay.take(tick, now).map_err(problem)?;
        let plan = replay.evaluate(policy, &prior, now);
        if let Some(e) = &tick.expect {
            expect::check(&replay.names, e, &plan.state, &plan.decisions).map_err(|source| {
                CaseFailure::Expectation {
                    tick: i + 1,
                    time: tick.at.clone(),
                    file: file.to_string(),
                    line,
                    source: Box::new(source),
                }
            })?;
        }
        prior = plan.state;
    }
    Ok(())
}

/// What a case has built up by a tick: the snapshot, the signals still reporting,
/// the jobs and the forecast.
struct Replay<'a> {
    site: &'a Site,
    names: inputs::Names<'a>,
    snapshot: Snapshot,
    signals: BTreeMap<(EntityId, String), Signal>,
    jobs: Vec<Job>,
    forecast: Forecast,
}

impl<'a> Replay<'a> {
    fn new(site: &'a Site) -> Self {
        Replay {
            site,
            names: inputs::Names::new(site),
            snapshot: Snapshot::new(),
            signals: BTreeMap::new(),
            jobs: Vec::new(),
            forecast: Forecast::default(),
        }
    }

    /// Takes in what a tick gives at `now`: readings, jobs, jobs removed, a forecast.
    fn take(&mut self, tick: &RawTick, now: Timestamp) -> Result<(), TickError> {
        self.set_readings(&tick.readings, now)?;
        self.read_signals(now)?;
        for j in &tick.jobs {
            let job = j.job(&self.names, now)?;
            match self.jobs.iter_mut().find(|o| o.id == job.id) {
                Some(o) => *o = job,
                None => self.jobs.push(job),
            }
        }
        for id in &tick.remove_jobs {
            let n = self.jobs.len();
            self.jobs.retain(|j| &j.id != id);
            if self.jobs.len() == n {
                return Err(TickError::NoJob(id.clone()));
            }
        }
        if let Some(f) = &tick.forecast {
            self.forecast = f.forecast(now).map_err(TickError::Forecast)?;
        }
        let site_id = self.site.site_entity();
        let own: Vec<&str> = [
            telemetry::metric::names::PRICE_PER_KWH,
            telemetry::metric::names::CARBON_G_PER_KWH,
        ]
        .into_iter()
        .filter(|m| self.signals.contains_key(&(site_id.clone(), m.to_string())))
        .collect();
        inputs::signals_from_forecast(self.site, &mut self.snapshot, &self.forecast, now, &own);
        Ok(())
    }

    /// The tick's readings, in order: a later reading of the same entity and metric
    /// replaces an earlier one; `stop` ends a signal.
    fn set_readings(&mut self, readings: &[RawReading], now: Timestamp) -> Result<(), TickError> {
        for r in readings {
            if r.stop {
                let ids = self.names.resolve(&r.entity)?;
                let n = self.signals.len();
                self.signals
                    .retain(|(e, m), _| !(m == &r.metric && ids.contains(e)));
                if self.signals.len() == n {
                    return Err(TickError::StopUnset {
                        entity: r.entity.clone(),
                        metric: r.metric.clone(),
                    });
                }
                continue;
            }
            for sample in r.samples(&self.names, now, "test")? {
                self.signals.insert(
                    (sample.entity.clone(), sample.metric.as_str().to_string()),
                    Signal {
                        sample,
                        age_s: r.age_s.unwrap_or(0.0),
                        fixed_time: r.time.is_some(),
                    },
                );
            }
        }
        Ok(())
    }

    /// Every signal still reporting is read again at this tick (one given with an
    /// absolute time is read once, as given).
    fn read_signals(&mut self, now: Timestamp) -> Result<(), TickError> {
        let mut latest: Vec<Sample> = Vec::new();
        for s in self.signals.values_mut() {
            if !s.fixed_time {
                s.sample.ts = now.plus_secs(-s.age_s);
            }
            latest.push(s.sample.clone());
        }
        self.signals.retain(|_, s| !s.fixed_time);
        for sample in latest {
            self.snapshot.ingest(sample, now)?;
        }
        Ok(())
    }

    fn evaluate(&self, policy: &Policy, prior: &State, now: Timestamp) -> Plan {
        policies::evaluate(
            &policies::Inputs {
                site: self.site,
                snapshot: &self.snapshot,
                jobs: &self.jobs,
                prior,
                policy,
                forecast: &self.forecast,
                job_table: None,
            },
            now,
        )
    }
}
