//! The controller's own side of `/metrics`: what the loop counted, its cadence, the
//! schedulers' and the store's counters, and the fleet of agents.

use std::collections::BTreeMap;

use super::exposition::Out;
use super::Board;
use control::fleet::FleetStatus;

/// What the loop counted: ticks, samples, resets and actuation errors.
pub(super) fn loop_counters(o: &mut Out, b: &Board) {
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
}

/// The energy ledger since the process started, by account and project: what a
/// finance team bills from, as counters (a leader's; a follower charges nothing).
pub(super) fn ledger(o: &mut Out, b: &Board) {
    let currency = b.site.currency.as_str();
    // the families are there, at 0, before the first interval closes
    let none = [(("idle", String::new()), Default::default())];
    let rows: Vec<(&(&str, String), &crate::board::LedgerSums)> = if b.ledger.by_account.is_empty()
    {
        none.iter().map(|(k, v)| (k, v)).collect()
    } else {
        b.ledger.by_account.iter().collect()
    };
    for ((account, project), s) in rows {
        let labels = [("account", *account), ("project", project.as_str())];
        o.add(
            "ledger_energy_joules_total",
            "counter",
            "Energy the ledger charged, by account (job, idle, overhead) and project",
            &labels,
            s.energy_kwh * 3.6e6,
        );
        o.add(
            "ledger_cost_total",
            "counter",
            "Energy cost the ledger charged, in the site's currency (label currency)",
            &[labels[0], labels[1], ("currency", currency)],
            s.cost,
        );
        o.add(
            "ledger_carbon_grams_total",
            "counter",
            "Carbon emissions the ledger charged (grams CO2e)",
            &labels,
            s.carbon_kg * 1000.0,
        );
    }
}

/// The price and carbon feeds: the age of what each holds, and its fetches.
pub(super) fn feeds(o: &mut Out, b: &Board) {
    for f in &b.feeds {
        if let Some(age) = f.age_s {
            o.add(
                "feed_age_seconds",
                "gauge",
                "Since the feed last gave a good series (a fetch, or its file at start); a failing feed keeps its last series and ages",
                &[("feed", f.feed)],
                age,
            );
        }
        for (result, n) in [("ok", f.fetches_ok), ("error", f.fetches_failed)] {
            o.add(
                "feed_fetches_total",
                "counter",
                "Fetches of the live feeds by result (an error keeps the last good series)",
                &[("feed", f.feed), ("result", result)],
                n as f64,
            );
        }
    }
}

/// What is read at the scrape, not at the last tick: the age of the last tick (it
/// grows while the loop is stalled) and the store backend's own figures
/// (reachability, journal).
pub(super) fn live(o: &mut Out, b: &Board) {
    o.add(
        "tick_age_seconds",
        "gauge",
        "Seconds since the last tick completed, at the scrape (grows while the loop is stalled; /readyz fails past ready_stall_ticks tick periods)",
        &[],
        common::wall_clock().secs_since(b.time).max(0.0),
    );
    for (name, kind, help, v) in b.store_health.iter().flat_map(|h| h.samples()) {
        o.add(name, kind, help, &[], v);
    }
}

/// The loop's cadence: tick delays and durations, and evaluations for crossings.
pub(super) fn cadence(o: &mut Out, b: &Board) {
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
    o.add(
        "event_latency_seconds",
        "gauge",
        "The last evaluation for a crossing: from the crossing seen to its commands handed to the agents",
        &[],
        b.cadence.event_latency_s,
    );
    o.add(
        "event_latency_max_seconds",
        "gauge",
        "The largest event latency since start",
        &[],
        b.cadence.event_latency_max_s,
    );
    o.add(
        "event_evaluation_duration_seconds",
        "gauge",
        "How long the last evaluation for a crossing took",
        &[],
        b.cadence.event_duration_s,
    );
    let h = &b.cadence.histograms;
    o.histogram(
        "tick_seconds",
        "How long each complete tick took",
        &[],
        &h.tick.snapshot(),
    );
    o.histogram(
        "event_evaluation_seconds",
        "How long each evaluation for a crossing took (the store's commit included)",
        &[],
        &h.event_evaluation.snapshot(),
    );
    o.histogram(
        "event_to_command_seconds",
        "From a threshold crossing seen to its commands handed to the agents' link, for each crossing evaluated",
        &[],
        &h.event_to_command.snapshot(),
    );
}

/// The schedulers', the store's and the buffer's counters, decisions by rule, the tariff and the last tick.
/// The store's counters: failed commits, what waits in memory for it and what was
/// dropped from that (the backend's own are read live, [`live`]).
pub(super) fn store(o: &mut Out, b: &Board) {
    let c = &b.counters;
    o.add(
        "store_errors_total",
        "counter",
        "Store commits that failed (retried next tick)",
        &[],
        c.store_errors as f64,
    );
    for (log, n) in &c.store_writes_dropped {
        o.add(
            "store_writes_dropped_total",
            "counter",
            "Records dropped from what waited in memory for a store that took nothing (its bound, [store] max_waiting_mib), by log",
            &[("log", log)],
            *n as f64,
        );
    }
    o.add(
        "store_waiting_writes",
        "gauge",
        "Writes waiting in memory for the store after the last commit",
        &[],
        c.store_waiting_writes as f64,
    );
    o.add(
        "store_waiting_bytes",
        "gauge",
        "About how many bytes the writes waiting in memory for the store hold",
        &[],
        c.store_waiting_bytes as f64,
    );
}

pub(super) fn edges(o: &mut Out, b: &Board) {
    let now = b.time;
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
}

/// The fleet of agents: GPUs in sync, protocol messages, each agent's clock skew and
/// agents by status.
pub(super) fn fleet(o: &mut Out, f: &FleetStatus<'_>) {
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
    for (node, skew_s) in f.clock_skew_s.iter() {
        o.add(
            "agent_clock_skew_seconds",
            "gauge",
            "Each agent's clock minus the controller's, from its last report (includes the report's transit)",
            &[("node", node)],
            *skew_s,
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

/// The telemetry sources' own counters (`Source::stats`, the VEN's too), each family that no step
/// before rendered (the MQTT decoders' rejects and the Redfish endpoints' counters are
/// rendered whole, every reason listed, before this): a new source's counters reach
/// `/metrics` with no change here.
pub(super) fn sources(o: &mut Out, b: &Board) {
    let taken: std::collections::BTreeSet<&str> = b
        .source_counters
        .iter()
        .map(|c| c.name)
        .filter(|n| o.has(n))
        .collect();
    for c in b.source_counters.iter().filter(|c| !taken.contains(c.name)) {
        let labels: Vec<(&str, &str)> = c.labels.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let kind = if c.name.ends_with("_total") {
            "counter"
        } else {
            "gauge"
        };
        o.add(c.name, kind, source_help(c.name), &labels, c.value as f64);
    }
}

/// The help line of a source's counter.
fn source_help(name: &str) -> &'static str {
    match name {
        "mqtt_messages_total" => "MQTT messages received on the subscribed topics",
        "mqtt_samples_total" => "Readings the MQTT decoders read from those messages",
        "mqtt_connects_total" => {
            "Connections to the MQTT broker made (the first and every reconnect)"
        }
        "mqtt_disconnects_total" => "Connections to the MQTT broker lost",
        n if n.starts_with("openadr_") => "The VEN's counter (see docs/demand-response.md)",
        _ => "A telemetry source's counter (see docs/operations.md)",
    }
}
