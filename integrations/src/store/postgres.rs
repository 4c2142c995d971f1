//! The PostgreSQL backend: for sites whose records belong in a database a DBA runs
//! (the energy ledger and the audit log with SQL access, backups and replication the
//! site already has).
//!
//! The store lives in one schema (`schema`, `powerplane` by default), in five tables:
//!
//! - `collections (collection, key, value)`: the jobs, the state, and the other keyed
//!   records (JSON in `value`, bytea);
//! - `logs (log, seq, value)`: the append-only logs (`audit`, `ledger` …), numbered from
//!   1 per log without gaps; `log_heads (log, len)` holds each log's length;
//! - `applied (writer, seq)`: the last batch each writer applied (a batch replayed from
//!   the journal after a crash is not applied twice);
//! - `fence (id, epoch)`: the highest fencing epoch a batch carried;
//! - `ha (id, holder, epoch, expires_at)`: the leader lease, where `[ha]` keeps it here
//!   ([`crate::lease::postgres`]).
//!
//! A batch is one transaction. A batch that carries a fencing epoch is refused, and
//! nothing of it written, when a batch of a higher epoch was committed before, or when
//! the leader lease here is in another term (a newer leader holds the store): the
//! checks and the write of the epoch are inside the same transaction, under the rows'
//! locks.
//!
//! The connection is tokio-postgres's on a tokio runtime (serve's, or one of its own);
//! the sync [`Backend`] calls drive it with `block_on` and a deadline per call. A call
//! that misses its deadline drops the connection (a statement may still be running:
//! the transaction it was in is rolled back by the server when the connection goes)
//! and the next call connects again, after a backoff (250 ms doubling to 5 s) during
//! which calls fail at once: a tick never waits more than one deadline for the store.
//!
//! Where it connects is a [`Target`]: the URL (one host, or several with
//! `target_session_attrs=read-write` to follow a promoted standby), a password kept
//! out of the URL, and TLS (rustls, the client configuration of every outbound client;
//! with it the server must speak TLS and show a certificate for the host's name).

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::runtime::Handle;
use tokio_postgres::config::SslMode;
use tokio_postgres::{Client, NoTls, Transaction};
use tracing::{info, warn};

use super::health::StoreHealth;
use super::rt::Rt;
use super::{Backend, Batch, Op, StoreError};

const NAME: &str = "postgres";
/// How long one call may take by default (connect, statements, commit).
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(2);
const MIN_BACKOFF: Duration = Duration::from_millis(250);
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// Where the store (and the leader lease) connect.
#[derive(Clone)]
pub struct Target {
    /// `postgres://user@host[:port][,host2[:port2]]/database[?options]`, or key-value.
    pub url: String,
    /// The password, when it is not in the URL (read from a file or the environment).
    pub password: Option<String>,
    /// TLS: required, with this client configuration (`None`: as the URL says, in the
    /// clear by default).
    pub tls: Option<Arc<rustls::ClientConfig>>,
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Target")
            .field("url", &redacted(&self.url))
            .field("password", &self.password.as_ref().map(|_| "(set)"))
            .field("tls", &self.tls.is_some())
            .finish()
    }
}

impl Target {
    /// `url` as it is: its own password, if any; TLS as its `sslmode` says.
    pub fn plain(url: &str) -> Self {
        Target {
            url: url.to_string(),
            password: None,
            tls: None,
        }
    }

    /// The URL as the log shows it (no password).
    pub fn shown(&self) -> String {
        redacted(&self.url)
    }

    fn config(&self) -> Result<tokio_postgres::Config, tokio_postgres::Error> {
        let mut c: tokio_postgres::Config = self.url.parse()?;
        if let Some(p) = &self.password {
            c.password(p);
        }
        if self.tls.is_some() {
            c.ssl_mode(SslMode::Require);
        }
        Ok(c)
    }

    /// Checks the URL without connecting.
    pub fn check(&self) -> Result<(), tokio_postgres::Error> {
        self.config().map(|_| ())
    }

