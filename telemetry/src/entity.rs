//! Typed entity ids: every metric belongs to one entity of the site.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// What kind of thing an entity is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum EntityKind {
    Site,
    Room,
    Row,
    Rack,
    Node,
    Gpu,
    Feed,
    Pdu,
    Branch,
    Outlet,
    Cooling,
}

impl EntityKind {
    pub const ALL: [EntityKind; 11] = [
        EntityKind::Site,
        EntityKind::Room,
        EntityKind::Row,
        EntityKind::Rack,
        EntityKind::Node,
        EntityKind::Gpu,
        EntityKind::Feed,
        EntityKind::Pdu,
        EntityKind::Branch,
        EntityKind::Outlet,
        EntityKind::Cooling,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            EntityKind::Site => "site",
            EntityKind::Room => "room",
            EntityKind::Row => "row",
            EntityKind::Rack => "rack",
            EntityKind::Node => "node",
            EntityKind::Gpu => "gpu",
            EntityKind::Feed => "feed",
            EntityKind::Pdu => "pdu",
            EntityKind::Branch => "branch",
            EntityKind::Outlet => "outlet",
            EntityKind::Cooling => "cooling",
        }
    }
}

/// Why a text is not an entity id (or kind).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EntityError {
    #[error("unknown entity kind {0:?}")]
    UnknownKind(String),
    #[error("entity {0:?} must be written kind/name, e.g. rack/a01")]
    NoKind(String),
    #[error("entity {0:?} has an empty name")]
    EmptyName(String),
}

impl FromStr for EntityKind {
    type Err = EntityError;
    fn from_str(s: &str) -> Result<Self, EntityError> {
        EntityKind::ALL
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| EntityError::UnknownKind(s.to_string()))
    }
}

/// `kind/name`, e.g. `rack/a01`, `gpu/a01-n01:3` (GPU 3 of node a01-n01), `site/hall`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct EntityId {
    pub kind: EntityKind,
    pub name: String,
}

impl EntityId {
    pub fn new(kind: EntityKind, name: impl Into<String>) -> Self {
        EntityId {
            kind,
            name: name.into(),
        }
    }
    pub fn rack(name: &str) -> Self {
        EntityId::new(EntityKind::Rack, name)
    }
    pub fn node(name: &str) -> Self {
        EntityId::new(EntityKind::Node, name)
    }
    pub fn gpu(node: &str, index: u32) -> Self {
        EntityId::new(EntityKind::Gpu, format!("{node}:{index}"))
    }
    pub fn site(name: &str) -> Self {
        EntityId::new(EntityKind::Site, name)
    }
}

impl fmt::Display for EntityId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.kind.as_str(), self.name)
    }
}

impl FromStr for EntityId {
    type Err = EntityError;
    fn from_str(s: &str) -> Result<Self, EntityError> {
        let (kind, name) = s
            .split_once('/')
            .ok_or_else(|| EntityError::NoKind(s.to_string()))?;
        if name.is_empty() {
            return Err(EntityError::EmptyName(s.to_string()));
        }
        Ok(EntityId::new(kind.parse()?, name))
    }
}

impl Serialize for EntityId {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for EntityId {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints() {
        let id: EntityId = "gpu/a01-n01:3".parse().expect("parses");
        assert_eq!(id, EntityId::gpu("a01-n01", 3));
        assert_eq!(id.to_string(), "gpu/a01-n01:3");
        assert!("toaster/x".parse::<EntityId>().is_err());
        assert!("rack".parse::<EntityId>().is_err());
        assert!("rack/".parse::<EntityId>().is_err());
    }
}
