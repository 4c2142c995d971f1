//! Demand-response events in the backtest: the scenario's `[[grid_events]]` checked,
//! the simulated meter (IT plus cooling, per step) that the policy's facility keeps
//! while a scenario has events, and the site readings it publishes from them each
//! time it is read: `facility_power_w` (the meter now), `grid_event_active` (1 while an
//! event is in force, else 0) and, during an event, `grid_shed_fraction` or
//! `grid_cap_w` with `grid_baseline_w` (the meter's mean over the hour before the
//! event's start, PJM hour-before style). The engine's grid controller reads them from
//! the snapshot; [`super::dr`] measures what the meter did.

use telemetry::grid::GridTarget;
use telemetry::metric::names::{
    FACILITY_POWER_W, GRID_BASELINE_W, GRID_CAP_W, GRID_EVENT_ACTIVE, GRID_SHED_FRACTION,
};
use telemetry::{Sample, Site, Timestamp};

use super::scenario::GridEventEntry;

/// The hour before an event its baseline is taken over, s.
pub const BASELINE_S: f64 = 3600.0;

/// A bad `[[grid_events]]` entry (`index` from 1, in file order).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum GridEventError {
    #[error("grid event {index} ({id}): give exactly one of shed_pct or target_kw, got {given}")]
    Target {
        index: usize,
        id: String,
        given: &'static str,
    },
    #[error("grid event {index} ({id}): shed_pct must be more than 0 and at most 100, got {got}")]
    ShedPct { index: usize, id: String, got: f64 },
    #[error("grid event {index} ({id}): target_kw must be positive, got {got}")]
    TargetKw { index: usize, id: String, got: f64 },
    #[error("grid event {index} ({id}): duration_min must be positive, got {got}")]
    Duration { index: usize, id: String, got: f64 },
    #[error("grid event {index} ({id}): its id is taken by grid event {first}")]
    DuplicateId {
        index: usize,
        id: String,
        first: usize,
    },
    #[error("grid event {index} ({id}) overlaps grid event {other} ({other_id}): events may not overlap")]
    Overlap {
        index: usize,
        id: String,
        other: usize,
        other_id: String,
    },
}

/// A checked event: `[start, end)` and what it asks of the meter.
#[derive(Debug, Clone, PartialEq)]
pub struct DrEvent {
    pub id: String,
    pub start: Timestamp,
    pub end: Timestamp,
    pub duration_min: f64,
    /// `ShedFraction` (from `shed_pct`) or `CapW` (from `target_kw`).
    pub target: GridTarget,
}

impl DrEvent {
    /// The meter target, W, given the baseline.
    pub fn target_w(&self, baseline_w: f64) -> f64 {
        telemetry::grid::target_w(&self.target, baseline_w, &[]).unwrap_or(baseline_w)
    }
}

/// The entries checked: the good ones in time order, and every problem found.
pub struct Checked {
    pub events: Vec<DrEvent>,
    pub errors: Vec<GridEventError>,
}

/// Checks every entry (all problems at once): exactly one of `shed_pct` (more than 0,
/// at most 100) or `target_kw` (positive), a positive duration, unique ids, no overlap.
pub fn events(entries: &[GridEventEntry]) -> Checked {
    let mut errors = Vec::new();
    let mut events: Vec<(usize, DrEvent)> = Vec::new();
    for (i, e) in entries.iter().enumerate() {
        let index = i + 1;
        let id =
            e.id.clone()
                .unwrap_or_else(|| format!("grid-event-{index}"));
        let target = match (e.shed_pct, e.target_kw) {
            (Some(p), None) if p > 0.0 && p <= 100.0 => Some(GridTarget::ShedFraction(p / 100.0)),
            (Some(got), None) => {
                let id = id.clone();
                errors.push(GridEventError::ShedPct { index, id, got });
                None
            }
            (None, Some(kw)) if kw > 0.0 && kw.is_finite() => Some(GridTarget::CapW(kw * 1000.0)),
            (None, Some(got)) => {
                let id = id.clone();
                errors.push(GridEventError::TargetKw { index, id, got });
                None
            }
            (s, _) => {
                let given = if s.is_some() { "both" } else { "neither" };
                let id = id.clone();
                errors.push(GridEventError::Target { index, id, given });
                None
            }
        };
        if !(e.duration_min > 0.0 && e.duration_min.is_finite()) {
            let (id, got) = (id.clone(), e.duration_min);
            errors.push(GridEventError::Duration { index, id, got });
            continue;
        }
        if let Some(&(first, _)) = events.iter().find(|(_, d)| d.id == id) {
            errors.push(GridEventError::DuplicateId { index, id, first });
            continue;
        }
        let event = DrEvent {
            start: e.start,
            end: e.start + e.duration_min * 60.0,
            duration_min: e.duration_min,
            target: target.unwrap_or(GridTarget::ShedFraction(0.0)),
            id,
        };
        if let Some((other, o)) = events
            .iter()
            .find(|(_, o)| o.start < event.end && event.start < o.end)
        {
            errors.push(GridEventError::Overlap {
                index,
                id: event.id.clone(),
                other: *other,
                other_id: o.id.clone(),
            });
            continue;
        }
        if target.is_some() {
            events.push((index, event));
        }
    }
    let mut events: Vec<DrEvent> = events.into_iter().map(|(_, e)| e).collect();
    events.sort_by_key(|e| e.start);
    Checked { events, errors }
}

