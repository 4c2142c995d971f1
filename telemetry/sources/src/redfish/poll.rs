//! The Redfish poller: every endpoint walked in parallel on tokio, under a global
//! limit of GETs in flight (`concurrency`) and one per endpoint (`per_endpoint`), with
//! a deadline per poll (the interval), backoff with jitter for an endpoint that fails,
//! and discoveries that may outlast a poll running on in the background. `serve` runs
//! [`Poller::run`] on its runtime; `telemetry probe` and the tests call the blocking
//! [`Poller::poll`].

use std::future::Future;
use std::hash::{BuildHasher, Hasher};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;
use tokio::task::JoinHandle;

use super::endpoint::Endpoint;
pub use super::polled::{BindingReport, Polled};
use super::stats::EndpointStats;
use super::task;
use super::{tls, EndpointConfig, RedfishError};
use telemetry::Timestamp;

/// How hard the poller may push the BMCs.
#[derive(Debug, Clone, PartialEq)]
pub struct Options {
    /// GETs in flight over all endpoints.
    pub concurrency: usize,
    /// GETs in flight to one endpoint.
    pub per_endpoint: usize,
    /// Polls between two full discoveries of an endpoint's tree (new outlets, a
    /// swapped PDU); in between only the resources that gave readings are read.
    pub rediscover_every: u32,
    /// The longest an endpoint that keeps failing waits between two tries.
    pub backoff_max: Duration,
}

/// Polls between two full discoveries, by default.
pub const REDISCOVER_EVERY: u32 = 360;

impl Default for Options {
    fn default() -> Self {
        Options {
            concurrency: 256,
            per_endpoint: 4,
            rediscover_every: REDISCOVER_EVERY,
            backoff_max: Duration::from_secs(300),
        }
    }
}

/// 1 s, 2 s, 4 s ... up to 5 min between tries of a dead endpoint (before jitter).
pub fn backoff(failures: u32) -> Duration {
    Duration::from_secs((1u64 << failures.saturating_sub(1).min(9)).min(300))
}

/// `d` spread over 0.75..1.25 of itself, so that endpoints that failed together do
/// not all come back in the same instant.
fn jitter(d: Duration, seed: u64) -> Duration {
    d.mul_f64(0.75 + (seed % 1000) as f64 / 2000.0)
}

/// One endpoint's place in the poller.
struct Slot {
    failures: u32,
    retry_at: Option<Instant>,
    /// A discovery from an earlier poll still running.
    running: Option<Running>,
    /// Where this endpoint's rediscovery cycle starts, spread by its name.
    first_rediscovery_at: u32,
    discovered_once: bool,
}

/// A discovery that outlasted the poll that started it.
struct Running {
    handle: JoinHandle<Option<Polled>>,
    /// A rediscovery of an endpoint that has a plan: its plan is re-read meanwhile,
    /// and the rediscovery's own readings are not delivered (the re-reads are newer).
    again: bool,
}

/// Polls many endpoints in parallel, with backoff for the ones that fail.
pub struct Poller {
    pub endpoints: Vec<Arc<Endpoint>>,
    slots: Vec<Slot>,
    /// The deadline of one poll, normally its interval: a re-read not done by then is
    /// cut off (`overrun`); a discovery goes on in the background (`deferred`).
    /// `None`: wait for every walk.
    pub interval: Option<Duration>,
    opts: Options,
    /// Discoveries at once: at most half the global limit, so that re-reads of the
    /// endpoints already discovered always have the other half.
    discoveries: Arc<Semaphore>,
    log: telemetry::log_limit::LogLimiter,
    seed: std::collections::hash_map::RandomState,
    /// The runtime of the blocking [`Poller::poll`], started on its first call.
    rt: Option<tokio::runtime::Runtime>,
}

impl Poller {
    /// A poller with `concurrency` GETs in flight and the other [`Options`] defaults.
    pub fn new(configs: Vec<EndpointConfig>, concurrency: usize) -> Result<Self, RedfishError> {
        Self::with_options(
            configs,
            Options {
                concurrency,
                ..Options::default()
            },
        )
    }

