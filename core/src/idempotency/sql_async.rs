//! The SQL store for async Rust services: the same table, statements and
//! rules as [`SqlIdempotencyStore`](super::SqlIdempotencyStore), over the
//! async seam.

use super::clock::Clock;
use super::options::{SqlIdempotencyOptions, TimeColumns};
use super::rules::Keys;
use super::store::AsyncIdempotencyStore;
use crate::error::Result;
use crate::sql::{AsyncConnectionSource, Dialect};
use std::future::Future;
use std::sync::Arc;

// Run one rule on a connection lent for the call, naming the table and
// what to check when it fails.
macro_rules! call {
    ($store:expr, $doing:expr, |$k:ident, $c:ident| $rule:expr) => {
        async move {
            let inner = &$store.inner;
            let $k = &inner.keys;
            let conn = inner.source.connection().await.map_err(|e| $k.failed($doing, e))?;
            let $c = &conn;
            $rule.await.map_err(|e| $k.failed($doing, e))
        }
    };
}

/// Idempotency keys in a SQL table, for async code: PostgreSQL through
/// [`PgConnection`](crate::sql::PgConnection) (feature `postgres`), or SQLite
/// through [`AsyncSqliteConnection`](crate::sql::AsyncSqliteConnection), whose
/// statements run on tokio's blocking pool.
///
/// The table, the statements and the rules are exactly
/// [`SqlIdempotencyStore`](super::SqlIdempotencyStore)'s (see there): the
/// claim is an INSERT that commits on its own, a stale `CLAIMED` row is taken
/// over by one conditional UPDATE, `confirm` makes it `CONFIRMED`, `forget`
/// deletes only this worker's own claim. Give it a connection of its own,
/// never the handler's transaction: a claim that rolls back with the work is
/// not a claim.
///
/// Cheap to clone (the clones share one store), so one store can guard
/// several handlers. Every call is cancel safe: a claim dropped before its
/// answer may or may not have been made, which is the same as a consumer
/// killed at that point (the claim expires after the claim timeout).
///
/// ```no_run
/// # #[cfg(feature = "postgres")]
/// # async fn run() -> acemq::Result<()> {
/// use acemq::idempotency::{AsyncSqlIdempotencyStore, Idempotent, SqlIdempotencyOptions};
/// use acemq::sql::PgConnection;
/// use acemq::{Ack, Message, Outcome};
///
/// let db = PgConnection::connect("postgres://postgres@127.0.0.1:5432/app").await?;
/// let store = AsyncSqlIdempotencyStore::new(db, SqlIdempotencyOptions::default())?;
/// store.create_schema().await?;
/// let charge = Idempotent::new(store, |m: Message| async move {
///     // Payments::charge(&m.payload["order_id"], ...) runs once per order.
///     Outcome::Ack(Ack::accept())
/// })
/// .with_key(|m| m.payload["order_id"].as_str().map(|id| format!("charge:{id}")));
/// // In the consumer: `let outcome = charge.handle(message).await;`
/// # Ok(()) }
/// ```
pub struct AsyncSqlIdempotencyStore<S> {
    inner: Arc<Inner<S>>,
}

struct Inner<S> {
    keys: Keys,
    source: S,
}

impl<S> Clone for AsyncSqlIdempotencyStore<S> {
    fn clone(&self) -> Self {
        AsyncSqlIdempotencyStore { inner: self.inner.clone() }
    }
}

impl<S> std::fmt::Debug for AsyncSqlIdempotencyStore<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncSqlIdempotencyStore").field("table", &self.inner.keys.options().table).finish()
    }
}

impl<S: AsyncConnectionSource> AsyncSqlIdempotencyStore<S> {
    /// A store whose calls run on connections from `source`.
    pub fn new(source: S, options: SqlIdempotencyOptions) -> Result<Self> {
        Ok(AsyncSqlIdempotencyStore { inner: Arc::new(Inner { keys: Keys::new(options)?, source }) })
    }

    /// Run on a table whose times are `times` (see
    /// [`SqlIdempotencyStore::with_time_columns`](super::SqlIdempotencyStore::with_time_columns)).
    /// Call it before cloning the store.
    ///
    /// # Panics
    ///
    /// When the store has been cloned already.
    pub fn with_time_columns(mut self, times: TimeColumns) -> Self {
        let inner = Arc::get_mut(&mut self.inner)
            .expect("AsyncSqlIdempotencyStore::with_time_columns: call it before cloning the store");
        inner.keys.set_time_columns(times);
        self
    }

