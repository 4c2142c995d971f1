//! The thermal model the predictive thermal rule plans with: how a rack's inlet follows
//! the heat load of its cooling unit and the unit's capacity, with a prior from the
//! site file and two parameters fitted online from telemetry (recursive least squares).
//!
//! Steady state of rack `r` served by unit `u` (heat `H` kW, capacity `C` kW):
//!
//! ```text
//! T_ss = supply + offset + rise · min(H / C, 1) + overload · max(H − C, 0)
//!        + skew · (P_r − H / n)
//! ```
//!
//! and the inlet follows it with the unit's time constant τ (first order):
//! `T(t) = T_ss + (T0 − T_ss) · e^(−t/τ)`. `offset` (prior 0 °C) and `rise` (prior
//! `full_load_rise_c`) are fitted; the rest comes from the site file. Pure: time and
//! the prior fit are arguments.

use telemetry::site::CoolingUnit;
use telemetry::Timestamp;

/// Bounds of the fitted offset, in °C either side of the prior (0 °C).
pub const OFFSET_BOUND_C: f64 = 3.0;
/// Bounds of the fitted rise, as a factor of the prior's `full_load_rise_c`.
pub const RISE_BOUNDS: (f64, f64) = (0.5, 2.0);
pub use crate::plan::RackFit;

/// A fit is used only after this many updates.
pub const MIN_SAMPLES: u32 = 20;
/// Forgetting factor of the least squares (older samples weigh less).
const FORGET: f64 = 0.995;
/// Weight of the newest error in the running RMS.
const RMS_WEIGHT: f64 = 0.05;

impl RackFit {
    /// A fit that knows only the prior.
    pub fn prior(unit: &CoolingUnit, now: Timestamp, inlet_c: f64) -> RackFit {
        RackFit {
            offset_c: 0.0,
            rise_c: unit.full_load_rise_c,
            cov: [1.0, 0.0, 1.0],
            rms_c: 0.0,
            samples: 0,
            last_at: now,
            last_inlet_c: inlet_c,
        }
    }
}

/// What loads a rack now or under a plan.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Load {
    /// Heat load of the rack's cooling unit, kW.
    pub unit_kw: f64,
    /// What the rack itself draws, kW.
    pub rack_kw: f64,
}

/// The parameters one prediction uses, and where they came from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Params {
    pub supply_c: f64,
    pub offset_c: f64,
    pub rise_c: f64,
    pub overload_c_per_kw: f64,
    pub skew_c_per_kw: f64,
    pub tau_s: f64,
    /// Capacity in force (a capacity reading, else the site file's).
    pub capacity_kw: f64,
    pub racks: usize,
    /// The fit is used (else the prior).
    pub fitted: bool,
}

impl Params {
    /// The prior's parameters, or the fit's where it is good and fresh.
    pub fn new(
        unit: &CoolingUnit,
        capacity_kw: f64,
        fit: Option<&RackFit>,
        max_rms_c: f64,
    ) -> Params {
        let good = fit.filter(|f| f.samples >= MIN_SAMPLES && f.rms_c <= max_rms_c);
        Params {
            supply_c: unit.supply_temp_c,
            offset_c: good.map_or(0.0, |f| f.offset_c),
            rise_c: good.map_or(unit.full_load_rise_c, |f| f.rise_c),
            overload_c_per_kw: unit.overload_rise_c_per_kw,
            skew_c_per_kw: unit.rack_skew_c_per_kw,
            tau_s: unit.time_constant_s,
            capacity_kw: capacity_kw.max(1e-6),
            racks: unit.racks.len().max(1),
            fitted: good.is_some(),
        }
    }

    /// The parameters with the fit's offset and rise, whatever its quality.
    fn with_fit(self, fit: &RackFit) -> Params {
        Params {
            offset_c: fit.offset_c,
            rise_c: fit.rise_c,
            ..self
        }
    }

    /// Where the inlet settles under `load`.
    pub fn steady_c(&self, load: Load) -> f64 {
        self.supply_c + self.offset_c + self.rise_c * self.ratio(load) + self.rest_c(load)
    }

