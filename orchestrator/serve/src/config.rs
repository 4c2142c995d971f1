//! `powerplane.toml`: the controller's config, read and checked in one pass. Every
//! problem of the file's shape (unknown keys, wrong types) is reported with its
//! position, then its values and the problems of every file it names (site, policy,
//! mapping, feeds, keys, tokens), all at once, before anything starts.
//!
//! Where it sits: first in `serve` (config → control → actuate → http → serve), and
//! in the tools that read the same file (`report`, `telemetry probe`).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use policies::Policy;
use serde::Deserialize;
use sources::mqtt::MqttConfig;
use telemetry::mapping::Mapping;
use telemetry::prices::Series;
use telemetry::Site;

pub use control::cadence::{DEFAULT_EVENT_DEBOUNCE_MS, DEFAULT_EVENT_MAX_PER_S};
pub use control::feeds::FeedFormat;
pub use runtime::mqtt::MqttSection;
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
    /// Follow the grid: a VEN's events, operators' targets (see [`runtime::grid`]).
    #[serde(default)]
    pub demand_response: Option<runtime::grid::DemandResponseSection>,
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
    Embedded(runtime::store_open::EmbeddedStoreConfig),
    Redis(runtime::store_open::RedisStoreConfig),
    Postgres(runtime::store_open::PostgresStoreConfig),
}

