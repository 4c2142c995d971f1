//! The predictive rule against a simulated room that follows the same first-order
//! physics as its model: planned and surprise heat steps, cooling faults and restarts
//! with no state, within the model's stated bounds, never take an inlet over its limit.

use super::*;
use crate::{evaluate as engine, Forecast, Inputs, Policy};
use proptest::prelude::*;
use telemetry::metric::names::POWER_W;
use telemetry::Sample;

/// One cooling unit (2 kW, undersized) for two racks of one 4-GPU A40 node each. The
/// model's bounds: the inlet limit (28 °C) binds at full load (28.6 °C), and with every
/// GPU at its minimum the inlet settles under limit − margin even with the unit at 70%
/// of its capacity (27.1 °C); one tick (15 s of a 300 s time constant) moves an inlet
/// less than the margin however the demand steps.
const SITE: &str = r#"
version = 1
[site]
name = "t"
[[feeds]]
id = "f"
rating_kw = 10
derate = 1.0
[[cooling]]
id = "c"
capacity_kw = 2
supply_temp_c = 22
full_load_rise_c = 6
overload_rise_c_per_kw = 0.8
time_constant_s = 300
racks = ["r1", "r2"]
[[rooms]]
id = "h"
[[rows]]
id = "w"
room = "h"
[[racks]]
id = "r1"
row = "w"
inlet_limit_c = 28
power_budget_kw = 5
nodes = 1
gpus_per_node = 4
gpu_model = "A40"
node_base_w = 200
[[racks]]
id = "r2"
row = "w"
inlet_limit_c = 28
power_budget_kw = 5
nodes = 1
gpus_per_node = 4
gpu_model = "A40"
node_base_w = 200
"#;

const POLICY: &str = r#"
version = 1
[budget]
enabled = false
[price]
enabled = false
[thermal]
mode = "predictive"
margin_c = 0.5
"#;

const TICK_S: f64 = 15.0;

fn t0() -> Timestamp {
    Timestamp::from_secs(1_700_000_000)
}

/// The simulated room: what each GPU would draw, the caps in force, the inlets.
struct Room {
    site: Site,
    demand_w: Vec<f64>,
    capacity_factor: f64,
    inlet_c: Vec<f64>,
}

impl Room {
    fn draws(&self, state: &State) -> Vec<f64> {
        self.site
            .gpus()
            .iter()
            .zip(&self.demand_w)
            .map(|(g, d)| {
                let limit = state.caps.get(&g.id).map_or(g.model.default_w, |c| c.watts);
                d.min(limit)
            })
            .collect()
    }

    fn rack_w(&self, draws: &[f64]) -> Vec<f64> {
        let mut w = vec![200.0; self.site.racks.len()];
        for (g, d) in self.site.gpus().iter().zip(draws) {
            w[g.rack_index] += d;
        }
        w
    }

    /// One tick of first-order physics under the caps in force.
    fn step(&mut self, state: &State) {
        let u = &self.site.cooling[0];
        let rack_w = self.rack_w(&self.draws(state));
        let heat_kw: f64 = rack_w.iter().sum::<f64>() / 1000.0;
        let cap_kw = u.capacity_kw * self.capacity_factor;
        let k = 1.0 - (-TICK_S / u.time_constant_s).exp();
        for (t, w) in self.inlet_c.iter_mut().zip(&rack_w) {
            let ss = u.supply_temp_c
                + u.full_load_rise_c * (heat_kw / cap_kw).min(1.0)
                + u.overload_rise_c_per_kw * (heat_kw - cap_kw).max(0.0)
                + u.rack_skew_c_per_kw * (w / 1000.0 - heat_kw / 2.0);
            *t += (ss - *t) * k;
        }
    }

    fn snapshot(&self, state: &State, now: Timestamp) -> Snapshot {
        let mut s = Snapshot::new();
        let draws = self.draws(state);
        let mut put = |e: EntityId, m: &str, v: f64| {
            s.ingest(Sample::new(e, m, v, now, "t"), now)
                .expect("sample");
        };
        for (g, d) in self.site.gpus().iter().zip(&draws) {
            put(EntityId::clone(&g.id), POWER_W, *d);
        }
        for ((r, w), t) in self
            .site
            .racks
            .iter()
            .zip(self.rack_w(&draws))
            .zip(&self.inlet_c)
        {
            put(EntityId::rack(&r.id), POWER_W, w);
            put(EntityId::rack(&r.id), INLET_TEMP_C, *t);
        }
        let u = &self.site.cooling[0];
        put(
            EntityId::new(EntityKind::Cooling, &u.id),
            COOLING_CAPACITY_KW,
            u.capacity_kw * self.capacity_factor,
        );
        s
    }
}

/// What happens at a tick: every GPU of a rack changes its demand, the unit's capacity
/// falls (a pump or fan fault), or the controller restarts with no state (its caps
/// lapse and its fitted models are forgotten: it starts again from the site's prior).
#[derive(Debug, Clone)]
enum Event {
    Heat { rack: usize, demand_w: f64 },
    Fault { factor: f64 },
    Restart,
}

