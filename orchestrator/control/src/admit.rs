//! The gate between the edges and the control loop: what a publisher may put into the
//! controller's state. Sources (MQTT, Redfish, the agents' reports, the feeds) hand
//! their samples to [`Gate::admit`] before they reach the buffer; readings for
//! entities the site file does not know are refused and counted (reason
//! `unknown_entity` of `powerplane_samples_rejected_total`), so that anyone who can
//! publish on the broker cannot grow the snapshot, the buffer or `/metrics` without
//! bound. [`Tally`] counts the MQTT decoders' rejects by reason for `/metrics`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use telemetry::log_limit::LogLimiter;
use telemetry::{EntityId, Sample, Site};
use tracing::warn;

/// The reason label unknown entities are counted under.
pub const UNKNOWN_ENTITY: &str = "unknown_entity";

/// How often the gate logs the entities it refuses (one line, with how many more).
const LOG_EVERY: Duration = Duration::from_secs(30);

/// Admits samples for the site's entities only; counts the rest.
#[derive(Debug)]
pub struct Gate {
    entities: BTreeSet<EntityId>,
    nodes: BTreeSet<String>,
    refused: AtomicU64,
    log: Mutex<LogLimiter>,
}

impl Gate {
    /// A gate for every entity the site file defines (site, rooms, rows, racks, nodes,
    /// GPUs, feeds, PDUs, their outlets and branches, cooling units).
    pub fn new(site: &Site) -> Self {
        Gate {
            entities: site.entities(),
            nodes: site.nodes.iter().map(|n| n.id.clone()).collect(),
            refused: AtomicU64::new(0),
            log: Mutex::new(LogLimiter::new(LOG_EVERY)),
        }
    }

    /// Whether the site defines this entity.
    pub fn knows(&self, entity: &EntityId) -> bool {
        self.entities.contains(entity)
    }

    /// Whether the site defines a node of this name (an agent's topic names it).
    pub fn knows_node(&self, node: &str) -> bool {
        self.nodes.contains(node)
    }

    /// The samples for known entities; the others are counted and logged (rate-limited).
    pub fn admit(&self, mut samples: Vec<Sample>, source: &str) -> Vec<Sample> {
        let before = samples.len();
        let mut first = None;
        samples.retain(|s| {
            let known = self.entities.contains(&s.entity);
            if !known && first.is_none() {
                first = Some(s.entity.to_string());
            }
            known
        });
        self.refuse(before - samples.len(), first, source);
        samples
    }

    /// The entities of a death notice that the site knows (the rest are dropped and
    /// counted: marking an unknown entity bad would add it to the snapshot).
    pub fn admit_dead(&self, mut dead: Vec<EntityId>, source: &str) -> Vec<EntityId> {
        let before = dead.len();
        let mut first = None;
        dead.retain(|e| {
            let known = self.entities.contains(e);
            if !known && first.is_none() {
                first = Some(e.to_string());
            }
            known
        });
        self.refuse(before - dead.len(), first, source);
        dead
    }

    fn refuse(&self, n: usize, example: Option<String>, source: &str) {
        if n == 0 {
            return;
        }
        self.refused.fetch_add(n as u64, Ordering::Relaxed);
        let mut log = self.log.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(left_out) = log.allow(UNKNOWN_ENTITY, Instant::now()) {
            warn!(
                source,
                entity = example.as_deref().unwrap_or(""),
                refused = n,
                left_out,
                "readings refused: the site file does not define this entity"
            );
        }
    }

    /// Samples refused since the last call (the control loop adds them to its
    /// counters each tick).
    pub fn take_refused(&self) -> u64 {
        self.log
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .warn_suppressed("admit", Instant::now());
        self.refused.swap(0, Ordering::Relaxed)
    }
}

