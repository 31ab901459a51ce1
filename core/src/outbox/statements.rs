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

/// On PostgreSQL, the relay's own autocommitted writes (the claim, the
/// delete of confirmed rows) commit without waiting for their WAL to reach
/// disk: `synchronous_commit = off` for that one transaction (`set_config`
/// with `is_local`, evaluated on the rows it writes; the session's setting
/// is untouched). Asynchronous commit never corrupts anything; what a crash
/// of the server can lose is the last few hundred milliseconds of commits,
/// and for these statements that is a lease or a delete: the row is then
/// published again (a duplicate, never a loss), which at-least-once already
/// allows. It saves a WAL flush per statement, most of what a claim
/// waits for. The application's add, in its own
/// transaction, is untouched, and so are failure completions.
const ASYNC_COMMIT: &str = "set_config('synchronous_commit', 'off', true) IS NOT NULL";

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
            // InnoDB keeps the counter past a deleted last row (and, from
            // MySQL 8.0 and MariaDB 10.6, across a restart).
            Dialect::Mysql => "id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY",
        };
        let int = match dialect {
            Dialect::Sqlite => "INTEGER",
            Dialect::Postgres | Dialect::Mysql => "BIGINT",
        };
        // MySQL's TEXT holds 64 KiB; a body or its headers may be larger
        // (RabbitMQ's own limit is 128 MiB by default). The index goes in the
        // table itself: MySQL 8 has no CREATE INDEX IF NOT EXISTS. utf8mb4
        // whatever the database's default, so a body with an emoji is stored.
        let big = if dialect == Dialect::Mysql { "LONGTEXT" } else { "TEXT" };
        // On PostgreSQL the claim rewrites every row it leases (a new row
        // version of about 1 KiB for two small columns). With room left on
        // the page the new version stays there: a heap-only update, no index
        // entry, and only the changed bytes in the WAL. A relay's table is
        // near empty in steady state, so the space costs nothing, and a
        // claim writes less.
        let storage = match dialect {
            Dialect::Sqlite => "",
            Dialect::Postgres => " WITH (fillfactor = 50)",
            Dialect::Mysql => " ENGINE=InnoDB DEFAULT CHARSET=utf8mb4",
        };
        let index_inline = if dialect == Dialect::Mysql { format!(",\n  INDEX {t}_due (next_attempt_at, id)") } else { String::new() };
        let table = number(
            dialect,
            &format!(
                "CREATE TABLE IF NOT EXISTS {t} (\n  \
                 {id},\n  \
                 exchange TEXT NOT NULL,\n  \
                 routing_key TEXT NOT NULL,\n  \
                 body {big} NOT NULL,\n  \
                 message_id TEXT NOT NULL,\n  \
                 message_type TEXT,\n  \
                 origin TEXT,\n  \
                 \"timestamp\" {int} NOT NULL,\n  \
                 headers {big} NOT NULL,\n  \
                 created_at {int} NOT NULL,\n  \
                 attempts INTEGER NOT NULL DEFAULT 0,\n  \
                 last_error TEXT,\n  \
                 next_attempt_at {int} NOT NULL,\n  \
                 claimed_by TEXT,\n  \
                 claimed_until {int}{index_inline}\n){storage}"
            ),
        );
        if dialect == Dialect::Mysql {
            return vec![table];
        }
        vec![
            table,
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
    /// message_type, origin, timestamp, headers. Returns the id.
    ///
    /// On PostgreSQL the same statement sends a `NOTIFY` on
    /// [`channel`](Self::channel): sent inside the caller's transaction, it is
    /// delivered at commit (and never after a rollback), which is exactly
    /// when a listening relay should wake. The notifications of one
    /// transaction collapse into one, so a transaction adding a thousand rows
    /// wakes each relay once.
    pub(crate) fn insert(&self, dialect: Dialect) -> String {
        let now = now_ms(dialect);
        let insert = format!(
            "INSERT INTO {} (exchange, routing_key, body, message_id, message_type, origin, \"timestamp\", headers, \
             created_at, attempts, next_attempt_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, {now}, 0, {now})",
            self.table
        );
        match dialect {
            // SQLite reads the id back with last_insert_rowid() instead of
            // RETURNING, which older libsqlite3 builds (before 3.35) lack;
            // MySQL with LAST_INSERT_ID(), which has no RETURNING at all.
            Dialect::Sqlite => insert,
            Dialect::Mysql => number(dialect, &insert),
            // pg_notify returns void, which not every driver can read: cast.
            Dialect::Postgres => number(
                dialect,
                &format!(
                    "WITH added AS ({insert} RETURNING id) SELECT id, CAST(pg_notify('{}', '') AS TEXT) FROM added",
                    self.channel()
                ),
            ),
        }
    }

    /// The PostgreSQL channel an add notifies and a relay listens on: the
    /// table name in lower case, as `LISTEN name` folds it.
    pub(crate) fn channel(&self) -> String {
        self.table.to_ascii_lowercase()
    }

    /// The claim, one statement: lease up to `limit` due, unleased rows to
    /// this worker, oldest first, and return them (in no particular order:
    /// sort by id). Params, in this order for both dialects: worker id, lease
    /// in ms, limit.
    ///
    /// One statement is one round trip and, autocommitted, one commit: as
    /// cheap as the hand-written relay's plain `SELECT`, and it keeps the
    /// lease. PostgreSQL locks the rows it picks and skips what another relay
    /// has locked (`FOR UPDATE SKIP LOCKED` in a subquery of the `FROM`, which runs once), so
    /// concurrent claims never block each other and never overlap. On SQLite
    /// an `UPDATE` takes the write lock before it reads anything, so the
    /// subquery and the lease are one step for every other connection, as a
    /// `BEGIN IMMEDIATE` transaction would make them.
    ///
    /// MySQL has no `UPDATE ... RETURNING`: there the claim is
    /// [`select_due_mysql`](Self::select_due_mysql) then
    /// [`lease_mysql`](Self::lease_mysql) in one transaction.
    pub(crate) fn claim(&self, dialect: Dialect) -> String {
        let now = now_ms(dialect);
        let t = &self.table;
        let due = format!("next_attempt_at <= {now} AND (claimed_until IS NULL OR claimed_until < {now})");
        match dialect {
            Dialect::Sqlite => format!(
                "UPDATE {t} SET claimed_by = ?1, claimed_until = {now} + ?2 WHERE id IN \
                 (SELECT id FROM {t} WHERE {due} ORDER BY id LIMIT ?3) RETURNING {RECORD_COLUMNS}"
            ),
            Dialect::Postgres => format!(
                "UPDATE {t} SET claimed_by = $1, claimed_until = {now} + $2 FROM \
                 (SELECT id AS due_id FROM {t} WHERE {due} ORDER BY id LIMIT $3 FOR UPDATE SKIP LOCKED) due \
                 WHERE id = due_id AND {ASYNC_COMMIT} RETURNING {RECORD_COLUMNS}"
            ),
            Dialect::Mysql => unreachable!("the MySQL claim is select_due_mysql then lease_mysql"),
        }
    }

    /// MySQL, inside a transaction: lock up to `?` (the limit) due, unleased
    /// rows, oldest first, skipping rows another relay has locked, and
    /// return them. `FOR UPDATE SKIP LOCKED`: MySQL 8.0 and MariaDB 10.6.
    pub(crate) fn select_due_mysql(&self) -> String {
        let now = now_ms(Dialect::Mysql);
        number(
            Dialect::Mysql,
            &format!(
                "SELECT {RECORD_COLUMNS} FROM {} WHERE next_attempt_at <= {now} AND \
                 (claimed_until IS NULL OR claimed_until < {now}) ORDER BY id LIMIT ? FOR UPDATE SKIP LOCKED",
                self.table
            ),
        )
    }

    /// MySQL: lease the `n` rows [`select_due_mysql`](Self::select_due_mysql)
    /// locked; params: worker id, lease in ms, then the ids.
    pub(crate) fn lease_mysql(&self, n: usize) -> String {
        format!(
            "UPDATE {} SET claimed_by = ?, claimed_until = {} + ? WHERE id IN ({})",
            self.table,
            now_ms(Dialect::Mysql),
            marks(n)
        )
    }

    /// The claim with the deletion of `n` rows confirmed by the previous
    /// sweep, for PostgreSQL: one statement, so one commit for both. Params:
    /// worker id, lease in ms, limit, then the ids. The claim's subquery sees
    /// the table as it was before the delete, and the rows being deleted are
    /// still leased by us, so it cannot pick them.
    pub(crate) fn delete_then_claim_pg(&self, n: usize) -> String {
        let ids: Vec<String> = (0..n).map(|i| format!("${}", i + 4)).collect();
        format!(
            "WITH done AS (DELETE FROM {} WHERE claimed_by = $1 AND id IN ({}) AND {ASYNC_COMMIT}) {}",
            self.table,
            ids.join(", "),
            self.claim(Dialect::Postgres)
        )
    }

    /// Delete `n` confirmed rows still leased by this worker; params: worker
    /// id, then the ids. A row whose lease passed to another relay is left to
    /// that relay, which publishes it again: a duplicate, never a loss.
    pub(crate) fn delete_owned(&self, dialect: Dialect, n: usize) -> String {
        let fast = match dialect {
            Dialect::Sqlite | Dialect::Mysql => String::new(),
            Dialect::Postgres => format!(" AND {ASYNC_COMMIT}"),
        };
        number(dialect, &format!("DELETE FROM {} WHERE claimed_by = ? AND id IN ({}){fast}", self.table, marks(n)))
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
