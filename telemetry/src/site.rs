//! The site file (`site.toml`): topology, power path and cooling path, as operators
//! write it, validated in one pass with `file:line:col` diagnostics.
//!
//! ```toml
//! version = 1
//! [site]
//! name = "hall-1"
//! timezone = "Europe/Berlin"
//! [[feeds]]
//! id = "utility"
//! rating_kw = 200
//! [[pdus]]
//! id = "pdu-a01"
//! feed = "utility"
//! rating_kw = 30
//! [[cooling]]
//! id = "crah-1"
//! capacity_kw = 120
//! racks = ["a01"]
//! [[rooms]]
//! id = "hall-1"
//! [[rows]]
//! id = "row-a"
//! room = "hall-1"
//! [[racks]]
//! id = "a01"
//! row = "row-a"
//! pdus = ["pdu-a01"]
//! nodes = 4
//! gpus_per_node = 8
//! gpu_model = "A40"
//! ```

mod build;
mod ids;
mod raw;
pub mod redfish;

pub use ids::{GpuIds, SiteIds};

use std::collections::{BTreeMap, BTreeSet};

use serde::Deserialize;

use crate::diag::{Collector, Diagnostics};
use crate::{EntityId, EntityKind, GpuModel};
use raw::RawSite;

/// Air (CRAH/CRAC) or liquid (CDU).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CoolingKind {
    #[default]
    Crah,
    Cdu,
}

/// A utility feed: the contract or breaker limit of the whole site or part of it.
#[derive(Debug, Clone, PartialEq)]
pub struct Feed {
    pub id: String,
    pub rating_kw: f64,
    /// Usable fraction of the rating (continuous-load derating).
    pub derate: f64,
}

