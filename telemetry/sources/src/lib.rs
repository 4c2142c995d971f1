//! Where samples come from: one module per protocol, each owning its client. The IO
//! half of the telemetry crate, kept apart so that the vocabulary (`telemetry`) and the
//! engine (`policies`) carry no network, runtime or driver library.
//!
//! # Layout
//!
//! - [`mqtt`]: the MQTT source (JSON mappings, Sparkplug B) and the agents' link
//!   (feature `mqtt`);
//! - [`redfish`]: the Redfish poller (async, bounded, backed off; feature `redfish`);
//! - [`nvml`]: the NVML GPU backend the node agent uses (feature `nvml`);
//! - [`openadr2b`]: the OpenADR 2.0b VEN (registration, polling, event answers,
//!   reports; feature `openadr`);
//! - [`http`]: price and carbon feeds fetched over HTTP (feature `http-feeds`);
//! - [`tls`]: trust settings shared by the clients (feature `tls`, taken by the three
//!   network features);
//! - [`secret`]: passwords and URLs read from the files a config names;
//! - [`source`]: the [`source::Source`] trait every telemetry input implements (its
//!   kind, its task on the runtime with a cancellation token and a bounded output, its
//!   counters), for MQTT and Redfish (feature `source`, taken by `redfish`).
//!
//! The node agent takes `mqtt` and `nvml` only: no HTTP client, no Redfish poller, no
//! `Source` trait (it runs its MQTT link on a thread of its own).
#![forbid(unsafe_code)]

#[cfg(feature = "http-feeds")]
pub mod http;
pub mod jitter;
#[cfg(feature = "mqtt")]
pub mod mqtt;
#[cfg(feature = "nvml")]
pub mod nvml;
#[cfg(feature = "openadr")]
pub mod openadr2b;
#[cfg(feature = "openadr")]
pub mod openadr3;
#[cfg(feature = "redfish")]
pub mod redfish;
pub mod secret;
#[cfg(feature = "source")]
pub mod source;
#[cfg(feature = "tls")]
pub mod tls;