    pub fn with_options(configs: Vec<EndpointConfig>, opts: Options) -> Result<Self, RedfishError> {
        let concurrency = opts.concurrency.max(1);
        let per = opts.per_endpoint.max(1);
        let global = Arc::new(Semaphore::new(concurrency));
        // one client (one connection pool) per distinct TLS setting and timeout
        let mut clients: std::collections::BTreeMap<String, reqwest::Client> =
            std::collections::BTreeMap::new();
        let (mut endpoints, mut slots) = (Vec::new(), Vec::new());
        for cfg in configs {
            let key = format!("{:?}/{}", cfg.tls, cfg.timeout_s);
            let client = match clients.get(&key) {
                Some(c) => c.clone(),
                None => {
                    let c = tls::client(&cfg)?;
                    clients.insert(key, c.clone());
                    c
                }
            };
            let every = opts.rediscover_every.max(1);
            let offset = cfg
                .name
                .bytes()
                .fold(0u32, |h, b| h.wrapping_mul(31).wrapping_add(u32::from(b)))
                % every;
            endpoints.push(Arc::new(Endpoint::with_client(
                cfg,
                client,
                per,
                global.clone(),
            )));
            slots.push(Slot {
                failures: 0,
                retry_at: None,
                running: None,
                first_rediscovery_at: offset,
                discovered_once: false,
            });
        }
        let discoveries = (concurrency / (2 * per)).max(concurrency.min(4)).max(1);
        Ok(Poller {
            endpoints,
            slots,
            interval: None,
            opts: Options {
                concurrency,
                per_endpoint: per,
                rediscover_every: opts.rediscover_every.max(1),
                ..opts
            },
            discoveries: Arc::new(Semaphore::new(discoveries)),
            // keys are endpoint × reason: bounded by the config, not by what BMCs send
            log: telemetry::log_limit::LogLimiter::new(Duration::from_secs(60))
                .with_max_keys(16_384),
            seed: std::collections::hash_map::RandomState::new(),
            rt: None,
        })
    }

    pub fn options(&self) -> &Options {
        &self.opts
    }

    /// Every endpoint's counters now, in config order.
    pub fn stats(&self) -> StatsHandle {
        StatsHandle(
            self.endpoints
                .iter()
                .map(|e| (e.cfg.name.clone(), e.counters.clone()))
                .collect(),
        )
    }

