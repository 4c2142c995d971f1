//! `powerplane serve`: the controller on a real clock.
//!
//! Sources run on threads of their own (MQTT) or as tasks on the runtime (the Redfish
//! poller, see [`crate::redfish`]) and put samples into
//! one bounded buffer that keeps the newest and counts what it drops. Every tick the
//! control loop drains it, evaluates the policy and commits to the store. With an
//! `[agents]` section the plan's caps are commanded to the GPU node agents (signed,
//! leased, acknowledged, renewed; see [`crate::fleet`]) and the agents' reports feed the
//! snapshot; without it caps are observe-only. With `[schedulers]` the holds in force
//! are applied to the schedulers (see [`crate::schedulers`]); without it they are
//! observe-only: computed, leased, audited, stored and logged.
//! SIGTERM or SIGINT stops the sources, closes the ledger interval and exits.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use integrations::prices::Series;
use integrations::store::Store;
use policies::State;
use sources::mqtt::{Event, MqttSource};
use telemetry::metric::names::{CARBON_G_PER_KWH, PRICE_PER_KWH};
use telemetry::{EntityId, Sample, Site, Timestamp};
use tracing::{info, warn};

use crate::config::{load, resolve, Loaded, StoreConfig};
use crate::control::{Actuator, ControlLoop};
use crate::embedded::EmbeddedBackend;
use crate::fleet::{Fleet, FleetConfig};
use crate::probe::wall_clock;
use sources::mqtt::{Link, LinkEvent};
use telemetry::agent_proto::{Channel, Topics};

/// Samples waiting for the next tick: bounded, keeps the newest, counts what it drops.
#[derive(Debug)]
pub struct Buffer {
    cap: usize,
    items: Mutex<(VecDeque<Sample>, Vec<EntityId>)>,
    pub dropped: AtomicU64,
}

impl Buffer {
    pub fn new(cap: usize) -> Self {
        Buffer {
            cap: cap.max(1),
            items: Mutex::new((VecDeque::new(), Vec::new())),
            dropped: AtomicU64::new(0),
        }
    }

