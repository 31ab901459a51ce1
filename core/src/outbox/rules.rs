//! What the outbox does with its table, written once: `add`, the relay's
//! `claim` and `complete`, `backlog`, `stuck`. Async code over the async seam;
//! the blocking store ([`SqlOutboxStore`](super::SqlOutboxStore)) runs it over
//! a blocking connection, where it never suspends, and the async store
//! ([`AsyncSqlOutboxStore`](super::AsyncSqlOutboxStore)) over tokio-postgres
//! or SQLite on the blocking pool. The two differ only in how a statement is
//! executed.

use super::statements::Statements;
use super::wake::LocalWake;
use crate::sql::values::{opt_str, Columns};

/// The outbox table's column readers.
const O: Columns = Columns("outbox");
use super::{Backlog, Completion, OutboxRecord, OutboxStoreOptions, StuckRecord};
use crate::envelope::Envelope;
use crate::error::{Error, Result};
use crate::headers::Headers;
use crate::sql::time::millis;
use crate::sql::{finish, AsyncSqlConnection, Dialect, SqlValue, WorkerId};
use std::collections::HashMap;
use std::time::Duration;

/// Ids per `IN (...)` list: under SQLite's oldest limit of 999 bound
/// parameters, with room for the worker id.
const IDS_PER_STATEMENT: usize = 500;

/// How many times in all a relay's step runs when the database keeps
/// rolling it back for a lock conflict ([`crate::sql::lock_conflict`]).
/// Relays claiming and deleting in one table can deadlock one another even
/// with `SKIP LOCKED` (seen with three relays on MariaDB 10.11): the
/// database picks one transaction, rolls it back and says to try again. It
/// is run again at once; the other one has its locks by then.
const CONFLICT_ATTEMPTS: u32 = 5;

/// `$step` (a future of a whole step: one autocommitted statement, or a
/// transaction from `BEGIN` to its `finish`) awaited, and made again and
/// awaited again while it fails with a lock conflict, up to
/// [`CONFLICT_ATTEMPTS`] times in all. Never one statement of a transaction:
/// the conflict has rolled the whole transaction back.
macro_rules! again_on_conflict {
    ($step:expr) => {{
        let mut attempt = 1;
        loop {
            match $step.await {
                Err(e) if attempt < CONFLICT_ATTEMPTS && crate::sql::lock_conflict(&e) => attempt += 1,
                done => break done,
            }
        }
    }};
}

/// One outbox table's rules: its statements, who leases as whom, and the
/// lease and backoff options.
#[derive(Debug)]
pub(crate) struct Rules {
    statements: Statements,
    worker_id: WorkerId,
    options: OutboxStoreOptions,
    wake: LocalWake,
}

impl Rules {
    /// Fails when the table name is not a plain identifier or the worker id is empty.
    pub(crate) fn new(options: OutboxStoreOptions) -> Result<Self> {
        let statements = Statements::new(&options.table)?;
        // Read at each call when unset: a forked child is a new worker.
        let worker_id = WorkerId::new("outbox", options.worker_id.clone())?;
        let wake = LocalWake::of(statements.table());
        Ok(Rules { statements, worker_id, options, wake })
    }

    pub(crate) fn table(&self) -> &str {
        self.statements.table()
    }

    pub(crate) fn worker_id(&self) -> String {
        self.worker_id.current()
    }

    pub(crate) fn options(&self) -> &OutboxStoreOptions {
        &self.options
    }

    pub(crate) fn local_wake(&self) -> &LocalWake {
        &self.wake
    }

    pub(crate) fn channel(&self) -> String {
        self.statements.channel()
    }

    pub(crate) fn schema_sql(&self, dialect: Dialect) -> Vec<String> {
        self.statements.create_schema(dialect)
    }

    pub(crate) async fn create_schema<C: AsyncSqlConnection>(&self, conn: &C) -> Result<()> {
        for sql in self.statements.create_schema(conn.dialect()) {
            conn.execute(&sql, &[])
                .await
                .map_err(|e| context(e, "cannot create the outbox table; check the user may create tables"))?;
        }
        Ok(())
    }