    /// Connects (over TLS where configured), the connection's task on `handle`
    /// (logged as `what` when it ends with an error).
    pub async fn connect(
        &self,
        handle: &Handle,
        what: &'static str,
    ) -> Result<Client, tokio_postgres::Error> {
        let config = self.config()?;
        let on_end = move |r: Result<(), tokio_postgres::Error>| {
            if let Err(e) = r {
                warn!(error = %e, "{what}: the connection ended");
            }
        };
        match &self.tls {
            None => {
                let (client, conn) = config.connect(NoTls).await?;
                handle.spawn(async move { on_end(conn.await) });
                Ok(client)
            }
            Some(tls) => {
                let make = tokio_postgres_rustls::MakeRustlsConnect::new((**tls).clone());
                let (client, conn) = config.connect(make).await?;
                handle.spawn(async move { on_end(conn.await) });
                Ok(client)
            }
        }
    }
}

/// A store in one schema of a PostgreSQL database.
pub struct PostgresBackend {
    client: Option<Client>,
    rt: Rt,
    target: Target,
    schema: String,
    deadline: Duration,
    /// While set and in the future, calls fail at once (the server failed lately).
    retry_at: Option<Instant>,
    backoff: Duration,
    health: Arc<StoreHealth>,
}

fn failed(message: String, source: Option<tokio_postgres::Error>) -> StoreError {
    StoreError::Backend {
        backend: NAME,
        message,
        source: source.map(|e| Box::new(e) as Box<dyn std::error::Error + Send + Sync>),
    }
}

/// A schema name as an SQL identifier: letters, digits and `_` only.
pub(crate) fn checked_schema(schema: &str) -> Result<String, StoreError> {
    let ok = !schema.is_empty()
        && schema.len() <= 63
        && schema
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !schema.starts_with(|c: char| c.is_ascii_digit());
    if ok {
        Ok(schema.to_ascii_lowercase())
    } else {
        Err(failed(
            format!(
                "schema {schema:?} must be 1 to 63 letters, digits or _, not starting with a digit"
            ),
            None,
        ))
    }
}

impl PostgresBackend {
    /// Connects to `url` (`postgres://user@host:port/db` or a key-value string) on a
    /// small runtime of its own (for tools and tests), in `schema` (created with its
    /// tables where missing).
    pub fn connect(url: &str, schema: &str) -> Result<Self, StoreError> {
        Self::connect_to(&Target::plain(url), schema)
    }

    /// As [`PostgresBackend::connect`], to `target` (its password, its TLS).
    pub fn connect_to(target: &Target, schema: &str) -> Result<Self, StoreError> {
        let rt = Rt::owned("powerplane-postgres")
            .map_err(|e| StoreError::backend(NAME, "cannot start its runtime", e))?;
        Self::open(target, schema, rt, DEFAULT_DEADLINE)
    }

    /// Connects with the connection's task on `handle` (the runtime `serve` owns) and
    /// `deadline` per call. The calls themselves must come from a thread outside that
    /// runtime's workers (the control loop's).
    pub fn connect_on(
        target: &Target,
        schema: &str,
        handle: Handle,
        deadline: Duration,
    ) -> Result<Self, StoreError> {
        Self::open(target, schema, Rt::Shared(handle), deadline)
    }

    fn open(target: &Target, schema: &str, rt: Rt, deadline: Duration) -> Result<Self, StoreError> {
        target
            .check()
            .map_err(|e| failed(format!("bad url {}", target.shown()), Some(e)))?;
        let mut b = PostgresBackend {
            client: None,
            rt,
            target: target.clone(),
            schema: checked_schema(schema)?,
            deadline,
            retry_at: None,
            backoff: MIN_BACKOFF,
            health: Arc::new(StoreHealth::default()),
        };
        b.connect_now()?;
        Ok(b)
    }

    /// The runtime the connection's task runs on.
    pub fn handle(&self) -> Handle {
        self.rt.handle()
    }

    /// Connects, and creates the schema and its tables where missing.
    fn connect_now(&mut self) -> Result<(), StoreError> {
        let (target, schema, deadline) = (self.target.clone(), self.schema.clone(), self.deadline);
        let handle = self.rt.handle();
        let connecting = async move {
            let client = target.connect(&handle, "postgres store").await?;
            client.batch_execute(&schema_sql(&schema)).await?;
            Ok::<_, tokio_postgres::Error>(client)
        };
        let shown = self.target.shown();
        match self
            .rt
            .block_on(async { tokio::time::timeout(deadline, connecting).await })
        {
            Ok(Ok(c)) => {
                self.client = Some(c);
                Ok(())
            }
            Ok(Err(e)) => Err(failed(format!("cannot connect to {shown}"), Some(e))),
            Err(_) => Err(failed(
                format!(
                    "cannot connect to {shown}: no answer within {} ms",
                    deadline.as_millis()
                ),
                None,
            )),
        }
    }