    /// The load's share of capacity, up to 1 (the regressor of `rise`).
    fn ratio(&self, load: Load) -> f64 {
        (load.unit_kw / self.capacity_kw).min(1.0)
    }

    /// The part of the steady state that is not fitted: overload and rack skew.
    fn rest_c(&self, load: Load) -> f64 {
        self.overload_c_per_kw * (load.unit_kw - self.capacity_kw).max(0.0)
            + self.skew_c_per_kw * (load.rack_kw - load.unit_kw / self.racks as f64)
    }

    /// The inlet `after_s` from `inlet_c` under a constant `load`.
    pub fn predict_c(&self, inlet_c: f64, load: Load, after_s: f64) -> f64 {
        let ss = self.steady_c(load);
        ss + (inlet_c - ss) * (-after_s / self.tau_s).exp()
    }
}

/// Updates a rack's fit with a new usable reading `inlet_c` at `now` under `load`.
/// A first reading, a gap longer than the time constant or a step too short to learn
/// from only records the reading.
pub fn update(
    fit: Option<&RackFit>,
    unit: &CoolingUnit,
    params: &Params,
    load: Load,
    inlet_c: f64,
    now: Timestamp,
) -> RackFit {
    let Some(old) = fit else {
        return persistable(RackFit::prior(unit, now, inlet_c));
    };
    let mut f = old.clone();
    f.last_at = now;
    f.last_inlet_c = inlet_c;
    let f0 = persistable(f.clone());
    let dt = now.secs_since(old.last_at);
    let k = 1.0 - (-dt / params.tau_s).exp();
    if dt <= 0.0 || dt > params.tau_s || k < 0.01 {
        return f0;
    }
    // the fit's own one-tick error, for its quality
    let own = params.with_fit(old);
    let err = inlet_c - own.predict_c(old.last_inlet_c, load, dt);
    f.rms_c = if old.samples == 0 {
        err.abs()
    } else {
        ((1.0 - RMS_WEIGHT) * old.rms_c.powi(2) + RMS_WEIGHT * err.powi(2)).sqrt()
    };
    // the steady state this step implies, less what is not fitted: y = offset + rise·x
    let y =
        old.last_inlet_c + (inlet_c - old.last_inlet_c) / k - params.supply_c - params.rest_c(load);
    let x = params.ratio(load);
    let [p00, p01, p11] = old.cov;
    // P·φ with φ = (1, x)
    let (g0, g1) = (p00 + p01 * x, p01 + p11 * x);
    let denom = FORGET + g0 + g1 * x;
    let (k0, k1) = (g0 / denom, g1 / denom);
    let e = y - (old.offset_c + old.rise_c * x);
    f.offset_c = (old.offset_c + k0 * e).clamp(-OFFSET_BOUND_C, OFFSET_BOUND_C);
    let prior = unit.full_load_rise_c;
    f.rise_c = (old.rise_c + k1 * e).clamp(prior * RISE_BOUNDS.0, prior * RISE_BOUNDS.1);
    // P = (P − K·φᵀ·P) / λ, kept bounded so a quiet period does not blow it up
    let cap = |v: f64| v.clamp(-1e3, 1e3);
    f.cov = [
        cap((p00 - k0 * g0) / FORGET),
        cap((p01 - k0 * g1) / FORGET),
        cap((p11 - k1 * g1) / FORGET),
    ];
    f.samples = old.samples.saturating_add(1);
    persistable(f)
}

