//! GPU models and their power-limit constraints, the bounds no command may leave.

use serde::{Deserialize, Serialize};

/// What the site file or the GPU itself says about a GPU model's power.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuModel {
    pub name: String,
    /// Lowest power limit the GPU accepts.
    pub min_w: f64,
    /// Highest power limit the GPU accepts.
    pub max_w: f64,
    /// The limit the GPU runs at when nobody set one.
    pub default_w: f64,
    /// Power drawn with no work.
    pub idle_w: f64,
    /// How fast the model runs work against the site's reference, whose time the jobs'
    /// estimates are given in (1: the reference, 0.5: twice as long). Slack is counted
    /// at the slowest model a job runs on.
    #[serde(
        default = "GpuModel::reference_speed",
        skip_serializing_if = "GpuModel::is_reference_speed"
    )]
    pub speed: f64,
}

impl GpuModel {
    fn reference_speed() -> f64 {
        1.0
    }

    fn is_reference_speed(s: &f64) -> bool {
        *s == 1.0
    }

    /// Clamps a wanted power limit into the GPU's own constraints.
    pub fn clamp_limit(&self, watts: f64) -> f64 {
        if watts.is_nan() {
            return self.default_w;
        }
        watts.clamp(self.min_w, self.max_w)
    }

    /// Models whose constraints are known without a site file entry (NVML's values).
    pub fn builtin(name: &str) -> Option<GpuModel> {
        let (min_w, max_w, default_w, idle_w) = match name {
            "A40" => (100.0, 300.0, 300.0, 30.0),
            "V100" => (100.0, 300.0, 300.0, 40.0),
            "P100" => (125.0, 250.0, 250.0, 30.0),
            "RTX6000" => (100.0, 260.0, 260.0, 20.0),
            "A100" => (100.0, 400.0, 400.0, 55.0),
            "H100" => (200.0, 700.0, 700.0, 70.0),
            "H200" => (200.0, 700.0, 700.0, 75.0),
            _ => return None,
        };
        Some(GpuModel {
            name: name.to_string(),
            min_w,
            max_w,
            default_w,
            idle_w,
            speed: 1.0,
        })
    }

    pub const BUILTIN_NAMES: [&'static str; 7] =
        ["A40", "V100", "P100", "RTX6000", "A100", "H100", "H200"];
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn clamp_never_leaves_the_constraints(w in proptest::num::f64::ANY) {
            let m = GpuModel::builtin("A40").expect("builtin");
            let c = m.clamp_limit(w);
            prop_assert!(c >= m.min_w && c <= m.max_w, "{w} clamped to {c}");
        }
    }
}
