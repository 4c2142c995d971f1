//! The thermal model of the simulated facility, shared by the demo's and the
//! backtest's facilities: rack inlets that follow their cooling unit's heat load with
//! a first-order lag, and the power the cooling spends.

use telemetry::Site;

/// Cooling electrical power per kW of heat removed (1 / coefficient of performance).
const CRAH_KW_PER_KW: f64 = 0.25;
const CDU_KW_PER_KW: f64 = 0.12;

/// What a cooling unit draws per kW of heat it removes.
pub fn cooling_kw_per_kw(unit: &telemetry::site::CoolingUnit) -> f64 {
    match unit.kind {
        telemetry::site::CoolingKind::Crah => CRAH_KW_PER_KW,
        telemetry::site::CoolingKind::Cdu => CDU_KW_PER_KW,
    }
}

/// The thermal model of the simulated facility, shared by the demo and the backtest:
/// where each rack's inlet is heading for the racks' power draw (W), and the electrical
/// power each cooling unit spends (W). `capacity_factor` scales every cooling unit's
/// capacity (a heat wave: 0.7).
///
/// Each unit's racks share its heat load: the inlet rises linearly with load up to the
/// unit's capacity (`full_load_rise_c` at full capacity), faster above it
/// (`overload_rise_c_per_kw`), and a rack drawing more than the unit's average sits
/// hotter by the unit's `rack_skew_c_per_kw`. Inlets follow their target with the unit's time
/// constant (first-order lag).
pub fn thermal_targets(
    site: &Site,
    rack_power_w: &[f64],
    capacity_factor: f64,
) -> (Vec<f64>, Vec<f64>) {
    thermal_targets_by_unit(
        site,
        rack_power_w,
        &vec![capacity_factor; site.cooling.len()],
    )
}

/// [`thermal_targets`] with a capacity factor per cooling unit (a unit with a failed
/// pump or a capacity drop has its own).
pub fn thermal_targets_by_unit(
    site: &Site,
    rack_power_w: &[f64],
    capacity_factor: &[f64],
) -> (Vec<f64>, Vec<f64>) {
    let mut target = vec![22.0; site.racks.len()];
    let mut cooling = vec![0.0; site.cooling.len()];
    for (ci, unit) in site.cooling.iter().enumerate() {
        let idx: Vec<usize> = unit
            .racks
            .iter()
            .filter_map(|r| site.rack_index(r))
            .collect();
        let capacity_kw =
            (unit.capacity_kw * capacity_factor.get(ci).copied().unwrap_or(1.0)).max(1e-6);
        let heat_kw: f64 = idx.iter().map(|&i| rack_power_w[i]).sum::<f64>() / 1000.0;
        let avg_kw = heat_kw / idx.len().max(1) as f64;
        let base = unit.supply_temp_c
            + unit.full_load_rise_c * heat_kw.min(capacity_kw) / capacity_kw
            + unit.overload_rise_c_per_kw * (heat_kw - capacity_kw).max(0.0);
        for &i in &idx {
            target[i] = base + unit.rack_skew_c_per_kw * (rack_power_w[i] / 1000.0 - avg_kw);
        }
        let per_kw = cooling_kw_per_kw(unit);
        cooling[ci] = heat_kw.min(capacity_kw) * per_kw * 1000.0;
    }
    (target, cooling)
}

/// Moves each rack's inlet toward its target over `dt_s` with its cooling unit's time
/// constant (300 s for a rack no unit cools).
pub(crate) fn follow(site: &Site, inlet_c: &mut [f64], target: &[f64], dt_s: f64) {
    for (ri, (inlet, t)) in inlet_c.iter_mut().zip(target).enumerate() {
        let tau = site
            .cooling_index_of(ri)
            .map_or(300.0, |c| site.cooling[c].time_constant_s);
        let k = 1.0 - (-dt_s / tau).exp();
        *inlet += (t - *inlet) * k;
    }
}
