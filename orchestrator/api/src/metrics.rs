//! `/metrics` in the Prometheus text exposition format (0.0.4).

//!
//! [`render`] adds each part of the board in turn; [`exposition`] writes the families.

mod counters;
mod exposition;
mod process;
mod site;

use exposition::Out;

use super::Board;
use control::fleet::FleetStatus;

/// GPUs exported one by one at most when `[http] metrics_gpu_series` is not set: a
/// 10,000-GPU site's scrape stays about 5 MB, and a larger site's GPUs are summed up by
/// node.
pub const DEFAULT_GPU_SERIES: usize = 10_000;

/// The exposition text for the board (and the fleet, when agents are commanded); the
/// GPUs' readings one by one up to `gpu_series` GPUs, by node (or rack) beyond: what
/// the last tick published ([`render_tick`]) and what is read now ([`render_live`]).
pub fn render(b: &Board, fleet: Option<&FleetStatus<'_>>, gpu_series: usize) -> String {
    let mut text = render_tick(b, fleet, gpu_series);
    text.push_str(&render_live(b));
    text
}

/// What is read at the scrape: the last tick's age, the leader, the store backend's
/// own figures. Cheap: the API writes it fresh for every scrape.
pub fn render_live(b: &Board) -> String {
    let mut o = Out::default();
    leader(&mut o, b);
    counters::live(&mut o, b);
    o.render()
}

/// What the last tick published: the API renders it once per tick.
pub fn render_tick(b: &Board, fleet: Option<&FleetStatus<'_>>, gpu_series: usize) -> String {
    let mut o = Out::default();
    identity(&mut o, b);
    site::readings(&mut o, b, gpu_series);
    site::site_budgets(&mut o, b);
    site::racks(&mut o, b);
    site::rows(&mut o, b);
    site::pue(&mut o, b);
    site::caps_and_holds(&mut o, b, gpu_series);
    counters::loop_counters(&mut o, b);
    counters::cadence(&mut o, b);
    counters::feeds(&mut o, b);
    counters::ledger(&mut o, b);
    counters::edges(&mut o, b);
    counters::store(&mut o, b);
    policy(&mut o, &b.policy_status);
    grid(&mut o, b);
    for m in runtime::redfish::metrics(&b.redfish) {
        let labels: Vec<(&str, &str)> = m.labels.iter().map(|(k, v)| (*k, v.as_str())).collect();
        o.add(m.name, m.kind, m.help, &labels, m.value);
    }
    if let Some(f) = fleet {
        counters::fleet(&mut o, f);
    }
    counters::sources(&mut o, b);
    // the edges' histograms, whatever edges registered them
    for f in telemetry::histogram::registered() {
        for (labels, h) in &f.members {
            let labels: Vec<(&str, &str)> = labels.iter().map(|(k, v)| (*k, v.as_str())).collect();
            o.histogram(f.name, f.help, &labels, h);
        }
    }
    process::metrics(&mut o);
    o.render()
}

/// The agents' families alone (for a render that holds the fleet's lock only while
/// it reads the fleet).
pub fn render_fleet(f: &FleetStatus<'_>) -> String {
    let mut o = Out::default();
    counters::fleet(&mut o, f);
    o.render()
}

/// One histogram family on its own, a label set per row, written whole (for the
/// parts of `/metrics` rendered beside the board: the HTTP edge's).
pub(crate) fn histogram_family(
    name: &str,
    help: &str,
    label: &str,
    rows: &[(&str, telemetry::histogram::Snapshot)],
) -> String {
    let mut o = Out::default();
    for (value, h) in rows {
        o.histogram(name, help, &[(label, value)], h);
    }
    o.render()
}

