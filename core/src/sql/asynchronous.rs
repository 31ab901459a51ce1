//! The async form of the SQL seam, for Rust services: the same three methods
//! as [`SqlConnection`](super::SqlConnection), returning futures, and where a
//! store gets one for the length of a call.
//!
//! The store rules are written once, as `async` code over
//! [`AsyncSqlConnection`]. The blocking stores run that same code over a
//! [`SqlConnection`](super::SqlConnection) whose statements finish when they
//! are called (so the future is ready at its first poll); the async stores run
//! it over a connection that really waits — tokio-postgres, or SQLite on
//! tokio's blocking pool.

use super::{Dialect, Row, SqlValue};
use crate::error::Result;
use std::future::Future;

/// A database connection as the async stores see it.
///
/// Implemented for `tokio_postgres::Client` and `tokio_postgres::Transaction`
/// (feature `postgres`), so [`AsyncSqlOutboxStore::add`](crate::outbox::AsyncSqlOutboxStore::add)
/// takes the service's own transaction; for the sessions lent by
/// [`PgConnection`](super::PgConnection) and
/// [`AsyncSqliteConnection`](super::AsyncSqliteConnection); and by anything a
/// service writes for another driver or a pool.
///
/// The futures are `Send`, so a store call can be awaited inside a task that
/// `tokio::spawn` moves between worker threads.
pub trait AsyncSqlConnection {
    /// The dialect to emit.
    fn dialect(&self) -> Dialect;
    /// Run a statement; the number of rows it changed.
    fn execute<'a>(&'a self, sql: &'a str, params: &'a [SqlValue]) -> impl Future<Output = Result<u64>> + Send + 'a;
    /// Run a query; its rows, columns in SELECT order.
    fn query<'a>(&'a self, sql: &'a str, params: &'a [SqlValue]) -> impl Future<Output = Result<Vec<Row>>> + Send + 'a;
}

impl<C: AsyncSqlConnection + ?Sized> AsyncSqlConnection for &C {
    fn dialect(&self) -> Dialect {
        (**self).dialect()
    }
    fn execute<'a>(&'a self, sql: &'a str, params: &'a [SqlValue]) -> impl Future<Output = Result<u64>> + Send + 'a {
        (**self).execute(sql, params)
    }
    fn query<'a>(&'a self, sql: &'a str, params: &'a [SqlValue]) -> impl Future<Output = Result<Vec<Row>>> + Send + 'a {
        (**self).query(sql, params)
    }
}

/// Where an async store gets its *own* connection (for `create_schema`, the
/// claims, the relay's `claim` and `complete`): one lent for the length of one
/// store call, so that a transaction the store runs (BEGIN ... COMMIT) has the
/// connection to itself.
///
/// [`PgConnection`](super::PgConnection) and
/// [`AsyncSqliteConnection`](super::AsyncSqliteConnection) are sources; a
/// pool is one by lending a checkout.
pub trait AsyncConnectionSource: Send + Sync {
    /// The connection lent for one call.
    type Connection<'a>: AsyncSqlConnection + Send + Sync
    where
        Self: 'a;

    /// Lend a connection, waiting for it if another call has it. Cancel safe:
    /// a connection dropped inside a store's transaction is rolled back
    /// before it is lent again.
    fn connection(&self) -> impl Future<Output = Result<Self::Connection<'_>>> + Send;

    /// Call `notified` whenever a `NOTIFY` on `channel` commits, from any
    /// process, until `stop` turns true; false when this source cannot
    /// listen (the default: SQLite, a pool, a client the service connected
    /// itself). `PgConnection::connect` (feature `postgres`) can:
    /// it listens on a connection of its own, opened again when the server
    /// drops it. What a started outbox relay wakes on.
    fn listen(&self, channel: &str, notified: Notified, stop: tokio::sync::watch::Receiver<bool>) -> bool {
        let _ = (channel, notified, stop);
        false
    }
}

/// What [`AsyncConnectionSource::listen`] calls on every notification.
pub type Notified = std::sync::Arc<dyn Fn() + Send + Sync>;

impl<S: AsyncConnectionSource + ?Sized> AsyncConnectionSource for std::sync::Arc<S> {
    type Connection<'a>
        = S::Connection<'a>
    where
        Self: 'a;

    fn connection(&self) -> impl Future<Output = Result<Self::Connection<'_>>> + Send {
        (**self).connection()
    }
    fn listen(&self, channel: &str, notified: Notified, stop: tokio::sync::watch::Receiver<bool>) -> bool {
        (**self).listen(channel, notified, stop)
    }
}
