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

use super::discover::Fetch;
use super::endpoint::{Endpoint, Plan};
use super::stats::EndpointStats;
use super::walk::Walk;
use super::{tls, EndpointConfig, RedfishError};
use crate::mapping::Reject;
use crate::{Sample, Timestamp};

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

/// What one poll of one endpoint gave.
#[derive(Debug, Clone, Default)]
pub struct Polled {
    pub endpoint: String,
    pub samples: Vec<Sample>,
    pub rejects: Vec<Reject>,
    /// The endpoint could not be polled at all (and is backing off).
    pub error: Option<String>,
    /// Skipped: still backing off after an earlier failure.
    pub skipped: bool,
    /// Not read in this poll: its discovery is still running (or waiting for a slot)
    /// and its readings come with a later poll.
    pub deferred: bool,
    /// Cut off at the poll deadline (the interval) before it finished.
    pub overrun: bool,
    /// This poll walked the whole tree.
    pub discovery: bool,
    pub elapsed: Duration,
    pub requests: usize,
}

impl Polled {
    fn named(ep: &Endpoint) -> Polled {
        Polled {
            endpoint: ep.cfg.name.clone(),
            ..Polled::default()
        }
    }

    /// An endpoint that could not be polled at all.
    fn failed(ep: &Endpoint, e: &RedfishError) -> Polled {
        Polled {
            error: Some(e.to_string()),
            rejects: vec![Reject {
                reason: e.reason(),
                detail: e.to_string(),
            }],
            ..Polled::named(ep)
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
    /// A walk from an earlier poll still running (a discovery).
    running: Option<JoinHandle<Polled>>,
    /// Where this endpoint's rediscovery cycle starts, spread by its name.
    first_rediscovery_at: u32,
    discovered_once: bool,
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
    log: super::super::log_limit::LogLimiter,
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
                ..opts
            },
            discoveries: Arc::new(Semaphore::new(discoveries)),
            log: super::super::log_limit::LogLimiter::new(Duration::from_secs(60)),
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
                        .map(|ep| Polled::failed(ep, &e))
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
        let started = Instant::now();
        let deadline = self.interval.map(|d| tokio::time::Instant::now() + d);
        let mut out: Vec<Option<Polled>> = vec![None; self.endpoints.len()];
        let mut started_now = Vec::new();
        for (i, ep) in self.endpoints.iter().enumerate() {
            let slot = &mut self.slots[i];
            if let Some(h) = slot.running.take() {
                if h.is_finished() {
                    out[i] = Some(joined(ep, h.await));
                } else {
                    slot.running = Some(h);
                    out[i] = Some(Polled {
                        deferred: true,
                        ..Polled::named(ep)
                    });
                }
                continue;
            }
            if slot.retry_at.is_some_and(|t| t > started) {
                ep.counters.skipped();
                out[i] = Some(Polled {
                    skipped: true,
                    ..Polled::named(ep)
                });
                continue;
            }
            let discovery = ep.needs_discovery(self.opts.rediscover_every);
            let first_polls = if slot.discovered_once {
                0
            } else {
                slot.first_rediscovery_at
            };
            let job = walk(
                ep.clone(),
                now,
                discovery,
                self.discoveries.clone(),
                self.discovery_deadline(),
                first_polls,
            );
            started_now.push((i, tokio::spawn(job), discovery));
        }
        for (i, mut h, discovery) in started_now {
            let ep = &self.endpoints[i];
            let done = match deadline {
                None => Some((&mut h).await),
                Some(d) => tokio::time::timeout_at(d, &mut h).await.ok(),
            };
            out[i] = Some(match done {
                Some(r) => joined(ep, r),
                None if discovery => {
                    self.slots[i].running = Some(h);
                    Polled {
                        deferred: true,
                        discovery: true,
                        ..Polled::named(ep)
                    }
                }
                None => {
                    h.abort();
                    ep.counters.overrun();
                    let e = ep.fail("", "deadline", None, "poll not done within its interval");
                    Polled {
                        overrun: true,
                        ..Polled::failed(ep, &e)
                    }
                }
            });
        }
        let out: Vec<Polled> = out
            .into_iter()
            .zip(&self.endpoints)
            .map(|(p, ep)| p.unwrap_or_else(|| Polled::named(ep)))
            .collect();
        self.settle(&out);
        out
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

    /// Polls every `interval` until `shutdown` completes, handing each poll's results
    /// to `sink`. A poll never outlasts the interval (its deadline); the next starts on
    /// the next tick, and a tick missed meanwhile is not caught up (no burst).
    pub async fn run<C, S, F>(mut self, interval: Duration, clock: C, shutdown: S, mut sink: F)
    where
        C: Fn() -> Timestamp,
        S: Future<Output = ()>,
        F: FnMut(Vec<Polled>),
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
            let polled = tokio::select! {
                _ = &mut shutdown => break,
                p = self.poll_async(clock()) => p,
            };
            let took = t.elapsed();
            if took > interval + Duration::from_millis(500) {
                tracing::warn!(
                    took_ms = took.as_millis() as u64,
                    "redfish poll took longer than its interval"
                );
            }
            sink(polled);
        }
    }
}

