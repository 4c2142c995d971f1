//! `/metrics` in the Prometheus text exposition format (0.0.4).

use std::collections::BTreeMap;
use std::fmt::Write;

use telemetry::metric::names::*;
use telemetry::{EntityKind, Quality};

use super::Board;
use crate::fleet::FleetStatus;

/// Prometheus name, scale to base units, help.
fn prom(metric: &str) -> Option<(&'static str, f64, &'static str)> {
    Some(match metric {
        POWER_W => ("power_watts", 1.0, "Electrical power drawn"),
        ENERGY_J => (
            "energy_reading_joules",
            1.0,
            "Cumulative energy as the device reports it (restarts from 0 on a reset)",
        ),
        POWER_LIMIT_W => ("gpu_power_limit_watts", 1.0, "Power limit the GPU enforces"),
        GPU_TEMP_C => ("gpu_temperature_celsius", 1.0, "GPU temperature"),
        UTILIZATION_PCT => ("gpu_utilization_ratio", 0.01, "GPU utilization"),
        SM_CLOCK_MHZ => ("gpu_sm_clock_hertz", 1e6, "GPU SM clock"),
        INLET_TEMP_C => (
            "inlet_temperature_celsius",
            1.0,
            "Rack inlet air temperature",
        ),
        SUPPLY_TEMP_C => (
            "supply_temperature_celsius",
            1.0,
            "Coolant or air supply temperature",
        ),
        RETURN_TEMP_C => (
            "return_temperature_celsius",
            1.0,
            "Coolant or air return temperature",
        ),
        HEAT_LOAD_KW => ("heat_load_watts", 1000.0, "Heat load on a cooling unit"),
        COOLING_POWER_W => ("cooling_power_watts", 1.0, "Power drawn by cooling"),
        FLOW_LPM => ("coolant_flow_liters_per_second", 1.0 / 60.0, "Coolant flow"),
        PRESSURE_KPA => ("pressure_pascals", 1000.0, "Coolant pressure"),
        CURRENT_A => ("current_amperes", 1.0, "Electrical current"),
        VOLTAGE_V => ("voltage_volts", 1.0, "Voltage"),
        HUMIDITY_PCT => ("humidity_ratio", 0.01, "Relative humidity"),
        FAN_SPEED_PCT => ("fan_speed_ratio", 0.01, "Fan speed"),
        LEAK_DETECTED => ("leak_detected", 1.0, "1 when a leak detector trips"),
        PRICE_PER_KWH => (
            "price_per_kwh",
            1.0,
            "Electricity price now, in the site's currency",
        ),
        CARBON_G_PER_KWH => (
            "carbon_grams_per_kwh",
            1.0,
            "Carbon intensity of the grid now",
        ),
        PERIOD_PEAK_W => (
            "period_peak_watts",
            1.0,
            "The billing period's highest demand-interval average of IT power so far",
        ),
        DAY_PEAK_W => (
            "day_peak_watts",
            1.0,
            "The highest demand-interval average of IT power over the last 24 hours",
        ),
        _ => return None,
    })
}