    /// Write `record` with the caller's connection, inside the caller's
    /// transaction; nothing is begun, committed or closed.
    pub(crate) async fn add<C: AsyncSqlConnection>(&self, conn: &C, record: &OutboxRecord) -> Result<i64> {
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
            // The column is NOT NULL: an envelope without a time is stamped as it is added.
            SqlValue::Int(i64::try_from(envelope.timestamp.unwrap_or_else(crate::envelope::now_secs)).unwrap_or(i64::MAX)),
            SqlValue::Text(headers),
        ];
        let sql = self.statements.insert(dialect);
        let no_table = "cannot add to the outbox; has create_schema been run on this database?";
        let rows = match dialect {
            Dialect::Postgres => conn.query(&sql, &params).await.map_err(|e| context(e, no_table))?,
            Dialect::Sqlite => {
                conn.execute(&sql, &params).await.map_err(|e| context(e, no_table))?;
                // After the insert, which now holds the write lock until the
                // caller commits: a woken relay's claim waits on that lock
                // and runs right after the commit (see wake.rs).
                self.wake.rows_added();
                // Same connection, same transaction: this is our insert's id.
                conn.query("SELECT last_insert_rowid()", &[]).await?
            }
            Dialect::Mysql => {
                conn.execute(&sql, &params).await.map_err(|e| context(e, no_table))?;
                // Per connection: this insert's id whatever others insert.
                conn.query("SELECT LAST_INSERT_ID()", &[]).await?
            }
        };
        let row = rows.first().ok_or_else(|| Error::store("outbox insert returned no id"))?;
        O.int(O.column(row, 0, "id")?, "id")
    }

    /// Lease up to `batch_size` due rows to this worker, oldest first, on
    /// `conn`: one autocommitted statement ([`Statements::claim`]), plus one
    /// per row that cannot be read back (rare: its headers are not JSON).
    pub(crate) async fn claim<C: AsyncSqlConnection>(&self, conn: &C, batch_size: usize) -> Result<Vec<OutboxRecord>> {
        again_on_conflict!(self.claim_once(conn, batch_size))
    }

    async fn claim_once<C: AsyncSqlConnection>(&self, conn: &C, batch_size: usize) -> Result<Vec<OutboxRecord>> {
        if batch_size == 0 {
            return Ok(Vec::new());
        }
        if conn.dialect() == Dialect::Mysql {
            self.begin_mysql(conn).await?;
            let rows = self.claim_locked_mysql(conn, batch_size).await;
            let rows = finish(conn, rows).await?;
            return self.read_claimed(conn, rows).await;
        }
        let limit = i64::try_from(batch_size).unwrap_or(i64::MAX);
        let params = [SqlValue::Text(self.worker_id.current()), SqlValue::Int(millis(self.options.lease)), SqlValue::Int(limit)];
        let rows = conn.query(&self.statements.claim(conn.dialect()), &params).await.map_err(|e| {
            context(e, "cannot claim outbox rows; the store needs a connection of its own, not one inside a transaction")
        })?;
        self.read_claimed(conn, rows).await
    }

    /// MySQL's claim, inside a transaction `conn` has open: lock the due rows
    /// (skipping what other relays hold), lease them, return them. The rows
    /// stay locked until the commit, so no other relay can lease them in
    /// between; after it, the lease keeps them out.
    async fn claim_locked_mysql<C: AsyncSqlConnection>(&self, conn: &C, batch_size: usize) -> Result<Vec<crate::sql::Row>> {
        let limit = i64::try_from(batch_size).unwrap_or(i64::MAX);
        let rows = conn.query(&self.statements.select_due_mysql(), &[SqlValue::Int(limit)]).await.map_err(|e| {
            context(e, "cannot claim outbox rows; the store needs a connection of its own, not one inside a transaction")
        })?;
        if rows.is_empty() {
            return Ok(rows);
        }
        let mut params = vec![SqlValue::Text(self.worker_id.current()), SqlValue::Int(millis(self.options.lease))];
        for row in &rows {
            params.push(SqlValue::Int(O.int(O.column(row, 0, "id")?, "id")?));
        }
        conn.execute(&self.statements.lease_mysql(rows.len()), &params).await?;
        Ok(rows)
    }

    /// The records of claimed rows, oldest first; a row that cannot be read
    /// back is failed with a backoff instead.
    async fn read_claimed<C: AsyncSqlConnection>(&self, conn: &C, rows: Vec<crate::sql::Row>) -> Result<Vec<OutboxRecord>> {
        let mut records = Vec::with_capacity(rows.len());
        let mut unreadable = Vec::new();
        for row in &rows {
            match record_from_row(row) {
                Ok(record) => records.push(record),
                Err(e) => {
                    let id = O.int(O.column(row, 0, "id")?, "id")?;
                    let attempts = O.int(O.column(row, 9, "attempts")?, "attempts")?;
                    unreadable.push((id, attempts, e));
                }
            }
        }
        // RETURNING gives no order; the relay publishes oldest first.
        records.sort_by_key(|r| r.id);
        for (id, attempts, e) in unreadable {
            self.record_failure(conn, id, attempts, &format!("cannot read this outbox row: {e}"), true).await?;
        }
        Ok(records)
    }

    /// [`claim`](Self::claim), first deleting `done`: rows of ours the
    /// broker confirmed in the previous sweep, whose delete was held back to
    /// share this claim's commit (see [`Swept::defer_delete`](super::Swept::defer_delete)).
    /// One statement on PostgreSQL; one `BEGIN IMMEDIATE` transaction on
    /// SQLite. Either both happen or neither does.
    pub(crate) async fn delete_then_claim<C: AsyncSqlConnection>(
        &self,
        conn: &C,
        done: &[i64],
        batch_size: usize,
    ) -> Result<Vec<OutboxRecord>> {
        if done.is_empty() {
            return self.claim(conn, batch_size).await;
        }
        if done.len() > IDS_PER_STATEMENT || batch_size == 0 {
            self.delete_ids(conn, done).await?;
            return self.claim(conn, batch_size).await;
        }
        again_on_conflict!(self.delete_then_claim_once(conn, done, batch_size))
    }

    async fn delete_then_claim_once<C: AsyncSqlConnection>(
        &self,
        conn: &C,
        done: &[i64],
        batch_size: usize,
    ) -> Result<Vec<OutboxRecord>> {
        match conn.dialect() {
            Dialect::Postgres => {
                let limit = i64::try_from(batch_size).unwrap_or(i64::MAX);
                let mut params =
                    vec![SqlValue::Text(self.worker_id.current()), SqlValue::Int(millis(self.options.lease)), SqlValue::Int(limit)];
                params.extend(done.iter().map(|id| SqlValue::Int(*id)));
                let rows = conn.query(&self.statements.delete_then_claim_pg(done.len()), &params).await?;
                self.read_claimed(conn, rows).await
            }
            Dialect::Sqlite => {
                self.begin(conn).await?;
                let result = async {
                    self.delete_ids_in_transaction(conn, done).await?;
                    self.claim_once(conn, batch_size).await
                }
                .await;
                finish(conn, result).await
            }
            Dialect::Mysql => {
                self.begin_mysql(conn).await?;
                let result = async {
                    self.delete_ids_in_transaction(conn, done).await?;
                    self.claim_locked_mysql(conn, batch_size).await
                }
                .await;
                let rows = finish(conn, result).await?;
                self.read_claimed(conn, rows).await
            }
        }
    }

    /// Delete rows of ours the broker confirmed, each statement autocommitted
    /// (and run again on a lock conflict); the rows deleted.
    pub(crate) async fn delete_ids<C: AsyncSqlConnection>(&self, conn: &C, ids: &[i64]) -> Result<usize> {
        let mut deleted = 0u64;
        for chunk in ids.chunks(IDS_PER_STATEMENT) {
            deleted += again_on_conflict!(self.delete_chunk(conn, chunk))?;
        }
        Ok(usize::try_from(deleted).unwrap_or(usize::MAX))
    }

    /// [`delete_ids`](Self::delete_ids) inside a transaction the caller
    /// opened: a conflict ends the transaction, which the caller runs again.
    async fn delete_ids_in_transaction<C: AsyncSqlConnection>(&self, conn: &C, ids: &[i64]) -> Result<usize> {
        let mut deleted = 0u64;
        for chunk in ids.chunks(IDS_PER_STATEMENT) {
            deleted += self.delete_chunk(conn, chunk).await?;
        }
        Ok(usize::try_from(deleted).unwrap_or(usize::MAX))
    }

    async fn delete_chunk<C: AsyncSqlConnection>(&self, conn: &C, chunk: &[i64]) -> Result<u64> {
        let mut params = vec![SqlValue::Text(self.worker_id.current())];
        params.extend(chunk.iter().map(|id| SqlValue::Int(*id)));
        conn.execute(&self.statements.delete_owned(conn.dialect(), chunk.len()), &params).await
    }

    /// Delete the confirmed rows still leased by this worker and back off the
    /// failed ones, in a transaction of its own on `conn`; the rows deleted.
    pub(crate) async fn complete<C: AsyncSqlConnection>(&self, conn: &C, completions: &[Completion]) -> Result<usize> {
        if completions.is_empty() {
            return Ok(0);
        }
        if completions.iter().all(|c| c.result.is_ok()) {
            // The common case, every row confirmed: one autocommitted DELETE
            // per 500 ids, as the hand-written relay does. A crash between two
            // of them leaves confirmed rows to be published again (a
            // duplicate, never a loss), as a crash before the commit would.
            return self.delete_ids(conn, &confirmed(completions)).await;
        }
        again_on_conflict!(self.complete_once(conn, completions))
    }

    async fn complete_once<C: AsyncSqlConnection>(&self, conn: &C, completions: &[Completion]) -> Result<usize> {
        self.begin(conn).await?;
        let completed = self.complete_in_transaction(conn, completions).await;
        finish(conn, completed).await
    }

    async fn complete_in_transaction<C: AsyncSqlConnection>(&self, conn: &C, completions: &[Completion]) -> Result<usize> {
        let failed: Vec<(i64, &str)> =
            completions.iter().filter_map(|c| c.result.as_ref().err().map(|e| (c.id, e.as_str()))).collect();
        let me = SqlValue::Text(self.worker_id.current());
        let dialect = conn.dialect();
        let deleted = self.delete_ids_in_transaction(conn, &confirmed(completions)).await?;
        for chunk in failed.chunks(IDS_PER_STATEMENT) {
            let mut params = vec![me.clone()];
            params.extend(chunk.iter().map(|(id, _)| SqlValue::Int(*id)));
            let rows = conn.query(&self.statements.select_attempts_owned(dialect, chunk.len()), &params).await?;
            let mut attempts = HashMap::with_capacity(rows.len());
            for row in &rows {
                attempts.insert(O.int(O.column(row, 0, "id")?, "id")?, O.int(O.column(row, 1, "attempts")?, "attempts")?);
            }
            for (id, error) in chunk {
                // Absent: no longer leased by us, so no longer ours to fail.
                if let Some(&so_far) = attempts.get(id) {
                    self.record_failure(conn, *id, so_far, error, true).await?;
                }
            }
        }
        Ok(deleted)
    }

    pub(crate) async fn backlog<C: AsyncSqlConnection>(&self, conn: &C) -> Result<Backlog> {
        let rows = conn.query(&self.statements.backlog(conn.dialect()), &[]).await?;
        let row = rows.first().ok_or_else(|| Error::store("outbox backlog query returned no row"))?;
        let count = O.int(O.column(row, 0, "count")?, "count")?;
        let oldest = O.opt_int(O.column(row, 1, "created_at")?, "created_at")?;
        let stuck = O.int(O.column(row, 2, "stuck")?, "stuck")?;
        let now = O.int(O.column(row, 3, "now")?, "now")?;
        Ok(Backlog {
            count: count.max(0) as u64,
            oldest_age: oldest.map(|t| Duration::from_millis(now.saturating_sub(t).max(0) as u64)),
            stuck: stuck.max(0) as u64,
        })
    }

    pub(crate) async fn stuck<C: AsyncSqlConnection>(&self, conn: &C, limit: usize) -> Result<Vec<StuckRecord>> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = conn.query(&self.statements.stuck(conn.dialect()), &[SqlValue::Int(limit)]).await?;
        rows.iter()
            .map(|row| {
                Ok(StuckRecord {
                    id: O.int(O.column(row, 0, "id")?, "id")?,
                    exchange: O.text(O.column(row, 1, "exchange")?, "exchange")?,
                    routing_key: O.text(O.column(row, 2, "routing_key")?, "routing_key")?,
                    message_id: O.text(O.column(row, 3, "message_id")?, "message_id")?,
                    attempts: u32::try_from(O.int(O.column(row, 4, "attempts")?, "attempts")?).unwrap_or(u32::MAX),
                    last_error: O.opt_text(O.column(row, 5, "last_error")?, "last_error")?,
                    next_attempt_at: O.int(O.column(row, 6, "next_attempt_at")?, "next_attempt_at")?,
                    created_at: O.int(O.column(row, 7, "created_at")?, "created_at")?,
                })
            })
            .collect()
    }

    async fn record_failure<C: AsyncSqlConnection>(
        &self,
        conn: &C,
        id: i64,
        so_far: i64,
        error: &str,
        owned: bool,
    ) -> Result<()> {
        let attempts = so_far.saturating_add(1);
        let backoff = self.options.backoff(u32::try_from(attempts).unwrap_or(u32::MAX));
        let error: String = error.chars().take(self.options.max_error_length).collect();
        let mut params =
            vec![SqlValue::Int(attempts), SqlValue::Text(error), SqlValue::Int(millis(backoff)), SqlValue::Int(id)];
        if owned {
            params.push(SqlValue::Text(self.worker_id.current()));
        }
        conn.execute(&self.statements.fail(conn.dialect(), owned), &params).await?;
        Ok(())
    }

    /// MySQL's claim transaction, READ COMMITTED (`SET TRANSACTION` without
    /// `SESSION` is for the next transaction only). InnoDB's default,
    /// REPEATABLE READ, makes the claim's `FOR UPDATE` take gap locks on the
    /// due index, and concurrent relays then deadlocked on each other's
    /// deletes (seen here with four relays on MariaDB 10.11); read committed
    /// locks only the rows it returns, which is all the claim needs.
    async fn begin_mysql<C: AsyncSqlConnection>(&self, conn: &C) -> Result<()> {
        conn.execute("SET TRANSACTION ISOLATION LEVEL READ COMMITTED", &[]).await?;
        self.begin(conn).await
    }

    async fn begin<C: AsyncSqlConnection>(&self, conn: &C) -> Result<()> {
        crate::sql::begin(conn).await.map_err(|e| {
            context(
                e,
                "cannot begin the outbox transaction; the store needs a connection of its own, not one inside a transaction",
            )
        })
    }
}

