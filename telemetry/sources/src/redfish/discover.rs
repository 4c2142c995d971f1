//! The async walk of one endpoint: discovery from the service root, and the re-reads of
//! what discovery found. Independent GETs (the members of a collection, the branches of
//! a chassis) run in parallel, up to the endpoint's `per_endpoint` limit; a GET that
//! needs a link from another waits for it. Results come back in walk order, so the
//! readings do not depend on which GET answered first.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use futures_util::future::{join_all, try_join_all};
use serde_json::Value;

use super::endpoint::Endpoint;
use super::walk::{last_segment, Item, Kind, Read};
use super::RedfishError;
use telemetry::mapping::Reject;
use telemetry::{EntityId, EntityKind};

fn link(v: &Value, key: &str) -> Option<String> {
    v.get(key)?.get("@odata.id")?.as_str().map(str::to_string)
}

fn members(v: &Value) -> Vec<String> {
    v.get("Members")
        .and_then(Value::as_array)
        .map(|m| {
            m.iter()
                .filter_map(|x| x.get("@odata.id")?.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// The most members read from one collection; a BMC that lists more (broken or
/// hostile) gets the first ones read and an `oversize` reject.
pub const MAX_MEMBERS: usize = 1024;

/// The most resources one discovery reads for the site's bindings.
pub const MAX_BOUND_RESOURCES: usize = 2048;

fn item(kind: Kind, entity: &EntityId, path: String, value: Value) -> Item {
    Item::new(kind, entity, path, &value)
}

/// What a collection GET with `$expand` gave.
enum Expanded {
    Members(Vec<(String, Value)>),
    Links(Vec<String>),
    Refused,
}

/// One walk's fetching: the GETs it sent, the resources that failed.
pub(super) struct Fetch<'a> {
    ep: &'a Endpoint,
    /// A rediscovery beside the re-reads: its GETs take a background permit first.
    background: bool,
    requests: AtomicUsize,
    rejects: Mutex<Vec<Reject>>,
    /// The first failure that means the endpoint cannot be talked to; once set, the
    /// rest of the walk is not sent.
    fatal: Mutex<Option<RedfishError>>,
    /// The last failure of a single resource.
    last: Mutex<Option<RedfishError>>,
}

impl<'a> Fetch<'a> {
    pub(super) fn new(ep: &'a Endpoint, background: bool) -> Self {
        Fetch {
            ep,
            background,
            requests: AtomicUsize::new(0),
            rejects: Mutex::new(Vec::new()),
            fatal: Mutex::new(None),
            last: Mutex::new(None),
        }
    }

    /// GETs sent and rejects, once the walk is over.
    pub(super) fn into_parts(self) -> (usize, Vec<Reject>) {
        (
            self.requests.into_inner(),
            self.rejects.into_inner().unwrap_or_else(|p| p.into_inner()),
        )
    }

    async fn get(&self, path: &str) -> Result<Value, RedfishError> {
        self.requests.fetch_add(1, Ordering::Relaxed);
        if self.background {
            let _permit = self.ep.background.acquire().await;
            return self.ep.get(path).await;
        }
        self.ep.get(path).await
    }

    fn reject(&self, e: RedfishError) {
        self.rejects
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Reject {
                reason: e.reason(),
                detail: e.to_string(),
            });
        *self.last.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
    }

    fn take_fatal(&self) -> Option<RedfishError> {
        self.fatal.lock().unwrap_or_else(|p| p.into_inner()).take()
    }

    /// GET that records a failure and carries on; nothing is sent once the endpoint
    /// has proved unreachable in this walk.
    async fn try_get(&self, path: &str) -> Option<Value> {
        if self
            .fatal
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some()
        {
            return None;
        }
        match self.get(path).await {
            Ok(v) => Some(v),
            Err(e) if e.is_fatal() => {
                self.fatal
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .get_or_insert(e);
                None
            }
            Err(e) => {
                self.reject(e);
                None
            }
        }
    }

    /// The member links of `parent`'s collection `key`, at most [`MAX_MEMBERS`].
    async fn member_links(&self, parent: &Value, key: &str) -> Vec<String> {
        let Some(path) = link(parent, key) else {
            return Vec::new();
        };
        let Some(coll) = self.try_get(&path).await else {
            return Vec::new();
        };
        self.capped_members(&path, &coll)
    }

    /// A collection's member links, at most [`MAX_MEMBERS`] (more is `oversize`).
    fn capped_members(&self, path: &str, coll: &Value) -> Vec<String> {
        let mut m = members(coll);
        if m.len() > MAX_MEMBERS {
            let e = self.ep.fail(
                path,
                "oversize",
                None,
                format!("{} members listed; the first {MAX_MEMBERS} read", m.len()),
            );
            self.ep.counters.failure(e.failure());
            self.reject(e);
            m.truncate(MAX_MEMBERS);
        }
        m
    }

    /// The members of `parent`'s collection `key`, in order: in one GET with `$expand`
    /// where the service offers it, else fetched in parallel.
    async fn collection(&self, parent: &Value, key: &str) -> Vec<(String, Value)> {
        let Some(path) = link(parent, key) else {
            return Vec::new();
        };
        let outcome = match self.ep.expand_query() {
            None => Expanded::Refused,
            Some(_) => {
                // until one collection came back expanded, one probe at a time
                let _probe = match self.ep.expand_confirmed() {
                    true => None,
                    false => Some(self.ep.expand_probe.lock().await),
                };
                match self.ep.expand_query() {
                    Some(q) => self.expanded(&path, q).await,
                    None => Expanded::Refused, // refused while this one waited
                }
            }
        };
        let links = match outcome {
            Expanded::Members(m) => {
                self.ep.expand_works();
                return m;
            }
            Expanded::Links(l) => l,
            Expanded::Refused => self.member_links(parent, key).await,
        };
        join_all(
            links
                .into_iter()
                .map(|m| async move { self.try_get(&m).await.map(|v| (m, v)) }),
        )
        .await
        .into_iter()
        .flatten()
        .collect()
    }

    /// One GET of a collection with `$expand`: its members inline, or (a service that
    /// ignores the query) only their links, or refused (then never asked again).
    async fn expanded(&self, path: &str, query: &str) -> Expanded {
        if self
            .fatal
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some()
        {
            return Expanded::Refused;
        }
        self.requests.fetch_add(1, Ordering::Relaxed);
        let got = if self.background {
            let _permit = self.ep.background.acquire().await;
            self.ep.get_uncounted(&format!("{path}{query}")).await
        } else {
            self.ep.get_uncounted(&format!("{path}{query}")).await
        };
        let coll = match got {
            Ok(c) => c,
            Err(e) if e.is_fatal() => {
                self.ep.counters.failure(e.failure());
                self.fatal
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .get_or_insert(e);
                return Expanded::Refused;
            }
            // a refused query is no failure of the service: read member by member
            Err(_) => {
                self.ep.expand_refused();
                return Expanded::Refused;
            }
        };
        let links = self.capped_members(path, &coll);
        let inline: Vec<(String, Value)> = coll
            .get("Members")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .take(MAX_MEMBERS)
            .filter_map(|m| {
                let id = m.get("@odata.id")?.as_str()?;
                // an expanded member is the resource itself, not just its link
                let full = m.as_object().is_some_and(|o| o.len() > 1);
                full.then(|| (id.to_string(), m.clone()))
            })
            .collect();
        if !links.is_empty() && inline.len() == links.len() {
            Expanded::Members(inline)
        } else {
            if !links.is_empty() {
                self.ep.expand_refused();
            }
            Expanded::Links(links)
        }
    }

    /// The members of `parent`'s collection `key`, each read into an item, in order.
    async fn read_members<F>(&self, parent: &Value, key: &str, to_item: F) -> Vec<Item>
    where
        F: Fn(String, Value) -> Item,
    {
        self.collection(parent, key)
            .await
            .into_iter()
            .map(|(m, v)| to_item(m, v))
            .collect()
    }

    /// The resource `parent` links as `key`, as an item (none when missing or failed).
    async fn linked(&self, kind: Kind, entity: &EntityId, parent: &Value, key: &str) -> Vec<Item> {
        let Some(p) = link(parent, key) else {
            return Vec::new();
        };
        match self.try_get(&p).await {
            Some(v) => vec![item(kind, entity, p, v)],
            None => Vec::new(),
        }
    }

    /// Discovery: the whole tree from the service root. An endpoint that stops
    /// answering mid-walk fails the walk (a partial tree is not kept as the plan).
    pub(super) async fn discover(&self) -> Result<Vec<Item>, RedfishError> {
        let root = self.get("/redfish/v1").await?;
        self.ep.learn_expand(&root);
        let tree = async {
            if !self.ep.cfg.walks_tree() {
                return Vec::new();
            }
            let (chassis, power, thermal) = futures_util::join!(
                self.chassis(&root),
                self.power_equipment(&root),
                self.thermal_equipment(&root)
            );
            [chassis, power, thermal].concat()
        };
        let (tree, bound) = futures_util::join!(tree, self.bound());
        if let Some(e) = self.take_fatal() {
            return Err(e);
        }
        Ok(tree.into_iter().chain(bound).collect())
    }

    /// The resources the site's bindings name: an exact path is read as it is; a
    /// pattern with wildcards is crawled from its literal start, following only the
    /// links that may lead to a resource it names (at most [`MAX_BOUND_RESOURCES`]).
    async fn bound(&self) -> Vec<Item> {
        let binds = &self.ep.cfg.bind;
        let mut seen = std::collections::BTreeSet::new();
        let mut next: Vec<String> = binds.iter().map(|b| b.resource.start()).collect();
        let mut out = Vec::new();
        let mut budget = MAX_BOUND_RESOURCES;
        while !next.is_empty() && budget > 0 {
            let level: Vec<String> = std::mem::take(&mut next)
                .into_iter()
                .filter(|p| seen.insert(p.clone()))
                .take(budget)
                .collect();
            budget -= level.len();
            let got = join_all(
                level
                    .iter()
                    .map(|p| async move { self.try_get(p).await.map(|v| (p, v)) }),
            )
            .await;
            for (p, v) in got.into_iter().flatten() {
                next.extend(super::survey::follow(&v).into_iter().filter(|l| {
                    binds.iter().any(|b| {
                        let start = b.resource.start();
                        let below = l
                            .strip_prefix(start.as_str())
                            .is_some_and(|r| r.starts_with('/'));
                        !b.resource.is_exact() && below && b.resource.may_lead_to(l)
                    })
                }));
                if binds.iter().any(|b| b.resource.matches(p)) {
                    out.push(Item::bound(p.clone(), &v, binds));
                }
            }
        }
        out
    }

    /// The polls after discovery: only the resources that gave readings, all in
    /// parallel. A resource that is gone (404) fails the re-read (discover again); so
    /// does an endpoint that cannot be reached, or one whose every resource failed.
    pub(super) async fn replay(&self, plan: &[Read]) -> Result<Vec<Item>, RedfishError> {
        let got = try_join_all(plan.iter().map(|r| async move {
            match self.get(&r.path).await {
                Ok(v) if r.kind == Kind::Bound => {
                    Ok(Some(Item::bound(r.path.clone(), &v, &self.ep.cfg.bind)))
                }
                Ok(v) => Ok(Some(Item::reread(r.kind, &r.entity, r.path.clone(), &v))),
                Err(e) if e.is_fatal() || e.is_gone() => Err(e),
                Err(e) => {
                    self.reject(e);
                    Ok(None)
                }
            }
        }))
        .await?;
        let items: Vec<Item> = got.into_iter().flatten().collect();
        if items.is_empty() {
            if let Some(e) = self.last.lock().unwrap_or_else(|p| p.into_inner()).take() {
                return Err(e);
            }
        }
        Ok(items)
    }

    async fn chassis(&self, root: &Value) -> Vec<Item> {
        let all = self.collection(root, "Chassis").await;
        join_all(all.iter().map(|(path, c)| self.one_chassis(path, c)))
            .await
            .into_iter()
            .flatten()
            .collect()
    }

    async fn one_chassis(&self, path: &str, c: &Value) -> Vec<Item> {
        let id = last_segment(path);
        let entity = self
            .ep
            .entity(&format!("Chassis/{id}"), EntityKind::Node, id);
        let e = &entity;
        let thermal_metrics = async {
            match link(c, "ThermalSubsystem") {
                Some(p) => match self.try_get(&p).await {
                    Some(ts) => {
                        self.linked(Kind::ThermalMetrics, e, &ts, "ThermalMetrics")
                            .await
                    }
                    None => Vec::new(),
                },
                None => Vec::new(),
            }
        };
        let supplies = async {
            let Some(ps) = link(c, "PowerSubsystem") else {
                return Vec::new();
            };
            let Some(ps) = self.try_get(&ps).await else {
                return Vec::new();
            };
            let all = self.collection(&ps, "PowerSupplies").await;
            join_all(all.iter().map(|(pp, psu)| async move {
                let psu_entity = EntityId::new(
                    EntityKind::Node,
                    format!("{}.psu.{}", e.name, last_segment(pp)),
                );
                self.linked(Kind::PowerSupply, &psu_entity, psu, "Metrics")
                    .await
            }))
            .await
            .into_iter()
            .flatten()
            .collect::<Vec<_>>()
        };
        let sensors = self.read_members(c, "Sensors", |sp, s| item(Kind::Sensor, e, sp, s));
        // legacy first: where both exist, the current model's reading is the one kept
        let (power, thermal, tm, psus, env, sensors) = futures_util::join!(
            self.linked(Kind::LegacyPower, e, c, "Power"),
            self.linked(Kind::LegacyThermal, e, c, "Thermal"),
            thermal_metrics,
            supplies,
            self.linked(Kind::Environment, e, c, "EnvironmentMetrics"),
            sensors
        );
        [power, thermal, tm, psus, env, sensors].concat()
    }

    async fn power_equipment(&self, root: &Value) -> Vec<Item> {
        let Some(pe) = link(root, "PowerEquipment") else {
            return Vec::new();
        };
        let Some(pe) = self.try_get(&pe).await else {
            return Vec::new();
        };
        let pdus = self.collection(&pe, "RackPDUs").await;
        join_all(pdus.iter().map(|(path, pdu)| self.one_pdu(path, pdu)))
            .await
            .into_iter()
            .flatten()
            .collect()
    }

    async fn one_pdu(&self, path: &str, pdu: &Value) -> Vec<Item> {
        let id = last_segment(path);
        let entity = self
            .ep
            .entity(&format!("RackPDUs/{id}"), EntityKind::Pdu, id);
        // mains belong to the PDU itself; branches and outlets are entities of their own
        let circuits = |key: &'static str, own: Option<EntityKind>| {
            let entity = &entity;
            self.read_members(pdu, key, move |p, v| match own {
                None => item(Kind::Mains, entity, p, v),
                Some(k) => {
                    let e = EntityId::new(k, format!("{}.{}", entity.name, last_segment(&p)));
                    item(Kind::Circuit, &e, p, v)
                }
            })
        };
        let (mains, branches, outlets) = futures_util::join!(
            circuits("Mains", None),
            circuits("Branches", Some(EntityKind::Branch)),
            circuits("Outlets", Some(EntityKind::Outlet))
        );
        [mains, branches, outlets].concat()
    }

    async fn thermal_equipment(&self, root: &Value) -> Vec<Item> {
        let Some(te) = link(root, "ThermalEquipment") else {
            return Vec::new();
        };
        let Some(te) = self.try_get(&te).await else {
            return Vec::new();
        };
        let cdus = self.collection(&te, "CDUs").await;
        join_all(cdus.iter().map(|(path, cdu)| self.one_cdu(path, cdu)))
            .await
            .into_iter()
            .flatten()
            .collect()
    }

    async fn one_cdu(&self, path: &str, cdu: &Value) -> Vec<Item> {
        let id = last_segment(path);
        let entity = self
            .ep
            .entity(&format!("CDUs/{id}"), EntityKind::Cooling, id);
        let e = &entity;
        let connectors = |key: &'static str, loop_name: &'static str| async move {
            let conns = self.collection(cdu, key).await;
            let single = conns.len() == 1;
            conns
                .into_iter()
                .map(|(cp, c)| {
                    let name = if single {
                        format!("{}.{loop_name}", e.name)
                    } else {
                        format!("{}.{loop_name}{}", e.name, last_segment(&cp))
                    };
                    item(
                        Kind::Coolant,
                        &EntityId::new(EntityKind::Cooling, name),
                        cp,
                        c,
                    )
                })
                .collect::<Vec<_>>()
        };
        let pumps = async {
            self.collection(cdu, "Pumps")
                .await
                .into_iter()
                .map(|(pp, p)| {
                    let pe = EntityId::new(
                        EntityKind::Cooling,
                        format!("{}.pump{}", e.name, last_segment(&pp)),
                    );
                    item(Kind::Pump, &pe, pp, p)
                })
                .collect::<Vec<_>>()
        };
        let (env, primary, secondary, pumps, leaks) = futures_util::join!(
            self.linked(Kind::Environment, e, cdu, "EnvironmentMetrics"),
            connectors("PrimaryCoolantConnectors", "primary"),
            connectors("SecondaryCoolantConnectors", "secondary"),
            pumps,
            self.leak_detection(e, cdu)
        );
        [env, primary, secondary, pumps, leaks].concat()
    }

    /// Detectors as linked resources, or inline in their groups.
    async fn leak_detection(&self, e: &EntityId, cdu: &Value) -> Vec<Item> {
        let Some(lp) = link(cdu, "LeakDetection") else {
            return Vec::new();
        };
        let Some(ld) = self.try_get(&lp).await else {
            return Vec::new();
        };
        let mut out: Vec<Item> = self
            .collection(&ld, "LeakDetectors")
            .await
            .into_iter()
            .map(|(dp, d)| {
                let de = EntityId::new(
                    EntityKind::Cooling,
                    format!("{}.leak.{}", e.name, last_segment(&dp)),
                );
                item(Kind::LeakDetector, &de, dp, d)
            })
            .collect();
        out.push(item(Kind::LeakGroups, e, lp, ld));
        out
    }
}
