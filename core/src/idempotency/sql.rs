//! The SQL store: the claim is an INSERT, SQLite and PostgreSQL alike.

use super::clock::{millis, Clock, SystemClock};
use super::source::ConnectionSource;
use super::store::IdempotencyStore;
use crate::error::{Error, Result};
use crate::sql::{Dialect, SqlConnection, SqlValue};
use once_cell::sync::Lazy;
use std::sync::Arc;
use std::time::Duration;

/// The table name when none is given.
pub const DEFAULT_TABLE: &str = "acemq_idempotency";

/// How long a key is remembered by default. It has to be longer than the
/// longest a duplicate can take to arrive: the top rung of the retry ladder,
/// a dead-letter queue drained by hand next week, a replay. A day is a
/// starting point, not an answer.
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(24 * 3600);

const CLAIMED: &str = "CLAIMED";
const CONFIRMED: &str = "CONFIRMED";

/// Options for [`SqlIdempotencyStore`].
#[derive(Debug, Clone, PartialEq)]
pub struct SqlIdempotencyOptions {
    /// The table (default `acemq_idempotency`). A plain identifier: letters,
    /// digits and underscores; use the search path for a PostgreSQL schema.
    pub table: String,
    /// How long a key is remembered before [`SqlIdempotencyStore::purge_expired`]
    /// may remove it (default 24 hours).
    pub retention: Duration,
    /// How long an unfinished claim is honoured (default 300 seconds). Longer
    /// than the slowest handler, or two consumers will work on one message at
    /// once; shorter than anybody's patience, because a consumer killed
    /// mid-handler leaves its claim behind and nothing handles the message
    /// until it expires.
    pub claim_timeout: Duration,
    /// Who claims (`claimed_by`), so that `forget` removes only this worker's
    /// own claim. `None` means `hostname:pid`, read at each call so that a
    /// forked child (Puma, Unicorn) is a different worker from its parent.
    pub worker: Option<String>,
}

impl Default for SqlIdempotencyOptions {
    fn default() -> Self {
        Self {
            table: DEFAULT_TABLE.to_string(),
            retention: DEFAULT_RETENTION,
            claim_timeout: super::memory::DEFAULT_CLAIM_TIMEOUT,
            worker: None,
        }
    }
}

/// Idempotency keys in a SQL table, through the SQL seam ([`SqlConnection`]).
///
/// The table is the store's own (`create_schema` makes it):
///
/// | column        | SQLite  | PostgreSQL | meaning                                   |
/// |---------------|---------|------------|-------------------------------------------|
/// | `message_id`  | TEXT PK | TEXT PK    | the key                                   |
/// | `state`       | TEXT    | TEXT       | `CLAIMED` or `CONFIRMED`                  |
/// | `claimed_by`  | TEXT    | TEXT       | the worker that claimed it                |
/// | `recorded_at` | INTEGER | BIGINT     | when it was claimed, epoch milliseconds   |
/// | `expires_at`  | INTEGER | BIGINT     | when it may be purged, epoch milliseconds |
///
/// Times are integers (epoch milliseconds, from this worker's clock) rather
/// than datetime columns: an integer compares the same way in both dialects
/// and in every driver, where timestamps come back as strings from `pg`,
/// as text in SQLite and with the session's time zone in between. This is
/// not the table from the guide's ActiveRecord migration, which has datetime
/// columns: if that table exists under the same name, give this store
/// another one.
///
/// The rules, exactly the guide's:
/// - the claim is an `INSERT ... ON CONFLICT (message_id) DO NOTHING` that
///   commits on its own (never inside the handler's transaction: a claim that
///   rolls back with the work is not a claim); the row appearing is the answer
///   to "am I the first?", because a primary key is the one thing two
///   concurrent transactions cannot both win. `DO NOTHING` rather than
///   catching a unique violation, because on PostgreSQL a violation aborts
///   the caller's transaction;
/// - on conflict, a `CLAIMED` row whose claim is older than the claim timeout
///   is taken over with one conditional `UPDATE`; a `CONFIRMED` row never is;
/// - `confirm` is an idempotent `UPDATE` to `CONFIRMED`;
/// - `forget` deletes only this worker's own `CLAIMED` row;
/// - nothing on the handling path deletes: schedule
///   [`purge_expired`](Self::purge_expired) (hourly, say). A key is remembered
///   at least for the retention and until it is purged.
pub struct SqlIdempotencyStore<C = Box<dyn ConnectionSource>> {
    source: C,
    options: SqlIdempotencyOptions,
    clock: Arc<dyn Clock>,
    sqlite: Statements,
    postgres: Statements,
}