/// The ids of the rows the broker confirmed.
fn confirmed(completions: &[Completion]) -> Vec<i64> {
    completions.iter().filter(|c| c.result.is_ok()).map(|c| c.id).collect()
}

/// Build a record from a row of [`super::statements::RECORD_COLUMNS`].
fn record_from_row(row: &[SqlValue]) -> Result<OutboxRecord> {
    let headers_text = O.text(O.column(row, 8, "headers")?, "headers")?;
    let headers: Headers = serde_json::from_str(&headers_text)
        .map_err(|e| Error::store(format!("outbox headers are not a JSON object ({e}); fix or delete the row")))?;
    let timestamp = O.int(O.column(row, 7, "timestamp")?, "timestamp")?;
    Ok(OutboxRecord {
        id: Some(O.int(O.column(row, 0, "id")?, "id")?),
        exchange: O.text(O.column(row, 1, "exchange")?, "exchange")?,
        routing_key: O.text(O.column(row, 2, "routing_key")?, "routing_key")?,
        body: O.text(O.column(row, 3, "body")?, "body")?,
        envelope: Envelope {
            id: O.text(O.column(row, 4, "message_id")?, "message_id")?,
            kind: O.opt_text(O.column(row, 5, "message_type")?, "message_type")?,
            origin: O.opt_text(O.column(row, 6, "origin")?, "origin")?,
            timestamp: u64::try_from(timestamp).ok(),
            attempt: 1,
            headers,
        },
    })
}

