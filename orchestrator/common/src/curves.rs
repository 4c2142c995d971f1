//! How GPU power and speed respond to a power limit, from Zeus's measurements (NSDI 2023)
//! on the A40, V100, P100 and Quadro RTX 6000: [`a40`] for the demo's all-A40 halls,
//! [`CurveSet`] for halls of several models, each GPU on its own model's curves.

/// One workload's response: at a limit (fraction of the GPU's maximum), the power it
/// draws (fraction of the maximum) and its speed relative to running uncapped.
#[derive(Debug, Clone, PartialEq)]
pub struct Curve {
    pub name: String,
    points: Vec<(f64, f64, f64)>,
    /// Seconds per epoch at the highest limit: how fast this model runs the workload,
    /// to compare with another model's measurement of it.
    full_time_s: f64,
}

impl Curve {
    /// (power as a fraction of max, relative throughput) at a limit fraction.
    pub fn at(&self, limit_frac: f64) -> (f64, f64) {
        let p = &self.points;
        let x = limit_frac.clamp(p[0].0, p[p.len() - 1].0);
        let i = p.partition_point(|q| q.0 < x).clamp(1, p.len() - 1);
        let (a, b) = (p[i - 1], p[i]);
        let t = if b.0 > a.0 {
            (x - a.0) / (b.0 - a.0)
        } else {
            0.0
        };
        let power = a.1 + t * (b.1 - a.1);
        let speed = a.2 + t * (b.2 - a.2);
        // below the measured range the GPU cannot go lower: the limit still binds
        (power.min(limit_frac), speed)
    }
}

const A40_CSV: &str = include_str!("../../data/zeus/zeus_nsdi23_summary_power_a40.csv");
const A40_MAX_W: f64 = 300.0;

/// Every A40 workload with a complete sweep of limits.
pub fn a40() -> Vec<Curve> {
    parse(A40_CSV, A40_MAX_W)
}

const V100_CSV: &str = include_str!("../../data/zeus/zeus_nsdi23_summary_power_v100.csv");
const P100_CSV: &str = include_str!("../../data/zeus/zeus_nsdi23_summary_power_p100.csv");
const RTX6000_CSV: &str = include_str!("../../data/zeus/zeus_nsdi23_summary_power_rtx6000.csv");

/// The measured workloads of every GPU model Zeus measured, by the model's name in the
/// site's catalogue: a job draws one workload (a position in [`CurveSet::workloads`],
/// the A40's list), and each GPU it runs on answers with its own model's measurement of
/// that workload (or, for a workload its model was not measured on, the one at the same
/// relative place in its model's list), in watts of that model's sweep, at its model's
/// pace: the A40's time per epoch for the workload over its own (the median over the
/// workloads both were measured on, where its model was not measured on this one).
#[derive(Debug, Clone)]
pub struct CurveSet {
    sets: Vec<Set>,
}

#[derive(Debug, Clone)]
struct Set {
    model: String,
    curves: Vec<Curve>,
    /// The highest limit of the model's sweep (W): the curves' 1.0.
    sweep_max_w: f64,
    /// For each of the default set's workloads, its position in `curves`, and the pace
    /// there relative to the default model's.
    map: Vec<(usize, f64)>,
}

/// One model's measurement of a workload, as a GPU reads it.
#[derive(Debug, Clone, Copy)]
pub struct Measured<'c> {
    pub curve: &'c Curve,
    /// The watts the curve's fractions are of: the sweep's highest limit for a
    /// measured model, else `None` (the GPU's own maximum).
    pub sweep_max_w: Option<f64>,
    /// Speed relative to the default model running the workload at full power.
    pub pace: f64,
}

impl CurveSet {
    /// Every model Zeus measured; the A40 is the default.
    pub fn measured() -> CurveSet {
        CurveSet::new(vec![
            ("A40".to_string(), a40(), A40_MAX_W),
            ("V100".to_string(), parse(V100_CSV, 250.0), 250.0),
            ("P100".to_string(), parse(P100_CSV, 250.0), 250.0),
            ("RTX6000".to_string(), parse(RTX6000_CSV, 260.0), 260.0),
        ])
    }

