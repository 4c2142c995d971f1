//! Starting `serve`: the store and the control loop restored from it, the schedulers,
//! the edges that feed the buffer and take the plan, the overrides and the HTTP API,
//! each opened in the order `run` calls them.

use std::path::Path;
use std::sync::{Arc, Mutex, RwLock};

use anyhow::Result;
use policies::Policy;
use sources::source::Source;
use telemetry::mapping::Mapping;
use telemetry::Site;
use tracing::info;

use super::edges;
use super::{leader::start_ha, open_store};
use crate::config::Config;
use api::Board;
use control::ControlLoop;
use runtime::buffer::Buffer;
use runtime::paths::resolve;
use runtime::schedulers::Schedulers;
use runtime::Runtime;

/// The control loop as the store left it, the leader election (with `[ha]`) and the
/// store's kind.
pub(super) fn control(
    cfg: &Config,
    base: &Path,
    site: &Site,
    policy: Policy,
    runtime: &Runtime,
) -> Result<(ControlLoop, Option<runtime::ha::Ha>, &'static str)> {
    let mut store = open_store(&cfg.store, base, Some(runtime.handle()))?;
    // with [ha], a replica starts as a follower: fenced at epoch 0, no scheduler open,
    // nothing commanded, until the election makes it the leader (see runtime::ha)
    let ha = start_ha(cfg, base)?;
    if ha.is_some() {
        store.set_fence(Some(0));
    }
    let backend = store.backend_name();
    let mut control = ControlLoop::restore(
        site.clone(),
        policy,
        store,
        cfg.controller.ledger_interval_s,
    )?;
    control.set_max_waiting_bytes(cfg.store.max_waiting_bytes());
    info!(
        store = backend,
        caps = control.state().caps.len(),
        holds = control.state().holds.len(),
        jobs = control.registry().len(),
        "restored from the store"
    );
    if ha.is_some() {
        control.set_records(false);
    }
    Ok((control, ha, backend))
}

/// Each scheduler adapter reconciles on a thread of its own (see runtime::schedulers);
/// with `[ha]` they open when this replica takes over.
pub(super) fn schedulers(
    cfg: &Config,
    base: &Path,
    ha: bool,
    control: &mut ControlLoop,
    runtime: &Runtime,
) -> Result<Schedulers> {
    if ha {
        return Ok(Schedulers::idle());
    }
    Schedulers::open(
        cfg.schedulers.as_ref(),
        base,
        control.store(),
        cfg.controller.tick_s,
        runtime.handle(),
        runtime.shutdown.clone(),
    )
}

/// The edges: the buffer the sources fill and the gate before it, the sources (MQTT,
/// Redfish, the agents' reports) in one list, and the agents (or observe-only caps).
pub(super) struct Edges {
    pub(super) buffer: Arc<Buffer>,
    pub(super) gate: Arc<control::admit::Gate>,
    pub(super) mqtt_rejects: Arc<control::admit::Tally>,
    pub(super) redfish: Option<sources::redfish::StatsHandle>,
    /// Every source started, with its counters.
    pub(super) sources: Vec<runtime::sources::Running>,
    /// The plan's caps go here: the agents, or observe-only.
    pub(super) actuator: Box<dyn control::Actuator>,
    /// The fleet's view, for the API and `/metrics` (with `[agents]`).
    pub(super) fleet: Option<Arc<Mutex<control::fleet::Fleet>>>,
}

