//! The leader lease in Redis: `{prefix}:ha:leader` holds `"{epoch} {instance}"` with a
//! TTL; `{prefix}:ha:epoch` is the fencing counter. Taking the lease (`SET NX PX`),
//! bumping the epoch (`INCR`) and writing the term into the key happen in one script,
//! so a term's epoch is in the key from its first moment. Renewal is a check-and-
//! extend script: `PEXPIRE` only while the key still holds this term.
//!
//! The election runs on a thread of its own with a blocking connection, a deadline on
//! every call (connect, read, write), and a reconnect on the next round after a
//! failure, so a dead server costs one deadline per round and never the control loop.

use std::time::Duration;

use redis::{Connection, Script};

use super::{Fence, Holder, LeaseError, LeaseStore};

const ACQUIRE: &str = r#"
if redis.call('SET', KEYS[1], 'taking', 'NX', 'PX', ARGV[2]) then
  local epoch = redis.call('INCR', KEYS[2])
  redis.call('SET', KEYS[1], epoch .. ' ' .. ARGV[1], 'PX', ARGV[2])
  return epoch
end
return 0
"#;

const RENEW: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
"#;

const RELEASE: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
end
return 0
"#;

/// The key of the fencing epoch under `prefix` (the store's commits check it).
/// Raises the fencing epoch to ARGV[1] if it is below (never lowers it).
const RAISE: &str = r#"
local e = tonumber(redis.call('GET', KEYS[1]) or '0')
if tonumber(ARGV[1]) > e then
  redis.call('SET', KEYS[1], ARGV[1])
end
return 1
"#;

pub fn epoch_key(prefix: &str) -> String {
    format!("{prefix}:ha:epoch")
}

/// The key of the lease under `prefix`.
pub fn lease_key(prefix: &str) -> String {
    format!("{prefix}:ha:leader")
}

/// The lease in one Redis database, under the store's key prefix.
pub struct RedisLease {
    client: redis::Client,
    conn: Option<Connection>,
    deadline: Duration,
    lease: String,
    epoch: String,
}

impl RedisLease {
    /// A lease at `url` (not yet connected: the first call connects).
    pub fn new(url: &str, prefix: &str, deadline: Duration) -> Result<Self, LeaseError> {
        let client = redis::Client::open(url)
            .map_err(|e| LeaseError(format!("bad redis url {url:?}: {e}")))?;
        Ok(RedisLease {
            client,
            conn: None,
            deadline,
            lease: lease_key(prefix),
            epoch: epoch_key(prefix),
        })
    }

    fn conn(&mut self) -> Result<&mut Connection, LeaseError> {
        if self.conn.is_none() {
            let c = self
                .client
                .get_connection_with_timeout(self.deadline)
                .map_err(|e| LeaseError(format!("cannot connect: {e}")))?;
            c.set_read_timeout(Some(self.deadline))
                .and_then(|_| c.set_write_timeout(Some(self.deadline)))
                .map_err(|e| LeaseError(format!("cannot set deadlines: {e}")))?;
            self.conn = Some(c);
        }
        self.conn
            .as_mut()
            .ok_or_else(|| LeaseError("no connection".into()))
    }

    /// Runs `f` on the connection; a failure drops it (the next call reconnects).
    fn call<T>(
        &mut self,
        what: &str,
        f: impl FnOnce(&mut Connection, &str, &str) -> redis::RedisResult<T>,
    ) -> Result<T, LeaseError> {
        let (lease, epoch) = (self.lease.clone(), self.epoch.clone());
        let c = self.conn()?;
        match f(c, &lease, &epoch) {
            Ok(v) => Ok(v),
            Err(e) => {
                self.conn = None;
                Err(LeaseError(format!("{what}: {e}")))
            }
        }
    }
}

fn term(instance: &str, epoch: u64) -> String {
    format!("{epoch} {instance}")
}

/// `"{epoch} {instance}"` as the key holds it.
pub fn parse_holder(value: &str) -> Option<Holder> {
    let (epoch, instance) = value.split_once(' ')?;
    Some(Holder {
        instance: instance.to_string(),
        epoch: epoch.parse().ok()?,
    })
}

impl LeaseStore for RedisLease {
    fn acquire(&mut self, instance: &str, lease_ms: u64) -> Result<Option<u64>, LeaseError> {
        let epoch: u64 = self.call("take the lease", |c, lease, epoch| {
            Script::new(ACQUIRE)
                .key(lease)
                .key(epoch)
                .arg(instance)
                .arg(lease_ms)
                .invoke(c)
        })?;
        Ok((epoch > 0).then_some(epoch))
    }

    fn renew(&mut self, instance: &str, epoch: u64, lease_ms: u64) -> Result<bool, LeaseError> {
        let done: i64 = self.call("renew the lease", |c, lease, _| {
            Script::new(RENEW)
                .key(lease)
                .arg(term(instance, epoch))
                .arg(lease_ms)
                .invoke(c)
        })?;
        Ok(done == 1)
    }

    fn release(&mut self, instance: &str, epoch: u64) -> Result<(), LeaseError> {
        let _: i64 = self.call("give the lease back", |c, lease, _| {
            Script::new(RELEASE)
                .key(lease)
                .arg(term(instance, epoch))
                .invoke(c)
        })?;
        Ok(())
    }

    fn holder(&mut self) -> Result<Option<Holder>, LeaseError> {
        let v: Option<String> = self.call("read the lease", |c, lease, _| {
            redis::cmd("GET").arg(lease).query(c)
        })?;
        Ok(v.as_deref().and_then(parse_holder))
    }

    fn epoch(&mut self) -> Result<u64, LeaseError> {
        let v: Option<u64> = self.call("read the epoch", |c, _, epoch| {
            redis::cmd("GET").arg(epoch).query(c)
        })?;
        Ok(v.unwrap_or(0))
    }
}

impl Fence for RedisLease {
    fn raise(&mut self, epoch: u64) -> Result<(), LeaseError> {
        let _: i64 = self.call("raise the fencing epoch", |c, _, key| {
            Script::new(RAISE).key(key).arg(epoch).invoke(c)
        })?;
        Ok(())
    }

    fn current(&mut self) -> Result<u64, LeaseError> {
        LeaseStore::epoch(self)
    }
}
