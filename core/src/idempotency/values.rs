//! Reading what the idempotency statements return, whatever the driver
//! behind the seam hands back: rusqlite and tokio-postgres give text as
//! text, and a Ruby `PG::Connection` without a type map gives every column
//! as text too, so only text is read here.

use crate::error::{Error, Result};
use crate::sql::{Row, SqlValue};

/// Column `i` of `row`, which must be text (`message_id`, `state`).
pub(crate) fn text(row: &Row, i: usize, column: &str) -> Result<String> {
    match row.get(i) {
        Some(SqlValue::Text(s)) => Ok(s.clone()),
        Some(other) => Err(Error::store(format!(
            "idempotency column {column} holds {other:?}, not text: check the table was made by create_schema"
        ))),
        None => Err(Error::store(format!(
            "the idempotency statement returned no {column} column (a bug in the connection adapter?)"
        ))),
    }
}
