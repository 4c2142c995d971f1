//! `powerplane site check --config powerplane.toml`: the site against the live BMCs.
//! Each Redfish endpoint of the config is discovered once (as `serve` would) and
//! surveyed; the check prints every `[[redfish]]` binding with the reading it took (or
//! why none), every reading of the service that nothing maps, and the site entities
//! no Redfish reading reaches. It fails when an endpoint cannot be read or a binding
//! takes no reading or several without `combine`.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::Path;

use anyhow::Result;
use sources::redfish::bind::{Matched, Outcome};
use sources::redfish::survey::{survey_blocking, Survey};
use sources::redfish::{EndpointConfig, Polled, Poller, RedfishError};
use telemetry::{EntityId, EntityKind, Site};

/// What the check found: the report, and whether the site's bindings all hold.
pub struct Checked {
    pub report: String,
    pub ok: bool,
}

/// Loads the config (and its site), polls and surveys every Redfish endpoint.
pub fn run(config: &Path) -> Result<Checked> {
    let loaded = serve::config::load(config)?;
    let endpoints: Vec<EndpointConfig> = loaded
        .config
        .redfish
        .as_ref()
        .map(|r| r.endpoints.clone())
        .unwrap_or_default();
    if endpoints.is_empty() {
        return Ok(Checked {
            report: format!(
                "{}: no [[redfish.endpoints]]: nothing to check against live services\n",
                config.display()
            ),
            ok: true,
        });
    }
    let mut poller = Poller::new(endpoints.clone(), 16)?;
    let polled = poller.poll(common::wall_clock());
    let surveys: Vec<Result<Survey, RedfishError>> = endpoints
        .iter()
        .map(|c| survey_blocking(c.clone()))
        .collect();
    Ok(report(&loaded.site, &endpoints, &polled, &surveys))
}

/// The report of one check (pure, for tests).
pub fn report(
    site: &Site,
    endpoints: &[EndpointConfig],
    polled: &[Polled],
    surveys: &[Result<Survey, RedfishError>],
) -> Checked {
    let mut t = String::new();
    let mut ok = true;
    let known = site.entities();
    let mut reached: BTreeSet<EntityId> = BTreeSet::new();
    for ((ep, p), s) in endpoints.iter().zip(polled).zip(surveys) {
        let _ = writeln!(t, "redfish {} ({})", ep.name, ep.url);
        if let Some(e) = &p.error {
            ok = false;
            let _ = writeln!(t, "  unreachable: {e}");
            continue;
        }
        for s in &p.samples {
            if known.contains(&s.entity) {
                reached.insert(s.entity.clone());
            }
        }
        let mut used = Used::default();
        ok &= bindings(&mut t, ep, p, &mut used);
        used.walked(ep, p, &known);
        match s {
            Err(e) => {
                ok = false;
                let _ = writeln!(t, "  survey failed: {e}");
            }
            Ok(s) => unmapped(&mut t, s, &used),
        }
    }
    let watched = [
        EntityKind::Feed,
        EntityKind::Pdu,
        EntityKind::Rack,
        EntityKind::Cooling,
    ];
    let missing: Vec<String> = known
        .iter()
        .filter(|e| watched.contains(&e.kind) && !reached.contains(e))
        .map(ToString::to_string)
        .collect();
    if !missing.is_empty() {
        let _ = writeln!(
            t,
            "site entities no Redfish reading reaches ({}): {}",
            missing.len(),
            missing.join(", ")
        );
    }
    let _ = writeln!(t, "{}", if ok { "ok" } else { "problems found" });
    Checked { report: t, ok }
}

/// The readings of an endpoint some site entity takes: bound (by key or source), or
/// through `entities` (by resource).
#[derive(Default)]
struct Used {
    readings: BTreeSet<String>,
    resources: BTreeSet<String>,
}

impl Used {
    /// The built-in walk's readings of site entities (`entities`): their resources.
    fn walked(&mut self, ep: &EndpointConfig, p: &Polled, known: &BTreeSet<EntityId>) {
        let prefix = format!("redfish:{}", ep.name);
        let bound = |s: &telemetry::Sample| {
            ep.bind
                .iter()
                .any(|b| b.entity == s.entity && b.metric == s.metric)
        };
        for s in p
            .samples
            .iter()
            .filter(|s| ep.walks_tree() && known.contains(&s.entity) && !bound(s))
        {
            if let Some(rest) = s.source.strip_prefix(prefix.as_str()) {
                self.resources
                    .insert(rest.split('#').next().unwrap_or(rest).to_string());
            }
        }
    }
}

/// Each binding of the endpoint with the reading it took, or why none; whether all
/// took one. The readings taken go to `used`.
fn bindings(t: &mut String, ep: &EndpointConfig, p: &Polled, used: &mut Used) -> bool {
    let mut ok = true;
    for r in &p.bindings {
        let Some(b) = ep.bind.get(r.index) else {
            continue;
        };
        let head = format!("  {} {} {}", b.at, b.entity, b.metric);
        let unit = b.metric.spec().map(|s| s.unit).unwrap_or_default();
        match &r.outcome {
            Outcome::Value { value, quality } => {
                let q = format!("{quality:?}").to_lowercase();
                let _ = writeln!(
                    t,
                    "{head} = {value:.3} {unit} ({q}) <- {}",
                    sources_of(&r.used)
                );
            }
            Outcome::Nothing => {
                ok = false;
                let prop = b
                    .property
                    .as_deref()
                    .map(|p| format!(" at {p:?}"))
                    .unwrap_or_default();
                let _ = writeln!(
                    t,
                    "{head}: NO READING: no resource /redfish/v1/{} holds a reading in {unit}{prop}",
                    b.resource
                );
            }
            Outcome::Ambiguous(n) => {
                ok = false;
                let _ = writeln!(
                    t,
                    "{head}: AMBIGUOUS: {n} readings match; name one with property or set combine:"
                );
                for m in &r.used {
                    let _ = writeln!(t, "      {:.3} {unit} {}", m.value, m.described());
                }
            }
        }
        if matches!(r.outcome, Outcome::Value { .. }) {
            for m in &r.used {
                used.readings.insert(m.key.clone());
                used.readings.insert(m.from.clone());
            }
        }
    }
    ok
}

/// The survey's readings no site entity takes, and the resources not understood.
fn unmapped(t: &mut String, s: &Survey, used: &Used) {
    let unmapped: Vec<_> = s
        .readings
        .values()
        .filter(|r| {
            let resource = r.from.split('#').next().unwrap_or_default();
            !(used.readings.contains(&r.key)
                || used.readings.contains(&r.from)
                || used.resources.contains(resource))
        })
        .collect();
    let _ = writeln!(
        t,
        "  {} of {} readings of the service reach a site entity; unmapped:",
        s.readings.len() - unmapped.len(),
        s.readings.len()
    );
    for r in &unmapped {
        let window = r.window.map(|w| format!(" ({w})")).unwrap_or_default();
        let _ = writeln!(
            t,
            "    {:<18} {:>12.3} {:<6} {}{window}",
            r.metric, r.value, r.unit, r.from
        );
    }
    for (path, u) in &s.not_understood {
        let _ = writeln!(
            t,
            "  not understood: {path}: {} numeric properties",
            u.len()
        );
    }
}

fn sources_of(used: &[Matched]) -> String {
    match used {
        [one] => one.described(),
        many => format!(
            "{} readings: {}",
            many.len(),
            many.iter()
                .map(Matched::described)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}
