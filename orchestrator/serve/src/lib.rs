//! `powerplane serve`: the controller on a real clock.
//!
//! Sources run on threads of their own (MQTT) or as tasks on the runtime (the Redfish
//! poller, see [`runtime::redfish`]) and put samples into
//! one bounded buffer that keeps the newest and counts what it drops. Every tick the
//! control loop drains it, evaluates the policy and commits to the store. With an
//! `[agents]` section the plan's caps are commanded to the GPU node agents (signed,
//! leased, acknowledged, renewed; see [`control::fleet`]) and the agents' reports feed the
//! snapshot; without it caps are observe-only. With `[schedulers]` the holds in force
//! are applied to the schedulers (see [`runtime::schedulers`]); without it they are
//! observe-only: computed, leased, audited, stored and logged.
//! With `[ha]` the replica follows the leader election (see [`leader`]): only the
//! leader actuates, drives the schedulers and commits.
//! SIGTERM or SIGINT stops the sources, closes the ledger interval and exits.
//!
//! # Layout
//!
//! - this module: the assembly: the edges started from the config, the loop on a real clock.
//! - [`config`]: `powerplane.toml`, every problem of it and of the files it names in one pass.
//! - `edges`: the MQTT sources and the agents' actuator, started from their sections.
//! - `leader`: `[ha]`'s leader gate and the standby actuator.
#![forbid(unsafe_code)]

pub mod config;

mod edges;
mod leader;
mod start;

pub use edges::{AgentActuator, ObserveOnly};
pub use runtime::buffer::Buffer;
pub use runtime::node_power::worker::NodePowerSection;

use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use anyhow::Result;
use integrations::store::Store;
use telemetry::Site;
use tracing::{info, warn};

use crate::config::{load, Config, Loaded, StoreConfig};
use api::Board;
use common::wall_clock;
use control::ControlLoop;
use leader::{Leader, Standby};
use runtime::node_power::worker as nodes;
use runtime::paths::resolve;
use runtime::prices::Prices;
use runtime::schedulers::Schedulers;

/// The site and the store a config names, for `powerplane report`.
pub fn open_for_report(config_path: &Path) -> Result<(Site, Store)> {
    let loaded = load(config_path)?;
    let base = config_path.parent().unwrap_or(Path::new("."));
    let store = open_store(&loaded.config.store, base, None)?;
    Ok((loaded.site, store))
}

/// For `serve --check`: the configured embedded store's file, checked without writing
/// to it (see `integrations::store::embedded::check`); `None` for Redis, which the
/// check does not contact.
pub fn check_store(config_path: &Path, cfg: &StoreConfig) -> Result<Option<String>> {
    let base = config_path.parent().unwrap_or(Path::new("."));
    Ok(match cfg {
        StoreConfig::Embedded(e) => Some(e.check(base)?),
        StoreConfig::Memoryless | StoreConfig::Redis(_) | StoreConfig::Postgres(_) => None,
    })
}

/// Opens the configured store; with `handle` (serve), Redis behind its journal.
fn open_store(
    cfg: &StoreConfig,
    base: &Path,
    handle: Option<tokio::runtime::Handle>,
) -> Result<Store> {
    Ok(match cfg {
        StoreConfig::Memoryless => anyhow::bail!(
            "[store] is required: kind = \"embedded\" (with path), \"redis\" or \"postgres\" (with url)"
        ),
        StoreConfig::Embedded(e) => match handle {
            // serve: behind its journal where one is set
            Some(_) => e.open(base)?,
            None => e.open_plain(base)?,
        },
        StoreConfig::Redis(redis) => match handle {
            Some(h) => redis.open_journaled(base, h)?,
            None => redis.open_plain(base)?,
        },
        StoreConfig::Postgres(pg) => match handle {
            Some(h) => pg.open_journaled(base, h)?,
            None => pg.open_plain(base)?,
        },
    })
}