    /// Whether a call may go out now: not while backing off; connected first where
    /// needed.
    fn ready(&mut self, what: &str) -> Result<(), StoreError> {
        if let Some(at) = self.retry_at {
            if Instant::now() < at {
                return Err(failed(
                    format!(
                        "{what}: {} is down (retrying in {} ms)",
                        self.target.shown(),
                        at.saturating_duration_since(Instant::now()).as_millis()
                    ),
                    None,
                ));
            }
        }
        if self.client.is_none() {
            StoreHealth::count(&self.health.reconnects);
            if let Err(e) = self.connect_now() {
                self.down(&e.to_string());
                return Err(e);
            }
            info!(url = %self.target.shown(), "postgres store connected");
        }
        Ok(())
    }

    /// What a call's future gave by the deadline (`None`: nothing): a failure that is
    /// the server's or the network's drops the connection and backs off.
    fn settle<T>(&mut self, what: &str, out: Option<Result<T, Failure>>) -> Result<T, StoreError> {
        match out {
            Some(Ok(v)) => {
                self.up();
                Ok(v)
            }
            Some(Err(Failure::Fenced(epoch))) => {
                self.up();
                StoreHealth::count(&self.health.fenced);
                Err(StoreError::Fenced {
                    backend: NAME,
                    epoch,
                })
            }
            Some(Err(Failure::Db(e))) => {
                let lost = e.is_closed() || e.as_db_error().is_none();
                let err = failed(format!("{what} failed"), Some(e));
                if lost {
                    self.client = None;
                    self.down(&err.to_string());
                }
                Err(err)
            }
            None => {
                // the statement may still run: the connection goes, and with it the
                // transaction (the server rolls it back)
                self.client = None;
                let msg = format!("{what}: no answer within {} ms", self.deadline.as_millis());
                self.down(&msg);
                Err(failed(msg, None))
            }
        }
    }

    /// A commit's outcome, counted.
    fn counted<T>(&self, r: Result<T, StoreError>) -> Result<T, StoreError> {
        StoreHealth::count(if r.is_ok() {
            &self.health.commits_ok
        } else {
            &self.health.commits_failed
        });
        r
    }

    fn up(&mut self) {
        self.retry_at = None;
        self.backoff = MIN_BACKOFF;
        if !self.health.set_reachable(true) {
            info!(url = %self.target.shown(), "postgres store reachable again");
        }
    }

    fn down(&mut self, why: &str) {
        self.retry_at = Some(Instant::now() + self.backoff);
        self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
        if self.health.set_reachable(false) {
            warn!(url = %self.target.shown(), error = why, "postgres store unreachable");
        }
    }

    fn t(&self, table: &str) -> String {
        format!("{}.{table}", self.schema)
    }
}

/// Why a call's future failed.
enum Failure {
    Db(tokio_postgres::Error),
    Fenced(u64),
}

impl From<tokio_postgres::Error> for Failure {
    fn from(e: tokio_postgres::Error) -> Self {
        Failure::Db(e)
    }
}

/// The schema and its tables, created where missing under an advisory lock (replicas
/// that start together would otherwise race on `CREATE SCHEMA IF NOT EXISTS`), without
/// the server's notices about what exists already.
pub(crate) fn schema_sql(s: &str) -> String {
    format!(
        "SET client_min_messages = warning;
         BEGIN;
         SELECT pg_advisory_xact_lock(hashtext('powerplane schema {s}'));
         CREATE SCHEMA IF NOT EXISTS {s};
         CREATE TABLE IF NOT EXISTS {s}.collections (collection text NOT NULL, key text NOT NULL, value bytea NOT NULL, PRIMARY KEY (collection, key));
         CREATE TABLE IF NOT EXISTS {s}.logs (log text NOT NULL, seq bigint NOT NULL, value bytea NOT NULL, PRIMARY KEY (log, seq));
         CREATE TABLE IF NOT EXISTS {s}.log_heads (log text PRIMARY KEY, len bigint NOT NULL);
         CREATE TABLE IF NOT EXISTS {s}.applied (writer text PRIMARY KEY, seq bigint NOT NULL);
         CREATE TABLE IF NOT EXISTS {s}.fence (id int PRIMARY KEY CHECK (id = 1), epoch bigint NOT NULL);
         CREATE TABLE IF NOT EXISTS {s}.ha (id int PRIMARY KEY CHECK (id = 1), holder text NOT NULL, epoch bigint NOT NULL, expires_at timestamptz NOT NULL);
         INSERT INTO {s}.ha VALUES (1, '', 0, '-infinity') ON CONFLICT (id) DO NOTHING;
         COMMIT;"
    )
}

