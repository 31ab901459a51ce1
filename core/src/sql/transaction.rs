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
/// everyone else. PostgreSQL's and InnoDB's `BEGIN` have row locks for that.
fn begin_statement(dialect: Dialect) -> &'static str {
    match dialect {
        Dialect::Sqlite => "BEGIN IMMEDIATE",
        Dialect::Postgres | Dialect::Mysql => "BEGIN",
    }
}

/// Open a transaction on `c` (which must not be inside one).
pub(crate) async fn begin<C: AsyncSqlConnection + ?Sized>(c: &C) -> Result<()> {
    c.execute(begin_statement(c.dialect()), &[]).await.map(drop)
}

/// Close the transaction `begin` opened, so the connection is never left
/// inside it: COMMIT when `result` is `Ok`, else ROLLBACK and `result`'s own
/// error, which is the one worth reporting (a failed rollback, the
/// transaction already gone, adds nothing to it).
pub(crate) async fn finish<C: AsyncSqlConnection + ?Sized, T>(c: &C, result: Result<T>) -> Result<T> {
    match result {
        Ok(r) => match c.execute("COMMIT", &[]).await {
            Ok(_) => Ok(r),
            Err(e) => {
                // A COMMIT that failed may leave the transaction open on some
                // drivers; the error that matters is the commit's.
                let _ = c.execute("ROLLBACK", &[]).await;
                Err(e)
            }
        },
        Err(e) => {
            let _ = c.execute("ROLLBACK", &[]).await;
            Err(e)
        }
    }
}

/// Whether the database rolled `e`'s statement or transaction back for a
/// lock conflict with another connection, and says to run it again: a
/// deadlock (MySQL and MariaDB 1213, PostgreSQL 40P01), a lock wait timeout
/// (MySQL and MariaDB 1205), a serialization failure (PostgreSQL 40001).
/// Told by the server's own words, which every driver passes on (mysql2,
/// `pg`, tokio-postgres, mysql_async), as their codes are not.
pub(crate) fn lock_conflict(e: &crate::error::Error) -> bool {
    const WORDS: [&str; 4] =
        ["Deadlock found when trying to get lock", "Lock wait timeout exceeded", "deadlock detected", "could not serialize access"];
    matches!(e.kind(), crate::error::ErrorKind::Store) && WORDS.iter().any(|w| e.to_string().contains(w))
}
