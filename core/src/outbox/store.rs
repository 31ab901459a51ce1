//! The outbox table over the SQL seam: `add` in the caller's transaction, and
//! the relay's SQL steps `claim` and `complete`.

use super::statements::{begin, Statements};
use super::values::{column, int, opt_int, opt_str, opt_text, text};
use super::worker_id::default_worker_id;
use super::{Backlog, Completion, OutboxRecord, OutboxStoreOptions, StuckRecord};
use crate::envelope::Envelope;
use crate::error::{Error, Result};
use crate::headers::Headers;
use crate::sql::ConnectionSource;
use crate::sql::{Dialect, SqlConnection, SqlValue};
use std::collections::HashMap;
use std::time::Duration;

/// Ids per `IN (...)` list: under SQLite's oldest limit of 999 bound
/// parameters, with room for the worker id.
const IDS_PER_STATEMENT: usize = 500;

/// A transactional outbox in a SQL table (SQLite or PostgreSQL).
///
/// Two connections are involved, and keeping them apart is the point:
///
/// * [`add`](Self::add) writes with the connection it is *handed*, the one
///   holding the caller's open transaction, and never begins, commits or
///   closes anything. The message commits with the work or rolls back with it.
/// * Everything else (`create_schema`, `claim`, `complete`, `backlog`,
///   `stuck`) uses the store's *own* connection, from the
///   [`ConnectionSource`] given at construction: a connection it keeps (a
///   [`SqliteConnection`](crate::sql::SqliteConnection), a
///   `Box<dyn SqlConnection>`) or one lent per call (a pool checkout, see
///   [`PerCall`](crate::sql::PerCall)). That connection must not be
///   inside a transaction of the caller's: `claim` and `complete` run their own.
///
/// Relaying is three steps so that the SQL can run on one thread and the
/// publish on another (the Ruby extension runs SQL on a Ruby thread holding
/// the GVL and waits for confirms without it): [`claim`](Self::claim), publish
/// through an [`OutboxPublisher`](crate::outbox::OutboxPublisher), then
/// [`complete`](Self::complete). [`OutboxRelay`](crate::outbox::OutboxRelay)
/// does all three for a Rust service.
///
/// `S` is the connection source. The default, `Box<dyn ConnectionSource>`,
/// need not be `Send` (a Ruby driver object is not); the Rust relay needs a
/// store whose source is `Send + Sync`, such as
/// [`SqliteConnection`](crate::sql::SqliteConnection) itself.
///
/// Delivery is at least once: a row is deleted only after its confirm, so a
/// crash between the confirm and the delete publishes it again. Rows are
/// claimed in id order; on PostgreSQL ids are taken at insert, not commit, so
/// two transactions committing out of order can publish out of order.
pub struct SqlOutboxStore<S = Box<dyn ConnectionSource>> {
    statements: Statements,
    worker_id: String,
    options: OutboxStoreOptions,
    source: S,
}

impl<S> std::fmt::Debug for SqlOutboxStore<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqlOutboxStore")
            .field("table", &self.statements.table())
            .field("worker_id", &self.worker_id)
            .finish()
    }
}

impl<S: ConnectionSource> SqlOutboxStore<S> {
    /// A store whose relay steps run on connections from `source`. Fails
    /// when the table name in `options` is not a plain identifier.
    pub fn new(source: S, options: OutboxStoreOptions) -> Result<Self> {
        let statements = Statements::new(&options.table)?;
        let worker_id = options.worker_id.clone().unwrap_or_else(default_worker_id);
        if worker_id.is_empty() {
            return Err(Error::invalid("outbox worker id is empty: leave it unset for hostname:pid, or name this relay"));
        }
        Ok(SqlOutboxStore { statements, worker_id, options, source })
    }

    /// The table name.
    pub fn table(&self) -> &str {
        self.statements.table()
    }

    /// Who this store claims rows as.
    pub fn worker_id(&self) -> &str {
        &self.worker_id
    }

    /// The options it was built with.
    pub fn options(&self) -> &OutboxStoreOptions {
        &self.options
    }

    /// Where the store's own connections come from.
    pub fn source(&self) -> &S {
        &self.source
    }

