//! Times in the stores' tables: integers, epoch milliseconds.
//!
//! An integer compares the same way in both dialects and every driver,
//! where timestamps come back as strings from `pg`, as text from SQLite and
//! with the session's time zone in between.

use super::Dialect;
use std::time::Duration;

/// `d` in whole milliseconds, saturating at `i64::MAX` (a retention of
/// `Duration::MAX` means forever, not an overflow).
pub(crate) fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// SQL for "now, in epoch milliseconds, by the database's clock", for a
/// store whose writers on several hosts must share one clock (the outbox's
/// leases and backoffs).
pub(crate) fn now_ms(dialect: Dialect) -> &'static str {
    match dialect {
        Dialect::Sqlite => "CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)",
        Dialect::Postgres => "CAST(EXTRACT(EPOCH FROM now()) * 1000 AS BIGINT)",
        // Arithmetic on UTC_TIMESTAMP: UNIX_TIMESTAMP(NOW(3)) goes through
        // the session's time zone and is an hour out in a DST fold.
        Dialect::Mysql => "(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000)",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn millis_saturates() {
        assert_eq!(millis(Duration::from_secs(2)), 2000);
        assert_eq!(millis(Duration::MAX), i64::MAX);
    }
}