/// Runs the controller until a signal, or for `run_for` when given.
pub fn run(config_path: &Path, run_for: Option<Duration>) -> Result<()> {
    let Loaded {
        config: cfg,
        site,
        policy,
        mapping,
        prices,
    } = load(config_path)?;
    let base = config_path.parent().unwrap_or(Path::new(".")).to_path_buf();
    // every IO edge runs on this runtime (see runtime); the control loop runs
    // on this thread and never awaits an edge
    let runtime = runtime::Runtime::new(4)?;
    let (mut control, ha, backend) = start::control(&cfg, &base, &site, policy, &runtime)?;
    let schedulers = start::schedulers(&cfg, &base, ha.is_some(), &mut control, &runtime)?;
    // SIGTERM and SIGINT cancel the runtime's token: the one shutdown path of every
    // edge, and of this loop
    runtime.cancel_on_signals()?;
    let keep_going = keep_going(&runtime, run_for);
    let edges = start::Edges::open(&cfg, mapping, &site, &base, &runtime)?;
    let (board, reloader) = first_board(&cfg, &base, &site, &mut control)?;
    board.write().unwrap_or_else(|p| p.into_inner()).ha = ha.as_ref().map(|h| h.gate.clone());
    let hooks = start::hooks(&cfg, &schedulers);
    let overrides = start::overrides(&cfg, &base)?;
    let grid = start::grid(&cfg, &base, &runtime)?;
    start::http(
        &cfg,
        &base,
        &runtime,
        &board,
        &edges.fleet,
        &hooks,
        &overrides,
        &grid.book,
    )?;
    // prices: the feed (a file, or a URL fetched every refresh_s), else the tariff
    let prices = Prices::start(cfg.prices.as_ref(), prices, &runtime);
    let events = control::cadence::Events::new(
        cfg.controller.event_debounce_ms,
        cfg.controller.event_max_per_s,
    );
    let node_power = match &cfg.node_power {
        Some(np) => Some(nodes::NodePower::start(np, &site, wall_clock())?),
        None => None,
    };
    let leader = Leader::new(ha, edges.fleet.clone(), hooks, base.clone(), &runtime);
    let mut serve = Serve {
        node_power,
        cfg,
        control,
        schedulers,
        leader,
        actuator: edges.actuator,
        buffer: edges.buffer,
        gate: edges.gate,
        mqtt_rejects: edges.mqtt_rejects,
        redfish: edges.redfish,
        sources: edges.sources,
        prices,
        grid,
        overrides,
        reloader,
        board,
        cadence: control::cadence::Cadence::default(),
        last_source_sample: None,
        events,
        thresholds: policies::triggers::Thresholds::default(),
        since: Default::default(),
    };
    info!(
        sources = ?serve.sources.iter().map(|s| s.kind).collect::<Vec<_>>(),
        "serving"
    );
    serve.drive(&site, backend, &keep_going);
    serve.stop(runtime)
}

/// Whether to keep going: the runtime's shutdown token not cancelled (no signal yet),
/// and `run_for` (when given) not over.
fn keep_going(runtime: &runtime::Runtime, run_for: Option<Duration>) -> impl Fn() -> bool {
    let started = Instant::now();
    let token = runtime.shutdown.clone();
    move || !token.is_cancelled() && run_for.is_none_or(|d| started.elapsed() < d)
}

/// The board the API reads, with the policy file as it is now, and its watcher.
fn first_board(
    cfg: &Config,
    base: &Path,
    site: &Site,
    control: &mut ControlLoop,
) -> Result<(Arc<RwLock<Board>>, runtime::reload::Reloader)> {
    let policy_path = resolve(base, &cfg.controller.policy);
    let mut board = Board::new(
        site.clone(),
        policy_path.display().to_string(),
        wall_clock(),
    );
    board.store_health = control.store().health();
    let reloader = start_policy_watch(
        &policy_path,
        cfg.controller.policy_reload_s,
        control,
        &mut board,
    )?;
    let sources = [
        cfg.mqtt.is_some(),
        cfg.redfish.is_some(),
        cfg.agents.is_some(),
    ];
    board.ready = api::health::Readiness::new(&sources, cfg.controller.tick_s, cfg.http.as_ref());
    Ok((Arc::new(RwLock::new(board)), reloader))
}

/// The running controller: the loop and what it reads from and hands to the edges.
struct Serve {
    cfg: Config,
    control: ControlLoop,
    schedulers: Schedulers,
    leader: Leader,
    actuator: Box<dyn control::Actuator>,
    buffer: Arc<Buffer>,
    gate: Arc<control::admit::Gate>,
    mqtt_rejects: Arc<control::admit::Tally>,
    redfish: Option<sources::redfish::StatsHandle>,
    /// The telemetry sources started, with their counters.
    sources: Vec<runtime::sources::Running>,
    prices: Prices,
    /// `[demand_response]`: the grid events and the one in force.
    grid: runtime::grid::Grid,
    overrides: Arc<Mutex<control::overrides::Book>>,
    reloader: runtime::reload::Reloader,
    board: Arc<RwLock<Board>>,
    cadence: control::cadence::Cadence,
    last_source_sample: Option<telemetry::Timestamp>,
    /// Event-driven evaluation: when a crossing is due, and the levels that count.
    events: control::cadence::Events,
    thresholds: policies::triggers::Thresholds,
    /// What the last evaluation saw of the watched series read since (the readings
    /// are taken in between evaluations, crossings are against what it saw).
    since: policies::triggers::SinceEvaluation,
    /// With `[node_power]`: nodes powered down and up through Slurm or Redfish.
    node_power: Option<nodes::NodePower>,
}

