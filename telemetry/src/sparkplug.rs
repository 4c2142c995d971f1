//! Sparkplug B, as industrial gateways speak it: protobuf payloads on
//! `spBv1.0/{group}/{type}/{edge node}[/{device}]`.
//!
//! The payload definitions below are written from the Sparkplug 3.0 specification
//! (only the fields powerplane reads; others are skipped by the decoder). [`Session`]
//! follows each edge node: a BIRTH gives the metric names and their aliases and starts
//! the sequence at 0; DATA messages may name metrics by alias only and must come in
//! sequence (0–255, wrapping); a DEATH marks what the node or device reported as bad.

use std::collections::{BTreeMap, BTreeSet};

use prost::Message;

use crate::EntityId;

/// `Payload` of the specification.
#[derive(Clone, PartialEq, Message)]
pub struct Payload {
    #[prost(uint64, optional, tag = "1")]
    pub timestamp: Option<u64>,
    #[prost(message, repeated, tag = "2")]
    pub metrics: Vec<Metric>,
    #[prost(uint64, optional, tag = "3")]
    pub seq: Option<u64>,
    #[prost(string, optional, tag = "4")]
    pub uuid: Option<String>,
}

/// `Payload.Metric`: the value fields of the `value` oneof, each optional.
#[derive(Clone, PartialEq, Message)]
pub struct Metric {
    #[prost(string, optional, tag = "1")]
    pub name: Option<String>,
    #[prost(uint64, optional, tag = "2")]
    pub alias: Option<u64>,
    #[prost(uint64, optional, tag = "3")]
    pub timestamp: Option<u64>,
    #[prost(uint32, optional, tag = "4")]
    pub datatype: Option<u32>,
    #[prost(bool, optional, tag = "5")]
    pub is_historical: Option<bool>,
    #[prost(bool, optional, tag = "6")]
    pub is_transient: Option<bool>,
    #[prost(bool, optional, tag = "7")]
    pub is_null: Option<bool>,
    #[prost(uint32, optional, tag = "10")]
    pub int_value: Option<u32>,
    #[prost(uint64, optional, tag = "11")]
    pub long_value: Option<u64>,
    #[prost(float, optional, tag = "12")]
    pub float_value: Option<f32>,
    #[prost(double, optional, tag = "13")]
    pub double_value: Option<f64>,
    #[prost(bool, optional, tag = "14")]
    pub boolean_value: Option<bool>,
    #[prost(string, optional, tag = "15")]
    pub string_value: Option<String>,
}

/// Sparkplug data types that carry a number.
pub mod datatype {
    pub const INT8: u32 = 1;
    pub const INT16: u32 = 2;
    pub const INT32: u32 = 3;
    pub const INT64: u32 = 4;
    pub const UINT8: u32 = 5;
    pub const UINT16: u32 = 6;
    pub const UINT32: u32 = 7;
    pub const UINT64: u32 = 8;
    pub const FLOAT: u32 = 9;
    pub const DOUBLE: u32 = 10;
    pub const BOOLEAN: u32 = 11;
    pub const STRING: u32 = 12;
}

/// What a metric's value is, by its datatype.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ValueKind {
    Number,
    Boolean,
    /// A `String` (or `Text`, `UUID`) metric: never a number, whatever it holds.
    Text,
}

impl Metric {
    /// The numeric value, by the metric's datatype (signed integers are two's complement
    /// in the unsigned fields, as the specification says); a boolean is 0 or 1; a string
    /// is no number.
    pub fn number(&self, datatype: Option<u32>) -> Option<f64> {
        if self.is_null == Some(true) {
            return None;
        }
        use datatype::*;
        match (datatype.or(self.datatype), self.int_value, self.long_value) {
            (Some(STRING), _, _) => None,
            (Some(INT8), Some(v), _) => Some(f64::from(v as u8 as i8)),
            (Some(INT16), Some(v), _) => Some(f64::from(v as u16 as i16)),
            (Some(INT32), Some(v), _) => Some(f64::from(v as i32)),
            (Some(INT64), _, Some(v)) => Some(v as i64 as f64),
            (_, Some(v), _) => Some(f64::from(v)),
            (_, _, Some(v)) => Some(v as f64),
            _ => self
                .double_value
                .or(self.float_value.map(f64::from))
                .or(self.boolean_value.map(|b| f64::from(u8::from(b)))),
        }
    }

