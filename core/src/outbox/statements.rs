//! The SQL the outbox runs, for each dialect. Every statement is written once
//! with `?` placeholders and numbered (`$1`, `$2`, ...) for PostgreSQL, so the
//! two dialects cannot drift apart in anything but what really differs: the
//! id column, the clock, and how a claim keeps other relays out.

use crate::error::Result;
use crate::sql::placeholders::{marks, number as shared_number};
use crate::sql::{table_name, Dialect};

/// Columns of a claimed row, in the order [`Statements::select_due`] returns
/// them. `attempts` comes last so a row that cannot be read can still be
/// given a backoff.
pub(crate) const RECORD_COLUMNS: &str =
    "id, exchange, routing_key, body, message_id, message_type, origin, \"timestamp\", headers, attempts";

/// Statement builder for one outbox table.
#[derive(Debug, Clone)]
pub(crate) struct Statements {
    table: String,
}

impl Statements {
    /// Statements for `table`, which must be a plain identifier: it is
    /// spliced into SQL text, so anything else is refused rather than quoted.
    pub(crate) fn new(table: &str) -> Result<Self> {
        table_name("outbox", table)?;
        Ok(Statements { table: table.to_owned() })
    }

    pub(crate) fn table(&self) -> &str {
        &self.table
    }

    /// The DDL, one statement per element: not every driver behind the seam
    /// runs several statements in one call.
    pub(crate) fn create_schema(&self, dialect: Dialect) -> Vec<String> {
        let t = &self.table;
        let id = match dialect {
            // AUTOINCREMENT, not a plain rowid: a plain rowid reuses the id of
            // a deleted last row, and a relay whose lease expired could then
            // delete or fail a new, unrelated message that got the old id.
            Dialect::Sqlite => "id INTEGER PRIMARY KEY AUTOINCREMENT",
            Dialect::Postgres => "id BIGSERIAL PRIMARY KEY",
        };
        let int = match dialect {
            Dialect::Sqlite => "INTEGER",
            Dialect::Postgres => "BIGINT",
        };
        vec![
            format!(
                "CREATE TABLE IF NOT EXISTS {t} (\n  \
                 {id},\n  \
                 exchange TEXT NOT NULL,\n  \
                 routing_key TEXT NOT NULL,\n  \
                 body TEXT NOT NULL,\n  \
                 message_id TEXT NOT NULL,\n  \
                 message_type TEXT,\n  \
                 origin TEXT,\n  \
                 \"timestamp\" {int} NOT NULL,\n  \
                 headers TEXT NOT NULL,\n  \
                 created_at {int} NOT NULL,\n  \
                 attempts INTEGER NOT NULL DEFAULT 0,\n  \
                 last_error TEXT,\n  \
                 next_attempt_at {int} NOT NULL,\n  \
                 claimed_by TEXT,\n  \
                 claimed_until {int}\n)"
            ),
            // The sweep asks for due rows (next_attempt_at <= now), oldest id
            // first. This index answers that range, so rows waiting out a
            // backoff (a destination that keeps failing) are skipped by the
            // index instead of being read on every sweep; `id` in it lets the
            // planner check the lease and order without touching the table
            // for rows it then rejects.
            format!("CREATE INDEX IF NOT EXISTS {t}_due ON {t} (next_attempt_at, id)"),
        ]
    }

    /// Insert one record; params: exchange, routing_key, body, message_id,
    /// message_type, origin, timestamp, headers.
    pub(crate) fn insert(&self, dialect: Dialect) -> String {
        let now = now_ms(dialect);
        let returning = match dialect {
            // SQLite reads the id back with last_insert_rowid() instead of
            // RETURNING, which older libsqlite3 builds (before 3.35) lack.
            Dialect::Sqlite => "",
            Dialect::Postgres => " RETURNING id",
        };
        number(
            dialect,
            &format!(
                "INSERT INTO {} (exchange, routing_key, body, message_id, message_type, origin, \"timestamp\", headers, \
                 created_at, attempts, next_attempt_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, {now}, 0, {now}){returning}",
                self.table
            ),
        )
    }

