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
//!
//! MySQL and MariaDB have no `ON CONFLICT ... WHERE` and MySQL no
//! `RETURNING`, so there the claim is two statements: the same rule as an
//! `ON DUPLICATE KEY UPDATE` whose every assignment keeps the old value
//! unless the row is a stale `CLAIMED` one (InnoDB locks the conflicting row
//! and evaluates them on its latest version, so two takeovers cannot both
//! win), then a `SELECT` of the rows that now hold exactly what this claim
//! wrote. What makes "exactly" exact is `expires_at`: each claim writes its
//! own (now + retention, plus a per-claim number of milliseconds under a
//! second, see `rules.rs`), since two threads of one process share the
//! worker id and may claim in the same millisecond.
//!
//! A MySQL table with datetime columns ([`TimeColumns::DatetimeUtc`], the
//! guide's migration) may keep whole seconds only, so that `SELECT` cannot
//! find a claim by the times it wrote. There a claim is one key at a time:
//! `INSERT IGNORE` (one row changed: inserted; none: the key was there),
//! then, for a key that was there, the takeover as an `UPDATE` whose `WHERE`
//! is the rule (InnoDB re-reads it on the locked row, so of two takeovers
//! one matches). `IGNORE` turns a duplicate key into "no row", and also
//! other errors into warnings: the key's length is checked before.

use crate::sql::placeholders::{marks, number, tuples, MAX_PARAMS};
use super::options::TimeColumns;
use crate::sql::{qualified_table_name, Dialect};

pub(crate) const CLAIMED: &str = "CLAIMED";
pub(crate) const CONFIRMED: &str = "CONFIRMED";

/// Parameters per claimed row: key, worker, now, expires.
const CLAIM_PARAMS: usize = 4;

/// Keys per claim statement: `CLAIM_PARAMS` each, plus the stale-before bound
/// (three times on MySQL: 249 * 4 + 3 = 999).
pub(crate) const CLAIM_ROWS: usize = (MAX_PARAMS - 3) / CLAIM_PARAMS;

/// The longest key a MySQL table holds: `message_id VARBINARY(255)`.
pub(crate) const MYSQL_KEY_BYTES: usize = 255;

/// Keys per confirm statement.
pub(crate) const CONFIRM_ROWS: usize = MAX_PARAMS;

/// The SQL for one table in one dialect; the fixed statements built once.
#[derive(Debug, Clone)]
pub(crate) struct Statements {
    table: String,
    dialect: Dialect,
    /// A time parameter in the SQL: `?`, or on PostgreSQL with datetime
    /// columns the text cast there (a driver that prepares statements would
    /// otherwise type the parameter as a timestamp and refuse text).
    time: &'static str,
    pub(crate) create_table: String,
    /// `None` for MySQL, whose table carries the index: MySQL 8 has no
    /// `CREATE INDEX IF NOT EXISTS`.
    pub(crate) create_index: Option<String>,
    pub(crate) forget: String,
    pub(crate) state: String,
    pub(crate) purge: String,
    /// MySQL with datetime columns: the claim of one key, and its takeover
    /// (see the module's doc); `None` elsewhere.
    pub(crate) claim_one: Option<(String, String)>,
    /// The takeover of a claim whose worker is provably dead (`owner.rs`):
    /// a compare-and-set on the dead worker's id, so that of two takers one
    /// wins and a claim confirmed meanwhile (its handler's commit landing
    /// after its process died) is never touched. Parameters: worker, now,
    /// expires, key, the dead worker.
    pub(crate) take_over: String,
}