/// The URL without its password, for logs and errors.
fn redacted(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => {
            let auth = &url[s + 3..at];
            match auth.split_once(':') {
                Some((user, _)) => format!("{}{user}:***{}", &url[..s + 3], &url[at..]),
                None => url.to_string(),
            }
        }
        _ if url.contains("password=") => "(a key-value connection string)".to_string(),
        _ => url.to_string(),
    }
}

/// Applies `batch` in `tx`; the sequence number of each append.
async fn apply(tx: &Transaction<'_>, s: &str, batch: &Batch) -> Result<Vec<u64>, Failure> {
    let mut seqs = Vec::new();
    for op in &batch.ops {
        match op {
            Op::Fence { epoch } => {
                let e = i64::try_from(*epoch).unwrap_or(i64::MAX);
                tx.execute(
                    &format!("INSERT INTO {s}.fence VALUES (1, 0) ON CONFLICT (id) DO NOTHING"),
                    &[],
                )
                .await?;
                let row = tx
                    .query_one(
                        &format!("SELECT epoch FROM {s}.fence WHERE id = 1 FOR UPDATE"),
                        &[],
                    )
                    .await?;
                let held: i64 = row.get(0);
                // the leader lease's term, where the lease lives here: a batch of any
                // other term is a deposed (or not yet elected) leader's
                let term: i64 = tx
                    .query_one(
                        &format!("SELECT epoch FROM {s}.ha WHERE id = 1 FOR SHARE"),
                        &[],
                    )
                    .await?
                    .get(0);
                if held > e || (term > 0 && term != e) {
                    return Err(Failure::Fenced(*epoch));
                }
                tx.execute(
                    &format!("UPDATE {s}.fence SET epoch = $1 WHERE id = 1"),
                    &[&e],
                )
                .await?;
            }
            Op::Put {
                collection,
                key,
                value,
            } => {
                tx.execute(
                    &format!(
                        "INSERT INTO {s}.collections VALUES ($1, $2, $3) \
                         ON CONFLICT (collection, key) DO UPDATE SET value = EXCLUDED.value"
                    ),
                    &[collection, key, value],
                )
                .await?;
            }
            Op::Delete { collection, key } => {
                tx.execute(
                    &format!("DELETE FROM {s}.collections WHERE collection = $1 AND key = $2"),
                    &[collection, key],
                )
                .await?;
            }
            Op::Append { log, value } => {
                let row = tx
                    .query_one(
                        &format!(
                            "INSERT INTO {s}.log_heads VALUES ($1, 1) ON CONFLICT (log) \
                             DO UPDATE SET len = {s}.log_heads.len + 1 RETURNING len"
                        ),
                        &[log],
                    )
                    .await?;
                let seq: i64 = row.get(0);
                tx.execute(
                    &format!("INSERT INTO {s}.logs VALUES ($1, $2, $3)"),
                    &[log, &seq, value],
                )
                .await?;
                seqs.push(seq as u64);
            }
        }
    }
    Ok(seqs)
}

/// Runs `body` (an async block over `$c`, the connection) by the backend's deadline:
/// `Some(result)`, or `None` when the deadline passed.
macro_rules! on_conn {
    ($self:ident, $what:expr, |$c:ident| $body:expr) => {{
        $self.ready($what)?;
        let deadline = $self.deadline;
        let $c = $self.client.as_mut().expect("connected");
        let out = $self
            .rt
            .block_on(async { tokio::time::timeout(deadline, $body).await.ok() });
        $self.settle($what, out)
    }};
}

impl Backend for PostgresBackend {
    fn commit(&mut self, batch: &Batch) -> Result<Vec<u64>, StoreError> {
        if batch.ops.is_empty() {
            return Ok(Vec::new());
        }
        let s = self.schema.clone();
        let r = (|| {
            on_conn!(self, "commit", |c| async {
                let tx = c.transaction().await?;
                let seqs = apply(&tx, &s, batch).await?;
                tx.commit().await?;
                Ok::<_, Failure>(seqs)
            })
        })();
        self.counted(r)
    }