impl StoreConfig {
    /// The bound on the writes that wait in memory for a store that takes nothing
    /// (`[store] max_waiting_mib`), in bytes.
    pub fn max_waiting_bytes(&self) -> usize {
        let mib = match self {
            StoreConfig::Memoryless => runtime::store_open::default_max_waiting_mib(),
            StoreConfig::Embedded(e) => e.max_waiting_mib,
            StoreConfig::Redis(r) => r.max_waiting_mib,
            StoreConfig::Postgres(p) => p.max_waiting_mib,
        };
        usize::try_from(mib.saturating_mul(1 << 20)).unwrap_or(usize::MAX)
    }
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
/// before anything starts, and all of them are reported at once, in one pass: the
/// shape problems first (unknown keys, wrong types: each `file:line:col`), then, on
/// what reads once they are set aside, its values and the problems of every file it
/// names (site, policy, mapping, feeds, keys), by position (the key they are about;
/// a named file's own problems keep their own positions).
pub fn load(config_path: &Path) -> Result<Loaded> {
    let base = config_path.parent().unwrap_or(Path::new("."));
    let (name, text) = read(config_path, Path::new("."))?;
    let shape = telemetry::diag::read_all::<Config>(&text);
    let mut problems = Problems::new(&name, &text, &shape.text);
    problems.shape = shape.problems;
    let Some(mut cfg) = shape.value else {
        return Err(problems
            .finish()
            .err()
            .unwrap_or_else(|| anyhow::anyhow!("{name}:1:1: the file could not be read")));
    };
    read_secrets(&mut cfg, base, &mut problems);
    let site = problems
        .at(&["controller", "site"])
        .take_file(read(&cfg.controller.site, base), |(n, t)| {
            Site::parse(&n, &t).map_err(|e| anyhow::anyhow!("{e}"))
        });
    // checked against the site, as a reload is
    let policy = site.as_ref().and_then(|site| {
        problems
            .at(&["controller", "policy"])
            .take_file(read(&cfg.controller.policy, base), |(n, t)| {
                runtime::reload::validate(&n, &t, site).map_err(anyhow::Error::msg)
            })
    });
    let mapping = cfg.mqtt.as_ref().and_then(|m| {
        problems
            .at(&["mqtt", "mapping"])
            .take_file(read(&m.mapping, base), |(n, t)| {
                Mapping::parse(&n, &t).map_err(|e| anyhow::anyhow!("{e}"))
            })
    });
    let prices = match &cfg.prices {
        Some(p) => problems.at(&["prices"]).take(load_prices(p, &name, base)),
        None => None,
    };
    if let Some(p) = &cfg.prices {
        let ok = p.refresh_s >= 10.0 && p.stale_after_s > 0.0;
        problems.at(&["prices", "refresh_s"]).check(ok, || {
            format!("{name}: [prices] refresh_s must be at least 10 and stale_after_s above 0")
        });
        if let Some(c) = &p.carbon {
            problems
                .at(&["prices", "carbon", "refresh_s"])
                .check(c.refresh_s >= 10.0, || {
                    format!("{name}: [prices.carbon] refresh_s must be at least 10")
                });
        }
    }
    check_against_site(&mut cfg, site.as_ref(), &name, &mut problems);
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

/// Secrets from their files (`*_file`), read once here.
fn read_secrets(cfg: &mut Config, base: &Path, problems: &mut Problems) {
    if let Some(m) = cfg.mqtt.as_mut() {
        let r = m.client.read_secrets(base);
        let name = problems.name.clone();
        problems
            .at(&["mqtt"])
            .take(r.map_err(|e| anyhow::anyhow!("{name}: [mqtt] {e}")));
    }
    let resolve = |p: &str| {
        runtime::paths::resolve(base, Path::new(p))
            .display()
            .to_string()
    };
    for e in cfg.redfish.iter_mut().flat_map(|r| r.endpoints.iter_mut()) {
        e.tls = e.tls.resolved(resolve);
        let r = e.auth.read_secrets(base);
        let (name, endpoint) = (problems.name.clone(), e.name.clone());
        problems
            .at(&["redfish", "endpoints"])
            .take(r.map_err(|m| anyhow::anyhow!("{name}: [[redfish.endpoints]] {endpoint}: {m}")));
    }
    if let Some(p) = cfg.prices.as_mut() {
        let name = problems.name.clone();
        p.tls = p.tls.resolved(resolve);
        if p.url.is_some() {
            let r = sources::tls::client_config(&p.tls);
            problems
                .at(&["prices", "tls"])
                .take(r.map_err(|e| anyhow::anyhow!("{name}: [prices] {e}")));
        }
        let r = p.auth.read_secrets(base);
        problems
            .at(&["prices", "auth"])
            .take(r.map_err(|e| anyhow::anyhow!("{name}: [prices] auth: {e}")));
        if let Some(c) = p.carbon.as_mut() {
            c.tls = c.tls.resolved(resolve);
            if c.url.is_some() {
                let r = sources::tls::client_config(&c.tls);
                problems
                    .at(&["prices", "carbon", "tls"])
                    .take(r.map_err(|e| anyhow::anyhow!("{name}: [prices.carbon] {e}")));
            }
            let r = c.auth.read_secrets(base);
            problems
                .at(&["prices", "carbon", "auth"])
                .take(r.map_err(|e| anyhow::anyhow!("{name}: [prices.carbon] auth: {e}")));
        }
    }
    if let Some(dr) = cfg.demand_response.as_mut() {
        demand_response_secrets(dr, base, &resolve, problems);
    }
    if let Some(np) = cfg.node_power.as_mut() {
        np.tls = np.tls.resolved(resolve);
        let r = np.auth.read_secrets(base);
        let name = problems.name.clone();
        problems
            .at(&["node_power", "auth"])
            .take(r.map_err(|e| anyhow::anyhow!("{name}: [node_power] {e}")));
    }
    if let Some(a) = cfg.agents.as_mut() {
        let r = a.mqtt.read_secrets(base);
        let name = problems.name.clone();
        problems
            .at(&["agents", "mqtt"])
            .take(r.map_err(|e| anyhow::anyhow!("{name}: [agents.mqtt] {e}")));
    }
    let url = match &cfg.store {
        StoreConfig::Redis(r) => Some(r.url(base)),
        StoreConfig::Postgres(p) => Some(p.target(base).map(|_| String::new())),
        _ => None,
    };
    if let Some(url) = url {
        let name = problems.name.clone();
        problems
            .at(&["store"])
            .take(url.map_err(|e| anyhow::anyhow!("{name}: {e}")));
    }
}

/// `[demand_response]`: its TLS files resolved and tried, its client secret read, its
/// problems told.
fn demand_response_secrets(
    dr: &mut runtime::grid::DemandResponseSection,
    base: &Path,
    resolve: &dyn Fn(&str) -> String,
    problems: &mut Problems,
) {
    let name = problems.name.clone();
    dr.tls = dr.tls.resolved(resolve);
    if dr.vtn_url.is_some() {
        let r = sources::tls::client_config(&dr.tls);
        problems
            .at(&["demand_response", "tls"])
            .take(r.map_err(|e| anyhow::anyhow!("{name}: [demand_response] {e}")));
    }
    let r = dr.read_secrets(base);
    problems
        .at(&["demand_response", "client_secret_file"])
        .take(r.map_err(|e| anyhow::anyhow!("{name}: [demand_response] client_secret_file: {e}")));
    for p in dr.problems() {
        problems
            .at(&["demand_response"])
            .check(false, || format!("{name}: [demand_response] {p}"));
    }
}

/// What the config says that the site must agree with: the Redfish endpoints and
/// their bindings, and the nodes `[node_power]` names.
fn check_against_site(cfg: &mut Config, site: Option<&Site>, name: &str, problems: &mut Problems) {
    if let Some(r) = &cfg.redfish {
        let checked = runtime::redfish::check(r);
        problems
            .at(&["redfish"])
            .take(checked.map_err(|e| anyhow::anyhow!("{name}: {e}")));
    }
    let Some(site) = site else {
        return;
    };
    if let Some(r) = &cfg.redfish {
        let r = runtime::redfish::check_redfish(&r.endpoints, site);
        problems
            .at(&["redfish", "endpoints"])
            .take(r.map_err(|e| anyhow::anyhow!("{name}: {e}")));
    }
    let r = attach_bindings(cfg, site, name);
    problems.at(&["redfish"]).take(r);
    if let Some(np) = &cfg.node_power {
        for p in np.problems(site) {
            problems
                .at(&["node_power"])
                .check(false, || format!("{name}: {p}"));
        }
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

/// Every problem `load` finds, reported together: the shape problems first, then the
/// others by the position of the key each is about. A problem that names this file
/// (`powerplane.toml: ...`) is printed at its key's `line:col`; the problems of a file
/// it names keep their own positions.
struct Problems<'a> {
    name: String,
    src: &'a str,
    /// The config's keys and their spans (of the text with the shape problems set
    /// aside, whose positions are the source's).
    keys: Option<toml::Spanned<toml::de::DeTable<'a>>>,
    shape: Vec<telemetry::diag::Problem>,
    found: Vec<(usize, String)>,
}

/// Where the next problems are about: a byte offset of the source.
struct At<'p, 'a> {
    problems: &'p mut Problems<'a>,
    offset: usize,
}

impl<'a> Problems<'a> {
    fn new(name: &str, src: &'a str, set_aside: &'a str) -> Self {
        Problems {
            name: name.to_string(),
            src,
            keys: toml::de::DeTable::parse(set_aside).ok(),
            shape: Vec::new(),
            found: Vec::new(),
        }
    }

    /// The problems about the key at `path` (or, where the file does not write it,
    /// the nearest table above it that it does; the file's start when none).
    fn at<'p>(&'p mut self, path: &[&str]) -> At<'p, 'a> {
        let offset = self
            .keys
            .as_ref()
            .map_or(0, |t| key_offset(t.get_ref(), path).unwrap_or(0));
        At {
            problems: self,
            offset,
        }
    }

    fn finish(mut self) -> Result<()> {
        if self.shape.is_empty() && self.found.is_empty() {
            return Ok(());
        }
        // stable: problems about one key keep the order they were found in
        self.shape.sort_by_key(|p| (p.line, p.col));
        self.found.sort_by_key(|(offset, _)| *offset);
        let name = &self.name;
        let own = format!("{name}: ");
        let mut lines: Vec<String> = self
            .shape
            .iter()
            .map(|p| format!("{name}:{}:{}: {}", p.line, p.col, p.message))
            .collect();
        for (offset, text) in &self.found {
            match text.strip_prefix(&own) {
                Some(message) => {
                    let (line, col) = telemetry::diag::line_col(self.src, *offset);
                    lines.push(format!("{name}:{line}:{col}: {message}"));
                }
                None => lines.push(text.clone()),
            }
        }
        Err(anyhow::anyhow!("{}", lines.join("\n")))
    }
}

impl At<'_, '_> {
    fn take<T>(self, r: Result<T>) -> Option<T> {
        let offset = self.offset;
        r.map_err(|e| self.problems.found.push((offset, format!("{e:#}"))))
            .ok()
    }

    /// A file the config names, read (`file`) and then parsed.
    fn take_file<T>(
        self,
        file: Result<(String, String)>,
        parse: impl FnOnce((String, String)) -> Result<T>,
    ) -> Option<T> {
        self.take(file.and_then(parse))
    }

    fn check(self, ok: bool, msg: impl FnOnce() -> String) {
        if !ok {
            self.problems.found.push((self.offset, msg()));
        }
    }
}

/// The offset of the key at `path`, or of the deepest table on the way that the file
/// writes (an array of tables: its first).
fn key_offset(root: &toml::de::DeTable<'_>, path: &[&str]) -> Option<usize> {
    let mut table = root;
    let mut found = None;
    for key in path {
        let (k, v) = table.iter().find(|(k, _)| &**k.get_ref() == *key)?;
        found = Some(k.span().start);
        table = match v.get_ref() {
            toml::de::DeValue::Table(t) => t,
            toml::de::DeValue::Array(a) => match a.first().map(|v| v.get_ref()) {
                Some(toml::de::DeValue::Table(t)) => t,
                _ => return found,
            },
            _ => return found,
        };
    }
    found
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
    let carbon = match &p.carbon {
        Some(c) => match (&c.file, &c.url) {
            (Some(f), None) => {
                let (n, t) = read(f, base)?;
                c.format.read(&n, &t, "carbon_g_per_kwh")?
            }
            // fetched by `serve` once it runs
            (None, Some(_)) => Series::default(),
            _ => anyhow::bail!("{name}: [prices.carbon] needs one of file or url"),
        },
        None if p.format.format.is_none() && !t.is_empty() => {
            Series::from_csv(&n, &t, "carbon_g_per_kwh").unwrap_or_default()
        }
        None => Series::default(),
    };
    Ok(Some((price, carbon)))
}

/// The config's values that its shape cannot say: ranges, relations, readable keys.
fn check_values(cfg: &Config, name: &str, base: &Path, problems: &mut Problems) {
    if let Some(m) = &cfg.mqtt {
        if let Err(sources::mqtt::MqttConfigError::BadSparkplugLimit(what)) =
            m.client.sparkplug_limits()
        {
            problems
                .at(&["mqtt"])
                .check(false, || format!("{name}: [mqtt] {what}"));
        }
    }
    if let Some(a) = &cfg.agents {
        problems.at(&["agents"]).check(
            a.retry_s > 0.0 && a.retry_s <= a.renew_s && a.renew_s * 2.0 <= a.lease_s,
            || format!(
                "{name}: [agents] needs 0 < retry_s <= renew_s <= lease_s / 2 (got retry_s = {}, renew_s = {}, lease_s = {}): a lease must survive a missed renewal",
                a.retry_s, a.renew_s, a.lease_s
            ),
        );
        // commands go out on ticks: a renewal may wait up to one tick
        let lease = problems.at(&["agents", "lease_s"]);
        lease.check(a.renew_s * 2.0 + cfg.controller.tick_s <= a.lease_s, || {
            format!(
                "{name}: [agents] lease_s ({}) must be at least 2 × renew_s + controller.tick_s ({}), or leases lapse between ticks",
                a.lease_s,
                a.renew_s * 2.0 + cfg.controller.tick_s
            )
        });
        problems
            .at(&["agents", "key_file"])
            .take(agent::run::read_key(&resolve(base, &a.key_file)));
    }
    if let Some(h) = &cfg.http {
        problems.at(&["http"]).take(api::load_tokens(h, base));
        problems
            .at(&["http"])
            .take(api::server::check(h, base).map_err(anyhow::Error::from));
    }
    if let Some(s) = &cfg.schedulers {
        problems
            .at(&["schedulers"])
            .take(runtime::schedulers::check(s, name, base));
    }
    if let Some(ha) = &cfg.ha {
        let shared = matches!(cfg.store, StoreConfig::Redis(_) | StoreConfig::Postgres(_));
        let agents = cfg.agents.as_ref().map(|a| a.lease_s);
        for p in runtime::ha::problems(ha, shared, agents, cfg.controller.tick_s) {
            problems.at(&["ha"]).check(false, || format!("{name}: {p}"));
        }
    }
    let reload = cfg.controller.policy_reload_s;
    let at = problems.at(&["controller", "policy_reload_s"]);
    at.check(reload == 0.0 || (0.1..=3600.0).contains(&reload), || {
        format!("{name}: controller.policy_reload_s must be 0 (only on SIGHUP) or within 0.1..=3600, got {reload}")
    });
    let tick = cfg.controller.tick_s;
    let at = problems.at(&["controller", "tick_s"]);
    at.check((0.1..=3600.0).contains(&tick), || {
        format!("{name}: controller.tick_s must be within 0.1..=3600, got {tick}")
    });
    let debounce = cfg.controller.event_debounce_ms;
    let at = problems.at(&["controller", "event_debounce_ms"]);
    at.check((0.0..=10_000.0).contains(&debounce), || {
        format!("{name}: controller.event_debounce_ms must be within 0..=10000, got {debounce}")
    });
    let rate = cfg.controller.event_max_per_s;
    let at = problems.at(&["controller", "event_max_per_s"]);
    at.check((0.0..=100.0).contains(&rate), || {
        format!(
            "{name}: controller.event_max_per_s must be within 0..=100 (0: only ticks), got {rate}"
        )
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_problem_at_once() {
        let dir = tempfile::tempdir().expect("tempdir");
        let d = dir.path();
        let demo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/demo");
        for f in ["site.toml", "policy.toml"] {
            std::fs::copy(demo.join(f), d.join(f)).expect("copy");
        }
        // an unknown top-level key, a wrong type in [controller], an impossible value
        // in [prices]
        let text = "colour = \"red\"\n[controller]\nsite = \"site.toml\"\npolicy = \"policy.toml\"\nbuffer_samples = \"many\"\n\n[prices]\nurl = \"http://127.0.0.1:9/prices.csv\"\nrefresh_s = 1\n";
        std::fs::write(d.join("powerplane.toml"), text).expect("config");
        let err = match load(&d.join("powerplane.toml")) {
            Ok(_) => panic!("a broken config must not load"),
            Err(e) => e.to_string(),
        };
        let name = d.join("powerplane.toml").display().to_string();
        let lines: Vec<&str> = err.lines().collect();
        assert_eq!(lines.len(), 3, "{err}");
        assert_eq!(lines[0], format!("{name}:1:1: unknown field `colour`, expected one of `controller`, `store`, `mqtt`, `redfish`, `prices`, `agents`, `http`, `schedulers`, `ha`, `node_power`, `demand_response`"));
        assert!(
            lines[1].starts_with(&format!("{name}:5:18: invalid type: string \"many\"")),
            "{err}"
        );
        assert_eq!(
            lines[2],
            format!("{name}:9:1: [prices] refresh_s must be at least 10 and stale_after_s above 0")
        );
    }

    #[test]
    fn sparkplug_bounds_out_of_range_are_a_problem_of_mqtt() {
        let dir = tempfile::tempdir().expect("tempdir");
        let d = dir.path();
        let demo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/demo");
        for f in ["site.toml", "policy.toml"] {
            std::fs::copy(demo.join(f), d.join(f)).expect("copy");
        }
        std::fs::write(d.join("mapping.toml"), "version = 1\n").expect("mapping");
        let text = "[controller]\nsite = \"site.toml\"\npolicy = \"policy.toml\"\n[store]\nkind = \"embedded\"\npath = \"s.redb\"\n[mqtt]\nurl = \"mqtt://127.0.0.1\"\nmapping = \"mapping.toml\"\nsparkplug_max_metrics_per_node = 0\n";
        std::fs::write(d.join("powerplane.toml"), text).expect("config");
        let err = match load(&d.join("powerplane.toml")) {
            Ok(_) => panic!("a bound of 0 must not load"),
            Err(e) => e.to_string(),
        };
        assert!(
            err.contains("[mqtt] sparkplug_max_metrics_per_node must be within 1..=1000000, got 0"),
            "{err}"
        );
    }
}