impl Serve {
    /// Ticks until `keep_going` says stop. With systemd (Type=notify): ready now that
    /// every edge runs; the watchdog is pinged by the loop itself, so a loop that
    /// stalls is restarted after WatchdogSec.
    fn drive(&mut self, site: &Site, backend: &str, keep_going: &dyn Fn() -> bool) {
        let mut notify = common::notify::Notifier::from_env();
        notify.ready(&format!(
            "{} racks, {} GPUs; store {backend}",
            site.racks.len(),
            site.gpu_count()
        ));
        let tick = Duration::from_secs_f64(self.cfg.controller.tick_s);
        let mut next = Instant::now();
        while keep_going() {
            notify.watchdog();
            self.tick(next);
            next += tick;
            self.between_ticks(next, keep_going, &mut notify);
        }
        notify.stopping();
    }

    /// One tick, due at `due`: what the edges delivered in, the plan out to the
    /// actuators and schedulers, the board for the API.
    fn tick(&mut self, due: Instant) {
        self.evaluate(Some(due));
    }

    /// An evaluation: a tick due at `due`, or (`None`) one made at once for samples
    /// that crossed a threshold between ticks.
    fn evaluate(&mut self, due: Option<Instant>) {
        if let Some(due) = due {
            self.cadence.start(due);
        }
        let began = Instant::now();
        let crossed = due.is_none().then(|| self.events.armed()).flatten();
        let now = wall_clock();
        // the operators' posted targets this tick takes (stored with it)
        let grid_seen = {
            let book = lock(&self.grid.book);
            self.control.set_posted_targets(book.list.clone());
            book.acks.changes
        };
        let mut samples = self.drain_edges(now);
        let overrides_seen = self.apply_overrides(now);
        self.reload_policy(now);
        // schedulers: their jobs in, the holds in force out (see runtime::schedulers);
        // neither waits on a scheduler
        let acting = self.follow_election();
        let jobs = self.schedulers.jobs();
        let actuator: &mut dyn control::Actuator = if acting {
            self.actuator.as_mut()
        } else {
            &mut Standby
        };
        // the GPUs of a node that is off read 0 W, fresh: off, not stale
        if let Some(np) = &self.node_power {
            samples.extend(np.off_samples(self.control.site(), now));
        }
        let mut timed = Timed {
            inner: actuator,
            done: None,
        };
        // the GPUs each pod holds, as the agents report them from the kubelets
        if let Some(f) = &self.leader.fleet {
            let holders = lock(f).holders();
            self.control.set_holders(holders);
        }
        let report = self.control.tick(now, samples, jobs, &mut timed);
        let done = timed.done;
        self.grid_saw(now);
        self.since.clear();
        if due.is_none() {
            self.cadence.event_done(crossed, done, began);
        }
        self.power_nodes(&report, acting, now);
        if acting && !self.schedulers.is_empty() {
            let actuated = self.control.actuated().clone();
            let limits = runtime::schedulers::job_limits(
                self.control.registry().active(),
                self.control.site(),
                self.control.policy(),
                &actuated,
            );
            self.schedulers.apply(
                &actuated,
                &report.decisions,
                limits,
                now,
                self.control.store(),
            );
            if report.store_error.is_none() && self.next_leader_has_it() {
                self.schedulers.stored();
            }
        }
        // the operators' changes this tick carried are where the next leader reads them
        if acting && report.store_error.is_none() && self.next_leader_has_it() {
            lock(&self.overrides).acks.stored_up_to(overrides_seen);
            lock(&self.grid.book).acks.stored_up_to(grid_seen);
        }
        for d in &report.decisions {
            info!(rule = %d.rule, target = %d.target, action = %d.action, "{}", d.reason);
        }
        // the API reads a copy of the tick; without [http] nobody does
        if self.cfg.http.is_some() {
            self.publish(now, &report);
        }
        if let Some(e) = report.store_error {
            warn!(error = %e, "store unavailable; writes kept for the next tick");
        }
        self.evaluated(due);
    }

