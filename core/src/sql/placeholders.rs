//! Placeholders: every statement is written once with `?` and numbered
//! (`$1`, `$2`, ...) for PostgreSQL, so the dialects differ only where the
//! databases really do.

use super::Dialect;

/// `sql` with its `?` placeholders as `dialect` wants them: unchanged for
/// SQLite, `$1`, `$2`, ... for PostgreSQL; for MySQL the placeholders stay
/// and a double-quoted identifier (`"timestamp"`) is backquoted, because
/// MySQL reads `"timestamp"` as a string literal unless the session has
/// `ANSI_QUOTES`: a `SELECT` would return the word, not the column.
///
/// A plain scan: the stores' statements have no string literal or quoted
/// identifier containing `?` and no string literal containing `"`, which is
/// what makes it exact. Do not pass SQL that does.
pub(crate) fn number(dialect: Dialect, sql: &str) -> String {
    match dialect {
        Dialect::Sqlite => sql.to_owned(),
        Dialect::Mysql => sql.replace('"', "`"),
        Dialect::Postgres => {
            let mut out = String::with_capacity(sql.len() + 8);
            let mut n = 0usize;
            for c in sql.chars() {
                if c == '?' {
                    n += 1;
                    out.push('$');
                    out.push_str(&n.to_string());
                } else {
                    out.push(c);
                }
            }
            out
        }
    }
}

/// `n` placeholders for an `IN (...)` list: `?, ?, ?`.
pub(crate) fn marks(n: usize) -> String {
    let mut out = String::with_capacity(n * 3);
    for i in 0..n {
        if i > 0 {
            out.push_str(", ");
        }
        out.push('?');
    }
    out
}

/// `rows` tuples of `row` for a multi-row `VALUES`: `(?, 'X', ?), (?, 'X', ?)`,
/// where `row` is one tuple's inside (`?, 'X', ?`).
pub(crate) fn tuples(row: &str, rows: usize) -> String {
    let mut out = String::with_capacity((row.len() + 4) * rows);
    for i in 0..rows {
        if i > 0 {
            out.push_str(", ");
        }
        out.push('(');
        out.push_str(row);
        out.push(')');
    }
    out
}

/// At most this many parameters in one statement: SQLite's oldest default
/// limit (999; 3.32 raised it to 32766), PostgreSQL's is 65535. A batch
/// statement is split into chunks that stay under it.
pub(crate) const MAX_PARAMS: usize = 999;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_for_postgres_only() {
        assert_eq!(number(Dialect::Sqlite, "a = ? AND b = ?"), "a = ? AND b = ?");
        assert_eq!(number(Dialect::Postgres, "a = ? AND b IN (?, ?)"), "a = $1 AND b IN ($2, $3)");
        let many = marks(12);
        assert!(number(Dialect::Postgres, &many).ends_with("$11, $12"));
        assert_eq!(number(Dialect::Mysql, "SELECT \"timestamp\" FROM t WHERE a = ?"), "SELECT `timestamp` FROM t WHERE a = ?");
    }

    #[test]
    fn marks_and_tuples() {
        assert_eq!(marks(0), "");
        assert_eq!(marks(3), "?, ?, ?");
        assert_eq!(tuples("?, 'C', ?", 2), "(?, 'C', ?), (?, 'C', ?)");
        assert_eq!(tuples("?", 0), "");
    }
}
