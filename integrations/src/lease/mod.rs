//! Leader election through the shared store: one replica of `serve` holds a lease and
//! actuates; the others follow.
//!
//! The election is a pure state machine ([`Election`]) over a [`LeaseStore`] and a
//! clock the caller passes in (milliseconds on a monotonic clock), so the same code
//! runs against Redis ([`redis::RedisLease`]) and against the fake of the property
//! test. A term starts when a replica takes the free lease key; taking it bumps the
//! fencing epoch (`INCR`), so every term has a larger epoch than the one before. The
//! leader renews with a check-and-extend script; it counts its lease from the moment
//! it *sent* the request (the server's lease ends no earlier than that) and stops
//! acting `margin` before the end, even while it cannot reach the store.
//!
//! A take-over whose reply missed its deadline may still have run (a store that
//! stalled runs the queued request when it wakes): the key then names this replica in
//! a term nobody acts in. The next round reads the key back and, finding this
//! replica's own newer term, renews it and leads, so no replica waits out a whole
//! phantom lease.

pub mod postgres;
pub mod redis;

use thiserror::Error;

/// The host name (`/proc/sys/kernel/hostname`, `$HOSTNAME`, else `localhost`).
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok().filter(|s| !s.is_empty()))
        .unwrap_or_else(|| "localhost".into())
}

/// Why the lease store could not answer.
#[derive(Debug, Error)]
#[error("leader lease: {0}")]
pub struct LeaseError(pub String);

/// Who holds the lease now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    pub instance: String,
    pub epoch: u64,
}

/// The store the lease lives in.
pub trait LeaseStore {
    /// Takes the lease for `lease_ms` if nobody holds it (`SET NX PX`), starting a new
    /// term: returns its epoch (the fencing counter after `INCR`), or `None` when
    /// another replica holds it.
    fn acquire(&mut self, instance: &str, lease_ms: u64) -> Result<Option<u64>, LeaseError>;
    /// Extends the lease by `lease_ms` if it is still `instance`'s term `epoch`;
    /// `false`: it is not (it expired, and perhaps another took it).
    fn renew(&mut self, instance: &str, epoch: u64, lease_ms: u64) -> Result<bool, LeaseError>;
    /// Gives the lease up (at shutdown) if it is still this term's.
    fn release(&mut self, instance: &str, epoch: u64) -> Result<(), LeaseError>;
    /// The current holder, if any.
    fn holder(&mut self) -> Result<Option<Holder>, LeaseError>;
    /// The fencing counter: the epoch of the latest term ever started here (0: the
    /// store never held a lease).
    fn epoch(&mut self) -> Result<u64, LeaseError>;
    /// Terms taken from now on start above `epoch` (a store whose counter is kept
    /// elsewhere, [`FencedLease`]); the stores that keep their own counter ignore it.
    fn at_least(&mut self, _epoch: u64) {}
}

/// A store whose commits are fenced by an epoch, when the lease lives elsewhere (a
/// Kubernetes Lease): raising its counter to a new term's epoch makes it refuse the
/// batches of every older term. Never lowers it; a new term starts above it.
pub trait Fence {
    fn raise(&mut self, epoch: u64) -> Result<(), LeaseError>;
    /// The counter now.
    fn current(&mut self) -> Result<u64, LeaseError>;
}

/// A lease kept in one place ([`LeaseStore`]) fencing a store kept in another
/// ([`Fence`]): a term counts as taken, and as renewed, only once the store's
/// counter holds its epoch, so the store refuses a deposed leader's batches before
/// the new leader acts. A store that cannot be raised makes the round fail, as an
/// unreachable lease would (the leader acts on until its term's margin, no longer).
pub struct FencedLease<L, F> {
    pub lease: L,
    pub fence: F,
}

impl<L: LeaseStore, F: Fence> LeaseStore for FencedLease<L, F> {
    fn acquire(&mut self, instance: &str, lease_ms: u64) -> Result<Option<u64>, LeaseError> {
        // a new term starts above every term the store has fenced (a move from the
        // store's own lease, a Lease deleted and made anew)
        let floor = self.fence.current()?;
        self.lease.at_least(floor);
        match self.lease.acquire(instance, lease_ms)? {
            Some(epoch) => {
                self.fence.raise(epoch)?;
                Ok(Some(epoch))
            }
            None => Ok(None),
        }
    }

    fn renew(&mut self, instance: &str, epoch: u64, lease_ms: u64) -> Result<bool, LeaseError> {
        if !self.lease.renew(instance, epoch, lease_ms)? {
            return Ok(false);
        }
        self.fence.raise(epoch)?;
        Ok(true)
    }

    fn release(&mut self, instance: &str, epoch: u64) -> Result<(), LeaseError> {
        self.lease.release(instance, epoch)
    }

    fn holder(&mut self) -> Result<Option<Holder>, LeaseError> {
        self.lease.holder()
    }