/// Demand response: the event in force as the engine sees it, the events known by
/// source and status, and the VEN's counters. `dr_event_active` is always there; the
/// watts only while an event or its rebound limit is in force.
fn grid(o: &mut Out, b: &Board) {
    let m = b.state.grid.as_ref();
    o.add(
        "dr_event_active",
        "gauge",
        "1 while a grid (demand-response) event is in force, else 0",
        &[],
        if m.is_some_and(|m| m.event_active()) {
            1.0
        } else {
            0.0
        },
    );
    o.add(
        "dr_rebound_active",
        "gauge",
        "1 while the rebound limit after a grid event holds the meter under the pre-event baseline",
        &[],
        if m.is_some_and(|m| !m.event_active()) {
            1.0
        } else {
            0.0
        },
    );
    if let Some(m) = m {
        let w = [
            ("dr_target_watts", "The meter target in force (the rebound limit after the event)", m.target_w),
            ("dr_baseline_watts", "The baseline the event's shed is taken from, at the meter", m.baseline_w),
            ("dr_meter_watts", "The meter's power (IT, cooling and losses) as the grid controller reads it", m.meter_w),
            ("dr_delivered_watts", "Baseline less the meter's power: what the site delivers now", m.baseline_w - m.meter_w),
            ("dr_floor_watts", "The lowest meter power reachable without protected work (an estimate)", m.floor_w),
            ("dr_shortfall_watts", "By how much the target is out of reach without protected work (0: met or reachable)", m.shortfall_w),
        ];
        for (name, help, v) in w {
            o.add(name, "gauge", help, &[], v);
        }
    }
    let mut by: std::collections::BTreeMap<(String, &'static str), f64> = Default::default();
    for e in &b.grid_events {
        let status = match e.status {
            telemetry::grid::EventStatus::Pending => "pending",
            telemetry::grid::EventStatus::Active => "active",
            telemetry::grid::EventStatus::Completed => "completed",
            telemetry::grid::EventStatus::Cancelled => "cancelled",
        };
        *by.entry((e.source.clone(), status)).or_default() += 1.0;
    }
    for ((source, status), n) in &by {
        o.add(
            "dr_events",
            "gauge",
            "Grid events known, by source (openadr2b, openadr3, api, file) and status",
            &[("source", source), ("status", status)],
            *n,
        );
    }
}

/// The build.
fn identity(o: &mut Out, _b: &Board) {
    o.add(
        "build_info",
        "gauge",
        "1, labelled with the version of powerplane that serves these metrics",
        &[("version", env!("CARGO_PKG_VERSION"))],
        1.0,
    );
}

/// This replica's part in high availability, as the election has it now.
fn leader(o: &mut Out, b: &Board) {
    let ha = b.ha_status();
    o.add(
        "leader",
        "gauge",
        "1 on the replica that actuates (the leader; a controller without [ha]), 0 on a follower",
        // `replica`, not `instance`: Prometheus sets `instance` to the scrape target
        &[("replica", ha.instance.as_str())],
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
}

/// The policy in force and its reloads.
fn policy(o: &mut Out, p: &runtime::reload::PolicyStatus) {
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
    use std::sync::Arc;

    use super::exposition::esc;
    use super::*;
    use control::fleet::{Fleet, FleetConfig};
    use policies::plan::Cap;
    use telemetry::agent_proto::{Key, Topics};
    use telemetry::metric::names::*;
    use telemetry::EntityKind;
    use telemetry::{EntityId, Sample, Site, Timestamp};

    fn board() -> (Board, Fleet) {
        let site = Site::parse("site.toml", control::examples::DEFAULT_SITE).expect("site");
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
        // a grid event in force: the dashboard's demand-response panels read it
        state.grid = Some(policies::GridMemory {
            since: now,
            baseline_w: 40_000.0,
            target_w: 30_000.0,
            meter_w: 33_000.0,
            floor_w: 28_000.0,
            shortfall_w: 0.0,
            rebound_until: None,
        });
        let mut c = control::Counters::default();
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
        let _ = b.update(
            now,
            Arc::new(snap.clone()),
            Arc::new(state.clone()),
            &c,
            &[d],
            0,
        );
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
        let text = render(&b, Some(&f.status()), DEFAULT_GPU_SERIES);
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
    fn each_agents_clock_skew_is_a_gauge_by_node() {
        let (b, mut f) = board();
        let node = b.site.nodes[0].id.clone();
        let report = telemetry::agent_proto::NodeReport {
            v: telemetry::agent_proto::VERSION,
            node: node.clone(),
            time: b.time.plus_secs(-600.0),
            seq: 1,
            backend: "sim".into(),
            gpus: vec![],
            errors: vec![],
        };
        let topic = Topics::default().topic(&node, telemetry::agent_proto::Channel::Gpus);
        f.on_message(
            &topic,
            &serde_json::to_vec(&report).expect("json"),
            b.time.plus_secs(0.5),
        );
        let text = render(&b, Some(&f.status()), DEFAULT_GPU_SERIES);
        assert!(
            text.contains("# TYPE powerplane_agent_clock_skew_seconds gauge\n"),
            "{text}"
        );
        let line = format!(
            "powerplane_agent_clock_skew_seconds{{node=\"{}\"}} -600.5\n",
            esc(&node)
        );
        assert!(text.contains(&line), "{line} in {text}");
    }

    #[test]
    fn gpus_beyond_metrics_gpu_series_are_summed_up_by_node_and_energy_is_a_counter() {
        let (mut b, _) = board();
        let now = b.time;
        let mut snap = (*b.snapshot).clone();
        let gpus = b.site.gpus();
        let node = gpus[0].node.id.clone();
        let second = gpus[1].id.clone().into_owned();
        assert_eq!(gpus[1].node.id, node, "the first node has two GPUs or more");
        for (e, m, v) in [
            (second.clone(), POWER_W, 150.0),
            (gpus[0].id.clone().into_owned(), GPU_TEMP_C, 61.0),
            (second, GPU_TEMP_C, 67.0),
            (gpus[0].id.clone().into_owned(), ENERGY_J, 1.0e6),
        ] {
            snap.ingest(Sample::new(e, m, v, now, "t"), now)
                .expect("sample");
        }
        drop(gpus);
        let (state, counters) = ((*b.state).clone(), b.counters.clone());
        let _ = b.update(
            now,
            Arc::new(snap.clone()),
            Arc::new(state.clone()),
            &counters,
            &[],
            0,
        );
        let one_by_one = render(&b, None, DEFAULT_GPU_SERIES);
        assert!(one_by_one.contains("kind=\"gpu\""), "{one_by_one}");
        assert!(one_by_one.contains("# TYPE powerplane_energy_joules_total counter\n"));
        assert!(one_by_one.contains("powerplane_gpu_series_per_node 0\n"));
        // fewer series than GPUs, as many as nodes: by node
        let by_node = render(&b, None, b.site.nodes.len());
        assert!(!by_node.contains("kind=\"gpu\""), "{by_node}");
        assert!(by_node.contains("powerplane_gpu_series_per_rack 0\n"));
        assert!(by_node.contains("powerplane_gpu_series_per_node 1\n"));
        let at = |family: &str| {
            by_node
                .lines()
                .find(|l| {
                    l.starts_with(&format!(
                        "{family}{{entity=\"node/{node}\",kind=\"node_gpus\"}}"
                    ))
                })
                .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .unwrap_or_else(|| panic!("no {family} of node {node}:\n{by_node}"))
        };
        // power summed, the hottest GPU's temperature, energy summed as a counter
        assert_eq!(at("powerplane_power_watts"), 400.0);
        assert_eq!(at("powerplane_gpu_temperature_celsius"), 67.0);
        assert_eq!(at("powerplane_energy_joules_total"), 1.0e6);
        assert!(by_node.contains("# TYPE powerplane_energy_joules_total counter\n"));
        // fewer series than nodes: by rack, caps too (the lowest in each rack)
        let rack = b
            .site
            .nodes
            .iter()
            .find(|n| n.id == node)
            .expect("node")
            .rack
            .clone();
        let mut state = (*b.state).clone();
        let gpus = b.site.gpus();
        for (g, w) in [(&gpus[0], 200.0), (&gpus[1], 180.0)] {
            state.caps.insert(
                g.id.clone().into_owned(),
                Cap {
                    watts: w,
                    rule: "r".into(),
                    since: now,
                    lease_until: now + 90.0,
                },
            );
        }
        drop(gpus);
        b.state = Arc::new(state);
        let by_rack = render(&b, None, 1);
        assert!(!by_rack.contains("kind=\"node_gpus\""), "{by_rack}");
        assert!(by_rack.contains("powerplane_gpu_series_per_rack 1\n"));
        assert!(
            by_rack.contains(&format!(
                "powerplane_power_watts{{entity=\"rack/{rack}\",kind=\"rack_gpus\"}} 400\n"
            )),
            "{by_rack}"
        );
        assert!(
            by_rack.contains(&format!(
                "powerplane_gpu_cap_watts{{entity=\"rack/{rack}\",kind=\"rack_gpus\"}} 180\n"
            )),
            "{by_rack}"
        );
        assert!(!by_rack.contains("powerplane_gpu_cap_watts{entity=\"gpu/"));
    }

    #[test]
    fn the_ledger_is_counted_by_account_and_project_with_the_projects_bounded() {
        use integrations::store::{Account, LedgerEntry};
        let (mut b, _) = board();
        let text = render(&b, None, DEFAULT_GPU_SERIES);
        assert!(
            text.contains(
                "powerplane_ledger_energy_joules_total{account=\"idle\",project=\"\"} 0\n"
            ),
            "{text}"
        );
        let entry = |account: Account, kwh: f64| LedgerEntry {
            start: b.time,
            end: b.time,
            account,
            rack: Some("a01".into()),
            energy_kwh: kwh,
            cost: kwh * 0.2,
            carbon_kg: kwh * 0.3,
            integrated_kwh: 0.0,
            shared_kwh: 0.0,
        };
        let job = |project: &str| Account::Job {
            job: "j".into(),
            project: project.into(),
            user: "u".into(),
        };
        // two ticks' closed intervals: the sums only grow
        for _ in 0..2 {
            let entries = [
                entry(job("climate"), 1.5),
                entry(Account::Idle, 0.5),
                entry(Account::Overhead, 0.25),
            ];
            b.ledger.add(&entries);
        }
        let text = render(&b, None, DEFAULT_GPU_SERIES);
        let at = |series: &str| {
            text.lines()
                .find(|l| l.starts_with(series))
                .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .unwrap_or_else(|| panic!("no {series} in:\n{text}"))
        };
        let close = |a: f64, b: f64| (a - b).abs() < 1e-6 * b.abs().max(1.0);
        assert!(close(
            at("powerplane_ledger_energy_joules_total{account=\"job\",project=\"climate\"}"),
            3.0 * 3.6e6
        ));
        assert!(close(
            at("powerplane_ledger_cost_total{account=\"job\",project=\"climate\",currency=\"EUR\"}"),
            0.6
        ));
        assert!(close(
            at("powerplane_ledger_carbon_grams_total{account=\"overhead\",project=\"\"}"),
            150.0
        ));
        assert!(text.contains("# TYPE powerplane_ledger_energy_joules_total counter\n"));
        // a project per job does not grow the scrape without bound
        let many: Vec<LedgerEntry> = (0..crate::board::LEDGER_PROJECT_SERIES + 50)
            .map(|i| entry(job(&format!("p{i}")), 1.0))
            .collect();
        b.ledger.add(&many);
        let jobs = b
            .ledger
            .by_account
            .keys()
            .filter(|(a, _)| *a == "job")
            .count();
        assert_eq!(jobs, crate::board::LEDGER_PROJECT_SERIES + 1);
        let other = b.ledger.by_account[&("job", "_other".to_string())];
        // `climate` came first and has its own series; the last 51 projects are summed
        assert!(close(other.energy_kwh, 51.0), "{other:?}");
    }

    #[test]
    fn the_loop_and_the_edges_histograms_are_exported_whole() {
        let (b, _) = board();
        b.cadence
            .histograms
            .tick
            .observe(std::time::Duration::from_millis(7));
        telemetry::histogram::registry("store_commit_seconds", "commits", &[("backend", "test")])
            .observe(std::time::Duration::from_millis(2));
        let text = render(&b, None, DEFAULT_GPU_SERIES);
        assert!(
            text.contains("# TYPE powerplane_tick_seconds histogram\n"),
            "{text}"
        );
        assert!(
            text.contains("powerplane_tick_seconds_bucket{le=\"0.005\"} 0\n"),
            "{text}"
        );
        assert!(
            text.contains("powerplane_tick_seconds_bucket{le=\"0.01\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("powerplane_tick_seconds_bucket{le=\"+Inf\"} 1\n"),
            "{text}"
        );
        assert!(text.contains("powerplane_tick_seconds_count 1\n"), "{text}");
        assert!(
            text.contains(
                "powerplane_store_commit_seconds_bucket{backend=\"test\",le=\"0.0025\"} 1\n"
            ),
            "{text}"
        );
        assert!(
            text.contains("# TYPE process_resident_memory_bytes gauge\n"),
            "{text}"
        );
    }

    #[test]
    fn each_racks_predicted_peak_and_headroom_are_gauges() {
        let (mut b, _) = board();
        assert!(
            !render(&b, None, DEFAULT_GPU_SERIES).contains("predicted_inlet"),
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
        let text = render(&b, None, DEFAULT_GPU_SERIES);
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
            !render(&b, None, DEFAULT_GPU_SERIES).contains("powerplane_pue_ratio"),
            "racks b01..b03 unread"
        );
        let now = b.time;
        let mut snap = (*b.snapshot).clone();
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
        let state = (*b.state).clone();
        let counters = b.counters.clone();
        let _ = b.update(
            now,
            Arc::new(snap.clone()),
            Arc::new(state.clone()),
            &counters,
            &[],
            0,
        );
        // (36 kW IT + 7.2 kW cooling) / 36 kW
        assert!(
            render(&b, None, DEFAULT_GPU_SERIES).contains("powerplane_pue_ratio 1.2\n"),
            "{}",
            render(&b, None, DEFAULT_GPU_SERIES)
        );
    }

    #[test]
    fn the_exposition_has_one_help_and_type_per_family_and_escapes_labels() {
        let (b, f) = board();
        let text = render(&b, Some(&f.status()), DEFAULT_GPU_SERIES);
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
    /// A source's counters reach `/metrics` as they are, each family once: those that
    /// a step renders whole (the MQTT decoders' rejects, every reason from 0) are not
    /// written again from the source's own list.
    #[test]
    fn every_sources_own_counters_are_exported_once() {
        use sources::source::Counter;
        let (mut b, _) = board();
        let c = |name, labels: &[(&'static str, &str)], value| Counter {
            name,
            labels: labels.iter().map(|(k, v)| (*k, v.to_string())).collect(),
            value,
        };
        b.labeled_counters = control::admit::labeled(
            Some(std::collections::BTreeMap::from([("bad_json", 3)])),
            None,
        );
        b.source_counters = vec![
            c("mqtt_messages_total", &[], 41),
            c("mqtt_rejected_total", &[("reason", "bad_json")], 3),
            c("newsource_reads_total", &[("endpoint", "x")], 7),
            c("newsource_queue", &[], 2),
        ];
        let text = render_tick(&b, None, DEFAULT_GPU_SERIES);
        assert!(text.contains("powerplane_mqtt_messages_total 41"), "{text}");
        assert!(text.contains("# TYPE powerplane_mqtt_messages_total counter"));
        assert!(text.contains("powerplane_newsource_reads_total{endpoint=\"x\"} 7"));
        assert!(text.contains("# TYPE powerplane_newsource_queue gauge"));
        let rejects: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("powerplane_mqtt_rejected_total{reason=\"bad_json\"}"))
            .collect();
        assert_eq!(
            rejects,
            ["powerplane_mqtt_rejected_total{reason=\"bad_json\"} 3"]
        );
        assert!(
            text.contains("powerplane_mqtt_rejected_total{reason=\"oversize\"} 0"),
            "the whole family, every reason from 0"
        );
    }
}
