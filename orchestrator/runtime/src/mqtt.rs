//! `[mqtt]`: the MQTT source of `serve` (JSON mappings and Sparkplug B), built from
//! its section and started with the others (see [`crate::sources`]); its counters are
//! the source's own and the admission's rejects.

use std::path::PathBuf;

use serde::Deserialize;
use sources::mqtt::{MqttConfig, MqttConfigError, MqttSource};
use telemetry::mapping::Mapping;

/// `[mqtt]` in `powerplane.toml`: the broker (see [`MqttConfig`]) and the mapping file
/// that turns its messages into samples.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MqttSection {
    pub mapping: PathBuf,
    #[serde(flatten)]
    pub client: MqttConfig,
}

/// The source for `section`, decoding with `mapping` (read from `section.mapping`).
pub fn source(section: &MqttSection, mapping: Mapping) -> Result<MqttSource, MqttConfigError> {
    MqttSource::new(section.client.clone(), mapping)
}
