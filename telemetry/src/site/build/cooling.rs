//! The cooling units and the racks each serves.

use super::*;

pub(super) fn build_cooling(
    raw: &[RawCooling],
    rack_ids: &BTreeSet<String>,
    c: &mut Collector,
) -> Vec<CoolingUnit> {
    let mut ids = BTreeSet::new();
    let mut out = Vec::new();
    for u in raw {
        check_id(c, &mut ids, "cooling unit", &u.id);
        let owner = format!("cooling unit {:?}", u.id.get_ref());
        for r in u.racks.get_ref() {
            check_ref(c, rack_ids, "rack", &owner, r);
        }
        if u.racks.get_ref().is_empty() {
            c.at(span(&u.racks), format!("{owner} serves no racks"));
        }
        out.push(CoolingUnit {
            id: u.id.get_ref().clone(),
            kind: u.kind,
            capacity_kw: check_range(
                c,
                &u.capacity_kw,
                &format!("{owner}: capacity_kw"),
                0.001,
                100_000.0,
            ),
            supply_temp_c: opt_range(
                c,
                &u.supply_temp_c,
                &format!("{owner}: supply_temp_c"),
                5.0,
                45.0,
                22.0,
            ),
            full_load_rise_c: opt_range(
                c,
                &u.full_load_rise_c,
                &format!("{owner}: full_load_rise_c"),
                0.0,
                30.0,
                6.0,
            ),
            overload_rise_c_per_kw: opt_range(
                c,
                &u.overload_rise_c_per_kw,
                &format!("{owner}: overload_rise_c_per_kw"),
                0.0,
                10.0,
                0.5,
            ),
            time_constant_s: opt_range(
                c,
                &u.time_constant_s,
                &format!("{owner}: time_constant_s"),
                1.0,
                86_400.0,
                300.0,
            ),
            rack_skew_c_per_kw: opt_range(
                c,
                &u.rack_skew_c_per_kw,
                &format!("{owner}: rack_skew_c_per_kw"),
                0.0,
                5.0,
                0.15,
            ),
            racks: u
                .racks
                .get_ref()
                .iter()
                .map(|r| r.get_ref().clone())
                .collect(),
        });
    }
    out
}
