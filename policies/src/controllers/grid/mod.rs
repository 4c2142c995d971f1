//! Grid events: the facility follows the grid. While an edge publishes an event at the
//! site (`grid_event_active`, with a shed or a cap: see [`telemetry::grid`]), the
//! controller brings the meter (IT plus cooling: the utility meters the facility) under
//! the event's target, by value:
//!
//! 1. queued deferrable work is held (never past a job's latest start);
//! 2. flexible running GPUs are capped, idle GPUs and the classes of `shed_order`
//!    first, each never under its class's floor;
//! 3. where caps at their floors do not reach the target, preemptible jobs are
//!    suspended, those cut first first;
//!
//! never a protected class (`protect`) nor a job near its latest start. Caps fall at
//! once and rise at `[budget] raise_w_per_min`. After the event, the rebound limit
//! keeps the meter under the pre-event baseline for `rebound_s`: held work and
//! suspended jobs come back as the room under it allows.
//!
//! The meter is read as `facility_power_w` where the site has it, else IT plus every
//! cooling unit's `cooling_power_w`, else IT times `overhead_ratio`; the IT target is
//! the meter target times IT's share of the meter now.
//!
//! What it saw and decided is kept in [`crate::plan::GridMemory`] (the state's `grid`):
//! the baseline, the target, the meter, the lowest meter reachable without protected
//! work, and the shortfall when the target is out of reach (the VEN reports it, or opts
//! out with it).
//!
//! # Layout
//!
//! - `mod.rs`: what the site asks and the meter ([`asked`], [`meter`]), the memory's
//!   step from one tick to the next ([`step`]) and the cut ([`cut`]);
//! - `controller.rs`: the adapter from the engine's `Context`, writing `Wants`.

pub(crate) mod controller;

use telemetry::metric::names::{
    COOLING_POWER_W, FACILITY_POWER_W, GRID_BASELINE_W, GRID_CAP_W, GRID_EVENT_ACTIVE,
    GRID_SHED_FRACTION, GRID_SHED_W, POWER_W,
};
use telemetry::{EntityId, EntityKind, Site, Snapshot, Timestamp};

use crate::budget::{waterfill, Claim};
use crate::plan::GridMemory;
use crate::policy::GridRule;

/// The rule name of the controller's caps, holds and suspensions.
pub const RULE: &str = "grid.shed";

/// What the site's grid readings ask this tick.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Asked {
    pub active: bool,
    pub shed_fraction: Option<f64>,
    pub shed_w: Option<f64>,
    pub cap_w: Option<f64>,
    pub baseline_w: Option<f64>,
}

impl Asked {
    /// The meter target against `baseline_w`: the lowest of what is asked.
    pub fn target_w(&self, baseline_w: f64) -> Option<f64> {
        [
            self.cap_w,
            self.shed_fraction
                .map(|f| baseline_w * (1.0 - f.clamp(0.0, 1.0))),
            self.shed_w.map(|w| (baseline_w - w).max(0.0)),
        ]
        .into_iter()
        .flatten()
        .min_by(f64::total_cmp)
    }
}

/// The site's grid readings (usable ones only: a stale event is no event).
pub fn asked(site: &Site, snapshot: &Snapshot, now: Timestamp) -> Asked {
    let entity = site.site_entity();
    let read = |m: &str| {
        snapshot
            .observe(&entity, m, now)
            .filter(|o| o.usable())
            .map(|o| o.value)
    };
    Asked {
        active: read(GRID_EVENT_ACTIVE).is_some_and(|v| v >= 0.5),
        shed_fraction: read(GRID_SHED_FRACTION),
        shed_w: read(GRID_SHED_W),
        cap_w: read(GRID_CAP_W),
        baseline_w: read(GRID_BASELINE_W),
    }
}

/// How the meter's power was known.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MeterFrom {
    /// The site's `facility_power_w`.
    Meter,
    /// IT plus every cooling unit's `cooling_power_w`.
    ItAndCooling,
    /// IT times `overhead_ratio`.
    Overhead,
}

/// The meter and IT power now.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Meter {
    pub meter_w: f64,
    pub it_w: f64,
    pub from: MeterFrom,
}

