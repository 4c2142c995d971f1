//! The agent's config file (`agent.toml`) and its loop: read every interval and
//! publish; take commands as they arrive (between reads, so a slow NVML read never
//! delays the network: publishing is queued to the MQTT thread); health on connect,
//! on change and every 30 reads, retained, with a last will that says `offline`.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde::Deserialize;
use sources::mqtt::{Link, LinkEvent, MqttConfig, Will};
use telemetry::agent_proto::{Channel, Key, Topics};
use telemetry::gpu_backend::GpuBackend;
use telemetry::Timestamp;
use tracing::{info, warn};

use super::core::{Core, FailSafe, OnExit, Rules};
use crate::wall_clock;

/// `agent.toml`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentConfig {
    /// This node's name as the site file spells it (default: the host name).
    #[serde(default)]
    pub node: Option<String>,
    #[serde(default = "one")]
    pub interval_s: f64,
    /// The site key (hex, as `openssl rand -hex 32` writes it).
    pub key_file: PathBuf,
    /// Where the desired state survives restarts.
    #[serde(default)]
    pub state_file: Option<PathBuf>,
    #[serde(default)]
    pub dry_run: bool,
    /// `restore_default`, `cap` (with `fail_safe_cap_w` or `fail_safe_cap_pct`), `keep`.
    #[serde(default = "restore")]
    pub fail_safe: String,
    #[serde(default)]
    pub fail_safe_cap_w: Option<f64>,
    #[serde(default)]
    pub fail_safe_cap_pct: Option<f64>,
    /// On SIGTERM/SIGINT: `restore_default`, `keep`, `fail_safe`.
    #[serde(default = "restore")]
    pub on_exit: String,
    #[serde(default = "max_lease")]
    pub max_lease_s: f64,
    #[serde(default = "max_age")]
    pub max_command_age_s: f64,
    #[serde(default = "max_skew")]
    pub max_clock_skew_s: f64,
    #[serde(default = "drift")]
    pub drift_tolerance_w: f64,
    #[serde(default = "prefix")]
    pub topic_prefix: String,
    #[serde(default = "proc_root")]
    pub proc_root: PathBuf,
    #[serde(default)]
    pub backend: BackendConfig,
    pub mqtt: MqttConfig,
    /// Which pods hold which GPUs, from the kubelet (absent: not asked).
    #[serde(default)]
    pub kubernetes: Option<crate::pods::KubernetesConfig>,
}

fn one() -> f64 {
    1.0
}
fn restore() -> String {
    "restore_default".into()
}
fn max_lease() -> f64 {
    900.0
}
fn max_age() -> f64 {
    60.0
}
fn max_skew() -> f64 {
    30.0
}
fn drift() -> f64 {
    2.0
}
fn prefix() -> String {
    telemetry::agent_proto::DEFAULT_PREFIX.into()
}
fn proc_root() -> PathBuf {
    "/proc".into()
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BackendConfig {
    /// `nvml` or `sim`.
    #[serde(default = "nvml")]
    pub kind: String,
    /// Simulated GPUs.
    #[serde(default = "eight")]
    pub gpus: u32,
    #[serde(default = "a40")]
    pub model: String,
    #[serde(default = "seed")]
    pub seed: u64,
}

impl Default for BackendConfig {
    fn default() -> Self {
        BackendConfig {
            kind: nvml(),
            gpus: eight(),
            model: a40(),
            seed: seed(),
        }
    }
}

fn nvml() -> String {
    "nvml".into()
}
fn eight() -> u32 {
    8
}
fn a40() -> String {
    "A40".into()
}
fn seed() -> u64 {
    1
}

/// The host name, for a node that does not name itself.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "node".into())
}

/// Everything the agent needs, read and checked.
pub struct Loaded {
    pub config: AgentConfig,
    pub rules: Rules,
    pub on_exit: OnExit,
    pub state_file: Option<PathBuf>,
}