fn esc(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// One metric family, written whole (HELP, TYPE, samples) so families never interleave.
struct Family {
    help: String,
    kind: &'static str,
    samples: Vec<(String, f64)>,
}

#[derive(Default)]
struct Out {
    families: BTreeMap<String, Family>,
}

impl Out {
    fn add(&mut self, name: &str, kind: &'static str, help: &str, labels: &[(&str, &str)], v: f64) {
        if !v.is_finite() {
            return;
        }
        let l = labels
            .iter()
            .map(|(k, v)| format!("{k}=\"{}\"", esc(v)))
            .collect::<Vec<_>>()
            .join(",");
        let f = self
            .families
            .entry(format!("powerplane_{name}"))
            .or_insert(Family {
                help: help.to_string(),
                kind,
                samples: Vec::new(),
            });
        f.samples.push((
            if l.is_empty() {
                String::new()
            } else {
                format!("{{{l}}}")
            },
            v,
        ));
    }

    fn render(self) -> String {
        let mut s = String::new();
        for (name, f) in self.families {
            let _ = writeln!(s, "# HELP {name} {}", f.help);
            let _ = writeln!(s, "# TYPE {name} {}", f.kind);
            for (labels, v) in f.samples {
                let _ = writeln!(s, "{name}{labels} {v}");
            }
        }
        s
    }
}

/// The exposition text for the board (and the fleet, when agents are commanded).
pub fn render(b: &Board, fleet: Option<&FleetStatus<'_>>) -> String {
    let mut o = Out::default();
    let now = b.time;
    o.add(
        "build_info",
        "gauge",
        "1, labelled with the version of powerplane that serves these metrics",
        &[("version", env!("CARGO_PKG_VERSION"))],
        1.0,
    );
    let ha = b.ha_status();
    o.add(
        "leader",
        "gauge",
        "1 on the replica that actuates (the leader; a controller without [ha]), 0 on a follower",
        &[("instance", ha.instance.as_str())],
        if ha.is_leader() { 1.0 } else { 0.0 },
    );
    o.add(
        "leader_epoch",
        "gauge",
        "The fencing epoch of the current leader's term, as this replica knows it (0 without [ha])",
        &[],
        ha.epoch as f64,
    );
    o.add(
        "leader_transitions_total",
        "counter",
        "Terms this replica started or lost",
        &[],
        ha.transitions as f64,
    );
    // telemetry: every reading of a known metric, GPUs included
    for (e, m, r) in b.snapshot.iter() {
        let Some((name, scale, help)) = prom(m.as_str()) else {
            continue;
        };
        let kind = e.kind.as_str().to_string();
        let labels = [("entity", e.to_string()), ("kind", kind)];
        let l: Vec<(&str, &str)> = labels.iter().map(|(k, v)| (*k, v.as_str())).collect();
        o.add(name, "gauge", help, &l, r.value * scale);
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
    o.add(
        "telemetry_stale_readings",
        "gauge",
        "Readings older than their freshness bound",
        &[],
        b.snapshot.stale(now).len() as f64,
    );
    // budgets and headroom
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
    // rows: the sum of their racks, when every rack of the row has a fresh reading
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
    // PUE: (IT + cooling) / IT, when every rack and some cooling power are fresh
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
    // caps and holds in force
    let mut capped_per_rack: BTreeMap<&str, (u32, f64)> = BTreeMap::new();
    let gpus = b.site.gpus();
    for g in &gpus {
        if let Some(c) = b.state.caps.get(&g.id) {
            o.add(
                "gpu_cap_watts",
                "gauge",
                "Cap in force on a GPU",
                &[("entity", &g.id.to_string()), ("rule", &c.rule)],
                c.watts,
            );
            let e = capped_per_rack.entry(&g.rack.id).or_insert((0, f64::MAX));
            e.0 += 1;
            e.1 = e.1.min(c.watts);
        }
    }
    for r in &b.site.racks {
        let n = capped_per_rack.get(r.id.as_str()).map_or(0, |c| c.0);
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
    // what the loop counted
    let c = &b.counters;
    o.add(
        "ticks_total",
        "counter",
        "Control loop ticks",
        &[],
        c.ticks as f64,
    );
    o.add(
        "samples_total",
        "counter",
        "Samples ingested",
        &[("result", "accepted")],
        c.samples_accepted as f64,
    );
    o.add(
        "samples_total",
        "counter",
        "Samples ingested",
        &[("result", "older_ignored")],
        c.samples_older_ignored as f64,
    );
    for (reason, n) in &c.samples_rejected {
        o.add(
            "samples_rejected_total",
            "counter",
            "Samples rejected, by reason",
            &[("reason", reason)],
            *n as f64,
        );
    }
    o.add(
        "samples_rejected_total",
        "counter",
        "Samples rejected, by reason",
        &[("reason", "none")],
        0.0,
    );
    o.add(
        "energy_meter_resets_total",
        "counter",
        "Energy meters that went backwards (device reset or wrap)",
        &[],
        c.counter_resets as f64,
    );
    o.add(
        "actuation_errors_total",
        "counter",
        "Actuations that failed",
        &[],
        c.actuation_errors as f64,
    );
    o.add(
        "tick_delay_seconds",
        "gauge",
        "How late the last tick started past its due time",
        &[],
        b.cadence.delay_s,
    );
    o.add(
        "tick_delay_max_seconds",
        "gauge",
        "The largest tick delay since start",
        &[],
        b.cadence.delay_max_s,
    );
    o.add(
        "tick_duration_seconds",
        "gauge",
        "How long the last complete tick took",
        &[],
        b.cadence.duration_s,
    );
    o.add(
        "event_crossings_total",
        "counter",
        "Samples that crossed a threshold of the policy between evaluations",
        &[],
        b.cadence.event_crossings as f64,
    );
    o.add(
        "event_evaluations_total",
        "counter",
        "Evaluations made at once for crossings, between ticks",
        &[],
        b.cadence.event_evaluations as f64,
    );
    for (name, help, v) in &b.scheduler_counters {
        let kind = if name.ends_with("_total") {
            "counter"
        } else {
            "gauge"
        };
        o.add(name, kind, help, &[], *v);
    }
    for c in &b.labeled_counters {
        o.add(
            c.name,
            "counter",
            c.help,
            &[(c.label, c.value)],
            c.count as f64,
        );
    }
    o.add(
        "store_errors_total",
        "counter",
        "Store commits that failed (retried next tick)",
        &[],
        c.store_errors as f64,
    );
    for (name, kind, help, v) in b.store_health.iter().flat_map(|h| h.samples()) {
        o.add(name, kind, help, &[], v);
    }
    o.add(
        "buffer_dropped_samples_total",
        "counter",
        "Samples dropped because the buffer was full",
        &[],
        b.buffer_dropped as f64,
    );
    for ((rule, action), n) in &b.decisions_by_rule {
        o.add(
            "decisions_total",
            "counter",
            "Decisions, by rule and action",
            &[("rule", rule), ("action", action)],
            *n as f64,
        );
    }
    if let Some(d) = b.site.tariff.as_ref().and_then(|t| t.demand_charge_per_kw) {
        o.add(
            "demand_charge_per_kw",
            "gauge",
            "Cost per kW of the billing period's peak demand (site tariff)",
            &[],
            d,
        );
    }
    o.add(
        "last_tick_timestamp_seconds",
        "gauge",
        "When the last tick ran",
        &[],
        now.as_secs_f64(),
    );
    policy(&mut o, &b.policy_status);
    for m in crate::redfish::metrics(&b.redfish) {
        let labels: Vec<(&str, &str)> = m.labels.iter().map(|(k, v)| (*k, v.as_str())).collect();
        o.add(m.name, m.kind, m.help, &labels, m.value);
    }
    if let Some(f) = fleet {
        o.add(
            "gpus_in_sync",
            "gauge",
            "GPUs whose agent acknowledged and enforces the desired state",
            &[],
            f.in_sync as f64,
        );
        for (k, v) in f.counters.iter() {
            o.add(
                "agent_messages_total",
                "counter",
                "Agent protocol messages, by kind",
                &[("kind", k)],
                *v as f64,
            );
        }
        let mut by_status: BTreeMap<&str, u32> = BTreeMap::new();
        for n in f.nodes.values() {
            *by_status.entry(n.status.as_str()).or_default() += 1;
        }
        for s in ["online", "degraded", "stopped", "offline"] {
            o.add(
                "agents",
                "gauge",
                "Agents by the status they last reported",
                &[("status", s)],
                f64::from(by_status.get(s).copied().unwrap_or(0)),
            );
        }
    }
    o.render()
}

/// The policy in force and its reloads.
fn policy(o: &mut Out, p: &crate::reload::PolicyStatus) {
    for (result, n) in [("ok", p.reloads_ok), ("error", p.reloads_error)] {
        o.add(
            "policy_reloads_total",
            "counter",
            "Policy file reloads, by result (an invalid file keeps the policy in force)",
            &[("result", result)],
            n as f64,
        );
    }
    o.add(
        "policy_valid",
        "gauge",
        "1 when the policy file on disk is the policy in force, 0 while it is invalid",
        &[],
        f64::from(u8::from(p.valid)),
    );
    o.add(
        "policy_loaded_timestamp_seconds",
        "gauge",
        "When the policy in force was loaded, labelled with its SHA-256",
        &[("sha256", &p.sha256)],
        p.loaded_at.as_secs_f64(),
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::{Fleet, FleetConfig};
    use policies::plan::Cap;
    use telemetry::agent_proto::{Key, Topics};
    use telemetry::{EntityId, Sample, Site, Timestamp};

    fn board() -> (Board, Fleet) {
        let site = Site::parse("site.toml", crate::demo::DEFAULT_SITE).expect("site");
        let now = Timestamp::from_secs(1_790_000_000);
        let mut b = Board::new(site.clone(), "policy.toml".into(), now);
        let mut snap = telemetry::Snapshot::new();
        let g = site.gpus()[0].id.clone().into_owned();
        for (e, m, v) in [
            (site.site_entity(), POWER_W, 30_000.0),
            (site.site_entity(), PRICE_PER_KWH, 0.2),
            (site.site_entity(), CARBON_G_PER_KWH, 300.0),
            (
                EntityId::new(EntityKind::Feed, "utility"),
                POWER_W,
                30_000.0,
            ),
            (EntityId::rack("a01"), POWER_W, 5_000.0),
            (EntityId::rack("a02"), POWER_W, 6_000.0),
            (EntityId::rack("a03"), POWER_W, 7_000.0),
            (EntityId::rack("a01"), INLET_TEMP_C, 27.0),
            (g.clone(), POWER_W, 250.0),
        ] {
            snap.ingest(Sample::new(e, m, v, now, "t"), now)
                .expect("sample");
        }
        let mut state = policies::State::default();
        state.caps.insert(
            g,
            Cap {
                watts: 200.0,
                rule: "budget.rack".into(),
                since: now,
                lease_until: now.plus_secs(60.0),
            },
        );
        let mut c = crate::control::Counters::default();
        c.samples_rejected.insert("out_of_range", 2);
        let d = policies::Decision {
            time: now,
            rule: "budget.rack".into(),
            target: policies::plan::Target::Job { job: "x".into() },
            action: policies::Action::Release,
            values: Default::default(),
            reason: String::new(),
            observe_only: false,
            release: String::new(),
        };
        b.update(now, &snap, &state, &c, &[d], 0);
        let mut f = Fleet::new(
            &site,
            Key::from_text(&"11".repeat(32)).expect("key"),
            Topics::default(),
            FleetConfig::default(),
            now,
        );
        f.commands(&state, now);
        (b, f)
    }

    #[test]
    fn every_metric_the_grafana_dashboard_queries_is_exported() {
        let (b, f) = board();
        let text = render(&b, Some(&f.status()));
        let exported: std::collections::BTreeSet<&str> = text
            .lines()
            .filter(|l| l.starts_with("# TYPE "))
            .filter_map(|l| l.split_whitespace().nth(2))
            .collect();
        let dash = include_str!("../../../deploy/grafana/powerplane.json");
        let v: serde_json::Value = serde_json::from_str(dash).expect("dashboard JSON");
        let mut queried = std::collections::BTreeSet::new();
        for p in v["panels"].as_array().expect("panels") {
            for t in p["targets"].as_array().expect("targets") {
                let e = t["expr"].as_str().expect("expr");
                let mut rest = e;
                while let Some(i) = rest.find("powerplane_") {
                    let name: String = rest[i..]
                        .chars()
                        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                        .collect();
                    rest = &rest[i + name.len()..];
                    queried.insert(name);
                }
            }
        }
        assert!(queried.len() > 15, "{queried:?}");
        let missing: Vec<_> = queried
            .iter()
            .filter(|q| !exported.contains(q.as_str()))
            .collect();
        assert!(
            missing.is_empty(),
            "the dashboard queries metrics /metrics does not export: {missing:?}"
        );
    }

    #[test]
    fn each_racks_predicted_peak_and_headroom_are_gauges() {
        let (mut b, _) = board();
        assert!(
            !render(&b, None).contains("predicted_inlet"),
            "no prediction yet"
        );
        b.predictions.insert(
            "a01".into(),
            policies::RackPrediction {
                inlet_c: 27.0,
                predicted_c: 30.25,
                peak_c: 30.25,
                peak_in_s: 900.0,
                horizon_s: 900.0,
                limit_c: 32.0,
                margin_c: 0.5,
            },
        );
        let text = render(&b, None);
        assert!(
            text.contains("powerplane_predicted_inlet_peak_celsius{entity=\"rack/a01\"} 30.25"),
            "{text}"
        );
        assert!(
            text.contains("powerplane_predicted_inlet_headroom_celsius{entity=\"rack/a01\"} 1.25"),
            "{text}"
        );
    }

    #[test]
    fn pue_shows_once_every_rack_and_the_cooling_are_read() {
        let (mut b, _) = board();
        assert!(
            !render(&b, None).contains("powerplane_pue_ratio"),
            "racks b01..b03 unread"
        );
        let now = b.time;
        let mut snap = b.snapshot.clone();
        for (e, m, v) in [
            (EntityId::rack("b01"), POWER_W, 6_000.0),
            (EntityId::rack("b02"), POWER_W, 6_000.0),
            (EntityId::rack("b03"), POWER_W, 6_000.0),
            (
                EntityId::new(EntityKind::Cooling, "crah-b"),
                COOLING_POWER_W,
                7_200.0,
            ),
        ] {
            snap.ingest(Sample::new(e, m, v, now, "t"), now)
                .expect("sample");
        }
        let state = b.state.clone();
        let counters = b.counters.clone();
        b.update(now, &snap, &state, &counters, &[], 0);
        // (36 kW IT + 7.2 kW cooling) / 36 kW
        assert!(
            render(&b, None).contains("powerplane_pue_ratio 1.2\n"),
            "{}",
            render(&b, None)
        );
    }

    #[test]
    fn the_exposition_has_one_help_and_type_per_family_and_escapes_labels() {
        let (b, f) = board();
        let text = render(&b, Some(&f.status()));
        let mut seen = std::collections::BTreeSet::new();
        for l in text.lines().filter(|l| l.starts_with("# TYPE ")) {
            assert!(seen.insert(l.to_string()), "family declared twice: {l}");
        }
        assert!(text.contains("powerplane_samples_rejected_total{reason=\"out_of_range\"} 2"));
        assert!(
            text.contains("powerplane_row_power_watts{entity=\"row/row-a\"} 18000"),
            "{text}"
        );
        assert!(
            !text.contains("row/row-b"),
            "a row with racks unread has no sum"
        );
        assert!(text.contains(
            "powerplane_gpu_cap_watts{entity=\"gpu/a01-n01:0\",rule=\"budget.rack\"} 200"
        ));
        assert!(
            !text.contains("powerplane_gpu_utilization_ratio"),
            "no value, no series"
        );
        assert_eq!(esc("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}
