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

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;

use serde::Deserialize;
use toml::Spanned;

use crate::diag::{from_toml_error, Collector, Diagnostics};
use crate::{EntityId, EntityKind, GpuModel};

type S<T> = Spanned<T>;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSite {
    version: S<i64>,
    site: RawSiteInfo,
    #[serde(default)]
    gpu_models: BTreeMap<String, S<RawGpuModel>>,
    #[serde(default)]
    feeds: Vec<RawFeed>,
    #[serde(default)]
    pdus: Vec<RawPdu>,
    #[serde(default)]
    cooling: Vec<RawCooling>,
    #[serde(default)]
    rooms: Vec<RawRoom>,
    #[serde(default)]
    rows: Vec<RawRow>,
    #[serde(default)]
    racks: Vec<RawRack>,
    #[serde(default)]
    nodes: Vec<RawNode>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSiteInfo {
    name: S<String>,
    #[serde(default = "default_tz")]
    timezone: S<String>,
    #[serde(default = "default_currency")]
    currency: String,
}

fn default_tz() -> S<String> {
    Spanned::new(0..0, "UTC".to_string())
}
fn default_currency() -> String {
    "EUR".to_string()
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawGpuModel {
    min_w: f64,
    max_w: f64,
    default_w: Option<f64>,
    idle_w: Option<f64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFeed {
    id: S<String>,
    rating_kw: S<f64>,
    derate: Option<S<f64>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPdu {
    id: S<String>,
    feed: S<String>,
    rating_kw: S<f64>,
    derate: Option<S<f64>>,
    #[serde(default)]
    branches: Vec<RawBranch>,
    #[serde(default)]
    outlets: Vec<RawOutlet>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBranch {
    id: S<String>,
    rating_kw: S<f64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawOutlet {
    id: S<String>,
    branch: Option<S<String>>,
    rating_kw: S<f64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCooling {
    id: S<String>,
    #[serde(default)]
    kind: CoolingKind,
    capacity_kw: S<f64>,
    supply_temp_c: Option<S<f64>>,
    full_load_rise_c: Option<S<f64>>,
    overload_rise_c_per_kw: Option<S<f64>>,
    time_constant_s: Option<S<f64>>,
    racks: S<Vec<S<String>>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRoom {
    id: S<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRow {
    id: S<String>,
    room: S<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRack {
    id: S<String>,
    row: S<String>,
    #[serde(default)]
    pdus: Vec<S<String>>,
    power_budget_kw: Option<S<f64>>,
    inlet_limit_c: Option<S<f64>>,
    #[serde(default)]
    nodes: Option<S<i64>>,
    gpus_per_node: Option<S<i64>>,
    gpu_model: Option<S<String>>,
    node_base_w: Option<S<f64>>,
    #[serde(default)]
    labels: BTreeMap<String, String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawNode {
    id: S<String>,
    rack: S<String>,
    gpus: S<i64>,
    gpu_model: S<String>,
    base_w: Option<S<f64>>,
    /// `pdu.outlet` for each power supply.
    #[serde(default)]
    outlets: Vec<S<String>>,
}

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
    pub currency: String,
    pub gpu_models: BTreeMap<String, GpuModel>,
    pub feeds: Vec<Feed>,
    pub pdus: Vec<Pdu>,
    pub cooling: Vec<CoolingUnit>,
    pub rooms: Vec<String>,
    pub rows: Vec<Row>,
    pub racks: Vec<Rack>,
    pub nodes: Vec<Node>,
}

/// One GPU of the site, with where it sits.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuRef<'a> {
    pub id: EntityId,
    /// Index of its node in [`Site::nodes`] and of its rack in [`Site::racks`].
    pub node_index: usize,
    pub rack_index: usize,
    pub node: &'a Node,
    pub index: u32,
    pub rack: &'a Rack,
    pub model: &'a GpuModel,
}

pub const DEFAULT_DERATE: f64 = 0.8;
pub const DEFAULT_INLET_LIMIT_C: f64 = 32.0;
pub const DEFAULT_NODE_BASE_W: f64 = 400.0;

impl Site {
    /// Parses and validates a site file. `file` is the name used in diagnostics.
    pub fn parse(file: &str, src: &str) -> Result<Site, Diagnostics> {
        let raw: RawSite = toml::from_str(src).map_err(|e| from_toml_error(file, src, &e))?;
        let mut c = Collector::new(file, src);
        let site = build(raw, &mut c);
        c.finish()?;
        Ok(site)
    }

    /// The site-wide usable power: the sum of its feeds after derating, in kW.
    pub fn facility_budget_kw(&self) -> f64 {
        self.feeds.iter().map(Feed::usable_kw).sum()
    }

    pub fn site_entity(&self) -> EntityId {
        EntityId::site(&self.name)
    }

    pub fn rack(&self, id: &str) -> Option<&Rack> {
        self.racks.iter().find(|r| r.id == id)
    }

    /// Every GPU in rack, node and index order.
    pub fn gpus(&self) -> Vec<GpuRef<'_>> {
        let mut out = Vec::new();
        for (rack_index, rack) in self.racks.iter().enumerate() {
            for &n in &rack.nodes {
                let node = &self.nodes[n];
                let Some(model) = self.gpu_models.get(&node.gpu_model) else {
                    continue;
                };
                for index in 0..node.gpus {
                    out.push(GpuRef {
                        id: EntityId::gpu(&node.id, index),
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
        self.cooling
            .iter()
            .find(|c| c.racks.iter().any(|r| r == rack))
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
        s.extend(self.gpus().into_iter().map(|g| g.id));
        s
    }
}

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

fn build(raw: RawSite, c: &mut Collector) -> Site {
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

    let gpu_models = build_gpu_models(&raw.gpu_models, c);

    let mut feed_ids = BTreeSet::new();
    let mut feeds = Vec::new();
    for f in &raw.feeds {
        check_id(c, &mut feed_ids, "feed", &f.id);
        let what = format!("feed {:?}: rating_kw", f.id.get_ref());
        feeds.push(Feed {
            id: f.id.get_ref().clone(),
            rating_kw: check_range(c, &f.rating_kw, &what, 0.001, 1_000_000.0),
            derate: opt_range(
                c,
                &f.derate,
                &format!("feed {:?}: derate", f.id.get_ref()),
                0.01,
                1.0,
                DEFAULT_DERATE,
            ),
        });
    }
    if raw.feeds.is_empty() {
        c.at(
            0..0,
            "the site needs at least one [[feeds]] entry (its utility supply)",
        );
    }

    let mut pdu_ids = BTreeSet::new();
    let mut pdus = Vec::new();
    for p in &raw.pdus {
        check_id(c, &mut pdu_ids, "pdu", &p.id);
        let pid = p.id.get_ref().clone();
        check_ref(c, &feed_ids, "feed", &format!("pdu {pid:?}"), &p.feed);
        let rating_kw = check_range(
            c,
            &p.rating_kw,
            &format!("pdu {pid:?}: rating_kw"),
            0.001,
            10_000.0,
        );
        let mut branch_ids = BTreeSet::new();
        let mut branches = Vec::new();
        for b in &p.branches {
            check_id(c, &mut branch_ids, &format!("pdu {pid:?} branch"), &b.id);
            let r = check_range(
                c,
                &b.rating_kw,
                &format!("pdu {pid:?} branch {:?}: rating_kw", b.id.get_ref()),
                0.001,
                10_000.0,
            );
            if r > rating_kw {
                c.at(
                    span(&b.rating_kw),
                    format!(
                        "pdu {pid:?} branch {:?}: rating_kw {r} exceeds the pdu's own {rating_kw}",
                        b.id.get_ref()
                    ),
                );
            }
            branches.push(Branch {
                id: b.id.get_ref().clone(),
                rating_kw: r,
            });
        }
        let mut outlet_ids = BTreeSet::new();
        let mut outlets = Vec::new();
        for o in &p.outlets {
            let oid = o.id.get_ref();
            check_id(c, &mut outlet_ids, &format!("pdu {pid:?} outlet"), &o.id);
            let r = check_range(
                c,
                &o.rating_kw,
                &format!("pdu {pid:?} outlet {oid:?}: rating_kw"),
                0.001,
                100.0,
            );
            if let Some(b) = &o.branch {
                check_ref(
                    c,
                    &branch_ids,
                    "branch",
                    &format!("pdu {pid:?} outlet {oid:?}"),
                    b,
                );
            }
            outlets.push(Outlet {
                id: oid.clone(),
                branch: o.branch.as_ref().map(|b| b.get_ref().clone()),
                rating_kw: r,
            });
        }
        pdus.push(Pdu {
            id: pid.clone(),
            feed: p.feed.get_ref().clone(),
            rating_kw,
            derate: opt_range(
                c,
                &p.derate,
                &format!("pdu {pid:?}: derate"),
                0.01,
                1.0,
                DEFAULT_DERATE,
            ),
            branches,
            outlets,
        });
    }

    let mut room_ids = BTreeSet::new();
    for r in &raw.rooms {
        check_id(c, &mut room_ids, "room", &r.id);
    }
    let mut row_ids = BTreeSet::new();
    let mut rows = Vec::new();
    for r in &raw.rows {
        check_id(c, &mut row_ids, "row", &r.id);
        check_ref(
            c,
            &room_ids,
            "room",
            &format!("row {:?}", r.id.get_ref()),
            &r.room,
        );
        rows.push(Row {
            id: r.id.get_ref().clone(),
            room: r.room.get_ref().clone(),
        });
    }

    let mut rack_ids = BTreeSet::new();
    for r in &raw.racks {
        check_id(c, &mut rack_ids, "rack", &r.id);
    }
    let cooling = build_cooling(&raw.cooling, &rack_ids, c);

    let mut nodes: Vec<Node> = Vec::new();
    let mut node_ids = BTreeSet::new();
    let mut racks = Vec::new();
    for r in &raw.racks {
        let rid = r.id.get_ref().clone();
        let owner = format!("rack {rid:?}");
        check_ref(c, &row_ids, "row", &owner, &r.row);
        for p in &r.pdus {
            check_ref(c, &pdu_ids, "pdu", &owner, p);
        }
        let served_by: Vec<&CoolingUnit> =
            cooling.iter().filter(|u| u.racks.contains(&rid)).collect();
        if served_by.is_empty() {
            c.at(
                span(&r.id),
                format!("{owner} is served by no cooling unit; list it in one [[cooling]] racks"),
            );
        } else if served_by.len() > 1 {
            let ids: Vec<&str> = served_by.iter().map(|u| u.id.as_str()).collect();
            c.at(
                span(&r.id),
                format!(
                    "{owner} is listed by more than one cooling unit: {}",
                    ids.join(", ")
                ),
            );
        }
        let pdu_kw: f64 = r
            .pdus
            .iter()
            .filter_map(|p| pdus.iter().find(|x| &x.id == p.get_ref()))
            .map(Pdu::usable_kw)
            .sum();
        let power_budget_kw = match &r.power_budget_kw {
            Some(b) => check_range(c, b, &format!("{owner}: power_budget_kw"), 0.001, 10_000.0),
            None => {
                if r.pdus.is_empty() {
                    c.at(
                        span(&r.id),
                        format!("{owner} needs power_budget_kw or at least one pdu"),
                    );
                }
                pdu_kw
            }
        };
        let inlet_limit_c = opt_range(
            c,
            &r.inlet_limit_c,
            &format!("{owner}: inlet_limit_c"),
            15.0,
            45.0,
            DEFAULT_INLET_LIMIT_C,
        );
        let mut idx = Vec::new();
        if let Some(count) = &r.nodes {
            let n = *count.get_ref();
            if !(0..=1000).contains(&n) {
                c.at(
                    span(count),
                    format!("{owner}: nodes must be within 0..=1000, got {n}"),
                );
            }
            let gpus = r.gpus_per_node.as_ref().map(|g| *g.get_ref()).unwrap_or(8);
            if let Some(g) = &r.gpus_per_node {
                if !(0..=16).contains(g.get_ref()) {
                    c.at(
                        span(g),
                        format!(
                            "{owner}: gpus_per_node must be within 0..=16, got {}",
                            g.get_ref()
                        ),
                    );
                }
            }
            let model = match &r.gpu_model {
                Some(m) => {
                    check_model(c, &gpu_models, &owner, m);
                    m.get_ref().clone()
                }
                None => {
                    if gpus > 0 {
                        c.at(
                            span(count),
                            format!("{owner}: gpu_model is required when the rack has GPU nodes"),
                        );
                    }
                    String::new()
                }
            };
            let base_w = opt_range(
                c,
                &r.node_base_w,
                &format!("{owner}: node_base_w"),
                0.0,
                20_000.0,
                DEFAULT_NODE_BASE_W,
            );
            for i in 1..=n.clamp(0, 1000) {
                let id = format!("{rid}-n{i:02}");
                if !node_ids.insert(id.clone()) {
                    c.at(
                        span(count),
                        format!("{owner}: generated node {id:?} is defined twice"),
                    );
                }
                idx.push(nodes.len());
                nodes.push(Node {
                    id,
                    rack: rid.clone(),
                    gpus: gpus.clamp(0, 16) as u32,
                    gpu_model: model.clone(),
                    base_w,
                    outlets: Vec::new(),
                });
            }
        }
        racks.push(Rack {
            id: rid,
            row: r.row.get_ref().clone(),
            pdus: r.pdus.iter().map(|p| p.get_ref().clone()).collect(),
            cooling: served_by.first().map(|u| u.id.clone()).unwrap_or_default(),
            power_budget_kw,
            inlet_limit_c,
            labels: r.labels.clone(),
            nodes: idx,
        });
    }

    for n in &raw.nodes {
        check_id(c, &mut node_ids, "node", &n.id);
        let owner = format!("node {:?}", n.id.get_ref());
        check_ref(c, &rack_ids, "rack", &owner, &n.rack);
        check_model(c, &gpu_models, &owner, &n.gpu_model);
        if !(0..=16).contains(n.gpus.get_ref()) {
            c.at(
                span(&n.gpus),
                format!(
                    "{owner}: gpus must be within 0..=16, got {}",
                    n.gpus.get_ref()
                ),
            );
        }
        for o in &n.outlets {
            let known = o
                .get_ref()
                .split_once('.')
                .and_then(|(p, out)| {
                    pdus.iter()
                        .find(|x| x.id == p)
                        .map(|x| x.outlets.iter().any(|y| y.id == out))
                })
                .unwrap_or(false);
            if !known {
                c.at(
                    span(o),
                    format!(
                        "{owner} refers to unknown outlet {:?} (write it pdu.outlet)",
                        o.get_ref()
                    ),
                );
            }
        }
        let i = nodes.len();
        nodes.push(Node {
            id: n.id.get_ref().clone(),
            rack: n.rack.get_ref().clone(),
            gpus: (*n.gpus.get_ref()).clamp(0, 16) as u32,
            gpu_model: n.gpu_model.get_ref().clone(),
            base_w: opt_range(
                c,
                &n.base_w,
                &format!("{owner}: base_w"),
                0.0,
                20_000.0,
                DEFAULT_NODE_BASE_W,
            ),
            outlets: n.outlets.iter().map(|o| o.get_ref().clone()).collect(),
        });
        if let Some(r) = racks.iter_mut().find(|r| &r.id == n.rack.get_ref()) {
            r.nodes.push(i);
        }
    }

    Site {
        name,
        timezone,
        currency: raw.site.currency,
        gpu_models,
        feeds,
        pdus,
        cooling,
        rooms: raw.rooms.iter().map(|r| r.id.get_ref().clone()).collect(),
        rows,
        racks,
        nodes,
    }
}

fn check_model(c: &mut Collector, models: &BTreeMap<String, GpuModel>, owner: &str, m: &S<String>) {
    if !models.contains_key(m.get_ref()) {
        let known: Vec<&str> = models.keys().map(String::as_str).collect();
        c.at(
            span(m),
            format!(
                "{owner}: unknown gpu_model {:?} (known: {}; define others under [gpu_models])",
                m.get_ref(),
                known.join(", ")
            ),
        );
    }
}

fn build_gpu_models(
    raw: &BTreeMap<String, S<RawGpuModel>>,
    c: &mut Collector,
) -> BTreeMap<String, GpuModel> {
    let mut models: BTreeMap<String, GpuModel> = GpuModel::BUILTIN_NAMES
        .iter()
        .filter_map(|n| GpuModel::builtin(n))
        .map(|m| (m.name.clone(), m))
        .collect();
    for (name, m) in raw {
        let v = m.get_ref();
        let default_w = v.default_w.unwrap_or(v.max_w);
        let idle_w = v.idle_w.unwrap_or(v.min_w * 0.3);
        let ok = v.min_w > 0.0 && v.min_w < v.max_w && v.max_w <= 5000.0;
        if !ok {
            c.at(span(m), format!("gpu model {name:?}: needs 0 < min_w < max_w <= 5000, got min_w {} and max_w {}", v.min_w, v.max_w));
        } else if !(v.min_w..=v.max_w).contains(&default_w) {
            c.at(
                span(m),
                format!("gpu model {name:?}: default_w {default_w} must be within min_w..=max_w"),
            );
        } else if !(0.0..=v.max_w).contains(&idle_w) {
            c.at(
                span(m),
                format!("gpu model {name:?}: idle_w {idle_w} must be within 0..=max_w"),
            );
        }
        models.insert(
            name.clone(),
            GpuModel {
                name: name.clone(),
                min_w: v.min_w,
                max_w: v.max_w,
                default_w,
                idle_w,
            },
        );
    }
    models
}

fn build_cooling(
    raw: &[RawCooling],
    rack_ids: &BTreeSet<String>,
    c: &mut Collector,
) -> Vec<CoolingUnit> {
    let mut ids = BTreeSet::new();
    let mut out = Vec::new();
    for u in raw {
        check_id(c, &mut ids, "cooling unit", &u.id);
        let owner = format!("cooling unit {:?}", u.id.get_ref());
        for r in u.racks.get_ref() {
            check_ref(c, rack_ids, "rack", &owner, r);
        }
        if u.racks.get_ref().is_empty() {
            c.at(span(&u.racks), format!("{owner} serves no racks"));
        }
        out.push(CoolingUnit {
            id: u.id.get_ref().clone(),
            kind: u.kind,
            capacity_kw: check_range(
                c,
                &u.capacity_kw,
                &format!("{owner}: capacity_kw"),
                0.001,
                100_000.0,
            ),
            supply_temp_c: opt_range(
                c,
                &u.supply_temp_c,
                &format!("{owner}: supply_temp_c"),
                5.0,
                45.0,
                22.0,
            ),
            full_load_rise_c: opt_range(
                c,
                &u.full_load_rise_c,
                &format!("{owner}: full_load_rise_c"),
                0.0,
                30.0,
                6.0,
            ),
            overload_rise_c_per_kw: opt_range(
                c,
                &u.overload_rise_c_per_kw,
                &format!("{owner}: overload_rise_c_per_kw"),
                0.0,
                10.0,
                0.5,
            ),
            time_constant_s: opt_range(
                c,
                &u.time_constant_s,
                &format!("{owner}: time_constant_s"),
                1.0,
                86_400.0,
                300.0,
            ),
            racks: u
                .racks
                .get_ref()
                .iter()
                .map(|r| r.get_ref().clone())
                .collect(),
        });
    }
    out
}

#[cfg(test)]
mod tests;
