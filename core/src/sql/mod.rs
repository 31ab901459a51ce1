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
    /// MySQL 8.0 and MariaDB 10.6 or later (InnoDB): `?` placeholders,
    /// backquoted identifiers. Both, because the statements use only what the
    /// two share: `ON DUPLICATE KEY UPDATE` and `FOR UPDATE SKIP LOCKED`,
    /// never `RETURNING` (MariaDB's INSERT only; MySQL has none).
    Mysql,
}

impl Dialect {
    /// The dialect a migration, a driver or a Ruby adapter names: `"sqlite"`
    /// (or `"sqlite3"`, the gem's name), `"postgres"` (or `"postgresql"`,
    /// ActiveRecord's adapter name, or `"pg"`, the gem's) or `"mysql"` (or
    /// `"mysql2"`, the gem and ActiveRecord adapter, `"mariadb"` or `"trilogy"`).
    pub fn parse(name: &str) -> Result<Self> {
        match name {
            "sqlite" | "sqlite3" => Ok(Dialect::Sqlite),
            "postgres" | "postgresql" | "pg" => Ok(Dialect::Postgres),
            "mysql" | "mysql2" | "mariadb" | "trilogy" => Ok(Dialect::Mysql),
            other => Err(crate::error::Error::invalid(format!(
                "SQL dialect {other:?} is not supported: a connection's dialect must be \"sqlite\", \"postgres\" or \"mysql\""
            ))),
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
pub use asynchronous::{AsyncConnectionSource, AsyncSqlConnection, Notified};
pub(crate) mod blocking;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "postgres")]
pub use postgres::{PgConnection, PgSession};
#[cfg(feature = "mysql")]
mod mysql;
#[cfg(feature = "mysql")]
pub use mysql::{MysqlConnection, MysqlSession};
#[cfg(feature = "sqlite")]
mod sqlite;
#[cfg(feature = "sqlite")]
pub use sqlite::SqliteConnection;
#[cfg(feature = "sqlite")]
mod sqlite_async;
#[cfg(feature = "sqlite")]
pub use sqlite_async::{AsyncSqliteConnection, AsyncSqliteSession};
mod source;
pub use source::{ConnectionSource, PerCall};
pub(crate) use source::lend;

// The plumbing both stores (idempotency, outbox) share, once: placeholders,
// transactions, times, worker ids and which table names are accepted.
mod identifier;
pub use identifier::MAX_TABLE_NAME;
pub(crate) use identifier::{qualified_table_name, table_name};
pub(crate) mod placeholders;
pub(crate) mod time;
pub(crate) mod values;
mod transaction;
pub(crate) use transaction::{begin, finish, lock_conflict};
mod worker;
pub use worker::{default_worker_id, DEFAULT_WORKER_ID_MAX};
pub(crate) use worker::WorkerId;

#[cfg(test)]
mod tests {
    use super::Dialect;

    #[test]
    fn dialect_names() {
        for (name, d) in [("sqlite", Dialect::Sqlite), ("sqlite3", Dialect::Sqlite), ("postgres", Dialect::Postgres), ("postgresql", Dialect::Postgres), ("pg", Dialect::Postgres), ("mysql", Dialect::Mysql), ("mysql2", Dialect::Mysql), ("mariadb", Dialect::Mysql), ("trilogy", Dialect::Mysql)] {
            assert_eq!(Dialect::parse(name).unwrap(), d);
        }
        let e = Dialect::parse("oracle").unwrap_err();
        assert!(e.is_invalid_argument() && e.message().contains("\"oracle\" is not supported"), "{e}");
    }
    #[test]
    fn lock_conflicts_are_told_by_the_servers_words() {
        use crate::error::{Error, ErrorKind};
        for words in [
            "the SQL connection's execute raised Mysql2::Error: Deadlock found when trying to get lock; try restarting transaction",
            "ERROR 1205 (HY000): Lock wait timeout exceeded; try restarting transaction",
            "db error: ERROR: deadlock detected",
            "the SQL connection's query raised PG::TRSerializationFailure: ERROR:  could not serialize access due to concurrent update",
        ] {
            assert!(super::lock_conflict(&Error::store(words)), "{words}");
        }
        assert!(!super::lock_conflict(&Error::store("ERROR 1146 (42S02): Table 'test.t' doesn't exist")));
        assert!(!super::lock_conflict(&Error::new(ErrorKind::Timeout, "deadlock detected")), "a store's words only");
    }
}