    fn commit_once(&mut self, writer: &str, seq: u64, batch: &Batch) -> Result<bool, StoreError> {
        let s = self.schema.clone();
        let n = i64::try_from(seq).unwrap_or(i64::MAX);
        let r =
            (|| {
                on_conn!(self, "commit", |c| async {
                    let tx = c.transaction().await?;
                    tx.execute(
                &format!("INSERT INTO {s}.applied VALUES ($1, 0) ON CONFLICT (writer) DO NOTHING"),
                &[&writer],
            )
            .await?;
                    let row = tx
                        .query_one(
                            &format!("SELECT seq FROM {s}.applied WHERE writer = $1 FOR UPDATE"),
                            &[&writer],
                        )
                        .await?;
                    let applied: i64 = row.get(0);
                    if n > 0 && n <= applied {
                        return Ok::<_, Failure>(false); // nothing written: rolled back
                    }
                    apply(&tx, &s, batch).await?;
                    if n > 0 {
                        tx.execute(
                            &format!("UPDATE {s}.applied SET seq = $2 WHERE writer = $1"),
                            &[&writer, &n],
                        )
                        .await?;
                    }
                    tx.commit().await?;
                    Ok(true)
                })
            })();
        self.counted(r)
    }

    fn applied(&mut self, writer: &str) -> Result<u64, StoreError> {
        let sql = format!("SELECT seq FROM {} WHERE writer = $1", self.t("applied"));
        on_conn!(self, "applied", |c| async {
            let row = c.query_opt(&sql, &[&writer]).await?;
            Ok::<_, Failure>(row.map_or(0, |r| r.get::<_, i64>(0).max(0) as u64))
        })
    }

    fn get(&mut self, collection: &str, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let sql = format!(
            "SELECT value FROM {} WHERE collection = $1 AND key = $2",
            self.t("collections")
        );
        on_conn!(self, "get", |c| async {
            let row = c.query_opt(&sql, &[&collection, &key]).await?;
            Ok::<_, Failure>(row.map(|r| r.get::<_, Vec<u8>>(0)))
        })
    }

    fn list(&mut self, collection: &str) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        let sql = format!(
            "SELECT key, value FROM {} WHERE collection = $1 ORDER BY key",
            self.t("collections")
        );
        on_conn!(self, "list", |c| async {
            let rows = c.query(&sql, &[&collection]).await?;
            Ok::<_, Failure>(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
        })
    }

    fn read_log(
        &mut self,
        log: &str,
        from: u64,
        limit: usize,
    ) -> Result<Vec<(u64, Vec<u8>)>, StoreError> {
        let sql = format!(
            "SELECT seq, value FROM {} WHERE log = $1 AND seq >= $2 ORDER BY seq LIMIT $3",
            self.t("logs")
        );
        let from = i64::try_from(from.max(1)).unwrap_or(i64::MAX);
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        on_conn!(self, "read_log", |c| async {
            let rows = c.query(&sql, &[&log, &from, &limit]).await?;
            Ok::<_, Failure>(
                rows.iter()
                    .map(|r| (r.get::<_, i64>(0) as u64, r.get(1)))
                    .collect(),
            )
        })
    }

    fn log_len(&mut self, log: &str) -> Result<u64, StoreError> {
        let sql = format!("SELECT len FROM {} WHERE log = $1", self.t("log_heads"));
        on_conn!(self, "log_len", |c| async {
            let row = c.query_opt(&sql, &[&log]).await?;
            Ok::<_, Failure>(row.map_or(0, |r| r.get::<_, i64>(0).max(0) as u64))
        })
    }

    fn name(&self) -> &'static str {
        NAME
    }

    fn health(&self) -> Option<Arc<StoreHealth>> {
        Some(self.health.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_stay_out_of_logs_and_schemas_are_identifiers() {
        assert_eq!(
            redacted("postgres://pp:s3cret@db:5432/powerplane"),
            "postgres://pp:***@db:5432/powerplane"
        );
        assert_eq!(redacted("postgres://pp@db/x"), "postgres://pp@db/x");
        assert_eq!(
            redacted("host=db user=pp password=s3cret"),
            "(a key-value connection string)"
        );
        assert_eq!(checked_schema("PowerPlane_1").expect("ok"), "powerplane_1");
        for bad in ["", "1x", "a;drop", "a-b", &"x".repeat(64)] {
            assert!(checked_schema(bad).is_err(), "{bad:?}");
        }
    }
}
