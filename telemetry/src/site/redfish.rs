//! `[[redfish]]` in the site file: a reading of a Redfish service bound to a site
//! entity and metric (a rack inlet from a chassis sensor, a PDU's power from its
//! mains, a cooling unit's supply from a CDU's coolant connector, a leak detector).
//! Pure: the poller in `telemetry/sources` fetches the resources and applies them.
//!
//! ```toml
//! [[redfish]]
//! endpoint = "bmc-a01-n01"                          # a [[redfish.endpoints]] name
//! resource = "Chassis/1U/Sensors/IntakeTemp"        # path under /redfish/v1/
//! entity = "rack/a01"
//! metric = "inlet_temp_c"
//!
//! [[redfish]]
//! endpoint = "shelf-1"
//! resource = "PowerEquipment/PowerShelves/1/PowerSupplies/*/Metrics"
//! property = "InputPowerWatts"                      # which reading of the resource
//! entity = "pdu/shelf-1"
//! metric = "power_w"
//! combine = "sum"                                   # several readings: sum, max, min, mean
//! ```

use std::collections::BTreeSet;
use std::fmt;

use serde::Deserialize;

use crate::diag::Collector;
use crate::metric;
use crate::EntityId;

/// A value with its byte span in the site file.
type S<T> = toml::Spanned<T>;

/// How several readings that one binding matches become one sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Combine {
    Sum,
    Max,
    Min,
    Mean,
}

impl Combine {
    pub fn apply(self, values: &[f64]) -> Option<f64> {
        let first = *values.first()?;
        Some(match self {
            Combine::Sum => values.iter().sum(),
            Combine::Max => values.iter().copied().fold(first, f64::max),
            Combine::Min => values.iter().copied().fold(first, f64::min),
            Combine::Mean => values.iter().sum::<f64>() / values.len() as f64,
        })
    }
}

impl fmt::Display for Combine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Combine::Sum => "sum",
            Combine::Max => "max",
            Combine::Min => "min",
            Combine::Mean => "mean",
        })
    }
}

/// Why a `resource` is no resource pattern.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PatternError {
    #[error("resource must name a path under /redfish/v1/")]
    Empty,
    #[error("resource {resource:?} has an empty segment {segment:?}")]
    EmptySegment { resource: String, segment: String },
    #[error("resource {0:?}: ** may only be the last segment")]
    TreeNotLast(String),
    #[error("resource {0:?}: a segment is a name, * or a final **")]
    BadSegment(String),
}

/// A resource path under `/redfish/v1/`, each segment literal or `*` (any one
/// segment); a last segment `**` is the whole tree below (one segment or more).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourcePattern {
    segments: Vec<String>,
}

impl ResourcePattern {
    pub fn parse(s: &str) -> Result<Self, PatternError> {
        let s = s
            .trim()
            .trim_start_matches('/')
            .trim_start_matches("redfish/v1/")
            .trim_end_matches('/');
        if s.is_empty() {
            return Err(PatternError::Empty);
        }
        let segments: Vec<String> = s.split('/').map(str::to_string).collect();
        if let Some(bad) = segments.iter().find(|x| x.is_empty()) {
            return Err(PatternError::EmptySegment {
                resource: s.to_string(),
                segment: bad.clone(),
            });
        }
        if let Some(i) = segments.iter().position(|x| x == "**") {
            if i + 1 != segments.len() {
                return Err(PatternError::TreeNotLast(s.to_string()));
            }
        }
        if segments
            .iter()
            .any(|x| x != "*" && x != "**" && (x.contains('*') || x.contains('#')))
        {
            return Err(PatternError::BadSegment(s.to_string()));
        }
        Ok(ResourcePattern { segments })
    }

    fn rel(path: &str) -> Vec<&str> {
        path.trim_start_matches("/redfish/v1")
            .trim_matches('/')
            .split('/')
            .filter(|s| !s.is_empty())
            .collect()
    }