    /// Due, unleased rows, oldest first; param: limit. Inside the claim
    /// transaction. PostgreSQL locks what it selects and skips what another
    /// relay has locked, so concurrent claims never block each other and never
    /// overlap; SQLite has no row locks, and the claim's `BEGIN IMMEDIATE`
    /// (one writer at a time) plays that part.
    pub(crate) fn select_due(&self, dialect: Dialect) -> String {
        let now = now_ms(dialect);
        let lock = match dialect {
            Dialect::Sqlite => "",
            Dialect::Postgres => " FOR UPDATE SKIP LOCKED",
        };
        number(
            dialect,
            &format!(
                "SELECT {RECORD_COLUMNS} FROM {} WHERE next_attempt_at <= {now} \
                 AND (claimed_until IS NULL OR claimed_until < {now}) ORDER BY id LIMIT ?{lock}",
                self.table
            ),
        )
    }

    /// Take the lease on `n` rows; params: worker id, lease in ms, then the ids.
    pub(crate) fn lease(&self, dialect: Dialect, n: usize) -> String {
        number(
            dialect,
            &format!(
                "UPDATE {} SET claimed_by = ?, claimed_until = {} + ? WHERE id IN ({})",
                self.table,
                now_ms(dialect),
                marks(n)
            ),
        )
    }

    /// Delete `n` confirmed rows still leased by this worker; params: worker
    /// id, then the ids. A row whose lease passed to another relay is left to
    /// that relay, which publishes it again: a duplicate, never a loss.
    pub(crate) fn delete_owned(&self, dialect: Dialect, n: usize) -> String {
        number(dialect, &format!("DELETE FROM {} WHERE claimed_by = ? AND id IN ({})", self.table, marks(n)))
    }

    /// Attempts so far of `n` rows still leased by this worker; params:
    /// worker id, then the ids.
    pub(crate) fn select_attempts_owned(&self, dialect: Dialect, n: usize) -> String {
        number(
            dialect,
            &format!("SELECT id, attempts FROM {} WHERE claimed_by = ? AND id IN ({})", self.table, marks(n)),
        )
    }

    /// Record a failed attempt and release the lease so the row is retried
    /// after its backoff; params: attempts, last_error, backoff in ms, id, and
    /// the worker id when `owned` (the row must still be leased by us).
    pub(crate) fn fail(&self, dialect: Dialect, owned: bool) -> String {
        let guard = if owned { " AND claimed_by = ?" } else { "" };
        number(
            dialect,
            &format!(
                "UPDATE {} SET attempts = ?, last_error = ?, next_attempt_at = {} + ?, claimed_by = NULL, \
                 claimed_until = NULL WHERE id = ?{guard}",
                self.table,
                now_ms(dialect)
            ),
        )
    }

    /// Count, oldest created_at, rows that have failed, and the database's now.
    pub(crate) fn backlog(&self, dialect: Dialect) -> String {
        format!(
            "SELECT COUNT(*), MIN(created_at), COUNT(CASE WHEN attempts > 0 THEN 1 END), {} FROM {}",
            now_ms(dialect),
            self.table
        )
    }

    /// Rows that have failed at least once, oldest first; param: limit.
    pub(crate) fn stuck(&self, dialect: Dialect) -> String {
        number(
            dialect,
            &format!(
                "SELECT id, exchange, routing_key, message_id, attempts, last_error, next_attempt_at, created_at \
                 FROM {} WHERE attempts > 0 ORDER BY id LIMIT ?",
                self.table
            ),
        )
    }
}

// The database clock lives with the shared SQL plumbing (crate::sql).
pub(crate) use crate::sql::time::now_ms;

fn number(dialect: Dialect, sql: &str) -> String {
    shared_number(dialect, sql)
}
