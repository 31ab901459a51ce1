//! The SQL the dead-letter store runs, for each dialect. Written once with
//! `?` placeholders and numbered for PostgreSQL (crate::sql::placeholders),
//! so the dialects differ only where the databases do: the id column, the
//! text types MySQL needs for an index, and how a duplicate is ignored.

use super::Filter;
use crate::error::Result;
use crate::sql::placeholders::{marks, number, tuples};
use crate::sql::{table_name, Dialect, SqlValue};

/// Columns of a row, in the order every SELECT of rows returns them.
pub(crate) const COLUMNS: &str = "id, queue, message_id, content_hash, body, body_encoding, headers, properties, \
     message_type, reason, error_class, attempt, exchange, routing_key, failed_at, ingested_at, history, backtrace";

/// Columns an insert writes, in the order of its parameters.
/// A row no replay holds now (param: now, seconds): never leased, released,
/// or its lease run out (a replay that died).
const NOT_LEASED: &str = "(claimed_by IS NULL OR claimed_until < ?)";

const INSERT_COLUMNS: &str = "queue, message_id, content_hash, body, body_encoding, headers, properties, message_type, \
     reason, error_class, attempt, exchange, routing_key, failed_at, ingested_at, history, backtrace";
pub(crate) const INSERT_PARAMS: usize = 17;

/// Columns of an audit row.
pub(crate) const AUDIT_COLUMNS: &str = "id, created_at, actor, action, queue, detail, affected";

#[derive(Debug, Clone)]
pub(crate) struct Statements {
    pub(crate) table: String,
    pub(crate) audit: String,
}

impl Statements {
    pub(crate) fn new(table: &str, audit: &str) -> Result<Self> {
        table_name("dead-letter", table)?;
        table_name("dead-letter audit", audit)?;
        Ok(Statements { table: table.to_owned(), audit: audit.to_owned() })
    }

