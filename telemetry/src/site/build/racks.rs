//! Rooms, rows, racks (with the nodes a rack generates) and the nodes listed one by one.

use super::models::check_model;
use super::*;

/// What the racks and nodes refer to, built before them.
pub(super) struct Known<'a> {
    pub(super) row_ids: &'a BTreeSet<String>,
    pub(super) pdu_ids: &'a BTreeSet<String>,
    pub(super) rack_ids: &'a BTreeSet<String>,
    pub(super) pdus: &'a [Pdu],
    pub(super) cooling: &'a [CoolingUnit],
    pub(super) gpu_models: &'a BTreeMap<String, GpuModel>,
}

/// The racks and nodes built so far, and the node ids taken.
pub(super) struct Placed {
    pub(super) racks: Vec<Rack>,
    pub(super) nodes: Vec<Node>,
    pub(super) node_ids: BTreeSet<String>,
}

/// The rooms' ids (checked) and the rows in them, with the rows' ids.
pub(super) fn build_rows(
    rooms: &[RawRoom],
    raw: &[RawRow],
    c: &mut Collector,
) -> (BTreeSet<String>, Vec<Row>) {
    let mut room_ids = BTreeSet::new();
    for r in rooms {
        check_id(c, &mut room_ids, "room", &r.id);
    }
    let mut row_ids = BTreeSet::new();
    let mut rows = Vec::new();
    for r in raw {
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
    (row_ids, rows)
}

/// The racks in file order, each with the nodes it generates.
pub(super) fn build_racks(raw: &[RawRack], known: &Known, c: &mut Collector) -> Placed {
    let mut placed = Placed {
        racks: Vec::new(),
        nodes: Vec::new(),
        node_ids: BTreeSet::new(),
    };
    for r in raw {
        let rack = build_rack(r, known, &mut placed, c);
        placed.racks.push(rack);
    }
    placed
}

fn build_rack(r: &RawRack, known: &Known, placed: &mut Placed, c: &mut Collector) -> Rack {
    let rid = r.id.get_ref().clone();
    let owner = format!("rack {rid:?}");
    check_ref(c, known.row_ids, "row", &owner, &r.row);
    for p in &r.pdus {
        check_ref(c, known.pdu_ids, "pdu", &owner, p);
    }
    let served_by = served_by(r, &rid, &owner, known.cooling, c);
    let power_budget_kw = power_budget(r, &owner, known.pdus, c);
    let inlet_limit_c = opt_range(
        c,
        &r.inlet_limit_c,
        &format!("{owner}: inlet_limit_c"),
        15.0,
        45.0,
        DEFAULT_INLET_LIMIT_C,
    );
    let nodes = match &r.nodes {
        Some(count) => generate_nodes(r, count, &rid, &owner, known, placed, c),
        None => Vec::new(),
    };
    Rack {
        id: rid,
        row: r.row.get_ref().clone(),
        pdus: r.pdus.iter().map(|p| p.get_ref().clone()).collect(),
        cooling: served_by.first().map(|u| u.id.clone()).unwrap_or_default(),
        power_budget_kw,
        inlet_limit_c,
        labels: r.labels.clone(),
        nodes,
    }
}

/// The cooling units that serve the rack: exactly one is expected.
fn served_by<'a>(
    r: &RawRack,
    rid: &str,
    owner: &str,
    cooling: &'a [CoolingUnit],
    c: &mut Collector,
) -> Vec<&'a CoolingUnit> {
    let served_by: Vec<&CoolingUnit> = cooling
        .iter()
        .filter(|u| u.racks.iter().any(|x| x == rid))
        .collect();
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
    served_by
}

/// The rack's power budget: as given, or what its PDUs can deliver.
fn power_budget(r: &RawRack, owner: &str, pdus: &[Pdu], c: &mut Collector) -> f64 {
    let pdu_kw: f64 = r
        .pdus
        .iter()
        .filter_map(|p| pdus.iter().find(|x| &x.id == p.get_ref()))
        .map(Pdu::usable_kw)
        .sum();
    match &r.power_budget_kw {
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
    }
}

/// The `nodes = N` of a rack: nodes `RACK-n01`.., returned as indices into the nodes.
fn generate_nodes(
    r: &RawRack,
    count: &S<i64>,
    rid: &str,
    owner: &str,
    known: &Known,
    placed: &mut Placed,
    c: &mut Collector,
) -> Vec<usize> {
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
            check_model(c, known.gpu_models, owner, m);
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
    let mut idx = Vec::new();
    for i in 1..=n.clamp(0, 1000) {
        let id = format!("{rid}-n{i:02}");
        if !placed.node_ids.insert(id.clone()) {
            c.at(
                span(count),
                format!("{owner}: generated node {id:?} is defined twice"),
            );
        }
        idx.push(placed.nodes.len());
        placed.nodes.push(Node {
            id,
            rack: rid.to_string(),
            gpus: gpus.clamp(0, 16) as u32,
            gpu_model: model.clone(),
            base_w,
            outlets: Vec::new(),
        });
    }
    idx
}

/// The `[[nodes]]` listed one by one, each added to its rack.
pub(super) fn build_nodes(raw: &[RawNode], known: &Known, placed: &mut Placed, c: &mut Collector) {
    // the first rack of each id (an id given twice is reported above)
    let mut rack_at: crate::fasthash::FnvMap<String, usize> = Default::default();
    for (i, r) in placed.racks.iter().enumerate() {
        rack_at.entry(r.id.clone()).or_insert(i);
    }
    for n in raw {
        check_id(c, &mut placed.node_ids, "node", &n.id);
        let owner = format!("node {:?}", n.id.get_ref());
        check_ref(c, known.rack_ids, "rack", &owner, &n.rack);
        check_model(c, known.gpu_models, &owner, &n.gpu_model);
        if !(0..=16).contains(n.gpus.get_ref()) {
            c.at(
                span(&n.gpus),
                format!(
                    "{owner}: gpus must be within 0..=16, got {}",
                    n.gpus.get_ref()
                ),
            );
        }
        check_outlets(n, &owner, known.pdus, c);
        let i = placed.nodes.len();
        placed.nodes.push(Node {
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
        if let Some(&r) = rack_at.get(n.rack.get_ref().as_str()) {
            placed.racks[r].nodes.push(i);
        }
    }
}

/// Each outlet a node names (`pdu.outlet`) is one of the PDUs'.
fn check_outlets(n: &RawNode, owner: &str, pdus: &[Pdu], c: &mut Collector) {
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
}
