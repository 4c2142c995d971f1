//! The site's side of `/metrics`: readings, budgets and headroom, rows, PUE, caps and holds,
//! read from the board's snapshot and state.

use std::collections::BTreeMap;

use telemetry::metric::names::*;
use telemetry::{EntityKind, Quality};

use super::exposition::{prom, Out};
use super::Board;

/// How the GPUs' own series are exported: one by one while the site has at most
/// `gpu_series` GPUs; summed up by node while it has at most `gpu_series` nodes; by
/// rack beyond.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum GpuSeries {
    Each,
    ByNode,
    ByRack,
}

fn gpu_series_of(b: &Board, gpu_series: usize) -> GpuSeries {
    if b.site.gpu_count() <= gpu_series {
        GpuSeries::Each
    } else if b.site.nodes.len() <= gpu_series {
        GpuSeries::ByNode
    } else {
        GpuSeries::ByRack
    }
}

/// Every reading of a known metric with its age and quality; the GPUs' one by one,
/// by node or by rack (see [`GpuSeries`], [`grouped_gpus`]), so that the scrape of a
/// 500,000-GPU site stays a few MB.
pub(super) fn readings(o: &mut Out, b: &Board, gpu_series: usize) {
    let now = b.time;
    let grouping = gpu_series_of(b, gpu_series);
    let rack_of: BTreeMap<&str, &str> = match grouping {
        GpuSeries::ByRack => b
            .site
            .nodes
            .iter()
            .map(|n| (n.id.as_str(), n.rack.as_str()))
            .collect(),
        _ => BTreeMap::new(),
    };
    let mut groups: BTreeMap<(&str, &str), NodeGpus> = BTreeMap::new();
    for (e, m, r) in b.snapshot.iter() {
        let Some((name, scale, help)) = prom(m.as_str()) else {
            continue;
        };
        if grouping != GpuSeries::Each && e.kind == EntityKind::Gpu {
            let node = e.name.rsplit_once(':').map_or(e.name.as_str(), |(n, _)| n);
            let key = match grouping {
                GpuSeries::ByRack => rack_of.get(node).copied().unwrap_or(node),
                _ => node,
            };
            groups
                .entry((key, m.as_str()))
                .or_default()
                .add(r.value * scale);
            continue;
        }
        let kind = e.kind.as_str().to_string();
        let labels = [("entity", e.to_string()), ("kind", kind)];
        let l: Vec<(&str, &str)> = labels.iter().map(|(k, v)| (*k, v.as_str())).collect();
        o.add(name, family_kind(m.as_str()), help, &l, r.value * scale);
        if e.kind != EntityKind::Gpu {
            let l = [("entity", labels[0].1.as_str()), ("metric", m.as_str())];
            o.add(
                "telemetry_age_seconds",
                "gauge",
                "Age of the latest reading",
                &l,
                now.secs_since(r.ts).max(0.0),
            );
        }
        if r.quality == Quality::Bad {
            o.add(
                "telemetry_bad",
                "gauge",
                "1 for a reading its source marked bad",
                &[("entity", labels[0].1.as_str()), ("metric", m.as_str())],
                1.0,
            );
        }
    }
    grouped_gpus(o, &groups, grouping == GpuSeries::ByRack);
    o.add(
        "gpu_series_per_node",
        "gauge",
        "1 when the GPUs' readings are summed up by node or by rack ([http] metrics_gpu_series is below the site's GPUs), 0 when each GPU has its own series",
        &[],
        if grouping == GpuSeries::Each { 0.0 } else { 1.0 },
    );
    o.add(
        "gpu_series_per_rack",
        "gauge",
        "1 when the GPUs' readings and caps are summed up by rack ([http] metrics_gpu_series is below the site's nodes too)",
        &[],
        if grouping == GpuSeries::ByRack { 1.0 } else { 0.0 },
    );
    o.add(
        "telemetry_stale_readings",
        "gauge",
        "Readings older than their freshness bound",
        &[],
        b.snapshot.stale(now).len() as f64,
    );
}

/// Energy readings are the devices' own counters (a reset restarts them, which
/// Prometheus' `rate` and `increase` take as a counter reset); the rest are gauges.
fn family_kind(metric: &str) -> &'static str {
    if metric == ENERGY_J {
        "counter"
    } else {
        "gauge"
    }
}

