//! The SQL store: the claim is an INSERT, SQLite and PostgreSQL alike.

use super::clock::Clock;
use super::options::{SqlIdempotencyOptions, TimeColumns};
use super::rules::Keys;
use super::store::IdempotencyStore;
use crate::error::Result;
use crate::sql::blocking::{run, Blocking};
use crate::sql::ConnectionSource;
use crate::sql::{Dialect, SqlConnection};
use std::time::Duration;

/// Idempotency keys in a SQL table, through the SQL seam ([`SqlConnection`]).
///
/// The table is the store's own (`create_schema` makes it):
///
/// | column        | SQLite  | PostgreSQL | meaning                                   |
/// |---------------|---------|------------|-------------------------------------------|
/// | `message_id`  | TEXT PK | TEXT PK    | the key                                   |
/// | `state`       | TEXT    | TEXT       | `CLAIMED` or `CONFIRMED`                  |
/// | `claimed_by`  | TEXT    | TEXT       | the worker that claimed it                |
/// | `recorded_at` | INTEGER | BIGINT     | when it was claimed, epoch milliseconds   |
/// | `expires_at`  | INTEGER | BIGINT     | when it may be purged, epoch milliseconds |
///
/// Times are integers (epoch milliseconds, from this worker's clock) rather
/// than datetime columns: an integer compares the same way in both dialects
/// and in every driver, where timestamps come back as strings from `pg`,
/// as text in SQLite and with the session's time zone in between. This is
/// not the table from the guide's ActiveRecord migration, which has datetime
/// columns: if that table exists under the same name, give this store
/// another one.
///
/// The rules, exactly the guide's:
/// - the claim is an `INSERT ... ON CONFLICT (message_id)` that commits on
///   its own (never inside the handler's transaction: a claim that rolls back
///   with the work is not a claim); the row being this worker's is the answer
///   to "am I the first?", because a primary key is the one thing two
///   concurrent transactions cannot both win. `ON CONFLICT` rather than
///   catching a unique violation, because on PostgreSQL a violation aborts
///   the caller's transaction;
/// - on conflict, a `CLAIMED` row whose claim is older than the claim timeout
///   is taken over by the same statement (`DO UPDATE ... WHERE`, see the
///   statements); a `CONFIRMED` row never is. One key or a batch, the claim
///   is that one statement, one `VALUES` tuple per key;
/// - `confirm` is an idempotent `UPDATE` to `CONFIRMED`;
/// - `forget` deletes only this worker's own `CLAIMED` row;
/// - nothing on the handling path deletes: schedule
///   [`purge_expired`](Self::purge_expired) (hourly, say). A key is remembered
///   at least for the retention and until it is purged.
pub struct SqlIdempotencyStore<C = Box<dyn ConnectionSource>> {
    pub(super) source: C,
    keys: Keys,
}

impl<C: ConnectionSource> SqlIdempotencyStore<C> {
    /// A store over `source`: a connection it keeps (e.g. a
    /// [`SqliteConnection`](crate::sql::SqliteConnection)) or a
    /// [`ConnectionSource`] that lends one per call.
    pub fn new(source: C, options: SqlIdempotencyOptions) -> Result<Self> {
        Ok(Self { keys: Keys::new(options)?, source })
    }

    /// Run on a table whose `recorded_at` and `expires_at` hold `times`:
    /// [`TimeColumns::DatetimeUtc`] for the guide's ActiveRecord migration
    /// (what `AceMQ::Rails::ActiveRecordIdempotencyStore` runs on). The
    /// rules and their SQL are the same; only the times' type differs, and
    /// on MySQL the claim goes one key at a time (see `TimeColumns`).
    pub fn with_time_columns(mut self, times: TimeColumns) -> Self {
        self.keys.set_time_columns(times);
        self
    }

    /// Read time from `clock` (a [`ManualClock`](super::ManualClock) in tests).
    pub fn with_clock(mut self, clock: impl Clock + 'static) -> Self {
        self.keys = self.keys.with_clock(clock);
        self
    }

