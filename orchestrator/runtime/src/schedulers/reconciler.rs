//! One scheduler adapter's reconciler, on a thread of its own: it polls the
//! scheduler's jobs into a shared cache the control loop reads, and brings the
//! scheduler to the newest desired state the loop handed it.
//!
//! The desired state travels in a watch channel: one slot, the newest state wins
//! (commands never drop: a state that is superseded before it was applied is carried
//! by the next one, since applying is idempotent and each state is complete). Each
//! call has the adapter's deadline; a pass with failures is retried after a backoff
//! (doubling up to [`MAX_BACKOFF`]); what a pass applied (the acks) and the adapter's
//! view, status and counters go back through the cache. The loop never waits on a
//! reconciler: it only swaps the slot and copies the cache.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use integrations::scheduler::{Applied, Counter, Desired, Requeues, Scheduler, SchedulerId, View};
use telemetry::{Job, Timestamp};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::store_link::StoreLink;
use common::wall_clock;

/// The first retry after a failed pass waits this long; each next one twice as long.
pub const BACKOFF: Duration = Duration::from_secs(1);
pub const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// Acks kept for the loop at most; beyond it the oldest are dropped and counted.
pub const ACKS: usize = 10_000;

/// One thing a reconciler applied, with when and where: the loop logs it to the
/// store (log `scheduler_acks`) and keeps the most recent for the API.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Ack {
    pub time: Timestamp,
    pub scheduler: SchedulerId,
    #[serde(flatten)]
    pub applied: Applied,
}

/// What a reconciler reports, read by the loop each tick.
#[derive(Debug, Default)]
pub struct Reported {
    /// The jobs of the last poll that answered.
    pub jobs: Vec<Job>,
    pub view: View,
    pub status: serde_json::Value,
    pub counters: Vec<Counter>,
    /// What passes applied since the loop last took them.
    pub acks: VecDeque<Ack>,
    pub acks_dropped: u64,
    /// Requeues carried out (or tried) up to this sequence number.
    pub requeued_up_to: u64,
    pub passes: u64,
    pub polls: u64,
    /// Successful polls: the plan's [`Desired::polls`] names the one it saw.
    pub poll_seq: u64,
    /// Since when the reconciler has been in a call to its scheduler (poll or pass).
    pub busy_since: Option<Instant>,
    pub last_pass: Option<Timestamp>,
}

/// The loop's handle on one reconciler.
pub struct Reconciler {
    pub id: SchedulerId,
    /// What the adapter declared: how its jobs' requeues go, and whether it reports
    /// its status and counters under its own name.
    pub requeues: Requeues,
    pub reports: bool,
    desired: watch::Sender<Option<Arc<Desired>>>,
    shared: Arc<Mutex<Reported>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// How a reconciler runs.
pub struct Settings {
    /// Between polls of the scheduler's jobs (`None`: the adapter does not poll).
    pub poll_every: Option<Duration>,
    pub handle: tokio::runtime::Handle,
    pub shutdown: CancellationToken,
    pub store: StoreLink,
}

impl Reconciler {
    /// Starts the reconciler of `adapter` on a thread of its own.
    pub fn start(adapter: Box<dyn Scheduler>, settings: Settings) -> std::io::Result<Self> {
        let (id, requeues, reports) = (adapter.id(), adapter.requeues(), adapter.reports());
        let (desired, rx) = watch::channel(None);
        let shared = Arc::new(Mutex::new(Reported {
            status: adapter.status(),
            counters: adapter.counters(),
            view: adapter.view(),
            ..Default::default()
        }));
        let cache = shared.clone();
        let thread = std::thread::Builder::new()
            .name(format!("sched-{id}"))
            .spawn(move || Worker::new(adapter, settings, rx, cache).run())?;
        Ok(Reconciler {
            id,
            requeues,
            reports,
            desired,
            shared,
            thread: Some(thread),
        })
    }

    /// Hands the reconciler the newest desired state (it supersedes any not applied).
    pub fn want(&self, desired: Arc<Desired>) {
        self.desired.send_replace(Some(desired));
    }

    /// What the reconciler reported last.
    pub fn reported(&self) -> MutexGuard<'_, Reported> {
        self.shared.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn is_finished(&self) -> bool {
        self.thread.as_ref().is_none_or(|t| t.is_finished())
    }

