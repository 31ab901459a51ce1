//! The throttle shared across processes: a SQL row per consumer name that
//! grants tokens in leases.
//!
//! Each consumer's local token bucket ([`Throttle`]) stays the per-process
//! limiter. With a [`ThrottleStore`] the consumer also needs a token from a
//! lease before it hands a message out; a lease is up to [`lease_size`]
//! tokens of the current window, taken by one UPDATE:
//!
//! ```sql
//! UPDATE acemq_throttle
//!    SET taken = CASE WHEN window_start = ? THEN taken + ? ELSE ? END, window_start = ?
//!  WHERE name = ? AND (window_start < ? OR (window_start = ? AND taken + ? <= ?))
//! ```
//!
//! Windows are fixed, `per` long and aligned on the epoch (`now - now % per`),
//! so every process computes the same window from its clock. The statement
//! either opens the new window with this lease or adds the lease to the
//! current one while it stays within the limit; one row changed is the
//! grant. When it changes none, the row is read: the lease is then the rest
//! of the window (`limit - taken`, one more UPDATE), or nothing until the
//! window ends, and the consumer sleeps until then without asking again.
//!
//! A lease is good until its window ends: tokens left unused are dropped,
//! never carried into the next window. So the store grants at most `limit`
//! per window, whatever the number of processes: the shared limit is exact
//! per window, at the price of a fixed window's edge (up to `limit` at the end
//! of one window and `limit` at the start of the next, as every fixed window
//! allows) and of clocks: a process whose clock is ahead opens the next
//! window early. A process holds at most one lease (`lease_size` tokens),
//! so what it strands at a window's end, unused, is fewer than `lease_size`.

use crate::error::{Error, Result};
use crate::sql::blocking::{run, Blocking};
use crate::sql::placeholders::number;
use crate::sql::{AsyncSqlConnection, ConnectionSource, Dialect, SqlConnection, SqlValue};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// At most `limit` messages handed out per `per`, in this process: a token
/// bucket of `limit` tokens refilled evenly over `per`, so a burst after an
/// idle spell is at most `limit`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Throttle {
    /// Messages per period. At least 1.
    pub limit: u32,
    /// The period.
    pub per: Duration,
}

impl Throttle {
    /// `limit` messages per `per`.
    pub fn new(limit: u32, per: Duration) -> Self {
        Throttle { limit, per }
    }

    /// The rules a throttle must meet (a limit of at least 1, a positive
    /// period), checked by `open` and, through the extension, by Ruby's
    /// `consume` and the Rails DSL as they are given.
    pub fn validate(&self) -> crate::Result<()> {
        if self.limit == 0 || self.per.is_zero() {
            return Err(crate::Error::invalid(format!(
                "throttle needs a limit of at least 1 and a positive period (got {} per {}s)",
                self.limit,
                self.per.as_secs_f64()
            )));
        }
        Ok(())
    }
}

/// The table a [`SqlThrottleStore`] keeps its rows in by default.
pub const DEFAULT_TABLE: &str = "acemq_throttle";

/// How long a consumer waits before asking a failing store again. Meanwhile
/// it hands nothing out (its deliveries wait in the prefetch, unstarted) and
/// each failure is a `throttle_store_failed` subscription event.
pub const STORE_RETRY: Duration = Duration::from_secs(1);

/// Tokens per lease: a tenth of the limit, at least 1. A tenth keeps the
/// cost at about ten UPDATEs per window whatever the rate (plus up to two per
/// process when the window runs out), and keeps what a process can strand
/// unused at a window's end under a tenth of the limit, so that a few
/// processes sharing a limit still reach it.
pub fn lease_size(limit: u32) -> u32 {
    (limit / 10).max(1)
}

/// The window `now_ms` falls in: (start, end), epoch milliseconds.
pub fn window(now_ms: i64, per: Duration) -> (i64, i64) {
    let per_ms = i64::try_from(per.as_millis()).unwrap_or(i64::MAX).max(1);
    let start = now_ms - now_ms.rem_euclid(per_ms);
    (start, start.saturating_add(per_ms))
}

/// Tokens granted by a store: good until `until_ms` (the window's end,
/// epoch milliseconds). None granted: the window is spent until then.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    /// Tokens granted.
    pub tokens: u32,
    /// When they lapse, epoch milliseconds.
    pub until_ms: i64,
}

