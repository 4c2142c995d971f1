//! How GPU power and speed respond to a power limit, from Zeus's A40 measurements.

/// One workload's response: at a limit (fraction of the GPU's maximum), the power it
/// draws (fraction of the maximum) and its speed relative to running uncapped.
#[derive(Debug, Clone, PartialEq)]
pub struct Curve {
    pub name: String,
    points: Vec<(f64, f64, f64)>,
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
    let limits: usize = groups.values().map(Vec::len).max().unwrap_or(0);
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
        out.push(Curve { name, points });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

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