    /// The statements [`create_schema`](Self::create_schema) runs, for a
    /// migration file.
    pub fn schema_sql(&self, dialect: Dialect) -> Vec<String> {
        self.statements.create_schema(dialect)
    }

    /// Create the table and its index if they do not exist, in the dialect of
    /// the store's connection.
    pub fn create_schema(&self) -> Result<()> {
        self.with_conn(|conn| {
            for sql in self.statements.create_schema(conn.dialect()) {
                conn.execute(&sql, &[])
                    .map_err(|e| context(e, "cannot create the outbox table; check the user may create tables"))?;
            }
            Ok(())
        })
    }

    /// Write `record` with `conn`, the connection holding the caller's open
    /// transaction; the new row id.
    ///
    /// Nothing is begun, committed or closed: roll the transaction back and
    /// the message is gone with the work it describes. `conn` may be a
    /// different connection from the store's own and need not be `Send`.
    pub fn add(&self, record: &OutboxRecord, conn: &dyn SqlConnection) -> Result<i64> {
        // What can never be sent is refused here, in the caller's
        // transaction, rather than becoming a row the relay fails on for ever.
        crate::connection::check_destination(&record.exchange, &record.routing_key, &crate::wire::props_for(&record.envelope))?;
        let dialect = conn.dialect();
        let envelope = &record.envelope;
        let headers = serde_json::to_string(&envelope.headers)?;
        let params = [
            SqlValue::Text(record.exchange.clone()),
            SqlValue::Text(record.routing_key.clone()),
            SqlValue::Text(record.body.clone()),
            SqlValue::Text(envelope.id.clone()),
            opt_str(envelope.kind.as_deref()),
            opt_str(envelope.origin.as_deref()),
            SqlValue::Int(i64::try_from(envelope.timestamp).unwrap_or(i64::MAX)),
            SqlValue::Text(headers),
        ];
        let sql = self.statements.insert(dialect);
        let no_table = "cannot add to the outbox; has create_schema been run on this database?";
        match dialect {
            Dialect::Postgres => {
                let rows = conn.query(&sql, &params).map_err(|e| context(e, no_table))?;
                let row = rows.first().ok_or_else(|| Error::store("outbox insert returned no id"))?;
                int(column(row, 0, "id")?, "id")
            }
            Dialect::Sqlite => {
                conn.execute(&sql, &params).map_err(|e| context(e, no_table))?;
                // Same connection, same transaction: this is our insert's id.
                let rows = conn.query("SELECT last_insert_rowid()", &[])?;
                let row = rows.first().ok_or_else(|| Error::store("outbox insert returned no id"))?;
                int(column(row, 0, "id")?, "id")
            }
        }
    }

    /// Lease up to `batch_size` due rows to this worker, oldest first, and
    /// return them. Blocking; runs its own transaction on the store's
    /// connection.
    ///
    /// While the lease lasts no other relay claims them, however many run
    /// against the same table. A relay that dies holding a lease loses its
    /// rows to the others once the lease runs out. A row that cannot be read
    /// back (its headers are not JSON) is not returned: it is failed with a
    /// backoff like an unpublishable one, so it shows in
    /// [`stuck`](Self::stuck) instead of stopping every sweep.
    pub fn claim(&self, batch_size: usize) -> Result<Vec<OutboxRecord>> {
        if batch_size == 0 {
            return Ok(Vec::new());
        }
        let limit = i64::try_from(batch_size).unwrap_or(i64::MAX);
        self.transaction(|conn| {
            let dialect = conn.dialect();
            let rows = conn.query(&self.statements.select_due(dialect), &[SqlValue::Int(limit)])?;
            let mut records = Vec::with_capacity(rows.len());
            let mut unreadable = Vec::new();
            for row in &rows {
                match record_from_row(row) {
                    Ok(record) => records.push(record),
                    Err(e) => {
                        let id = int(column(row, 0, "id")?, "id")?;
                        let attempts = int(column(row, 9, "attempts")?, "attempts")?;
                        unreadable.push((id, attempts, e));
                    }
                }
            }
            let ids: Vec<i64> = records.iter().filter_map(|r| r.id).collect();
            let lease = SqlValue::Int(millis(self.options.lease));
            for chunk in ids.chunks(IDS_PER_STATEMENT) {
                let mut params = vec![SqlValue::Text(self.worker_id.clone()), lease.clone()];
                params.extend(chunk.iter().map(|id| SqlValue::Int(*id)));
                conn.execute(&self.statements.lease(dialect, chunk.len()), &params)?;
            }
            for (id, attempts, e) in unreadable {
                self.record_failure(conn, id, attempts, &format!("cannot read this outbox row: {e}"), false)?;
            }
            Ok(records)
        })
    }

