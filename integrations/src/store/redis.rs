//! The Redis backend: for deployments where several controllers share state.
//!
//! Collections are hashes (`{prefix}:c:{collection}`), logs are lists
//! (`{prefix}:log:{log}`); a batch is one Lua script, atomic in Redis, that also
//! records the last batch each writer applied (`{prefix}:applied`), so that a batch
//! replayed from the journal after a crash is not applied twice. Redis must persist
//! (AOF with `appendfsync everysec` or stricter) for the store to survive a Redis
//! restart.
//!
//! The connection is a [`ConnectionManager`] (it reconnects by itself) on a tokio
//! runtime; the sync [`Backend`] calls drive it with `block_on` and a deadline per
//! call. After a failure the backend backs off (250 ms doubling to 5 s): calls in
//! between fail at once instead of waiting on a dead server, so a tick never waits
//! more than one deadline for the store.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{AsyncCommands, RedisError, RedisResult, Value};
use tokio::runtime::Handle;
use tracing::{info, warn};

use super::health::StoreHealth;
use super::rt::Rt;
use super::{Backend, Batch, Op, StoreError};

const NAME: &str = "redis";

/// How long one call may take by default (connect, send, answer).
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(2);
const MIN_BACKOFF: Duration = Duration::from_millis(250);
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// Applies a batch atomically. KEYS[1]: the hash of applied sequence numbers;
/// ARGV[1]: the writer, ARGV[2]: the batch's sequence number (0: no check), then the
/// ops: `p key field value`, `d key field`, `a key value`. Returns -1 when the writer's
/// batch `seq` (or a later one) was already applied, else the RPUSH replies.
///
/// A batch that starts with the fence op (`f epoch`) applies only while KEYS[2], the
/// fencing epoch of the leader lease, holds that epoch; else nothing is written and the
/// answer is -2.
const COMMIT: &str = r#"
local seq = tonumber(ARGV[2])
local i = 3
if ARGV[3] == 'f' then
  if tonumber(redis.call('GET', KEYS[2]) or '0') ~= tonumber(ARGV[4]) then return -2 end
  i = 5
end
if seq > 0 then
  local applied = tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '0')
  if seq <= applied then return -1 end
