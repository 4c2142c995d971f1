//! The Redfish edge of `serve`: the `[redfish]` section, checked, and its poller as a
//! source (started with the others, see [`crate::sources`]) whose samples go into the
//! tick's bounded buffer; its per-endpoint counters go to `/metrics` through the board.

use std::time::Duration;

use anyhow::Result;
use serde::Deserialize;
use sources::redfish::{
    EndpointConfig, EndpointStats, Options, Poller, RedfishSource, StatsHandle, FAILURE_REASONS,
};
use tracing::info;

use telemetry::{EntityId, Site};

/// `[redfish]` in `powerplane.toml`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedfishSection {
    #[serde(default = "default_interval")]
    pub interval_s: f64,
    /// GETs in flight over all endpoints.
    #[serde(default = "default_concurrency")]
    pub concurrency: usize,
    /// GETs in flight to one endpoint.
    #[serde(default = "crate::redfish::default_per_endpoint")]
    pub per_endpoint: usize,
    #[serde(default = "crate::redfish::default_rediscover_every")]
    pub rediscover_every: u32,
    #[serde(default = "crate::redfish::default_backoff_max_s")]
    pub backoff_max_s: f64,
    pub endpoints: Vec<EndpointConfig>,
}

fn default_interval() -> f64 {
    10.0
}
fn default_concurrency() -> usize {
    256
}

pub fn default_per_endpoint() -> usize {
    Options::default().per_endpoint
}

pub fn default_rediscover_every() -> u32 {
    Options::default().rediscover_every
}

pub fn default_backoff_max_s() -> f64 {
    Options::default().backoff_max.as_secs_f64()
}

/// Checks the section's numbers, every problem at once.
pub fn check(r: &RedfishSection) -> Result<()> {
    let mut problems = Vec::new();
    if !(r.interval_s >= 1.0 && r.interval_s.is_finite()) {
        problems.push(format!(
            "[redfish] interval_s must be at least 1, got {}",
            r.interval_s
        ));
    }
    if r.concurrency == 0 {
        problems.push("[redfish] concurrency must be at least 1, got 0".to_string());
    }
    if r.per_endpoint == 0 {
        problems.push("[redfish] per_endpoint must be at least 1, got 0".to_string());
    }
    if r.rediscover_every == 0 {
        problems.push("[redfish] rediscover_every must be at least 1, got 0".to_string());
    }
    if !(r.backoff_max_s >= 1.0 && r.backoff_max_s.is_finite()) {
        problems.push(format!(
            "[redfish] backoff_max_s must be at least 1, got {}",
            r.backoff_max_s
        ));
    }
    anyhow::ensure!(problems.is_empty(), "{}", problems.join("; "));
    Ok(())
}

/// The poller of `r` as a source (see [`crate::sources`]), and the handle its
/// per-endpoint counters are read through for `/metrics`.
pub fn source(r: &RedfishSection) -> Result<(RedfishSource, StatsHandle)> {
    check(r)?;
    let poller = Poller::with_options(
        r.endpoints.clone(),
        Options {
            concurrency: r.concurrency,
            per_endpoint: r.per_endpoint,
            rediscover_every: r.rediscover_every,
            backoff_max: Duration::from_secs_f64(r.backoff_max_s),
        },
    )?;
    let stats = poller.stats();
    info!(
        endpoints = poller.endpoints.len(),
        interval_s = r.interval_s,
        concurrency = r.concurrency,
        per_endpoint = r.per_endpoint,
        "redfish poller configured"
    );
    // each endpoint's samples go out as soon as they are read
    let source = RedfishSource::new(poller, Duration::from_secs_f64(r.interval_s));
    Ok((source, stats))
}

/// One exported sample of a Redfish family.
#[derive(Debug, Clone, PartialEq)]
pub struct Metric {
    /// Without the `powerplane_` prefix.
    pub name: &'static str,
    pub kind: &'static str,
    pub help: &'static str,
    pub labels: Vec<(&'static str, String)>,
    pub value: f64,
}

/// The poller's counters as `/metrics` families, per endpoint of the config (so the
/// labels are bounded by it).
pub fn metrics(endpoints: &[EndpointStats]) -> Vec<Metric> {
    let mut out = Vec::new();
    for e in endpoints {
        let ep = || vec![("endpoint", e.endpoint.clone())];
        let mut add = |name, kind, help, labels, value| {
            out.push(Metric {
                name,
                kind,
                help,
                labels,
                value,
            })
        };
        for reason in FAILURE_REASONS {
            let n = e.failures.get(reason).copied().unwrap_or(0);
            // the common reasons always, so that rate() sees the first failure
            if n > 0 || matches!(reason, "timeout" | "connect" | "status_5xx") {
                let mut l = ep();
                l.push(("reason", reason.to_string()));
                add(
                    "redfish_failures_total",
                    "counter",
                    "Redfish requests that failed, by endpoint and reason",
                    l,
                    n as f64,
                );
            }
        }
        let counters = [
            (
                "redfish_requests_total",
                "Redfish requests sent (GETs and session logins)",
                e.requests,
            ),
            (
                "redfish_poll_overruns_total",
                "Redfish polls of an endpoint cut off at the poll deadline (the interval)",
                e.overruns,
            ),
            (
                "redfish_polls_skipped_total",
                "Redfish polls skipped while the endpoint backs off after failing",
                e.skipped,
            ),
            (
                "redfish_not_understood_total",
                "Numeric Redfish readings with a unit powerplane does not know, in the resources each discovery read",
                e.not_understood,
            ),
        ];
        for (name, help, n) in counters {
            add(name, "counter", help, ep(), n as f64);
        }
        add(
            "redfish_bindings_unfilled",
            "gauge",
            "The site's [[redfish]] bindings of the endpoint that its last discovery could not fill (no reading, or several without combine)",
            ep(),
            e.bindings_unfilled as f64,
        );
        add(
            "redfish_backing_off",
            "gauge",
            "1 while the endpoint is failing and its polls are skipped",
            ep(),
            f64::from(u8::from(e.backing_off)),
        );
        if let Some(s) = e.last_poll_s {
            add(
                "redfish_poll_duration_seconds",
                "gauge",
                "How long the endpoint's last finished poll took",
                ep(),
                s,
            );
        }
    }
    out
}

/// An entity a Redfish endpoint names that is not one of the site's.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum EndpointEntity {
    #[error("[[redfish.endpoints]] {endpoint:?}: entities.{path:?} = {entity:?}: the site file has no such entity")]
    NotInSite {
        endpoint: String,
        path: String,
        entity: String,
    },
    #[error("[[redfish.endpoints]] {endpoint:?}: entities.{path:?} = {entity:?}: {reason}")]
    NotAnId {
        endpoint: String,
        path: String,
        entity: String,
        /// The id parser's message.
        reason: String,
    },
}