    /// Whether this tick's batch is where the next leader will find it, so that its
    /// job events may be answered 202: always for one controller (its journal is
    /// replayed by itself); with `[ha]`, only once the store's server took it. A batch
    /// waiting in this replica's journal is dropped as fenced if another replica takes
    /// over meanwhile, so its events wait (503 after `ack_wait`: the sender resends,
    /// to whichever replica leads).
    fn next_leader_has_it(&mut self) -> bool {
        if self.leader.ha.is_none() {
            return true;
        }
        self.control
            .store()
            .health()
            .is_none_or(|h| h.journal_depth.load(std::sync::atomic::Ordering::Relaxed) == 0)
    }

    /// What the edges delivered since the last look (most readings were taken in
    /// between evaluations, see `take_readings`), with the price feed's samples; the
    /// refused and the dead are counted and marked, the forecast handed to the loop.
    fn drain_edges(&mut self, now: telemetry::Timestamp) -> Vec<telemetry::Sample> {
        let (mut samples, dead) = self.buffer.drain();
        let refused = self.gate.take_refused();
        self.control
            .count_rejected(control::admit::UNKNOWN_ENTITY, refused);
        if !samples.is_empty() {
            self.last_source_sample = Some(now);
        }
        for e in &dead {
            self.control.mark_bad(e);
        }
        let forecast = self.prices.tick(self.control.site(), now, &mut samples);
        self.control.set_forecast(forecast);
        // the grid event in force, chosen against the engine's baseline during an
        // event, else the meter after the last tick
        let baseline = self
            .control
            .state()
            .grid
            .as_ref()
            .map(|m| m.baseline_w)
            .or_else(|| runtime::grid::read_shared(&self.grid.meter_w))
            .unwrap_or(0.0);
        let events = self
            .grid
            .tick(self.control.site(), baseline, now, &mut samples);
        self.control.note_grid_events(&events);
        samples
    }

    /// After a tick: the meter and the floor the engine saw, for the VEN's reports and
    /// opt decisions (outside an event, the meter as the grid controller reads it).
    fn grid_saw(&self, now: telemetry::Timestamp) {
        let (meter, floor) = match &self.control.state().grid {
            Some(m) => (Some(m.meter_w), Some(m.floor_w)),
            None => {
                let site = self.control.site();
                let m = policies::grid::meter(
                    site,
                    self.control.snapshot(),
                    &self.control.policy().grid,
                    f64::NAN,
                    now,
                );
                (m.meter_w.is_finite().then_some(m.meter_w), None)
            }
        };
        self.grid.saw(meter, floor);
    }

    /// Drops the expired overrides (saving the book) and hands the loop those in force;
    /// the number of the book's changes they include.
    fn apply_overrides(&mut self, now: telemetry::Timestamp) -> u64 {
        let mut book = lock(&self.overrides);
        if book.expire(now) {
            if let Err(e) = book.save() {
                warn!(error = %e, "cannot save the overrides");
            }
        }
        self.control.set_overrides(book.list.clone());
        book.acks.changes
    }

    /// With `[ha]`: takes the posted grid targets the store holds into the grid's book
    /// (a follower mirroring its leader, a new leader taking over), when it holds any.
    fn grid_targets_from_store(&mut self) {
        let Some(list) = self.control.stored_posted_targets() else {
            return;
        };
        let mut book = lock(&self.grid.book);
        if book.replace(list) {
            if let Err(e) = book.save() {
                warn!(error = %e, "cannot save the posted grid targets");
            }
        }
    }

    /// With `[ha]`: takes the overrides the store holds into the book (a follower
    /// mirroring its leader, a new leader taking over), when the store holds any.
    fn overrides_from_store(&mut self) {
        let Some(list) = self.control.stored_overrides() else {
            return;
        };
        let mut book = lock(&self.overrides);
        if book.replace(list) {
            if let Err(e) = book.save() {
                warn!(error = %e, "cannot save the overrides");
            }
        }
    }

    /// Reloads the policy file when it changed, and shows its text and status.
    fn reload_policy(&mut self, now: telemetry::Timestamp) {
        if let Some((text, status)) = self.reloader.between_ticks(&mut self.control, now) {
            let mut b = self.board.write().unwrap_or_else(|p| p.into_inner());
            if let Some(text) = text {
                b.policy_text = text;
            }
            b.policy_status = status;
        }
    }