/// The fit with every value rounded to 1e-9: numbers of at most 15 significant digits
/// come back from the store's JSON bit for bit, so a restart resumes the same fit.
fn persistable(f: RackFit) -> RackFit {
    let r = |x: f64| (x * 1e9).round() / 1e9;
    RackFit {
        offset_c: r(f.offset_c),
        rise_c: r(f.rise_c),
        cov: f.cov.map(r),
        rms_c: r(f.rms_c),
        last_inlet_c: r(f.last_inlet_c),
        ..f
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unit() -> CoolingUnit {
        CoolingUnit {
            id: "crah-a".into(),
            kind: telemetry::site::CoolingKind::Crah,
            capacity_kw: 40.0,
            supply_temp_c: 22.0,
            full_load_rise_c: 6.0,
            overload_rise_c_per_kw: 0.5,
            time_constant_s: 300.0,
            rack_skew_c_per_kw: 0.15,
            racks: vec!["a".into(), "b".into()],
        }
    }

    fn t(s: f64) -> Timestamp {
        Timestamp::from_secs(1_700_000_000) + s
    }

    /// A world whose true rise and offset differ from the prior; the fit finds them.
    #[test]
    fn the_fit_finds_a_rise_and_offset_the_prior_does_not_know() {
        let u = unit();
        let truth = Params {
            offset_c: 1.0,
            rise_c: 8.0,
            ..Params::new(&u, 40.0, None, 0.3)
        };
        let mut inlet = 24.0;
        let mut fit: Option<RackFit> = None;
        for i in 0..400 {
            let now = i as f64 * 15.0;
            // load swings between 30% and 90% of capacity
            let kw = 24.0 + 12.0 * (now / 900.0).sin();
            let load = Load {
                unit_kw: kw,
                rack_kw: kw / 2.0,
            };
            inlet = truth.predict_c(inlet, load, 15.0);
            let p = Params::new(&u, 40.0, fit.as_ref(), 0.3);
            fit = Some(update(fit.as_ref(), &u, &p, load, inlet, t(now)));
        }
        let f = fit.expect("a fit");
        assert!((f.rise_c - 8.0).abs() < 0.2, "rise {}", f.rise_c);
        assert!((f.offset_c - 1.0).abs() < 0.2, "offset {}", f.offset_c);
        assert!(f.rms_c < 0.05, "rms {}", f.rms_c);
        assert!(Params::new(&u, 40.0, Some(&f), 0.3).fitted);
    }

    #[test]
    fn a_fit_stays_within_its_bounds_and_a_poor_one_falls_back_to_the_prior() {
        let u = unit();
        let mut fit: Option<RackFit> = None;
        for i in 0..100 {
            // nonsense readings: the inlet jumps around regardless of load
            let inlet = if i % 2 == 0 { 20.0 } else { 45.0 };
            let load = Load {
                unit_kw: 20.0,
                rack_kw: 10.0,
            };
            let p = Params::new(&u, 40.0, fit.as_ref(), 0.3);
            fit = Some(update(
                fit.as_ref(),
                &u,
                &p,
                load,
                inlet,
                t(i as f64 * 15.0),
            ));
        }
        let f = fit.expect("a fit");
        assert!(f.offset_c.abs() <= OFFSET_BOUND_C);
        assert!((3.0..=12.0).contains(&f.rise_c), "rise {}", f.rise_c);
        assert!(f.rms_c > 0.3, "rms {}", f.rms_c);
        let p = Params::new(&u, 40.0, Some(&f), 0.3);
        assert!(!p.fitted, "a poor fit is not used");
        assert_eq!((p.offset_c, p.rise_c), (0.0, 6.0), "the prior");
    }

    #[test]
    fn a_gap_longer_than_the_time_constant_only_records_the_reading() {
        let u = unit();
        let load = Load {
            unit_kw: 20.0,
            rack_kw: 10.0,
        };
        let p = Params::new(&u, 40.0, None, 0.3);
        let first = update(None, &u, &p, load, 25.0, t(0.0));
        let later = update(Some(&first), &u, &p, load, 27.0, t(900.0));
        assert_eq!(later.samples, 0);
        assert_eq!((later.last_inlet_c, later.last_at), (27.0, t(900.0)));
    }

    #[test]
    fn a_capacity_drop_raises_the_prediction() {
        let u = unit();
        let load = Load {
            unit_kw: 30.0,
            rack_kw: 15.0,
        };
        let full = Params::new(&u, 40.0, None, 0.3).predict_c(25.0, load, 900.0);
        let half = Params::new(&u, 20.0, None, 0.3).predict_c(25.0, load, 900.0);
        assert!(half > full + 5.0, "{full} -> {half}");
    }
}
