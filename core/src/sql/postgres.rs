//! PostgreSQL for the async stores, natively, on tokio-postgres (feature
//! `postgres`): the seam implemented for a service's own `Client` and
//! `Transaction`, and [`PgConnection`], a connection a store keeps for itself.
//!
//! Values cross as the seam's [`SqlValue`]s. tokio-postgres binds by the type
//! the server inferred for each placeholder, so an integer is sent as
//! `int2`/`int4`/`int8` (or a float, or text) as the column needs, and
//! every integer, float and text column is read back as one.

use super::{AsyncConnectionSource, AsyncSqlConnection, Dialect, Row, SqlValue};
use crate::error::{Error, Result};
use bytes::BytesMut;
use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use tokio_postgres::types::{FromSql, IsNull, ToSql, Type};
use tokio_postgres::{Client, GenericClient, NoTls, Statement, Transaction};

type BoxError = Box<dyn std::error::Error + Sync + Send>;

/// A [`SqlValue`] bound as a parameter.
#[derive(Debug)]
struct Param<'a>(&'a SqlValue);

impl ToSql for Param<'_> {
    fn to_sql(&self, ty: &Type, out: &mut BytesMut) -> std::result::Result<IsNull, BoxError> {
        match (self.0, ty) {
            (SqlValue::Null, _) => Ok(IsNull::Yes),
            (SqlValue::Int(i), &Type::INT8) => i.to_sql(ty, out),
            (SqlValue::Int(i), &Type::INT4) => i32::try_from(*i)?.to_sql(ty, out),
            (SqlValue::Int(i), &Type::INT2) => i16::try_from(*i)?.to_sql(ty, out),
            (SqlValue::Int(i), &Type::FLOAT8) => (*i as f64).to_sql(ty, out),
            (SqlValue::Int(i), &Type::FLOAT4) => (*i as f32).to_sql(ty, out),
            (SqlValue::Int(i), &Type::BOOL) => (*i != 0).to_sql(ty, out),
            (SqlValue::Real(f), &Type::FLOAT8) => f.to_sql(ty, out),
            (SqlValue::Real(f), &Type::FLOAT4) => (*f as f32).to_sql(ty, out),
            (SqlValue::Int(i), t) if is_text(t) => i.to_string().as_str().to_sql(&Type::TEXT, out),
            (SqlValue::Real(f), t) if is_text(t) => f.to_string().as_str().to_sql(&Type::TEXT, out),
            (SqlValue::Text(s), t) if is_text(t) => s.as_str().to_sql(&Type::TEXT, out),
            (value, ty) => Err(format!("cannot bind {value:?} to a PostgreSQL {ty} parameter").into()),
        }
    }

    fn accepts(_: &Type) -> bool {
        // Decided per value in to_sql, which names the mismatch.
        true
    }

    tokio_postgres::types::to_sql_checked!();
}

fn is_text(ty: &Type) -> bool {
    matches!(*ty, Type::TEXT | Type::VARCHAR | Type::BPCHAR | Type::NAME | Type::UNKNOWN)
}

/// A column read back as a [`SqlValue`].
struct Column(SqlValue);

impl<'a> FromSql<'a> for Column {
    fn from_sql(ty: &Type, raw: &'a [u8]) -> std::result::Result<Self, BoxError> {
        Ok(Column(match *ty {
            Type::INT8 => SqlValue::Int(i64::from_sql(ty, raw)?),
            Type::INT4 => SqlValue::Int(i32::from_sql(ty, raw)?.into()),
            Type::INT2 => SqlValue::Int(i16::from_sql(ty, raw)?.into()),
            Type::BOOL => SqlValue::Int(bool::from_sql(ty, raw)?.into()),
            Type::FLOAT8 => SqlValue::Real(f64::from_sql(ty, raw)?),
            Type::FLOAT4 => SqlValue::Real(f32::from_sql(ty, raw)?.into()),
            ref t if is_text(t) => SqlValue::Text(<&str>::from_sql(ty, raw)?.to_owned()),
            ref t => return Err(format!("a PostgreSQL {t} column cannot be read through the SQL seam; cast it to TEXT or BIGINT").into()),
        }))
    }

