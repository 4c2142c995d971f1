//! A survey of one endpoint for `telemetry probe`: a crawl of every resource under
//! `Chassis`, `PowerEquipment`, `ThermalEquipment`, `Systems` and `Facilities`, every
//! reading in them (by the schemas' conventions, see [`readings`]), each physical
//! reading once, and every resource whose numeric readings were not understood.
//!
//! The crawl follows every link a resource holds (`@odata.id`, including `Links`, and a
//! sensor excerpt's `DataSourceUri`) into those trees, outside `Actions` and `Oem`,
//! fragments dropped, each resource once; at most [`MAX_RESOURCES`] GETs,
//! [`PARALLEL`] at a time, each under the endpoint's GET timeout.

pub mod readings;

use std::collections::{BTreeMap, BTreeSet};

use futures_util::stream::{self, StreamExt};
use serde_json::Value;

use super::{Endpoint, EndpointConfig, RedfishError};
pub use readings::{Reading, Unknown};

/// The most resources one survey reads.
pub const MAX_RESOURCES: usize = 5000;
/// GETs in flight to the endpoint during a survey.
pub const PARALLEL: usize = 4;

/// The trees under the service root that hold readings.
const ROOTS: &[&str] = &[
    "Chassis",
    "PowerEquipment",
    "ThermalEquipment",
    "Systems",
    "Facilities",
];

/// Subordinate collections that never hold readings and can be large.
const NOT_FOLLOWED: &[&str] = &["LogServices", "Certificates", "Bios", "SecureBoot"];

/// What a survey found at one endpoint.
#[derive(Debug, Default, Clone)]
pub struct Survey {
    pub endpoint: String,
    /// Every distinct reading, by key (the sensor's URI where it has one).
    pub readings: BTreeMap<String, Reading>,
    /// Per resource, the numeric readings whose unit is not known.
    pub not_understood: BTreeMap<String, Vec<Unknown>>,
    /// Resources read.
    pub resources: usize,
    /// GETs sent (including failed ones).
    pub requests: usize,
    /// Resources that failed (path and error), the walk going on without them.
    pub failed: Vec<String>,
    /// More than [`MAX_RESOURCES`] were linked; the rest were not read.
    pub truncated: bool,
}

impl Survey {
    /// Adds one resource's readings; a sensor's own reading wins over an excerpt of it.
    fn add(&mut self, path: &str, v: &Value) {
        let found = readings::resource(v, path);
        for r in found.readings {
            match self.readings.get(&r.key) {
                Some(old) if old.own || !r.own => {}
                _ => {
                    self.readings.insert(r.key.clone(), r);
                }
            }
        }
        if !found.unknown.is_empty() {
            self.not_understood.insert(path.to_string(), found.unknown);
        }
    }

    /// Drops "not understood" entries whose reading was mapped elsewhere (an excerpt
    /// without units whose sensor said them).
    fn settle(&mut self) {
        let known = &self.readings;
        self.not_understood.retain(|_, u| {
            u.retain(|x| !known.contains_key(&x.key));
            !u.is_empty()
        });
    }
}

/// Every link of `v` (`@odata.id`, `DataSourceUri`) into the trees that hold readings,
/// outside `Actions` and `Oem`, without fragments.
fn links(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(o) => {
            for (k, x) in o {
                if matches!(k.as_str(), "Actions" | "Oem") {
                    continue;
                }
                if k == "@odata.id" || k == "DataSourceUri" {
                    if let Some(s) = x.as_str() {
                        let s = s.split('#').next().unwrap_or_default();
                        let s = s.trim_end_matches('/');
                        let tree = s
                            .strip_prefix("/redfish/v1/")
                            .and_then(|r| r.split('/').next())
                            .is_some_and(|t| ROOTS.contains(&t));
                        let seg = s.rsplit('/').next().unwrap_or_default();
                        if tree && !NOT_FOLLOWED.contains(&seg) {
                            out.push(s.to_string());
                        }
                    }
                    continue;
                }
                links(x, out);
            }
        }
        Value::Array(a) => a.iter().for_each(|x| links(x, out)),
        _ => {}
    }
}