    /// Polls every endpoint that is not backing off, blocking; one result per
    /// endpoint, in order. Not to be called from inside a tokio runtime.
    pub fn poll(&mut self, now: Timestamp) -> Vec<Polled> {
        let rt = match self.rt.take() {
            Some(rt) => rt,
            None => match tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .thread_name("redfish")
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    let e = RedfishError::Config {
                        endpoint: "*".into(),
                        message: format!("cannot start the poller's runtime: {e}"),
                    };
                    return self
                        .endpoints
                        .iter()
                        .map(|ep| Polled::failed(&ep.cfg.name, &e))
                        .collect();
                }
            },
        };
        let out = rt.block_on(self.poll_async(now));
        self.rt = Some(rt);
        out
    }

    /// One poll: every endpoint at once, under the limits, until the deadline.
    pub async fn poll_async(&mut self, now: Timestamp) -> Vec<Polled> {
        self.poll_streaming(now, |_| {}).await
    }

    /// One poll, handing each endpoint's result to `on_done` as soon as it is known
    /// (it may take the samples); all results, in endpoint order, at the end.
    pub async fn poll_streaming<F: FnMut(&mut Polled)>(
        &mut self,
        now: Timestamp,
        mut on_done: F,
    ) -> Vec<Polled> {
        let started = Instant::now();
        let deadline = self.interval.map(|d| tokio::time::Instant::now() + d);
        let n = self.endpoints.len();
        let mut out: Vec<Option<Polled>> = vec![None; n];
        // one result per endpoint at most: never full
        let (tx, mut rx) = tokio::sync::mpsc::channel::<(usize, Polled)>(n.max(1));
        let mut in_flight: Vec<Option<(JoinHandle<Option<Polled>>, bool)>> = Vec::new();
        in_flight.resize_with(n, || None);
        for i in 0..n {
            match self.start(i, now, started, &tx).await {
                Started::Done(mut p) => {
                    on_done(&mut p);
                    out[i] = Some(p);
                }
                Started::Walking(h, discovery) => in_flight[i] = Some((h, discovery)),
            }
        }
        drop(tx);
        let mut left = in_flight.iter().filter(|h| h.is_some()).count();
        let mut take = |i: usize, mut p: Polled, out: &mut Vec<Option<Polled>>| {
            on_done(&mut p);
            out[i] = Some(p);
        };
        while left > 0 {
            let got = match deadline {
                None => rx.recv().await,
                Some(d) => tokio::time::timeout_at(d, rx.recv()).await.ok().flatten(),
            };
            let Some((i, p)) = got else { break };
            in_flight[i] = None;
            take(i, p, &mut out);
            left -= 1;
        }
        // what arrived as the deadline struck still counts; later walks keep their result
        rx.close();
        while let Ok((i, p)) = rx.try_recv() {
            in_flight[i] = None;
            take(i, p, &mut out);
        }
        for (i, h) in in_flight.into_iter().enumerate() {
            if let Some((h, discovery)) = h {
                let p = self.cut_off(i, h, discovery);
                take(i, p, &mut out);
            }
        }
        let out: Vec<Polled> = out
            .into_iter()
            .zip(&self.endpoints)
            .map(|(p, ep)| p.unwrap_or_else(|| Polled::named(&ep.cfg.name)))
            .collect();
        self.settle(&out);
        out
    }

    /// Starts endpoint `i`'s walk for this poll; its result at once when there is
    /// nothing to wait for (backing off, still discovering).
    async fn start(
        &mut self,
        i: usize,
        now: Timestamp,
        started: Instant,
        tx: &tokio::sync::mpsc::Sender<(usize, Polled)>,
    ) -> Started {
        let ep = self.endpoints[i].clone();
        let deadline = self.discovery_deadline();
        let slot = &mut self.slots[i];
        let mut again_running = false;
        if let Some(run) = slot.running.take() {
            if !run.handle.is_finished() {
                again_running = run.again;
                let initial = !run.again;
                slot.running = Some(run);
                if initial {
                    return Started::Done(Polled {
                        deferred: true,
                        discovery: true,
                        ..Polled::named(&ep.cfg.name)
                    });
                }
            } else {
                let p = joined(&ep, run.handle.await);
                if !run.again {
                    return Started::Done(p);
                }
                // a rediscovery: its plan is in place; the re-read below reads now
                if let Some(e) = &p.error {
                    tracing::debug!(endpoint = %ep.cfg.name, error = %e, "redfish rediscovery failed; the old plan stays");
                }
            }
        }
        if slot.retry_at.is_some_and(|t| t > started) {
            ep.counters.skipped();
            return Started::Done(Polled {
                skipped: true,
                ..Polled::named(&ep.cfg.name)
            });
        }
        let first_polls = if slot.discovered_once {
            0
        } else {
            slot.first_rediscovery_at
        };
        let due = ep
            .plan
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(|p| p.polls >= self.opts.rediscover_every);
        let slots = self.discoveries.clone();
        let Some(due) = due else {
            // never discovered (or the tree changed): this poll discovers
            let job = task::discover(ep, now, slots, deadline, first_polls, false);
            return Started::Walking(tokio::spawn(deliver(i, Some(tx.clone()), job)), true);
        };
        if due && !again_running {
            // rediscover in the background while the plan is still re-read
            let job = task::discover(ep.clone(), now, slots, deadline, 0, true);
            slot.running = Some(Running {
                handle: tokio::spawn(deliver(i, None, job)),
                again: true,
            });
        }
        let job = task::replay(ep, now);
        Started::Walking(tokio::spawn(deliver(i, Some(tx.clone()), job)), false)
    }

    /// A walk not done at the deadline: a re-read is cut off (`overrun`); a discovery
    /// goes on in the background and reports with a later poll.
    fn cut_off(&mut self, i: usize, h: JoinHandle<Option<Polled>>, discovery: bool) -> Polled {
        let ep = &self.endpoints[i];
        if discovery {
            self.slots[i].running = Some(Running {
                handle: h,
                again: false,
            });
            return Polled {
                deferred: true,
                discovery: true,
                ..Polled::named(&ep.cfg.name)
            };
        }
        h.abort();
        ep.counters.overrun();
        let e = ep.fail("", "deadline", None, "poll not done within its interval");
        Polled {
            overrun: true,
            ..Polled::failed(&ep.cfg.name, &e)
        }
    }

    /// How long one discovery may take: six intervals (at least 30 s), else 2 min.
    fn discovery_deadline(&self) -> Duration {
        self.interval.map_or(Duration::from_secs(120), |iv| {
            (iv * 6).max(Duration::from_secs(30))
        })
    }

    /// Backoff, health and (rate-limited) log lines from a poll's results.
    fn settle(&mut self, results: &[Polled]) {
        let now = Instant::now();
        self.log
            .warn_suppressed("redfish", std::time::Instant::now());
        for (i, r) in results.iter().enumerate() {
            if r.skipped || r.deferred {
                continue;
            }
            let (ep, slot) = (&self.endpoints[i], &mut self.slots[i]);
            if r.discovery && r.error.is_none() {
                slot.discovered_once = true;
            }
            for rej in &r.rejects {
                if let Some(left_out) = self
                    .log
                    .allow(&format!("{}:{}", ep.cfg.name, rej.reason), now)
                {
                    tracing::warn!(endpoint = %ep.cfg.name, reason = rej.reason, left_out, "redfish: {}", rej.detail);
                }
            }
            if let Some(e) = &r.error {
                slot.failures += 1;
                let mut h = self.seed.build_hasher();
                h.write(ep.cfg.name.as_bytes());
                h.write_u32(slot.failures);
                let wait = jitter(
                    backoff(slot.failures).min(self.opts.backoff_max),
                    h.finish(),
                );
                slot.retry_at = Some(now + wait);
                ep.counters.backing_off(true);
                tracing::debug!(endpoint = %ep.cfg.name, failures = slot.failures, retry_in_s = wait.as_secs_f64(), error = %e, "redfish endpoint backing off");
            } else {
                if slot.failures > 0 {
                    tracing::info!(endpoint = %ep.cfg.name, failures = slot.failures, "redfish endpoint answers again");
                }
                slot.failures = 0;
                slot.retry_at = None;
                ep.counters.backing_off(false);
            }
        }
    }

    /// Polls every `interval` until `shutdown` completes, handing each endpoint's
    /// result to `sink` as soon as it is read. A poll never outlasts the interval (its
    /// deadline); the next starts on the next tick, and a tick missed meanwhile is not
    /// caught up (no burst).
    pub async fn run<C, S, F>(mut self, interval: Duration, clock: C, shutdown: S, mut sink: F)
    where
        C: Fn() -> Timestamp,
        S: Future<Output = ()>,
        F: FnMut(&mut Polled),
    {
        self.interval = Some(interval);
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                _ = &mut shutdown => break,
                _ = ticker.tick() => {}
            }
            let t = Instant::now();
            tokio::select! {
                _ = &mut shutdown => break,
                _ = self.poll_streaming(clock(), &mut sink) => {}
            }
            let took = t.elapsed();
            if took > interval + Duration::from_millis(500) {
                tracing::warn!(
                    took_ms = took.as_millis() as u64,
                    "redfish poll took longer than its interval"
                );
            }
        }
    }
}