    /// The given models' curves with their sweeps' highest limits; the first is the
    /// default and names the workloads.
    pub fn new(sets: Vec<(String, Vec<Curve>, f64)>) -> CurveSet {
        let sets: Vec<_> = sets.into_iter().filter(|(_, c, _)| !c.is_empty()).collect();
        // the default's workloads: their names and how fast the default model runs them
        let base: Vec<(String, f64)> = sets.first().map_or_else(Vec::new, |s| {
            s.1.iter()
                .map(|c| (c.name.clone(), c.full_time_s))
                .collect()
        });
        let sets = sets
            .into_iter()
            .map(|(model, curves, sweep_max_w)| {
                // each default workload's place in this model's list and its pace there
                let same: Vec<Option<(usize, f64)>> = base
                    .iter()
                    .map(|(name, t)| {
                        let o = curves.iter().position(|c| &c.name == name)?;
                        let pace = t / curves[o].full_time_s;
                        (pace.is_finite() && pace > 0.0).then_some((o, pace))
                    })
                    .collect();
                let mut paces: Vec<f64> = same.iter().flatten().map(|&(_, p)| p).collect();
                paces.sort_by(f64::total_cmp);
                let median = paces.get(paces.len() / 2).copied().unwrap_or(1.0);
                let map = same
                    .iter()
                    .enumerate()
                    .map(|(i, found)| {
                        found.unwrap_or_else(|| {
                            let at = (i * curves.len() / base.len().max(1)).min(curves.len() - 1);
                            (at, median)
                        })
                    })
                    .collect();
                Set {
                    model,
                    curves,
                    sweep_max_w,
                    map,
                }
            })
            .collect();
        CurveSet { sets }
    }

    /// The workloads a job draws from (the default model's).
    pub fn workloads(&self) -> &[Curve] {
        self.sets.first().map_or(&[], |s| &s.curves)
    }

    /// The set a GPU model answers from: `Some` for a measured model, `None` for one
    /// that uses the default's curves scaled to its own maximum at the default's pace.
    pub fn set_of(&self, model: &str) -> Option<usize> {
        self.sets.iter().position(|s| s.model == model)
    }

    /// Workload `w` (a position in [`CurveSet::workloads`]) on set `set` (`None`: the
    /// default's curve, scaled to the GPU's own maximum).
    pub fn curve(&self, set: Option<usize>, w: usize) -> Measured<'_> {
        match set {
            Some(s) => {
                let set = &self.sets[s];
                let (at, pace) = set.map[w];
                Measured {
                    curve: &set.curves[at],
                    sweep_max_w: Some(set.sweep_max_w),
                    pace,
                }
            }
            None => Measured {
                curve: &self.sets[0].curves[w],
                sweep_max_w: None,
                pace: 1.0,
            },
        }
    }
}