    fn from_sql_null(_: &Type) -> std::result::Result<Self, BoxError> {
        Ok(Column(SqlValue::Null))
    }

    fn accepts(_: &Type) -> bool {
        true
    }
}

/// tokio-postgres's error with the server's message and SQLSTATE, which its
/// `Display` leaves in `source()`.
fn pg_error(e: tokio_postgres::Error) -> Error {
    match e.as_db_error() {
        Some(db) => Error::store(format!("postgres: {} (SQLSTATE {})", db.message(), db.code().code())),
        None => match std::error::Error::source(&e) {
            Some(source) => Error::store(format!("postgres: {e}: {source}")),
            None => Error::store(format!("postgres: {e}")),
        },
    }
}

/// `?` on the service's own tokio-postgres calls in a function returning
/// [`crate::Result`]: a store error with the server's message and SQLSTATE.
impl From<tokio_postgres::Error> for Error {
    fn from(e: tokio_postgres::Error) -> Self {
        pg_error(e)
    }
}

fn bind(params: &[SqlValue]) -> Vec<Param<'_>> {
    params.iter().map(Param).collect()
}

fn refs<'a>(params: &'a [Param<'a>]) -> Vec<&'a (dyn ToSql + Sync)> {
    params.iter().map(|p| p as &(dyn ToSql + Sync)).collect()
}

fn rows(rows: Vec<tokio_postgres::Row>) -> Result<Vec<Row>> {
    rows.iter()
        .map(|row| (0..row.len()).map(|i| row.try_get::<_, Column>(i).map(|c| c.0).map_err(pg_error)).collect())
        .collect()
}

async fn generic_execute<C: GenericClient>(c: &C, sql: &str, params: &[SqlValue]) -> Result<u64> {
    let bound = bind(params);
    c.execute(sql, &refs(&bound)).await.map_err(pg_error)
}

async fn generic_query<C: GenericClient>(c: &C, sql: &str, params: &[SqlValue]) -> Result<Vec<Row>> {
    let bound = bind(params);
    rows(c.query(sql, &refs(&bound)).await.map_err(pg_error)?)
}

/// A service's own client: statements run outside any transaction (each
/// commits on its own) unless the client is inside one it began itself.
impl AsyncSqlConnection for Client {
    fn dialect(&self) -> Dialect {
        Dialect::Postgres
    }
    fn execute<'a>(&'a self, sql: &'a str, params: &'a [SqlValue]) -> impl Future<Output = Result<u64>> + Send + 'a {
        generic_execute(self, sql, params)
    }
    fn query<'a>(&'a self, sql: &'a str, params: &'a [SqlValue]) -> impl Future<Output = Result<Vec<Row>>> + Send + 'a {
        generic_query(self, sql, params)
    }
}

/// A service's own transaction: what
/// [`AsyncSqlOutboxStore::add`](crate::outbox::AsyncSqlOutboxStore::add)
/// writes with, so the message commits or rolls back with the work.
impl AsyncSqlConnection for Transaction<'_> {
    fn dialect(&self) -> Dialect {
        Dialect::Postgres
    }
    fn execute<'a>(&'a self, sql: &'a str, params: &'a [SqlValue]) -> impl Future<Output = Result<u64>> + Send + 'a {
        generic_execute(self, sql, params)
    }
    fn query<'a>(&'a self, sql: &'a str, params: &'a [SqlValue]) -> impl Future<Output = Result<Vec<Row>>> + Send + 'a {
        generic_query(self, sql, params)
    }
}

