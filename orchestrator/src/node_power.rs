//! Node power as an actuation, beside caps and holds: the node power decisions of
//! `policies::node_power` carried out through Redfish `ComputerSystem.Reset`
//! (`GracefulShutdown` to power down, `On` to power up) on the node's BMC, for sites
//! without Slurm.
//!
//! Blocking HTTP with a deadline on every call (connect and whole request): callers
//! run it off the control tick (`spawn_blocking` or its own thread), never on it.
//! The reset target is read from the system's own `Actions` (as the standard says),
//! falling back to `{system}/Actions/ComputerSystem.Reset`.

use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use policies::node_power::NodeAction;
use serde_json::Value;

/// A node's power state as its BMC reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PowerState {
    On,
    Off,
    PoweringOn,
    PoweringOff,
    Unknown,
}

impl PowerState {
    fn parse(s: &str) -> PowerState {
        match s {
            "On" => PowerState::On,
            "Off" => PowerState::Off,
            "PoweringOn" => PowerState::PoweringOn,
            "PoweringOff" => PowerState::PoweringOff,
            _ => PowerState::Unknown,
        }
    }
}

/// Redfish power control of one BMC (one or more systems).
pub struct RedfishPower {
    client: reqwest::blocking::Client,
    base: String,
    auth: Option<(String, String)>,
}

impl RedfishPower {
    /// `base`: `http(s)://host:port`; every call ends within `timeout`.
    pub fn new(base: &str, timeout: Duration, auth: Option<(String, String)>) -> Result<Self> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::blocking::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout)
            .user_agent(concat!("powerplane/", env!("CARGO_PKG_VERSION")))
            .build()
            .context("Redfish client")?;
        Ok(RedfishPower {
            client,
            base: base.trim_end_matches('/').to_string(),
            auth,
        })
    }

    fn get(&self, path: &str) -> Result<Value> {
        let mut r = self.client.get(format!("{}{path}", self.base));
        if let Some((u, p)) = &self.auth {
            r = r.basic_auth(u, Some(p));
        }
        let resp = r.send().with_context(|| format!("GET {path}"))?;
        let status = resp.status();
        if !status.is_success() {
            bail!("GET {path}: HTTP {status}");
        }
        resp.json().with_context(|| format!("GET {path}: not JSON"))
    }

    /// The systems the BMC manages (their `@odata.id`).
    pub fn systems(&self) -> Result<Vec<String>> {
        let v = self.get("/redfish/v1/Systems")?;
        Ok(v["Members"]
            .as_array()
            .map(|m| {
                m.iter()
                    .filter_map(|x| x["@odata.id"].as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default())
    }

    pub fn power_state(&self, system: &str) -> Result<PowerState> {
        let v = self.get(system)?;
        Ok(PowerState::parse(v["PowerState"].as_str().unwrap_or("")))
    }

    /// POSTs `ComputerSystem.Reset` with `reset_type` (`On`, `GracefulShutdown`, ...);
    /// a type the system does not list as allowed is refused before it is sent.
    pub fn reset(&self, system: &str, reset_type: &str) -> Result<()> {
        let v = self.get(system)?;
        let action = &v["Actions"]["#ComputerSystem.Reset"];
        if let Some(allowed) = action["ResetType@Redfish.AllowableValues"].as_array() {
            if !allowed.iter().any(|a| a.as_str() == Some(reset_type)) {
                bail!("{system}: reset type {reset_type} not allowed (allowed: {allowed:?})");
            }
        }
        let target = action["target"]
            .as_str()
            .map(str::to_string)
            .unwrap_or_else(|| format!("{system}/Actions/ComputerSystem.Reset"));
        let mut r = self
            .client
            .post(format!("{}{target}", self.base))
            .json(&serde_json::json!({ "ResetType": reset_type }));
        if let Some((u, p)) = &self.auth {
            r = r.basic_auth(u, Some(p));
        }
        let resp = r.send().with_context(|| format!("POST {target}"))?;
        let status = resp.status();
        if !status.is_success() {
            return Err(anyhow!("POST {target} ({reset_type}): HTTP {status}"));
        }
        Ok(())
    }

    /// Carries out node actions; `system_of` names each node's system. Returns one
    /// line per action that failed (the caller counts and logs them).
    pub fn apply(
        &self,
        actions: &[NodeAction],
        system_of: &dyn Fn(&str) -> Option<String>,
    ) -> Vec<String> {
        let mut errors = Vec::new();
        for a in actions {
            let reset = match a {
                NodeAction::Down { .. } => "GracefulShutdown",
                NodeAction::Up { .. } => "On",
                NodeAction::Failed { .. } => continue,
            };
            let Some(system) = system_of(a.node()) else {
                errors.push(format!("node {}: no Redfish system", a.node()));
                continue;
            };
            if let Err(e) = self.reset(&system, reset) {
                errors.push(format!("node {}: {e:#}", a.node()));
            }
        }
        errors
    }
}
