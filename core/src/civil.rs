//! Calendar dates from day counts, for the few places that print a UTC
//! time without a date crate (a certificate's expiry, a datetime column's
//! text).

/// The proleptic Gregorian date `days` days after 1970-01-01, as (year,
/// month, day): Howard Hinnant's `civil_from_days`.
pub(crate) fn date(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(month <= 2), month, day)
}

#[cfg(test)]
mod tests {
    #[test]
    fn dates_across_leap_days_and_centuries() {
        assert_eq!(super::date(0), (1970, 1, 1));
        assert_eq!(super::date(11_016), (2000, 2, 29));
        assert_eq!(super::date(19_782), (2024, 2, 29));
        assert_eq!(super::date(47_482), (2100, 1, 1));
        assert_eq!(super::date(-1), (1969, 12, 31));
    }
}