    /// Settle what a claim led to: delete the rows the broker confirmed, and
    /// for each failure count the attempt, keep the error, schedule the next
    /// try after an exponential backoff and release the lease, so a row that
    /// keeps failing (its exchange does not exist) waits on its own and does
    /// not hold back rows to other destinations. The number of rows deleted.
    ///
    /// Only rows still leased by this worker are touched. One whose lease ran
    /// out and passed to another relay is that relay's to settle: if it was
    /// confirmed here, it is published once more (a duplicate, never a loss).
    /// Blocking; runs its own transaction on the store's connection.
    pub fn complete(&self, completions: &[Completion]) -> Result<usize> {
        if completions.is_empty() {
            return Ok(0);
        }
        let confirmed: Vec<i64> = completions.iter().filter(|c| c.result.is_ok()).map(|c| c.id).collect();
        let failed: Vec<(i64, &str)> =
            completions.iter().filter_map(|c| c.result.as_ref().err().map(|e| (c.id, e.as_str()))).collect();
        let me = SqlValue::Text(self.worker_id.clone());
        self.transaction(|conn| {
            let dialect = conn.dialect();
            let mut deleted = 0u64;
            for chunk in confirmed.chunks(IDS_PER_STATEMENT) {
                let mut params = vec![me.clone()];
                params.extend(chunk.iter().map(|id| SqlValue::Int(*id)));
                deleted += conn.execute(&self.statements.delete_owned(dialect, chunk.len()), &params)?;
            }
            for chunk in failed.chunks(IDS_PER_STATEMENT) {
                let mut params = vec![me.clone()];
                params.extend(chunk.iter().map(|(id, _)| SqlValue::Int(*id)));
                let rows = conn.query(&self.statements.select_attempts_owned(dialect, chunk.len()), &params)?;
                let mut attempts = HashMap::with_capacity(rows.len());
                for row in &rows {
                    attempts.insert(int(column(row, 0, "id")?, "id")?, int(column(row, 1, "attempts")?, "attempts")?);
                }
                for (id, error) in chunk {
                    // Absent: no longer leased by us, so no longer ours to fail.
                    if let Some(&so_far) = attempts.get(id) {
                        self.record_failure(conn, *id, so_far, error, true)?;
                    }
                }
            }
            Ok(usize::try_from(deleted).unwrap_or(usize::MAX))
        })
    }

    /// How many rows wait, how long the oldest has, and how many have failed.
    pub fn backlog(&self) -> Result<Backlog> {
        let rows = self.with_conn(|conn| conn.query(&self.statements.backlog(conn.dialect()), &[]))?;
        let row = rows.first().ok_or_else(|| Error::store("outbox backlog query returned no row"))?;
        let count = int(column(row, 0, "count")?, "count")?;
        let oldest = opt_int(column(row, 1, "created_at")?, "created_at")?;
        let stuck = int(column(row, 2, "stuck")?, "stuck")?;
        let now = int(column(row, 3, "now")?, "now")?;
        Ok(Backlog {
            count: count.max(0) as u64,
            oldest_age: oldest.map(|t| Duration::from_millis(now.saturating_sub(t).max(0) as u64)),
            stuck: stuck.max(0) as u64,
        })
    }

