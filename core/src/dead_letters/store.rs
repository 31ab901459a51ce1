//! The dead-letter store over the blocking SQL seam: what the Ruby gem
//! runs (through the application's own connection, or a SQLite file), and a
//! Rust service with a blocking connection.

use super::rules::Rules;
use super::{AuditEntry, Counts, DeadLetterStoreOptions, Filter, NewDeadLetter, Page, Retention, Selection, StoredDeadLetter};
use crate::error::Result;
use crate::sql::blocking::{run, Blocking};
use crate::sql::{lend, ConnectionSource, Dialect};

/// Dead letters in SQL tables (SQLite, PostgreSQL, MySQL/MariaDB), over a
/// blocking connection. Every call takes one connection from the source for
/// its length; each write runs in a transaction of its own.
///
/// ```no_run
/// use acemq::dead_letters::{DeadLetterStoreOptions, Filter, SqlDeadLetterStore};
/// use acemq::sql::SqliteConnection;
///
/// # fn main() -> acemq::Result<()> {
/// let store = SqlDeadLetterStore::new(SqliteConnection::open("app.db")?, DeadLetterStoreOptions::default())?;
/// store.create_schema()?;
/// let page = store.list(&Filter::queue("payments"), None, 50)?;
/// for row in &page.letters {
///     println!("{} {} {:?}", row.id, row.letter.message_id, row.letter.reason);
/// }
/// # Ok(()) }
/// ```
pub struct SqlDeadLetterStore<S> {
    rules: Rules,
    source: S,
}

impl<S: ConnectionSource> SqlDeadLetterStore<S> {
    /// A store whose calls take connections from `source`. Fails when a
    /// table name in `options` is not a plain identifier.
    pub fn new(source: S, options: DeadLetterStoreOptions) -> Result<Self> {
        Ok(SqlDeadLetterStore { rules: Rules::new(&options)?, source })
    }

    /// The dead letters' table.
    pub fn table(&self) -> &str {
        &self.rules.st.table
    }

    /// The audit table.
    pub fn audit_table(&self) -> &str {
        &self.rules.st.audit
    }

    /// The DDL for `dialect`, one statement per element: what a migration
    /// runs (`acemq:install` writes it). Idempotent (`IF NOT EXISTS`).
    pub fn schema_sql(&self, dialect: Dialect) -> Vec<String> {
        self.rules.st.create_schema(dialect)
    }

    /// Create both tables and their indexes if they do not exist.
    pub fn create_schema(&self) -> Result<()> {
        self.with(|c| run(self.rules.create_schema(&c)))
    }

    /// Insert `letters` in one transaction; a key already stored (the same
    /// delivery ingested again) is skipped. The rows the database reports
    /// inserted.
    pub fn insert(&self, letters: &[NewDeadLetter]) -> Result<u64> {
        self.with(|c| run(self.rules.insert(&c, letters)))
    }

    /// One page, newest first: rows below `after_id` (the previous page's
    /// [`Page::next`]), at most `limit` (1 to 1,000).
    pub fn list(&self, filter: &Filter, after_id: Option<i64>, limit: usize) -> Result<Page> {
        self.with(|c| run(self.rules.list(&c, filter, after_id, limit)))
    }

    /// One row.
    pub fn find(&self, id: i64) -> Result<Option<StoredDeadLetter>> {
        self.with(|c| run(self.rules.find(&c, id)))
    }

    /// How many match `filter`, grouped by queue, reason and error class
    /// (the `top` largest groups of each).
    pub fn counts(&self, filter: &Filter, top: usize) -> Result<Counts> {
        self.with(|c| run(self.rules.counts(&c, filter, top)))
    }

    /// The ids `selection` names now, lowest first: a replay's snapshot.
    pub fn snapshot(&self, selection: &Selection) -> Result<Vec<i64>> {
        self.with(|c| run(self.rules.snapshot(&c, selection)))
    }

    /// Delete rows by id; recorded in the audit table as `actor`'s.
    pub fn discard(&self, ids: &[i64], actor: &str) -> Result<u64> {
        check_actor(actor)?;
        self.with(|c| run(self.rules.discard(&c, ids, actor)))
    }

    /// Delete every row `filter` matches now; recorded as `actor`'s. A
    /// filter that sets nothing (blank texts count as unset) is refused:
    /// deleting every dead letter of every queue is [`Self::purge_all`].
    pub fn purge(&self, filter: &Filter, actor: &str) -> Result<u64> {
        check_actor(actor)?;
        check_purge_filter(filter)?;
        self.with(|c| run(self.rules.purge(&c, filter, actor)))
    }

    /// Delete every row of every queue; recorded as `actor`'s.
    pub fn purge_all(&self, actor: &str) -> Result<u64> {
        check_actor(actor)?;
        self.with(|c| run(self.rules.purge(&c, &Filter::default(), actor)))
    }

    /// Delete rows past `retention` (of `queue`, or of every queue);
    /// recorded as `actor`'s when any went.
    pub fn prune(&self, queue: Option<&str>, retention: &Retention, actor: &str) -> Result<u64> {
        self.with(|c| run(self.rules.prune(&c, queue, retention, actor)))
    }

    /// The newest `limit` audit rows, newest first.
    pub fn audit(&self, limit: usize) -> Result<Vec<AuditEntry>> {
        self.with(|c| run(self.rules.audit(&c, limit)))
    }

    /// A replay's step: lease `ids` to replay `run` until `until` (seconds)
    /// and return the rows it got.
    pub fn claim(&self, run_id: &str, ids: &[i64], until: i64) -> Result<Vec<StoredDeadLetter>> {
        self.with(|c| run(self.rules.claim(&c, run_id, ids, until)))
    }

    /// A replay's step: delete the rows it sent and the broker confirmed.
    pub fn delete_sent(&self, run_id: &str, ids: &[i64]) -> Result<u64> {
        self.with(|c| run(self.rules.delete_sent(&c, run_id, ids)))
    }

    /// A replay's step: give back rows it leased and did not send.
    pub fn release(&self, run_id: &str, ids: &[i64]) -> Result<u64> {
        self.with(|c| run(self.rules.release(&c, run_id, ids)))
    }

    /// Write an audit row (a replay's, at its end).
    pub fn record(&self, actor: &str, action: &str, queue: Option<&str>, detail: serde_json::Value, affected: u64) -> Result<()> {
        self.with(|c| run(self.rules.record(&c, actor, action, queue, detail, affected)))
    }

    fn with<R>(&self, f: impl FnOnce(Blocking<'_>) -> Result<R>) -> Result<R> {
        lend(&self.source, "use the dead-letter store", |c| f(Blocking(c)))
    }
}

/// A purge names what it deletes: an empty filter is [`purge_all`]'s.
pub(crate) fn check_purge_filter(filter: &Filter) -> Result<()> {
    if filter.is_empty() {
        return Err(crate::error::Error::invalid(
            "purge without a filter would delete every dead letter of every queue: name one (a queue, a reason, ...) \
             or purge everything with purge_all (Ruby: all: true)",
        ));
    }
    Ok(())
}

pub(crate) fn check_actor(actor: &str) -> Result<()> {
    if actor.trim().is_empty() {
        return Err(crate::error::Error::invalid(
            "a dead-letter action needs an actor: who did it, for the audit table (a user name, \"console\", ...)",
        ));
    }
    Ok(())
}