/// Reads a key file, warning when others may read it.
pub fn read_key(path: &Path) -> Result<Key> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the site key {}", path.display()))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        if let Ok(m) = std::fs::metadata(path) {
            if m.permissions().mode() & 0o004 != 0 {
                warn!(path = %path.display(), "the site key is readable by every user; chmod 0600 it");
            }
        }
    }
    Key::from_text(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
}

/// Loads and checks `agent.toml`: every problem is an error here, before anything
/// starts.
pub fn load(path: &Path, dry_run: bool) -> Result<Loaded> {
    let name = path.display().to_string();
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {name}"))?;
    let mut cfg: AgentConfig =
        telemetry::diag::parse_all(&name, &text).map_err(|e| anyhow::anyhow!("{e}"))?;
    cfg.dry_run |= dry_run;
    let base = path.parent().unwrap_or(Path::new("."));
    cfg.mqtt
        .read_secrets(base)
        .map_err(|e| anyhow::anyhow!("{name}: [mqtt] {e}"))?;
    let key = read_key(&resolve(base, &cfg.key_file))?;
    let node = cfg.node.clone().unwrap_or_else(hostname);
    check_numbers(&name, &node, &cfg)?;
    if let Some(k) = cfg.kubernetes.as_mut() {
        k.check().map_err(|e| anyhow::anyhow!("{name}: {e}"))?;
        k.pod_resources_socket = resolve(base, &k.pod_resources_socket);
    }
    if cfg.state_file.is_none() {
        warn!("{name}: no state_file: a restart forgets the desired state, its leases and the command ids seen (replays)");
    }
    let fail_safe = fail_safe_of(&name, &cfg)?;
    let on_exit = on_exit_of(&name, &cfg)?;
    let mut rules = Rules::new(&node, key);
    rules.max_lease_s = cfg.max_lease_s;
    rules.max_age_s = cfg.max_command_age_s;
    rules.max_skew_s = cfg.max_clock_skew_s;
    rules.fail_safe = fail_safe;
    rules.dry_run = cfg.dry_run;
    rules.drift_tolerance_w = cfg.drift_tolerance_w;
    rules.proc_root = cfg.proc_root.clone();
    let state_file = cfg.state_file.as_ref().map(|p| resolve(base, p));
    Ok(Loaded {
        config: cfg,
        rules,
        on_exit,
        state_file,
    })
}

/// The node's name fits in a topic; the interval, the command limits and the drift
/// tolerance are within their ranges.
fn check_numbers(name: &str, node: &str, cfg: &AgentConfig) -> Result<()> {
    anyhow::ensure!(
        !node.is_empty() && !node.contains(['/', '+', '#']),
        "{name}: node {node:?} cannot be part of a topic"
    );
    anyhow::ensure!(
        (0.05..=3600.0).contains(&cfg.interval_s),
        "{name}: interval_s must be within 0.05..=3600, got {}",
        cfg.interval_s
    );
    for (what, v) in [
        ("max_lease_s", cfg.max_lease_s),
        ("max_command_age_s", cfg.max_command_age_s),
        ("max_clock_skew_s", cfg.max_clock_skew_s),
    ] {
        anyhow::ensure!(
            v.is_finite() && v > 0.0,
            "{name}: {what} must be above 0, got {v}"
        );
    }
    anyhow::ensure!(
        cfg.drift_tolerance_w.is_finite() && cfg.drift_tolerance_w >= 0.0,
        "{name}: drift_tolerance_w must be 0 or more, got {}",
        cfg.drift_tolerance_w
    );
    Ok(())
}

