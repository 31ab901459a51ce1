//! Which table names a store accepts.

use crate::error::{Error, Result};

/// The longest table name a store accepts, in bytes.
///
/// PostgreSQL silently truncates identifiers at 63 bytes, and the stores
/// name their indexes after their table (`{table}_expiry`, `{table}_due`):
/// 63 less the longest suffix (`_expiry`, 7) is what keeps every derived
/// name whole, so two long table names can never share a truncated index
/// name. One limit for both stores, so a name that works for one works for
/// the other.
pub const MAX_TABLE_NAME: usize = 56;

/// Refuse a table name that is not a plain identifier: an ASCII letter or
/// underscore, then letters, digits and underscores, at most
/// [`MAX_TABLE_NAME`] bytes. The name is spliced into SQL text, so anything
/// else is refused rather than quoted; a PostgreSQL schema is chosen with
/// the connection's `search_path`, not a dotted name. `what` names the store
/// in the message ("outbox", "idempotency").
pub(crate) fn table_name(what: &str, table: &str) -> Result<()> {
    let mut chars = table.chars();
    let valid = matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        && table.len() <= MAX_TABLE_NAME;
    if valid {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "{what} table name {table:?} is not a plain identifier: use letters, digits and underscores, \
             starting with a letter or underscore, at most {MAX_TABLE_NAME} bytes (set the schema with search_path)"
        )))
    }
}

/// A table name that may also name its schema, `schema.table`, each part a
/// plain identifier as [`table_name`] takes it: the idempotency store, which
/// may be handed the table of an application's model (ActiveRecord's
/// `payments.acemq_idempotency`). Returns the table's own part, which is
/// what an index is named after: an index lives in its table's schema.
pub(crate) fn qualified_table_name<'a>(what: &str, table: &'a str) -> Result<&'a str> {
    match table.split_once('.') {
        None => table_name(what, table).map(|()| table),
        Some((schema, name)) => {
            if table_name(what, schema).and(table_name(what, name)).is_ok() {
                Ok(name)
            } else {
                Err(Error::invalid(format!(
                    "{what} table name {table:?} is not a plain identifier or schema.table: use letters, digits \
                     and underscores, each part starting with a letter or underscore, at most {MAX_TABLE_NAME} bytes"
                )))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_identifiers_only() {
        for ok in ["acemq_outbox", "_t", "T1", &"a".repeat(MAX_TABLE_NAME)] {
            table_name("outbox", ok).unwrap();
        }
        for bad in ["", "1abc", "a b", "x;DROP TABLE y", "public.t", "é", &"a".repeat(MAX_TABLE_NAME + 1)] {
            let e = table_name("idempotency", bad).unwrap_err();
            assert!(e.is_invalid_argument(), "{bad}");
            assert!(e.message().contains("idempotency table name"), "{e}");
            assert!(e.message().contains("letters, digits and underscores"), "{e}");
        }
    }

    #[test]
    fn the_longest_name_keeps_its_index_names_under_postgres_limit() {
        assert!(MAX_TABLE_NAME + "_expiry".len() <= 63);
        assert!(MAX_TABLE_NAME + "_due".len() <= 63);
    }

    #[test]
    fn a_schema_may_be_named_once() {
        assert_eq!(qualified_table_name("idempotency", "acemq_idempotency").unwrap(), "acemq_idempotency");
        assert_eq!(qualified_table_name("idempotency", "payments.keys").unwrap(), "keys");
        for bad in ["a.b.c", ".t", "t.", "p.1t", "x;DROP.t", "a b.t"] {
            let e = qualified_table_name("idempotency", bad).unwrap_err();
            assert!(e.message().contains("schema.table"), "{bad}: {e}");
        }
    }
}
