//! The SQL store's rules, written once as async code over the async seam:
//! the claim INSERT, the stale-claim takeover, confirm, forget, the batches
//! and the purge. [`SqlIdempotencyStore`](super::SqlIdempotencyStore) runs
//! them over a blocking connection (where they never suspend),
//! [`AsyncSqlIdempotencyStore`](super::AsyncSqlIdempotencyStore) over
//! tokio-postgres or SQLite on the blocking pool.

use super::clock::{Clock, SystemClock};
use super::options::{SqlIdempotencyOptions, TimeColumns};
use crate::error::{Error, Result};
use super::statements::{Statements, CLAIM_ROWS, CONFIRMED, CONFIRM_ROWS, MYSQL_KEY_BYTES};
use super::{owner, values};
use crate::sql::placeholders::MAX_PARAMS;
use crate::sql::time::{datetime_text, millis};
use crate::sql::{AsyncSqlConnection, Dialect, SqlValue, WorkerId};
use std::collections::{BTreeSet, HashSet};
use std::sync::Arc;

/// One table's rules: its options, its clock and its statements in both dialects.
pub(crate) struct Keys {
    options: SqlIdempotencyOptions,
    worker: WorkerId,
    clock: Arc<dyn Clock>,
    times: TimeColumns,
    sqlite: Statements,
    postgres: Statements,
    mysql: Statements,
}

/// A number under 1000 that differs from one claim to the next in this
/// process: added to a MySQL claim's `expires_at` (milliseconds on a
/// retention of days), so that claim can find its own rows again (see the
/// statements' doc). Two claims of one worker id in one millisecond would
/// both need the 1000th claim since to collide.
fn claim_stamp() -> i64 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    i64::from(NEXT.fetch_add(1, Ordering::Relaxed) % 1000)
}

impl Keys {
    pub(crate) fn new(options: SqlIdempotencyOptions) -> Result<Self> {
        options.validate()?;
        let times = TimeColumns::default();
        Ok(Keys {
            worker: WorkerId::new("idempotency", options.worker.clone())?,
            sqlite: Statements::new(&options.table, Dialect::Sqlite, times),
            postgres: Statements::new(&options.table, Dialect::Postgres, times),
            mysql: Statements::new(&options.table, Dialect::Mysql, times),
            times,
            options,
            clock: Arc::new(SystemClock),
        })
    }

    /// The same rules on a table whose times are `times`.
    pub(crate) fn set_time_columns(&mut self, times: TimeColumns) {
        let t = &self.options.table;
        self.sqlite = Statements::new(t, Dialect::Sqlite, times);
        self.postgres = Statements::new(t, Dialect::Postgres, times);
        self.mysql = Statements::new(t, Dialect::Mysql, times);
        self.times = times;
    }

    /// Epoch milliseconds `ms` as this table's time columns hold it.
    fn at(&self, ms: i64) -> SqlValue {
        match self.times {
            TimeColumns::EpochMillis => SqlValue::Int(ms),
            TimeColumns::DatetimeUtc => SqlValue::Text(datetime_text(ms)),
        }
    }

    pub(crate) fn with_clock(mut self, clock: impl Clock + 'static) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    pub(crate) fn set_clock(&mut self, clock: impl Clock + 'static) {
        self.clock = Arc::new(clock);
    }

    pub(crate) fn options(&self) -> &SqlIdempotencyOptions {
        &self.options
    }

    pub(crate) fn worker(&self) -> String {
        self.worker.current()
    }

    pub(crate) fn schema_sql(&self, dialect: Dialect) -> Vec<String> {
        let s = self.statements(dialect);
        std::iter::once(s.create_table.clone()).chain(s.create_index.clone()).collect()
    }

    /// A store call that failed, saying which table and what to check.
    pub(crate) fn failed(&self, doing: &str, e: Error) -> Error {
        // A key the table cannot hold (MySQL's 255 bytes) is the caller's to
        // fix, not the database's: say so as it is.
        if e.is_invalid_argument() {
            return e;
        }
        // A table of datetimes is an application's, made by its migration.
        let made_by = match self.times {
            TimeColumns::EpochMillis => "create_schema has been run",
            TimeColumns::DatetimeUtc => "the migration that creates it has run on this database",
        };
        Error::store(format!(
            "cannot {doing} in table {}: {e} (check the database is reachable and {made_by})",
            self.options.table
        ))
    }

    fn statements(&self, dialect: Dialect) -> &Statements {
        match dialect {
            Dialect::Sqlite => &self.sqlite,
            Dialect::Postgres => &self.postgres,
            Dialect::Mysql => &self.mysql,
        }
    }

