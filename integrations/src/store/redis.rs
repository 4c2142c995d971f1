//! The Redis backend: for deployments where several controllers share state.
//!
//! Collections are hashes (`{prefix}:c:{collection}`), logs are lists
//! (`{prefix}:log:{log}`); a batch is one `MULTI`/`EXEC`. Redis must persist (AOF with
//! `appendfsync everysec` or stricter) for the store to survive a Redis restart.

use redis::{Commands, Connection, Value};

use super::{Backend, Batch, Op, StoreError};

const NAME: &str = "redis";

/// A store in one Redis database, under a key prefix.
pub struct RedisBackend {
    conn: Connection,
    prefix: String,
}

impl RedisBackend {
    /// Connects to `url` (e.g. `redis://127.0.0.1:6379/0`); every key starts with `prefix`.
    pub fn connect(url: &str, prefix: &str) -> Result<Self, StoreError> {
        let client = redis::Client::open(url)
            .map_err(|e| StoreError::backend(NAME, format!("bad url {url:?}"), e))?;
        let conn = client
            .get_connection_with_timeout(std::time::Duration::from_secs(5))
            .map_err(|e| StoreError::backend(NAME, format!("cannot connect to {url}"), e))?;
        conn.set_read_timeout(Some(std::time::Duration::from_secs(10)))
            .map_err(|e| StoreError::backend(NAME, "set timeout", e))?;
        Ok(RedisBackend {
            conn,
            prefix: prefix.to_string(),
        })
    }

    fn coll(&self, c: &str) -> String {
        format!("{}:c:{c}", self.prefix)
    }

    fn log(&self, l: &str) -> String {
        format!("{}:log:{l}", self.prefix)
    }

    /// Deletes every key under the prefix (for tests and `--reset`).
    pub fn clear(&mut self) -> Result<(), StoreError> {
        let keys: Vec<String> = self
            .conn
            .keys(format!("{}:*", self.prefix))
            .map_err(|e| StoreError::backend(NAME, "list keys", e))?;
        if !keys.is_empty() {
            let _: () = self
                .conn
                .del(keys)
                .map_err(|e| StoreError::backend(NAME, "delete keys", e))?;
        }
        Ok(())
    }
}

impl Backend for RedisBackend {
    fn commit(&mut self, batch: &Batch) -> Result<Vec<u64>, StoreError> {
        let mut pipe = redis::pipe();
        pipe.atomic();
        let mut appends = Vec::new();
        for (i, op) in batch.ops.iter().enumerate() {
            match op {
                Op::Put {
                    collection,
                    key,
                    value,
                } => {
                    pipe.hset(self.coll(collection), key, value.as_slice());
                }
                Op::Delete { collection, key } => {
                    pipe.hdel(self.coll(collection), key);
                }
                Op::Append { log, value } => {
                    pipe.rpush(self.log(log), value.as_slice());
                    appends.push(i);
                }
            }
        }
        let results: Vec<Value> = pipe
            .query(&mut self.conn)
            .map_err(|e| StoreError::backend(NAME, "commit batch", e))?;
        appends
            .into_iter()
            .map(|i| match results.get(i) {
                Some(Value::Int(n)) => Ok(*n as u64),
                other => Err(StoreError::Backend {
                    backend: NAME,
                    message: format!("unexpected RPUSH reply {other:?}"),
                    source: None,
                }),
            })
            .collect()
    }

    fn get(&mut self, collection: &str, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let key_name = self.coll(collection);
        self.conn
            .hget(key_name, key)
            .map_err(|e| StoreError::backend(NAME, format!("get {collection}/{key}"), e))
    }

    fn list(&mut self, collection: &str) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        let key_name = self.coll(collection);
        let mut all: Vec<(String, Vec<u8>)> = self
            .conn
            .hgetall(key_name)
            .map_err(|e| StoreError::backend(NAME, format!("list {collection}"), e))?;
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
        let key_name = self.log(log);
        let items: Vec<Vec<u8>> = self
            .conn
            .lrange(key_name, start as isize, stop as isize)
            .map_err(|e| StoreError::backend(NAME, format!("read log {log}"), e))?;
        Ok(items
            .into_iter()
            .enumerate()
            .map(|(i, v)| (start + 1 + i as u64, v))
            .collect())
    }

    fn log_len(&mut self, log: &str) -> Result<u64, StoreError> {
        let key_name = self.log(log);
        self.conn
            .llen(key_name)
            .map_err(|e| StoreError::backend(NAME, format!("length of log {log}"), e))
    }

    fn name(&self) -> &'static str {
        NAME
    }
}
