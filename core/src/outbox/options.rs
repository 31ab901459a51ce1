//! How a store names its table, leases rows and backs off failures.

use std::time::Duration;

/// Options of a [`SqlOutboxStore`](crate::outbox::SqlOutboxStore).
#[derive(Debug, Clone)]
pub struct OutboxStoreOptions {
    /// The table, a plain identifier. Default `acemq_outbox`.
    pub table: String,
    /// Who this store claims rows as (`claimed_by`). Default `hostname:pid`.
    /// Give each store its own when one process runs several relays: a
    /// completion only touches rows still leased under this name.
    pub worker_id: Option<String>,
    /// How long a claim keeps other relays off a row. It must outlast a
    /// publish with its confirm: a lease that runs out mid-publish lets
    /// another relay publish the same row (a duplicate, never a loss). It is
    /// also how long the rows of a relay that crashed wait before another
    /// relay takes them. Default 60 seconds.
    pub lease: Duration,
    /// The wait after a row's first failure, doubled on every further failure.
    /// Default 1 second.
    pub base_backoff: Duration,
    /// The longest wait between two attempts of a failing row. Default 5 minutes.
    pub max_backoff: Duration,
    /// `last_error` is cut to this many characters, so a long broker message
    /// cannot bloat every failing row. Default 1000.
    pub max_error_length: usize,
}

impl Default for OutboxStoreOptions {
    fn default() -> Self {
        OutboxStoreOptions {
            table: "acemq_outbox".to_owned(),
            worker_id: None,
            lease: Duration::from_secs(60),
            base_backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(300),
            max_error_length: 1000,
        }
    }
}

impl OutboxStoreOptions {
    /// The wait before the next attempt of a row that has now failed
    /// `failures` times (1 after the first failure): base, 2 × base, 4 × base,
    /// ... up to `max_backoff`.
    pub fn backoff(&self, failures: u32) -> Duration {
        let exponent = failures.saturating_sub(1).min(31);
        let wait = self.base_backoff.saturating_mul(1u32 << exponent);
        wait.min(self.max_backoff)
    }
}