/// Parses Zeus's `summary_power` CSV; keeps workloads measured at every limit.
pub fn parse(csv: &str, max_w: f64) -> Vec<Curve> {
    use std::collections::BTreeMap;
    let mut groups: BTreeMap<String, Vec<(f64, f64, f64)>> = BTreeMap::new();
    for line in csv.lines().skip(1) {
        let f: Vec<&str> = line.split(',').collect();
        if f.len() != 7 {
            continue;
        }
        let (Ok(limit), Ok(tpe), Ok(power)) = (
            f[4].parse::<f64>(),
            f[5].parse::<f64>(),
            f[6].parse::<f64>(),
        ) else {
            continue;
        };
        let key = format!("{}/{}/bs{}", f[0], f[1], f[2]);
        groups.entry(key).or_default().push((limit, tpe, power));
    }
    // the limits the sweep went through; a workload measured at each once is kept (one
    // measured twice, with two optimizers, is not one curve)
    let limits = groups
        .values()
        .flatten()
        .map(|r| r.0.to_bits())
        .collect::<std::collections::BTreeSet<_>>()
        .len();
    let mut out = Vec::new();
    for (name, mut rows) in groups {
        if rows.len() != limits || limits < 2 {
            continue;
        }
        rows.sort_by(|a, b| a.0.total_cmp(&b.0));
        let t_max = rows[rows.len() - 1].1;
        let points = rows
            .iter()
            .map(|&(l, tpe, p)| (l / max_w, (p / max_w).min(1.0), (t_max / tpe).min(1.0)))
            .collect();
        out.push(Curve {
            name,
            points,
            full_time_s: t_max,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_model_answers_from_its_own_measurements_of_the_same_workload() {
        let set = CurveSet::measured();
        let w = set.workloads();
        assert_eq!(w, a40().as_slice());
        let r = w
            .iter()
            .position(|c| c.name == "imagenet/resnet50/bs128")
            .expect("resnet50 on the A40");
        let a40 = set.curve(set.set_of("A40"), r);
        assert_eq!(
            (a40.curve, a40.sweep_max_w, a40.pace),
            (&w[r], Some(300.0), 1.0)
        );
        for model in ["V100", "P100", "RTX6000"] {
            let s = set.set_of(model);
            assert!(s.is_some_and(|s| s > 0), "{model} was measured");
            let m = set.curve(s, r);
            assert_eq!(m.curve.name, w[r].name, "{model}: the same workload");
            assert_ne!(m.curve, &w[r], "{model}: its own measurement");
            // every workload has a curve on every model, each slower under a cap, and
            // a pace of its own
            for i in 0..w.len() {
                let m = set.curve(s, i);
                assert!(
                    m.curve.at(0.6).1 <= m.curve.at(1.0).1 + 1e-9,
                    "{model} {}",
                    m.curve.name
                );
                assert!(
                    m.pace > 0.05 && m.pace < 5.0,
                    "{model} {}: {}",
                    m.curve.name,
                    m.pace
                );
            }
        }
        // resnet50 at batch 128: the A40 runs an epoch in 3739.5 s at 300 W, the P100 in
        // its own time at 250 W; the V100 draws 222.4 W at 250 W
        let v100 = set.curve(set.set_of("V100"), r);
        let (p, s) = v100.curve.at(1.0);
        assert!(
            (p * 250.0 - 222.439).abs() < 0.01 && (s - 1.0).abs() < 1e-9,
            "{p} {s}"
        );
        assert!(
            (v100.pace - 3739.5 / 3603.5966666666664).abs() < 1e-9,
            "{}",
            v100.pace
        );
        let p100 = set.curve(set.set_of("P100"), r);
        assert!(p100.pace < 0.8, "the P100 is slower: {}", p100.pace);
        // a model Zeus did not measure answers with the A40's, at the A40's pace
        let h = set.curve(set.set_of("H100"), r);
        assert_eq!((h.curve, h.sweep_max_w, h.pace), (&w[r], None, 1.0));
    }

    #[test]
    fn the_measured_curves_slow_down_and_draw_less_under_a_cap() {
        let curves = a40();
        assert!(curves.len() >= 20, "{} workloads", curves.len());
        let mut slower = 0;
        for c in &curves {
            let (p_full, s_full) = c.at(1.0);
            let (p_low, s_low) = c.at(1.0 / 3.0);
            assert!((s_full - 1.0).abs() < 1e-9, "{}", c.name);
            assert!(
                p_low <= p_full + 0.02 && s_low <= s_full,
                "{}: {p_low} {p_full} {s_low} {s_full}",
                c.name
            );
            assert!(p_low <= 1.0 / 3.0 + 1e-9, "a limit binds: {}", c.name);
            slower += usize::from(s_low < 0.9);
        }
        // small models (shufflenet at small batches) never reach the cap; most workloads slow
        let heavy = curves.iter().filter(|c| c.at(1.0).0 > 0.6).count();
        assert!(
            curves
                .iter()
                .filter(|c| c.at(1.0).0 > 0.6)
                .all(|c| c.at(1.0 / 3.0).0 < c.at(1.0).0 * 0.6),
            "{heavy} heavy workloads draw less under a cap"
        );
        assert!(
            slower * 2 >= curves.len(),
            "{slower} of {} slow down by over 10%",
            curves.len()
        );
        // resnet50 at batch 128: 300 W limit draws 244 W; 200 W limit runs at 3739.5/3992.39
        let r = curves
            .iter()
            .find(|c| c.name == "imagenet/resnet50/bs128")
            .expect("resnet50");
        let (p, s) = r.at(200.0 / 300.0);
        assert!(
            (p * 300.0 - 179.226).abs() < 0.01 && (s - 3739.5 / 3992.39).abs() < 1e-6,
            "{p} {s}"
        );
    }
}
