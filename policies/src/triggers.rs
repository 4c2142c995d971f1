//! The thresholds the policy acts on, for event-driven evaluation: a sample that
//! crosses one between ticks (relative to the value the last evaluation saw) is worth
//! an evaluation at once rather than at the next tick.
//!
//! The levels: each rule's comparison of a metric with a number (`inlet_temp_c > 30`:
//! 30 for every entity's `inlet_temp_c`), the thermal controller's inlet limit less its
//! margin (per rack), and each budget's margin (a rack's and the facility's `power_w`
//! against budget × (1 − margin)). Pure: the same readings give the same answer.

use std::collections::BTreeMap;

use telemetry::fasthash::FnvMap;
use telemetry::metric::names::{INLET_TEMP_C, POWER_W};
use telemetry::{EntityId, Site};

use crate::expr::{Cond, Expr, Signal};
use crate::Policy;

/// The levels a reading crossing of which makes the engine look again.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Thresholds {
    /// From rules: any entity's reading of the metric.
    any: BTreeMap<String, Vec<f64>>,
    /// Per entity: (metric, level).
    own: FnvMap<EntityId, Vec<(&'static str, f64)>>,
}

/// The values the last evaluation saw of the watched series read since it (see
/// [`Thresholds::any_crossed_since`]).
#[derive(Debug, Clone, Default)]
pub struct SinceEvaluation {
    seen: FnvMap<EntityId, Vec<(telemetry::Metric, Option<f64>)>>,
}

impl SinceEvaluation {
    /// An evaluation ran: what it saw is the snapshot as it is now.
    pub fn clear(&mut self) {
        self.seen.clear();
    }
}

impl Thresholds {
    pub fn new(policy: &Policy, site: &Site) -> Thresholds {
        let mut t = Thresholds::default();
        for rule in policy.rules.iter().filter(|r| r.enabled) {
            for c in [&rule.when, &rule.release].into_iter().flatten() {
                t.add_levels(&c.cond);
            }
        }
        if policy.thermal.enabled {
            for r in &site.racks {
                t.own
                    .entry(EntityId::rack(&r.id))
                    .or_default()
                    .push((INLET_TEMP_C, r.inlet_limit_c - policy.thermal.margin_c));
            }
        }
        let b = &policy.budget;
        if b.enabled {
            for r in &site.racks {
                t.own
                    .entry(EntityId::rack(&r.id))
                    .or_default()
                    .push((POWER_W, r.power_budget_kw * 1000.0 * (1.0 - b.margin)));
            }
            let kw = crate::budget::facility_budget_kw(site, b);
            t.own
                .entry(site.site_entity())
                .or_default()
                .push((POWER_W, kw * 1000.0 * (1.0 - b.margin)));
        }
        for v in t.any.values_mut() {
            v.sort_by(f64::total_cmp);
            v.dedup();
        }
        t
    }

    fn add_levels(&mut self, c: &Cond) {
        match c {
            Cond::Cmp(x) => {
                let level = match (&x.lhs, &x.rhs) {
                    (Expr::Signal(Signal::Metric(m), _), Expr::Num(n))
                    | (Expr::Num(n), Expr::Signal(Signal::Metric(m), _)) => Some((m, *n)),
                    _ => None,
                };
                if let Some((m, n)) = level {
                    self.any.entry(m.clone()).or_default().push(n);
                }
            }
            Cond::And(v) | Cond::Or(v) => v.iter().for_each(|c| self.add_levels(c)),
            Cond::Not(c) => self.add_levels(c),
        }
    }

    /// Whether a reading of `metric` of `entity` going from `before` to `after` crosses
    /// one of the levels (either way). A first reading (`before` unknown) crosses the
    /// levels it is above.
    pub fn crossed(
        &self,
        entity: &EntityId,
        metric: &str,
        before: Option<f64>,
        after: f64,
    ) -> bool {
        let crosses = |level: f64| before.map_or(after > level, |b| (b > level) != (after > level));
        self.any
            .get(metric)
            .is_some_and(|v| v.iter().any(|&l| crosses(l)))
            || self
                .own
                .get(entity)
                .is_some_and(|v| v.iter().any(|&(m, l)| m == metric && crosses(l)))
    }

    /// Whether any of `samples` crosses a level against the value `seen` holds for
    /// it (the snapshot the last evaluation read).
    pub fn any_crossed(&self, seen: &telemetry::Snapshot, samples: &[telemetry::Sample]) -> bool {
        samples.iter().any(|s| {
            let before = seen.reading(&s.entity, s.metric.as_str()).map(|r| r.value);
            self.crossed(&s.entity, s.metric.as_str(), before, s.value)
        })
    }

    /// Whether a level watches `metric` of `entity`.
    pub fn watches(&self, entity: &EntityId, metric: &str) -> bool {
        self.any.contains_key(metric)
            || self
                .own
                .get(entity)
                .is_some_and(|v| v.iter().any(|&(m, _)| m == metric))
    }

