//! [`Session`]: what each edge node told so far (its birth, sequence, aliases and the
//! entities it fed), and what one message means ([`Handled`]). What it holds is bounded
//! by its [`Limits`]: a birth beyond them is refused (`too_many_metrics`), a death frees
//! what the node (or device) held, and a node silent for `idle_ms` is forgotten.

use std::collections::{BTreeMap, BTreeSet};

use prost::Message;

use super::bounds::{alias_bytes, entity_bytes, node_bytes, Held, Limits};
use super::{bd_seq, Payload, Topic, ValueKind};
use crate::EntityId;

/// What one edge node (and its devices) told us so far.
#[derive(Debug, Clone, Default)]
pub(super) struct Node {
    born: bool,
    last_seq: Option<u64>,
    /// The `bdSeq` of its current birth: a DEATH with another one is of an earlier
    /// session (the broker's will delivered late) and is ignored.
    bd_seq: Option<u64>,
    /// (device or "", alias) → (metric name, datatype)
    aliases: BTreeMap<(String, u64), (String, Option<u32>)>,
    /// device or "" → entities its metrics went to
    entities: BTreeMap<String, BTreeSet<EntityId>>,
    /// The receipt time of its last message, in milliseconds.
    last_seen_ms: i64,
    /// What it takes, as [`Held::bytes`] counts it.
    bytes: usize,
}

/// One metric value, resolved to its name.
#[derive(Debug, Clone, PartialEq)]
pub struct Value {
    pub name: String,
    /// The number (a boolean as 0 or 1; NaN for text).
    pub value: f64,
    pub kind: ValueKind,
    /// Milliseconds since the epoch, from the metric or the payload.
    pub timestamp_ms: Option<u64>,
}

/// What a Sparkplug message means: values, problems (a message may have both: values
/// after a sequence gap still count), or a death.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Handled {
    pub values: Vec<Value>,
    pub problems: Vec<(&'static str, String)>,
    /// `Some(None)`: the node died; `Some(Some(device))`: a device died.
    pub death: Option<Option<String>>,
    /// With a death: the entities the node (or the device) fed, which it forgot.
    pub dead: BTreeSet<EntityId>,
    /// The node's state is lost (data before its birth, a sequence gap, an alias its
    /// birth did not name): a host should ask it for a rebirth.
    pub rebirth: bool,
}

impl Handled {
    fn problem(reason: &'static str, detail: String) -> Self {
        Handled {
            problems: vec![(reason, detail)],
            ..Handled::default()
        }
    }

    fn needs_rebirth(mut self) -> Self {
        self.rebirth = true;
        self
    }
}

/// Edge nodes a session follows at most: beyond it a new node's messages are
/// rejected (`too_many_nodes`), so a publisher of made-up node names cannot grow it.
pub const MAX_NODES: usize = 10_000;
/// Fed entities kept per edge node at most.
pub const MAX_ENTITIES: usize = 4_096;

/// The state of every edge node seen, by (group, node).
#[derive(Debug, Clone, Default)]
pub struct Session {
    pub(super) nodes: BTreeMap<(String, String), Node>,
    limits: Limits,
    /// Aliases and bytes over every node: the sums of theirs.
    metrics: usize,
    bytes: usize,
    /// When silent nodes are looked for next (receipt time, milliseconds).
    next_sweep_ms: i64,
    /// Nodes forgotten for their silence, since the start.
    expired: u64,
}

impl Session {
    pub fn new() -> Self {
        Session::default()
    }

    pub fn with_limits(limits: Limits) -> Self {
        Session {
            limits,
            ..Session::default()
        }
    }

    /// What the session holds now.
    pub fn held(&self) -> Held {
        Held {
            nodes: self.nodes.len(),
            metrics: self.metrics,
            bytes: self.bytes,
        }
    }

    /// What the session holds, counted again from its nodes (for tests of the sums);
    /// each node's own sum is checked on the way.
    #[cfg(test)]
    pub(super) fn recount(&self) -> Held {
        let mut held = Held {
            nodes: self.nodes.len(),
            ..Held::default()
        };
        for ((group, name), n) in &self.nodes {
            let aliases: usize = n
                .aliases
                .iter()
                .map(|((d, _), (m, _))| alias_bytes(d, m))
                .sum();
            let entities: usize = n
                .entities
                .iter()
                .flat_map(|(d, es)| es.iter().map(move |e| entity_bytes(d, e)))
                .sum();
            let bytes = node_bytes(group, name) + aliases + entities;
            assert_eq!(n.bytes, bytes, "node {group}/{name}");
            held.metrics += n.aliases.len();
            held.bytes += bytes;
        }
        held
    }

