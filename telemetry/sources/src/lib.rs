//! Where samples come from: one module per protocol, each owning its client. The IO
//! half of the telemetry crate, kept apart so that the vocabulary (`telemetry`) and the
//! engine (`policies`) carry no network, runtime or driver library.
//!
//! # Layout
//!
//! - [`mqtt`]: the MQTT source (JSON mappings, Sparkplug B) and the agents' link;
//! - [`redfish`]: the Redfish poller (async, bounded, backed off);
//! - [`nvml`]: the NVML GPU backend the node agent uses;
//! - [`http`]: price and carbon feeds fetched over HTTP;
//! - [`tls`]: trust settings shared by the clients;
//! - [`secret`]: passwords and URLs read from the files a config names.
#![forbid(unsafe_code)]

pub mod http;
pub mod mqtt;
pub mod nvml;
pub mod redfish;
pub mod secret;
pub mod tls;