/// Where a throttle shared across processes takes its leases.
pub trait ThrottleStore: Send + Sync {
    /// Up to `want` tokens of `name`'s current window, at most `throttle.limit`
    /// granted per window of `throttle.per` across every process.
    fn lease(&self, name: &str, throttle: Throttle, want: u32) -> Result<Lease>;
}

/// A [`ThrottleStore`] as [`ConsumeOptions::throttle_store`](crate::ConsumeOptions::throttle_store) holds it.
#[derive(Clone)]
pub struct SharedStore(pub std::sync::Arc<dyn ThrottleStore>);

impl SharedStore {
    /// Share `store`.
    pub fn new(store: impl ThrottleStore + 'static) -> Self {
        SharedStore(std::sync::Arc::new(store))
    }
}

impl std::fmt::Debug for SharedStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SharedStore")
    }
}

/// The SQL for one table in one dialect.
#[derive(Debug, Clone)]
struct Statements {
    create_table: String,
    take: String,
    read: String,
    insert: String,
}

impl Statements {
    fn new(t: &str, dialect: Dialect) -> Self {
        let p = |sql: String| number(dialect, &sql);
        let create_table = match dialect {
            Dialect::Mysql => format!(
                "CREATE TABLE IF NOT EXISTS {t} (name VARCHAR(255) NOT NULL PRIMARY KEY, window_start BIGINT NOT NULL, \
                 taken BIGINT NOT NULL) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4"
            ),
            Dialect::Sqlite => {
                format!("CREATE TABLE IF NOT EXISTS {t} (name TEXT NOT NULL PRIMARY KEY, window_start INTEGER NOT NULL, taken INTEGER NOT NULL)")
            }
            Dialect::Postgres => {
                format!("CREATE TABLE IF NOT EXISTS {t} (name TEXT NOT NULL PRIMARY KEY, window_start BIGINT NOT NULL, taken BIGINT NOT NULL)")
            }
        };
        let insert = match dialect {
            Dialect::Mysql => format!("INSERT IGNORE INTO {t} (name, window_start, taken) VALUES (?, ?, 0)"),
            _ => p(format!("INSERT INTO {t} (name, window_start, taken) VALUES (?, ?, 0) ON CONFLICT (name) DO NOTHING")),
        };
        Statements {
            create_table,
            // MySQL assigns left to right: taken first, while window_start
            // is still the old one.
            take: p(format!(
                "UPDATE {t} SET taken = CASE WHEN window_start = ? THEN taken + ? ELSE ? END, window_start = ? \
                 WHERE name = ? AND (window_start < ? OR (window_start = ? AND taken + ? <= ?))"
            )),
            read: p(format!("SELECT window_start, taken FROM {t} WHERE name = ?")),
            insert,
        }
    }
}

/// One lease, by the rules in the module's doc: the UPDATE, else the read
/// and the rest of the window.
async fn take_lease(conn: &impl AsyncSqlConnection, t: &str, name: &str, throttle: Throttle, want: u32, now_ms: i64) -> Result<Lease> {
    let st = Statements::new(t, conn.dialect());
    let (w, until_ms) = window(now_ms, throttle.per);
    let limit = i64::from(throttle.limit);
    let take = |n: i64| {
        vec![
            SqlValue::Int(w),
            SqlValue::Int(n),
            SqlValue::Int(n),
            SqlValue::Int(w),
            SqlValue::Text(name.to_owned()),
            SqlValue::Int(w),
            SqlValue::Int(w),
            SqlValue::Int(n),
            SqlValue::Int(limit),
        ]
    };
    let want = i64::from(want.clamp(1, throttle.limit));
    for _ in 0..2 {
        if conn.execute(&st.take, &take(want)).await? == 1 {
            return Ok(Lease { tokens: want as u32, until_ms });
        }
        let rows = conn.query(&st.read, &[SqlValue::Text(name.to_owned())]).await?;
        let Some(row) = rows.first() else {
            // The first lease of this name: its row, then the UPDATE again.
            conn.execute(&st.insert, &[SqlValue::Text(name.to_owned()), SqlValue::Int(w)]).await?;
            continue;
        };
        let int = |v: Option<&SqlValue>| match v {
            Some(SqlValue::Int(i)) => Ok(*i),
            Some(SqlValue::Text(s)) => s.parse::<i64>().map_err(|e| Error::store(format!("throttle row holds {s:?}: {e}"))),
            other => Err(Error::store(format!("throttle row holds {other:?}, not an integer"))),
        };
        let (start, taken) = (int(row.first())?, int(row.get(1))?);
        let rest = limit - taken;
        if start == w && rest > 0 && conn.execute(&st.take, &take(rest)).await? == 1 {
            return Ok(Lease { tokens: rest as u32, until_ms });
        }
        // Spent (or another process just took the rest, or its clock is
        // ahead and opened a later window): nothing until this window ends.
        return Ok(Lease { tokens: 0, until_ms });
    }
    Ok(Lease { tokens: 0, until_ms })
}