/// One node's GPUs' readings of one metric.
#[derive(Default)]
struct NodeGpus {
    sum: f64,
    max: f64,
    n: usize,
}

impl NodeGpus {
    fn add(&mut self, v: f64) {
        self.max = if self.n == 0 { v } else { self.max.max(v) };
        self.sum += v;
        self.n += 1;
    }
}

/// The GPUs' readings by node (or rack), under the per-GPU families' names with `kind
/// = "node_gpus"` (`"rack_gpus"`) and the node (rack) as `entity`: power, energy and
/// limits summed; temperature the hottest GPU's; utilization and clock the mean.
fn grouped_gpus(o: &mut Out, groups: &BTreeMap<(&str, &str), NodeGpus>, by_rack: bool) {
    let (prefix, kind) = if by_rack {
        ("rack", "rack_gpus")
    } else {
        ("node", "node_gpus")
    };
    for ((key, metric), g) in groups {
        let Some((name, _, help)) = prom(metric) else {
            continue;
        };
        let v = match *metric {
            GPU_TEMP_C => g.max,
            UTILIZATION_PCT | SM_CLOCK_MHZ => g.sum / g.n.max(1) as f64,
            _ => g.sum,
        };
        let entity = format!("{prefix}/{key}");
        o.add(
            name,
            family_kind(metric),
            help,
            &[("entity", &entity), ("kind", kind)],
            v,
        );
    }
}

/// The site's and the feeds' budgets, and the site's headroom.
pub(super) fn site_budgets(o: &mut Out, b: &Board) {
    let now = b.time;
    let site_id = b.site.site_entity().to_string();
    let facility_w = b.site.facility_budget_kw() * 1000.0;
    o.add(
        "budget_watts",
        "gauge",
        "Power budget",
        &[("entity", &site_id), ("kind", "site")],
        facility_w,
    );
    if let Some(p) = b.snapshot.observe(&b.site.site_entity(), POWER_W, now) {
        o.add(
            "headroom_watts",
            "gauge",
            "Budget minus measured power",
            &[("entity", &site_id), ("kind", "site")],
            facility_w - p.value,
        );
    }
    for f in &b.site.feeds {
        let id = format!("feed/{}", f.id);
        o.add(
            "budget_watts",
            "gauge",
            "Power budget",
            &[("entity", &id), ("kind", "feed")],
            f.usable_kw() * 1000.0,
        );
    }
}

/// Each rack's budget, headroom, inlet limit and predicted inlet.
pub(super) fn racks(o: &mut Out, b: &Board) {
    let now = b.time;
    for r in &b.site.racks {
        let id = telemetry::EntityId::new(EntityKind::Rack, r.id.clone());
        let ids = id.to_string();
        o.add(
            "budget_watts",
            "gauge",
            "Power budget",
            &[("entity", &ids), ("kind", "rack")],
            r.power_budget_kw * 1000.0,
        );
        if let Some(p) = b.snapshot.observe(&id, POWER_W, now) {
            o.add(
                "headroom_watts",
                "gauge",
                "Budget minus measured power",
                &[("entity", &ids), ("kind", "rack")],
                r.power_budget_kw * 1000.0 - p.value,
            );
        }
        o.add(
            "inlet_limit_celsius",
            "gauge",
            "Rack inlet temperature limit",
            &[("entity", &ids)],
            r.inlet_limit_c,
        );
        if let Some(t) = b.snapshot.observe(&id, INLET_TEMP_C, now) {
            o.add(
                "inlet_headroom_celsius",
                "gauge",
                "Inlet limit minus measured inlet",
                &[("entity", &ids)],
                r.inlet_limit_c - t.value,
            );
        }
        if let Some(p) = b.predictions.get(&r.id) {
            o.add(
                "predicted_inlet_peak_celsius",
                "gauge",
                "Highest inlet the predictive thermal rule expects within its horizon",
                &[("entity", &ids)],
                p.peak_c,
            );
            o.add(
                "predicted_inlet_headroom_celsius",
                "gauge",
                "Inlet limit minus margin minus the predicted peak",
                &[("entity", &ids)],
                p.headroom_c(),
            );
        }
    }
}