    /// The DDL, one statement per element (not every driver runs several in
    /// one call).
    pub(crate) fn create_schema(&self, dialect: Dialect) -> Vec<String> {
        let (t, a) = (&self.table, &self.audit);
        let id = match dialect {
            // AUTOINCREMENT: a plain rowid reuses a deleted last row's id,
            // and a cursor or a replay's snapshot could then name a new row.
            Dialect::Sqlite => "id INTEGER PRIMARY KEY AUTOINCREMENT",
            Dialect::Postgres => "id BIGSERIAL PRIMARY KEY",
            Dialect::Mysql => "id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY",
        };
        let int = if dialect == Dialect::Sqlite { "INTEGER" } else { "BIGINT" };
        // MySQL indexes a VARCHAR, not a TEXT, whole; 255 characters of
        // utf8mb4 is 1,020 bytes, and the unique key's three columns (and
        // the counts' queue, error class and reason) fit InnoDB's 3,072.
        // The store cuts these columns to 255 characters, the reason to 250
        // (1,020 + 1,020 + 1,000 bytes for the counts' index; the headers
        // keep every value whole).
        let short = if dialect == Dialect::Mysql { "VARCHAR(255)" } else { "TEXT" };
        let hash = if dialect == Dialect::Mysql { "CHAR(32)" } else { "TEXT" };
        let reason = if dialect == Dialect::Mysql { "VARCHAR(250)" } else { "TEXT" };
        // MySQL's TEXT holds 64 KiB; a body or its headers may be larger.
        let big = if dialect == Dialect::Mysql { "LONGTEXT" } else { "TEXT" };
        // utf8mb4 so any text is stored; a binary collation so that two
        // message ids that differ only in case are two keys (a case-blind
        // unique index would drop the second as a duplicate).
        let storage = if dialect == Dialect::Mysql { " ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin" } else { "" };
        // Each index answers one way in: the key that makes ingest
        // idempotent; a queue's rows newest first; each equality filter
        // newest first; the time range (and retention by age).
        let indexes = [
            ("key", true, "queue, message_id, content_hash"),
            ("queue", false, "queue, id"),
            ("class", false, "error_class, id"),
            ("type", false, "message_type, id"),
            ("msgid", false, "message_id, id"),
            ("failed", false, "failed_at, id"),
            // The grouped counts read this index alone, in its order; and a
            // `reason` substring filter reads it instead of the rows (a
            // tenth of the bytes), then fetches only the rows that match.
            ("group", false, "queue, error_class, reason"),
        ];
        let inline: String = if dialect == Dialect::Mysql {
            indexes
                .iter()
                .map(|(n, unique, cols)| format!(",\n  {}INDEX {t}_{n} ({cols})", if *unique { "UNIQUE " } else { "" }))
                .collect()
        } else {
            String::new()
        };
        let table = format!(
            "CREATE TABLE IF NOT EXISTS {t} (\n  \
             {id},\n  \
             queue {short} NOT NULL,\n  \
             message_id {short} NOT NULL,\n  \
             content_hash {hash} NOT NULL,\n  \
             body {big} NOT NULL,\n  \
             body_encoding {short} NOT NULL,\n  \
             headers {big} NOT NULL,\n  \
             properties {big} NOT NULL,\n  \
             message_type {short},\n  \
             reason {reason},\n  \
             error_class {short},\n  \
             attempt {int} NOT NULL,\n  \
             exchange {short},\n  \
             routing_key {short},\n  \
             failed_at {int} NOT NULL,\n  \
             ingested_at {int} NOT NULL,\n  \
             history {big},\n  \
             backtrace {big},\n  \
             claimed_by {short},\n  \
             claimed_until {int}{inline}\n){storage}"
        );
        let audit = format!(
            "CREATE TABLE IF NOT EXISTS {a} (\n  \
             {id},\n  \
             created_at {int} NOT NULL,\n  \
             actor {short} NOT NULL,\n  \
             action {short} NOT NULL,\n  \
             queue {short},\n  \
             detail {big} NOT NULL,\n  \
             affected {int} NOT NULL\n){storage}"
        );
        let mut out = vec![table, audit];
        if dialect != Dialect::Mysql {
            for (n, unique, cols) in indexes {
                out.push(format!("CREATE {}INDEX IF NOT EXISTS {t}_{n} ON {t} ({cols})", if unique { "UNIQUE " } else { "" }));
            }
        }
        if dialect == Dialect::Postgres {
            // A reason substring (`ILIKE '%…%'`) is answered by a trigram
            // index, which finds a rare reason without reading every row
            // (bench/README.md has the figures). pg_trgm ships with PostgreSQL and is a
            // trusted extension (13+), so a role that may create tables in
            // the database may create it. Where it cannot (or the operator
            // class is in a schema off the search path), the block says so
            // and goes on: the filter still answers, by a scan.
            out.push(format!(
                "DO $acemq$\nBEGIN\n  \
                 BEGIN\n    CREATE EXTENSION IF NOT EXISTS pg_trgm;\n  \
                 EXCEPTION WHEN OTHERS THEN NULL;\n  END;\n  \
                 BEGIN\n    EXECUTE 'CREATE INDEX IF NOT EXISTS {t}_reason ON {t} USING gin (reason gin_trgm_ops)';\n  \
                 EXCEPTION WHEN OTHERS THEN\n    \
                 RAISE NOTICE 'acemq: no trigram index on {t}.reason (%); a reason filter scans the table', SQLERRM;\n  \
                 END;\nEND\n$acemq$"
            ));
        }
        out
    }

    /// Insert `n` rows, a duplicate of the key ignored (and only that: not
    /// SQLite's `OR IGNORE` or MySQL's `INSERT IGNORE`, which also swallow a
    /// NOT NULL violation or a value cut short).
    pub(crate) fn insert(&self, dialect: Dialect, n: usize) -> String {
        let values = tuples(&marks(INSERT_PARAMS), n);
        let head = format!("INSERT INTO {} ({INSERT_COLUMNS}) VALUES {values}", self.table);
        let sql = match dialect {
            Dialect::Sqlite | Dialect::Postgres => format!("{head} ON CONFLICT (queue, message_id, content_hash) DO NOTHING"),
            Dialect::Mysql => format!("{head} ON DUPLICATE KEY UPDATE id = id"),
        };
        number(dialect, &sql)
    }

