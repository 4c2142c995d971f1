//! Validation of the site file: every problem collected in one pass, with its position.
//!
//! # Layout
//! - `mod.rs`: the pass in its order (header, models, power path, rooms and rows,
//!   cooling, racks, nodes, tariff, Redfish bindings) and the shared checks of ids,
//!   references and ranges
//! - `power.rs`: feeds and PDUs with their branches and outlets
//! - `racks.rs`: rooms, rows, racks with their generated nodes, and the nodes listed
//!   one by one
//! - `models.rs`: the GPU models (built-in and the file's own)
//! - `cooling.rs`: the cooling units
//! - `tariff.rs`: the time-of-use tariff

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;

use super::raw::*;
use super::*;
use crate::diag::Collector;

mod cooling;
mod models;
mod power;
mod racks;
mod tariff;

fn span<T>(s: &S<T>) -> Range<usize> {
    s.span()
}

/// Checks an id's spelling and uniqueness within its kind.
fn check_id(c: &mut Collector, seen: &mut BTreeSet<String>, kind: &str, id: &S<String>) {
    let v = id.get_ref();
    if v.is_empty() {
        c.at(span(id), format!("{kind} id must not be empty"));
        return;
    }
    if let Some(bad) = v
        .chars()
        .find(|ch| !(ch.is_ascii_alphanumeric() || matches!(ch, '-' | '_' | '.')))
    {
        c.at(
            span(id),
            format!("{kind} {v:?}: ids may hold letters, digits, '-', '_' and '.', not {bad:?}"),
        );
    }
    if !seen.insert(v.clone()) {
        c.at(span(id), format!("{kind} {v:?} is defined twice"));
    }
}

fn check_ref(c: &mut Collector, known: &BTreeSet<String>, what: &str, owner: &str, r: &S<String>) {
    if !known.contains(r.get_ref()) {
        c.at(
            span(r),
            format!("{owner} refers to unknown {what} {:?}", r.get_ref()),
        );
    }
}

fn check_range(c: &mut Collector, v: &S<f64>, what: &str, lo: f64, hi: f64) -> f64 {
    let x = *v.get_ref();
    if !(lo..=hi).contains(&x) {
        c.at(
            span(v),
            format!("{what} must be within {lo}..={hi}, got {x}"),
        );
    }
    x
}

fn opt_range(
    c: &mut Collector,
    v: &Option<S<f64>>,
    what: &str,
    lo: f64,
    hi: f64,
    default: f64,
) -> f64 {
    v.as_ref()
        .map(|v| check_range(c, v, what, lo, hi))
        .unwrap_or(default)
}

pub(super) fn build(raw: RawSite, c: &mut Collector) -> Site {
    let (name, timezone) = header(&raw, c);
    let gpu_models = models::build_gpu_models(&raw.gpu_models, c);
    let (feed_ids, feeds) = power::build_feeds(&raw.feeds, c);
    let (pdu_ids, pdus) = power::build_pdus(&raw.pdus, &feed_ids, c);
    let (row_ids, rows) = racks::build_rows(&raw.rooms, &raw.rows, c);
    let mut rack_ids = BTreeSet::new();
    for r in &raw.racks {
        check_id(c, &mut rack_ids, "rack", &r.id);
    }
    let cooling = cooling::build_cooling(&raw.cooling, &rack_ids, c);
    let known = racks::Known {
        row_ids: &row_ids,
        pdu_ids: &pdu_ids,
        rack_ids: &rack_ids,
        pdus: &pdus,
        cooling: &cooling,
        gpu_models: &gpu_models,
    };
    let mut placed = racks::build_racks(&raw.racks, &known, c);
    racks::build_nodes(&raw.nodes, &known, &mut placed, c);
    let racks::Placed { racks, nodes, .. } = placed;

    let tariff = raw.tariff.as_ref().map(|t| tariff::build_tariff(t, c));
    let mut site = Site {
        name,
        timezone,
        tariff,
        currency: raw.site.currency,
        gpu_models,
        feeds,
        pdus,
        cooling,
        rooms: raw.rooms.iter().map(|r| r.id.get_ref().clone()).collect(),
        rows,
        racks,
        nodes,
        redfish: Vec::new(),
        ids: Default::default(),
    };
    site.ids = super::SiteIds::build(&site);
    site.redfish = super::redfish::build(&raw.redfish, &site.entities(), c);
    site
}

/// The file's version, the site's name and its time zone (UTC when it is not known).
fn header(raw: &RawSite, c: &mut Collector) -> (String, chrono_tz::Tz) {
    if *raw.version.get_ref() != 1 {
        c.at(
            span(&raw.version),
            format!(
                "unsupported site file version {}, expected 1",
                raw.version.get_ref()
            ),
        );
    }
    let name = raw.site.name.get_ref().clone();
    check_id(c, &mut BTreeSet::new(), "site", &raw.site.name);
    let timezone = match raw.site.timezone.get_ref().parse::<chrono_tz::Tz>() {
        Ok(tz) => tz,
        Err(_) => {
            c.at(
                span(&raw.site.timezone),
                format!(
                    "unknown time zone {:?}: use an IANA name such as \"Europe/Berlin\"",
                    raw.site.timezone.get_ref()
                ),
            );
            chrono_tz::UTC
        }
    };
    (name, timezone)
}
