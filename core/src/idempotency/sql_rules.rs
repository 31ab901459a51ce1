//! The SQL store's rules, written once as async code over the async seam:
//! the claim INSERT, the stale-claim takeover, confirm, forget, the batches
//! and the purge. [`SqlIdempotencyStore`](super::SqlIdempotencyStore) runs
//! them over a blocking connection (where they never suspend),
//! [`AsyncSqlIdempotencyStore`](super::AsyncSqlIdempotencyStore) over
//! tokio-postgres or SQLite on the blocking pool.

use super::clock::{Clock, SystemClock};
use super::sql::SqlIdempotencyOptions;
use crate::error::{Error, Result};
use crate::sql::placeholders::number;
use crate::sql::time::millis;
use crate::sql::{begin, finish, table_name, AsyncSqlConnection, Dialect, SqlValue, WorkerId};
use std::sync::Arc;

const CLAIMED: &str = "CLAIMED";
const CONFIRMED: &str = "CONFIRMED";

/// One table's rules: its options, its clock and its statements in both dialects.
pub(crate) struct Keys {
    options: SqlIdempotencyOptions,
    worker: WorkerId,
    clock: Arc<dyn Clock>,
    sqlite: Statements,
    postgres: Statements,
}

impl Keys {
    pub(crate) fn new(options: SqlIdempotencyOptions) -> Result<Self> {
        validate(&options)?;
        Ok(Keys {
            worker: WorkerId::new("idempotency", options.worker.clone())?,
            sqlite: Statements::new(&options.table, Dialect::Sqlite),
            postgres: Statements::new(&options.table, Dialect::Postgres),
            options,
            clock: Arc::new(SystemClock),
        })
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
        vec![s.create_table.clone(), s.create_index.clone()]
    }

    /// A store call that failed, saying which table and what to check.
    pub(crate) fn failed(&self, doing: &str, e: Error) -> Error {
        Error::store(format!(
            "cannot {doing} in table {}: {e} (check the database is reachable and create_schema has been run)",
            self.options.table
        ))
    }

    fn statements(&self, dialect: Dialect) -> &Statements {
        match dialect {
            Dialect::Sqlite => &self.sqlite,
            Dialect::Postgres => &self.postgres,
        }
    }

    pub(crate) async fn create_schema<C: AsyncSqlConnection>(&self, c: &C) -> Result<()> {
        let s = self.statements(c.dialect());
        // One statement per call: drivers differ on multi-statement strings.
        c.execute(&s.create_table, &[]).await?;
        c.execute(&s.create_index, &[]).await?;
        Ok(())
    }

    pub(crate) async fn purge_expired<C: AsyncSqlConnection>(&self, c: &C) -> Result<u64> {
        let now = self.clock.now_millis();
        c.execute(&self.statements(c.dialect()).purge, &[SqlValue::Int(now)]).await
    }

    /// The claim: the INSERT, else a takeover of a stale claim. Commits on
    /// its own when `c` is outside a transaction.
    pub(crate) async fn first_time<C: AsyncSqlConnection>(&self, c: &C, key: &str) -> Result<bool> {
        let now = self.clock.now_millis();
        self.claim_at(c, key, now, SqlValue::Text(self.worker())).await
    }

    async fn claim_at<C: AsyncSqlConnection>(&self, c: &C, key: &str, now: i64, worker: SqlValue) -> Result<bool> {
        let s = self.statements(c.dialect());
        let expires = now.saturating_add(millis(self.options.retention));
        let stale_before = now.saturating_sub(millis(self.options.claim_timeout));
        let key = SqlValue::Text(key.to_string());
        let inserted =
            c.execute(&s.claim, &[key.clone(), worker.clone(), SqlValue::Int(now), SqlValue::Int(expires)]).await?;
        if inserted > 0 {
            return Ok(true);
        }
        // Somebody has the key. Take it over only if their claim has gone
        // stale, and never a CONFIRMED row: that message really was handled.
        // The UPDATE's own WHERE decides, so two workers taking over at
        // once cannot both win (the first moves recorded_at to now).
        let taken = c
            .execute(
                &s.take_over,
                &[worker, SqlValue::Int(now), SqlValue::Int(expires), key, SqlValue::Int(stale_before)],
            )
            .await?;
        Ok(taken > 0)
    }

