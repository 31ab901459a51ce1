//! One sweep's bookkeeping, written once for every relay: the Rust relay's
//! task and the Ruby relay's thread (whose SQL must run on a Ruby thread, so
//! it drives claim, publish and complete itself) both settle a published
//! batch here and ask it whether to sweep again.

use super::{Completion, OutboxRecord};
use crate::error::Error;

/// What one sweep did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Swept {
    /// Rows claimed.
    pub claimed: usize,
    /// Rows the broker confirmed (and that were then deleted).
    pub confirmed: usize,
    /// Rows that failed and were backed off.
    pub failed: usize,
}

impl Swept {
    /// Whether to sweep again at once rather than wait: a full batch that
    /// all went out means more is waiting. A batch with failures does not:
    /// with the broker gone that would be a busy loop of rows failing one
    /// after another.
    pub fn again(&self, batch_size: usize) -> bool {
        self.claimed >= batch_size && self.failed == 0
    }

    /// Whether to hold back the delete of this sweep's confirmed rows and
    /// fold it into the next claim ([`delete_then_claim`](super::SqlOutboxStore::delete_then_claim)),
    /// which then costs one commit for both: only when that claim comes at
    /// once (`again`, or `woken`: a wake-up arrived while this sweep
    /// published) and nothing failed. The held-back rows stay leased to us,
    /// so no relay publishes them meanwhile; a crash before the next claim
    /// publishes them again after their lease (a duplicate, never a loss),
    /// as a crash before any delete would.
    pub fn defer_delete(&self, batch_size: usize, woken: bool) -> bool {
        self.failed == 0 && self.confirmed > 0 && (self.again(batch_size) || woken)
    }
}

/// A published batch, settled: what to [`complete`](super::SqlOutboxStore::complete)
/// with, and the failures to report.
#[derive(Debug)]
pub struct Settled {
    /// One per record, in the order claimed.
    pub completions: Vec<Completion>,
    /// Each failure with the exchange and routing key of its record.
    pub failures: Vec<(Error, String, String)>,
    /// The counts.
    pub swept: Swept,
}

/// Pair each claimed record with its publish result. A missing result (the
/// publisher returned fewer) is a failure of that record, so it is retried
/// rather than deleted.
pub fn settle(records: &[OutboxRecord], results: Vec<crate::error::Result<()>>) -> Settled {
    let mut results = results.into_iter();
    let mut completions = Vec::with_capacity(records.len());
    let mut failures = Vec::new();
    let mut confirmed = 0;
    for record in records {
        match results.next() {
            Some(Ok(())) => {
                confirmed += 1;
                completions.push(Completion::confirmed(record));
            }
            Some(Err(e)) => {
                completions.push(Completion::failed(record, &e));
                failures.push((e, record.exchange.clone(), record.routing_key.clone()));
            }
            None => {
                let e = Error::store("the outbox publisher returned no result for this record; it will be retried");
                completions.push(Completion::failed(record, &e));
                failures.push((e, record.exchange.clone(), record.routing_key.clone()));
            }
        }
    }
    let swept = Swept { claimed: records.len(), confirmed, failed: failures.len() };
    Settled { completions, failures, swept }
}
