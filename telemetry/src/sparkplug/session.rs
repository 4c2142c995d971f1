//! [`Session`]: what each edge node told so far (its birth, sequence, aliases and the
//! entities it fed), and what one message means ([`Handled`]).

use std::collections::{BTreeMap, BTreeSet};

use prost::Message;

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
/// Aliases and fed entities kept per edge node at most.
pub const MAX_ALIASES: usize = 65_536;
pub const MAX_ENTITIES: usize = 4_096;

/// The state of every edge node seen, by (group, node).
#[derive(Debug, Clone, Default)]
pub struct Session {
    pub(super) nodes: BTreeMap<(String, String), Node>,
}

impl Session {
    pub fn new() -> Self {
        Session::default()
    }

    /// Records that `entity` was fed by this node/device (so a DEATH can mark it).
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
        node.entities
            .entry(t.device.unwrap_or("").to_string())
            .or_default()
            .insert(entity.clone());
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

    /// Follows one message.
    pub fn handle(&mut self, t: &Topic<'_>, payload: &[u8]) -> Handled {
        let key = (t.group.to_string(), t.node.to_string());
        match t.kind {
            "NDEATH" => return self.node_death(&key, t, payload),
            "DDEATH" => {
                return Handled {
                    death: Some(t.device.map(str::to_string)),
                    ..Handled::default()
                }
            }
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
        let node = self.nodes.entry(key).or_default();
        let mut out = Handled::default();
        if let Err(refused) = node.follow_sequence(t, &p, &mut out) {
            return refused;
        }
        node.read_metrics(t, &p, &mut out);
        out
    }

    /// An NDEATH: the node's birth is over, unless the death is of an earlier session.
    fn node_death(&mut self, key: &(String, String), t: &Topic<'_>, payload: &[u8]) -> Handled {
        let died = Payload::decode(payload).ok().as_ref().and_then(bd_seq);
        if let Some(n) = self.nodes.get_mut(key) {
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
            n.born = false;
            n.last_seq = None;
        }
        Handled {
            death: Some(None),
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
            self.aliases.clear();
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

    /// The message's metrics as values, by name or by the alias a birth gave; a birth
    /// names its aliases.
    fn read_metrics(&mut self, t: &Topic<'_>, p: &Payload, out: &mut Handled) {
        let device = t.device.unwrap_or("").to_string();
        let birth = t.kind.ends_with("BIRTH");
        let mut unknown = Vec::new();
        for m in &p.metrics {
            if birth {
                if let (Some(name), Some(alias)) = (&m.name, m.alias) {
                    if self.aliases.len() < MAX_ALIASES {
                        self.aliases
                            .insert((device.clone(), alias), (name.clone(), m.datatype));
                    }
                }
            }
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