impl Statements {
    /// `t` must be a plain identifier or `schema.table` (checked by the
    /// options).
    pub(crate) fn new(t: &str, dialect: Dialect, times: TimeColumns) -> Self {
        let time = match (times, dialect) {
            (TimeColumns::EpochMillis, Dialect::Sqlite) => "INTEGER",
            (TimeColumns::EpochMillis, _) => "BIGINT",
            (TimeColumns::DatetimeUtc, Dialect::Sqlite) => "TEXT",
            (TimeColumns::DatetimeUtc, Dialect::Postgres) => "TIMESTAMP(6)",
            (TimeColumns::DatetimeUtc, Dialect::Mysql) => "DATETIME(6)",
        };
        // An index is named after its table's own part and lives in the
        // table's schema (SQLite names the schema on the index instead).
        let name = qualified_table_name("idempotency", t).unwrap_or(t);
        let index = match (dialect, t.split_once('.')) {
            (Dialect::Sqlite, Some((schema, table))) => {
                format!("CREATE INDEX IF NOT EXISTS {schema}.{name}_expiry ON {table} (expires_at)")
            }
            _ => format!("CREATE INDEX IF NOT EXISTS {name}_expiry ON {t} (expires_at)"),
        };
        let p = |sql: String| number(dialect, &sql);
        let at = match (times, dialect) {
            (TimeColumns::DatetimeUtc, Dialect::Postgres) => "CAST(CAST(? AS TEXT) AS TIMESTAMP)",
            _ => "?",
        };
        let (create_table, create_index) = match dialect {
            // VARBINARY, not VARCHAR: a key is compared byte for byte. A
            // VARCHAR takes the database's collation, which by default folds
            // case ("ABC" = "abc") and pads ("a" = "a "): two different
            // messages would share one key and the second would be dropped as
            // a duplicate. 255 bytes is an AMQP message id's own limit;
            // longer keys are refused before they reach the table.
            Dialect::Mysql => (
                format!(
                    "CREATE TABLE IF NOT EXISTS {t} (message_id VARBINARY({MYSQL_KEY_BYTES}) NOT NULL PRIMARY KEY, \
                     state VARCHAR(16) NOT NULL, claimed_by VARCHAR(255), recorded_at {time} NOT NULL, \
                     expires_at {time} NOT NULL, INDEX {name}_expiry (expires_at)) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4"
                ),
                None,
            ),
            _ => (
                format!(
                    "CREATE TABLE IF NOT EXISTS {t} (message_id TEXT NOT NULL PRIMARY KEY, state TEXT NOT NULL, \
                     claimed_by TEXT, recorded_at {time} NOT NULL, expires_at {time} NOT NULL)"
                ),
                Some(index),
            ),
        };
        Statements {
            table: t.to_owned(),
            dialect,
            time: at,
            create_table,
            create_index,
            forget: p(format!("DELETE FROM {t} WHERE message_id = ? AND state = '{CLAIMED}' AND claimed_by = ?")),
            state: p(format!("SELECT state FROM {t} WHERE message_id = ?")),
            purge: p(format!("DELETE FROM {t} WHERE expires_at < {at}")),
            take_over: p(format!(
                "UPDATE {t} SET claimed_by = ?, recorded_at = {at}, expires_at = {at} \
                 WHERE message_id = ? AND state = '{CLAIMED}' AND claimed_by = ?"
            )),
            claim_one: (dialect == Dialect::Mysql && times == TimeColumns::DatetimeUtc).then(|| {
                (
                    format!(
                        "INSERT IGNORE INTO {t} (message_id, state, claimed_by, recorded_at, expires_at) \
                         VALUES (?, '{CLAIMED}', ?, ?, ?)"
                    ),
                    // Parameters: worker, now, expires, key, stale-before.
                    format!(
                        "UPDATE {t} SET claimed_by = ?, recorded_at = ?, expires_at = ? \
                         WHERE message_id = ? AND state = '{CLAIMED}' AND recorded_at < ?"
                    ),
                )
            }),
        }
    }

    /// The claim of `rows` distinct keys (see the module's doc). Parameters:
    /// `rows` times (key, worker, now, expires), then stale-before (three
    /// times for MySQL, once per assignment).
    pub(crate) fn claim(&self, rows: usize) -> String {
        let (t, at) = (&self.table, self.time);
        if self.dialect == Dialect::Mysql {
            // recorded_at last: MySQL assigns left to right and later
            // conditions would read the new value.
            let keep = |c: &str| format!("{c} = IF(state = '{CLAIMED}' AND recorded_at < ?, VALUES({c}), {c})");
            return format!(
                "INSERT INTO {t} (message_id, state, claimed_by, recorded_at, expires_at) VALUES {} \
                 ON DUPLICATE KEY UPDATE {}, {}, {}",
                tuples(&format!("?, '{CLAIMED}', ?, ?, ?"), rows),
                keep("claimed_by"),
                keep("expires_at"),
                keep("recorded_at")
            );
        }
        number(
            self.dialect,
            &format!(
                "INSERT INTO {t} (message_id, state, claimed_by, recorded_at, expires_at) VALUES {} \
                 ON CONFLICT (message_id) DO UPDATE SET claimed_by = excluded.claimed_by, \
                 recorded_at = excluded.recorded_at, expires_at = excluded.expires_at \
                 WHERE {t}.state = '{CLAIMED}' AND {t}.recorded_at < {at} RETURNING message_id",
                tuples(&format!("?, '{CLAIMED}', ?, {at}, {at}"), rows)
            ),
        )
    }

    /// MySQL's second half of a claim: which of `rows` keys hold what this
    /// claim wrote. Parameters: the keys, then worker, now, expires.
    pub(crate) fn claimed_mysql(&self, rows: usize) -> String {
        format!(
            "SELECT message_id FROM {} WHERE message_id IN ({}) AND state = '{CLAIMED}' AND claimed_by = ? \
             AND recorded_at = ? AND expires_at = ?",
            self.table,
            marks(rows)
        )
    }

    /// The workers of those of `rows` keys that are claimed (not
    /// confirmed): `message_id, claimed_by`. Parameters: the keys.
    pub(crate) fn owners(&self, rows: usize) -> String {
        number(
            self.dialect,
            &format!(
                "SELECT message_id, claimed_by FROM {} WHERE message_id IN ({}) AND state = '{CLAIMED}'",
                self.table,
                marks(rows)
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