    /// The options it was built with.
    pub fn options(&self) -> &SqlIdempotencyOptions {
        self.keys.options()
    }

    /// The worker id written to `claimed_by`.
    pub fn worker(&self) -> String {
        self.keys.worker()
    }

    /// The statements [`create_schema`](Self::create_schema) runs, for a
    /// migration file.
    pub fn schema_sql(&self, dialect: Dialect) -> Vec<String> {
        self.keys.schema_sql(dialect)
    }

    /// Create the table and its expiry index if they do not exist.
    pub fn create_schema(&self) -> Result<()> {
        self.with_conn("create the idempotency table", |c| run(self.keys.create_schema(&Blocking(c))))
    }

    /// Remove keys past their retention; how many were removed. Nothing on
    /// the handling path deletes (a delete there is contention on the one
    /// table every message touches), so schedule this; the index on
    /// `expires_at` keeps it from scanning the table.
    pub fn purge_expired(&self) -> Result<u64> {
        self.with_conn("purge expired idempotency keys", |c| run(self.keys.purge_expired(&Blocking(c))))
    }

    /// [`first_time`](IdempotencyStore::first_time) for each key, in one
    /// statement (one per 249 distinct keys): one round trip and one commit
    /// instead of one per key, for a consumer that takes deliveries in
    /// batches. Each key is decided exactly by the one-message rules (insert,
    /// else take over a stale claim, never a confirmed key), in order, and a
    /// key repeated in the batch is first at most once. No transaction of
    /// its own: like `first_time`, it commits on its own only outside one.
    pub fn claim_batch(&self, keys: &[&str]) -> Result<Vec<bool>> {
        self.with_conn("claim idempotency keys", |c| run(self.keys.claim_batch(&Blocking(c), keys)))
    }

    /// [`confirm`](IdempotencyStore::confirm) each key: one
    /// `UPDATE ... WHERE message_id IN (...)` (per 999 distinct keys).
    pub fn confirm_batch(&self, keys: &[&str]) -> Result<()> {
        self.with_conn("confirm idempotency keys", |c| run(self.keys.confirm_batch(&Blocking(c), keys)))
    }

    fn with_conn<R>(&self, doing: &str, f: impl FnOnce(&dyn SqlConnection) -> Result<R>) -> Result<R> {
        crate::sql::lend(&self.source, doing, f).map_err(|e| self.keys.failed(doing, e))
    }
}

impl<C: ConnectionSource> IdempotencyStore for SqlIdempotencyStore<C> {
    fn claim_timeout(&self) -> Option<Duration> {
        Some(self.options().claim_timeout)
    }

    /// The INSERT (and any takeover) commits on its own only if the
    /// connection is not inside a transaction: give the store a connection
    /// outside the handler's transaction, or the claim rolls back with the work.
    fn first_time(&self, key: &str) -> Result<bool> {
        self.with_conn("claim an idempotency key", |c| run(self.keys.first_time(&Blocking(c), key)))
    }

    fn confirm(&self, key: &str) -> Result<()> {
        self.with_conn("confirm an idempotency key", |c| run(self.keys.confirm(&Blocking(c), key)))
    }

    fn forget(&self, key: &str) -> Result<()> {
        self.with_conn("forget an idempotency key", |c| run(self.keys.forget(&Blocking(c), key)))
    }

    fn confirmed(&self, key: &str) -> Result<bool> {
        self.with_conn("read an idempotency key", |c| run(self.keys.confirmed(&Blocking(c), key)))
    }

    /// One statement for the whole batch: [`claim_batch`](Self::claim_batch).
    fn first_time_many(&self, keys: &[&str]) -> Result<Vec<bool>> {
        self.claim_batch(keys)
    }

    /// One statement for the whole batch: [`confirm_batch`](Self::confirm_batch).
    fn confirm_many(&self, keys: &[&str]) -> Result<()> {
        self.confirm_batch(keys)
    }
}