/// Rows: the sum of their racks, when every rack of the row has a fresh reading.
pub(super) fn rows(o: &mut Out, b: &Board) {
    let now = b.time;
    for row in &b.site.rows {
        let racks: Vec<_> = b.site.racks.iter().filter(|r| r.row == row.id).collect();
        let readings: Vec<f64> = racks
            .iter()
            .filter_map(|r| {
                b.snapshot.observe(
                    &telemetry::EntityId::new(EntityKind::Rack, r.id.clone()),
                    POWER_W,
                    now,
                )
            })
            .filter(|o| !o.stale)
            .map(|o| o.value)
            .collect();
        if !racks.is_empty() && readings.len() == racks.len() {
            let id = format!("row/{}", row.id);
            o.add(
                "row_power_watts",
                "gauge",
                "Power of a row: the sum of its racks' fresh readings",
                &[("entity", &id)],
                readings.iter().sum(),
            );
            let budget: f64 = racks.iter().map(|r| r.power_budget_kw * 1000.0).sum();
            o.add(
                "budget_watts",
                "gauge",
                "Power budget",
                &[("entity", &id), ("kind", "row")],
                budget,
            );
        }
    }
}

/// PUE: (IT + cooling) / IT, when every rack and some cooling power are fresh.
pub(super) fn pue(o: &mut Out, b: &Board) {
    let now = b.time;
    let rack_w: Option<f64> = b
        .site
        .racks
        .iter()
        .map(|r| {
            b.snapshot
                .observe(
                    &telemetry::EntityId::new(EntityKind::Rack, r.id.clone()),
                    POWER_W,
                    now,
                )
                .filter(|o| !o.stale)
                .map(|o| o.value)
        })
        .sum();
    let cooling_w: Vec<f64> = b
        .site
        .cooling
        .iter()
        .filter_map(|c| {
            b.snapshot
                .observe(
                    &telemetry::EntityId::new(EntityKind::Cooling, c.id.clone()),
                    COOLING_POWER_W,
                    now,
                )
                .filter(|o| !o.stale)
                .map(|o| o.value)
        })
        .collect();
    if let (Some(it), false) = (rack_w, cooling_w.is_empty()) {
        if it > 0.0 {
            o.add(
                "pue_ratio",
                "gauge",
                "Power usage effectiveness: (IT + cooling) / IT",
                &[],
                (it + cooling_w.iter().sum::<f64>()) / it,
            );
        }
    }
}

/// Caps and holds in force.
pub(super) fn caps_and_holds(o: &mut Out, b: &Board, gpu_series: usize) {
    let mut capped_per_rack: BTreeMap<&str, (u32, f64)> = BTreeMap::new();
    let each = gpu_series_of(b, gpu_series) == GpuSeries::Each;
    let gpus = b.site.gpus();
    for g in &gpus {
        if let Some(c) = b.state.caps.get(&g.id) {
            if each {
                o.add(
                    "gpu_cap_watts",
                    "gauge",
                    "Cap in force on a GPU (beyond [http] metrics_gpu_series GPUs: the lowest cap in force in each rack, kind=\"rack_gpus\")",
                    &[("entity", &g.id.to_string()), ("rule", &c.rule)],
                    c.watts,
                );
            }
            let e = capped_per_rack.entry(&g.rack.id).or_insert((0, f64::MAX));
            e.0 += 1;
            e.1 = e.1.min(c.watts);
        }
    }
    for r in &b.site.racks {
        let n = capped_per_rack.get(r.id.as_str()).map_or(0, |c| c.0);
        if let (false, Some((_, lowest))) = (each, capped_per_rack.get(r.id.as_str())) {
            o.add(
                "gpu_cap_watts",
                "gauge",
                "Cap in force on a GPU (beyond [http] metrics_gpu_series GPUs: the lowest cap in force in each rack, kind=\"rack_gpus\")",
                &[("entity", &format!("rack/{}", r.id)), ("kind", "rack_gpus")],
                *lowest,
            );
        }
        o.add(
            "capped_gpus",
            "gauge",
            "GPUs under a cap",
            &[("entity", &format!("rack/{}", r.id))],
            f64::from(n),
        );
    }
    o.add(
        "caps_in_force",
        "gauge",
        "GPUs under a cap",
        &[],
        b.state.caps.len() as f64,
    );
    o.add(
        "holds_in_force",
        "gauge",
        "Jobs held by powerplane",
        &[],
        b.state.holds.len() as f64,
    );
    o.add(
        "observed_caps",
        "gauge",
        "Caps rules in observe mode would have in force",
        &[],
        b.state.observed_caps.len() as f64,
    );
}