/// Epoch milliseconds now.
pub(crate) fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

/// A [`ThrottleStore`] in a SQL table (SQLite, PostgreSQL, MySQL), through
/// the SQL seam: one row per consumer name (`name`, `window_start`, `taken`),
/// the table created on first use (`CREATE TABLE IF NOT EXISTS`).
pub struct SqlThrottleStore<C = Box<dyn ConnectionSource + Send + Sync>> {
    source: C,
    table: Table,
}

/// A store's table and whether this store has created it yet.
#[derive(Debug)]
struct Table {
    name: String,
    created: AtomicBool,
}

impl Table {
    fn new(name: &str) -> Result<Table> {
        crate::sql::table_name("throttle", name)?;
        Ok(Table { name: name.to_owned(), created: AtomicBool::new(false) })
    }

    fn created(&self) -> bool {
        self.created.load(Ordering::Acquire)
    }

    fn create_table(&self, dialect: Dialect) -> String {
        Statements::new(&self.name, dialect).create_table
    }
}

impl<C: ConnectionSource> SqlThrottleStore<C> {
    /// A store over `source`, in [`DEFAULT_TABLE`].
    pub fn new(source: C) -> Self {
        SqlThrottleStore { source, table: Table { name: DEFAULT_TABLE.to_owned(), created: AtomicBool::new(false) } }
    }

    /// In `table` instead (a plain identifier).
    pub fn with_table(self, table: &str) -> Result<Self> {
        Ok(SqlThrottleStore { source: self.source, table: Table::new(table)? })
    }

    /// The statement that creates the table, for a migration.
    pub fn schema_sql(&self, dialect: Dialect) -> String {
        self.table.create_table(dialect)
    }

    /// Create the table if it does not exist.
    pub fn create_schema(&self) -> Result<()> {
        self.with_conn("create the throttle table", |c| c.execute(&self.table.create_table(c.dialect()), &[]).map(|_| ()))?;
        self.table.created.store(true, Ordering::Release);
        Ok(())
    }

    /// [`ThrottleStore::lease`] at `now_ms` (epoch milliseconds).
    pub fn lease_at(&self, name: &str, throttle: Throttle, want: u32, now_ms: i64) -> Result<Lease> {
        if !self.table.created() {
            self.create_schema()?;
        }
        self.with_conn("take a throttle lease", |c| run(take_lease(&Blocking(c), &self.table.name, name, throttle, want, now_ms)))
    }

    fn with_conn<R>(&self, doing: &str, f: impl FnOnce(&dyn SqlConnection) -> Result<R>) -> Result<R> {
        crate::sql::lend(&self.source, doing, f).map_err(|e| Error::store(format!("the throttle store failed: {e}")))
    }
}

impl<C: ConnectionSource + Send + Sync> ThrottleStore for SqlThrottleStore<C> {
    fn lease(&self, name: &str, throttle: Throttle, want: u32) -> Result<Lease> {
        self.lease_at(name, throttle, want, now_ms())
    }
}

/// A [`ThrottleStore`] over an async source (a
/// [`PgConnection`](crate::sql::PgConnection), a MySQL one, a pool): the
/// same statements as [`SqlThrottleStore`], awaited. The consumer asks for a
/// lease off the runtime's workers (tokio's blocking pool), and the lease
/// waits there on the runtime for its round trip.
pub struct AsyncSqlThrottleStore<S> {
    source: S,
    table: Table,
}