impl<C: ConnectionSource> SqlIdempotencyStore<C> {
    /// A store over `source`: a connection it keeps (e.g. a
    /// [`SqliteConnection`](crate::sql::SqliteConnection)) or a
    /// [`ConnectionSource`] that lends one per call.
    pub fn new(source: C, options: SqlIdempotencyOptions) -> Result<Self> {
        validate(&options)?;
        Ok(Self {
            sqlite: Statements::new(&options.table, Dialect::Sqlite),
            postgres: Statements::new(&options.table, Dialect::Postgres),
            source,
            options,
            clock: Arc::new(SystemClock),
        })
    }

    /// Read time from `clock` (a [`ManualClock`](super::ManualClock) in tests).
    pub fn with_clock(mut self, clock: impl Clock + 'static) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// The options it was built with.
    pub fn options(&self) -> &SqlIdempotencyOptions {
        &self.options
    }

    /// The worker id written to `claimed_by`.
    pub fn worker(&self) -> String {
        match &self.options.worker {
            Some(w) => w.clone(),
            None => format!("{}:{}", *HOSTNAME, std::process::id()),
        }
    }

    /// The statements [`create_schema`](Self::create_schema) runs, for a
    /// migration file.
    pub fn schema_sql(&self, dialect: Dialect) -> Vec<String> {
        let s = self.statements(dialect);
        vec![s.create_table.clone(), s.create_index.clone()]
    }

    /// Create the table and its expiry index if they do not exist.
    pub fn create_schema(&self) -> Result<()> {
        self.with_conn("create the idempotency table", |c, s| {
            // One statement per call: drivers differ on multi-statement strings.
            c.execute(&s.create_table, &[])?;
            c.execute(&s.create_index, &[])?;
            Ok(())
        })
    }

    /// Remove keys past their retention; how many were removed. Nothing on
    /// the handling path deletes (a delete there is contention on the one
    /// table every message touches), so schedule this; the index on
    /// `expires_at` keeps it from scanning the table.
    pub fn purge_expired(&self) -> Result<u64> {
        let now = self.clock.now_millis();
        self.with_conn("purge expired idempotency keys", |c, s| c.execute(&s.purge, &[SqlValue::Int(now)]))
    }

    fn statements(&self, dialect: Dialect) -> &Statements {
        match dialect {
            Dialect::Sqlite => &self.sqlite,
            Dialect::Postgres => &self.postgres,
        }
    }

    fn with_conn<R>(
        &self,
        doing: &str,
        f: impl FnOnce(&dyn SqlConnection, &Statements) -> Result<R>,
    ) -> Result<R> {
        let mut f = Some(f);
        let mut out = None;
        self.source
            .with_connection(&mut |c| {
                let f = f.take().ok_or_else(|| Error::store("connection source called the store twice"))?;
                out = Some(f(c, self.statements(c.dialect()))?);
                Ok(())
            })
            .map_err(|e| {
                Error::store(format!(
                    "cannot {doing} in table {}: {e} (check the database is reachable and create_schema has been run)",
                    self.options.table
                ))
            })?;
        out.ok_or_else(|| Error::store(format!("cannot {doing}: the connection source never lent a connection")))
    }
}

impl<C: ConnectionSource> IdempotencyStore for SqlIdempotencyStore<C> {
    fn first_time(&self, key: &str) -> Result<bool> {
        let now = self.clock.now_millis();
        let expires = now.saturating_add(millis(self.options.retention));
        let stale_before = now.saturating_sub(millis(self.options.claim_timeout));
        let worker = SqlValue::Text(self.worker());
        let key = SqlValue::Text(key.to_string());
        self.with_conn("claim an idempotency key", |c, s| {
            let inserted = c.execute(
                &s.claim,
                &[key.clone(), worker.clone(), SqlValue::Int(now), SqlValue::Int(expires)],
            )?;
            if inserted > 0 {
                return Ok(true);
            }
            // Somebody has the key. Take it over only if their claim has gone
            // stale, and never a CONFIRMED row: that message really was handled.
            // The UPDATE's own WHERE decides, so two workers taking over at
            // once cannot both win (the first moves recorded_at to now).
            let taken = c.execute(
                &s.take_over,
                &[worker, SqlValue::Int(now), SqlValue::Int(expires), key, SqlValue::Int(stale_before)],
            )?;
            Ok(taken > 0)
        })
    }

