//! Sparkplug B, as industrial gateways speak it: protobuf payloads on
//! `spBv1.0/{group}/{type}/{edge node}[/{device}]`.
//!
//! The payload definitions below are written from the Sparkplug 3.0 specification
//! (only the fields powerplane reads; others are skipped by the decoder). [`Session`]
//! follows each edge node: a BIRTH gives the metric names and their aliases and starts
//! the sequence at 0; DATA messages may name metrics by alias only and must come in
//! sequence (0–255, wrapping); a DEATH marks what the node or device reported as bad.

//!
//! # Layout
//! - `mod.rs`: the payload's protobuf types, topics, and the rebirth command
//! - `session.rs`: [`Session`], what each edge node told so far, and what a message
//!   means ([`Handled`])
//! - `bounds.rs`: [`Limits`], what a session may hold, and [`Held`], what it holds

use prost::Message;

mod bounds;
mod session;

pub use bounds::{
    Held, Limits, DEFAULT_IDLE_S, DEFAULT_MAX_BYTES, DEFAULT_MAX_METRICS,
    DEFAULT_MAX_METRICS_PER_NODE,
};
pub use session::{Handled, Session, Value, MAX_ENTITIES, MAX_NODES};

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

#[cfg(test)]
mod tests;

#[cfg(test)]
mod bounds_tests;