/// What the agent does when its lease runs out.
fn fail_safe_of(name: &str, cfg: &AgentConfig) -> Result<FailSafe> {
    Ok(
        match (cfg.fail_safe.as_str(), cfg.fail_safe_cap_w, cfg.fail_safe_cap_pct) {
            ("restore_default", None, None) => FailSafe::RestoreDefault,
            ("keep", None, None) => FailSafe::Keep,
            ("cap", Some(w), None) if w.is_finite() && w > 0.0 => FailSafe::Cap {
                watts: Some(w),
                percent: None,
            },
            ("cap", None, Some(p)) if p.is_finite() && p > 0.0 && p <= 100.0 => FailSafe::Cap {
                watts: None,
                percent: Some(p),
            },
            ("cap", ..) => anyhow::bail!(
                "{name}: fail_safe = \"cap\" needs one of fail_safe_cap_w (W, above 0) or fail_safe_cap_pct (0 < % <= 100)"
            ),
            ("restore_default" | "keep", ..) => anyhow::bail!(
                "{name}: fail_safe_cap_w and fail_safe_cap_pct go with fail_safe = \"cap\" only"
            ),
            (other, ..) => anyhow::bail!(
                "{name}: fail_safe must be \"restore_default\", \"cap\" or \"keep\", got {other:?}"
            ),
        },
    )
}

/// What the agent leaves behind when it stops.
fn on_exit_of(name: &str, cfg: &AgentConfig) -> Result<OnExit> {
    Ok(match cfg.on_exit.as_str() {
        "restore_default" => OnExit::RestoreDefault,
        "keep" => OnExit::Keep,
        "fail_safe" => OnExit::FailSafe,
        other => anyhow::bail!(
            "{name}: on_exit must be \"restore_default\", \"keep\" or \"fail_safe\", got {other:?}"
        ),
    })
}

/// The backend a config names.
pub fn open_backend(b: &BackendConfig) -> Result<Box<dyn GpuBackend>> {
    Ok(match b.kind.as_str() {
        "nvml" => Box::new(sources::nvml::NvmlBackend::open().map_err(|e| anyhow::anyhow!("{e}"))?),
        "sim" => {
            let model = telemetry::GpuModel::builtin(&b.model).ok_or_else(|| {
                anyhow::anyhow!(
                    "unknown simulated GPU model {:?} (known: {})",
                    b.model,
                    telemetry::GpuModel::BUILTIN_NAMES.join(", ")
                )
            })?;
            Box::new(super::SimGpus::new(b.gpus, model, b.seed).live())
        }
        other => anyhow::bail!("unknown backend {other:?}: use nvml or sim"),
    })
}

/// Runs the agent until `keep_going` says stop, then does what `on_exit` says.
pub fn run(
    loaded: Loaded,
    backend: Box<dyn GpuBackend>,
    keep_going: &dyn Fn() -> bool,
    clock: &dyn Fn() -> Timestamp,
) -> Result<()> {
    let Loaded {
        config: cfg,
        rules,
        on_exit,
        state_file,
    } = loaded;
    let topics = Topics::new(&cfg.topic_prefix);
    let node = rules.node.clone();
    let key = rules.key.clone();
    let t = NodeTopics {
        gpus: topics.topic(&node, Channel::Gpus),
        health: topics.topic(&node, Channel::Health),
        cmd: topics.topic(&node, Channel::Cmd),
        ack: topics.topic(&node, Channel::Ack),
    };
    let mut core = Core::start(rules, backend, state_file, clock());
    if let Some(k) = &cfg.kubernetes {
        let pods = crate::pods::PodResources::start(k)
            .context("cannot start asking the kubelet for the pods' GPUs")?;
        core = core.with_pods(pods);
    }
    let (link, events) = open_link(&cfg, &node, &core, &t, clock)?;
    info!(node = %node, cmd = %t.cmd, interval_s = cfg.interval_s, dry_run = cfg.dry_run, fail_safe = core.rules().fail_safe.name(), "agent starting");
    let interval = Duration::from_secs_f64(cfg.interval_s);
    // systemd (Type=notify): ready once the link is opening; the watchdog is pinged
    // by this loop, so a loop that stalls is restarted
    let mut notify = crate::notify::Notifier::from_env();
    notify.ready(&format!("node {node}: reading the GPUs"));
    let mut agent = Running {
        core,
        link,
        t,
        key,
        clock,
        next: Instant::now(),
        reads_since_health: 0,
        last_health: String::new(),
    };
    let mut steps = StepWatch::new(clock(), Instant::now());
    while keep_going() {
        notify.watchdog();
        let wait = agent
            .next
            .saturating_duration_since(Instant::now())
            .min(Duration::from_millis(100));
        let event = events.recv_timeout(wait);
        // right after the wait, before the core reads the clock: a step during the
        // wait must not reach the leases first
        if let Some(step) = steps.check(clock(), Instant::now()) {
            agent.core.clock_stepped(step);
        }
        agent.on_event(event)?;
        if Instant::now() >= agent.next {
            agent.read(interval)?;
        }
    }
    notify.stopping();
    agent.stop(on_exit, &cfg.on_exit, &node)
}