    fn confirm(&self, key: &str) -> Result<()> {
        let key = SqlValue::Text(key.to_string());
        self.with_conn("confirm an idempotency key", |c, s| c.execute(&s.confirm, &[key]).map(drop))
    }

    fn forget(&self, key: &str) -> Result<()> {
        let params = [SqlValue::Text(key.to_string()), SqlValue::Text(self.worker())];
        self.with_conn("forget an idempotency key", |c, s| c.execute(&s.forget, &params).map(drop))
    }

    fn confirmed(&self, key: &str) -> Result<bool> {
        let key = SqlValue::Text(key.to_string());
        self.with_conn("read an idempotency key", |c, s| {
            let rows = c.query(&s.state, &[key])?;
            Ok(rows.first().and_then(|r| r.first()) == Some(&SqlValue::Text(CONFIRMED.to_string())))
        })
    }
}

static HOSTNAME: Lazy<String> = Lazy::new(|| {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok().filter(|h| !h.is_empty()))
        .or_else(|| std::env::var("COMPUTERNAME").ok().filter(|h| !h.is_empty()))
        .unwrap_or_else(|| "localhost".to_string())
});

fn validate(o: &SqlIdempotencyOptions) -> Result<()> {
    let t = &o.table;
    let ident = !t.is_empty()
        && t.len() <= 58 // PostgreSQL truncates identifiers at 63 bytes, and "_expiry" is added
        && !t.starts_with(|c: char| c.is_ascii_digit())
        && t.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !ident {
        return Err(Error::invalid(format!(
            "idempotency table name {t:?} is not a plain identifier: use letters, digits and underscores (at most 58)"
        )));
    }
    if o.retention.is_zero() || o.claim_timeout.is_zero() {
        return Err(Error::invalid("idempotency retention and claim_timeout must be longer than zero"));
    }
    if o.worker.as_deref() == Some("") {
        return Err(Error::invalid("idempotency worker id is empty: give a non-empty worker, or none for hostname:pid"));
    }
    Ok(())
}

/// The SQL for one table in one dialect, built once.
#[derive(Debug, Clone)]
struct Statements {
    create_table: String,
    create_index: String,
    claim: String,
    take_over: String,
    confirm: String,
    forget: String,
    state: String,
    purge: String,
}

impl Statements {
    fn new(t: &str, dialect: Dialect) -> Self {
        let int = match dialect {
            Dialect::Sqlite => "INTEGER",
            Dialect::Postgres => "BIGINT",
        };
        let p = |sql: String| placeholders(&sql, dialect);
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

/// `?` placeholders become `$1`, `$2`, ... for PostgreSQL. The statements
/// above have no `?` inside literals, so a plain scan is exact.
fn placeholders(sql: &str, dialect: Dialect) -> String {
    if dialect == Dialect::Sqlite {
        return sql.to_string();
    }
    let mut out = String::with_capacity(sql.len() + 8);
    let mut n = 0;
    for ch in sql.chars() {
        if ch == '?' {
            n += 1;
            out.push('$');
            out.push_str(&n.to_string());
        } else {
            out.push(ch);
        }
    }
    out
}
