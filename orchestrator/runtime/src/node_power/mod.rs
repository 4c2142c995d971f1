//! Node power as an actuation, beside caps and holds: the node power decisions of
//! `policies::node_power` carried out either through Slurm's power saving
//! ([`SlurmPower`]: `scontrol` power down / up, Slurm runs its Suspend/ResumeProgram)
//! or through Redfish `ComputerSystem.Reset` ([`RedfishPower`]: `GracefulShutdown` to
//! power down, `On` to power up) on the node's BMC, for sites without Slurm.
//!
//! Blocking calls with a deadline on every one (HTTP: connect and whole request, by
//! the Redfish endpoint client with its auth and TLS;
//! `scontrol`: the process is killed at the deadline): callers run them off the
//! control tick (`spawn_blocking` or its own thread), never on it.
//! The reset target is read from the system's own `Actions` (as the standard says),
//! falling back to `{system}/Actions/ComputerSystem.Reset`.

pub mod worker;

use std::time::Duration;

use anyhow::{bail, Context, Result};
use policies::node_power::NodeAction;
use serde_json::Value;
use sources::redfish::{Endpoint, EndpointConfig};

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

/// Redfish power control of one BMC (one or more systems), through the Redfish
/// telemetry's own endpoint client: the same `auth` (HTTP Basic, or a Redfish session
/// logged in again when its token expires) and `tls` (the site's CA, a pin, a client
/// certificate) as `[[redfish.endpoints]]`, on the one outbound HTTP stack. Blocking:
/// each call runs on a small runtime of its own, for the node power thread.
pub struct RedfishPower {
    endpoint: Endpoint,
    rt: tokio::runtime::Runtime,
}

