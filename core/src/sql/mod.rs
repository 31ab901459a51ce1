//! The SQL seam: the three methods a store needs from a database connection.
//!
//! The idempotency and outbox stores are written against [`SqlConnection`] and
//! emit the SQL for the connection's [`Dialect`] themselves, so the rules (what
//! is claimed, when a claim can be taken over, what is deleted) live here once,
//! whichever driver sits behind the seam: rusqlite for a Rust service, or a
//! Ruby driver object adapted by the extension.

use crate::error::Result;

/// Which SQL the stores emit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// SQLite: `?` placeholders.
    Sqlite,
    /// PostgreSQL: `$1` placeholders.
    Postgres,
}

impl Dialect {
    /// `"sqlite"` or `"postgres"`, as a migration or a Ruby caller names it.
    pub fn parse(name: &str) -> Result<Self> {
        match name {
            "sqlite" => Ok(Dialect::Sqlite),
            "postgres" => Ok(Dialect::Postgres),
            other => Err(crate::error::Error::invalid(format!("dialect must be \"sqlite\" or \"postgres\", got {other:?}"))),
        }
    }
}

/// A bound parameter or a column value.
#[derive(Debug, Clone, PartialEq)]
pub enum SqlValue {
    /// NULL.
    Null,
    /// An integer.
    Int(i64),
    /// A float.
    Real(f64),
    /// Text. Keys are always bound as text, whatever encoding they arrived in.
    Text(String),
}

/// One row of a query result, columns in SELECT order.
pub type Row = Vec<SqlValue>;

/// A database connection as the stores see it. Blocking: a store runs on the
/// caller's thread, inside the caller's transaction when it is handed one.
pub trait SqlConnection {
    /// The dialect to emit.
    fn dialect(&self) -> Dialect;
    /// Run a statement; the number of rows it changed.
    fn execute(&self, sql: &str, params: &[SqlValue]) -> Result<u64>;
    /// Run a query; its rows, columns in SELECT order.
    fn query(&self, sql: &str, params: &[SqlValue]) -> Result<Vec<Row>>;
}
mod asynchronous;
pub use asynchronous::{AsyncConnectionSource, AsyncSqlConnection};
pub(crate) mod blocking;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "postgres")]
pub use postgres::{PgConnection, PgSession};
mod sqlite;
pub use sqlite::SqliteConnection;
mod sqlite_async;
pub use sqlite_async::{AsyncSqliteConnection, AsyncSqliteSession};
mod source;
pub use source::{ConnectionSource, PerCall};
