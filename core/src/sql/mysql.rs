//! MySQL and MariaDB for the async stores, natively, on mysql_async (feature
//! `mysql`): [`MysqlConnection`], a connection a store keeps for itself, and
//! the [`MysqlSession`] it lends for one call, on which a service can also
//! run its own transaction around [`AsyncSqlOutboxStore::add`](crate::outbox::AsyncSqlOutboxStore::add).
//!
//! Statements with parameters go over the binary protocol, prepared once
//! per connection and kept (mysql_async's statement cache); statements
//! without (`BEGIN`, `COMMIT`, `SET TRANSACTION ...`, which MySQL does not
//! prepare) over the text protocol. Columns are read by their type, since
//! the text protocol sends integers as digits.

use super::{AsyncConnectionSource, AsyncSqlConnection, Dialect, Row, SqlValue};
use crate::error::{Error, Result};
use mysql_async::consts::ColumnType;
use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Opts, Params, Value};
use std::future::Future;

/// A MySQL connection a store keeps for itself: its claims, the relay's
/// `claim` and `complete`, `create_schema`. One store call at a time has it.
/// Opened again on the next call after the server or the network dropped it,
/// when it was opened with [`connect`](Self::connect); a call dropped inside
/// a store's transaction is rolled back before the connection is lent again.
///
/// In utf8mb4 (mysql_async's default), which the stores need. No TLS (the
/// crate is built without a TLS stack): reach a server that needs TLS
/// through a local proxy, or connect a `Conn` yourself with mysql_async's
/// TLS features and pass it to [`from_conn`](Self::from_conn).
pub struct MysqlConnection {
    opts: Option<Opts>,
    state: tokio::sync::Mutex<MysqlState>,
}

struct MysqlState {
    conn: Option<Conn>,
    // Set by BEGIN, cleared by COMMIT or ROLLBACK: a call dropped in between
    // leaves it set, and the next call rolls back first.
    in_transaction: bool,
}

impl std::fmt::Debug for MysqlConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MysqlConnection").field("reconnects", &self.opts.is_some()).finish_non_exhaustive()
    }
}

impl MysqlConnection {
    /// Connect to `url` (`mysql://user:password@host:3306/database`). The
    /// `mysql2://` form a Rails application's DATABASE_URL has is read the
    /// same, so a Ruby and a Rust service can share one setting.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropped before it returns, the half-made connection is
    /// dropped with it and nothing has been written.
    pub async fn connect(url: &str) -> Result<Self> {
        let plain = match url.strip_prefix("mysql2://") {
            Some(rest) => format!("mysql://{rest}"),
            None => url.to_string(),
        };
        let opts = Opts::from_url(&plain).map_err(|e| Error::invalid(format!("cannot parse the MySQL URL {url:?}: {e}")))?;
        let conn = open(&opts).await?;
        Ok(MysqlConnection { opts: Some(opts), state: tokio::sync::Mutex::new(MysqlState { conn: Some(conn), in_transaction: false }) })
    }

    /// Use a connection the service opened itself (with TLS, say). It is
    /// not opened again once lost. Its character set must be utf8mb4.
    pub fn from_conn(conn: Conn) -> Self {
        MysqlConnection { opts: None, state: tokio::sync::Mutex::new(MysqlState { conn: Some(conn), in_transaction: false }) }
    }
}

async fn open(opts: &Opts) -> Result<Conn> {
    Conn::new(opts.clone()).await.map_err(|e| Error::store(format!("cannot connect to MySQL: {}", my_error(e).message())))
}

/// The server's message and error code, or the driver's.
fn my_error(e: mysql_async::Error) -> Error {
    match e {
        mysql_async::Error::Server(s) => Error::store(format!("mysql: {} (error {}, SQLSTATE {})", s.message, s.code, s.state)),
        other => Error::store(format!("mysql: {other}")),
    }
}

/// Whether the connection is no use after `e` (and must be opened again),
/// as opposed to a statement the server refused.
/// `?` on the service's own mysql_async calls in a function returning
/// [`crate::Result`], as for PostgreSQL.
impl From<mysql_async::Error> for Error {
    fn from(e: mysql_async::Error) -> Self {
        my_error(e)
    }
}

fn lost(e: &mysql_async::Error) -> bool {
    matches!(e, mysql_async::Error::Io(_) | mysql_async::Error::Driver(_))
}

/// The connection lent by [`MysqlConnection`] for one store call.
pub struct MysqlSession<'a> {
    // The store's calls on one session are sequential; the inner lock only
    // turns `&self` into the `&mut Conn` mysql_async wants.
    state: tokio::sync::Mutex<tokio::sync::MutexGuard<'a, MysqlState>>,
    reconnects: bool,
}

impl AsyncConnectionSource for MysqlConnection {
    type Connection<'a> = MysqlSession<'a>;