/// A PostgreSQL connection a store keeps for itself: its claims, the relay's
/// `claim` and `complete`, `create_schema`. One store call at a time has it
/// (a store's transaction must not share it); statements are prepared once
/// and kept. Reconnects on the next call after the server closed it, when it
/// was opened with [`connect`](Self::connect).
///
/// No TLS: the connection is made with `NoTls`. Reach a server that needs TLS
/// through a local proxy, or build the `Client` yourself with a TLS connector
/// and pass it to [`from_client`](Self::from_client).
pub struct PgConnection {
    config: Option<tokio_postgres::Config>,
    state: tokio::sync::Mutex<PgState>,
}

struct PgState {
    client: Client,
    // Set by a BEGIN, cleared by COMMIT or ROLLBACK: a call dropped in
    // between leaves it set, and the next call rolls back first.
    in_transaction: AtomicBool,
    prepared: std::sync::Mutex<HashMap<String, Statement>>,
}

impl std::fmt::Debug for PgConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgConnection").field("reconnects", &self.config.is_some()).finish_non_exhaustive()
    }
}

impl PgConnection {
    /// Connect to `url` (`postgres://user@host:5432/db`, or the key=value
    /// form libpq takes). Spawns the connection's I/O task, so call it within
    /// a tokio runtime.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropped before it returns, the half-made connection is
    /// dropped with it and nothing has been written.
    pub async fn connect(url: &str) -> Result<Self> {
        let config: tokio_postgres::Config = url
            .parse()
            .map_err(|e| Error::invalid(format!("cannot parse the PostgreSQL URL {url:?}: {e}")))?;
        let client = open(&config).await?;
        Ok(PgConnection { config: Some(config), state: tokio::sync::Mutex::new(PgState::new(client)) })
    }

    /// Use a client the service connected itself (with TLS, say). Its
    /// connection task is the caller's to run; it is not reconnected.
    pub fn from_client(client: Client) -> Self {
        PgConnection { config: None, state: tokio::sync::Mutex::new(PgState::new(client)) }
    }
}

/// `LISTEN` on a connection of its own until `stop`: each notification
/// calls `notified`. A lost connection is opened again, backing off from
/// 100 ms to 5 s, and `notified` is called once it listens again: rows may
/// have been committed while nobody listened.
async fn listen(
    config: tokio_postgres::Config,
    statement: String,
    notified: super::Notified,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let mut pause = std::time::Duration::from_millis(100);
    loop {
        if let Ok((client, mut connection)) = config.connect(NoTls).await {
            let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
            // The connection's own task: it reads the socket, and a
            // notification is a message on it, not a reply to a query.
            let driver = tokio::spawn(async move {
                let mut messages = futures_lite::stream::poll_fn(move |cx| connection.poll_message(cx));
                while let Some(Ok(message)) = futures_lite::StreamExt::next(&mut messages).await {
                    if let tokio_postgres::AsyncMessage::Notification(_) = message {
                        let _ = tx.send(());
                    }
                }
            });
            if client.batch_execute(&statement).await.is_ok() {
                pause = std::time::Duration::from_millis(100);
                notified();
                loop {
                    tokio::select! {
                        got = rx.recv() => match got {
                            Some(()) => notified(),
                            None => break, // the connection ended
                        },
                        () = stopped(&mut stop) => {
                            driver.abort();
                            return;
                        }
                    }
                }
            }
            drop(client);
            driver.abort();
        }
        tokio::select! {
            () = tokio::time::sleep(pause) => {}
            () = stopped(&mut stop) => return,
        }
        pause = (pause * 2).min(std::time::Duration::from_secs(5));
    }
}

/// Until `stop` is true or its sender is gone.
async fn stopped(stop: &mut tokio::sync::watch::Receiver<bool>) {
    while !*stop.borrow_and_update() {
        if stop.changed().await.is_err() {
            return;
        }
    }
}

