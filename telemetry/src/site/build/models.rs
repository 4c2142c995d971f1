//! The GPU models: the built-in ones and those the site file defines.

use super::*;

pub(super) fn check_model(
    c: &mut Collector,
    models: &BTreeMap<String, GpuModel>,
    owner: &str,
    m: &S<String>,
) {
    if !models.contains_key(m.get_ref()) {
        let known: Vec<&str> = models.keys().map(String::as_str).collect();
        c.at(
            span(m),
            format!(
                "{owner}: unknown gpu_model {:?} (known: {}; define others under [gpu_models])",
                m.get_ref(),
                known.join(", ")
            ),
        );
    }
}

pub(super) fn build_gpu_models(
    raw: &BTreeMap<String, S<RawGpuModel>>,
    c: &mut Collector,
) -> BTreeMap<String, GpuModel> {
    let mut models: BTreeMap<String, GpuModel> = GpuModel::BUILTIN_NAMES
        .iter()
        .filter_map(|n| GpuModel::builtin(n))
        .map(|m| (m.name.clone(), m))
        .collect();
    for (name, m) in raw {
        let v = m.get_ref();
        let default_w = v.default_w.unwrap_or(v.max_w);
        let idle_w = v.idle_w.unwrap_or(v.min_w * 0.3);
        let speed = v.speed.unwrap_or(1.0);
        let ok = v.min_w > 0.0 && v.min_w < v.max_w && v.max_w <= 5000.0;
        if !ok {
            c.at(span(m), format!("gpu model {name:?}: needs 0 < min_w < max_w <= 5000, got min_w {} and max_w {}", v.min_w, v.max_w));
        } else if !(v.min_w..=v.max_w).contains(&default_w) {
            c.at(
                span(m),
                format!("gpu model {name:?}: default_w {default_w} must be within min_w..=max_w"),
            );
        } else if !(0.0..=v.max_w).contains(&idle_w) {
            c.at(
                span(m),
                format!("gpu model {name:?}: idle_w {idle_w} must be within 0..=max_w"),
            );
        }
        if !(speed > 0.0 && speed <= 100.0) {
            c.at(
                span(m),
                format!("gpu model {name:?}: speed {speed} must be over 0 and at most 100 (1: the reference model's pace)"),
            );
        }
        models.insert(
            name.clone(),
            GpuModel {
                name: name.clone(),
                min_w: v.min_w,
                max_w: v.max_w,
                default_w,
                idle_w,
                speed,
            },
        );
    }
    models
}
