//! The native SQLite connection (rusqlite, linked against the system
//! libsqlite3 so that it shares POSIX locks with any other SQLite in the
//! process, such as Ruby's sqlite3 gem).

use super::{Dialect, Row, SqlConnection, SqlValue};
use crate::error::{Error, Result};
use rusqlite::types::{Value as SqliteValue, ValueRef};
use std::sync::Mutex;
use std::time::Duration;

/// Prepared statements kept per connection.
const STATEMENT_CACHE: usize = 256;

/// A SQLite database file opened by the library itself.
pub struct SqliteConnection {
    conn: Mutex<rusqlite::Connection>,
}

impl SqliteConnection {
    /// Open (or create) the database at `path`, in WAL mode with a busy
    /// timeout, so several processes can share it.
    pub fn open(path: &str) -> Result<Self> {
        let conn = rusqlite::Connection::open(path)
            .map_err(|e| Error::store(format!("cannot open sqlite database {path}: {e}")))?;
        conn.busy_timeout(Duration::from_secs(10)).map_err(sqlite_error)?;
        // WAL lets readers and one writer proceed together; NORMAL sync is
        // durable across a process crash, which is the failure that matters here.
        conn.pragma_update(None, "journal_mode", "WAL").map_err(sqlite_error)?;
        conn.pragma_update(None, "synchronous", "NORMAL").map_err(sqlite_error)?;
        Ok(Self::from_rusqlite(conn))
    }

    /// Wrap a connection the caller already opened.
    pub fn from_rusqlite(conn: rusqlite::Connection) -> Self {
        // A batch statement's text depends on its size (one VALUES tuple per
        // key), so a consumer whose batches vary prepares one per size: room
        // for them beside the fixed statements (rusqlite keeps 16).
        conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
        Self { conn: Mutex::new(conn) }
    }

    /// Run `f` with the underlying rusqlite connection (for the caller's own
    /// transactions around a store call).
    pub fn with<R>(&self, f: impl FnOnce(&rusqlite::Connection) -> R) -> R {
        let guard = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        f(&guard)
    }
}

fn sqlite_error(e: rusqlite::Error) -> Error {
    Error::store(format!("sqlite: {e}"))
}

fn to_sqlite(v: &SqlValue) -> SqliteValue {
    match v {
        SqlValue::Null => SqliteValue::Null,
        SqlValue::Int(i) => SqliteValue::Integer(*i),
        SqlValue::Real(f) => SqliteValue::Real(*f),
        SqlValue::Text(s) => SqliteValue::Text(s.clone()),
    }
}

fn from_sqlite(v: ValueRef<'_>) -> SqlValue {
    match v {
        ValueRef::Null => SqlValue::Null,
        ValueRef::Integer(i) => SqlValue::Int(i),
        ValueRef::Real(f) => SqlValue::Real(f),
        ValueRef::Text(t) | ValueRef::Blob(t) => SqlValue::Text(String::from_utf8_lossy(t).into_owned()),
    }
}

impl SqlConnection for SqliteConnection {
    fn dialect(&self) -> Dialect {
        Dialect::Sqlite
    }

    fn execute(&self, sql: &str, params: &[SqlValue]) -> Result<u64> {
        self.with(|c| {
            let params: Vec<SqliteValue> = params.iter().map(to_sqlite).collect();
            if params.is_empty() && sql.trim_end().trim_end_matches(';').contains(';') {
                c.execute_batch(sql).map(|_| 0).map_err(sqlite_error)
            } else {
                let mut stmt = c.prepare_cached(sql).map_err(sqlite_error)?;
                stmt.execute(rusqlite::params_from_iter(params)).map(|n| n as u64).map_err(sqlite_error)
            }
        })
    }

    fn query(&self, sql: &str, params: &[SqlValue]) -> Result<Vec<Row>> {
        self.with(|c| {
            let params: Vec<SqliteValue> = params.iter().map(to_sqlite).collect();
            let mut stmt = c.prepare_cached(sql).map_err(sqlite_error)?;
            let n = stmt.column_count();
            let rows = stmt
                .query_map(rusqlite::params_from_iter(params), |row| {
                    (0..n).map(|i| row.get_ref(i).map(from_sqlite)).collect::<rusqlite::Result<Row>>()
                })
                .map_err(sqlite_error)?;
            rows.collect::<rusqlite::Result<Vec<Row>>>().map_err(sqlite_error)
        })
    }
}