    /// With `[node_power]`: powers nodes down and up after the tick, and logs it.
    fn power_nodes(
        &mut self,
        report: &control::TickReport,
        acting: bool,
        now: telemetry::Timestamp,
    ) {
        let Some(np) = &mut self.node_power else {
            return;
        };
        // the price now above the mean of the next 24 h: deeper off-time
        let prices = self.prices.next_24h(now);
        let expensive = prices.first().is_some_and(|(_, p)| {
            *p > prices.iter().map(|(_, v)| v).sum::<f64>() / prices.len() as f64
        });
        let grid_event = self
            .control
            .state()
            .grid
            .as_ref()
            .is_some_and(|m| m.event_active());
        let actions = np.tick(
            self.control.site(),
            &self.control.policy().node_power,
            self.control.registry().active(),
            &report.planned_starts,
            expensive,
            grid_event,
            acting,
            now,
        );
        for a in &actions {
            match a {
                policies::node_power::NodeAction::Down { node, reason } => {
                    info!(node = %node, "node power down: {reason}")
                }
                policies::node_power::NodeAction::Up { node, reason } => {
                    info!(node = %node, "node power up: {reason}")
                }
                policies::node_power::NodeAction::Failed { node, reason } => {
                    warn!(node = %node, "node resume failed: {reason}")
                }
            }
        }
    }

    /// After an evaluation: the cadence and the event counters, and the thresholds of
    /// the policy in force.
    fn evaluated(&mut self, due: Option<Instant>) {
        match due {
            Some(_) => {
                self.events.ticked();
                self.cadence.end();
            }
            None => self.events.evaluated(Instant::now()),
        }
        self.cadence.event_crossings = self.events.crossings;
        self.cadence.event_evaluations = self.events.evaluations;
        if self.events.enabled() {
            self.thresholds =
                policies::triggers::Thresholds::new(self.control.policy(), self.control.site());
        }
    }

    /// Takes what the edges delivered since the last look into the snapshot, so that
    /// an evaluation (on a tick or a crossing) does not first ingest every reading
    /// since the one before it; with `crossings`, notes whether any sample crossed a
    /// threshold against the value the last evaluation saw.
    fn take_readings(&mut self, crossings: bool) {
        let (samples, dead) = self.buffer.drain();
        if samples.is_empty() && dead.is_empty() {
            return;
        }
        let now = wall_clock();
        if crossings
            && self
                .thresholds
                .any_crossed_since(self.control.snapshot(), &mut self.since, &samples)
        {
            self.events.crossed(Instant::now());
        }
        for e in &dead {
            self.control.mark_bad(e);
        }
        if !samples.is_empty() {
            self.last_source_sample = Some(now);
            self.control.ingest(samples, now);
        }
    }

    /// The tick, copied for the API and `/metrics`.
    fn publish(&self, now: telemetry::Timestamp, report: &control::TickReport) {
        // everything is copied first, outside the lock: the API's readers (`/readyz`
        // above all) never wait for a copy of a large site's snapshot
        let snapshot = Arc::new(self.control.snapshot().clone());
        let state = Arc::new(self.control.actuated().clone());
        let feeds = self.prices.reports(now);
        let prices = self.prices.next_24h(now);
        let predictions = report.predictions.clone();
        let grid_events = self.grid.events(now);
        // the sources' counters and the VEN's, written alike on /metrics
        let source_counters = self
            .sources
            .iter()
            .map(|s| &s.stats)
            .chain(self.grid.ven_stats())
            .flat_map(|s| s.read())
            .collect();
        let jobs = self.control.registry().active().to_vec();
        let schedulers = self.schedulers.status();
        let mut scheduler_counters = self.schedulers.counters();
        if let Some(np) = &self.node_power {
            scheduler_counters.extend(np.counters());
        }
        let labeled_counters = control::admit::labeled(
            self.cfg.mqtt.is_some().then(|| self.mqtt_rejects.counts()),
            self.schedulers.events_rejected(),
        );
        let redfish = self
            .redfish
            .as_ref()
            .map(|r| r.snapshot())
            .unwrap_or_default();
        let mut b = self.board.write().unwrap_or_else(|p| p.into_inner());
        b.price_source = self.prices.source.to_string();
        b.feeds = feeds;
        b.prices = prices;
        let replaced = b.update(
            now,
            snapshot,
            state,
            &self.control.counters,
            &report.decisions,
            self.buffer.dropped.load(Ordering::Relaxed),
        );
        b.predictions = predictions;
        b.grid_events = grid_events;
        b.source_counters = source_counters;
        b.ledger.add(&report.ledger);
        b.jobs = jobs;
        b.schedulers = schedulers;
        b.scheduler_counters = scheduler_counters;
        b.labeled_counters = labeled_counters;
        b.ready
            .after_tick(report.store_error.as_deref(), self.last_source_sample);
        b.cadence = self.cadence.clone();
        b.redfish = redfish;
        drop(b);
        // freed outside the lock (unless a render still holds them)
        drop(replaced);
    }

