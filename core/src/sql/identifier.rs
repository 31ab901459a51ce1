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
}