    fn epoch(&mut self) -> Result<u64, LeaseError> {
        self.lease.epoch()
    }
}

/// How long a term lasts and how its holder renews it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Timing {
    pub lease_ms: u64,
    /// Renew (or try to take the lease) this often.
    pub renew_ms: u64,
    /// Stop acting this long before the lease ends.
    pub margin_ms: u64,
}

impl Timing {
    /// `lease_s` and `renew_s` as configured; the margin is a fifth of the lease, at
    /// least one renew interval's worth of slack below it.
    pub fn from_secs(lease_s: f64, renew_s: f64) -> Self {
        let lease_ms = (lease_s * 1000.0).round().max(1.0) as u64;
        let renew_ms = (renew_s * 1000.0).round().max(1.0) as u64;
        Timing {
            lease_ms,
            renew_ms,
            margin_ms: (lease_ms / 5).max(1),
        }
    }
}

/// What a replica is, as the election sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Role {
    /// Acting as leader of term `epoch` until `until_ms` (the lease's end less the
    /// margin, on the caller's clock).
    Leader { epoch: u64, until_ms: u64 },
    /// Not leading; `leader` is the holder last seen (`None`: nobody, or unknown while
    /// the store does not answer).
    Follower { leader: Option<Holder> },
}

/// What one step changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    None,
    /// This replica started term `epoch`.
    Elected {
        epoch: u64,
    },
    /// This replica's term ended: `why` (renewal refused, lease ran out).
    Deposed {
        epoch: u64,
        why: &'static str,
    },
}

/// One replica's side of the election.
#[derive(Debug, Clone)]
pub struct Election {
    pub instance: String,
    pub timing: Timing,
    role: Role,
    /// Terms this replica started, and lost.
    pub transitions: u64,
    /// A take-over was sent and its reply never came: it may have run.
    take_unanswered: bool,
    /// The largest epoch this replica led under (a term of its own found in the
    /// store is taken up only above it).
    led: u64,
}

impl Election {
    pub fn new(instance: &str, timing: Timing) -> Self {
        Election {
            instance: instance.to_string(),
            timing,
            role: Role::Follower { leader: None },
            transitions: 0,
            take_unanswered: false,
            led: 0,
        }
    }

    pub fn role(&self) -> &Role {
        &self.role
    }

    /// The epoch this replica may act under at `now_ms`: leader, and its lease not
    /// within the margin of its end.
    pub fn acting(&self, now_ms: u64) -> Option<u64> {
        match self.role {
            Role::Leader { epoch, until_ms } if now_ms < until_ms => Some(epoch),
            _ => None,
        }
    }

    /// One round at `sent_ms`, the clock read just before the request went out:
    /// renew the lease (leader) or try to take it (follower).
    pub fn step(&mut self, store: &mut dyn LeaseStore, sent_ms: u64) -> Change {
        let t = self.timing;
        let until = sent_ms + t.lease_ms.saturating_sub(t.margin_ms);
        match self.role.clone() {
            Role::Leader { epoch, until_ms } => {
                match store.renew(&self.instance, epoch, t.lease_ms) {
                    Ok(true) => {
                        self.role = Role::Leader {
                            epoch,
                            until_ms: until.max(until_ms),
                        };
                        Change::None
                    }
                    Ok(false) => self.depose(epoch, "renewal_refused", None),
                    // the store does not answer: keep the term while it lasts
                    Err(_) if sent_ms < until_ms => Change::None,
                    Err(_) => self.depose(epoch, "lease_ran_out", None),
                }
            }
            Role::Follower { .. } => match store.acquire(&self.instance, t.lease_ms) {
                Ok(Some(epoch)) => {
                    self.take_unanswered = false;
                    self.elect(epoch, until)
                }
                Ok(None) => {
                    let leader = store.holder().ok().flatten();
                    if std::mem::take(&mut self.take_unanswered) {
                        if let Some(epoch) = self.own_phantom(store, leader.as_ref()) {
                            return self.elect(epoch, until);
                        }
                    }
                    self.role = Role::Follower { leader };
                    Change::None
                }
                Err(_) => {
                    self.take_unanswered = true;
                    self.role = Role::Follower { leader: None };
                    Change::None
                }
            },
        }
    }

    /// A term of this replica's, newer than any it led under, that the store holds
    /// though no reply said so (its take-over ran after the deadline): renewed, so
    /// that its lease counts from this round, and its epoch returned.
    fn own_phantom(&self, store: &mut dyn LeaseStore, holder: Option<&Holder>) -> Option<u64> {
        let h = holder.filter(|h| h.instance == self.instance && h.epoch > self.led)?;
        match store.renew(&self.instance, h.epoch, self.timing.lease_ms) {
            Ok(true) => Some(h.epoch),
            _ => None,
        }
    }