    /// `WHERE` text (with a leading ` WHERE ` when anything is set, the
    /// extra conditions anded on) and its parameters.
    pub(crate) fn filter(dialect: Dialect, f: &Filter, extra: &[&str]) -> (String, Vec<SqlValue>) {
        let f = &f.normalized();
        let mut conds: Vec<String> = Vec::new();
        let mut params = Vec::new();
        let mut eq = |col: &str, v: &Option<String>| {
            if let Some(v) = v {
                conds.push(format!("{col} = ?"));
                params.push(SqlValue::Text(super::letter::short(v)));
            }
        };
        eq("queue", &f.queue);
        eq("error_class", &f.error_class);
        eq("message_type", &f.kind);
        eq("message_id", &f.message_id);
        if let Some(r) = &f.reason {
            // `!` escapes: a backslash means something else in a MySQL
            // string literal.
            let pattern = format!("%{}%", r.replace('!', "!!").replace('%', "!%").replace('_', "!_"));
            conds.push(
                match dialect {
                    Dialect::Sqlite => "reason LIKE ? ESCAPE '!'",
                    Dialect::Postgres => "reason ILIKE ? ESCAPE '!'",
                    // The table's collation is binary: compare in a
                    // case-blind one, which costs a row less than folding
                    // both sides with LOWER(): no copy of either is made.
                    Dialect::Mysql => "reason COLLATE utf8mb4_general_ci LIKE ? ESCAPE '!'",
                }
                .to_owned(),
            );
            params.push(SqlValue::Text(super::letter::column_text(&pattern)));
        }
        if let Some(s) = f.since {
            conds.push("failed_at >= ?".into());
            params.push(SqlValue::Int(s));
        }
        if let Some(b) = f.before {
            conds.push("failed_at < ?".into());
            params.push(SqlValue::Int(b));
        }
        conds.extend(extra.iter().map(|e| (*e).to_owned()));
        if conds.is_empty() {
            (String::new(), params)
        } else {
            (format!(" WHERE {}", conds.join(" AND ")), params)
        }
    }

    /// The ids of a page, newest first; params: the filter's, [after id],
    /// limit. Ids alone, so that an index holding every column the filter
    /// reads answers it without touching the rows (see [`Self::rows`]).
    pub(crate) fn page_ids(&self, dialect: Dialect, f: &Filter, after: Option<i64>, limit: usize) -> (String, Vec<SqlValue>) {
        let extra: &[&str] = if after.is_some() { &["id < ?"] } else { &[] };
        let (w, mut params) = Self::filter(dialect, f, extra);
        if let Some(a) = after {
            params.push(SqlValue::Int(a));
        }
        params.push(SqlValue::Int(limit as i64));
        // A substring of the reason is indexed nowhere, and SQLite reads
        // the rows backwards by id (no sort, the page found early), where
        // a rare one reads every wide row. `+id` is not the key's order:
        // it reads the narrow `group` index, which holds the reason, and
        // sorts what matched, which is few when the reason is rare.
        // PostgreSQL's plan was no faster for it, so it is SQLite's.
        let order = if f.reason.is_some() && dialect == Dialect::Sqlite { "+id" } else { "id" };
        (number(dialect, &format!("SELECT id FROM {}{w} ORDER BY {order} DESC LIMIT ?", self.table)), params)
    }

    /// The rows of `n` ids, newest first.
    pub(crate) fn rows(&self, dialect: Dialect, n: usize) -> String {
        number(dialect, &format!("SELECT {COLUMNS} FROM {} WHERE id IN ({}) ORDER BY id DESC", self.table, marks(n)))
    }

    pub(crate) fn find(&self, dialect: Dialect) -> String {
        number(dialect, &format!("SELECT {COLUMNS} FROM {} WHERE id = ?", self.table))
    }

    /// Rows matching, per (queue, error class, reason): one pass, which
    /// the `group` index answers in its own order.
    pub(crate) fn grouped(&self, dialect: Dialect, f: &Filter) -> (String, Vec<SqlValue>) {
        let (w, params) = Self::filter(dialect, f, &[]);
        (
            number(dialect, &format!("SELECT queue, error_class, reason, COUNT(*) FROM {}{w} GROUP BY queue, error_class, reason", self.table)),
            params,
        )
    }

    /// The ids matching, lowest first (a replay's snapshot, a purge's).
    pub(crate) fn ids(&self, dialect: Dialect, f: &Filter) -> (String, Vec<SqlValue>) {
        let (w, params) = Self::filter(dialect, f, &[]);
        (number(dialect, &format!("SELECT id FROM {}{w} ORDER BY id", self.table)), params)
    }