/// Keep the kind and the driver's message, and say what to check first.
fn context(e: Error, what: &str) -> Error {
    Error::new(e.kind().clone(), format!("{what}: {}", e.message()))
}

/// The accessors both outbox stores (blocking and async) answer with, over
/// their `rules` and `source` fields: one copy of each.
macro_rules! store_accessors {
    () => {
    /// The table name.
        pub fn table(&self) -> &str {
            self.rules.table()
        }
    
        /// Who this store claims rows as.
        pub fn worker_id(&self) -> String {
            self.rules.worker_id()
        }
    
        /// The options it was built with.
        pub fn options(&self) -> &OutboxStoreOptions {
            self.rules.options()
        }
    
        /// Where the store's own connections come from.
        pub fn source(&self) -> &S {
            &self.source
        }
    
        /// This table's wake-up in this process: what a relay waits on
        /// between sweeps, moved by every SQLite `add` here.
        pub fn local_wake(&self) -> &crate::outbox::LocalWake {
            self.rules.local_wake()
        }

        /// The PostgreSQL channel every `add` notifies at commit: `LISTEN`
        /// on it to wake a relay when rows arrive from any process.
        pub fn channel(&self) -> String {
            self.rules.channel()
        }

        /// The statements [`create_schema`](Self::create_schema) runs, for a
        /// migration file.
        pub fn schema_sql(&self, dialect: Dialect) -> Vec<String> {
            self.rules.schema_sql(dialect)
        }
    };
}
pub(crate) use store_accessors;

/// `Debug` for an outbox store: its table and worker id.
macro_rules! store_debug {
    ($name:ident) => {
        impl<S> std::fmt::Debug for $name<S> {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_struct(stringify!($name))
                    .field("table", &self.rules.table())
                    .field("worker_id", &self.rules.worker_id())
                    .finish()
            }
        }
    };
}
pub(crate) use store_debug;
