//! Reading column values whatever the driver behind the seam hands back:
//! rusqlite gives integers, a Ruby `PG::Connection` without a type map gives
//! every column as text, so each reader accepts both.

use crate::error::{Error, Result};
use crate::sql::SqlValue;

pub(crate) fn int(v: &SqlValue, column: &str) -> Result<i64> {
    match v {
        SqlValue::Int(i) => Ok(*i),
        SqlValue::Real(f) => Ok(*f as i64),
        SqlValue::Text(s) => s.trim().parse::<i64>().or_else(|_| s.trim().parse::<f64>().map(|f| f as i64)).map_err(
            |_| Error::store(format!("dead-letter column {column} holds {s:?}, not an integer: check the table was made by create_schema")),
        ),
        SqlValue::Null => Err(Error::store(format!(
            "dead-letter column {column} is null: check the table was made by create_schema"
        ))),
    }
}

pub(crate) fn text(v: &SqlValue, column: &str) -> Result<String> {
    match v {
        SqlValue::Text(s) => Ok(s.clone()),
        SqlValue::Int(i) => Ok(i.to_string()),
        SqlValue::Real(f) => Ok(f.to_string()),
        SqlValue::Null => Err(Error::store(format!(
            "dead-letter column {column} is null: check the table was made by create_schema"
        ))),
    }
}

pub(crate) fn opt_text(v: &SqlValue, column: &str) -> Result<Option<String>> {
    match v {
        SqlValue::Null => Ok(None),
        other => text(other, column).map(Some),
    }
}

pub(crate) fn column<'a>(row: &'a [SqlValue], index: usize, name: &str) -> Result<&'a SqlValue> {
    row.get(index).ok_or_else(|| {
        Error::store(format!("dead-letter query returned no column {name}: the connection dropped columns from the result"))
    })
}