    /// Nodes forgotten because they fell silent for the limits' `idle_ms`.
    pub fn expired(&self) -> u64 {
        self.expired
    }

    /// Records that `entity` was fed by this node/device (so a DEATH can mark it),
    /// within [`MAX_ENTITIES`] per node and the limits' bytes.
    pub fn remember(&mut self, t: &Topic<'_>, entity: &EntityId) {
        let Some(node) = self
            .nodes
            .get_mut(&(t.group.to_string(), t.node.to_string()))
        else {
            return;
        };
        if node.entities.values().map(BTreeSet::len).sum::<usize>() >= MAX_ENTITIES {
            return;
        }
        let device = t.device.unwrap_or("");
        let cost = entity_bytes(device, entity);
        if node
            .entities
            .get(device)
            .is_some_and(|e| e.contains(entity))
            || self.bytes + cost > self.limits.max_bytes
        {
            return;
        }
        node.entities
            .entry(device.to_string())
            .or_default()
            .insert(entity.clone());
        node.bytes += cost;
        self.bytes += cost;
    }

    /// Entities fed by the node (every device, `device` None) or by one device.
    pub fn entities_of(&self, t: &Topic<'_>, device: Option<&str>) -> BTreeSet<EntityId> {
        let Some(node) = self.nodes.get(&(t.group.to_string(), t.node.to_string())) else {
            return BTreeSet::new();
        };
        match device {
            Some(d) => node.entities.get(d).cloned().unwrap_or_default(),
            None => node.entities.values().flatten().cloned().collect(),
        }
    }

    /// Follows one message, received at `now_ms` (milliseconds since the epoch; only
    /// compared with earlier receipt times, to forget silent nodes).
    pub fn handle(&mut self, t: &Topic<'_>, payload: &[u8], now_ms: i64) -> Handled {
        self.expire(now_ms);
        let key = (t.group.to_string(), t.node.to_string());
        match t.kind {
            "NDEATH" => return self.node_death(&key, t, payload),
            "DDEATH" => return self.device_death(&key, t),
            "NBIRTH" | "DBIRTH" | "NDATA" | "DDATA" => {}
            _ => return Handled::default(),
        }
        let p = match Payload::decode(payload) {
            Ok(p) => p,
            Err(e) => {
                return Handled::problem("bad_protobuf", format!("{} from {}: {e}", t.kind, t.node))
            }
        };
        if let Err(refused) = self.admit(&key, t) {
            return refused;
        }
        if !self.nodes.contains_key(&key) {
            let bytes = node_bytes(&key.0, &key.1);
            self.bytes += bytes;
            self.nodes.insert(
                key.clone(),
                Node {
                    bytes,
                    ..Node::default()
                },
            );
        }
        let Some(node) = self.nodes.get_mut(&key) else {
            return Handled::default();
        };
        node.last_seen_ms = now_ms;
        let mut out = Handled::default();
        if let Err(refused) = node.follow_sequence(t, &p, &mut out) {
            return refused;
        }
        if t.kind.ends_with("BIRTH") {
            if let Err(refused) = self.birth(&key, t, &p) {
                out.problems.push(refused);
                return out;
            }
        }
        if let Some(node) = self.nodes.get_mut(&key) {
            node.read_metrics(t, &p, &mut out);
        }
        out
    }

