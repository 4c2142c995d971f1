//! `powerplane.toml`: the controller's config, read and checked in one pass. Every
//! problem of the file's shape (unknown keys, wrong types) is reported with its
//! position, then its values and the problems of every file it names (site, policy,
//! mapping, feeds, keys, tokens), all at once, before anything starts.
//!
//! Where it sits: first in `serve` (config → control → actuate → http → serve), and
//! in the tools that read the same file (`report`, `telemetry probe`).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use integrations::prices::Series;
use policies::Policy;
use serde::Deserialize;
use sources::mqtt::MqttConfig;
use telemetry::mapping::Mapping;
use telemetry::Site;

pub use control::cadence::{DEFAULT_EVENT_DEBOUNCE_MS, DEFAULT_EVENT_MAX_PER_S};
pub use control::feeds::FeedFormat;
pub use runtime::paths::resolve;
pub use runtime::prices::{CarbonSection, PricesSection};
pub use runtime::redfish::RedfishSection;

/// `powerplane.toml`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub controller: ControllerConfig,
    #[serde(default)]
    pub store: StoreConfig,
    #[serde(default)]
    pub mqtt: Option<MqttSection>,
    #[serde(default)]
    pub redfish: Option<RedfishSection>,
    #[serde(default)]
    pub prices: Option<PricesSection>,
    /// Command the GPU node agents (without it, caps are observe-only).
    #[serde(default)]
    pub agents: Option<AgentsSection>,
    /// `/metrics` and the JSON API.
    #[serde(default)]
    pub http: Option<api::HttpSection>,
    /// The schedulers to steer (without it, holds are observe-only).
    #[serde(default)]
    pub schedulers: Option<runtime::schedulers::SchedulersSection>,
    /// Several replicas, one leader (see [`runtime::ha`]).
    #[serde(default)]
    pub ha: Option<runtime::ha::HaSection>,
    /// Power nodes down and up through Slurm's power saving or Redfish (see
    /// [`crate`]).
    #[serde(default)]
    pub node_power: Option<runtime::node_power::worker::NodePowerSection>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentsSection {
    /// The site key the agents share (hex, `openssl rand -hex 32`).
    pub key_file: PathBuf,
    #[serde(default = "default_lease")]
    pub lease_s: f64,
    #[serde(default = "default_renew")]
    pub renew_s: f64,
    #[serde(default = "default_retry")]
    pub retry_s: f64,
    #[serde(default = "default_topic_prefix")]
    pub topic_prefix: String,
    /// Rewritten every tick: per GPU the desired, acknowledged and enforced state.
    #[serde(default)]
    pub status_file: Option<PathBuf>,
    pub mqtt: MqttConfig,
}

