//! The SQL the idempotency store runs, for each dialect. Every statement is
//! written once with `?` placeholders (numbered for PostgreSQL by the shared
//! plumbing), so the two dialects differ only in the integer type.
//!
//! A claim, of one key or of a batch, is one statement:
//!
//! ```sql
//! INSERT INTO t (message_id, state, claimed_by, recorded_at, expires_at)
//! VALUES (?, 'CLAIMED', ?, ?, ?), (?, 'CLAIMED', ?, ?, ?), ...
//! ON CONFLICT (message_id) DO UPDATE
//!   SET claimed_by = excluded.claimed_by, recorded_at = excluded.recorded_at, expires_at = excluded.expires_at
//!   WHERE t.state = 'CLAIMED' AND t.recorded_at < ?
//! RETURNING message_id
//! ```
//!
//! A row comes back for each key that is this worker's now: inserted (new)
//! or taken over (a `CLAIMED` row older than the claim timeout). A key that
//! is `CONFIRMED` or claimed less than the timeout ago conflicts, fails the
//! `WHERE` and is not returned. That is the one-key rule ("insert, else take
//! over a stale claim, never a confirmed one") decided by the database row
//! by row; `DO NOTHING` would need a second statement for the takeover. On
//! PostgreSQL the conflicting row is locked and its `WHERE` re-read after a
//! concurrent writer commits, so two workers taking over at once cannot both
//! win (the first moves `recorded_at` to now); SQLite serialises writers.

use crate::sql::placeholders::{marks, number, tuples, MAX_PARAMS};
use crate::sql::Dialect;

pub(crate) const CLAIMED: &str = "CLAIMED";
pub(crate) const CONFIRMED: &str = "CONFIRMED";

/// Parameters per claimed row: key, worker, now, expires.
const CLAIM_PARAMS: usize = 4;

/// Keys per claim statement: `CLAIM_PARAMS` each, plus the stale-before bound.
pub(crate) const CLAIM_ROWS: usize = (MAX_PARAMS - 1) / CLAIM_PARAMS;

/// Keys per confirm statement.
pub(crate) const CONFIRM_ROWS: usize = MAX_PARAMS;

/// The SQL for one table in one dialect; the fixed statements built once.
#[derive(Debug, Clone)]
pub(crate) struct Statements {
    table: String,
    dialect: Dialect,
    pub(crate) create_table: String,
    pub(crate) create_index: String,
    pub(crate) forget: String,
    pub(crate) state: String,
    pub(crate) purge: String,
}

impl Statements {
    /// `t` must be a plain identifier (checked by the options).
    pub(crate) fn new(t: &str, dialect: Dialect) -> Self {
        let int = match dialect {
            Dialect::Sqlite => "INTEGER",
            Dialect::Postgres => "BIGINT",
        };
        let p = |sql: String| number(dialect, &sql);
        Statements {
            table: t.to_owned(),
            dialect,
            create_table: format!(
                "CREATE TABLE IF NOT EXISTS {t} (message_id TEXT NOT NULL PRIMARY KEY, state TEXT NOT NULL, \
                 claimed_by TEXT, recorded_at {int} NOT NULL, expires_at {int} NOT NULL)"
            ),
            create_index: format!("CREATE INDEX IF NOT EXISTS {t}_expiry ON {t} (expires_at)"),
            forget: p(format!("DELETE FROM {t} WHERE message_id = ? AND state = '{CLAIMED}' AND claimed_by = ?")),
            state: p(format!("SELECT state FROM {t} WHERE message_id = ?")),
            purge: p(format!("DELETE FROM {t} WHERE expires_at < ?")),
        }
    }

    /// The claim of `rows` distinct keys (see the module's doc). Parameters:
    /// `rows` times (key, worker, now, expires), then stale-before.
    pub(crate) fn claim(&self, rows: usize) -> String {
        let t = &self.table;
        number(
            self.dialect,
            &format!(
                "INSERT INTO {t} (message_id, state, claimed_by, recorded_at, expires_at) VALUES {} \
                 ON CONFLICT (message_id) DO UPDATE SET claimed_by = excluded.claimed_by, \
                 recorded_at = excluded.recorded_at, expires_at = excluded.expires_at \
                 WHERE {t}.state = '{CLAIMED}' AND {t}.recorded_at < ? RETURNING message_id",
                tuples(&format!("?, '{CLAIMED}', ?, ?, ?"), rows)
            ),
        )
    }

    /// Confirm `rows` keys: one idempotent UPDATE, whatever their state (a
    /// confirm is never refused: the handler did finish).
    pub(crate) fn confirm(&self, rows: usize) -> String {
        number(
            self.dialect,
            &format!("UPDATE {} SET state = '{CONFIRMED}' WHERE message_id IN ({})", self.table, marks(rows)),
        )
    }
}