    async fn connection(&self) -> Result<MysqlSession<'_>> {
        let mut state = self.state.lock().await;
        if state.conn.is_none() {
            match &self.opts {
                Some(opts) => {
                    state.conn = Some(open(opts).await?);
                    state.in_transaction = false;
                }
                None => return Err(Error::store("mysql: the connection was lost and was given by the caller, so it is not reopened")),
            }
        }
        if state.in_transaction {
            let conn = state.conn.as_mut().expect("checked above");
            if let Err(e) = conn.query_drop("ROLLBACK").await {
                if lost(&e) {
                    state.conn = None;
                }
                return Err(my_error(e));
            }
            state.in_transaction = false;
        }
        Ok(MysqlSession { state: tokio::sync::Mutex::new(state), reconnects: self.opts.is_some() })
    }
}

fn param(v: &SqlValue) -> Value {
    match v {
        SqlValue::Null => Value::NULL,
        SqlValue::Int(i) => Value::Int(*i),
        SqlValue::Real(f) => Value::Double(*f),
        SqlValue::Text(s) => Value::Bytes(s.as_bytes().to_vec()),
    }
}

fn row(row: mysql_async::Row) -> Result<Row> {
    let types: Vec<ColumnType> = row.columns_ref().iter().map(|c| c.column_type()).collect();
    row.unwrap().into_iter().zip(types).map(|(v, t)| column(v, t)).collect()
}

fn column(v: Value, t: ColumnType) -> Result<SqlValue> {
    use ColumnType::*;
    Ok(match v {
        Value::NULL => SqlValue::Null,
        Value::Int(i) => SqlValue::Int(i),
        Value::UInt(u) => SqlValue::Int(i64::try_from(u).map_err(|_| Error::store(format!("mysql: {u} is past a BIGINT")))?),
        Value::Float(f) => SqlValue::Real(f.into()),
        Value::Double(f) => SqlValue::Real(f),
        // The text protocol's digits, and DECIMAL in either protocol.
        Value::Bytes(b) => match t {
            MYSQL_TYPE_TINY | MYSQL_TYPE_SHORT | MYSQL_TYPE_INT24 | MYSQL_TYPE_LONG | MYSQL_TYPE_LONGLONG | MYSQL_TYPE_YEAR => {
                let s = String::from_utf8_lossy(&b);
                SqlValue::Int(s.parse().map_err(|_| Error::store(format!("mysql: an integer column held {s:?}")))?)
            }
            MYSQL_TYPE_FLOAT | MYSQL_TYPE_DOUBLE | MYSQL_TYPE_DECIMAL | MYSQL_TYPE_NEWDECIMAL => {
                let s = String::from_utf8_lossy(&b);
                match s.parse::<i64>() {
                    Ok(i) => SqlValue::Int(i),
                    Err(_) => SqlValue::Real(s.parse().map_err(|_| Error::store(format!("mysql: a numeric column held {s:?}")))?),
                }
            }
            // VARBINARY keys were bound as UTF-8 text and come back as it.
            _ => SqlValue::Text(String::from_utf8_lossy(&b).into_owned()),
        },
        other => {
            return Err(Error::store(format!(
                "mysql: a {t:?} column ({other:?}) cannot be read through the SQL seam; cast it to CHAR or SIGNED"
            )))
        }
    })
}

impl MysqlSession<'_> {
    /// Run `sql` on the connection, marking it lost after an I/O or
    /// protocol error so the next call opens a new one.
    async fn run(&self, sql: &str, params: &[SqlValue], rows: bool) -> Result<(u64, Vec<Row>)> {
        let mut guard = self.state.lock().await;
        let state: &mut MysqlState = &mut guard;
        let conn = state.conn.as_mut().ok_or_else(|| Error::store("mysql: the connection was lost"))?;
        if sql == "BEGIN" {
            // Before the round trip: a BEGIN whose answer never arrives may
            // still have begun.
            state.in_transaction = true;
        }
        let result: std::result::Result<Vec<mysql_async::Row>, mysql_async::Error> = if params.is_empty() {
            if rows { conn.query(sql).await } else { conn.query_drop(sql).await.map(|()| Vec::new()) }
        } else {
            let bound = Params::Positional(params.iter().map(param).collect());
            if rows { conn.exec(sql, bound).await } else { conn.exec_drop(sql, bound).await.map(|()| Vec::new()) }
        };
        if sql == "COMMIT" || sql == "ROLLBACK" {
            // A COMMIT that failed ended the transaction too.
            state.in_transaction = false;
        }
        match result {
            Ok(found) => {
                let changed = conn.affected_rows();
                Ok((changed, found.into_iter().map(row).collect::<Result<_>>()?))
            }
            Err(e) => {
                if lost(&e) && self.reconnects {
                    state.conn = None;
                }
                Err(my_error(e))
            }
        }
    }
}

impl AsyncSqlConnection for MysqlSession<'_> {
    fn dialect(&self) -> Dialect {
        Dialect::Mysql
    }

    fn execute<'a>(&'a self, sql: &'a str, params: &'a [SqlValue]) -> impl Future<Output = Result<u64>> + Send + 'a {
        async move { self.run(sql, params, false).await.map(|(n, _)| n) }
    }

    fn query<'a>(&'a self, sql: &'a str, params: &'a [SqlValue]) -> impl Future<Output = Result<Vec<Row>>> + Send + 'a {
        async move { self.run(sql, params, true).await.map(|(_, rows)| rows) }
    }
}