impl<S: crate::sql::AsyncConnectionSource> AsyncSqlThrottleStore<S> {
    /// A store over `source`, in [`DEFAULT_TABLE`].
    pub fn new(source: S) -> Self {
        AsyncSqlThrottleStore { source, table: Table { name: DEFAULT_TABLE.to_owned(), created: AtomicBool::new(false) } }
    }

    /// In `table` instead (a plain identifier).
    pub fn with_table(self, table: &str) -> Result<Self> {
        Ok(AsyncSqlThrottleStore { source: self.source, table: Table::new(table)? })
    }

    /// Create the table if it does not exist.
    pub async fn create_schema(&self) -> Result<()> {
        let c = self.source.connection().await?;
        c.execute(&self.table.create_table(c.dialect()), &[]).await?;
        self.table.created.store(true, Ordering::Release);
        Ok(())
    }

    /// A lease at `now_ms` (epoch milliseconds), awaited.
    pub async fn lease_at(&self, name: &str, throttle: Throttle, want: u32, now_ms: i64) -> Result<Lease> {
        if !self.table.created() {
            self.create_schema().await?;
        }
        let c = self.source.connection().await?;
        take_lease(&c, &self.table.name, name, throttle, want, now_ms).await
    }
}

impl<S: crate::sql::AsyncConnectionSource> ThrottleStore for AsyncSqlThrottleStore<S> {
    fn lease(&self, name: &str, throttle: Throttle, want: u32) -> Result<Lease> {
        let f = self.lease_at(name, throttle, want, now_ms());
        // Called off the runtime's workers: in tokio's blocking pool (the
        // runtime is current there) or on a thread of its own.
        match tokio::runtime::Handle::try_current() {
            Ok(h) => h.block_on(f),
            Err(_) => crate::runtime::handle().block_on(f),
        }
        .map_err(|e| Error::store(format!("the throttle store failed: {e}")))
    }
}

#[cfg(all(test, feature = "sqlite"))]
mod tests {
    use super::*;
    use crate::sql::SqliteConnection;

    fn per_second(limit: u32) -> Throttle {
        Throttle::new(limit, Duration::from_secs(1))
    }

    #[test]
    fn lease_size_is_a_tenth_of_the_limit_at_least_one() {
        assert_eq!(lease_size(1), 1);
        assert_eq!(lease_size(9), 1);
        assert_eq!(lease_size(20), 2);
        assert_eq!(lease_size(100), 10);
        assert_eq!(lease_size(1005), 100);
    }

    #[test]
    fn windows_are_aligned_on_the_epoch() {
        assert_eq!(window(12_345, Duration::from_secs(1)), (12_000, 13_000));
        assert_eq!(window(12_000, Duration::from_secs(1)), (12_000, 13_000));
        assert_eq!(window(12_999, Duration::from_millis(250)), (12_750, 13_000));
        assert_eq!(window(59_000, Duration::from_secs(60)), (0, 60_000));
    }

    #[test]
    fn leases_never_grant_more_than_the_limit_per_window_and_the_next_window_starts_afresh() {
        let store = SqlThrottleStore::new(SqliteConnection::open(":memory:").unwrap());
        let t = per_second(25);
        let at = 1_000_000;
        let mut granted = Vec::new();
        loop {
            let l = store.lease_at("payments", t, lease_size(25), at + 10).unwrap();
            assert_eq!(l.until_ms, at + 1000);
            if l.tokens == 0 {
                break;
            }
            granted.push(l.tokens);
        }
        // 12 leases of 2, then the rest of the window (1): exactly 25.
        assert_eq!(granted.iter().sum::<u32>(), 25, "{granted:?}");
        assert_eq!(*granted.last().unwrap(), 1);
        // Another name has its own window.
        assert_eq!(store.lease_at("refunds", t, 2, at + 10).unwrap().tokens, 2);
        // The next window.
        assert_eq!(store.lease_at("payments", t, 2, at + 1000).unwrap(), Lease { tokens: 2, until_ms: at + 2000 });
        // A clock behind, in the window before: nothing, until its end.
        assert_eq!(store.lease_at("payments", t, 2, at + 999).unwrap(), Lease { tokens: 0, until_ms: at + 1000 });
        // A lease never asks for more than the limit.
        assert_eq!(store.lease_at("tiny", per_second(1), 5, at).unwrap().tokens, 1);
    }
}
