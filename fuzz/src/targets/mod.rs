//! The decoders fuzzed, each with its seeds and generator.

mod files;
mod mqtt;
mod openadr;
mod openadr3;
mod redfish;
mod signed;

use crate::runner::Decoder;

/// Every decoder, in the order the table lists them.
pub const DECODERS: &[Decoder] = &[
    Decoder {
        name: "mqtt_json",
        make: mqtt::json_mapping,
    },
    Decoder {
        name: "sparkplug_b",
        make: mqtt::sparkplug,
    },
    Decoder {
        name: "agent_command",
        make: signed::agent_commands,
    },
    Decoder {
        name: "webhook_event",
        make: signed::webhook_events,
    },
    Decoder {
        name: "redfish_json",
        make: redfish::redfish,
    },
    Decoder {
        name: "openadr2b",
        make: openadr::openadr2b,
    },
    Decoder {
        name: "openadr3",
        make: openadr3::openadr3,
    },
    Decoder {
        name: "site_toml",
        make: files::site,
    },
    Decoder {
        name: "policy_toml",
        make: files::policy,
    },
];

/// The decoder named `name`.
pub fn decoder(name: &str) -> Option<Decoder> {
    DECODERS.iter().copied().find(|d| d.name == name)
}