/// Every entity of the Redfish endpoints the site does not have, one per line.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{}", lines(.0))]
pub struct UnknownEntities(pub Vec<EndpointEntity>);

fn lines(problems: &[EndpointEntity]) -> String {
    problems
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("\n")
}

/// Checks that every entity a Redfish endpoint names is one of the site's; every
/// problem at once.
pub fn check_redfish(endpoints: &[EndpointConfig], site: &Site) -> Result<(), UnknownEntities> {
    let known = site.entities();
    let mut problems = Vec::new();
    for ep in endpoints {
        for (path, entity) in &ep.entities {
            match entity.parse::<EntityId>() {
                Ok(e) if known.contains(&e) => {}
                Ok(_) => problems.push(EndpointEntity::NotInSite {
                    endpoint: ep.name.clone(),
                    path: path.clone(),
                    entity: entity.clone(),
                }),
                Err(reason) => problems.push(EndpointEntity::NotAnId {
                    endpoint: ep.name.clone(),
                    path: path.clone(),
                    entity: entity.clone(),
                    reason: reason.to_string(),
                }),
            }
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(UnknownEntities(problems))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redfish_entities_must_be_the_sites() {
        let site = Site::parse("site.toml", control::examples::DEFAULT_SITE).expect("site");
        let mut good = EndpointConfig::new("pdu", "http://127.0.0.1:1");
        good.entities
            .insert("RackPDUs/1".into(), "pdu/pdu-a01".into());
        assert_eq!(check_redfish(std::slice::from_ref(&good), &site), Ok(()));
        let mut bad = good.clone();
        bad.entities.insert("RackPDUs/2".into(), "pdu/nope".into());
        bad.entities.insert("RackPDUs/3".into(), "nonsense".into());
        let e = check_redfish(&[good, bad], &site)
            .expect_err("unknown entities")
            .to_string();
        assert!(
            e.contains("\"pdu/nope\": the site file has no such entity"),
            "{e}"
        );
        assert_eq!(e.lines().count(), 2, "every problem at once: {e}");
    }

    #[test]
    fn every_bad_number_of_the_section_is_reported_at_once() {
        let r: RedfishSection =
            toml::from_str("interval_s = 0.5\nconcurrency = 0\nper_endpoint = 0\nendpoints = []\n")
                .expect("section");
        let e = check(&r).expect_err("refused").to_string();
        for key in [
            "interval_s must be at least 1, got 0.5",
            "concurrency",
            "per_endpoint",
        ] {
            assert!(e.contains(key), "{key}: {e}");
        }
        let ok: RedfishSection = toml::from_str("endpoints = []\n").expect("defaults");
        assert!(check(&ok).is_ok());
        assert_eq!(
            (ok.concurrency, ok.per_endpoint, ok.rediscover_every),
            (256, 4, 360)
        );
    }

    #[test]
    fn failures_are_exported_per_endpoint_and_reason() {
        let mut e = EndpointStats {
            endpoint: "pdu-a01".into(),
            requests: 7,
            overruns: 2,
            last_poll_s: Some(0.3),
            ..EndpointStats::default()
        };
        e.failures.insert("status_4xx", 3);
        let m = metrics(&[e]);
        let find = |name: &str, reason: Option<&str>| {
            m.iter()
                .find(|x| {
                    x.name == name
                        && x.labels.contains(&("endpoint", "pdu-a01".to_string()))
                        && reason.is_none_or(|r| x.labels.contains(&("reason", r.to_string())))
                })
                .map(|x| x.value)
        };
        assert_eq!(
            find("redfish_failures_total", Some("status_4xx")),
            Some(3.0)
        );
        assert_eq!(find("redfish_failures_total", Some("timeout")), Some(0.0));
        assert_eq!(find("redfish_failures_total", Some("bad_json")), None);
        assert_eq!(find("redfish_requests_total", None), Some(7.0));
        assert_eq!(find("redfish_poll_overruns_total", None), Some(2.0));
        assert_eq!(find("redfish_poll_duration_seconds", None), Some(0.3));
    }
}