    /// A birth names the aliases of the node (NBIRTH: they replace all of its aliases)
    /// or of one device (DBIRTH: they replace that device's), within the limits; a
    /// birth beyond them is refused, and what it replaced is forgotten all the same
    /// (an NBIRTH's node with it: its data is then data before a birth).
    fn birth(
        &mut self,
        key: &(String, String),
        t: &Topic<'_>,
        p: &Payload,
    ) -> Result<(), (&'static str, String)> {
        let node_birth = t.kind == "NBIRTH";
        let device = if node_birth {
            ""
        } else {
            t.device.unwrap_or("")
        };
        // borrowed: a refused birth copies none of its names
        let mut named = BTreeMap::new();
        for m in &p.metrics {
            if let (Some(name), Some(alias)) = (&m.name, m.alias) {
                named.insert(alias, (name.as_str(), m.datatype));
            }
        }
        let cost: usize = named.values().map(|(n, _)| alias_bytes(device, n)).sum();
        let limits = self.limits;
        let Some(node) = self.nodes.get_mut(key) else {
            return Ok(());
        };
        let (metrics, bytes) = node.forget_aliases((!node_birth).then_some(device));
        self.metrics -= metrics;
        self.bytes -= bytes;
        let what = || match t.device {
            Some(d) if !node_birth => format!("{} from {}/{d}", t.kind, t.node),
            _ => format!("{} from {}", t.kind, t.node),
        };
        let over = if node.aliases.len() + named.len() > limits.max_metrics_per_node {
            Some(format!(
                "{}: {} aliased metrics would make the node hold {}, over sparkplug_max_metrics_per_node ({})",
                what(),
                named.len(),
                node.aliases.len() + named.len(),
                limits.max_metrics_per_node
            ))
        } else if self.metrics + named.len() > limits.max_metrics {
            Some(format!(
                "{}: {} aliased metrics would make all edge nodes hold {}, over sparkplug_max_metrics ({})",
                what(),
                named.len(),
                self.metrics + named.len(),
                limits.max_metrics
            ))
        } else if self.bytes + cost > limits.max_bytes {
            Some(format!(
                "{}: {} aliased metrics of {cost} bytes would make all edge nodes hold {} bytes, over sparkplug_max_mib ({} bytes)",
                what(),
                named.len(),
                self.bytes + cost,
                limits.max_bytes
            ))
        } else {
            None
        };
        if let Some(detail) = over {
            if node_birth {
                self.remove(key);
            }
            return Err(("too_many_metrics", detail));
        }
        node.bytes += cost;
        self.metrics += named.len();
        self.bytes += cost;
        for (alias, (name, datatype)) in named {
            node.aliases
                .insert((device.to_string(), alias), (name.to_string(), datatype));
        }
        Ok(())
    }

    /// Forgets a node and everything it held; the entities it fed.
    fn remove(&mut self, key: &(String, String)) -> BTreeSet<EntityId> {
        let Some(node) = self.nodes.remove(key) else {
            return BTreeSet::new();
        };
        self.metrics -= node.aliases.len();
        self.bytes -= node.bytes;
        node.entities.into_values().flatten().collect()
    }

    /// Forgets the nodes silent for the limits' `idle_ms`, looking at most every tenth
    /// of it (1 s to 60 s).
    fn expire(&mut self, now_ms: i64) {
        let idle = self.limits.idle_ms;
        if idle <= 0 {
            return;
        }
        let every = (idle / 10).clamp(1_000, 60_000);
        // (a receipt clock set back by more than `every` looks again at once)
        if now_ms < self.next_sweep_ms && self.next_sweep_ms - now_ms <= every {
            return;
        }
        self.next_sweep_ms = now_ms.saturating_add(every);
        let silent: Vec<_> = self
            .nodes
            .iter()
            .filter(|(_, n)| now_ms.saturating_sub(n.last_seen_ms) >= idle)
            .map(|(k, _)| k.clone())
            .collect();
        for key in silent {
            self.remove(&key);
            self.expired += 1;
        }
    }

    /// A DDEATH: the device's aliases and the entities it fed are forgotten (the
    /// entities returned, to be marked bad).
    fn device_death(&mut self, key: &(String, String), t: &Topic<'_>) -> Handled {
        let mut out = Handled {
            death: Some(t.device.map(str::to_string)),
            ..Handled::default()
        };
        let Some(node) = self.nodes.get_mut(key) else {
            return out;
        };
        match t.device {
            Some(d) => {
                let (metrics, bytes) = node.forget_aliases(Some(d));
                let (dead, entity_bytes) = node.forget_entities(d);
                self.metrics -= metrics;
                self.bytes -= bytes + entity_bytes;
                out.dead = dead;
            }
            None => out.dead = node.entities.values().flatten().cloned().collect(),
        }
        out
    }

    /// An NDEATH: the node's birth is over, unless the death is of an earlier session;
    /// the node is forgotten, and the entities it fed returned, to be marked bad.
    fn node_death(&mut self, key: &(String, String), t: &Topic<'_>, payload: &[u8]) -> Handled {
        let died = Payload::decode(payload).ok().as_ref().and_then(bd_seq);
        if let Some(n) = self.nodes.get(key) {
            if let (Some(born), Some(died)) = (n.bd_seq, died) {
                if n.born && born != died {
                    return Handled::problem(
                        "stale_death",
                        format!(
                            "NDEATH from {} with bdSeq {died}, but its birth has bdSeq {born}: the death of an earlier session, ignored",
                            t.node
                        ),
                    );
                }
            }
        }
        Handled {
            death: Some(None),
            dead: self.remove(key),
            ..Handled::default()
        }
    }