impl Feed {
    pub fn usable_kw(&self) -> f64 {
        self.rating_kw * self.derate
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Branch {
    pub id: String,
    pub rating_kw: f64,
}

/// A PDU outlet, on a branch circuit when the PDU has them.
#[derive(Debug, Clone, PartialEq)]
pub struct Outlet {
    pub id: String,
    pub branch: Option<String>,
    pub rating_kw: f64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Pdu {
    pub id: String,
    pub feed: String,
    pub rating_kw: f64,
    pub derate: f64,
    pub branches: Vec<Branch>,
    pub outlets: Vec<Outlet>,
}

impl Pdu {
    pub fn usable_kw(&self) -> f64 {
        self.rating_kw * self.derate
    }
}

/// A cooling unit and the racks it serves, with its thermal response.
#[derive(Debug, Clone, PartialEq)]
pub struct CoolingUnit {
    pub id: String,
    pub kind: CoolingKind,
    pub capacity_kw: f64,
    /// Rack inlet temperature with no heat load.
    pub supply_temp_c: f64,
    /// Inlet rise above supply at exactly full capacity.
    pub full_load_rise_c: f64,
    /// Further inlet rise per kW of heat above capacity.
    pub overload_rise_c_per_kw: f64,
    /// How fast inlets follow a change of load.
    pub time_constant_s: f64,
    /// Extra inlet rise of a rack per kW it draws above the unit's rack average.
    pub rack_skew_c_per_kw: f64,
    pub racks: Vec<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub id: String,
    pub room: String,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Rack {
    pub id: String,
    pub row: String,
    pub pdus: Vec<String>,
    pub cooling: String,
    /// Explicit budget, or the usable capacity of its PDUs.
    pub power_budget_kw: f64,
    pub inlet_limit_c: f64,
    pub labels: BTreeMap<String, String>,
    /// Indexes into [`Site::nodes`].
    pub nodes: Vec<usize>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    pub id: String,
    pub rack: String,
    pub gpus: u32,
    pub gpu_model: String,
    /// Power of everything but the GPUs (CPUs, memory, fans).
    pub base_w: f64,
    /// The PDU outlets feeding its power supplies, as `pdu.outlet`.
    pub outlets: Vec<String>,
}

/// A validated site.
#[derive(Debug, Clone, PartialEq)]
pub struct Site {
    pub name: String,
    /// Local time for tariffs, calendars and reports.
    pub timezone: chrono_tz::Tz,
    /// The time-of-use tariff, when the site file gives one: the price when no feed is
    /// fresh.
    pub tariff: Option<crate::tariff::Tariff>,
    pub currency: String,
    pub gpu_models: BTreeMap<String, GpuModel>,
    pub feeds: Vec<Feed>,
    pub pdus: Vec<Pdu>,
    pub cooling: Vec<CoolingUnit>,
    pub rooms: Vec<String>,
    pub rows: Vec<Row>,
    pub racks: Vec<Rack>,
    pub nodes: Vec<Node>,
    /// `[[redfish]]`: Redfish readings bound to entities of this site.
    pub redfish: Vec<redfish::RedfishBinding>,
    /// Dense ids of its racks, nodes and GPUs, and the GPUs' ids made once (a node
    /// changed after the site was built, in name or GPU count, gets its ids made anew
    /// by [`Site::gpus`]); see [`SiteIds`].
    pub ids: SiteIds,
}

/// One GPU of the site, with where it sits.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuRef<'a> {
    /// Borrowed from the site's ids made once ([`Site::gpu_table`]).
    pub id: std::borrow::Cow<'a, EntityId>,
    /// Index of its node in [`Site::nodes`] and of its rack in [`Site::racks`].
    pub node_index: usize,
    pub rack_index: usize,
    pub node: &'a Node,
    pub index: u32,
    pub rack: &'a Rack,
    pub model: &'a GpuModel,
}

/// The pace of work on these GPUs against the jobs' estimates: the speed of their
/// slowest model (1 for none).
pub fn slowest<'a>(gpus: impl IntoIterator<Item = &'a GpuRef<'a>>) -> f64 {
    let speeds = gpus.into_iter().map(|g| g.model.speed);
    speeds.reduce(f64::min).unwrap_or(1.0)
}

pub const DEFAULT_DERATE: f64 = 0.8;
pub const DEFAULT_INLET_LIMIT_C: f64 = 32.0;
pub const DEFAULT_NODE_BASE_W: f64 = 400.0;

impl Site {
    /// Parses and validates a site file. `file` is the name used in diagnostics.
    ///
    /// Every problem at once: the shape problems (unknown keys, wrong types) are set
    /// aside and the rest of the file is still built and checked (unknown references,
    /// impossible values), all reported together in the order of the file.
    pub fn parse(file: &str, src: &str) -> Result<Site, Diagnostics> {
        let read = crate::diag::read_all::<RawSite>(src);
        let mut c = Collector::new(file, src);
        c.extend(read.problems);
        let site = read.value.map(|raw| build::build(raw, &mut c));
        c.finish_with(site)
    }

    /// The site-wide usable power: the sum of its feeds after derating, in kW.
    pub fn facility_budget_kw(&self) -> f64 {
        self.feeds.iter().map(Feed::usable_kw).sum()
    }

    pub fn site_entity(&self) -> EntityId {
        EntityId::site(&self.name)
    }

    pub fn rack(&self, id: &str) -> Option<&Rack> {
        self.rack_index(id).map(|i| &self.racks[i])
    }

    /// Every GPU in rack, node and index order.
    pub fn gpus(&self) -> Vec<GpuRef<'_>> {
        let mut out = Vec::with_capacity(self.gpu_count());
        for (rack_index, rack) in self.racks.iter().enumerate() {
            for &n in &rack.nodes {
                let node = &self.nodes[n];
                let Some(model) = self.gpu_models.get(&node.gpu_model) else {
                    continue;
                };
                let cached = self.node_gpu_ids(n);
                for index in 0..node.gpus {
                    out.push(GpuRef {
                        id: match cached {
                            Some(ids) => std::borrow::Cow::Borrowed(&ids[index as usize]),
                            None => std::borrow::Cow::Owned(EntityId::gpu(&node.id, index)),
                        },
                        node_index: n,
                        rack_index,
                        node,
                        index,
                        rack,
                        model,
                    });
                }
            }
        }
        out
    }

    pub fn gpu_count(&self) -> usize {
        self.nodes.iter().map(|n| n.gpus as usize).sum()
    }

    /// The cooling unit that serves a rack.
    pub fn cooling_of(&self, rack: &str) -> Option<&CoolingUnit> {
        match self.rack_index(rack) {
            Some(r) => self.cooling_index_of(r).map(|u| &self.cooling[u]),
            None => self
                .cooling
                .iter()
                .find(|c| c.racks.iter().any(|r| r == rack)),
        }
    }

    /// Every entity id the site defines.
    pub fn entities(&self) -> BTreeSet<EntityId> {
        let mut s = BTreeSet::new();
        s.insert(self.site_entity());
        s.extend(
            self.rooms
                .iter()
                .map(|r| EntityId::new(EntityKind::Room, r)),
        );
        s.extend(
            self.rows
                .iter()
                .map(|r| EntityId::new(EntityKind::Row, &r.id)),
        );
        s.extend(self.racks.iter().map(|r| EntityId::rack(&r.id)));
        s.extend(self.nodes.iter().map(|n| EntityId::node(&n.id)));
        s.extend(
            self.feeds
                .iter()
                .map(|f| EntityId::new(EntityKind::Feed, &f.id)),
        );
        s.extend(
            self.pdus
                .iter()
                .map(|p| EntityId::new(EntityKind::Pdu, &p.id)),
        );
        for p in &self.pdus {
            s.extend(
                p.outlets
                    .iter()
                    .map(|o| EntityId::new(EntityKind::Outlet, format!("{}.{}", p.id, o.id))),
            );
            s.extend(
                p.branches
                    .iter()
                    .map(|b| EntityId::new(EntityKind::Branch, format!("{}.{}", p.id, b.id))),
            );
        }
        s.extend(
            self.cooling
                .iter()
                .map(|c| EntityId::new(EntityKind::Cooling, &c.id)),
        );
        s.extend(self.gpus().into_iter().map(|g| g.id.into_owned()));
        s
    }

    /// The order in which a snapshot should give its entities slots
    /// ([`crate::Snapshot::register`]): the GPUs in [`Site::gpus`] order (slot `i` is
    /// GPU `i`), then the racks in site order, then the site itself.
    pub fn snapshot_order(&self) -> Vec<EntityId> {
        let mut v: Vec<EntityId> = self.gpus().into_iter().map(|g| g.id.into_owned()).collect();
        v.extend(self.racks.iter().map(|r| EntityId::rack(&r.id)));
        v.push(self.site_entity());
        v
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod every_problem_at_once {
    use super::Site;

    #[test]
    fn shape_and_meaning_problems_are_reported_together() {
        let src = "version = 1\n[site]\nname = \"x\"\ncolour = 3\n\n[[feeds]]\nid = \"utility\"\nrating_kw = -5\nphase = 3\n";
        let err = Site::parse("s.toml", src).expect_err("invalid");
        let lines: Vec<String> = err.to_string().lines().map(str::to_string).collect();
        assert_eq!(lines.len(), 3, "{err}");
        // the shape problems first, then the meaning ones, each in the file's order
        assert!(
            lines[0].starts_with("s.toml:4:1: unknown field `colour`"),
            "{err}"
        );
        assert!(
            lines[1].starts_with("s.toml:9:1: unknown field `phase`"),
            "{err}"
        );
        assert_eq!(
            lines[2],
            "s.toml:8:13: feed \"utility\": rating_kw must be within 0.001..=1000000, got -5"
        );
    }
}