/// Tells a step of the wall clock (NTP setting it, `date -s`) from time passing, by
/// the monotonic clock: checked at every turn of the loop (at least ten times a
/// second), a difference of a second or more between the two is a step. NTP's slewing
/// (at most 0.5 ms a second) never comes near it. A machine that was suspended counts
/// its sleep as a step forward (the monotonic clock stops while it sleeps): its leases
/// keep what was left of them, as for any step.
struct StepWatch {
    wall: Timestamp,
    mono: Instant,
}

impl StepWatch {
    const MIN_STEP_S: f64 = 1.0;

    fn new(wall: Timestamp, mono: Instant) -> Self {
        StepWatch { wall, mono }
    }

    /// The step since the last check, in seconds (positive: set forward).
    fn check(&mut self, wall: Timestamp, mono: Instant) -> Option<f64> {
        let elapsed = mono.saturating_duration_since(self.mono).as_secs_f64();
        let step = wall.secs_since(self.wall) - elapsed;
        self.wall = wall;
        self.mono = mono;
        (step.abs() >= Self::MIN_STEP_S).then_some(step)
    }
}

/// The topics of this node's channels.
struct NodeTopics {
    gpus: String,
    health: String,
    cmd: String,
    ack: String,
}

/// Opens the link to the broker: commands in, with a retained `offline` health as the
/// last will.
fn open_link(
    cfg: &AgentConfig,
    node: &str,
    core: &Core,
    t: &NodeTopics,
    clock: &dyn Fn() -> Timestamp,
) -> Result<(Link, std::sync::mpsc::Receiver<LinkEvent>)> {
    // the will has no time: the broker sends it when it notices the agent is gone
    let mut will = core.health("offline", clock(), Some("connection lost".into()));
    will.time = None;
    let mut mqtt = cfg.mqtt.clone();
    if mqtt.client_id.is_none() {
        mqtt.client_id = Some(format!("powerplane-agent-{node}"));
    }
    Ok(Link::open(
        &mqtt,
        vec![t.cmd.clone()],
        Some(Will {
            topic: t.health.clone(),
            payload: serde_json::to_vec(&will)?,
            retain: true,
        }),
    )?)
}

/// The running agent: its core, its link and when it reads the GPUs next.
struct Running<'a> {
    core: Core,
    link: Link,
    t: NodeTopics,
    key: Key,
    clock: &'a dyn Fn() -> Timestamp,
    next: Instant,
    reads_since_health: u32,
    last_health: String,
}

