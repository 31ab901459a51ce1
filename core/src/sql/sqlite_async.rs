//! SQLite for the async stores: the same rusqlite connection, its statements
//! run on tokio's blocking pool so that a runtime worker never waits out
//! SQLite's busy timeout.

use super::blocking::off_runtime;
use super::{AsyncConnectionSource, AsyncSqlConnection, Dialect, Row, SqlConnection, SqlValue, SqliteConnection};
use crate::error::Result;
use std::future::Future;
use std::sync::Arc;

/// A SQLite database for the async stores.
///
/// One connection, lent to one store call at a time (a store's transaction
/// must have it to itself); each statement runs on tokio's blocking pool
/// (`spawn_blocking`), inline when there is no runtime. Open one per store,
/// or share one: calls then take turns.
pub struct AsyncSqliteConnection {
    conn: Arc<SqliteConnection>,
    turn: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for AsyncSqliteConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncSqliteConnection").finish_non_exhaustive()
    }
}

impl AsyncSqliteConnection {
    /// Open (or create) the database at `path` as
    /// [`SqliteConnection::open`] does (WAL, a busy timeout), off the runtime.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropped before it returns, the open finishes on the
    /// blocking pool and the connection is closed there; a database file it
    /// created stays (empty), as after any open.
    pub async fn open(path: &str) -> Result<Self> {
        let path = path.to_owned();
        let conn = off_runtime(move || SqliteConnection::open(&path)).await?;
        Ok(Self::from_sync(conn))
    }

    /// Use a connection opened already.
    pub fn from_sync(conn: SqliteConnection) -> Self {
        AsyncSqliteConnection { conn: Arc::new(conn), turn: tokio::sync::Mutex::new(()) }
    }
}

/// The connection lent by [`AsyncSqliteConnection`] for one call; the next
/// call waits until it is dropped.
pub struct AsyncSqliteSession<'a> {
    conn: &'a Arc<SqliteConnection>,
    _turn: tokio::sync::MutexGuard<'a, ()>,
}

impl AsyncConnectionSource for AsyncSqliteConnection {
    type Connection<'a> = AsyncSqliteSession<'a>;

    async fn connection(&self) -> Result<AsyncSqliteSession<'_>> {
        let turn = self.turn.lock().await;
        // A call dropped between its BEGIN and its COMMIT left the
        // transaction open; roll it back rather than let the next call's
        // statements join it.
        if !self.conn.with(|c| c.is_autocommit()) {
            let conn = self.conn.clone();
            off_runtime(move || conn.execute("ROLLBACK", &[])).await?;
        }
        Ok(AsyncSqliteSession { conn: &self.conn, _turn: turn })
    }
}

impl AsyncSqlConnection for AsyncSqliteSession<'_> {
    fn dialect(&self) -> Dialect {
        Dialect::Sqlite
    }

    fn execute<'a>(&'a self, sql: &'a str, params: &'a [SqlValue]) -> impl Future<Output = Result<u64>> + Send + 'a {
        let (conn, sql, params) = (self.conn.clone(), sql.to_owned(), params.to_vec());
        off_runtime(move || conn.execute(&sql, &params))
    }

    fn query<'a>(&'a self, sql: &'a str, params: &'a [SqlValue]) -> impl Future<Output = Result<Vec<Row>>> + Send + 'a {
        let (conn, sql, params) = (self.conn.clone(), sql.to_owned(), params.to_vec());
        off_runtime(move || conn.query(&sql, &params))
    }
}