impl Drop for Poller {
    fn drop(&mut self) {
        for s in &mut self.slots {
            if let Some(r) = s.running.take() {
                r.handle.abort();
            }
        }
        if let Some(rt) = self.rt.take() {
            // dropping a runtime may block, which a runtime's own thread must not do
            rt.shutdown_background();
        }
    }
}

/// A walk's result, or a failure for a walk that panicked.
fn joined(ep: &Endpoint, r: Result<Option<Polled>, tokio::task::JoinError>) -> Polled {
    match r {
        Ok(Some(p)) => p,
        Ok(None) => Polled::named(&ep.cfg.name),
        Err(e) => Polled::failed(
            &ep.cfg.name,
            &ep.fail("", "config", None, format!("the walk ended: {e}")),
        ),
    }
}

/// What starting an endpoint's walk gave.
enum Started {
    Done(Polled),
    /// A task, and whether it is a discovery.
    Walking(JoinHandle<Option<Polled>>, bool),
}

/// Runs a walk and hands its result to the poll that started it; once that poll is
/// over (its channel closed), the result stays with the task for a later poll.
async fn deliver(
    i: usize,
    tx: Option<tokio::sync::mpsc::Sender<(usize, Polled)>>,
    walk: impl Future<Output = Polled>,
) -> Option<Polled> {
    let p = walk.await;
    match tx {
        Some(tx) => match tx.try_send((i, p)) {
            Ok(()) => None,
            Err(tokio::sync::mpsc::error::TrySendError::Closed((_, p)))
            | Err(tokio::sync::mpsc::error::TrySendError::Full((_, p))) => Some(p),
        },
        None => Some(p),
    }
}

/// The counters of every endpoint, readable while the poller runs elsewhere.
#[derive(Clone)]
pub struct StatsHandle(Vec<(String, Arc<super::stats::Counters>)>);

impl StatsHandle {
    pub fn snapshot(&self) -> Vec<EndpointStats> {
        self.0.iter().map(|(n, c)| c.snapshot(n)).collect()
    }
}