impl Running<'_> {
    fn publish_health(&mut self, status: &str) {
        let mut h = self.core.health(status, (self.clock)(), None);
        h.counters.insert(
            "mqtt_dropped".into(),
            self.link.dropped.load(std::sync::atomic::Ordering::Relaxed),
        );
        let json = serde_json::to_vec(&h).unwrap_or_default();
        self.link.publish(&self.t.health, json, true, true);
        self.last_health = h.status;
    }

    /// What the link brought (or a timeout): a connect, or a command to answer.
    fn on_event(&mut self, ev: Result<LinkEvent, std::sync::mpsc::RecvTimeoutError>) -> Result<()> {
        match ev {
            Ok(LinkEvent::Connected) => self.publish_health("online"),
            Ok(LinkEvent::Message { topic, payload }) if topic == self.t.cmd => {
                // a message that fails its signature check gets no answer
                if let Some(ack) = self.core.answer(&payload, (self.clock)()) {
                    self.link
                        .publish(&self.t.ack, ack.seal(&self.key), true, false);
                    // show a new state at once (not for rejections: garbage must not
                    // make the agent read its GPUs on demand)
                    if ack.status != telemetry::agent_proto::AckStatus::Rejected {
                        self.next = Instant::now();
                    }
                }
            }
            Ok(_) | Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                anyhow::bail!("the MQTT thread stopped")
            }
        }
        Ok(())
    }

    /// Reads the GPUs and publishes the report (and the health when it changed or 30
    /// reads went by); the next read is an interval later.
    fn read(&mut self, interval: Duration) -> Result<()> {
        let report = self.core.tick((self.clock)());
        self.link
            .publish(&self.t.gpus, serde_json::to_vec(&report)?, false, false);
        self.reads_since_health += 1;
        let status = self.core.health("online", (self.clock)(), None).status;
        if self.reads_since_health >= 30 || status != self.last_health {
            self.publish_health("online");
            self.reads_since_health = 0;
        }
        self.next += interval;
        if self.next < Instant::now() {
            warn!(
                behind_ms = (Instant::now() - self.next).as_millis() as u64,
                "reading the GPUs took longer than the interval"
            );
            self.next = Instant::now() + interval;
        }
        Ok(())
    }

    /// Does what `on_exit` says, publishes the last report and a `stopped` health, and
    /// closes the link.
    fn stop(mut self, on_exit: OnExit, on_exit_name: &str, node: &str) -> Result<()> {
        self.core.shutdown(on_exit, (self.clock)());
        let report = self.core.tick((self.clock)());
        self.link
            .publish(&self.t.gpus, serde_json::to_vec(&report)?, true, false);
        let h = self.core.health(
            "stopped",
            (self.clock)(),
            Some(format!("stopped on request (on_exit = {on_exit_name})")),
        );
        self.link
            .publish(&self.t.health, serde_json::to_vec(&h)?, true, true);
        info!(node = %node, counters = ?self.core.counters, "agent stopped");
        self.link.close(Duration::from_millis(300));
        Ok(())
    }
}

pub use common::resolve;

/// Runs with a wall clock and the given stop flag.
pub fn run_wall(
    loaded: Loaded,
    backend: Box<dyn GpuBackend>,
    keep_going: &dyn Fn() -> bool,
) -> Result<()> {
    run(loaded, backend, keep_going, &wall_clock)
}

#[cfg(test)]
mod step_tests {
    use super::StepWatch;
    use std::time::{Duration, Instant};
    use telemetry::Timestamp;