impl RedfishPower {
    /// `cfg.url`: `https://host:port`; every call ends within `cfg.timeout_s`.
    pub fn new(cfg: EndpointConfig) -> Result<Self> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("node power runtime")?;
        let endpoint = Endpoint::new(cfg)?;
        Ok(RedfishPower { endpoint, rt })
    }

    fn get(&self, path: &str) -> Result<Value> {
        Ok(self.rt.block_on(self.endpoint.get(path))?)
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
    /// a type the system does not list as allowed is refused before it is sent, and
    /// nothing is sent when the system cannot be read (credentials refused, say).
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
        self.rt.block_on(
            self.endpoint
                .post_action(&target, &serde_json::json!({ "ResetType": reset_type })),
        )?;
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

/// Node power through Slurm's power saving, for sites where Slurm owns the nodes:
/// `scontrol update nodename=<node> state=power_down` / `state=power_up` (Slurm runs
/// its SuspendProgram / ResumeProgram; both 22.05 and 24.11 take these), and the
/// node's state read back from `scontrol -o show node <node>`: the POWERED_DOWN,
/// POWERING_DOWN / POWER_DOWN and POWERING_UP / POWER_UP flags.
///
/// Every call runs under a deadline (the process is killed when it passes); callers
/// run it off the control tick.
pub struct SlurmPower {
    /// `scontrol`, or the command that runs it (`["chroot", "/srv/slurm", "scontrol"]`).
    scontrol: Vec<String>,
    timeout: Duration,
}

impl SlurmPower {
    pub fn new(scontrol: Vec<String>, timeout: Duration) -> Result<Self> {
        anyhow::ensure!(!scontrol.is_empty(), "scontrol must name a command");
        Ok(SlurmPower { scontrol, timeout })
    }

    /// `scontrol <args>`: its stdout, or its stderr as the error.
    fn run(&self, args: &[&str]) -> Result<String> {
        use std::process::{Command, Stdio};
        let (cmd, pre) = self.scontrol.split_first().context("no scontrol command")?;
        let shown = args.join(" ");
        let mut child = Command::new(cmd)
            .args(pre)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("cannot run {cmd}"))?;
        let end = std::time::Instant::now() + self.timeout;
        // scontrol's answers are small: they fit the pipes while it runs
        let status = loop {
            if let Some(s) = child.try_wait().context("scontrol")? {
                break s;
            }
            if std::time::Instant::now() >= end {
                let _ = child.kill();
                let _ = child.wait();
                bail!(
                    "scontrol {shown}: no answer within {} s",
                    self.timeout.as_secs_f64()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let out = child.wait_with_output().context("scontrol")?;
        if !status.success() {
            bail!(
                "scontrol {shown}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// The node's power state, from its `State=` in `scontrol -o show node`.
    pub fn power_state(&self, node: &str) -> Result<PowerState> {
        let out = self.run(&["-o", "show", "node", node])?;
        let state = out
            .split_whitespace()
            .find_map(|w| w.strip_prefix("State="))
            .with_context(|| format!("scontrol show node {node}: no State= in {out:?}"))?;
        Ok(slurm_power_state(state))
    }

    pub fn power_down(&self, node: &str) -> Result<()> {
        self.run(&["update", &format!("nodename={node}"), "state=power_down"])
            .map(drop)
    }

    pub fn power_up(&self, node: &str) -> Result<()> {
        self.run(&["update", &format!("nodename={node}"), "state=power_up"])
            .map(drop)
    }
}

/// A Slurm node state (`IDLE+POWERED_DOWN`, `ALLOCATED+POWERING_UP`, ...) as a power
/// state: powered down is off, a power-down asked or under way is powering off, a
/// power-up asked or under way is powering on, a node that is down (not responding,
/// a resume that timed out) is unknown, any other is on.
pub fn slurm_power_state(state: &str) -> PowerState {
    let mut words = state.split('+');
    let base = words.next().unwrap_or("");
    let flags: Vec<&str> = words.collect();
    let has = |f: &str| flags.contains(&f);
    if has("POWERED_DOWN") {
        PowerState::Off
    } else if has("POWERING_DOWN") || has("POWER_DOWN") {
        PowerState::PoweringOff
    } else if has("POWERING_UP") || has("POWER_UP") {
        PowerState::PoweringOn
    } else if base.is_empty() || base == "DOWN" || base == "UNKNOWN" || base == "FUTURE" {
        PowerState::Unknown
    } else {
        PowerState::On
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slurm_states_read_as_power_states() {
        for (s, want) in [
            ("IDLE", PowerState::On),
            ("MIXED", PowerState::On),
            ("ALLOCATED+DRAIN", PowerState::On),
            ("IDLE+POWERED_DOWN", PowerState::Off),
            ("DOWN+POWERED_DOWN+NOT_RESPONDING", PowerState::Off),
            ("IDLE+POWERING_DOWN", PowerState::PoweringOff),
            ("IDLE+POWER_DOWN", PowerState::PoweringOff),
            ("IDLE+NOT_RESPONDING+POWERING_UP", PowerState::PoweringOn),
            ("ALLOCATED+POWERING_UP", PowerState::PoweringOn),
            ("DOWN+NOT_RESPONDING", PowerState::Unknown),
            ("UNKNOWN", PowerState::Unknown),
            ("", PowerState::Unknown),
        ] {
            assert_eq!(slurm_power_state(s), want, "{s}");
        }
    }

    #[test]
    fn a_hung_scontrol_is_cut_at_the_deadline() {
        let p = SlurmPower::new(
            vec!["sh".into(), "-c".into(), "sleep 30".into()],
            Duration::from_millis(300),
        )
        .expect("power");
        let t = std::time::Instant::now();
        let e = p.power_state("n1").expect_err("a hung command fails");
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
        assert!(format!("{e:#}").contains("no answer within 0.3 s"), "{e:#}");
        let e = SlurmPower::new(vec!["false".into()], Duration::from_secs(5))
            .expect("power")
            .power_down("n1")
            .expect_err("a failing command fails");
        assert!(format!("{e:#}").contains("scontrol update nodename=n1 state=power_down"));
    }
}