    /// Joins a finished thread; one still in a call is left to end on its own.
    pub fn join(&mut self) -> bool {
        match self.thread.take() {
            Some(t) if t.is_finished() => {
                let _ = t.join();
                true
            }
            Some(t) => {
                self.thread = Some(t);
                false
            }
            None => true,
        }
    }
}

enum Woken {
    Stop,
    Changed,
    Timer,
}

struct Worker {
    adapter: Box<dyn Scheduler>,
    settings: Settings,
    rx: watch::Receiver<Option<Arc<Desired>>>,
    shared: Arc<Mutex<Reported>>,
    next_poll: Instant,
    /// A pass is wanted (a new desired state, a poll, or a failed pass to retry).
    pending: bool,
    retry_at: Option<Instant>,
    backoff: Duration,
    requeued_up_to: u64,
    /// Successful polls, and the one the last pass applied a plan of.
    poll_seq: u64,
    applied_poll: u64,
    /// `scheduler_call_seconds` of this scheduler: poll, apply, requeue.
    calls: [Arc<telemetry::histogram::Histogram>; 3],
}

/// The histograms of `id`'s calls, in the order of [`Worker::calls`].
fn call_histograms(id: SchedulerId) -> [Arc<telemetry::histogram::Histogram>; 3] {
    let id = id.to_string();
    ["poll", "apply", "requeue"].map(|call| {
        telemetry::histogram::registry(
            "scheduler_call_seconds",
            "Calls to the schedulers by the reconcilers, by scheduler and call (poll: its jobs read; apply: a pass of the desired state; requeue), failed ones included",
            &[("scheduler", &id), ("call", call)],
        )
    })
}

impl Worker {
    fn new(
        adapter: Box<dyn Scheduler>,
        settings: Settings,
        rx: watch::Receiver<Option<Arc<Desired>>>,
        shared: Arc<Mutex<Reported>>,
    ) -> Self {
        Worker {
            calls: call_histograms(adapter.id()),
            adapter,
            settings,
            rx,
            shared,
            next_poll: Instant::now(),
            pending: false,
            retry_at: None,
            backoff: BACKOFF,
            requeued_up_to: 0,
            poll_seq: 0,
            applied_poll: 0,
        }
    }

    fn cache(&self) -> MutexGuard<'_, Reported> {
        self.shared.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn run(mut self) {
        let id = self.adapter.id();
        info!(scheduler = %id, poll_s = ?self.settings.poll_every.map(|d| d.as_secs_f64()), "scheduler reconciler starting");
        while !self.settings.shutdown.is_cancelled() {
            if self.poll_due() {
                self.poll();
            }
            let ready = self.retry_at.is_none_or(|t| Instant::now() >= t);
            let due = self.adapter.next_due().is_some_and(|t| t <= wall_clock());
            if self.current() && ready && (self.pending || due) {
                self.pass();
            }
            match self.wait() {
                Woken::Stop => break,
                Woken::Changed => self.pending = true,
                Woken::Timer => {}
            }
        }
        info!(scheduler = %id, "scheduler reconciler stopped");
    }

    /// The next poll waits until a plan computed on the last one has been applied
    /// (or, should no plan come, three intervals).
    fn poll_due(&self) -> bool {
        let Some(every) = self.settings.poll_every else {
            return false;
        };
        let now = Instant::now();
        now >= self.next_poll
            && (self.applied_poll >= self.poll_seq || now >= self.next_poll + every * 2)
    }

    /// The newest desired state was computed on the adapter's latest poll (adapters
    /// that do not poll take every state).
    fn current(&self) -> bool {
        let rx = self.rx.borrow();
        let Some(d) = rx.as_ref() else {
            return false;
        };
        self.settings.poll_every.is_none()
            || (self.poll_seq > 0 && d.polls.get(&self.adapter.id()) == Some(&self.poll_seq))
    }

    fn poll(&mut self) {
        let started = Instant::now();
        self.cache().busy_since = Some(started);
        let got = self.adapter.poll(wall_clock(), &mut self.settings.store);
        self.calls[0].observe(started.elapsed());
        if let Some(every) = self.settings.poll_every {
            self.next_poll = Instant::now() + every;
        }
        let (view, status, counters) = (
            self.adapter.view(),
            self.adapter.status(),
            self.adapter.counters(),
        );
        let jobs = match got {
            Ok(Some(jobs)) => {
                self.poll_seq += 1;
                Some(jobs)
            }
            Ok(None) => None,
            Err(e) => {
                warn!(scheduler = %self.adapter.id(), error = %e, "scheduler poll failed; the loop keeps the last view of its jobs");
                None
            }
        };
        let poll_seq = self.poll_seq;
        let mut c = self.cache();
        c.busy_since = None;
        c.polls += 1;
        if let Some(jobs) = jobs {
            c.jobs = jobs;
        }
        c.poll_seq = poll_seq;
        (c.view, c.status, c.counters) = (view, status, counters);
        drop(c);
        // what the poll found may change what applying does (a job now pending)
        self.pending = true;
    }