fn event() -> impl Strategy<Value = (usize, Event)> {
    (
        0usize..240,
        prop_oneof![
            (0usize..2, 30.0..300.0f64).prop_map(|(rack, demand_w)| Event::Heat { rack, demand_w }),
            (0.7..1.0f64).prop_map(|factor| Event::Fault { factor }),
            Just(Event::Restart),
        ],
    )
}

/// Runs the room for an hour under the predictive rule; the hottest inlet seen.
fn run(events: &[(usize, Event)], start_demand_w: f64) -> (f64, State) {
    let site = Site::parse("t.toml", SITE).expect("site");
    let policy = Policy::parse("p.toml", POLICY).expect("policy");
    let mut room = Room {
        demand_w: vec![start_demand_w; site.gpu_count()],
        inlet_c: vec![24.0; site.racks.len()],
        capacity_factor: 1.0,
        site: site.clone(),
    };
    let mut state = State::default();
    let mut hottest = f64::NEG_INFINITY;
    for tick in 0..240 {
        let now = t0() + tick as f64 * TICK_S;
        if tick > 0 {
            for (_, e) in events.iter().filter(|(at, _)| *at == tick) {
                match *e {
                    Event::Heat { rack, demand_w } => {
                        for (g, d) in site.gpus().iter().zip(room.demand_w.iter_mut()) {
                            if g.rack_index == rack {
                                *d = demand_w;
                            }
                        }
                    }
                    Event::Fault { factor } => {
                        room.capacity_factor = room.capacity_factor.min(factor)
                    }
                    Event::Restart => state = State::default(),
                }
            }
            room.step(&state);
        }
        hottest = room.inlet_c.iter().copied().fold(hottest, f64::max);
        let snap = room.snapshot(&state, now);
        let plan = engine(
            &Inputs {
                site: &site,
                snapshot: &snap,
                jobs: &[],
                prior: &state,
                policy: &policy,
                forecast: &Forecast::default(),
                job_table: None,
            },
            now,
        );
        state = plan.state;
    }
    (hottest, state)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn heat_steps_and_cooling_faults_within_bounds_never_cross_the_inlet_limit(
        events in prop::collection::vec(event(), 0..12),
        start in 30.0..300.0f64,
    ) {
        let (hottest, _) = run(&events, start);
        prop_assert!(hottest <= 28.0, "hottest inlet {hottest:.3} °C against 28 °C");
    }
}

#[test]
fn full_load_is_capped_before_the_limit_and_the_fit_persists_in_the_state() {
    let (hottest, state) = run(&[], 300.0);
    assert!(
        hottest <= 27.5 + 1e-6,
        "kept under limit − margin: {hottest}"
    );
    assert!(
        !state.caps.is_empty(),
        "full load would settle at 28.6 °C: capped"
    );
    let fit = state
        .thermal_models
        .get("r1")
        .expect("r1's fit is in the state");
    assert!(fit.samples > 100, "{fit:?}");
    assert!(fit.rms_c < 0.05, "the physics match the prior: {fit:?}");
}

#[test]
fn a_capacity_drop_changes_the_prediction_within_one_tick() {
    let site = Site::parse("t.toml", SITE).expect("site");
    let policy = Policy::parse("p.toml", POLICY).expect("policy");
    let mut room = Room {
        demand_w: vec![120.0; site.gpu_count()],
        inlet_c: vec![24.0; site.racks.len()],
        capacity_factor: 1.0,
        site: site.clone(),
    };
    let eval = |room: &Room, prior: &State, now: Timestamp| {
        engine(
            &Inputs {
                site: &site,
                snapshot: &room.snapshot(prior, now),
                jobs: &[],
                prior,
                policy: &policy,
                forecast: &Forecast::default(),
                job_table: None,
            },
            now,
        )
    };
    let before = eval(&room, &State::default(), t0());
    assert!(
        before.state.caps.is_empty(),
        "1.36 kW of 2 kW: no cap needed"
    );
    room.capacity_factor = 0.5;
    let after = eval(&room, &before.state, t0() + TICK_S);
    assert!(
        !after.state.caps.is_empty(),
        "half the capacity: capped at once"
    );
    let d = after
        .decisions
        .iter()
        .find(|d| d.rule == "thermal.inlet")
        .expect("a thermal decision");
    for key in [
        "inlet_temp_c",
        "predicted_peak_c",
        "predicted_peak_in_s",
        "margin_c",
        "model_rise_c",
        "model_tau_s",
        "capacity_kw",
    ] {
        assert!(d.values.contains_key(key), "{key} in {:?}", d.values);
    }
    assert_eq!(d.values["capacity_kw"], 1.0);
    assert!(d.reason.contains("predicted inlet"), "{}", d.reason);
}