end
local out = {}
while i <= #ARGV do
  local op = ARGV[i]
  if op == 'p' then
    redis.call('HSET', ARGV[i + 1], ARGV[i + 2], ARGV[i + 3])
    i = i + 4
  elseif op == 'd' then
    redis.call('HDEL', ARGV[i + 1], ARGV[i + 2])
    i = i + 3
  else
    out[#out + 1] = redis.call('RPUSH', ARGV[i + 1], ARGV[i + 2])
    i = i + 3
  end
end
if seq > 0 then redis.call('HSET', KEYS[1], ARGV[1], seq) end
return out
"#;

/// A store in one Redis database, under a key prefix.
pub struct RedisBackend {
    conn: ConnectionManager,
    rt: Rt,
    prefix: String,
    url: String,
    deadline: Duration,
    /// While set and in the future, calls fail at once (the server failed lately).
    retry_at: Option<Instant>,
    backoff: Duration,
    health: Arc<StoreHealth>,
}

fn unreachable(message: String) -> StoreError {
    StoreError::Backend {
        backend: NAME,
        message,
        source: None,
    }
}

/// Whether an error says the server is gone (rather than that it refused a command).
fn lost(e: &RedisError) -> bool {
    e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal() || e.is_timeout()
}

impl RedisBackend {
    /// Connects to `url` (e.g. `redis://127.0.0.1:6379/0`) on a small runtime of its
    /// own (for tools and tests); every key starts with `prefix`.
    pub fn connect(url: &str, prefix: &str) -> Result<Self, StoreError> {
        let rt = Rt::owned("powerplane-redis")
            .map_err(|e| StoreError::backend(NAME, "cannot start its runtime", e))?;
        Self::open(url, prefix, rt, DEFAULT_DEADLINE)
    }

    /// Connects to `url` with the connection's tasks on `handle` (the runtime `serve`
    /// owns) and `deadline` per call. The calls themselves must come from a thread
    /// outside that runtime's workers (the control loop's).
    pub fn connect_on(
        url: &str,
        prefix: &str,
        handle: Handle,
        deadline: Duration,
    ) -> Result<Self, StoreError> {
        Self::open(url, prefix, Rt::Shared(handle), deadline)
    }

    fn open(url: &str, prefix: &str, rt: Rt, deadline: Duration) -> Result<Self, StoreError> {
        let client = redis::Client::open(url)
            .map_err(|e| StoreError::backend(NAME, format!("bad url {url:?}"), e))?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(deadline))
            .set_response_timeout(Some(deadline))
            // one attempt per call: the backend's own backoff spaces the attempts
            .set_number_of_retries(0)
            .set_min_delay(Duration::from_millis(50))
            .set_max_delay(Duration::from_secs(1));
        let connecting = async move {
            tokio::time::timeout(deadline, ConnectionManager::new_with_config(client, config)).await
        };
        let conn = match rt.block_on(connecting) {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => {
                return Err(StoreError::backend(
                    NAME,
                    format!("cannot connect to {url}"),
                    e,
                ))
            }
            Err(_) => {
                return Err(unreachable(format!(
                    "cannot connect to {url}: no answer within {} ms",
                    deadline.as_millis()
                )))
            }
        };
        Ok(RedisBackend {
            conn,
            rt,
            prefix: prefix.to_string(),
            url: url.to_string(),
            deadline,
            retry_at: None,
            backoff: MIN_BACKOFF,
            health: Arc::new(StoreHealth::default()),
        })
    }

    /// The runtime the connection's tasks run on.
    pub fn handle(&self) -> Handle {
        self.rt.handle()
    }

    fn coll(&self, c: &str) -> String {
        format!("{}:c:{c}", self.prefix)
    }

    fn log(&self, l: &str) -> String {
        format!("{}:log:{l}", self.prefix)
    }

    fn applied_key(&self) -> String {
        format!("{}:applied", self.prefix)
    }

    /// Runs one call with the deadline; `retry`: once more on a lost connection (the
    /// manager reconnects in between), for calls that are safe to repeat.
    fn call<T, F, Fut>(&mut self, what: &str, retry: bool, f: F) -> Result<T, StoreError>
    where
        F: Fn(ConnectionManager) -> Fut,
        Fut: Future<Output = RedisResult<T>>,
    {
        if Handle::try_current().is_ok() {
            return Err(unreachable(format!(
                "{what}: called from inside the async runtime (the store blocks)"
            )));
        }
        if let Some(at) = self.retry_at {
            let now = Instant::now();
            if now < at {
                return Err(unreachable(format!(
                    "{what}: {} unreachable, next try in {} ms",
                    self.url,
                    at.duration_since(now).as_millis()
                )));
            }
        }
        let conn = self.conn.clone();
        let deadline = self.deadline;
        let attempt = async {
            match f(conn.clone()).await {
                Err(e) if retry && lost(&e) => f(conn).await,
                other => other,
            }
        };
        match self
            .rt
            .block_on(async { tokio::time::timeout(deadline, attempt).await })
        {
            Ok(Ok(v)) => {
                self.answered();
                Ok(v)
            }
            Ok(Err(e)) => {
                if lost(&e) {
                    self.failed(&e.to_string());
                }
                Err(StoreError::backend(NAME, format!("{what}: {e}"), e))
            }
            Err(_) => {
                let why = format!("no answer within {} ms", deadline.as_millis());
                self.failed(&why);
                Err(unreachable(format!("{what}: {why}")))
            }
        }
    }

    fn answered(&mut self) {
        self.retry_at = None;
        self.backoff = MIN_BACKOFF;
        if !self.health.set_reachable(true) {
            StoreHealth::count(&self.health.reconnects);
            info!(url = %self.url, "redis store answers again");
        }
    }

    fn failed(&mut self, why: &str) {
        self.retry_at = Some(Instant::now() + self.backoff);
        self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
        if self.health.set_reachable(false) {
            warn!(url = %self.url, error = why, "redis store unreachable; backing off");
        }
    }

    /// Deletes every key under the prefix (for tests and `--reset`).
    pub fn clear(&mut self) -> Result<(), StoreError> {
        let pattern = format!("{}:*", self.prefix);
        let keys: Vec<String> = self.call("list keys", true, |mut c| {
            let pattern = pattern.clone();
            async move { c.keys(pattern).await }
        })?;
        if !keys.is_empty() {
            self.call("delete keys", true, |mut c| {
                let keys = keys.clone();
                async move { c.del::<_, ()>(keys).await }
            })?;
        }
        Ok(())
    }

    /// The EVAL command that applies `batch` as batch `seq` of `writer` (0: always).
    fn commit_cmd(&self, writer: &str, seq: u64, batch: &Batch) -> redis::Cmd {
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(COMMIT)
            .arg(2)
            .arg(self.applied_key())
            .arg(crate::lease::redis::epoch_key(&self.prefix))
            .arg(writer)
            .arg(seq);
        for op in &batch.ops {
            match op {
                Op::Put {
                    collection,
                    key,
                    value,
                } => {
                    cmd.arg("p")
                        .arg(self.coll(collection))
                        .arg(key)
                        .arg(value.as_slice());
                }
                Op::Delete { collection, key } => {
                    cmd.arg("d").arg(self.coll(collection)).arg(key);
                }
                Op::Append { log, value } => {
                    cmd.arg("a").arg(self.log(log)).arg(value.as_slice());
                }
                Op::Fence { epoch } => {
                    cmd.arg("f").arg(*epoch);
                }
            }
        }
        cmd
    }

    /// Runs a commit; `None` when the batch had been applied already.
    fn run_commit(
        &mut self,
        cmd: redis::Cmd,
        retry: bool,
        fence: Option<u64>,
    ) -> Result<Option<Vec<u64>>, StoreError> {
        let result = self.call("commit batch", retry, |mut c| {
            let cmd = cmd.clone();
            async move { cmd.query_async::<Value>(&mut c).await }
        });
        let health = self.health.clone();
        StoreHealth::count(match &result {
            Ok(_) => &health.commits_ok,
            Err(_) => &health.commits_failed,
        });
        match result? {
            Value::Int(-1) => Ok(None),
            Value::Int(-2) => {
                StoreHealth::count(&health.fenced);
                Err(StoreError::Fenced {
                    backend: NAME,
                    epoch: fence.unwrap_or(0),
                })
            }
            Value::Array(items) => items
                .into_iter()
                .map(|v| match v {
                    Value::Int(n) => Ok(n as u64),
                    other => Err(unreachable(format!("unexpected RPUSH reply {other:?}"))),
                })
                .collect::<Result<Vec<u64>, _>>()
                .map(Some),
            other => Err(unreachable(format!("unexpected commit reply {other:?}"))),
        }
    }
}

