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
///
/// Fork-aware: SQLite forbids using a connection in a process other than
/// the one that opened it (its locks are per process, and its in-process
/// lock bookkeeping is copied into the child as it stood). A store built in
/// a parent that then forks (`acemq run --processes N` boots the app and
/// its stores once) would otherwise write through the parent's handle. The
/// first call in another process opens the file again there and leaks the
/// inherited handle without closing it, as the sqlite3 gem 2.x does:
/// closing it in the child could checkpoint or remove the parent's WAL.
pub struct SqliteConnection {
    conn: Mutex<Opened>,
}

struct Opened {
    conn: rusqlite::Connection,
    /// The process the handle belongs to.
    pid: u32,
}

impl SqliteConnection {
    /// Open (or create) the database at `path`, in WAL mode with a busy
    /// timeout, so several processes can share it.
    pub fn open(path: &str) -> Result<Self> {
        Ok(Self::from_rusqlite(open_file(path)?))
    }

    /// Wrap a connection the caller already opened.
    pub fn from_rusqlite(conn: rusqlite::Connection) -> Self {
        // A batch statement's text depends on its size (one VALUES tuple per
        // key), so a consumer whose batches vary prepares one per size: room
        // for them beside the fixed statements (rusqlite keeps 16).
        conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
        Self { conn: Mutex::new(Opened { conn, pid: std::process::id() }) }
    }

    /// Run `f` with the underlying rusqlite connection (for the caller's own
    /// transactions around a store call).
    ///
    /// # Panics
    ///
    /// In a forked child whose file cannot be opened again (deleted, say):
    /// the parent's handle is never used there. The store calls report that
    /// as an error instead.
    pub fn with<R>(&self, f: impl FnOnce(&rusqlite::Connection) -> R) -> R {
        match self.checked(f) {
            Ok(r) => r,
            Err(e) => panic!("{e}"),
        }
    }

    /// `f` with this process's own connection: opened again first when the
    /// handle was inherited across a fork.
    fn checked<R>(&self, f: impl FnOnce(&rusqlite::Connection) -> R) -> Result<R> {
        let mut guard = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        let pid = std::process::id();
        if guard.pid != pid {
            // An in-memory database is the child's own copy: nothing to reopen.
            if let Some(path) = guard.conn.path().filter(|p| !p.is_empty()).map(str::to_owned) {
                let fresh = open_file(&path).map_err(|e| {
                    Error::store(format!("{} (opening it again in forked process {pid}, as SQLite requires)", e.message()))
                })?;
                fresh.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
                std::mem::forget(std::mem::replace(&mut guard.conn, fresh));
            }
            guard.pid = pid;
        }
        Ok(f(&guard.conn))
    }
}

/// Open (or create) `path` in WAL mode with a busy timeout.
fn open_file(path: &str) -> Result<rusqlite::Connection> {
    let conn =
        rusqlite::Connection::open(path).map_err(|e| Error::store(format!("cannot open sqlite database {path}: {e}")))?;
    conn.busy_timeout(Duration::from_secs(10)).map_err(sqlite_error)?;
    // WAL lets readers and one writer proceed together; NORMAL sync is
    // durable across a process crash, which is the failure that matters here.
    conn.pragma_update(None, "journal_mode", "WAL").map_err(sqlite_error)?;
    conn.pragma_update(None, "synchronous", "NORMAL").map_err(sqlite_error)?;
    Ok(conn)
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
        self.checked(|c| {
            let params: Vec<SqliteValue> = params.iter().map(to_sqlite).collect();
            if params.is_empty() && sql.trim_end().trim_end_matches(';').contains(';') {
                c.execute_batch(sql).map(|_| 0).map_err(sqlite_error)
            } else {
                let mut stmt = c.prepare_cached(sql).map_err(sqlite_error)?;
                stmt.execute(rusqlite::params_from_iter(params)).map(|n| n as u64).map_err(sqlite_error)
            }
        })?
    }

    fn query(&self, sql: &str, params: &[SqlValue]) -> Result<Vec<Row>> {
        self.checked(|c| {
            let params: Vec<SqliteValue> = params.iter().map(to_sqlite).collect();
            let mut stmt = c.prepare_cached(sql).map_err(sqlite_error)?;
            let n = stmt.column_count();
            let rows = stmt
                .query_map(rusqlite::params_from_iter(params), |row| {
                    (0..n).map(|i| row.get_ref(i).map(from_sqlite)).collect::<rusqlite::Result<Row>>()
                })
                .map_err(sqlite_error)?;
            rows.collect::<rusqlite::Result<Vec<Row>>>().map_err(sqlite_error)
        })?
    }
}