/// One step of the simulated meter: from `t0` for `dt_s`, the mean of IT plus cooling
/// (kW), the work the jobs did (GPU-seconds at full speed) and the GPU-seconds that
/// suspended jobs held without running.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MeterStep {
    pub t0: Timestamp,
    pub dt_s: f64,
    pub kw: f64,
    pub work_gpu_s: f64,
    pub suspended_gpu_s: f64,
}

/// The meter's steps, in time order.
#[derive(Debug, Clone, Default)]
pub struct Meter {
    pub steps: Vec<MeterStep>,
}

impl Meter {
    pub fn push(&mut self, step: MeterStep) {
        self.steps.push(step);
    }

    /// The steps that overlap `[from, to)`, each with the seconds of it inside.
    fn overlapping(
        &self,
        from: Timestamp,
        to: Timestamp,
    ) -> impl Iterator<Item = (&MeterStep, f64)> {
        let first = self.steps.partition_point(|s| (s.t0 + s.dt_s) <= from);
        self.steps[first..]
            .iter()
            .take_while(move |s| s.t0 < to)
            .filter_map(move |s| {
                let a = s.t0.max(from);
                let b = (s.t0 + s.dt_s).min(to);
                let overlap = b.secs_since(a);
                (overlap > 0.0).then_some((s, overlap))
            })
    }

    /// The meter's mean over `[from, to)` (over the part of it the steps cover), kW;
    /// none where they cover none of it.
    pub fn mean_kw(&self, from: Timestamp, to: Timestamp) -> Option<f64> {
        let (mut kws, mut secs) = (0.0, 0.0);
        for (s, o) in self.overlapping(from, to) {
            kws += s.kw * o;
            secs += o;
        }
        (secs > 0.0).then(|| kws / secs)
    }

    /// The work done in `[from, to)`, GPU-hours (a step's work spread evenly over it).
    pub fn gpu_hours(&self, from: Timestamp, to: Timestamp) -> f64 {
        self.sum_hours(from, to, |s| s.work_gpu_s)
    }

    /// The GPU-hours suspended jobs held in `[from, to)` without running.
    pub fn suspended_gpu_hours(&self, from: Timestamp, to: Timestamp) -> f64 {
        self.sum_hours(from, to, |s| s.suspended_gpu_s)
    }

    fn sum_hours(&self, from: Timestamp, to: Timestamp, of: impl Fn(&MeterStep) -> f64) -> f64 {
        self.overlapping(from, to)
            .map(|(s, o)| of(s) * o / s.dt_s.max(1e-9))
            .sum::<f64>()
            / 3600.0
    }
}

/// What the engine's grid controller said of an event at a tick (its memory in the
/// plan's state): the lowest meter it could reach without protected work and by how
/// much the target was out of reach, kW.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ControllerView {
    pub t: Timestamp,
    pub floor_kw: f64,
    pub shortfall_kw: f64,
}

/// The events the policy's facility publishes, with the baseline each got when it came
/// into force (kW), and what the controller said at each tick an event was in force.
#[derive(Debug, Clone, Default)]
pub struct Schedule {
    pub events: Vec<DrEvent>,
    pub baselines_kw: Vec<Option<f64>>,
    pub controller: Vec<ControllerView>,
}

impl Schedule {
    pub fn new(events: Vec<DrEvent>) -> Self {
        let baselines_kw = vec![None; events.len()];
        Schedule {
            events,
            baselines_kw,
            controller: Vec::new(),
        }
    }

    /// Notes the engine's grid memory after a tick at `now`, while an event (not its
    /// rebound) is in force.
    pub fn note(&mut self, memory: Option<&policies::GridMemory>, now: Timestamp) {
        if let Some(g) = memory.filter(|g| g.event_active()) {
            self.controller.push(ControllerView {
                t: now,
                floor_kw: g.floor_w / 1000.0,
                shortfall_kw: g.shortfall_w / 1000.0,
            });
        }
    }

    /// The site readings at `now`: the meter (`meter_now_w`, IT plus cooling now), and
    /// the event in force, if any, with its baseline, taken the first time it is read
    /// in force: the meter's mean over the hour before its start (over what the run
    /// covered of it; the meter now where it covered none).
    pub fn samples(
        &mut self,
        site: &Site,
        meter: &Meter,
        meter_now_w: f64,
        now: Timestamp,
    ) -> Vec<Sample> {
        let e = site.site_entity();
        let s = |metric: &str, v: f64| Sample::new(e.clone(), metric, v, now, "backtest");
        let mut out = vec![s(FACILITY_POWER_W, meter_now_w)];
        let Some(i) = self
            .events
            .iter()
            .position(|ev| ev.start <= now && now < ev.end)
        else {
            out.push(s(GRID_EVENT_ACTIVE, 0.0));
            return out;
        };
        let ev = &self.events[i];
        let baseline_kw = *self.baselines_kw[i].get_or_insert_with(|| {
            meter
                .mean_kw(ev.start.plus_secs(-BASELINE_S), ev.start)
                .unwrap_or(meter_now_w / 1000.0)
        });
        out.push(s(GRID_EVENT_ACTIVE, 1.0));
        match ev.target {
            GridTarget::ShedFraction(f) => out.push(s(GRID_SHED_FRACTION, f)),
            GridTarget::CapW(w) => out.push(s(GRID_CAP_W, w)),
            GridTarget::ShedW(w) => out.push(s(telemetry::metric::names::GRID_SHED_W, w)),
            GridTarget::Level(_) => {}
        }
        out.push(s(GRID_BASELINE_W, baseline_kw * 1000.0));
        out
    }
}

#[cfg(test)]
mod tests;
