//! What the outbox tests share.

use crate::envelope::Envelope;
use crate::error::{Error, ErrorKind, Result};
use crate::outbox::{OutboxPublisher, OutboxRecord, OutboxStoreOptions, PublishFuture, SqlOutboxStore};
use crate::sql::{Dialect, Row, SqlConnection, SqlValue, SqliteConnection};
use rusqlite::types::{Value as SqliteValue, ValueRef};
use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

/// A SQLite file in the temp dir, removed (with its WAL files) on drop.
pub struct TempDb {
    pub path: PathBuf,
}

impl TempDb {
    pub fn new(name: &str) -> Self {
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let unique = format!(
            "acemq-outbox-{name}-{}-{}-{}.db",
            std::process::id(),
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos(),
            COUNTER.fetch_add(1, Ordering::SeqCst)
        );
        TempDb { path: std::env::temp_dir().join(unique) }
    }

    pub fn path(&self) -> &str {
        self.path.to_str().unwrap()
    }

    pub fn connect(&self) -> SqliteConnection {
        SqliteConnection::open(self.path()).unwrap()
    }

    /// A store with its own connection to this file, as `worker`.
    pub fn store(&self, worker: &str) -> SqlOutboxStore<SqliteConnection> {
        self.store_with(OutboxStoreOptions { worker_id: Some(worker.to_owned()), ..OutboxStoreOptions::default() })
    }

    pub fn store_with(&self, options: OutboxStoreOptions) -> SqlOutboxStore<SqliteConnection> {
        let store = SqlOutboxStore::new(self.connect(), options).unwrap();
        store.create_schema().unwrap();
        store
    }
}

impl Drop for TempDb {
    fn drop(&mut self) {
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", self.path()));
        }
    }
}

/// A record to `exchange` with a recognisable id.
pub fn record(exchange: &str, routing_key: &str, n: usize) -> OutboxRecord {
    OutboxRecord::json(
        exchange,
        routing_key,
        &serde_json::json!({ "n": n }),
        Envelope::new().with_type("order.placed.v2").with_id(format!("msg-{n}")).with_header("tenant", "acme"),
    )
    .unwrap()
}

/// Add `record` in a transaction of its own on `conn`, as an application would.
pub fn add_committed<S: crate::sql::ConnectionSource>(store: &SqlOutboxStore<S>, conn: &SqliteConnection, record: &OutboxRecord) -> i64 {
    conn.execute("BEGIN", &[]).unwrap();
    let id = store.add(record, conn).unwrap();
    conn.execute("COMMIT", &[]).unwrap();
    id
}

/// One column of one row, by SQL.
pub fn scalar(conn: &SqliteConnection, sql: &str, params: &[SqlValue]) -> SqlValue {
    conn.query(sql, params).unwrap().remove(0).remove(0)
}

/// Publishes to every exchange but the failing ones, and remembers what it
/// published, in order.
#[derive(Default)]
pub struct FakePublisher {
    pub published: Mutex<Vec<OutboxRecord>>,
    pub failing: Mutex<HashSet<String>>,
    /// Answer with this many results at most (a publisher that drops some).
    pub truncate: Mutex<Option<usize>>,
    pub batches: AtomicUsize,
}

impl FakePublisher {
    pub fn failing(exchanges: &[&str]) -> Self {
        let publisher = FakePublisher::default();
        publisher.failing.lock().unwrap().extend(exchanges.iter().map(|e| e.to_string()));
        publisher
    }

    pub fn message_ids(&self) -> Vec<String> {
        self.published.lock().unwrap().iter().map(|r| r.envelope.id.clone()).collect()
    }
}

impl OutboxPublisher for FakePublisher {
    fn publish_batch<'a>(&'a self, records: &'a [OutboxRecord]) -> PublishFuture<'a> {
        Box::pin(async move {
            self.batches.fetch_add(1, Ordering::SeqCst);
            // Await something, as a real publisher awaits confirms.
            tokio::task::yield_now().await;
            let failing = self.failing.lock().unwrap().clone();
            let mut results: Vec<Result<()>> = records
                .iter()
                .map(|r| {
                    if failing.contains(&r.exchange) {
                        Err(Error::new(
                            ErrorKind::Broker { reply_code: 404 },
                            format!("no exchange '{}' in vhost '/': declare it first", r.exchange),
                        ))
                    } else {
                        self.published.lock().unwrap().push(r.clone());
                        Ok(())
                    }
                })
                .collect();
            if let Some(n) = *self.truncate.lock().unwrap() {
                results.truncate(n);
            }
            results
        })
    }
}

/// A borrowed rusqlite connection behind the seam: what a Rust service holds
/// inside `conn.transaction()`.
pub struct Borrowed<'a>(pub &'a rusqlite::Connection);

impl SqlConnection for Borrowed<'_> {
    fn dialect(&self) -> Dialect {
        Dialect::Sqlite
    }

    fn execute(&self, sql: &str, params: &[SqlValue]) -> Result<u64> {
        let params: Vec<SqliteValue> = params.iter().map(to_sqlite).collect();
        self.0
            .execute(sql, rusqlite::params_from_iter(params))
            .map(|n| n as u64)
            .map_err(|e| Error::store(format!("sqlite: {e}")))
    }

    fn query(&self, sql: &str, params: &[SqlValue]) -> Result<Vec<Row>> {
        let params: Vec<SqliteValue> = params.iter().map(to_sqlite).collect();
        let mut stmt = self.0.prepare(sql).map_err(|e| Error::store(format!("sqlite: {e}")))?;
        let n = stmt.column_count();
        let rows = stmt
            .query_map(rusqlite::params_from_iter(params), |row| {
                (0..n)
                    .map(|i| {
                        row.get_ref(i).map(|v| match v {
                            ValueRef::Null => SqlValue::Null,
                            ValueRef::Integer(i) => SqlValue::Int(i),
                            ValueRef::Real(f) => SqlValue::Real(f),
                            ValueRef::Text(t) | ValueRef::Blob(t) => {
                                SqlValue::Text(String::from_utf8_lossy(t).into_owned())
                            }
                        })
                    })
                    .collect::<rusqlite::Result<Row>>()
            })
            .map_err(|e| Error::store(format!("sqlite: {e}")))?;
        rows.collect::<rusqlite::Result<Vec<Row>>>().map_err(|e| Error::store(format!("sqlite: {e}")))
    }
}

fn to_sqlite(v: &SqlValue) -> SqliteValue {
    match v {
        SqlValue::Null => SqliteValue::Null,
        SqlValue::Int(i) => SqliteValue::Integer(*i),
        SqlValue::Real(f) => SqliteValue::Real(*f),
        SqlValue::Text(s) => SqliteValue::Text(s.clone()),
    }
}

/// Poll `check` until it holds or `timeout` passes.
pub async fn eventually(timeout: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + timeout;
    while tokio::time::Instant::now() < deadline {
        if check() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    check()
}
