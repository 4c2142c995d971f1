//! The leader lease in PostgreSQL: one row of `{schema}.ha` (`holder`, `epoch`,
//! `expires_at`), in the schema of the store (see [`crate::store::postgres`]).
//! Taking the lease, bumping the epoch and writing the term happen in one transaction
//! under the row's lock, and only while the row's lease has ended by the server's
//! clock (`now()`), so two replicas never hold one term and every term's epoch is
//! larger than the one before. Renewal extends `expires_at` only while the row still
//! holds this term and it has not ended (compare-and-set in one statement).
//!
//! The store's commits that carry an epoch check it against this row inside their own
//! transaction: a deposed leader's batch does not land, directly or from its journal.
//!
//! The election runs on a thread of its own; this client drives tokio-postgres on a
//! small runtime of its own with a deadline on every call, and connects again on the
//! next round after a failure, so a dead or hung server costs one deadline per round
//! and never the control loop.

use std::time::Duration;

use tokio_postgres::Client;

use crate::store::postgres::Target;

use super::{Fence, Holder, LeaseError, LeaseStore};

/// The lease in one schema of a PostgreSQL database.
pub struct PostgresLease {
    target: Target,
    schema: String,
    deadline: Duration,
    rt: tokio::runtime::Runtime,
    client: Option<Client>,
}

fn err(what: &str, e: impl std::fmt::Display) -> LeaseError {
    LeaseError(format!("postgres: {what}: {e}"))
}

impl PostgresLease {
    /// A lease client for `url` in `schema` (the store's), `deadline` per call; it
    /// connects on its first call.
    pub fn new(url: &str, schema: &str, deadline: Duration) -> Result<Self, LeaseError> {
        Self::to(&Target::plain(url), schema, deadline)
    }

    /// As [`PostgresLease::new`], to `target` (its password, its TLS).
    pub fn to(target: &Target, schema: &str, deadline: Duration) -> Result<Self, LeaseError> {
        target.check().map_err(|e| err("bad url", e))?;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| err("cannot start its runtime", e))?;
        Ok(PostgresLease {
            target: target.clone(),
            schema: crate::store::postgres::checked_schema(schema).map_err(|e| err("schema", e))?,
            deadline,
            rt,
            client: None,
        })
    }

    /// Runs `sql` with `params` (text and integers) by the deadline; the rows' first
    /// two columns as (text, bigint) where they have them. A failure drops the
    /// connection: the next call connects again.
    fn run(
        &mut self,
        what: &str,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<Vec<tokio_postgres::Row>, LeaseError> {
        let (target, schema, deadline) = (self.target.clone(), self.schema.clone(), self.deadline);
        let client = &mut self.client;
        let out = self.rt.block_on(async {
            tokio::time::timeout(deadline, async {
                if client.is_none() {
                    let c = target
                        .connect(&tokio::runtime::Handle::current(), "leader lease")
                        .await?;
                    c.batch_execute(&crate::store::postgres::schema_sql(&schema))
                        .await?;
                    *client = Some(c);
                }
                let c = client.as_mut().expect("connected");
                let tx = c.transaction().await?;
                let rows = tx.query(sql, params).await?;
                tx.commit().await?;
                Ok::<_, tokio_postgres::Error>(rows)
            })
            .await
        });
        match out {
            Ok(Ok(rows)) => Ok(rows),
            Ok(Err(e)) => {
                self.client = None;
                Err(err(what, e))
            }
            Err(_) => {
                self.client = None;
                Err(err(
                    what,
                    format!("no answer within {} ms", deadline.as_millis()),
                ))
            }
        }
    }
}

impl LeaseStore for PostgresLease {
    fn acquire(&mut self, instance: &str, lease_ms: u64) -> Result<Option<u64>, LeaseError> {
        let s = self.schema.clone();
        let ms = i64::try_from(lease_ms).unwrap_or(i64::MAX);
        // the row exists from the schema on (free); taking it is one statement under
        // its lock
        let rows = self.run(
            "acquire",
            &format!(
                "UPDATE {s}.ha SET holder = $1, epoch = epoch + 1, \
                     expires_at = now() + $2::bigint * interval '1 millisecond' \
                 WHERE id = 1 AND expires_at <= now() RETURNING epoch"
            ),
            &[&instance, &ms],
        )?;
        Ok(rows.first().map(|r| r.get::<_, i64>(0) as u64))
    }

    fn renew(&mut self, instance: &str, epoch: u64, lease_ms: u64) -> Result<bool, LeaseError> {
        let s = self.schema.clone();
        let (e, ms) = (
            i64::try_from(epoch).unwrap_or(i64::MAX),
            i64::try_from(lease_ms).unwrap_or(i64::MAX),
        );
        let rows = self.run(
            "renew",
            &format!(
                "UPDATE {s}.ha SET expires_at = now() + $3::bigint * interval '1 millisecond' \
                 WHERE id = 1 AND holder = $1 AND epoch = $2 AND expires_at > now() RETURNING 1"
            ),
            &[&instance, &e, &ms],
        )?;
        Ok(!rows.is_empty())
    }

    fn release(&mut self, instance: &str, epoch: u64) -> Result<(), LeaseError> {
        let s = self.schema.clone();
        let e = i64::try_from(epoch).unwrap_or(i64::MAX);
        self.run(
            "release",
            &format!(
                "UPDATE {s}.ha SET expires_at = now() \
                 WHERE id = 1 AND holder = $1 AND epoch = $2 AND expires_at > now() RETURNING 1"
            ),
            &[&instance, &e],
        )?;
        Ok(())
    }

    fn holder(&mut self) -> Result<Option<Holder>, LeaseError> {
        let s = self.schema.clone();
        let rows = self.run(
            "holder",
            &format!("SELECT holder, epoch FROM {s}.ha WHERE id = 1 AND expires_at > now()"),
            &[],
        )?;
        Ok(rows.first().map(|r| Holder {
            instance: r.get(0),
            epoch: r.get::<_, i64>(1) as u64,
        }))
    }

    fn epoch(&mut self) -> Result<u64, LeaseError> {
        let s = self.schema.clone();
        let rows = self.run(
            "epoch",
            &format!("SELECT epoch FROM {s}.ha WHERE id = 1"),
            &[],
        )?;
        Ok(rows.first().map_or(0, |r| r.get::<_, i64>(0).max(0) as u64))
    }
}

impl Fence for PostgresLease {
    fn raise(&mut self, epoch: u64) -> Result<(), LeaseError> {
        let s = self.schema.clone();
        let e = i64::try_from(epoch).unwrap_or(i64::MAX);
        self.run(
            "raise the fencing epoch",
            &format!("UPDATE {s}.ha SET epoch = $1 WHERE id = 1 AND epoch < $1 RETURNING 1"),
            &[&e],
        )?;
        Ok(())
    }

    fn current(&mut self) -> Result<u64, LeaseError> {
        LeaseStore::epoch(self)
    }
}
