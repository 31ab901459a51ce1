//! Reading column values whatever the driver behind the seam hands back:
//! rusqlite gives integers, a Ruby `PG::Connection` without a type map gives
//! every column as text, so each reader accepts both. One reader for every
//! store's rows (the outbox's, the dead-letter store's); `store` names the
//! table's kind in the error.

use crate::error::{Error, Result};
use crate::sql::SqlValue;

/// The column readers of one store's rows.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Columns(pub(crate) &'static str);

impl Columns {
    fn null(self, column: &str) -> Error {
        Error::store(format!("{} column {column} is null: check the table was made by create_schema", self.0))
    }

    pub(crate) fn int(self, v: &SqlValue, column: &str) -> Result<i64> {
        match v {
            SqlValue::Int(i) => Ok(*i),
            SqlValue::Real(f) => Ok(*f as i64),
            SqlValue::Text(s) => s.trim().parse::<i64>().or_else(|_| s.trim().parse::<f64>().map(|f| f as i64)).map_err(|_| {
                Error::store(format!(
                    "{} column {column} holds {s:?}, not an integer: check the table was made by create_schema",
                    self.0
                ))
            }),
            SqlValue::Null => Err(self.null(column)),
        }
    }

    pub(crate) fn opt_int(self, v: &SqlValue, column: &str) -> Result<Option<i64>> {
        match v {
            SqlValue::Null => Ok(None),
            other => self.int(other, column).map(Some),
        }
    }

    pub(crate) fn text(self, v: &SqlValue, column: &str) -> Result<String> {
        match v {
            SqlValue::Text(s) => Ok(s.clone()),
            SqlValue::Int(i) => Ok(i.to_string()),
            SqlValue::Real(f) => Ok(f.to_string()),
            SqlValue::Null => Err(self.null(column)),
        }
    }

    pub(crate) fn opt_text(self, v: &SqlValue, column: &str) -> Result<Option<String>> {
        match v {
            SqlValue::Null => Ok(None),
            other => self.text(other, column).map(Some),
        }
    }

    pub(crate) fn column<'a>(self, row: &'a [SqlValue], index: usize, name: &str) -> Result<&'a SqlValue> {
        row.get(index).ok_or_else(|| {
            Error::store(format!("{} query returned no column {name}: the connection dropped columns from the result", self.0))
        })
    }
}

/// An optional text parameter: NULL when absent.
pub(crate) fn opt_str(s: Option<&str>) -> SqlValue {
    s.map(|s| SqlValue::Text(s.to_owned())).unwrap_or(SqlValue::Null)
}