    /// Up to `limit` rows that have failed at least once, oldest first: where
    /// each is going, how often it has failed and why.
    pub fn stuck(&self, limit: usize) -> Result<Vec<StuckRecord>> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows =
            self.with_conn(|conn| conn.query(&self.statements.stuck(conn.dialect()), &[SqlValue::Int(limit)]))?;
        rows.iter()
            .map(|row| {
                Ok(StuckRecord {
                    id: int(column(row, 0, "id")?, "id")?,
                    exchange: text(column(row, 1, "exchange")?, "exchange")?,
                    routing_key: text(column(row, 2, "routing_key")?, "routing_key")?,
                    message_id: text(column(row, 3, "message_id")?, "message_id")?,
                    attempts: u32::try_from(int(column(row, 4, "attempts")?, "attempts")?).unwrap_or(u32::MAX),
                    last_error: opt_text(column(row, 5, "last_error")?, "last_error")?,
                    next_attempt_at: int(column(row, 6, "next_attempt_at")?, "next_attempt_at")?,
                    created_at: int(column(row, 7, "created_at")?, "created_at")?,
                })
            })
            .collect()
    }

    fn record_failure(&self, conn: &dyn SqlConnection, id: i64, so_far: i64, error: &str, owned: bool) -> Result<()> {
        let attempts = so_far.saturating_add(1);
        let backoff = self.options.backoff(u32::try_from(attempts).unwrap_or(u32::MAX));
        let error: String = error.chars().take(self.options.max_error_length).collect();
        let mut params =
            vec![SqlValue::Int(attempts), SqlValue::Text(error), SqlValue::Int(millis(backoff)), SqlValue::Int(id)];
        if owned {
            params.push(SqlValue::Text(self.worker_id.clone()));
        }
        conn.execute(&self.statements.fail(conn.dialect(), owned), &params)?;
        Ok(())
    }

    /// Run `f` in a transaction on the store's connection, rolling back on
    /// any error so the connection is never left inside one.
    fn transaction<T>(&self, f: impl FnOnce(&dyn SqlConnection) -> Result<T>) -> Result<T> {
        // One lent connection for the whole transaction: BEGIN and COMMIT on
        // two different pool connections would commit nothing.
        self.with_conn(|conn| {
            conn.execute(begin(conn.dialect()), &[]).map_err(|e| {
                context(
                    e,
                    "cannot begin the outbox transaction; the store needs a connection of its own, not one inside a transaction",
                )
            })?;
            let result = f(conn).and_then(|value| conn.execute("COMMIT", &[]).map(|_| value));
            if result.is_err() {
                // The error that matters is the one above; a failed rollback
                // (the transaction is already gone) adds nothing to it.
                let _ = conn.execute("ROLLBACK", &[]);
            }
            result
        })
    }

    /// Run `f` with one connection lent by the source.
    fn with_conn<T>(&self, f: impl FnOnce(&dyn SqlConnection) -> Result<T>) -> Result<T> {
        let mut f = Some(f);
        let mut out = None;
        self.source.with_connection(&mut |conn| {
            let f = f.take().ok_or_else(|| Error::store("the connection source lent the outbox store two connections for one call; lend exactly one"))?;
            out = Some(f(conn)?);
            Ok(())
        })?;
        out.ok_or_else(|| Error::store("the connection source lent the outbox store no connection; lend exactly one per call"))
    }
}

/// Build a record from a row of [`super::statements::RECORD_COLUMNS`].
fn record_from_row(row: &[SqlValue]) -> Result<OutboxRecord> {
    let headers_text = text(column(row, 8, "headers")?, "headers")?;
    let headers: Headers = serde_json::from_str(&headers_text)
        .map_err(|e| Error::store(format!("outbox headers are not a JSON object ({e}); fix or delete the row")))?;
    let timestamp = int(column(row, 7, "timestamp")?, "timestamp")?;
    Ok(OutboxRecord {
        id: Some(int(column(row, 0, "id")?, "id")?),
        exchange: text(column(row, 1, "exchange")?, "exchange")?,
        routing_key: text(column(row, 2, "routing_key")?, "routing_key")?,
        body: text(column(row, 3, "body")?, "body")?,
        envelope: Envelope {
            id: text(column(row, 4, "message_id")?, "message_id")?,
            kind: opt_text(column(row, 5, "message_type")?, "message_type")?,
            origin: opt_text(column(row, 6, "origin")?, "origin")?,
            timestamp: u64::try_from(timestamp).unwrap_or(0),
            attempt: 1,
            headers,
        },
    })
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// Keep the kind and the driver's message, and say what to check first.
fn context(e: Error, what: &str) -> Error {
    Error::new(e.kind().clone(), format!("{what}: {}", e.message()))
}