impl Backend for RedisBackend {
    fn commit(&mut self, batch: &Batch) -> Result<Vec<u64>, StoreError> {
        // not repeated on a lost connection: without a sequence number it could apply twice
        let cmd = self.commit_cmd("", 0, batch);
        Ok(self
            .run_commit(cmd, false, fence_of(batch))?
            .unwrap_or_default())
    }

    fn commit_once(&mut self, writer: &str, seq: u64, batch: &Batch) -> Result<bool, StoreError> {
        let cmd = self.commit_cmd(writer, seq.max(1), batch);
        Ok(self.run_commit(cmd, true, fence_of(batch))?.is_some())
    }

    fn applied(&mut self, writer: &str) -> Result<u64, StoreError> {
        let key = self.applied_key();
        let writer = writer.to_string();
        let seq: Option<u64> = self.call("read applied batch", true, |mut c| {
            let (key, writer) = (key.clone(), writer.clone());
            async move { c.hget(key, writer).await }
        })?;
        Ok(seq.unwrap_or(0))
    }

    fn get(&mut self, collection: &str, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let (name, field) = (self.coll(collection), key.to_string());
        self.call(&format!("get {collection}/{key}"), true, |mut c| {
            let (name, field) = (name.clone(), field.clone());
            async move { c.hget(name, field).await }
        })
    }

    fn list(&mut self, collection: &str) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        let name = self.coll(collection);
        let mut all: Vec<(String, Vec<u8>)> =
            self.call(&format!("list {collection}"), true, |mut c| {
                let name = name.clone();
                async move { c.hgetall(name).await }
            })?;
        all.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(all)
    }

    fn read_log(
        &mut self,
        log: &str,
        from: u64,
        limit: usize,
    ) -> Result<Vec<(u64, Vec<u8>)>, StoreError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let start = from.max(1) - 1;
        let stop = start + limit as u64 - 1;
        let name = self.log(log);
        let items: Vec<Vec<u8>> = self.call(&format!("read log {log}"), true, |mut c| {
            let name = name.clone();
            async move { c.lrange(name, start as isize, stop as isize).await }
        })?;
        Ok(items
            .into_iter()
            .enumerate()
            .map(|(i, v)| (start + 1 + i as u64, v))
            .collect())
    }

    fn log_len(&mut self, log: &str) -> Result<u64, StoreError> {
        let name = self.log(log);
        self.call(&format!("length of log {log}"), true, |mut c| {
            let name = name.clone();
            async move { c.llen(name).await }
        })
    }

    fn name(&self) -> &'static str {
        NAME
    }

    fn health(&self) -> Option<Arc<StoreHealth>> {
        Some(self.health.clone())
    }
}

/// The epoch a batch is fenced with (its first op), if any.
fn fence_of(batch: &Batch) -> Option<u64> {
    match batch.ops.first() {
        Some(Op::Fence { epoch }) => Some(*epoch),
        _ => None,
    }
}