    /// Whether the value is a number, a boolean or text.
    pub fn kind(&self, datatype: Option<u32>) -> ValueKind {
        match datatype.or(self.datatype) {
            Some(datatype::BOOLEAN) => ValueKind::Boolean,
            Some(datatype::STRING | TEXT | UUID) => ValueKind::Text,
            None if self.boolean_value.is_some() => ValueKind::Boolean,
            None if self.string_value.is_some() => ValueKind::Text,
            _ => ValueKind::Number,
        }
    }
}

/// Sparkplug's `Text` and `UUID` datatypes: strings too.
const TEXT: u32 = 14;
const UUID: u32 = 15;

/// The metric of a BIRTH and a DEATH that ties them to one MQTT session.
pub const BD_SEQ: &str = "bdSeq";
/// The node control metric a host writes (NCMD) to ask an edge node for a new birth.
pub const REBIRTH: &str = "Node Control/Rebirth";

/// The NCMD payload that asks an edge node to publish its births again.
pub fn rebirth_request(timestamp_ms: u64) -> Vec<u8> {
    Payload {
        timestamp: Some(timestamp_ms),
        metrics: vec![Metric {
            name: Some(REBIRTH.to_string()),
            timestamp: Some(timestamp_ms),
            datatype: Some(datatype::BOOLEAN),
            boolean_value: Some(true),
            ..Metric::default()
        }],
        seq: None,
        uuid: None,
    }
    .encode_to_vec()
}

/// The NCMD topic of an edge node.
pub fn command_topic(group: &str, node: &str) -> String {
    format!("spBv1.0/{group}/NCMD/{node}")
}

fn bd_seq(p: &Payload) -> Option<u64> {
    p.metrics
        .iter()
        .find(|m| m.name.as_deref() == Some(BD_SEQ))
        .and_then(|m| m.long_value.or(m.int_value.map(u64::from)))
}

/// The parts of a Sparkplug topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topic<'a> {
    pub group: &'a str,
    pub kind: &'a str,
    pub node: &'a str,
    pub device: Option<&'a str>,
}

/// Splits `spBv1.0/{group}/{type}/{node}[/{device}]`.
pub fn parse_topic(topic: &str) -> Option<Topic<'_>> {
    let mut it = topic.split('/');
    if it.next()? != "spBv1.0" {
        return None;
    }
    let (group, kind, node) = (it.next()?, it.next()?, it.next()?);
    let device = it.next();
    if it.next().is_some() {
        return None;
    }
    Some(Topic {
        group,
        kind,
        node,
        device,
    })
}