    fn elect(&mut self, epoch: u64, until_ms: u64) -> Change {
        self.role = Role::Leader { epoch, until_ms };
        self.led = self.led.max(epoch);
        self.transitions += 1;
        Change::Elected { epoch }
    }

    /// Ends this replica's term at once (a leader that found it cannot act, or shuts
    /// down); gives the lease back when `store` is given.
    pub fn resign(&mut self, store: Option<&mut dyn LeaseStore>) -> Change {
        match self.role {
            Role::Leader { epoch, .. } => {
                if let Some(s) = store {
                    let _ = s.release(&self.instance, epoch);
                }
                self.depose(epoch, "resigned", None)
            }
            Role::Follower { .. } => Change::None,
        }
    }

    fn depose(&mut self, epoch: u64, why: &'static str, leader: Option<Holder>) -> Change {
        self.role = Role::Follower { leader };
        self.transitions += 1;
        Change::Deposed { epoch, why }
    }
}

/// A lease store in memory on a fake clock, for tests: the same semantics as Redis's
/// `SET NX PX`, `INCR` and `PEXPIRE`.
#[derive(Debug, Default, Clone)]
pub struct FakeLeaseStore {
    pub now_ms: u64,
    pub holder: Option<(Holder, u64)>,
    pub epoch: u64,
    /// While set, every call fails (the server is down).
    pub down: bool,
    /// While set, every call runs but its reply is lost (the caller's deadline passes
    /// before the server answers).
    pub replies_lost: bool,
}

impl FakeLeaseStore {
    fn live(&mut self) -> Result<(), LeaseError> {
        if self.down {
            return Err(LeaseError("down".into()));
        }
        if self
            .holder
            .as_ref()
            .is_some_and(|(_, exp)| *exp <= self.now_ms)
        {
            self.holder = None;
        }
        Ok(())
    }

    /// The holder whose lease has not expired at the store's clock.
    pub fn current(&self) -> Option<&Holder> {
        self.holder
            .as_ref()
            .filter(|(_, exp)| *exp > self.now_ms)
            .map(|(h, _)| h)
    }
}

/// The calls as the server runs them.
impl FakeLeaseStore {
    fn run_acquire(&mut self, instance: &str, lease_ms: u64) -> Result<Option<u64>, LeaseError> {
        self.live()?;
        if self.holder.is_some() {
            return Ok(None);
        }
        self.epoch += 1;
        let h = Holder {
            instance: instance.into(),
            epoch: self.epoch,
        };
        self.holder = Some((h, self.now_ms + lease_ms));
        Ok(Some(self.epoch))
    }

    fn run_renew(&mut self, instance: &str, epoch: u64, lease_ms: u64) -> Result<bool, LeaseError> {
        self.live()?;
        match &mut self.holder {
            Some((h, exp)) if h.instance == instance && h.epoch == epoch => {
                *exp = self.now_ms + lease_ms;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    fn run_release(&mut self, instance: &str, epoch: u64) -> Result<(), LeaseError> {
        self.live()?;
        if self
            .holder
            .as_ref()
            .is_some_and(|(h, _)| h.instance == instance && h.epoch == epoch)
        {
            self.holder = None;
        }
        Ok(())
    }

    fn run_holder(&mut self) -> Result<Option<Holder>, LeaseError> {
        self.live()?;
        Ok(self.holder.as_ref().map(|(h, _)| h.clone()))
    }

    fn run_epoch(&mut self) -> Result<u64, LeaseError> {
        self.live()?;
        Ok(self.epoch)
    }
}

impl LeaseStore for FakeLeaseStore {
    fn acquire(&mut self, instance: &str, lease_ms: u64) -> Result<Option<u64>, LeaseError> {
        let r = self.run_acquire(instance, lease_ms);
        self.answered(r)
    }

    fn renew(&mut self, instance: &str, epoch: u64, lease_ms: u64) -> Result<bool, LeaseError> {
        let r = self.run_renew(instance, epoch, lease_ms);
        self.answered(r)
    }

    fn release(&mut self, instance: &str, epoch: u64) -> Result<(), LeaseError> {
        let r = self.run_release(instance, epoch);
        self.answered(r)
    }

    fn holder(&mut self) -> Result<Option<Holder>, LeaseError> {
        let r = self.run_holder();
        self.answered(r)
    }

    fn epoch(&mut self) -> Result<u64, LeaseError> {
        let r = self.run_epoch();
        self.answered(r)
    }
}

/// The fake with replies that may be lost: the call runs, the caller sees an error.
impl FakeLeaseStore {
    fn answered<T>(&self, r: Result<T, LeaseError>) -> Result<T, LeaseError> {
        match r {
            Ok(_) if self.replies_lost => Err(LeaseError("no answer by the deadline".into())),
            r => r,
        }
    }
}

#[cfg(test)]
mod tests;