    /// Whether the resource at `path` (`/redfish/v1/...`) is one this pattern names.
    pub fn matches(&self, path: &str) -> bool {
        let p = Self::rel(path);
        let mut i = 0;
        for seg in &self.segments {
            if seg == "**" {
                return p.len() > i;
            }
            match p.get(i) {
                Some(x) if seg == "*" || seg == x => i += 1,
                _ => return false,
            }
        }
        i == p.len()
    }

    /// Whether a resource this pattern names may lie below `path`: the crawl of a
    /// pattern with wildcards follows only such links.
    pub fn may_lead_to(&self, path: &str) -> bool {
        let p = Self::rel(path);
        for (i, x) in p.iter().enumerate() {
            match self.segments.get(i).map(String::as_str) {
                Some("**") => return true,
                Some("*") => {}
                Some(seg) if seg == *x => {}
                _ => return false,
            }
        }
        true
    }

    /// The literal path before the first wildcard (`/redfish/v1/...`), where the
    /// crawl of this pattern starts; the whole path when it has none.
    pub fn start(&self) -> String {
        let lit: Vec<&str> = self
            .segments
            .iter()
            .take_while(|s| *s != "*" && *s != "**")
            .map(String::as_str)
            .collect();
        if lit.is_empty() {
            "/redfish/v1".into()
        } else {
            format!("/redfish/v1/{}", lit.join("/"))
        }
    }

    pub fn is_exact(&self) -> bool {
        self.segments.iter().all(|s| s != "*" && s != "**")
    }
}

impl fmt::Display for ResourcePattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.segments.join("/"))
    }
}

/// One validated `[[redfish]]` entry.
#[derive(Debug, Clone, PartialEq)]
pub struct RedfishBinding {
    /// The `[[redfish.endpoints]]` name (checked against the controller's config).
    pub endpoint: String,
    pub resource: ResourcePattern,
    /// The property holding the reading, as a JSON pointer inside the resource
    /// without its leading `/` or trailing `/Reading` (`PowerWatts`,
    /// `PolyPhaseVoltage/Line1ToNeutral`, `Temperatures/0/ReadingCelsius`); `None`:
    /// every reading of the resource in the metric's unit.
    pub property: Option<String>,
    pub entity: EntityId,
    pub metric: metric::Metric,
    /// `None`: the binding must match exactly one reading.
    pub combine: Option<Combine>,
    /// Where it is in the site file, for messages (`site.toml:41:1`).
    pub at: String,
}

impl RedfishBinding {
    /// `property` normalised as [`RedfishBinding::property`] holds it.
    pub fn normalise_property(p: &str) -> String {
        let p = p.trim().trim_start_matches('/');
        p.strip_suffix("/Reading")
            .or_else(|| (p == "Reading").then_some(""))
            .unwrap_or(p)
            .to_string()
    }

