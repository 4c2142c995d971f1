//! Validation of the site file: every problem collected in one pass, with its position.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;

use super::raw::*;
use super::*;
use crate::diag::Collector;

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

    // the first rack of each id (an id given twice is reported above)
    let mut rack_at: crate::fasthash::FnvMap<String, usize> = Default::default();
    for (i, r) in racks.iter().enumerate() {
        rack_at.entry(r.id.clone()).or_insert(i);
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
        if let Some(&r) = rack_at.get(n.rack.get_ref().as_str()) {
            racks[r].nodes.push(i);
        }
    }

    let tariff = raw.tariff.as_ref().map(|t| build_tariff(t, c));
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

fn build_tariff(t: &super::raw::RawTariff, c: &mut Collector) -> crate::tariff::Tariff {
    use crate::tariff::{parse_clock, parse_day, Tariff, TouPeriod};
    // prices may be negative (day-ahead markets), never absurd
    let price = |c: &mut Collector, v: &S<f64>, what: &str| {
        let p = *v.get_ref();
        if !(p.is_finite() && (-10.0..=100.0).contains(&p)) {
            c.at(
                span(v),
                format!("{what} must be within -10..=100 per kWh, got {p}"),
            );
        }
        p
    };
    let default_per_kwh = price(c, &t.default_per_kwh, "tariff: default_per_kwh");
    let mut periods = Vec::new();
    for p in &t.periods {
        let owner = format!("tariff period {:?}", p.name.get_ref());
        let mut days = [true; 7];
        if let Some(list) = &p.days {
            days = [false; 7];
            for d in list {
                match parse_day(d.get_ref()) {
                    Some(i) => days[i] = true,
                    None => c.at(
                        span(d),
                        format!(
                            "{owner}: unknown day {:?} (mon, tue, wed, thu, fri, sat, sun)",
                            d.get_ref()
                        ),
                    ),
                }
            }
        }
        let clock = |c: &mut Collector, v: &S<String>, end: bool| match parse_clock(v.get_ref()) {
            Some(m) if end || m < 1440 => m,
            _ => {
                c.at(
                    span(v),
                    format!(
                        "{owner}: {:?} is not a time of day (HH:MM, 00:00..{})",
                        v.get_ref(),
                        if end { "24:00" } else { "23:59" }
                    ),
                );
                0
            }
        };
        let from_min = clock(c, &p.from, false);
        let to_min = clock(c, &p.to, true);
        if from_min == to_min {
            c.at(
                span(&p.to),
                format!("{owner}: from and to are the same: the period would be empty"),
            );
        }
        periods.push(TouPeriod {
            name: p.name.get_ref().clone(),
            days,
            from_min,
            to_min: to_min.min(1440),
            per_kwh: price(c, &p.per_kwh, &format!("{owner}: per_kwh")),
        });
    }
    let demand_charge_per_kw = t.demand_charge_per_kw.as_ref().map(|d| {
        let v = *d.get_ref();
        if !(v.is_finite() && (0.0..=10_000.0).contains(&v)) {
            c.at(
                span(d),
                format!("tariff: demand_charge_per_kw must be within 0..=10000, got {v}"),
            );
        }
        v
    });
    let demand_interval_s = t.demand_interval_min.as_ref().map(|d| {
        let v = *d.get_ref();
        if !(v.is_finite() && (1.0..=1440.0).contains(&v) && 1440.0 % v == 0.0) {
            c.at(
                span(d),
                format!(
                    "tariff: demand_interval_min must divide a day into whole intervals (1..=1440 minutes, e.g. 15 or 30), got {v}"
                ),
            );
        }
        v * 60.0
    });
    Tariff {
        default_per_kwh,
        periods,
        demand_charge_per_kw,
        demand_interval_s,
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
            rack_skew_c_per_kw: opt_range(
                c,
                &u.rack_skew_c_per_kw,
                &format!("{owner}: rack_skew_c_per_kw"),
                0.0,
                5.0,
                0.15,
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
