//! The transactions a store runs on a connection of its own.

use super::{AsyncSqlConnection, Dialect};
use crate::error::Result;

/// The statement that opens a store's transaction.
///
/// SQLite's plain `BEGIN` is deferred: a transaction that reads and then
/// writes takes the write lock only at its first write, so two of them can
/// both read (two relays the same due rows) and then one fails with
/// `SQLITE_BUSY` instead of waiting out the busy timeout. `IMMEDIATE` takes
/// the write lock first, so the read and the write are one step for
/// everyone else. PostgreSQL's `BEGIN` has row locks for that.
pub(crate) fn begin_statement(dialect: Dialect) -> &'static str {
    match dialect {
        Dialect::Sqlite => "BEGIN IMMEDIATE",
        Dialect::Postgres => "BEGIN",
    }
}

/// Open a transaction on `c` (which must not be inside one).
pub(crate) async fn begin<C: AsyncSqlConnection + ?Sized>(c: &C) -> Result<()> {
    c.execute(begin_statement(c.dialect()), &[]).await.map(drop)
}

/// Close the transaction `begin` opened: COMMIT when `result` is `Ok` (a
/// failed COMMIT is the error then), else ROLLBACK and `result`'s own error,
/// which is the one worth reporting.
pub(crate) async fn finish<C: AsyncSqlConnection + ?Sized, T>(c: &C, result: Result<T>) -> Result<T> {
    match result {
        Ok(r) => {
            c.execute("COMMIT", &[]).await?;
            Ok(r)
        }
        Err(e) => {
            let _ = c.execute("ROLLBACK", &[]).await;
            Err(e)
        }
    }
}