async fn open(config: &tokio_postgres::Config) -> Result<Client> {
    let (client, connection) = config
        .connect(NoTls)
        .await
        .map_err(|e| Error::store(format!("cannot connect to PostgreSQL: {}", pg_error(e).message())))?;
    let _ = tokio::runtime::Handle::try_current()
        .map_err(|_| Error::invalid("PgConnection::connect spawns a tokio task: call it within a tokio runtime"))?
        // Ends when the client is dropped or the server goes away; the
        // client's next call then fails with "connection closed".
        .spawn(async move { let _ = connection.await; });
    Ok(client)
}

impl PgState {
    fn new(client: Client) -> Self {
        PgState { client, in_transaction: AtomicBool::new(false), prepared: Default::default() }
    }
}

/// The connection lent by [`PgConnection`] for one store call.
pub struct PgSession<'a> {
    state: tokio::sync::MutexGuard<'a, PgState>,
}

impl AsyncConnectionSource for PgConnection {
    type Connection<'a> = PgSession<'a>;

    async fn connection(&self) -> Result<PgSession<'_>> {
        let mut state = self.state.lock().await;
        if state.client.is_closed() {
            if let Some(config) = &self.config {
                *state = PgState::new(open(config).await?);
            }
        }
        if state.in_transaction.load(Ordering::SeqCst) {
            state.client.batch_execute("ROLLBACK").await.map_err(pg_error)?;
            state.in_transaction.store(false, Ordering::SeqCst);
        }
        Ok(PgSession { state })
    }

    fn listen(&self, channel: &str, notified: super::Notified, stop: tokio::sync::watch::Receiver<bool>) -> bool {
        let (Some(config), Ok(runtime)) = (self.config.clone(), tokio::runtime::Handle::try_current()) else {
            return false;
        };
        runtime.spawn(listen(config, format!("LISTEN \"{}\"", channel.replace('"', "\"\"")), notified, stop));
        true
    }
}

impl PgSession<'_> {
    async fn statement(&self, sql: &str) -> Result<Statement> {
        if let Some(s) = self.state.prepared.lock().unwrap_or_else(|p| p.into_inner()).get(sql) {
            return Ok(s.clone());
        }
        let statement = self.state.client.prepare(sql).await.map_err(pg_error)?;
        let mut prepared = self.state.prepared.lock().unwrap_or_else(|p| p.into_inner());
        // The stores' statements are a fixed set per table; anything else
        // (a caller's own) is not worth keeping without bound.
        if prepared.len() < 256 {
            prepared.insert(sql.to_owned(), statement.clone());
        }
        Ok(statement)
    }

    fn track(&self, sql: &str) {
        match sql {
            "BEGIN" => self.state.in_transaction.store(true, Ordering::SeqCst),
            "COMMIT" | "ROLLBACK" => self.state.in_transaction.store(false, Ordering::SeqCst),
            _ => {}
        }
    }
}

impl AsyncSqlConnection for PgSession<'_> {
    fn dialect(&self) -> Dialect {
        Dialect::Postgres
    }

    fn execute<'a>(&'a self, sql: &'a str, params: &'a [SqlValue]) -> impl Future<Output = Result<u64>> + Send + 'a {
        async move {
            let statement = self.statement(sql).await?;
            let bound = bind(params);
            // Set before the round trip: a BEGIN whose answer never arrives
            // (the call dropped) may still have begun.
            if sql == "BEGIN" {
                self.track(sql);
            }
            let result = self.state.client.execute(&statement, &refs(&bound)).await.map_err(pg_error);
            // A COMMIT that failed ended the transaction too.
            self.track(sql);
            result
        }
    }

    fn query<'a>(&'a self, sql: &'a str, params: &'a [SqlValue]) -> impl Future<Output = Result<Vec<Row>>> + Send + 'a {
        async move {
            let statement = self.statement(sql).await?;
            let bound = bind(params);
            rows(self.state.client.query(&statement, &refs(&bound)).await.map_err(pg_error)?)
        }
    }
}