/// What one edge node (and its devices) told us so far.
#[derive(Debug, Clone, Default)]
struct Node {
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
    nodes: BTreeMap<(String, String), Node>,
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
            "NDEATH" => {
                let died = Payload::decode(payload).ok().as_ref().and_then(bd_seq);
                if let Some(n) = self.nodes.get_mut(&key) {
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
                return Handled {
                    death: Some(None),
                    ..Handled::default()
                };
            }
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
        if !self.nodes.contains_key(&key) {
            if t.kind != "NBIRTH" {
                return Handled::problem(
                    "no_birth",
                    format!(
                        "{} from {} before its NBIRTH: aliases unknown",
                        t.kind, t.node
                    ),
                )
                .needs_rebirth();
            }
            if self.nodes.len() >= MAX_NODES {
                return Handled::problem(
                    "too_many_nodes",
                    format!(
                        "NBIRTH from {}: {MAX_NODES} edge nodes are followed already",
                        t.node
                    ),
                );
            }
        }
        let node = self.nodes.entry(key).or_default();
        let device = t.device.unwrap_or("").to_string();
        let mut out = Handled::default();
        if t.kind == "NBIRTH" {
            node.born = true;
            node.aliases.clear();
            node.last_seq = None;
            node.bd_seq = bd_seq(&p);
            if p.seq.is_some_and(|s| s != 0) {
                out.problems.push((
                    "bad_sequence",
                    format!("NBIRTH from {} with seq {:?}, expected 0", t.node, p.seq),
                ));
            }
        } else if !node.born {
            return Handled::problem(
                "no_birth",
                format!(
                    "{} from {} before its NBIRTH: aliases unknown",
                    t.kind, t.node
                ),
            )
            .needs_rebirth();
        } else if let (Some(seq), Some(last)) = (p.seq, node.last_seq) {
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
        if p.seq.is_some() {
            node.last_seq = p.seq;
        }
        let birth = t.kind.ends_with("BIRTH");
        let mut unknown = Vec::new();
        for m in &p.metrics {
            if birth {
                if let (Some(name), Some(alias)) = (&m.name, m.alias) {
                    if node.aliases.len() < MAX_ALIASES {
                        node.aliases
                            .insert((device.clone(), alias), (name.clone(), m.datatype));
                    }
                }
            }
            let (name, dt) = match (&m.name, m.alias) {
                (Some(n), _) => (n.clone(), m.datatype),
                (None, Some(a)) => match node.aliases.get(&(device.clone(), a)) {
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
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn metric(name: Option<&str>, alias: Option<u64>, dt: u32, v: f64) -> Metric {
        Metric {
            name: name.map(str::to_string),
            alias,
            datatype: Some(dt),
            double_value: (dt == datatype::DOUBLE).then_some(v),
            float_value: (dt == datatype::FLOAT).then_some(v as f32),
            int_value: (dt == datatype::INT32 || dt == datatype::UINT32).then_some(v as i32 as u32),
            ..Metric::default()
        }
    }

    fn payload(seq: u64, metrics: Vec<Metric>) -> Vec<u8> {
        Payload {
            timestamp: Some(1_717_416_000_000),
            metrics,
            seq: Some(seq),
            uuid: None,
        }
        .encode_to_vec()
    }

    fn topic(kind: &str, device: Option<&str>) -> String {
        match device {
            Some(d) => format!("spBv1.0/dc1/{kind}/gw1/{d}"),
            None => format!("spBv1.0/dc1/{kind}/gw1"),
        }
    }

    fn handle(s: &mut Session, kind: &str, device: Option<&str>, p: &[u8]) -> Handled {
        let t = topic(kind, device);
        let parsed = parse_topic(&t).expect("sparkplug topic");
        s.handle(&parsed, p)
    }

    #[test]
    fn topics_split_into_group_type_node_device() {
        assert_eq!(
            parse_topic("spBv1.0/dc1/DDATA/gw1/cdu-1"),
            Some(Topic {
                group: "dc1",
                kind: "DDATA",
                node: "gw1",
                device: Some("cdu-1")
            })
        );
        assert_eq!(
            parse_topic("spBv1.0/dc1/NBIRTH/gw1").map(|t| t.device),
            Some(None)
        );
        assert_eq!(parse_topic("dc1/a/b/c"), None);
        assert_eq!(parse_topic("spBv1.0/dc1/DDATA/gw1/d/extra"), None);
    }

    #[test]
    fn births_name_aliases_and_data_uses_them() {
        let mut s = Session::new();
        let birth = handle(
            &mut s,
            "NBIRTH",
            None,
            &payload(
                0,
                vec![metric(Some("Uptime"), Some(1), datatype::INT32, 5.0)],
            ),
        );
        assert!(birth.problems.is_empty());
        let dbirth = handle(
            &mut s,
            "DBIRTH",
            Some("cdu-1"),
            &payload(
                1,
                vec![
                    metric(Some("Supply/Temp"), Some(10), datatype::FLOAT, 30.5),
                    metric(Some("Flow"), Some(11), datatype::DOUBLE, 120.0),
                ],
            ),
        );
        assert_eq!(
            dbirth
                .values
                .iter()
                .map(|v| (v.name.as_str(), v.value))
                .collect::<Vec<_>>(),
            vec![("Supply/Temp", 30.5), ("Flow", 120.0)]
        );
        let data = handle(
            &mut s,
            "DDATA",
            Some("cdu-1"),
            &payload(
                2,
                vec![
                    metric(None, Some(11), datatype::DOUBLE, 99.0),
                    metric(None, Some(10), datatype::FLOAT, 31.0),
                ],
            ),
        );
        assert!(data.problems.is_empty(), "{:?}", data.problems);
        assert_eq!(
            data.values
                .iter()
                .map(|v| (v.name.as_str(), v.value))
                .collect::<Vec<_>>(),
            vec![("Flow", 99.0), ("Supply/Temp", 31.0)]
        );
        assert_eq!(data.values[0].timestamp_ms, Some(1_717_416_000_000));
    }

    #[test]
    fn signed_integers_are_twos_complement() {
        let m = Metric {
            int_value: Some((-5i32) as u32),
            datatype: Some(datatype::INT32),
            ..Metric::default()
        };
        assert_eq!(m.number(None), Some(-5.0));
        let m = Metric {
            int_value: Some(0xFF),
            datatype: Some(datatype::INT8),
            ..Metric::default()
        };
        assert_eq!(m.number(None), Some(-1.0));
        let m = Metric {
            long_value: Some(u64::MAX),
            datatype: Some(datatype::INT64),
            ..Metric::default()
        };
        assert_eq!(m.number(None), Some(-1.0));
        let m = Metric {
            boolean_value: Some(true),
            datatype: Some(datatype::BOOLEAN),
            ..Metric::default()
        };
        assert_eq!(m.number(None), Some(1.0));
        let m = Metric {
            is_null: Some(true),
            double_value: Some(3.0),
            ..Metric::default()
        };
        assert_eq!(m.number(None), None);
    }

    #[test]
    fn a_sequence_gap_is_reported_and_the_values_kept() {
        let mut s = Session::new();
        handle(
            &mut s,
            "NBIRTH",
            None,
            &payload(0, vec![metric(Some("P"), Some(1), datatype::DOUBLE, 1.0)]),
        );
        let gap = handle(
            &mut s,
            "NDATA",
            None,
            &payload(5, vec![metric(None, Some(1), datatype::DOUBLE, 2.0)]),
        );
        assert_eq!(gap.problems[0].0, "sequence_gap");
        assert_eq!(gap.values.len(), 1);
        let next = handle(
            &mut s,
            "NDATA",
            None,
            &payload(6, vec![metric(None, Some(1), datatype::DOUBLE, 3.0)]),
        );
        assert!(next.problems.is_empty());
        // 255 wraps to 0
        handle(&mut s, "NDATA", None, &payload(255, vec![]));
        assert!(handle(&mut s, "NDATA", None, &payload(0, vec![]))
            .problems
            .is_empty());
    }

    #[test]
    fn data_before_birth_unknown_aliases_and_garbage_are_rejected() {
        let mut s = Session::new();
        assert_eq!(
            handle(&mut s, "NDATA", None, &payload(1, vec![])).problems[0].0,
            "no_birth"
        );
        handle(&mut s, "NBIRTH", None, &payload(0, vec![]));
        let unknown = handle(
            &mut s,
            "NDATA",
            None,
            &payload(1, vec![metric(None, Some(42), datatype::DOUBLE, 1.0)]),
        );
        assert_eq!(unknown.problems[0].0, "unknown_alias");
        assert_eq!(
            handle(&mut s, "NDATA", None, b"\xff\xff\xff").problems[0].0,
            "bad_protobuf"
        );
        assert_eq!(
            handle(&mut s, "NBIRTH", None, &payload(7, vec![])).problems[0].0,
            "bad_sequence"
        );
    }

    #[test]
    fn deaths_name_what_died() {
        let mut s = Session::new();
        handle(&mut s, "NBIRTH", None, &payload(0, vec![]));
        let t = topic("DDATA", Some("cdu-1"));
        let parsed = parse_topic(&t).expect("topic");
        s.remember(&parsed, &EntityId::new(crate::EntityKind::Cooling, "cdu-1"));
        assert_eq!(
            handle(&mut s, "DDEATH", Some("cdu-1"), b"").death,
            Some(Some("cdu-1".to_string()))
        );
        assert_eq!(s.entities_of(&parsed, Some("cdu-1")).len(), 1);
        assert_eq!(handle(&mut s, "NDEATH", None, b"").death, Some(None));
        assert_eq!(
            handle(&mut s, "NDATA", None, &payload(1, vec![])).problems[0].0,
            "no_birth",
            "a dead node must be born again"
        );
    }

    #[test]
    fn made_up_edge_nodes_grow_the_session_only_up_to_its_bound() {
        let mut s = Session::new();
        let birth = payload(
            0,
            vec![metric(Some("temp"), Some(1), datatype::DOUBLE, 20.0)],
        );
        let data = payload(1, vec![metric(None, Some(1), datatype::DOUBLE, 21.0)]);
        for i in 0..(MAX_NODES + 50) {
            let node = format!("made-up-{i}");
            let t = format!("spBv1.0/g/NDATA/{node}");
            let h = s.handle(&parse_topic(&t).expect("topic"), &data);
            assert_eq!(
                h.problems[0].0, "no_birth",
                "data before a birth keeps nothing"
            );
        }
        assert_eq!(s.nodes.len(), 0);
        let mut refused = 0;
        for i in 0..(MAX_NODES + 50) {
            let t = format!("spBv1.0/g/NBIRTH/made-up-{i}");
            let h = s.handle(&parse_topic(&t).expect("topic"), &birth);
            if h.problems.first().is_some_and(|p| p.0 == "too_many_nodes") {
                refused += 1;
            }
        }
        assert_eq!((s.nodes.len(), refused), (MAX_NODES, 50));
    }

    fn bd(seq: u64) -> Metric {
        Metric {
            name: Some(BD_SEQ.to_string()),
            datatype: Some(datatype::UINT64),
            long_value: Some(seq),
            ..Metric::default()
        }
    }

    #[test]
    fn a_death_of_an_earlier_session_is_ignored_and_the_current_one_counts() {
        let mut s = Session::new();
        handle(&mut s, "NBIRTH", None, &payload(0, vec![bd(3)]));
        let death = |n: u64| {
            Payload {
                metrics: vec![bd(n)],
                ..Payload::default()
            }
            .encode_to_vec()
        };
        let stale = handle(&mut s, "NDEATH", None, &death(2));
        assert_eq!(stale.death, None, "the will of session 2 arrived late");
        assert_eq!(stale.problems[0].0, "stale_death");
        assert!(
            handle(&mut s, "NDATA", None, &payload(1, vec![]))
                .problems
                .is_empty(),
            "the node is still alive"
        );
        let real = handle(&mut s, "NDEATH", None, &death(3));
        assert_eq!(real.death, Some(None));
        assert!(real.problems.is_empty());
        // a death without bdSeq (an older gateway) is believed
        handle(&mut s, "NBIRTH", None, &payload(0, vec![bd(4)]));
        assert_eq!(handle(&mut s, "NDEATH", None, b"").death, Some(None));
    }

    #[test]
    fn lost_state_calls_for_a_rebirth() {
        let mut s = Session::new();
        let before = handle(&mut s, "NDATA", None, &payload(3, vec![]));
        assert!(before.rebirth, "data before birth");
        handle(
            &mut s,
            "NBIRTH",
            None,
            &payload(0, vec![metric(Some("P"), Some(1), datatype::DOUBLE, 1.0)]),
        );
        assert!(!handle(&mut s, "NDATA", None, &payload(1, vec![])).rebirth);
        assert!(
            handle(&mut s, "NDATA", None, &payload(5, vec![])).rebirth,
            "a gap"
        );
        let alias = handle(
            &mut s,
            "NDATA",
            None,
            &payload(6, vec![metric(None, Some(9), datatype::DOUBLE, 1.0)]),
        );
        assert!(alias.rebirth, "an alias the birth did not name");
        let req = Payload::decode(rebirth_request(5).as_slice()).expect("ncmd");
        assert_eq!(req.metrics[0].name.as_deref(), Some(REBIRTH));
        assert_eq!(req.metrics[0].boolean_value, Some(true));
        assert_eq!(command_topic("dc1", "gw1"), "spBv1.0/dc1/NCMD/gw1");
    }

    #[test]
    fn a_string_metric_is_text_never_a_number() {
        let m = Metric {
            datatype: Some(datatype::STRING),
            string_value: Some("42.5".into()),
            ..Metric::default()
        };
        assert_eq!(m.number(None), None);
        assert_eq!(m.kind(None), ValueKind::Text);
        let mut s = Session::new();
        let h = handle(
            &mut s,
            "NBIRTH",
            None,
            &payload(
                0,
                vec![Metric {
                    name: Some("Inlet".into()),
                    ..m.clone()
                }],
            ),
        );
        assert_eq!(h.values[0].kind, ValueKind::Text);
        assert!(h.values[0].value.is_nan());
    }
}
