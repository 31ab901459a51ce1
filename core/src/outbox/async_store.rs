//! The outbox for async Rust services: the same table, statements and rules
//! as [`SqlOutboxStore`](super::SqlOutboxStore), over the async seam, so no
//! call blocks a runtime worker.

use super::rules::Rules;
use super::{Backlog, Completion, OutboxRecord, OutboxStoreOptions, StuckRecord};
use crate::error::{Error, Result};
use crate::sql::{AsyncConnectionSource, AsyncSqlConnection, Dialect};

/// A transactional outbox in a SQL table, for async code: PostgreSQL through
/// [`PgConnection`](crate::sql::PgConnection) and the service's own
/// `tokio_postgres::Transaction` (feature `postgres`), or SQLite through
/// [`AsyncSqliteConnection`](crate::sql::AsyncSqliteConnection).
///
/// The same table as [`SqlOutboxStore`](super::SqlOutboxStore) (a Ruby
/// process and a Rust one can share it), the same statements, and the same
/// rules, which are written once; the two differ only in how a statement is
/// executed. As there, two connections are involved:
///
/// * [`add`](Self::add) writes with the connection it is handed, the one
///   holding the service's open transaction, and never begins, commits or
///   closes anything: the message commits or rolls back with the work.
/// * everything else runs on the store's own connection, lent for one call
///   by the [`AsyncConnectionSource`] given at construction, in transactions
///   of its own.
///
/// ```no_run
/// # #[cfg(feature = "postgres")]
/// # async fn run() -> acemq::Result<()> {
/// use acemq::Envelope;
/// use acemq::outbox::{AsyncSqlOutboxStore, OutboxRecord, OutboxStoreOptions};
/// use acemq::sql::PgConnection;
///
/// let url = "postgres://postgres@127.0.0.1:5432/app";
/// let outbox = AsyncSqlOutboxStore::new(PgConnection::connect(url).await?, OutboxStoreOptions::default())?;
/// outbox.create_schema().await?;
///
/// // The service's own connection and transaction.
/// let (mut client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await.unwrap();
/// tokio::spawn(connection);
/// let tx = client.transaction().await.unwrap();
/// tx.execute("UPDATE orders SET state = 'placed' WHERE id = $1", &[&42i64]).await.unwrap();
/// let event = OutboxRecord::json("orders-events", "order.placed", &serde_json::json!({ "order_id": 42 }),
///                                Envelope::new().with_type("order.placed.v2"))?;
/// outbox.add(&event, &tx).await?;
/// tx.commit().await.unwrap(); // or drop `tx`: the row goes with the work
/// # Ok(()) }
/// ```
pub struct AsyncSqlOutboxStore<S> {
    // Shared by clones: a clone is the same store (one worker id, one
    // source), for the service's handlers and its relay alike.
    rules: std::sync::Arc<Rules>,
    source: std::sync::Arc<S>,
}

impl<S> Clone for AsyncSqlOutboxStore<S> {
    fn clone(&self) -> Self {
        AsyncSqlOutboxStore { rules: self.rules.clone(), source: self.source.clone() }
    }
}

crate::outbox::rules::store_debug!(AsyncSqlOutboxStore);

impl<S: AsyncConnectionSource> AsyncSqlOutboxStore<S> {
    /// Call `notified` whenever an `add` commits in any process, where the
    /// source can listen (see [`AsyncConnectionSource::listen`]).
    pub(crate) fn listen_for_rows(&self, notified: crate::sql::Notified, stop: tokio::sync::watch::Receiver<bool>) -> bool {
        self.source.listen(&self.channel(), notified, stop)
    }

    /// A store whose own calls run on connections from `source`. Fails when
    /// the table name in `options` is not a plain identifier.
    pub fn new(source: S, options: OutboxStoreOptions) -> Result<Self> {
        Ok(AsyncSqlOutboxStore { rules: std::sync::Arc::new(Rules::new(options)?), source: std::sync::Arc::new(source) })
    }

    crate::outbox::rules::store_accessors!();

    /// Create the table and its index if they do not exist.
    pub async fn create_schema(&self) -> Result<()> {
        let conn = self.connection().await?;
        self.rules.create_schema(&conn).await
    }

    /// Write `record` with `conn`, the service's open transaction (a
    /// `&tokio_postgres::Transaction`); the new row id.
    ///
    /// Nothing is begun, committed or closed: roll the transaction back (or
    /// drop it) and the message is gone with the work it describes. Cancel
    /// safe as the transaction is: a dropped `add` leaves at most a row that
    /// commits only if the caller goes on to commit.
    pub async fn add<C: AsyncSqlConnection + ?Sized>(&self, record: &OutboxRecord, conn: &C) -> Result<i64> {
        self.rules.add(&conn, record).await
    }

    /// Lease up to `batch_size` due rows to this worker, oldest first, in a
    /// transaction of its own; see [`SqlOutboxStore::claim`](super::SqlOutboxStore::claim).
    /// Cancel safe: a claim dropped before its commit is rolled back, one
    /// dropped after it leaves rows leased until the lease runs out.
    pub async fn claim(&self, batch_size: usize) -> Result<Vec<OutboxRecord>> {
        if batch_size == 0 {
            return Ok(Vec::new());
        }
        let conn = self.connection().await?;
        self.rules.claim(&conn, batch_size).await
    }

    /// [`claim`](Self::claim), deleting `done` first in the same commit; see
    /// [`SqlOutboxStore::delete_then_claim`](super::SqlOutboxStore::delete_then_claim).
    ///
    /// # Cancel safety
    ///
    /// As `claim`: dropped before its commit, neither the delete nor the
    /// claim happened; after it, the claimed rows wait out their lease.
    pub async fn delete_then_claim(&self, done: &[i64], batch_size: usize) -> Result<Vec<OutboxRecord>> {
        let conn = self.connection().await?;
        self.rules.delete_then_claim(&conn, done, batch_size).await
    }

    /// Delete `ids`, rows of this worker the broker confirmed; see
    /// [`SqlOutboxStore::delete_confirmed`](super::SqlOutboxStore::delete_confirmed).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a row whose delete was dropped is published again after
    /// its lease (a duplicate, never a loss).
    pub async fn delete_confirmed(&self, ids: &[i64]) -> Result<usize> {
        if ids.is_empty() {
            return Ok(0);
        }
        let conn = self.connection().await?;
        self.rules.delete_ids(&conn, ids).await
    }

    /// Delete what the broker confirmed and back off what failed; see
    /// [`SqlOutboxStore::complete`](super::SqlOutboxStore::complete).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a completion dropped before its commit deletes nothing, and the
    /// rows are published again after their lease (a duplicate, never a loss).
    pub async fn complete(&self, completions: &[Completion]) -> Result<usize> {
        if completions.is_empty() {
            return Ok(0);
        }
        let conn = self.connection().await?;
        self.rules.complete(&conn, completions).await
    }

    /// How many rows wait, how long the oldest has, and how many have failed.
    pub async fn backlog(&self) -> Result<Backlog> {
        let conn = self.connection().await?;
        self.rules.backlog(&conn).await
    }

    /// Up to `limit` rows that have failed at least once, oldest first.
    pub async fn stuck(&self, limit: usize) -> Result<Vec<StuckRecord>> {
        let conn = self.connection().await?;
        self.rules.stuck(&conn, limit).await
    }

    async fn connection(&self) -> Result<S::Connection<'_>> {
        self.source.connection().await.map_err(|e| {
            Error::new(e.kind().clone(), format!("cannot get the outbox store's connection: {}", e.message()))
        })
    }
}