    pub(crate) async fn confirm<C: AsyncSqlConnection>(&self, c: &C, key: &str) -> Result<()> {
        c.execute(&self.statements(c.dialect()).confirm, &[SqlValue::Text(key.to_string())]).await.map(drop)
    }

    pub(crate) async fn forget<C: AsyncSqlConnection>(&self, c: &C, key: &str) -> Result<()> {
        let params = [SqlValue::Text(key.to_string()), SqlValue::Text(self.worker())];
        c.execute(&self.statements(c.dialect()).forget, &params).await.map(drop)
    }

    pub(crate) async fn confirmed<C: AsyncSqlConnection>(&self, c: &C, key: &str) -> Result<bool> {
        let rows = c.query(&self.statements(c.dialect()).state, &[SqlValue::Text(key.to_string())]).await?;
        Ok(rows.first().and_then(|r| r.first()) == Some(&SqlValue::Text(CONFIRMED.to_string())))
    }

    /// Each key by the one-message rules, in order, in one transaction.
    pub(crate) async fn claim_batch<C: AsyncSqlConnection>(&self, c: &C, keys: &[&str]) -> Result<Vec<bool>> {
        let now = self.clock.now_millis();
        let worker = SqlValue::Text(self.worker());
        begin(c).await?;
        let claimed = async {
            let mut claimed = Vec::with_capacity(keys.len());
            for key in keys {
                claimed.push(self.claim_at(c, key, now, worker.clone()).await?);
            }
            Ok(claimed)
        }
        .await;
        finish(c, claimed).await
    }

    pub(crate) async fn confirm_batch<C: AsyncSqlConnection>(&self, c: &C, keys: &[&str]) -> Result<()> {
        begin(c).await?;
        let confirmed = async {
            for key in keys {
                self.confirm(c, key).await?;
            }
            Ok(())
        }
        .await;
        finish(c, confirmed).await
    }
}

fn validate(o: &SqlIdempotencyOptions) -> Result<()> {
    table_name("idempotency", &o.table)?;
    if o.retention.is_zero() || o.claim_timeout.is_zero() {
        return Err(Error::invalid("idempotency retention and claim_timeout must be longer than zero"));
    }
    Ok(())
}

/// The SQL for one table in one dialect, built once.
#[derive(Debug, Clone)]
pub(crate) struct Statements {
    pub(crate) create_table: String,
    pub(crate) create_index: String,
    pub(crate) claim: String,
    pub(crate) take_over: String,
    pub(crate) confirm: String,
    pub(crate) forget: String,
    pub(crate) state: String,
    pub(crate) purge: String,
}

impl Statements {
    pub(crate) fn new(t: &str, dialect: Dialect) -> Self {
        let int = match dialect {
            Dialect::Sqlite => "INTEGER",
            Dialect::Postgres => "BIGINT",
        };
        let p = |sql: String| number(dialect, &sql);
        Statements {
            create_table: format!(
                "CREATE TABLE IF NOT EXISTS {t} (message_id TEXT NOT NULL PRIMARY KEY, state TEXT NOT NULL, \
                 claimed_by TEXT, recorded_at {int} NOT NULL, expires_at {int} NOT NULL)"
            ),
            create_index: format!("CREATE INDEX IF NOT EXISTS {t}_expiry ON {t} (expires_at)"),
            claim: p(format!(
                "INSERT INTO {t} (message_id, state, claimed_by, recorded_at, expires_at) \
                 VALUES (?, '{CLAIMED}', ?, ?, ?) ON CONFLICT (message_id) DO NOTHING"
            )),
            take_over: p(format!(
                "UPDATE {t} SET claimed_by = ?, recorded_at = ?, expires_at = ? \
                 WHERE message_id = ? AND state = '{CLAIMED}' AND recorded_at < ?"
            )),
            confirm: p(format!("UPDATE {t} SET state = '{CONFIRMED}' WHERE message_id = ?")),
            forget: p(format!("DELETE FROM {t} WHERE message_id = ? AND state = '{CLAIMED}' AND claimed_by = ?")),
            state: p(format!("SELECT state FROM {t} WHERE message_id = ?")),
            purge: p(format!("DELETE FROM {t} WHERE expires_at < ?")),
        }
    }
}
