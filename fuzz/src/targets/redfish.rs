//! Redfish JSON: a resource's bytes parsed as the poller parses them, then every pure
//! function that reads it (the extractors, the survey's readings, the bindings' match
//! and settle). Inputs are `path\njson`; the seeds are the DMTF mockups and examples
//! of `tests/fixtures/redfish`.

use common::rng::Rng;
use serde_json::Value;
use sources::redfish::bind::{matches, settle};
use sources::redfish::extract;
use sources::redfish::survey::readings;
use telemetry::site::redfish::{Combine, RedfishBinding, ResourcePattern};
use telemetry::{EntityId, EntityKind, Metric};

use crate::bytes::below;
use crate::corpus::{join_line, mutate_levels, split_line, workspace, JsonCorpus};
use crate::runner::Target;

pub struct Redfish {
    paths: Vec<String>,
    corpus: JsonCorpus,
    bindings: Vec<RedfishBinding>,
}

fn binding(
    resource: &str,
    property: Option<&str>,
    metric: &str,
    combine: Option<Combine>,
) -> RedfishBinding {
    RedfishBinding {
        endpoint: "e".into(),
        resource: ResourcePattern::parse(resource).expect("pattern"),
        property: property.map(RedfishBinding::normalise_property),
        entity: EntityId::new(EntityKind::Pdu, "p"),
        metric: Metric::new(metric),
        combine,
        at: "site.toml:1:1".into(),
    }
}

/// The fixtures' JSON files under 24 KiB, with the URI each stands for.
fn fixtures() -> Vec<(String, Value)> {
    let mut out = Vec::new();
    let mut dirs = vec![workspace().join("tests/fixtures/redfish")];
    while let Some(d) = dirs.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        let mut entries: Vec<_> = rd.filter_map(|e| e.ok().map(|e| e.path())).collect();
        entries.sort();
        for p in entries {
            if p.is_dir() {
                dirs.push(p);
                continue;
            }
            let small = p.metadata().is_ok_and(|m| m.len() < 24 * 1024);
            if !small || p.extension().is_none_or(|e| e != "json") {
                continue;
            }
            let Some(v) = std::fs::read(&p)
                .ok()
                .and_then(|b| serde_json::from_slice(&b).ok())
            else {
                continue;
            };
            let s = p.to_string_lossy();
            let path = s.find("/redfish/v1").map_or_else(
                || "/redfish/v1/Chassis/1/Sensors/x".to_string(),
                |i| s[i..].trim_end_matches("/index.json").to_string(),
            );
            out.push((path, v));
        }
    }
    out
}

pub fn redfish() -> Box<dyn Target> {
    let (paths, seeds) = fixtures().into_iter().unzip();
    let bindings = vec![
        binding("**", None, "power_w", Some(Combine::Sum)),
        binding("**", None, "inlet_temp_c", None),
        binding("**", None, "leak_detected", Some(Combine::Max)),
        binding(
            "Chassis/*/Power",
            Some("PowerControl/0/PowerConsumedWatts"),
            "power_w",
            None,
        ),
        binding(
            "PowerEquipment/**",
            Some("PowerWatts"),
            "power_w",
            Some(Combine::Mean),
        ),
        binding("**", Some("Reading"), "voltage_v", Some(Combine::Min)),
    ];
    Box::new(Redfish {
        paths,
        corpus: JsonCorpus::new(seeds),
        bindings,
    })
}

impl Target for Redfish {
    fn generate(&mut self, rng: &mut Rng) -> Vec<u8> {
        let i = below(rng, self.corpus.len());
        let path = mutate_levels(rng, &self.paths[i], &self.corpus.dict);
        join_line(&path, &self.corpus.mutant(rng, i, None))
    }

    fn decode(&mut self, input: &[u8]) -> bool {
        let (path, body) = split_line(input);
        let Ok(v) = serde_json::from_slice::<Value>(body) else {
            return false;
        };
        let _ = extract::quality(&v);
        let _ = extract::reading(Some(&v));
        let _ = extract::reading(v.get("Reading"));
        let mut n = 0;
        for f in [
            extract::legacy_power,
            extract::legacy_thermal,
            extract::environment,
            extract::thermal_metrics,
            extract::power_supply,
            extract::sensor,
            extract::circuit,
            extract::coolant_connector,
            extract::pump,
            extract::leak_detector,
        ] {
            n += f(&v, &path).len();
        }
        let found = readings::resource(&v, &path);
        n += found.readings.len() + found.unknown.len();
        for b in &self.bindings {
            let m = matches(b, &path, &v);
            n += m.len();
            let _ = settle(b, m);
        }
        let _ = n;
        true
    }
}