fn default_lease() -> f64 {
    90.0
}
fn default_renew() -> f64 {
    30.0
}
fn default_retry() -> f64 {
    5.0
}
fn default_topic_prefix() -> String {
    telemetry::agent_proto::DEFAULT_PREFIX.into()
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ControllerConfig {
    pub site: PathBuf,
    pub policy: PathBuf,
    #[serde(default = "default_tick")]
    pub tick_s: f64,
    #[serde(default = "default_ledger")]
    pub ledger_interval_s: f64,
    /// Samples the buffer holds between ticks; beyond it the oldest are dropped.
    #[serde(default = "default_buffer")]
    pub buffer_samples: usize,
    /// How often to look at the policy file for edits (0: only on SIGHUP).
    #[serde(default = "default_policy_reload")]
    pub policy_reload_s: f64,
    /// Event-driven evaluation: a sample crossing a threshold of the policy is
    /// evaluated this long after the first crossing (a burst is one evaluation).
    #[serde(default = "default_event_debounce")]
    pub event_debounce_ms: f64,
    /// At most this many event-driven evaluations per second (0: only ticks).
    #[serde(default = "default_event_rate")]
    pub event_max_per_s: f64,
}

fn default_event_debounce() -> f64 {
    DEFAULT_EVENT_DEBOUNCE_MS
}
fn default_event_rate() -> f64 {
    DEFAULT_EVENT_MAX_PER_S
}

fn default_policy_reload() -> f64 {
    runtime::reload::DEFAULT_RELOAD_S
}

fn default_tick() -> f64 {
    15.0
}
fn default_ledger() -> f64 {
    60.0
}
fn default_buffer() -> usize {
    200_000
}

#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields, tag = "kind", rename_all = "snake_case")]
pub enum StoreConfig {
    #[default]
    Memoryless,
    Embedded {
        path: PathBuf,
    },
    Redis(runtime::store_open::RedisStoreConfig),
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MqttSection {
    pub mapping: PathBuf,
    #[serde(flatten)]
    pub client: MqttConfig,
}

fn read(path: &Path, base: &Path) -> Result<(String, String)> {
    let p = resolve(base, path);
    let text =
        std::fs::read_to_string(&p).with_context(|| format!("cannot read {}", p.display()))?;
    Ok((p.display().to_string(), text))
}

/// Everything `serve` needs, read and checked.
pub struct Loaded {
    pub config: Config,
    pub site: Site,
    pub policy: Policy,
    pub mapping: Option<Mapping>,
    /// Price and carbon series.
    pub prices: Option<(Series, Series)>,
}

/// Loads and checks everything the config names; every problem is an error here,
/// before anything starts, and all of them are reported at once: the config's own
/// (shape and values) and those of every file it names (site, policy, mapping, feeds,
/// keys).
pub fn load(config_path: &Path) -> Result<Loaded> {
    let base = config_path.parent().unwrap_or(Path::new("."));
    let (name, text) = read(config_path, Path::new("."))?;
    // every problem of the file's shape at once, as file:line:col
    let mut cfg: Config =
        telemetry::diag::parse_all(&name, &text).map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut problems = Problems::default();
    // secrets from their files (`*_file`), read once here
    if let Some(m) = cfg.mqtt.as_mut() {
        let r = m.client.read_secrets(base);
        problems.take(r.map_err(|e| anyhow::anyhow!("{name}: [mqtt] {e}")));
    }
    for e in cfg.redfish.iter_mut().flat_map(|r| r.endpoints.iter_mut()) {
        let r = e.auth.read_secrets(base);
        let endpoint = e.name.clone();
        problems
            .take(r.map_err(|m| anyhow::anyhow!("{name}: [[redfish.endpoints]] {endpoint}: {m}")));
    }
    if let Some(a) = cfg.agents.as_mut() {
        let r = a.mqtt.read_secrets(base);
        problems.take(r.map_err(|e| anyhow::anyhow!("{name}: [agents.mqtt] {e}")));
    }
    if let StoreConfig::Redis(r) = &cfg.store {
        problems.take(r.url(base).map_err(|e| anyhow::anyhow!("{name}: {e}")));
    }
    let site = problems.take(
        read(&cfg.controller.site, base)
            .and_then(|(n, t)| Site::parse(&n, &t).map_err(|e| anyhow::anyhow!("{e}"))),
    );
    // checked against the site, as a reload is
    let policy =
        site.as_ref().and_then(|site| {
            problems.take(read(&cfg.controller.policy, base).and_then(|(n, t)| {
                runtime::reload::validate(&n, &t, site).map_err(anyhow::Error::msg)
            }))
        });
    let mapping = cfg.mqtt.as_ref().and_then(|m| {
        problems.take(
            read(&m.mapping, base)
                .and_then(|(n, t)| Mapping::parse(&n, &t).map_err(|e| anyhow::anyhow!("{e}"))),
        )
    });
    let prices = match &cfg.prices {
        Some(p) => problems.take(load_prices(p, &name, base)),
        None => None,
    };
    if let Some(r) = &cfg.redfish {
        let checked = runtime::redfish::check(r);
        problems.take(checked.map_err(|e| anyhow::anyhow!("{name}: {e}")));
    }
    if let (Some(r), Some(site)) = (&cfg.redfish, &site) {
        let r = control::admit::check_redfish(&r.endpoints, site);
        problems.take(r.map_err(|e| anyhow::anyhow!("{name}: {e}")));
    }
    if let Some(site) = &site {
        let r = attach_bindings(&mut cfg, site, &name);
        problems.take(r);
    }
    if let (Some(np), Some(site)) = (&cfg.node_power, &site) {
        for p in np.problems(site) {
            problems.check(false, || format!("{name}: {p}"));
        }
    }
    check_values(&cfg, &name, base, &mut problems);
    problems.finish()?;
    match (site, policy) {
        (Some(site), Some(policy)) => Ok(Loaded {
            config: cfg,
            site,
            policy,
            mapping,
            prices: prices.flatten(),
        }),
        _ => anyhow::bail!("{name}: the site or the policy did not load"),
    }
}

/// Hands each endpoint the site's `[[redfish]]` bindings of it; a binding of an
/// endpoint the config does not name is an error.
fn attach_bindings(cfg: &mut Config, site: &Site, name: &str) -> Result<()> {
    let endpoints = cfg
        .redfish
        .as_mut()
        .map(|r| r.endpoints.as_mut_slice())
        .unwrap_or_default();
    let mut problems = Vec::new();
    for b in &site.redfish {
        match endpoints.iter_mut().find(|e| e.name == b.endpoint) {
            Some(e) => e.bind.push(b.clone()),
            None => problems.push(format!(
                "{}: [[redfish]] endpoint {:?}: {name} has no such [[redfish.endpoints]]",
                b.at, b.endpoint
            )),
        }
    }
    anyhow::ensure!(problems.is_empty(), "{}", problems.join("\n"));
    Ok(())
}

/// Every problem `load` finds, reported together.
#[derive(Default)]
struct Problems(Vec<String>);

impl Problems {
    fn take<T>(&mut self, r: Result<T>) -> Option<T> {
        r.map_err(|e| self.0.push(format!("{e:#}"))).ok()
    }

    fn check(&mut self, ok: bool, msg: impl FnOnce() -> String) {
        if !ok {
            self.0.push(msg());
        }
    }

    fn finish(self) -> Result<()> {
        match self.0.is_empty() {
            true => Ok(()),
            false => Err(anyhow::anyhow!("{}", self.0.join("\n"))),
        }
    }
}

/// The price and carbon series of `[prices]` (None: fetched from its URL later).
fn load_prices(p: &PricesSection, name: &str, base: &Path) -> Result<Option<(Series, Series)>> {
    let (price, n, t) = match (&p.file, &p.url) {
        (Some(f), None) => {
            let (n, t) = read(f, base)?;
            (p.format.read(&n, &t, "price_per_kwh")?, n, t)
        }
        // fetched by `serve` once it runs; until then the tariff applies
        (None, Some(_)) => (Series::default(), String::new(), String::new()),
        _ => anyhow::bail!("{name}: [prices] needs one of file or url"),
    };
    anyhow::ensure!(
        p.refresh_s >= 10.0 && p.stale_after_s > 0.0,
        "{name}: [prices] refresh_s must be at least 10 and stale_after_s above 0"
    );
    let carbon = match &p.carbon {
        Some(c) => {
            let (n, t) = read(&c.file, base)?;
            c.format.read(&n, &t, "carbon_g_per_kwh")?
        }
        None if p.format.format.is_none() && !t.is_empty() => {
            Series::from_csv(&n, &t, "carbon_g_per_kwh").unwrap_or_default()
        }
        None => Series::default(),
    };
    Ok(Some((price, carbon)))
}

/// The config's values that its shape cannot say: ranges, relations, readable keys.
fn check_values(cfg: &Config, name: &str, base: &Path, problems: &mut Problems) {
    if let Some(a) = &cfg.agents {
        problems.check(
            a.retry_s > 0.0 && a.retry_s <= a.renew_s && a.renew_s * 2.0 <= a.lease_s,
            || format!(
                "{name}: [agents] needs 0 < retry_s <= renew_s <= lease_s / 2 (got retry_s = {}, renew_s = {}, lease_s = {}): a lease must survive a missed renewal",
                a.retry_s, a.renew_s, a.lease_s
            ),
        );
        // commands go out on ticks: a renewal may wait up to one tick
        problems.check(a.renew_s * 2.0 + cfg.controller.tick_s <= a.lease_s, || {
            format!(
                "{name}: [agents] lease_s ({}) must be at least 2 × renew_s + controller.tick_s ({}), or leases lapse between ticks",
                a.lease_s,
                a.renew_s * 2.0 + cfg.controller.tick_s
            )
        });
        problems.take(agent::run::read_key(&resolve(base, &a.key_file)));
    }
    if let Some(h) = &cfg.http {
        problems.take(api::load_tokens(h, base));
        problems.take(api::server::check(h, base).map_err(anyhow::Error::from));
    }
    if let Some(s) = &cfg.schedulers {
        problems.take(runtime::schedulers::check(s, name, base));
    }
    if let Some(ha) = &cfg.ha {
        let redis = matches!(cfg.store, StoreConfig::Redis(_));
        let agents = cfg.agents.as_ref().map(|a| a.lease_s);
        for p in runtime::ha::problems(ha, redis, agents, cfg.controller.tick_s) {
            problems.check(false, || format!("{name}: {p}"));
        }
    }
    let reload = cfg.controller.policy_reload_s;
    problems.check(reload == 0.0 || (0.1..=3600.0).contains(&reload), || {
        format!("{name}: controller.policy_reload_s must be 0 (only on SIGHUP) or within 0.1..=3600, got {reload}")
    });
    let tick = cfg.controller.tick_s;
    problems.check((0.1..=3600.0).contains(&tick), || {
        format!("{name}: controller.tick_s must be within 0.1..=3600, got {tick}")
    });
    let debounce = cfg.controller.event_debounce_ms;
    problems.check((0.0..=10_000.0).contains(&debounce), || {
        format!("{name}: controller.event_debounce_ms must be within 0..=10000, got {debounce}")
    });
    let rate = cfg.controller.event_max_per_s;
    problems.check((0.0..=100.0).contains(&rate), || {
        format!(
            "{name}: controller.event_max_per_s must be within 0..=100 (0: only ticks), got {rate}"
        )
    });
}