    pub fn push(&self, samples: Vec<Sample>, dead: Vec<EntityId>) {
        let mut g = self.items.lock().unwrap_or_else(|p| p.into_inner());
        for s in samples {
            if g.0.len() == self.cap {
                g.0.pop_front();
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
            g.0.push_back(s);
        }
        g.1.extend(dead);
    }

    pub fn drain(&self) -> (Vec<Sample>, Vec<EntityId>) {
        let mut g = self.items.lock().unwrap_or_else(|p| p.into_inner());
        (g.0.drain(..).collect(), std::mem::take(&mut g.1))
    }
}

/// Caps without `[agents]`: log when the desired caps change, command nothing. (Holds
/// go to the schedulers in `[schedulers]`, which log their own actions.)
#[derive(Debug, Default)]
pub struct ObserveOnly {
    last: State,
}

impl Actuator for ObserveOnly {
    fn apply(&mut self, state: &State, _now: Timestamp) -> Vec<String> {
        let watts = |s: &State| {
            s.caps
                .iter()
                .map(|(g, c)| (g.clone(), c.watts.to_bits()))
                .collect::<Vec<_>>()
        };
        if watts(state) != watts(&self.last) {
            info!(
                caps = state.caps.len(),
                "desired caps changed (no [agents]: nothing commanded)"
            );
        }
        self.last = state.clone();
        Vec::new()
    }
}

/// Actuation through the GPU agents: the plan's caps and clock locks become signed,
/// leased commands (holds go to the schedulers).
pub struct AgentActuator {
    fleet: Arc<Mutex<Fleet>>,
    link: Link,
    status_file: Option<PathBuf>,
    in_sync: Option<usize>,
}

impl Actuator for AgentActuator {
    fn apply(&mut self, state: &State, now: Timestamp) -> Vec<String> {
        let mut errors = Vec::new();
        let mut fleet = self.fleet.lock().unwrap_or_else(|p| p.into_inner());
        for (topic, payload) in fleet.commands(state, now) {
            // never blocks the tick: `try_publish` into the client's bounded queue; a full
            // queue (a broker that does not take them) counts a drop, retried with backoff
            if !self.link.publish(&topic, payload, true, false) {
                errors.push(format!(
                    "{topic}: command not queued (the broker has been unreachable; retried with backoff)"
                ));
            }
        }
        let status = fleet.status();
        if self.in_sync != Some(status.in_sync) {
            info!(
                in_sync = status.in_sync,
                gpus = status.gpus.len(),
                "GPUs running as desired (acknowledged and enforced)"
            );
            self.in_sync = Some(status.in_sync);
        }
        if let Some(path) = &self.status_file {
            let tmp = path.with_extension("tmp");
            let written = serde_json::to_vec_pretty(&status)
                .map_err(std::io::Error::other)
                .and_then(|b| std::fs::write(&tmp, b))
                .and_then(|_| std::fs::rename(&tmp, path));
            if let Err(e) = written {
                warn!(path = %path.display(), error = %e, "cannot write the agents' status file");
            }
        }
        errors
    }
}

/// The site and the store a config names, for `powerplane report`.
pub fn open_for_report(config_path: &Path) -> Result<(Site, Store)> {
    let loaded = load(config_path)?;
    let base = config_path.parent().unwrap_or(Path::new("."));
    let store = open_store(&loaded.config.store, base, None)?;
    Ok((loaded.site, store))
}

/// Opens the configured store; with `handle` (serve), Redis behind its journal.
fn open_store(
    cfg: &StoreConfig,
    base: &Path,
    handle: Option<tokio::runtime::Handle>,
) -> Result<Store> {
    Ok(match cfg {
        StoreConfig::Memoryless => anyhow::bail!(
            "[store] is required: kind = \"embedded\" (with path) or \"redis\" (with url)"
        ),
        StoreConfig::Embedded { path } => {
            Store::new(Box::new(EmbeddedBackend::open(&resolve(base, path))?))
        }
        StoreConfig::Redis(redis) => match handle {
            Some(h) => redis.open_journaled(base, h)?,
            None => redis.open_plain(base)?,
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
    // every IO edge runs on this runtime (see crate::runtime); the control loop runs
    // on this thread and never awaits an edge
    let runtime = crate::runtime::Runtime::new(4)?;
    let store = open_store(&cfg.store, &base, Some(runtime.handle()))?;
    let backend = store.backend_name();
    let mut control = ControlLoop::restore(
        site.clone(),
        policy,
        store,
        cfg.controller.ledger_interval_s,
    )?;
    info!(
        store = backend,
        caps = control.state().caps.len(),
        holds = control.state().holds.len(),
        jobs = control.registry().len(),
        "restored from the store"
    );
    // each scheduler adapter reconciles on a thread of its own (see crate::schedulers)
    let mut schedulers = crate::schedulers::Schedulers::open(
        cfg.schedulers.as_ref(),
        &base,
        control.store(),
        cfg.controller.tick_s,
        runtime.handle(),
        runtime.shutdown.clone(),
    )?;

    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(sig, stop.clone()).context("cannot install signal handlers")?;
    }
    let started = Instant::now();
    let keep_going = {
        let stop = stop.clone();
        move || !stop.load(Ordering::Relaxed) && run_for.is_none_or(|d| started.elapsed() < d)
    };
    let buffer = Arc::new(Buffer::new(cfg.controller.buffer_samples));
    // only the site's entities reach the buffer (see crate::admit)
    let gate = Arc::new(crate::admit::Gate::new(&site));
    let mqtt_rejects = Arc::new(crate::admit::Tally::default());
    let mut threads = Vec::new();
    if let (Some(m), Some(mapping)) = (cfg.mqtt.clone(), mapping) {
        let mut source = MqttSource::new(m.client.clone(), mapping)?;
        let (buf, keep) = (buffer.clone(), keep_going.clone());
        let (gate, tally) = (gate.clone(), mqtt_rejects.clone());
        info!(url = %m.client.url, filters = ?source.filters(), "mqtt source starting");
        threads.push(
            std::thread::Builder::new()
                .name("mqtt".into())
                .spawn(move || {
                    source.run(&keep, &wall_clock, &mut |ev| {
                        if let Event::Message { decoded, .. } = ev {
                            for r in &decoded.rejects {
                                tally.add(r.reason, 1);
                            }
                            buf.push(
                                gate.admit(decoded.samples, "mqtt"),
                                gate.admit_dead(decoded.dead, "mqtt"),
                            );
                        }
                    });
                })?,
        );
    }
    // the Redfish poller: a task on the runtime (see crate::redfish); only the site's
    // entities pass the gate
    let redfish = match &cfg.redfish {
        Some(r) => Some(crate::redfish::spawn(
            r,
            &runtime,
            buffer.clone(),
            gate.clone(),
        )?),
        None => None,
    };

    let tick = Duration::from_secs_f64(cfg.controller.tick_s);
    let mut fleet_handle = None;
    let mut actuator: Box<dyn Actuator> = match cfg.agents.clone() {
        None => Box::new(ObserveOnly::default()),
        Some(a) => {
            let key = crate::agent::run::read_key(&resolve(&base, &a.key_file))?;
            let topics = Topics::new(&a.topic_prefix);
            let fleet = Arc::new(Mutex::new(Fleet::new(
                &site,
                key,
                topics.clone(),
                FleetConfig {
                    lease_s: a.lease_s,
                    renew_s: a.renew_s,
                    retry_s: a.retry_s,
                },
                wall_clock(),
            )));
            let mut mqtt = a.mqtt.clone();
            if mqtt.client_id.is_none() {
                mqtt.client_id = Some(format!("powerplane-controller-{}", std::process::id()));
            }
            let (link, events) = Link::open(
                &mqtt,
                [Channel::Gpus, Channel::Ack, Channel::Health]
                    .into_iter()
                    .map(|c| topics.all(c))
                    .collect(),
                None,
            )?;
            info!(url = %a.mqtt.url, prefix = %a.topic_prefix, lease_s = a.lease_s, "commanding the GPU agents");
            let (buf, keep, fl) = (buffer.clone(), keep_going.clone(), fleet.clone());
            let gate = gate.clone();
            threads.push(
                std::thread::Builder::new()
                    .name("agents".into())
                    .spawn(move || {
                        while keep() {
                            match events.recv_timeout(Duration::from_millis(100)) {
                                Ok(LinkEvent::Message { topic, payload }) => {
                                    let samples = fl
                                        .lock()
                                        .unwrap_or_else(|p| p.into_inner())
                                        .on_message(&topic, &payload, wall_clock());
                                    if !samples.is_empty() {
                                        buf.push(gate.admit(samples, "agents"), Vec::new());
                                    }
                                }
                                Ok(_) | Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
                            }
                        }
                    })?,
            );
            fleet_handle = Some(fleet.clone());
            Box::new(AgentActuator {
                fleet,
                link,
                status_file: a.status_file.map(|p| resolve(&base, &p)),
                in_sync: None,
            })
        }
    };
    let policy_path = resolve(&base, &cfg.controller.policy);
    let mut first_board = crate::http::Board::new(
        site.clone(),
        policy_path.display().to_string(),
        wall_clock(),
    );
    first_board.store_health = control.store().health();
    let mut reloader = start_policy_watch(
        &policy_path,
        cfg.controller.policy_reload_s,
        &mut control,
        &mut first_board,
    )?;
    let sources = [
        cfg.mqtt.is_some(),
        cfg.redfish.is_some(),
        cfg.agents.is_some(),
    ];
    first_board.ready = crate::http::health::Readiness::new(&sources, cfg.http.as_ref());
    let board = Arc::new(std::sync::RwLock::new(first_board));
    let mut last_source_sample = None;
    let overrides = Arc::new(Mutex::new(
        crate::overrides::Book::open(
            cfg.http
                .as_ref()
                .and_then(|h| h.overrides_file.as_ref())
                .map(|p| resolve(&base, p))
                .as_deref(),
        )
        .map_err(|e| anyhow::anyhow!("overrides: {e}"))?,
    ));
    if let Some(h) = &cfg.http {
        let api = crate::http::Api {
            overrides: overrides.clone(),
            board: board.clone(),
            fleet: fleet_handle.clone(),
            tokens: crate::http::load_tokens(h, &base)?,
            metrics_public: h.metrics_public,
            status_page_public: h.status_page_public,
            refresh_s: h.refresh_s.max(1),
            events: schedulers.inbox(),
            kubernetes: schedulers.kube_hooks(),
            stats: Default::default(),
        };
        crate::http::serve(h, &base, api, &runtime)?;
    }
    // prices: the feed (a file, or a URL fetched every refresh_s), else the tariff
    let feed = Arc::new(std::sync::RwLock::new(prices.clone().unwrap_or_default()));
    let stale_after_s = cfg
        .prices
        .as_ref()
        .map_or(f64::INFINITY, |p| p.stale_after_s);
    let mut price_source = "";
    if let Some(p) = cfg.prices.clone() {
        if let Some(url) = p.url.clone() {
            let (feed, keep) = (feed.clone(), keep_going.clone());
            threads.push(
                std::thread::Builder::new()
                    .name("prices".into())
                    .spawn(move || {
                        let every = Duration::from_secs_f64(p.refresh_s);
                        while keep() {
                            let got = sources::http::fetch_text(
                                &url,
                                Duration::from_secs(30),
                                &sources::tls::Tls::default(),
                            )
                            .map_err(anyhow::Error::msg)
                            .and_then(|text| p.format.read(&url, &text, "price_per_kwh"));
                            match got {
                                Ok(series) => {
                                    info!(url = %url, points = series.points().len(), last = ?series.points().last().map(|p| p.0), "price feed fetched");
                                    feed.write().unwrap_or_else(|p| p.into_inner()).0 = series;
                                }
                                Err(e) => warn!(url = %url, error = %e, "price feed fetch failed; keeping the last series"),
                            }
                            let t = Instant::now();
                            while keep() && t.elapsed() < every {
                                std::thread::sleep(Duration::from_millis(100));
                            }
                        }
                    })?,
            );
        }
    }
    // systemd (Type=notify): ready now that every edge runs; the watchdog is pinged
    // by the loop itself, so a loop that stalls is restarted after WatchdogSec
    let mut notify = crate::notify::Notifier::from_env();
    notify.ready(&format!(
        "{} racks, {} GPUs; store {backend}",
        site.racks.len(),
        site.gpu_count()
    ));
    let mut next = Instant::now();
    let mut cadence = crate::cadence::Cadence::default();
    while keep_going() {
        notify.watchdog();
        cadence.start(next);
        let now = wall_clock();
        let (mut samples, dead) = buffer.drain();
        control.count_rejected(crate::admit::UNKNOWN_ENTITY, gate.take_refused());
        if !samples.is_empty() {
            last_source_sample = Some(now);
        }
        for e in &dead {
            control.mark_bad(e);
        }
        {
            let (price, carbon) = &*feed.read().unwrap_or_else(|p| p.into_inner());
            let site_id = site.site_entity();
            // the feed while it covers now; past its last point, the site's tariff
            let fresh = price
                .points()
                .last()
                .is_some_and(|(t, _)| now.secs_since(*t) <= stale_after_s)
                && price.at(now).is_some();
            let (value, source) = match (fresh, &site.tariff) {
                (true, _) => (price.at(now), "feed"),
                (false, Some(t)) => (Some(t.at(now, site.timezone).0), "tariff"),
                (false, None) => (price.at(now), "feed (stale)"),
            };
            if source != price_source {
                if source == "feed" {
                    info!(source, "price source");
                } else {
                    warn!(source, last_point = ?price.points().last().map(|p| p.0), "the price feed is stale or empty");
                }
                price_source = source;
            }
            if let Some(p) = value {
                let mut s = Sample::new(site_id.clone(), PRICE_PER_KWH, p, now, source);
                if source == "feed (stale)" {
                    s.quality = telemetry::Quality::Uncertain;
                }
                samples.push(s);
            }
            if let Some(c) = carbon.at(now) {
                samples.push(Sample::new(site_id, CARBON_G_PER_KWH, c, now, "prices"));
            }
            control.set_forecast(forecast(
                price,
                carbon,
                fresh,
                site.tariff.as_ref(),
                &site,
                now,
            ));
        }
        {
            let mut book = overrides.lock().unwrap_or_else(|p| p.into_inner());
            if book.expire(now) {
                if let Err(e) = book.save() {
                    warn!(error = %e, "cannot save the overrides");
                }
            }
            control.set_overrides(book.list.clone());
        }
        if let Some((text, status)) = reloader.between_ticks(&mut control, now) {
            let mut b = board.write().unwrap_or_else(|p| p.into_inner());
            if let Some(text) = text {
                b.policy_text = text;
            }
            b.policy_status = status;
        }
        // schedulers: their jobs in, the holds in force out (see crate::schedulers);
        // neither waits on a scheduler
        let jobs = schedulers.jobs();
        let report = control.tick(now, samples, jobs, actuator.as_mut());
        if !schedulers.is_empty() {
            let actuated = control.actuated().clone();
            schedulers.apply(&actuated, &report.decisions, now, control.store());
            if report.store_error.is_none() {
                schedulers.stored();
            }
        }
        for d in &report.decisions {
            info!(rule = %d.rule, target = %d.target, action = %d.action, "{}", d.reason);
        }
        // the API reads a copy of the tick; without [http] nobody does
        if cfg.http.is_some() {
            let mut b = board.write().unwrap_or_else(|p| p.into_inner());
            b.price_source = price_source.to_string();
            {
                let (price, _) = &*feed.read().unwrap_or_else(|p| p.into_inner());
                let horizon = now.plus_secs(24.0 * 3600.0);
                let pts = price.points();
                let from = pts.partition_point(|(t, _)| *t <= now).saturating_sub(1);
                b.prices = pts[from..]
                    .iter()
                    .take_while(|(t, _)| *t < horizon)
                    .copied()
                    .collect();
            }
            b.update(
                now,
                control.snapshot(),
                control.actuated(),
                &control.counters,
                &report.decisions,
                buffer.dropped.load(Ordering::Relaxed),
            );
            b.jobs = control.registry().active().to_vec();
            b.schedulers = schedulers.status();
            b.scheduler_counters = schedulers.counters();
            b.labeled_counters = crate::admit::labeled(
                cfg.mqtt.is_some().then(|| mqtt_rejects.counts()),
                schedulers.events_rejected(),
            );
            b.ready
                .after_tick(report.store_error.as_deref(), last_source_sample);
            b.cadence = cadence.clone();
            b.redfish = redfish.as_ref().map(|r| r.snapshot()).unwrap_or_default();
            drop(b);
        }
        if let Some(e) = report.store_error {
            warn!(error = %e, "store unavailable; writes kept for the next tick");
        }
        cadence.end();
        next += tick;
        // between ticks (at least once, even after a tick that ran late): the
        // reconcilers' store writes (a Slurm hold's intent waits for its commit here)
        loop {
            notify.watchdog();
            schedulers.commit_writes(
                control.store(),
                Duration::from_millis(20).min(next.saturating_duration_since(Instant::now())),
            );
            if !keep_going() || Instant::now() >= next {
                break;
            }
        }
    }
    notify.stopping();
    stop.store(true, Ordering::Relaxed);
    runtime.shutdown.cancel();
    schedulers.stop(control.store(), crate::runtime::DEFAULT_GRACE);
    for t in threads {
        let _ = t.join();
    }
    control.finish(wall_clock())?;
    runtime.stop(crate::runtime::DEFAULT_GRACE);
    let c = &control.counters;
    info!(
        ticks = c.ticks,
        accepted = c.samples_accepted,
        rejected = c.samples_rejected.values().sum::<u64>(),
        dropped = buffer.dropped.load(Ordering::Relaxed),
        decisions = c.decisions,
        "stopped"
    );
    Ok(())
}

/// Starts watching the policy file: the loop runs the file as it is now (an edit made
/// since `load` included), and the board shows its text and hash.
fn start_policy_watch(
    path: &Path,
    every_s: f64,
    control: &mut ControlLoop,
    board: &mut crate::http::Board,
) -> Result<crate::reload::Reloader> {
    let now = wall_clock();
    let (reloader, policy, text) =
        crate::reload::Reloader::start(path, every_s, control.site(), now)?;
    control.set_policy(policy);
    board.policy_text = text;
    board.policy_status = reloader.status().clone();
    Ok(reloader)
}

/// What the engine plans with: the next 48 hours of the feed while it is fresh, else
/// of the site's tariff (in 15-minute steps, so periods starting at any quarter hour
/// are kept); the carbon series as the feed has it.
fn forecast(
    price: &Series,
    carbon: &Series,
    fresh: bool,
    tariff: Option<&telemetry::tariff::Tariff>,
    site: &telemetry::Site,
    now: Timestamp,
) -> policies::Forecast {
    let horizon = now.plus_secs(48.0 * 3600.0);
    let window = |s: &Series| {
        let pts = s.points();
        let from = pts.partition_point(|(t, _)| *t <= now).saturating_sub(1);
        let kept: Vec<_> = pts[from..]
            .iter()
            .take_while(|(t, _)| *t < horizon)
            .copied()
            .collect();
        // the last step lasts as long as the one before it (hourly feeds: an hour)
        let step = match pts.len() {
            n if n >= 2 => pts[n - 1].0.secs_since(pts[n - 2].0),
            _ => 3600.0,
        };
        policies::StepSeries::new(kept, step)
    };
    let price = match (fresh, tariff) {
        (true, _) | (false, None) => window(price),
        (false, Some(t)) => {
            let start = Timestamp::from_secs((now.as_secs_f64() / 900.0).floor() as i64 * 900);
            let points = (0..192)
                .map(|i| {
                    let at = start.plus_secs(900.0 * i as f64);
                    (at, t.at(at, site.timezone).0)
                })
                .collect();
            policies::StepSeries::new(points, 900.0)
        }
    };
    policies::Forecast {
        price,
        carbon: window(carbon),
        stale: !fresh && tariff.is_none(),
    }
}