    /// One pass: the newest desired state applied, then the requeues not yet done.
    fn pass(&mut self) {
        let Some(desired) = self.rx.borrow_and_update().clone() else {
            return;
        };
        self.pending = false;
        self.applied_poll = self.poll_seq;
        let started = Instant::now();
        self.cache().busy_since = Some(started);
        let pass = self
            .adapter
            .apply(&desired, wall_clock(), &mut self.settings.store);
        self.calls[1].observe(started.elapsed());
        let mut applied = pass.applied;
        let mine = self.adapter.id();
        for r in desired
            .requeues
            .iter()
            .filter(|r| r.seq > self.requeued_up_to)
        {
            if r.job.scheduler() == mine {
                let started = Instant::now();
                let requeued = self.adapter.requeue(&r.job);
                self.calls[2].observe(started.elapsed());
                let detail = match requeued {
                    Ok(()) => format!("requeued: {}", r.reason),
                    Err(e) => format!("requeue failed: {e}"),
                };
                applied.push(Applied {
                    job: r.job.to_string(),
                    action: "requeue",
                    detail,
                });
            }
        }
        if let Some(last) = desired.requeues.iter().map(|r| r.seq).max() {
            self.requeued_up_to = self.requeued_up_to.max(last);
        }
        if pass.failed > 0 {
            self.retry_at = Some(Instant::now() + self.backoff);
            warn!(scheduler = %mine, failed = pass.failed, retry_in_s = self.backoff.as_secs_f64(), "scheduler calls failed; retrying after a backoff");
            self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
            self.pending = true;
        } else {
            self.retry_at = None;
            self.backoff = BACKOFF;
        }
        for a in &applied {
            info!(scheduler = %mine, job = %a.job, action = a.action, "{}", a.detail);
        }
        let (view, status, counters) = (
            self.adapter.view(),
            self.adapter.status(),
            self.adapter.counters(),
        );
        let mut c = self.cache();
        c.busy_since = None;
        c.passes += 1;
        c.last_pass = Some(wall_clock());
        c.requeued_up_to = self.requeued_up_to;
        for a in applied {
            if c.acks.len() == ACKS {
                c.acks.pop_front();
                c.acks_dropped += 1;
            }
            c.acks.push_back(Ack {
                time: wall_clock(),
                scheduler: mine,
                applied: a,
            });
        }
        (c.view, c.status, c.counters) = (view, status, counters);
    }

    /// Sleeps until the next poll, the retry, the adapter's next due time or (when no
    /// pass is waiting already) a new desired state; or until shutdown.
    fn wait(&mut self) -> Woken {
        let now = Instant::now();
        let mut until = now + Duration::from_secs(1);
        if let Some(every) = self.settings.poll_every {
            let waiting_for_plan = self.applied_poll < self.poll_seq;
            until = until.min(match waiting_for_plan {
                false => self.next_poll,
                true => self.next_poll + every * 2,
            });
        }
        if let Some(t) = self.retry_at.filter(|_| self.pending) {
            until = until.min(t);
        }
        if let (None, Some(t)) = (self.retry_at, self.adapter.next_due()) {
            let secs = t.secs_since(wall_clock()).max(0.0);
            until = until.min(now + Duration::from_secs_f64(secs.min(1.0)));
        }
        // a pass that waits for its backoff needs no wake-up; one that waits for a plan
        // on the latest poll does
        let listen = !self.pending || !self.current();
        let (token, rx) = (self.settings.shutdown.clone(), &mut self.rx);
        self.settings.handle.block_on(async move {
            let changed = async {
                if !listen || rx.changed().await.is_err() {
                    // nothing to listen for (or the loop is gone): only the timer
                    std::future::pending::<()>().await;
                }
            };
            tokio::select! {
                _ = token.cancelled() => Woken::Stop,
                _ = changed => Woken::Changed,
                _ = tokio::time::sleep_until(until.into()) => Woken::Timer,
            }
        })
    }
}

#[cfg(test)]
#[path = "reconciler_tests.rs"]
mod tests;
