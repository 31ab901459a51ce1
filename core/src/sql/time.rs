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

/// The latest time a datetime column is asked to hold: 9999-12-31
/// 23:59:59.999 UTC, the last millisecond every dialect's datetime takes (a
/// retention of `Duration::MAX`, "forever", ends there).
const LAST_DATETIME_MS: i64 = 253_402_300_799_999;

/// Epoch milliseconds `ms` as the text of a UTC datetime, `YYYY-MM-DD
/// HH:MM:SS.ffffff`: what ActiveRecord writes into a datetime column, so one
/// compares with the other in each dialect (PostgreSQL and MySQL parse it
/// into their timestamp; SQLite keeps datetimes as that text, whose order is
/// time order). Clamped to 1970 ... 9999.
pub(crate) fn datetime_text(ms: i64) -> String {
    let ms = ms.clamp(0, LAST_DATETIME_MS);
    let (days, in_day) = (ms.div_euclid(86_400_000), ms.rem_euclid(86_400_000));
    let (year, month, day) = crate::civil::date(days);
    let (h, m, s, milli) = (in_day / 3_600_000, in_day / 60_000 % 60, in_day / 1000 % 60, in_day % 1000);
    format!("{year:04}-{month:02}-{day:02} {h:02}:{m:02}:{s:02}.{milli:03}000")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn datetime_text_is_utc_civil_time() {
        assert_eq!(datetime_text(0), "1970-01-01 00:00:00.000000");
        // 2024-02-29 12:34:56.789 UTC, a leap day.
        assert_eq!(datetime_text(1_709_210_096_789), "2024-02-29 12:34:56.789000");
        assert_eq!(datetime_text(951_782_400_000), "2000-02-29 00:00:00.000000");
        assert_eq!(datetime_text(i64::MAX), "9999-12-31 23:59:59.999000");
        assert_eq!(datetime_text(-5), "1970-01-01 00:00:00.000000");
        // Text order is time order, across a day, a year, a century.
        let times = [0, 86_399_999, 86_400_000, 946_684_799_999, 946_684_800_000, 4_102_444_800_000];
        for w in times.windows(2) {
            assert!(datetime_text(w[0]) < datetime_text(w[1]));
        }
    }

    #[test]
    fn millis_saturates() {
        assert_eq!(millis(Duration::from_secs(2)), 2000);
        assert_eq!(millis(Duration::MAX), i64::MAX);
    }
}
