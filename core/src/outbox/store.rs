//! The outbox table over the blocking SQL seam: `add` in the caller's
//! transaction, and the relay's SQL steps `claim` and `complete`. The rules
//! are [`Rules`](super::rules::Rules); this runs them on a blocking connection.

use super::rules::Rules;
use super::{Backlog, Completion, OutboxRecord, OutboxStoreOptions, StuckRecord};
use crate::error::{Error, Result};
use crate::sql::blocking::{run, Blocking};
use crate::sql::ConnectionSource;
use crate::sql::{Dialect, SqlConnection};

/// A transactional outbox in a SQL table (SQLite or PostgreSQL).
///
/// Two connections are involved, and keeping them apart is the point:
///
/// * [`add`](Self::add) writes with the connection it is *handed*, the one
///   holding the caller's open transaction, and never begins, commits or
///   closes anything. The message commits with the work or rolls back with it.
/// * Everything else (`create_schema`, `claim`, `complete`, `backlog`,
///   `stuck`) uses the store's *own* connection, from the
///   [`ConnectionSource`] given at construction: a connection it keeps (a
///   [`SqliteConnection`](crate::sql::SqliteConnection), a
///   `Box<dyn SqlConnection>`) or one lent per call (a pool checkout, see
///   [`PerCall`](crate::sql::PerCall)). That connection must not be
///   inside a transaction of the caller's: `claim` and `complete` run their own.
///
/// Relaying is three steps so that the SQL can run on one thread and the
/// publish on another (the Ruby extension runs SQL on a Ruby thread holding
/// the GVL and waits for confirms without it): [`claim`](Self::claim), publish
/// through an [`OutboxPublisher`](crate::outbox::OutboxPublisher), then
/// [`complete`](Self::complete). [`OutboxRelay`](crate::outbox::OutboxRelay)
/// does all three for a Rust service.
///
/// `S` is the connection source. The default, `Box<dyn ConnectionSource>`,
/// need not be `Send` (a Ruby driver object is not); the Rust relay needs a
/// store whose source is `Send + Sync`, such as
/// [`SqliteConnection`](crate::sql::SqliteConnection) itself.
///
/// Delivery is at least once: a row is deleted only after its confirm, so a
/// crash between the confirm and the delete publishes it again. Rows are
/// claimed in id order; on PostgreSQL ids are taken at insert, not commit, so
/// two transactions committing out of order can publish out of order.
pub struct SqlOutboxStore<S = Box<dyn ConnectionSource>> {
    rules: Rules,
    source: S,
}

crate::outbox::rules::store_debug!(SqlOutboxStore);

impl<S: ConnectionSource> SqlOutboxStore<S> {
    /// A store whose relay steps run on connections from `source`. Fails
    /// when the table name in `options` is not a plain identifier.
    pub fn new(source: S, options: OutboxStoreOptions) -> Result<Self> {
        Ok(SqlOutboxStore { rules: Rules::new(options)?, source })
    }

    crate::outbox::rules::store_accessors!();

    /// Create the table and its index if they do not exist, in the dialect of
    /// the store's connection.
    pub fn create_schema(&self) -> Result<()> {
        self.with_conn(|conn| run(self.rules.create_schema(&Blocking(conn))))
    }

    /// Write `record` with `conn`, the connection holding the caller's open
    /// transaction; the new row id.
    ///
    /// Nothing is begun, committed or closed: roll the transaction back and
    /// the message is gone with the work it describes. `conn` may be a
    /// different connection from the store's own and need not be `Send`.
    pub fn add(&self, record: &OutboxRecord, conn: &dyn SqlConnection) -> Result<i64> {
        run(self.rules.add(&Blocking(conn), record))
    }

    /// Lease up to `batch_size` due rows to this worker, oldest first, and
    /// return them. Blocking; runs its own transaction on the store's
    /// connection.
    ///
    /// While the lease lasts no other relay claims them, however many run
    /// against the same table. A relay that dies holding a lease loses its
    /// rows to the others once the lease runs out. A row that cannot be read
    /// back (its headers are not JSON) is not returned: it is failed with a
    /// backoff like an unpublishable one, so it shows in
    /// [`stuck`](Self::stuck) instead of stopping every sweep.
    pub fn claim(&self, batch_size: usize) -> Result<Vec<OutboxRecord>> {
        if batch_size == 0 {
            return Ok(Vec::new());
        }
        // One lent connection for the whole transaction: BEGIN and COMMIT on
        // two different pool connections would commit nothing.
        self.with_conn(|conn| run(self.rules.claim(&Blocking(conn), batch_size)))
    }

    /// [`claim`](Self::claim), deleting `done` first in the same commit:
    /// rows of this worker that the broker confirmed in the previous sweep,
    /// held back when [`Swept::defer_delete`](crate::outbox::Swept::defer_delete)
    /// said so. One statement on PostgreSQL, one transaction on SQLite: a
    /// relay draining a backlog (or woken while it publishes) commits once
    /// per sweep instead of twice. Blocking.
    pub fn delete_then_claim(&self, done: &[i64], batch_size: usize) -> Result<Vec<OutboxRecord>> {
        self.with_conn(|conn| run(self.rules.delete_then_claim(&Blocking(conn), done, batch_size)))
    }

    /// Delete `ids`, rows of this worker the broker confirmed (those whose
    /// delete was held back for a claim that is not coming); the rows
    /// deleted. Autocommitted, 500 ids per statement. Blocking.
    pub fn delete_confirmed(&self, ids: &[i64]) -> Result<usize> {
        if ids.is_empty() {
            return Ok(0);
        }
        self.with_conn(|conn| run(self.rules.delete_ids(&Blocking(conn), ids)))
    }

    /// Settle what a claim led to: delete the rows the broker confirmed, and
    /// for each failure count the attempt, keep the error, schedule the next
    /// try after an exponential backoff and release the lease, so a row that
    /// keeps failing (its exchange does not exist) waits on its own and does
    /// not hold back rows to other destinations. The number of rows deleted.
    ///
    /// Only rows still leased by this worker are touched. One whose lease ran
    /// out and passed to another relay is that relay's to settle: if it was
    /// confirmed here, it is published once more (a duplicate, never a loss).
    /// Blocking; runs its own transaction on the store's connection.
    pub fn complete(&self, completions: &[Completion]) -> Result<usize> {
        if completions.is_empty() {
            return Ok(0);
        }
        self.with_conn(|conn| run(self.rules.complete(&Blocking(conn), completions)))
    }

    /// How many rows wait, how long the oldest has, and how many have failed.
    pub fn backlog(&self) -> Result<Backlog> {
        self.with_conn(|conn| run(self.rules.backlog(&Blocking(conn))))
    }

    /// Up to `limit` rows that have failed at least once, oldest first: where
    /// each is going, how often it has failed and why.
    pub fn stuck(&self, limit: usize) -> Result<Vec<StuckRecord>> {
        self.with_conn(|conn| run(self.rules.stuck(&Blocking(conn), limit)))
    }

    /// Run `f` with one connection lent by the source.
    fn with_conn<T>(&self, f: impl FnOnce(&dyn SqlConnection) -> Result<T>) -> Result<T> {
        let mut f = Some(f);
        let mut out = None;
        self.source.with_connection(&mut |conn| {
            let f = f.take().ok_or_else(|| Error::store("the connection source lent the outbox store two connections for one call; lend exactly one"))?;
            out = Some(f(conn)?);
            Ok(())
        })?;
        out.ok_or_else(|| Error::store("the connection source lent the outbox store no connection; lend exactly one per call"))
    }
}
