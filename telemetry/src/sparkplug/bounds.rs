//! What a [`super::Session`] may hold: [`Limits`] on the aliased metrics (per edge node
//! and in all) and on their bytes, and how long a silent node is kept; [`Held`], what
//! it holds now. Anyone who may publish on the Sparkplug namespace can send births, so
//! a birth beyond a limit is refused (`too_many_metrics`) rather than kept.

/// The bounds of a session. The defaults fit a site of a few hundred gateways of a few
/// thousand metrics each (about 40 MB of names at most).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    /// Aliased metrics one edge node (its own and all its devices') may hold.
    pub max_metrics_per_node: usize,
    /// Aliased metrics all edge nodes together may hold.
    pub max_metrics: usize,
    /// The bytes all edge nodes' state may take, as [`Held::bytes`] counts them.
    pub max_bytes: usize,
    /// A node silent this long (milliseconds of receipt time) is forgotten, as after
    /// its death; 0 keeps it until its death.
    pub idle_ms: i64,
}

pub const DEFAULT_MAX_METRICS_PER_NODE: usize = 4_096;
pub const DEFAULT_MAX_METRICS: usize = 100_000;
pub const DEFAULT_MAX_BYTES: usize = 32 << 20;
pub const DEFAULT_IDLE_S: f64 = 3_600.0;

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_metrics_per_node: DEFAULT_MAX_METRICS_PER_NODE,
            max_metrics: DEFAULT_MAX_METRICS,
            max_bytes: DEFAULT_MAX_BYTES,
            idle_ms: (DEFAULT_IDLE_S * 1000.0) as i64,
        }
    }
}

/// What a session holds: what [`Limits`] bound.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Held {
    pub nodes: usize,
    /// Aliased metrics, over every node and device.
    pub metrics: usize,
    /// An estimate of the memory the nodes' state takes: each alias, each entity a node
    /// fed and each node with its names, plus the collections' overhead.
    pub bytes: usize,
}

/// The bytes one alias takes: its key (device, alias), its value (name, datatype), and
/// a B-tree entry's share.
pub(super) fn alias_bytes(device: &str, name: &str) -> usize {
    96 + device.len() + name.len()
}

/// The bytes one fed entity takes.
pub(super) fn entity_bytes(device: &str, entity: &crate::EntityId) -> usize {
    96 + device.len() + entity.name.len()
}

/// The bytes one node takes before its aliases and entities.
pub(super) fn node_bytes(group: &str, node: &str) -> usize {
    160 + group.len() + node.len()
}