    /// The distinct queues of `n` ids.
    pub(crate) fn queues_of_ids(&self, dialect: Dialect, n: usize) -> String {
        number(dialect, &format!("SELECT DISTINCT queue FROM {} WHERE id IN ({})", self.table, marks(n)))
    }

    /// Delete `n` rows by id, but those a live replay holds (it is sending
    /// them: deleting one would count it discarded and replayed both);
    /// params: now (seconds), then the ids.
    pub(crate) fn delete_ids(&self, dialect: Dialect, n: usize) -> String {
        number(dialect, &format!("DELETE FROM {} WHERE {NOT_LEASED} AND id IN ({})", self.table, marks(n)))
    }

    /// Lease `n` rows to a replay: those no other replay holds. Params:
    /// replay id, until (seconds), now, then the ids.
    pub(crate) fn claim(&self, dialect: Dialect, n: usize) -> String {
        number(
            dialect,
            &format!(
                "UPDATE {} SET claimed_by = ?, claimed_until = ? WHERE (claimed_by IS NULL OR claimed_until < ?) AND id IN ({})",
                self.table,
                marks(n)
            ),
        )
    }

    /// The rows of `n` ids leased to a replay; params: replay id, ids.
    pub(crate) fn claimed(&self, dialect: Dialect, n: usize) -> String {
        number(dialect, &format!("SELECT {COLUMNS} FROM {} WHERE claimed_by = ? AND id IN ({}) ORDER BY id", self.table, marks(n)))
    }

    /// Delete `n` rows a replay sent; params: replay id, ids.
    pub(crate) fn delete_claimed(&self, dialect: Dialect, n: usize) -> String {
        number(dialect, &format!("DELETE FROM {} WHERE claimed_by = ? AND id IN ({})", self.table, marks(n)))
    }

    /// Release rows a replay leased and did not send; params: replay id, ids.
    pub(crate) fn release(&self, dialect: Dialect, n: usize) -> String {
        number(
            dialect,
            &format!("UPDATE {} SET claimed_by = NULL, claimed_until = NULL WHERE claimed_by = ? AND id IN ({})", self.table, marks(n)),
        )
    }

    /// The id of the `?`+1-th newest row (of a queue when `queue`): rows
    /// at or below it are past a count limit. Params: [queue], offset.
    pub(crate) fn nth_newest(&self, dialect: Dialect, queue: bool) -> String {
        let w = if queue { " WHERE queue = ?" } else { "" };
        // MySQL wants LIMIT n OFFSET m with a row count: 1.
        number(dialect, &format!("SELECT id FROM {}{w} ORDER BY id DESC LIMIT 1 OFFSET ?", self.table))
    }

    /// Delete rows at or below an id (of a queue); params: [queue], id.
    pub(crate) fn delete_through(&self, dialect: Dialect, queue: bool) -> String {
        let q = if queue { "queue = ? AND " } else { "" };
        number(dialect, &format!("DELETE FROM {} WHERE {q}id <= ?", self.table))
    }

    /// Delete rows that failed before a time (of a queue); params: [queue], time.
    pub(crate) fn delete_older(&self, dialect: Dialect, queue: bool) -> String {
        let q = if queue { "queue = ? AND " } else { "" };
        number(dialect, &format!("DELETE FROM {} WHERE {q}failed_at < ?", self.table))
    }

    /// Delete what a filter matches.
    /// Delete what `f` matches but the rows a live replay holds (see
    /// [`Self::delete_ids`]); params: the filter's, then now.
    pub(crate) fn purge(&self, dialect: Dialect, f: &Filter, now: i64) -> (String, Vec<SqlValue>) {
        let (w, mut params) = Self::filter(dialect, f, &[NOT_LEASED]);
        params.push(SqlValue::Int(now));
        (number(dialect, &format!("DELETE FROM {}{w}", self.table)), params)
    }

    /// Params: created_at, actor, action, queue, detail, affected.
    pub(crate) fn audit_insert(&self, dialect: Dialect) -> String {
        number(dialect, &format!("INSERT INTO {} (created_at, actor, action, queue, detail, affected) VALUES (?, ?, ?, ?, ?, ?)", self.audit))
    }

    pub(crate) fn audit_list(&self, dialect: Dialect) -> String {
        number(dialect, &format!("SELECT {AUDIT_COLUMNS} FROM {} ORDER BY id DESC LIMIT ?", self.audit))
    }
}