impl Edges {
    /// Builds every source its section asks for and starts them on `runtime`: they
    /// stop with its shutdown token.
    pub(super) fn open(
        cfg: &Config,
        mapping: Option<Mapping>,
        site: &Site,
        base: &Path,
        runtime: &Runtime,
    ) -> Result<Edges> {
        let buffer = Arc::new(Buffer::new(cfg.controller.buffer_samples));
        // only the site's entities reach the buffer (see control::admit)
        let gate = Arc::new(control::admit::Gate::new(site));
        let mqtt_rejects = Arc::new(control::admit::Tally::default());
        let mut list: Vec<Box<dyn Source>> = Vec::new();
        if let (Some(m), Some(mapping)) = (&cfg.mqtt, mapping) {
            list.push(Box::new(runtime::mqtt::source(m, mapping)?));
        }
        let redfish = match &cfg.redfish {
            Some(r) => {
                let (source, stats) = runtime::redfish::source(r)?;
                list.push(Box::new(source));
                Some(stats)
            }
            None => None,
        };
        let actuation = edges::open_agents(cfg.agents.clone(), site, base)?;
        if let Some(reports) = actuation.reports {
            list.push(Box::new(reports));
        }
        let admission = Arc::new(runtime::sources::Admission {
            buffer: buffer.clone(),
            gate: gate.clone(),
            rejects: mqtt_rejects.clone(),
        });
        let sources = runtime::sources::start(list, runtime, admission);
        Ok(Edges {
            buffer,
            gate,
            mqtt_rejects,
            redfish,
            sources,
            actuator: actuation.actuator,
            fleet: actuation.fleet,
        })
    }
}

/// What the HTTP server takes from the schedulers open now (or once this replica
/// leads).
pub(super) fn hooks(cfg: &Config, schedulers: &Schedulers) -> api::Hooks {
    let configured = cfg.schedulers.as_ref();
    // the Kubernetes hooks answer on every replica, leader or follower
    let kube = configured
        .and_then(|s| s.kubernetes.as_ref())
        .map(runtime::schedulers::kube_hooks);
    api::Hooks::new(schedulers.inbox(), kube).configured(
        configured.is_some_and(|s| s.webhook.is_some()),
        configured.is_some_and(|s| s.kubernetes.is_some()),
    )
}

/// The operators' overrides, from `[http] overrides_file` when given.
/// With `[ha]`, a change is answered once the store's server holds it (the next
/// leader reads them there).
pub(super) fn overrides(cfg: &Config, base: &Path) -> Result<Arc<Mutex<control::overrides::Book>>> {
    let mut book = control::overrides::Book::open(
        cfg.http
            .as_ref()
            .and_then(|h| h.overrides_file.as_ref())
            .map(|p| resolve(base, p))
            .as_deref(),
    )
    .map_err(|e| anyhow::anyhow!("overrides: {e}"))?;
    book.acks.durable = cfg.ha.as_ref().is_some_and(|h| h.enabled);
    Ok(Arc::new(Mutex::new(book)))
}

/// `[demand_response]`'s edge: its files opened and, with `protocol`, its VEN started
/// on the runtime.
pub(super) fn grid(cfg: &Config, base: &Path, runtime: &Runtime) -> Result<runtime::grid::Grid> {
    let section = cfg.demand_response.as_ref();
    let mut grid = runtime::grid::Grid::open(section, base)
        .map_err(|e| anyhow::anyhow!("[demand_response]: {e}"))?;
    // with [ha], a posted target is answered once the store holds it
    grid.book
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .acks
        .durable = cfg.ha.as_ref().is_some_and(|h| h.enabled);
    if let Some(s) = section {
        grid.start_ven(s, runtime)
            .map_err(|e| anyhow::anyhow!("[demand_response]: {e}"))?;
    }
    Ok(grid)
}

/// With `[http]`: serves the API on the board, the fleet, the hooks and the overrides.
#[allow(clippy::too_many_arguments)]
pub(super) fn http(
    cfg: &Config,
    base: &Path,
    runtime: &Runtime,
    board: &Arc<RwLock<Board>>,
    fleet: &Option<Arc<Mutex<control::fleet::Fleet>>>,
    hooks: &api::Hooks,
    overrides: &Arc<Mutex<control::overrides::Book>>,
    grid: &Arc<Mutex<control::grid::targets::Book>>,
) -> Result<()> {
    let Some(h) = &cfg.http else {
        return Ok(());
    };
    let api = api::Api {
        overrides: overrides.clone(),
        grid: grid.clone(),
        board: board.clone(),
        fleet: fleet.clone(),
        tokens: api::load_tokens(h, base)?,
        metrics_public: h.metrics_public,
        metrics_gpu_series: h.metrics_gpu_series,
        status_page_public: h.status_page_public,
        refresh_s: h.refresh_s.max(1),
        hooks: hooks.clone(),
        stats: Default::default(),
        renders: Default::default(),
    };
    Ok(api::serve(h, base, api, runtime)?)
}