    /// Read time from `clock` (a [`ManualClock`](super::ManualClock) in
    /// tests). Call it on the store [`new`](Self::new) returned, before
    /// cloning it.
    ///
    /// # Panics
    ///
    /// When the store has been cloned already.
    pub fn with_clock(mut self, clock: impl Clock + 'static) -> Self {
        let inner = Arc::get_mut(&mut self.inner).expect("AsyncSqlIdempotencyStore::with_clock: call it before cloning the store");
        inner.keys.set_clock(clock);
        self
    }

    /// How long a claim lasts before another worker may take it over: the
    /// same name as the blocking store's
    /// ([`IdempotencyStore::claim_timeout`](super::IdempotencyStore::claim_timeout)),
    /// no trait to import. `consume` reads it from the guard by itself.
    pub fn claim_timeout(&self) -> Option<std::time::Duration> {
        Some(self.options().claim_timeout)
    }

    /// The options it was built with.
    pub fn options(&self) -> &SqlIdempotencyOptions {
        self.inner.keys.options()
    }

    /// The worker id written to `claimed_by`.
    pub fn worker(&self) -> String {
        self.inner.keys.worker()
    }

    /// Where the store's connections come from.
    pub fn source(&self) -> &S {
        &self.inner.source
    }

    /// The statements [`create_schema`](Self::create_schema) runs, for a
    /// migration file.
    pub fn schema_sql(&self, dialect: Dialect) -> Vec<String> {
        self.inner.keys.schema_sql(dialect)
    }

    /// Create the table and its expiry index if they do not exist.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: each statement is `IF NOT EXISTS`, so one dropped half
    /// way is finished by the next call.
    pub async fn create_schema(&self) -> Result<()> {
        call!(self, "create the idempotency table", |k, c| k.create_schema(c)).await
    }

    /// Remove keys past their retention; how many were removed. Schedule it
    /// (hourly, say): nothing on the handling path deletes.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropped, the DELETE either ran or did not; the next
    /// purge removes what is left.
    pub async fn purge_expired(&self) -> Result<u64> {
        call!(self, "purge expired idempotency keys", |k, c| k.purge_expired(c)).await
    }

    /// Claim each key, one statement for the batch; see
    /// [`SqlIdempotencyStore::claim_batch`](super::SqlIdempotencyStore::claim_batch).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe in the sense that matters: dropped before its answer, the
    /// statement may or may not have claimed the keys, which is the same as
    /// a consumer killed at that point. Claims made are this worker's, live
    /// until the claim timeout; their redeliveries wait, then run.
    pub async fn claim_batch(&self, keys: &[&str]) -> Result<Vec<bool>> {
        call!(self, "claim idempotency keys", |k, c| k.claim_batch(c, keys)).await
    }

    /// Confirm each key: one `UPDATE ... WHERE message_id IN (...)`.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: the UPDATE either ran or did not, and confirming again
    /// is harmless (a confirm is idempotent).
    pub async fn confirm_batch(&self, keys: &[&str]) -> Result<()> {
        call!(self, "confirm idempotency keys", |k, c| k.confirm_batch(c, keys)).await
    }
}


impl<S: AsyncConnectionSource + 'static> AsyncIdempotencyStore for AsyncSqlIdempotencyStore<S> {
    fn claim_expiry(&self) -> Option<std::time::Duration> {
        self.claim_timeout()
    }

    fn first_time_async<'a>(&'a self, key: &'a str) -> impl Future<Output = Result<bool>> + Send + 'a {
        call!(self, "claim an idempotency key", |k, c| k.first_time(c, key))
    }

    fn confirm_async<'a>(&'a self, key: &'a str) -> impl Future<Output = Result<()>> + Send + 'a {
        call!(self, "confirm an idempotency key", |k, c| k.confirm(c, key))
    }

    fn forget_async<'a>(&'a self, key: &'a str) -> impl Future<Output = Result<()>> + Send + 'a {
        call!(self, "forget an idempotency key", |k, c| k.forget(c, key))
    }

    fn confirmed_async<'a>(&'a self, key: &'a str) -> impl Future<Output = Result<bool>> + Send + 'a {
        call!(self, "read an idempotency key", |k, c| k.confirmed(c, key))
    }

    fn first_time_many_async<'a>(&'a self, keys: &'a [&'a str]) -> impl Future<Output = Result<Vec<bool>>> + Send + 'a {
        self.claim_batch(keys)
    }

    fn confirm_many_async<'a>(&'a self, keys: &'a [&'a str]) -> impl Future<Output = Result<()>> + Send + 'a {
        self.confirm_batch(keys)
    }

    /// Spawns the forget on the current tokio runtime; with none, the claim
    /// is left to expire.
    fn forget_now_or_later(&self, key: String) -> Option<Result<()>> {
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            let store = self.clone();
            handle.spawn(async move {
                let _ = store.forget_async(&key).await;
            });
        }
        None
    }
}