    #[test]
    fn steps_are_told_from_time_passing_and_from_slewing() {
        let m0 = Instant::now();
        let w0 = Timestamp::from_secs(1_700_000_000);
        let mut w = StepWatch::new(w0, m0);
        // time passing, a slow turn of the loop included: no step
        assert_eq!(
            w.check(w0.plus_secs(0.1), m0 + Duration::from_millis(100)),
            None
        );
        assert_eq!(
            w.check(w0.plus_secs(5.1), m0 + Duration::from_millis(5100)),
            None
        );
        // slewing at NTP's most (500 ppm) over an hour of turns: never a step
        let mut wall = w0.plus_secs(5.1);
        let mut mono = m0 + Duration::from_millis(5100);
        for _ in 0..36_000 {
            wall = wall.plus_secs(0.1 * 1.0005);
            mono += Duration::from_millis(100);
            assert_eq!(w.check(wall, mono), None);
        }
        // set back an hour
        mono += Duration::from_millis(100);
        let back = w
            .check(wall.plus_secs(-3600.0 + 0.1), mono)
            .expect("a step");
        assert!((back + 3600.0).abs() < 0.01, "{back}");
        // set forward ten minutes
        mono += Duration::from_millis(100);
        let fwd = w
            .check(wall.plus_secs(-3600.0 + 0.2 + 600.0), mono)
            .expect("a step");
        assert!((fwd - 600.0).abs() < 0.01, "{fwd}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_example_config_loads_with_a_key() {
        let example = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../examples/agent/agent.toml"
        );
        let text = std::fs::read_to_string(example).expect("example");
        let dir = tempfile::tempdir().expect("tmp");
        std::fs::write(dir.path().join("site.key"), "0f".repeat(32)).expect("key");
        let text = text.replace("/etc/powerplane/site.key", "site.key");
        std::fs::write(dir.path().join("agent.toml"), text).expect("cfg");
        let l = load(&dir.path().join("agent.toml"), false).expect("the example is valid");
        assert_eq!(l.config.backend.kind, "nvml");
        assert_eq!(l.rules.fail_safe, FailSafe::RestoreDefault);
        assert_eq!(l.on_exit, OnExit::RestoreDefault);
        assert_eq!(l.config.mqtt.url, "mqtt://controller.example:1883");
        assert!(l.config.kubernetes.is_none(), "no [kubernetes]: not asked");
    }

    fn load_with(extra: &str) -> Result<Loaded> {
        let dir = tempfile::tempdir().expect("tmp");
        std::fs::write(dir.path().join("site.key"), "0f".repeat(32)).expect("key");
        let text = format!(
            "node = \"n1\"\nkey_file = \"site.key\"\n[mqtt]\nurl = \"mqtt://127.0.0.1:1883\"\n{extra}"
        );
        std::fs::write(dir.path().join("agent.toml"), text).expect("cfg");
        load(&dir.path().join("agent.toml"), false)
    }

    #[test]
    fn the_kubernetes_table_has_defaults_and_is_checked() {
        let l = load_with("[kubernetes]\n").expect("an empty table takes the defaults");
        let k = l.config.kubernetes.expect("asked");
        assert_eq!(
            k.pod_resources_socket,
            PathBuf::from("/var/lib/kubelet/pod-resources/kubelet.sock")
        );
        assert_eq!(k.resource_names, vec!["nvidia.com/gpu".to_string()]);
        assert_eq!((k.refresh_s, k.timeout_s), (10.0, 2.0));

        let l = load_with(
            "[kubernetes]\npod_resources_socket = \"/run/k.sock\"\nresource_names = [\"nvidia.com/gpu\", \"nvidia.com/mig-1g.10gb\"]\nrefresh_s = 5\ntimeout_s = 1.5\n",
        )
        .expect("valid");
        let k = l.config.kubernetes.expect("asked");
        assert_eq!(k.pod_resources_socket, PathBuf::from("/run/k.sock"));
        assert_eq!(k.resource_names.len(), 2);
        assert_eq!((k.refresh_s, k.timeout_s), (5.0, 1.5));

        for (extra, says) in [
            ("[kubernetes]\nsocket = \"/x\"\n", "unknown field `socket`"),
            ("[kubernetes]\nrefresh_s = 0\n", "refresh_s must be within"),
            (
                "[kubernetes]\ntimeout_s = 20\n",
                "timeout_s must be above 0 and at most refresh_s",
            ),
            (
                "[kubernetes]\nresource_names = []\n",
                "resource_names must name",
            ),
        ] {
            let e = format!("{:#}", load_with(extra).err().expect(extra));
            assert!(e.contains(says), "{extra}: {e}");
        }
    }
}