    pub(crate) async fn create_schema<C: AsyncSqlConnection>(&self, c: &C) -> Result<()> {
        let s = self.statements(c.dialect());
        // One statement per call: drivers differ on multi-statement strings.
        c.execute(&s.create_table, &[]).await?;
        if let Some(index) = &s.create_index {
            c.execute(index, &[]).await?;
        }
        Ok(())
    }

    pub(crate) async fn purge_expired<C: AsyncSqlConnection>(&self, c: &C) -> Result<u64> {
        let now = self.clock.now_millis();
        c.execute(&self.statements(c.dialect()).purge, &[self.at(now)]).await
    }

    /// The claim of one key: [`claim_batch`](Self::claim_batch) of one, the
    /// same statement. Commits on its own when `c` is outside a transaction.
    pub(crate) async fn first_time<C: AsyncSqlConnection>(&self, c: &C, key: &str) -> Result<bool> {
        Ok(self.claim_batch(c, &[key]).await?.first().copied().unwrap_or(false))
    }

    pub(crate) async fn confirm<C: AsyncSqlConnection>(&self, c: &C, key: &str) -> Result<()> {
        self.confirm_batch(c, &[key]).await
    }

    pub(crate) async fn forget<C: AsyncSqlConnection>(&self, c: &C, key: &str) -> Result<()> {
        let params = [SqlValue::Text(key.to_string()), SqlValue::Text(self.worker())];
        c.execute(&self.statements(c.dialect()).forget, &params).await.map(drop)
    }

    pub(crate) async fn confirmed<C: AsyncSqlConnection>(&self, c: &C, key: &str) -> Result<bool> {
        let rows = c.query(&self.statements(c.dialect()).state, &[SqlValue::Text(key.to_string())]).await?;
        match rows.first() {
            Some(row) => Ok(values::text(row, 0, "state")? == CONFIRMED),
            None => Ok(false),
        }
    }

    /// Claim `keys`, answering for each what [`first_time`](Self::first_time)
    /// alone would have, in order: one statement per [`CLAIM_ROWS`] distinct
    /// keys (one for any prefetch batch), with no transaction around it, so
    /// each key is decided by its own row exactly as alone. A key repeated in
    /// the batch is answered once: its later copies are not first, as they
    /// would not be one after the other (the first copy's claim is live).
    ///
    /// The keys go to the database sorted: two batches that share keys then
    /// lock their rows in the same order, so PostgreSQL cannot deadlock them.
    pub(crate) async fn claim_batch<C: AsyncSqlConnection>(&self, c: &C, keys: &[&str]) -> Result<Vec<bool>> {
        let distinct: BTreeSet<&str> = keys.iter().copied().collect();
        if distinct.is_empty() {
            return Ok(Vec::new());
        }
        let mysql = c.dialect() == Dialect::Mysql;
        if mysql {
            if let Some(long) = distinct.iter().find(|k| k.len() > MYSQL_KEY_BYTES) {
                return Err(Error::invalid(format!(
                    "an idempotency key of {} bytes is longer than the {MYSQL_KEY_BYTES} a MySQL table's message_id \
                     holds: derive a shorter key (a SHA-256 hex digest is 64), starting {:?}",
                    long.len(),
                    long.chars().take(40).collect::<String>()
                )));
            }
        }
        let now = self.clock.now_millis();
        let s = self.statements(c.dialect());
        if let Some(claim_one) = &s.claim_one {
            return self.claim_one_by_one(c, keys, distinct, now, claim_one).await;
        }
        let mut expires = now.saturating_add(millis(self.options.retention));
        if mysql {
            // Added, so a key is still remembered at least for the
            // retention; subtracted only from a retention of forever.
            let stamp = claim_stamp();
            expires = expires.checked_add(stamp).unwrap_or(expires - stamp);
        }
        let expires = self.at(expires);
        let stale_before = self.at(now.saturating_sub(millis(self.options.claim_timeout)));
        let worker = SqlValue::Text(self.worker());
        let now = self.at(now);
        let distinct: Vec<&str> = distinct.into_iter().collect();
        let mut mine: HashSet<String> = HashSet::with_capacity(distinct.len());
        for chunk in distinct.chunks(CLAIM_ROWS) {
            let mut params = Vec::with_capacity(chunk.len() * 4 + 3);
            for key in chunk {
                params.extend([SqlValue::Text((*key).to_owned()), worker.clone(), now.clone(), expires.clone()]);
            }
            params.push(stale_before.clone());
            if mysql {
                params.extend([stale_before.clone(), stale_before.clone()]);
                c.execute(&s.claim(chunk.len()), &params).await?;
                let mut check: Vec<SqlValue> = chunk.iter().map(|k| SqlValue::Text((*k).to_owned())).collect();
                check.extend([worker.clone(), now.clone(), expires.clone()]);
                for row in c.query(&s.claimed_mysql(chunk.len()), &check).await? {
                    mine.insert(values::text(&row, 0, "message_id")?);
                }
                continue;
            }
            for row in c.query(&s.claim(chunk.len()), &params).await? {
                mine.insert(values::text(&row, 0, "message_id")?);
            }
        }
        self.take_over_dead(c, &distinct, &mut mine, &worker, &now, &expires).await?;
        Ok(in_order(keys, &mine))
    }