impl Drop for Poller {
    fn drop(&mut self) {
        for s in &mut self.slots {
            if let Some(h) = s.running.take() {
                h.abort();
            }
        }
        if let Some(rt) = self.rt.take() {
            // dropping a runtime may block, which a runtime's own thread must not do
            rt.shutdown_background();
        }
    }
}

/// A walk's result, or a failure for a walk that panicked.
fn joined(ep: &Endpoint, r: Result<Polled, tokio::task::JoinError>) -> Polled {
    r.unwrap_or_else(|e| {
        Polled::failed(
            ep,
            &ep.fail("", "config", None, format!("the walk ended: {e}")),
        )
    })
}

/// One walk of one endpoint: the re-reads of its plan, or a discovery (which first
/// waits for one of the poller's discovery slots, then has `deadline` to finish).
async fn walk(
    ep: Arc<Endpoint>,
    now: Timestamp,
    discovery: bool,
    slots: Arc<Semaphore>,
    deadline: Duration,
    first_polls: u32,
) -> Polled {
    if !discovery {
        let t = Instant::now();
        let plan = {
            let mut g = ep.plan.lock().unwrap_or_else(|p| p.into_inner());
            g.as_mut().map(|p| {
                p.polls += 1;
                p.reads.clone()
            })
        };
        if let Some(reads) = plan {
            let fetch = Fetch::new(&ep);
            let got = fetch.replay(&reads).await;
            let (requests, rejects) = fetch.into_parts();
            let mut p = match got {
                Ok(items) => {
                    let mut w = Walk::new(&ep.cfg.name, now);
                    w.read_all(&items);
                    w.out.rejects = rejects;
                    w.out
                }
                Err(e) => {
                    if e.is_gone() {
                        // the tree changed: the next poll discovers it again
                        *ep.plan.lock().unwrap_or_else(|p| p.into_inner()) = None;
                    }
                    Polled::failed(&ep, &e)
                }
            };
            p.requests = requests;
            p.elapsed = t.elapsed();
            ep.counters.polled(p.elapsed);
            return p;
        }
    }
    let Ok(_slot) = slots.acquire_owned().await else {
        return Polled::failed(&ep, &ep.fail("", "config", None, "poller closed"));
    };
    let t = Instant::now();
    let fetch = Fetch::new(&ep);
    let got = match tokio::time::timeout(deadline, fetch.discover()).await {
        Ok(r) => r,
        Err(_) => Err(ep.fail(
            "/redfish/v1",
            "deadline",
            None,
            format!("discovery not done within {:.0} s", deadline.as_secs_f64()),
        )),
    };
    let (requests, rejects) = fetch.into_parts();
    let mut p = match got {
        Ok(items) => {
            let mut w = Walk::new(&ep.cfg.name, now);
            w.read_all(&items);
            *ep.plan.lock().unwrap_or_else(|p| p.into_inner()) = Some(Plan {
                reads: std::mem::take(&mut w.plan),
                polls: first_polls,
            });
            w.out.rejects = rejects;
            w.out
        }
        Err(e) => {
            if e.reason() == "deadline" {
                ep.counters.failure(e.failure());
            }
            Polled::failed(&ep, &e)
        }
    };
    p.discovery = true;
    p.requests = requests;
    p.elapsed = t.elapsed();
    ep.counters.polled(p.elapsed);
    p
}

/// The counters of every endpoint, readable while the poller runs elsewhere.
#[derive(Clone)]
pub struct StatsHandle(Vec<(String, Arc<super::stats::Counters>)>);

impl StatsHandle {
    pub fn snapshot(&self) -> Vec<EndpointStats> {
        self.0.iter().map(|(n, c)| c.snapshot(n)).collect()
    }
}