    /// Whether the reading at `pointer` (a JSON pointer inside the resource, e.g.
    /// `/PowerWatts/Reading`) is the property this binding names.
    pub fn property_matches(&self, pointer: &str) -> bool {
        match &self.property {
            None => true,
            Some(p) => Self::normalise_property(pointer) == *p,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawBinding {
    pub(super) endpoint: S<String>,
    pub(super) resource: S<String>,
    #[serde(default)]
    pub(super) property: Option<S<String>>,
    pub(super) entity: S<String>,
    pub(super) metric: S<String>,
    #[serde(default)]
    pub(super) combine: Option<S<Combine>>,
}

/// Validates every binding against the site's entities and the known metrics.
pub(super) fn build(
    raw: &[RawBinding],
    entities: &BTreeSet<EntityId>,
    c: &mut Collector,
) -> Vec<RedfishBinding> {
    let mut out = Vec::new();
    for b in raw {
        let resource = match ResourcePattern::parse(b.resource.get_ref()) {
            Ok(r) => Some(r),
            Err(e) => {
                c.at(b.resource.span(), format!("[[redfish]] {e}"));
                None
            }
        };
        let entity = match b.entity.get_ref().parse::<EntityId>() {
            Ok(e) if entities.contains(&e) => Some(e),
            Ok(e) => {
                c.at(
                    b.entity.span(),
                    format!("[[redfish]] entity {e}: the site defines no such entity"),
                );
                None
            }
            Err(e) => {
                c.at(b.entity.span(), format!("[[redfish]] entity: {e}"));
                None
            }
        };
        let m = b.metric.get_ref();
        if metric::spec(m).is_none() {
            let known: Vec<&str> = metric::all().iter().map(|s| s.name).collect();
            c.at(
                b.metric.span(),
                format!(
                    "[[redfish]] unknown metric {m:?} (known: {})",
                    known.join(", ")
                ),
            );
        }
        if b.endpoint.get_ref().trim().is_empty() {
            c.at(b.endpoint.span(), "[[redfish]] endpoint must not be empty");
        }
        let (line, col) = c.line_col(b.endpoint.span().start);
        if let (Some(resource), Some(entity)) = (resource, entity) {
            if metric::spec(m).is_some() {
                out.push(RedfishBinding {
                    endpoint: b.endpoint.get_ref().clone(),
                    resource,
                    property: b
                        .property
                        .as_ref()
                        .map(|p| RedfishBinding::normalise_property(p.get_ref())),
                    entity,
                    metric: metric::Metric::new(m),
                    combine: b.combine.as_ref().map(|c| *c.get_ref()),
                    at: format!("{}:{line}:{col}", c.file()),
                });
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_name_resources_one_segment_or_a_tree_at_a_time() {
        let p = ResourcePattern::parse("PowerEquipment/PowerShelves/1/PowerSupplies/*/Metrics")
            .expect("pattern");
        assert!(p.matches("/redfish/v1/PowerEquipment/PowerShelves/1/PowerSupplies/2/Metrics"));
        assert!(!p.matches("/redfish/v1/PowerEquipment/PowerShelves/1/PowerSupplies/2"));
        assert!(p.may_lead_to("/redfish/v1/PowerEquipment/PowerShelves/1/PowerSupplies"));
        assert!(p.may_lead_to("/redfish/v1/PowerEquipment/PowerShelves/1/PowerSupplies/7"));
        assert!(!p.may_lead_to("/redfish/v1/PowerEquipment/PowerShelves/2"));
        assert_eq!(
            p.start(),
            "/redfish/v1/PowerEquipment/PowerShelves/1/PowerSupplies"
        );
        let t = ResourcePattern::parse("/redfish/v1/Chassis/1U/Sensors/**").expect("tree");
        assert!(t.matches("/redfish/v1/Chassis/1U/Sensors/Temp1"));
        assert!(!t.matches("/redfish/v1/Chassis/1U/Sensors"));
        let e = ResourcePattern::parse("Chassis/1U/EnvironmentMetrics").expect("exact");
        assert!(e.is_exact() && e.matches("/redfish/v1/Chassis/1U/EnvironmentMetrics/"));
        assert!(ResourcePattern::parse("Chassis/**/Sensors").is_err());
        assert!(ResourcePattern::parse("Chassis/1U*").is_err());
        assert!(ResourcePattern::parse("").is_err());
    }

    #[test]
    fn a_property_is_named_without_its_reading() {
        assert_eq!(
            RedfishBinding::normalise_property("/PowerWatts/Reading"),
            "PowerWatts"
        );
        assert_eq!(RedfishBinding::normalise_property("/Reading"), "");
        assert_eq!(
            RedfishBinding::normalise_property("Temperatures/0/ReadingCelsius"),
            "Temperatures/0/ReadingCelsius"
        );
    }

    #[test]
    fn combine_sums_or_picks() {
        let v = [1.0, 4.0, 2.0];
        assert_eq!(Combine::Sum.apply(&v), Some(7.0));
        assert_eq!(Combine::Max.apply(&v), Some(4.0));
        assert_eq!(Combine::Min.apply(&v), Some(1.0));
        assert_eq!(Combine::Mean.apply(&[1.0, 3.0]), Some(2.0));
        assert_eq!(Combine::Sum.apply(&[]), None);
    }
}
