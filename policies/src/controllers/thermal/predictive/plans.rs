//! One unit's plans per cap level: each rack's planned kW under a level and its
//! predicted inlet after the horizon, made once per level, and the levels tried.

use super::loads::Rack;
use crate::thermal_model::{Load, Params, RackFit};

/// One rack of a unit, as the unit's search sees it.
pub(super) struct RackView {
    pub(super) rack: usize,
    /// The rack's fitted model after this tick's reading (as in [`Outcome::fits`]).
    pub(super) fit: Option<RackFit>,
    pub(super) inlet_c: Option<f64>,
    pub(super) limit_c: f64,
    pub(super) params: Params,
}

/// The unit's planned loads under `fraction`: (unit kW, each rack's kW).
pub(super) fn planned(racks: &[Rack<'_, '_>], fraction: f64, queued: usize) -> Load2 {
    let mut unit_w = 0.0;
    let mut left = queued;
    let mut rack_w = Vec::with_capacity(racks.len());
    for l in racks {
        let n = left.min(l.idle.len());
        left -= n;
        let draw = l.draw_w(fraction);
        // the rack itself: as if every queued GPU landed on it (the worst case)
        let (start_n, start_all) = l.start_w(fraction, n, queued);
        unit_w += draw + start_n;
        rack_w.push(draw + start_all);
    }
    Load2 {
        unit_kw: unit_w / 1000.0,
        rack_kw: rack_w.into_iter().map(|w| w / 1000.0).collect(),
    }
}

pub(super) struct Load2 {
    pub(super) unit_kw: f64,
    pub(super) rack_kw: Vec<f64>,
}

/// The unit's planned heat (kW) and the predicted inlet of each rack after `horizon_s`
/// under `fraction`.
pub(super) fn predictions(
    loads: &[Rack<'_, '_>],
    racks: &[RackView],
    fraction: f64,
    queued: usize,
    horizon_s: f64,
) -> (f64, Vec<Option<f64>>) {
    let l = planned(loads, fraction, queued);
    let p = racks
        .iter()
        .zip(&l.rack_kw)
        .map(|(v, &rack_kw)| {
            v.inlet_c.map(|t| {
                v.params.predict_c(
                    t,
                    Load {
                        unit_kw: l.unit_kw,
                        rack_kw,
                    },
                    horizon_s,
                )
            })
        })
        .collect();
    (l.unit_kw, p)
}

/// A cap level (its bits), the unit's planned kW under it and each rack's predicted inlet.
pub(super) type PlanAt = (u64, f64, Vec<Option<f64>>);

/// One unit's planned heat and predicted inlets per cap level, each level made once
/// (the searches and the decisions' values try the same levels).
pub(super) struct Plans<'a> {
    /// The loads of the unit's racks, as `views`.
    pub(super) loads: Vec<Rack<'a, 'a>>,
    pub(super) views: &'a [RackView],
    pub(super) queued: usize,
    pub(super) horizon_s: f64,
    pub(super) memo: std::cell::RefCell<Vec<PlanAt>>,
}

impl Plans<'_> {
    /// `read(unit kW, each rack's predicted inlet)` under `fraction`.
    pub(super) fn at<R>(&self, fraction: f64, read: impl FnOnce(f64, &[Option<f64>]) -> R) -> R {
        let mut memo = self.memo.borrow_mut();
        let at = match memo.iter().position(|(k, _, _)| *k == fraction.to_bits()) {
            Some(i) => i,
            None => {
                let (unit_kw, p) = predictions(
                    &self.loads,
                    self.views,
                    fraction,
                    self.queued,
                    self.horizon_s,
                );
                memo.push((fraction.to_bits(), unit_kw, p));
                memo.len() - 1
            }
        };
        read(memo[at].1, &memo[at].2)
    }
}

/// Cap levels tried per `step_pct`: caps fall to the finer level the prediction needs.
pub(super) const GRID_PER_STEP: f64 = 4.0;

/// The cap levels tried, from uncapped down: 1, 1 − step, …, 0 (each GPU's minimum).
pub(super) fn grid(step: f64) -> Vec<f64> {
    let mut v = vec![1.0];
    let mut f: f64 = 1.0;
    while f - step > 1e-9 {
        f -= step;
        v.push((f * 1e6).round() / 1e6);
    }
    v.push(0.0);
    v
}