/// Counts per reason, shared between an edge thread and the board (`/metrics`).
/// Reasons are static labels, so the map is bounded by the code, not by publishers.
#[derive(Debug, Default)]
pub struct Tally(Mutex<BTreeMap<&'static str, u64>>);

impl Tally {
    pub fn add(&self, reason: &'static str, n: u64) {
        let mut g = self.0.lock().unwrap_or_else(|p| p.into_inner());
        *g.entry(reason).or_default() += n;
    }

    pub fn counts(&self) -> BTreeMap<&'static str, u64> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// Every reject reason of the MQTT decoders (JSON mapping, Sparkplug B, the source's
/// size limit): exported at 0 until seen, so dashboards and alerts find the series.
pub const MQTT_REASONS: [&str; 16] = [
    "oversize",
    "bad_json",
    "no_mapping",
    "missing_value",
    "not_a_number",
    "wrong_type",
    "bad_entity",
    "bad_timestamp",
    "bad_protobuf",
    "bad_sequence",
    "no_birth",
    "sequence_gap",
    "unknown_alias",
    "too_many_nodes",
    "too_many_metrics",
    "stale_death",
];

/// Keys of the MQTT tally that count Sparkplug rebirth requests (sent, or held back by
/// `rebirth_interval_s`), not rejects: exported as `mqtt_sparkplug_rebirths_total`.
pub const REBIRTH_SENT: &str = "rebirth:sent";
pub const REBIRTH_HELD: &str = "rebirth:held";

/// Every reason a job event is refused for (see `powerplane-runtime`'s `schedulers::Inbox`).
pub const EVENT_REASONS: [&str; 12] = [
    "unsigned",
    "bad_timestamp",
    "stale_timestamp",
    "bad_signature",
    "bad_token",
    "too_large",
    "bad_event",
    "field_too_long",
    "time_out_of_window",
    "replay",
    "stale",
    "rate_limited",
];

/// One sample of a counter with one label, for `/metrics`.
#[derive(Debug, Clone, PartialEq)]
pub struct LabeledCounter {
    /// Without the `powerplane_` prefix.
    pub name: &'static str,
    pub help: &'static str,
    pub label: &'static str,
    pub value: &'static str,
    pub count: u64,
}

fn family(
    name: &'static str,
    help: &'static str,
    known: &[&'static str],
    counts: BTreeMap<&'static str, u64>,
) -> impl Iterator<Item = LabeledCounter> {
    let mut all: BTreeMap<&'static str, u64> = known.iter().map(|r| (*r, 0)).collect();
    all.extend(counts);
    all.into_iter().map(move |(value, count)| LabeledCounter {
        name,
        help,
        label: "reason",
        value,
        count,
    })
}

/// The edges' reject counters by reason: the MQTT decoders' (with `[mqtt]`) and the
/// job events' (with `[schedulers.webhook]`).
pub fn labeled(
    mqtt: Option<BTreeMap<&'static str, u64>>,
    events: Option<BTreeMap<&'static str, u64>>,
) -> Vec<LabeledCounter> {
    let mut out = Vec::new();
    if let Some(mut m) = mqtt {
        let sent = m.remove(REBIRTH_SENT).unwrap_or(0);
        let held = m.remove(REBIRTH_HELD).unwrap_or(0);
        out.extend(family(
            "mqtt_rejected_total",
            "MQTT messages (or parts of them) the decoders rejected, by reason",
            &MQTT_REASONS,
            m,
        ));
        for (value, count) in [("sent", sent), ("held", held)] {
            out.push(LabeledCounter {
                name: "mqtt_sparkplug_rebirths_total",
                help: "Sparkplug rebirth requests (NCMD Node Control/Rebirth): sent, or held back by rebirth_interval_s",
                label: "outcome",
                value,
                count,
            });
        }
    }
    if let Some(e) = events {
        out.extend(family(
            "events_rejected_total",
            "Job events refused, by reason",
            &EVENT_REASONS,
            e,
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use telemetry::metric::names::{INLET_TEMP_C, POWER_W};
    use telemetry::Timestamp;

    #[test]
    fn only_the_site_entities_pass_and_the_rest_are_counted() {
        let site = Site::parse("site.toml", crate::examples::DEFAULT_SITE).expect("site");
        let gate = Gate::new(&site);
        let now = Timestamp::from_secs(1_790_000_000);
        let gpu = site.gpus()[0].id.clone().into_owned();
        let mut samples = vec![
            Sample::new(EntityId::rack("a01"), INLET_TEMP_C, 25.0, now, "t"),
            Sample::new(gpu.clone(), POWER_W, 250.0, now, "t"),
            Sample::new(site.site_entity(), POWER_W, 1.0, now, "t"),
        ];
        for i in 0..1000 {
            samples.push(Sample::new(
                EntityId::rack(&format!("made-up-{i}")),
                INLET_TEMP_C,
                25.0,
                now,
                "t",
            ));
        }
        let kept = gate.admit(samples, "test");
        assert_eq!(kept.len(), 3);
        assert!(kept.iter().any(|s| s.entity == gpu));
        let dead = gate.admit_dead(vec![EntityId::rack("a01"), EntityId::rack("nope")], "test");
        assert_eq!(dead, vec![EntityId::rack("a01")]);
        assert_eq!(gate.take_refused(), 1001);
        assert_eq!(gate.take_refused(), 0, "taken once");
        assert!(gate.knows_node(&site.nodes[0].id));
        assert!(!gate.knows_node("made-up"));
    }

    #[test]
    fn every_reason_is_exported_even_before_it_is_seen() {
        let mut seen = BTreeMap::new();
        seen.insert("bad_json", 3);
        seen.insert(REBIRTH_SENT, 2);
        let l = labeled(Some(seen), None);
        let rejects = l.iter().filter(|c| c.name == "mqtt_rejected_total");
        assert_eq!(rejects.count(), MQTT_REASONS.len());
        let rebirths: Vec<_> = l
            .iter()
            .filter(|c| c.name == "mqtt_sparkplug_rebirths_total")
            .map(|c| (c.label, c.value, c.count))
            .collect();
        assert_eq!(
            rebirths,
            vec![("outcome", "sent", 2), ("outcome", "held", 0)]
        );
        assert!(l
            .iter()
            .any(|c| c.name == "mqtt_rejected_total" && c.value == "bad_json" && c.count == 3));
        assert!(labeled(None, None).is_empty());
    }

    #[test]
    fn a_tally_counts_by_reason() {
        let t = Tally::default();
        t.add("bad_json", 2);
        t.add("bad_json", 1);
        t.add("oversize", 1);
        assert_eq!(
            t.counts().into_iter().collect::<Vec<_>>(),
            vec![("bad_json", 3), ("oversize", 1)]
        );
    }
}