impl Meter {
    /// IT's share of the meter (1 where the meter reads nothing).
    pub fn it_share(&self) -> f64 {
        if self.meter_w > 0.0 {
            (self.it_w / self.meter_w).clamp(0.05, 1.0)
        } else {
            1.0
        }
    }
}

/// The meter, from the site's readings; `it_estimate_w` is IT power as the GPUs' draws
/// and the nodes' base power give it, used where the site's `power_w` is not read.
pub fn meter(
    site: &Site,
    snapshot: &Snapshot,
    rule: &GridRule,
    it_estimate_w: f64,
    now: Timestamp,
) -> Meter {
    let read = |e: &EntityId, m: &str| {
        snapshot
            .observe(e, m, now)
            .filter(|o| o.usable())
            .map(|o| o.value)
    };
    let entity = site.site_entity();
    let it_w = read(&entity, POWER_W).unwrap_or(it_estimate_w);
    if let Some(m) = read(&entity, FACILITY_POWER_W) {
        return Meter {
            meter_w: m.max(it_w),
            it_w,
            from: MeterFrom::Meter,
        };
    }
    let cooling: Option<f64> = (!site.cooling.is_empty())
        .then(|| {
            site.cooling
                .iter()
                .map(|c| read(&EntityId::new(EntityKind::Cooling, &c.id), COOLING_POWER_W))
                .sum::<Option<f64>>()
        })
        .flatten();
    match cooling {
        Some(c) => Meter {
            meter_w: it_w + c,
            it_w,
            from: MeterFrom::ItAndCooling,
        },
        None => Meter {
            meter_w: it_w * rule.overhead_ratio,
            it_w,
            from: MeterFrom::Overhead,
        },
    }
}

/// The memory after this tick, from the prior one and what is asked: an event seen for
/// the first time takes its baseline (the edge's, else the meter now, before any
/// shed); an event that ends starts the rebound limit; the rebound ends at its time,
/// once nothing the controller held or suspended is still waiting (`holding`): a
/// backlog comes back under the baseline, never all at once when the time is up (each
/// hold ends by its job's latest start, so the rebound does too). `None`: nothing in
/// force.
pub fn step(
    prior: Option<&GridMemory>,
    asked: &Asked,
    meter: &Meter,
    rule: &GridRule,
    holding: bool,
    now: Timestamp,
) -> Option<GridMemory> {
    let fresh = |baseline_w: f64, since: Timestamp| GridMemory {
        since,
        baseline_w,
        target_w: baseline_w,
        meter_w: meter.meter_w,
        floor_w: 0.0,
        shortfall_w: 0.0,
        rebound_until: None,
    };
    if asked.active {
        let mut m = match prior.filter(|p| p.event_active()) {
            Some(p) => fresh(asked.baseline_w.unwrap_or(p.baseline_w), p.since),
            None => fresh(asked.baseline_w.unwrap_or(meter.meter_w), now),
        };
        // an event that asks nothing the controller understands holds at the baseline
        m.target_w = asked.target_w(m.baseline_w).unwrap_or(m.baseline_w);
        return Some(m);
    }
    let p = prior?;
    let until = match p.rebound_until {
        Some(t) => t,
        None if rule.rebound_s > 0.0 => now.plus_secs(rule.rebound_s),
        None => return None,
    };
    if now >= until && !holding {
        return None;
    }
    let mut m = fresh(p.baseline_w, p.since);
    m.rebound_until = Some(until);
    Some(m)
}

/// One GPU as the cut sees it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GpuClaim {
    /// What it draws now, W.
    pub draw_w: f64,
    /// What it would draw uncapped, as far as we can tell, W.
    pub demand_w: f64,
    /// The lowest cap the event may give it (its draw, for protected work), W.
    pub floor_w: f64,
    /// Lower is cut first.
    pub priority: i64,
}

/// The cut: each GPU's allocation under `gpu_budget_w` (water-filled in priority order,
/// never under a floor) and whether the budget is met.
pub fn cut(claims: &[GpuClaim], gpu_budget_w: f64) -> (Vec<f64>, bool) {
    let c: Vec<Claim> = claims
        .iter()
        .map(|g| Claim {
            demand_w: g.demand_w,
            min_w: g.floor_w,
            priority: g.priority,
        })
        .collect();
    waterfill(&c, gpu_budget_w)
}

#[cfg(test)]
mod tests;