    /// Until `next` (at least once, even after a tick that ran late): the
    /// reconcilers' store writes (a Slurm hold's intent waits for its commit here)
    /// and the watchdog.
    fn between_ticks(
        &mut self,
        next: Instant,
        keep_going: &dyn Fn() -> bool,
        notify: &mut common::notify::Notifier,
    ) {
        loop {
            notify.watchdog();
            // a crossing is evaluated at once (after its debounce), not at the tick
            let until = self.events.due().map_or(next, |d| d.min(next));
            // with events on, the buffer is looked at every 5 ms
            let step = Duration::from_millis(if self.events.enabled() { 5 } else { 20 });
            self.schedulers.commit_writes(
                self.control.store(),
                step.min(until.saturating_duration_since(Instant::now())),
            );
            if !keep_going() || Instant::now() >= next {
                break;
            }
            // a follower's evaluations actuate nothing: it waits for the tick
            let acting = self.leader.ha.is_none() || self.leader.epoch.is_some();
            let events = self.events.enabled() && acting;
            self.take_readings(events);
            if events && self.events.due().is_some_and(|d| Instant::now() >= d) {
                self.evaluate(None);
            } else if acting && self.grid.due(wall_clock()) {
                // a grid event started, changed or ended: its caps go out now
                self.evaluate(None);
            }
        }
    }

    /// Shutdown: the reconcilers finish their pass, every edge is cancelled, the
    /// ledger interval is closed and committed, then the runtime waits for its tasks.
    fn stop(mut self, runtime: runtime::Runtime) -> Result<()> {
        runtime.shutdown.cancel();
        // the nodes this controller holds off come back (their lease ends with it)
        if let Some(np) = self.node_power.take() {
            np.stop(wall_clock());
        }
        self.schedulers
            .stop(self.control.store(), runtime::DEFAULT_GRACE);
        // a follower has nothing of its own to close; a leader closes the ledger
        // interval, then gives the lease back so that a follower takes over at once
        let follower = self.leader.ha.is_some() && self.leader.epoch.is_none();
        if !follower {
            self.control.finish(wall_clock())?;
        }
        if let Some(ha) = &mut self.leader.ha {
            ha.stop();
        }
        runtime.stop(runtime::DEFAULT_GRACE);
        let c = &self.control.counters;
        info!(
            ticks = c.ticks,
            accepted = c.samples_accepted,
            rejected = c.samples_rejected.values().sum::<u64>(),
            dropped = self.buffer.dropped.load(Ordering::Relaxed),
            decisions = c.decisions,
            "stopped"
        );
        Ok(())
    }
}

/// An actuator that notes when the desired state was handed on (for the event
/// latency on `/metrics`).
struct Timed<'a> {
    inner: &'a mut dyn control::Actuator,
    done: Option<Instant>,
}

impl control::Actuator for Timed<'_> {
    fn apply(&mut self, state: &policies::State, now: telemetry::Timestamp) -> Vec<String> {
        let errors = self.inner.apply(state, now);
        self.done = Some(Instant::now());
        errors
    }
}

/// Starts watching the policy file: the loop runs the file as it is now (an edit made
/// since `load` included), and the board shows its text and hash.
fn start_policy_watch(
    path: &Path,
    every_s: f64,
    control: &mut ControlLoop,
    board: &mut api::Board,
) -> Result<runtime::reload::Reloader> {
    let now = wall_clock();
    let (reloader, policy, text) =
        runtime::reload::Reloader::start(path, every_s, control.site(), now)?;
    control.set_policy(policy);
    board.policy_text = text;
    board.policy_status = reloader.status().clone();
    Ok(reloader)
}

/// A mutex's guard, through a poisoning (the data is plain).
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