    /// A node not followed yet may only start with its NBIRTH, and only while the
    /// session follows fewer than [`MAX_NODES`].
    fn admit(&self, key: &(String, String), t: &Topic<'_>) -> Result<(), Handled> {
        if self.nodes.contains_key(key) {
            return Ok(());
        }
        if t.kind != "NBIRTH" {
            return Err(no_birth(t));
        }
        if self.nodes.len() >= MAX_NODES {
            return Err(Handled::problem(
                "too_many_nodes",
                format!(
                    "NBIRTH from {}: {MAX_NODES} edge nodes are followed already",
                    t.node
                ),
            ));
        }
        Ok(())
    }
}

/// DATA (or a device's BIRTH) before the node's NBIRTH: its aliases are unknown.
fn no_birth(t: &Topic<'_>) -> Handled {
    Handled::problem(
        "no_birth",
        format!(
            "{} from {} before its NBIRTH: aliases unknown",
            t.kind, t.node
        ),
    )
    .needs_rebirth()
}

impl Node {
    /// Forgets the aliases of one device (`Some("")`: the node's own), or all of them;
    /// the aliases and bytes freed.
    fn forget_aliases(&mut self, device: Option<&str>) -> (usize, usize) {
        let before = self.aliases.len();
        let mut bytes = 0;
        self.aliases.retain(|(d, _), (name, _)| {
            let gone = device.is_none_or(|device| d == device);
            if gone {
                bytes += alias_bytes(d, name);
            }
            !gone
        });
        self.bytes -= bytes;
        (before - self.aliases.len(), bytes)
    }

    /// Forgets the entities one device fed; them, and the bytes freed.
    fn forget_entities(&mut self, device: &str) -> (BTreeSet<EntityId>, usize) {
        let gone = self.entities.remove(device).unwrap_or_default();
        let bytes = gone.iter().map(|e| entity_bytes(device, e)).sum();
        self.bytes -= bytes;
        (gone, bytes)
    }

    /// A birth starts the node's sequence at 0; anything else continues it (a gap is a
    /// problem, and calls for a rebirth).
    fn follow_sequence(
        &mut self,
        t: &Topic<'_>,
        p: &Payload,
        out: &mut Handled,
    ) -> Result<(), Handled> {
        if t.kind == "NBIRTH" {
            self.born = true;
            self.last_seq = None;
            self.bd_seq = bd_seq(p);
            if p.seq.is_some_and(|s| s != 0) {
                out.problems.push((
                    "bad_sequence",
                    format!("NBIRTH from {} with seq {:?}, expected 0", t.node, p.seq),
                ));
            }
        } else if !self.born {
            return Err(no_birth(t));
        }
        match p.seq {
            // a sequence number runs 0..=255: one beyond is refused and not followed
            // (adding one to it overflowed at u64::MAX); a birth's says so above
            Some(seq) if seq > 255 && t.kind != "NBIRTH" => {
                out.rebirth = true;
                out.problems.push((
                    "bad_sequence",
                    format!("{} from {}: seq {seq} is beyond 0..=255", t.kind, t.node),
                ));
            }
            Some(seq) if seq > 255 => {}
            Some(seq) => {
                if let Some(last) = self.last_seq {
                    if seq != (last + 1) % 256 {
                        out.rebirth = true;
                        out.problems.push((
                            "sequence_gap",
                            format!(
                                "{} from {}: seq {seq} after {last}, messages were lost",
                                t.kind, t.node
                            ),
                        ));
                    }
                }
                self.last_seq = Some(seq);
            }
            None => {}
        }
        Ok(())
    }

    /// The message's metrics as values, by name or by the alias a birth gave (see
    /// [`Session::birth`]).
    fn read_metrics(&mut self, t: &Topic<'_>, p: &Payload, out: &mut Handled) {
        let device = t.device.unwrap_or("").to_string();
        let mut unknown = Vec::new();
        for m in &p.metrics {
            let (name, dt) = match (&m.name, m.alias) {
                (Some(n), _) => (n.clone(), m.datatype),
                (None, Some(a)) => match self.aliases.get(&(device.clone(), a)) {
                    Some((n, dt)) => (n.clone(), m.datatype.or(*dt)),
                    None => {
                        unknown.push(a);
                        continue;
                    }
                },
                (None, None) => continue,
            };
            let kind = m.kind(dt);
            let value = match kind {
                ValueKind::Text if m.is_null != Some(true) && m.string_value.is_some() => f64::NAN,
                _ => match m.number(dt) {
                    Some(v) => v,
                    None => continue,
                },
            };
            out.values.push(Value {
                name,
                value,
                kind,
                timestamp_ms: m.timestamp.or(p.timestamp),
            });
        }
        if !unknown.is_empty() {
            out.rebirth = true;
            out.problems.push((
                "unknown_alias",
                format!(
                    "{} from {}: aliases {unknown:?} were not in its BIRTH",
                    t.kind, t.node
                ),
            ));
        }
    }
}
