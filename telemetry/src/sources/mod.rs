//! Where samples come from: one module per protocol, each owning its client.

pub mod http;
pub mod log_limit;
pub mod mqtt;
pub mod nvml;
pub mod redfish;
pub mod tls;
