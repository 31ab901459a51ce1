//! What a store is built with: the options of each store and their
//! defaults, in one place, so the Ruby stores (which pass nil for what the
//! user left out) and a Rust service get the same ones, and the rules that
//! refuse what cannot work.

use crate::error::{Error, Result};
use crate::sql::qualified_table_name;
use std::time::Duration;

/// How long a key is remembered when no window is given: the SQL store's
/// default retention, so swapping one for the other in a spec changes nothing.
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(24 * 3600);

/// How long an unfinished claim is honoured by default (as in the SQL store).
pub const DEFAULT_CLAIM_TIMEOUT: Duration = Duration::from_secs(300);

/// The table name when none is given.
pub const DEFAULT_TABLE: &str = "acemq_idempotency";

/// How long a key is remembered by default. It has to be longer than the
/// longest a duplicate can take to arrive: the top rung of the retry ladder,
/// a dead-letter queue drained by hand next week, a replay. A day is a
/// starting point, not an answer.
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(24 * 3600);

/// What the SQL store's `recorded_at` and `expires_at` columns hold (see
/// [`SqlIdempotencyStore::with_time_columns`](super::SqlIdempotencyStore::with_time_columns)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TimeColumns {
    /// Integers, epoch milliseconds: the table `create_schema` makes. An
    /// integer compares the same in every dialect and driver.
    #[default]
    EpochMillis,
    /// Datetimes in UTC, the columns of the guide's ActiveRecord migration
    /// (`t.datetime`): `TIMESTAMP` on PostgreSQL, `DATETIME` on MySQL (whole
    /// seconds unless the column says otherwise), text on SQLite. The store
    /// writes `YYYY-MM-DD HH:MM:SS.ffffff`, as ActiveRecord does with its
    /// default time zone, UTC.
    DatetimeUtc,
}

/// Options for [`SqlIdempotencyStore`](super::SqlIdempotencyStore) and
/// [`AsyncSqlIdempotencyStore`](super::AsyncSqlIdempotencyStore).
#[derive(Debug, Clone, PartialEq)]
pub struct SqlIdempotencyOptions {
    /// The table (default `acemq_idempotency`). A plain identifier (letters,
    /// digits and underscores), or `schema.table`.
    pub table: String,
    /// How long a key is remembered before [`SqlIdempotencyStore::purge_expired`](super::SqlIdempotencyStore::purge_expired)
    /// may remove it (default 24 hours).
    pub retention: Duration,
    /// How long an unfinished claim is honoured (default 300 seconds). Longer
    /// than the slowest handler, or two consumers will work on one message at
    /// once; shorter than anybody's patience, because a consumer killed
    /// mid-handler leaves its claim behind and nothing handles the message
    /// until it expires.
    pub claim_timeout: Duration,
    /// Who claims (`claimed_by`), so that `forget` removes only this worker's
    /// own claim. `None` means `hostname:pid`, read at each call so that a
    /// forked child (Puma, Unicorn) is a different worker from its parent.
    pub worker: Option<String>,
}

impl Default for SqlIdempotencyOptions {
    fn default() -> Self {
        Self {
            table: DEFAULT_TABLE.to_string(),
            retention: DEFAULT_RETENTION,
            claim_timeout: DEFAULT_CLAIM_TIMEOUT,
            worker: None,
        }
    }
}

/// Options for [`InMemoryIdempotencyStore`](super::InMemoryIdempotencyStore).
#[derive(Debug, Clone, PartialEq)]
pub struct InMemoryIdempotencyOptions {
    /// How long a key is remembered after it was claimed (default 24 hours).
    pub window: Duration,
    /// How long an unfinished claim is honoured (default 300 seconds); see
    /// [`SqlIdempotencyOptions::claim_timeout`].
    pub claim_timeout: Duration,
}

impl Default for InMemoryIdempotencyOptions {
    fn default() -> Self {
        Self { window: DEFAULT_WINDOW, claim_timeout: DEFAULT_CLAIM_TIMEOUT }
    }
}

impl InMemoryIdempotencyOptions {
    /// The defaults, with what is given in place of each: what a caller that
    /// leaves options out (the Ruby store's `nil`) builds.
    pub fn with(window: Option<Duration>, claim_timeout: Option<Duration>) -> Self {
        let d = Self::default();
        Self { window: window.unwrap_or(d.window), claim_timeout: claim_timeout.unwrap_or(d.claim_timeout) }
    }

    /// Refuse a zero window (nothing would be remembered: every redelivery
    /// runs again) or a zero claim timeout (every claim is stale at once, so
    /// two consumers run one message together).
    pub(crate) fn validate(&self) -> Result<()> {
        if self.window.is_zero() || self.claim_timeout.is_zero() {
            return Err(Error::invalid(
                "idempotency window and claim_timeout must be longer than zero seconds: a zero window remembers \
                 nothing, a zero claim_timeout lets two consumers run one message at once",
            ));
        }
        Ok(())
    }
}

impl SqlIdempotencyOptions {
    /// The defaults, with what is given in place of each (see
    /// [`InMemoryIdempotencyOptions::with`]).
    pub fn with(table: Option<String>, retention: Option<Duration>, claim_timeout: Option<Duration>, worker: Option<String>) -> Self {
        let d = Self::default();
        Self {
            table: table.unwrap_or(d.table),
            retention: retention.unwrap_or(d.retention),
            claim_timeout: claim_timeout.unwrap_or(d.claim_timeout),
            worker,
        }
    }

    /// Refuse a table name that is not a plain identifier, a zero retention
    /// or claim timeout, an empty worker id.
    pub(crate) fn validate(&self) -> Result<()> {
        qualified_table_name("idempotency", &self.table)?;
        if self.retention.is_zero() || self.claim_timeout.is_zero() {
            return Err(Error::invalid(
                "idempotency retention and claim_timeout must be longer than zero seconds: a zero retention \
                 forgets a key at once, a zero claim_timeout lets two consumers run one message at once",
            ));
        }
        Ok(())
    }
}