/// The links of a resource that the crawl follows.
pub(super) fn follow(v: &Value) -> Vec<String> {
    let mut out = Vec::new();
    links(v, &mut out);
    out
}

/// Crawls `ep` from its service root. Fails only when the service root cannot be read
/// (unreachable, TLS, auth, not Redfish); a resource that fails is listed and skipped.
pub async fn survey(ep: &Endpoint) -> Result<Survey, RedfishError> {
    let root_path = "/redfish/v1";
    let root = ep.get(root_path).await?;
    let mut s = Survey {
        endpoint: ep.cfg.name.clone(),
        resources: 1,
        requests: 1,
        ..Survey::default()
    };
    let mut seen: BTreeSet<String> = BTreeSet::from([root_path.to_string()]);
    let mut next: Vec<String> = follow(&root);
    while !next.is_empty() {
        let level: Vec<String> = std::mem::take(&mut next)
            .into_iter()
            .filter(|p| seen.insert(p.clone()))
            .collect();
        let room = MAX_RESOURCES.saturating_sub(s.requests);
        if level.len() > room {
            s.truncated = true;
        }
        let got: Vec<(String, Result<Value, RedfishError>)> =
            stream::iter(level.into_iter().take(room))
                .map(|p| async move {
                    let r = ep.get(&p).await;
                    (p, r)
                })
                .buffered(PARALLEL)
                .collect()
                .await;
        for (p, r) in got {
            s.requests += 1;
            match r {
                Ok(v) => {
                    s.resources += 1;
                    s.add(&p, &v);
                    next.extend(follow(&v));
                }
                Err(e) => s.failed.push(e.to_string()),
            }
        }
    }
    s.settle();
    Ok(s)
}

/// [`survey`] on a runtime of its own, for callers without one (`telemetry probe`).
pub fn survey_blocking(cfg: EndpointConfig) -> Result<Survey, RedfishError> {
    let name = cfg.name.clone();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| RedfishError::Config {
            endpoint: name,
            message: format!("cannot start a runtime for the survey: {e}"),
        })?;
    rt.block_on(async {
        let ep = Endpoint::new(cfg)?;
        survey(&ep).await
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_crawl_follows_links_into_the_trees_with_readings() {
        let c = json!({
            "Sensors": {"@odata.id": "/redfish/v1/Chassis/1/Sensors"},
            "Links": {"ManagedBy": [{"@odata.id": "/redfish/v1/Managers/1"}], "Contains": [{"@odata.id": "/redfish/v1/Chassis/2"}]},
            "PowerWatts": {"DataSourceUri": "/redfish/v1/Chassis/1/Sensors/P"},
            "Thermal": {"@odata.id": "/redfish/v1/Chassis/1/Thermal#/Fans/0"},
            "LogServices": {"@odata.id": "/redfish/v1/Chassis/1/LogServices"}
        });
        let mut got = follow(&c);
        got.sort();
        assert_eq!(
            got,
            vec![
                "/redfish/v1/Chassis/1/Sensors".to_string(),
                "/redfish/v1/Chassis/1/Sensors/P".to_string(),
                "/redfish/v1/Chassis/1/Thermal".to_string(),
                "/redfish/v1/Chassis/2".to_string(),
            ]
        );
    }

    #[test]
    fn a_reading_seen_twice_counts_once_and_the_sensor_wins() {
        let mut s = Survey::default();
        s.add(
            "/c/Env",
            &json!({"PowerWatts": {"Reading": 100.0, "DataSourceUri": "/c/Sensors/P"}}),
        );
        s.add(
            "/c/Sensors/P",
            &json!({"Reading": 101.0, "ReadingUnits": "W"}),
        );
        s.add(
            "/c/Other",
            &json!({"Power": {"Reading": 100.0, "DataSourceUri": "/c/Sensors/P"}}),
        );
        assert_eq!(s.readings.len(), 1);
        assert_eq!(s.readings["/c/Sensors/P"].value, 101.0);
    }
}