    /// Of `keys`, those this claim did not win and whose claim is held by a
    /// worker that is provably dead ([`owner::provably_dead`]: a pid of
    /// this host that has exited) are taken over now, rather than after the
    /// claim timeout: into `mine`. A dead worker cannot confirm, forget or
    /// run anything, so waiting out its lease only holds the message (and,
    /// on a partition, every later message of its key) back. One `SELECT`
    /// of the lost keys' workers, then a compare-and-set per dead one.
    async fn take_over_dead<C: AsyncSqlConnection>(
        &self,
        c: &C,
        keys: &[&str],
        mine: &mut HashSet<String>,
        worker: &SqlValue,
        now: &SqlValue,
        expires: &SqlValue,
    ) -> Result<()> {
        let lost: Vec<&str> = keys.iter().copied().filter(|k| !mine.contains(*k)).collect();
        let s = self.statements(c.dialect());
        for chunk in lost.chunks(MAX_PARAMS) {
            let params: Vec<SqlValue> = chunk.iter().map(|k| SqlValue::Text((*k).to_owned())).collect();
            for row in c.query(&s.owners(chunk.len()), &params).await? {
                let Some(SqlValue::Text(dead)) = row.get(1) else { continue };
                if !owner::provably_dead(dead) {
                    continue;
                }
                let key = values::text(&row, 0, "message_id")?;
                let params =
                    [worker.clone(), now.clone(), expires.clone(), SqlValue::Text(key.clone()), SqlValue::Text(dead.clone())];
                if c.execute(&s.take_over, &params).await? > 0 {
                    crate::events::idempotency("taken_over", Some(&key), Some(format!("claimed by {dead}, which has exited")));
                    mine.insert(key);
                }
            }
        }
        Ok(())
    }

    /// [`claim_batch`](Self::claim_batch) on MySQL with datetime columns:
    /// each key alone, `INSERT IGNORE`, then the takeover for a key that was
    /// there (see the statements' doc).
    async fn claim_one_by_one<C: AsyncSqlConnection>(
        &self,
        c: &C,
        keys: &[&str],
        distinct: BTreeSet<&str>,
        now: i64,
        (insert, takeover): &(String, String),
    ) -> Result<Vec<bool>> {
        let expires = now.saturating_add(millis(self.options.retention));
        let stale_before = self.at(now.saturating_sub(millis(self.options.claim_timeout)));
        let (worker, now, expires) = (SqlValue::Text(self.worker()), self.at(now), self.at(expires));
        let mut mine: HashSet<String> = HashSet::with_capacity(distinct.len());
        for key in distinct {
            let k = SqlValue::Text(key.to_owned());
            let won = c.execute(insert, &[k.clone(), worker.clone(), now.clone(), expires.clone()]).await? > 0
                || c.execute(takeover, &[worker.clone(), now.clone(), expires.clone(), k, stale_before.clone()])
                    .await?
                    > 0;
            if won {
                mine.insert(key.to_owned());
            }
        }
        let all: Vec<&str> = keys.iter().copied().collect::<BTreeSet<_>>().into_iter().collect();
        self.take_over_dead(c, &all, &mut mine, &worker, &now, &expires).await?;
        Ok(in_order(keys, &mine))
    }

    /// Confirm `keys`: one `UPDATE ... WHERE message_id IN (...)` per
    /// [`CONFIRM_ROWS`] distinct keys, each row changed as by a confirm alone.
    pub(crate) async fn confirm_batch<C: AsyncSqlConnection>(&self, c: &C, keys: &[&str]) -> Result<()> {
        let distinct: Vec<&str> = keys.iter().copied().collect::<BTreeSet<_>>().into_iter().collect();
        let s = self.statements(c.dialect());
        for chunk in distinct.chunks(CONFIRM_ROWS) {
            let params: Vec<SqlValue> = chunk.iter().map(|k| SqlValue::Text((*k).to_owned())).collect();
            c.execute(&s.confirm(chunk.len()), &params).await?;
        }
        Ok(())
    }
}

/// The answer for each of `keys` in the caller's order: claimed by this call
/// (in `mine`), and a repeated key first at most once.
fn in_order(keys: &[&str], mine: &HashSet<String>) -> Vec<bool> {
    let mut answered: HashSet<&str> = HashSet::with_capacity(keys.len());
    keys.iter().map(|k| answered.insert(k) && mine.contains(*k)).collect()
}