    /// [`Thresholds::any_crossed`] for readings taken into `snapshot` as they arrive,
    /// between evaluations: each sample is compared with the value the last evaluation
    /// saw, which `since` keeps for every watched series that changed since. Call it
    /// before ingesting `samples`, and clear `since` after each evaluation. The answer is
    /// the one `any_crossed` gives with the readings held back until the evaluation.
    pub fn any_crossed_since(
        &self,
        snapshot: &telemetry::Snapshot,
        since: &mut SinceEvaluation,
        samples: &[telemetry::Sample],
    ) -> bool {
        let mut any = false;
        for s in samples {
            let metric = s.metric.as_str();
            if !self.watches(&s.entity, metric) {
                continue;
            }
            let seen = since.seen.get(&s.entity).and_then(|v| {
                v.iter()
                    .find(|(m, _)| m.as_str() == metric)
                    .map(|&(_, b)| b)
            });
            let before = match seen {
                Some(b) => b,
                None => {
                    let b = snapshot.reading(&s.entity, metric).map(|r| r.value);
                    since
                        .seen
                        .entry(s.entity.clone())
                        .or_default()
                        .push((s.metric.clone(), b));
                    b
                }
            };
            any |= self.crossed(&s.entity, metric, before, s.value);
        }
        any
    }

    pub fn is_empty(&self) -> bool {
        self.any.is_empty() && self.own.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn site() -> Site {
        Site::parse(
            "site.toml",
            r#"version = 1
[site]
name = "hall"
[[feeds]]
id = "utility"
rating_kw = 100
[[pdus]]
id = "p1"
feed = "utility"
rating_kw = 20
[[cooling]]
id = "c1"
capacity_kw = 50
racks = ["a01"]
[[rooms]]
id = "hall"
[[rows]]
id = "row-a"
room = "hall"
[[racks]]
id = "a01"
row = "row-a"
pdus = ["p1"]
inlet_limit_c = 32
nodes = 1
gpus_per_node = 4
gpu_model = "A40"
"#,
        )
        .expect("site")
    }

    #[test]
    fn a_rule_level_the_thermal_limit_and_the_budget_margin_are_crossings() {
        let policy = Policy::parse(
            "policy.toml",
            r#"version = 1
[budget]
margin = 0.1
[thermal]
margin_c = 1.0
[[rules]]
name = "hot-gpus"
scope = "gpu"
when = "gpu_temp_c > 85"
action = { cap_pct = 80 }
"#,
        )
        .expect("policy");
        let t = Thresholds::new(&policy, &site());
        let rack = EntityId::rack("a01");
        let gpu = EntityId::gpu("a01-n01", 0);
        assert!(t.crossed(&gpu, "gpu_temp_c", Some(80.0), 86.0));
        assert!(
            t.crossed(&gpu, "gpu_temp_c", Some(86.0), 84.0),
            "either way"
        );
        assert!(!t.crossed(&gpu, "gpu_temp_c", Some(86.0), 90.0));
        assert!(!t.crossed(&gpu, "power_w", Some(100.0), 300.0));
        assert!(
            t.crossed(&gpu, "gpu_temp_c", None, 90.0),
            "a first reading above"
        );
        assert!(!t.crossed(&gpu, "gpu_temp_c", None, 60.0));
        // the rack's inlet limit 32 °C less the 1 °C margin
        assert!(t.crossed(&rack, INLET_TEMP_C, Some(30.0), 31.5));
        assert!(!t.crossed(&rack, INLET_TEMP_C, Some(29.0), 30.5));
        // the rack's budget: 20 kW × 0.8 derate × 0.9 margin = 14.4 kW
        assert!(t.crossed(&rack, POWER_W, Some(14_000.0), 14_500.0));
        assert!(!t.crossed(&rack, POWER_W, Some(13_000.0), 14_000.0));
    }
    #[test]
    fn readings_ingested_as_they_arrive_cross_as_if_held_for_the_evaluation() {
        use telemetry::{Sample, Snapshot, Timestamp};
        let policy = Policy::parse("policy.toml", "version = 1\n[thermal]\nmargin_c = 1.0\n")
            .expect("policy");
        let site = site();
        let t = Thresholds::new(&policy, &site);
        let rack = EntityId::rack("a01");
        let at = |s: i64| Timestamp(1_700_000_000_000 + s * 1000);
        let inlet = |v: f64, s: i64| Sample::new(rack.clone(), INLET_TEMP_C, v, at(s), "t");
        // the last evaluation saw 30 °C (under 32 − 1)
        let mut snapshot = Snapshot::default();
        snapshot.ingest(inlet(30.0, 0), at(0)).expect("ingest");
        let mut since = SinceEvaluation::default();
        // readings in two looks: 31.5 (over 31) then back to 30.5
        for (look, want) in [(vec![inlet(31.5, 1)], true), (vec![inlet(30.5, 2)], false)] {
            assert_eq!(
                t.any_crossed_since(&snapshot, &mut since, &look),
                want,
                "against the evaluated 30 °C, not the 31.5 °C ingested since"
            );
            for s in look {
                snapshot.ingest(s, at(3)).expect("ingest");
            }
        }
        // held back, the same readings give the same answers
        let mut held = Snapshot::default();
        held.ingest(inlet(30.0, 0), at(0)).expect("ingest");
        assert!(t.any_crossed(&held, &[inlet(31.5, 1)]));
        assert!(!t.any_crossed(&held, &[inlet(30.5, 2)]));
        // after an evaluation, the reference is what the snapshot holds then (30.5)
        since.clear();
        assert!(!t.any_crossed_since(&snapshot, &mut since, &[inlet(30.8, 4)]));
        assert!(t.any_crossed_since(&snapshot, &mut since, &[inlet(31.2, 5)]));
        // an unwatched series is not kept
        let gpu = EntityId::gpu("a01-n01", 0);
        since.clear();
        t.any_crossed_since(
            &snapshot,
            &mut since,
            &[Sample::new(gpu, "gpu_temp_c", 90.0, at(6), "t")],
        );
        assert!(since.seen.is_empty());
    }
}
