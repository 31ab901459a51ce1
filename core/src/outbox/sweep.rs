//! One sweep's bookkeeping: how a published batch settles and the rules for
//! sweeping again, holding a delete and keeping a batch in flight, which
//! the relay's [`Cycle`](super::Cycle) applies for both of its drivers.

use super::{Completion, Confirms, OutboxRecord};
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

    /// Whether a batch of `sent` rows just sent should be left in flight
    /// while the next batch is claimed, `self` being the sweep of the batch
    /// before it ([`Swept::default`] for none): when it is full (more is
    /// waiting, as [`again`](Self::again) says) and the batch before it had
    /// no failure. After a failure the relay waits for each batch's
    /// confirms before claiming the next, as a relay that does not overlap
    /// would: with the broker gone, claiming ahead only leases rows that
    /// fail.
    pub fn keep_in_flight(&self, sent: usize, batch_size: usize) -> bool {
        sent >= batch_size && self.failed == 0
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

/// A full batch a started relay has sent and not settled yet. While a
/// backlog drains, the relay claims its next batch as soon as this one is
/// sent and settles this one after that claim: the claim (a round trip and
/// the rows' conversion) overlaps the broker's confirms instead of
/// following them. The rows stay leased to
/// this relay until they are settled, so no other relay can pick them, and
/// the next batch goes out after them, so rows still leave in id order.
///
/// Dropped unsettled (the relay's task cancelled, its process killed), the
/// rows stay leased and are published again once the lease runs out: a
/// duplicate, never a loss.
///
/// The relays themselves keep their batch in flight in [`Cycle`](super::Cycle)
/// (the records) and its driver (the confirms), and nothing in the crate or
/// the gem makes one of these: it stays, deprecated, for one release for
/// code outside that drove the store's steps on its own. Its rule is
/// [`Swept::keep_in_flight`].
#[deprecated(
    note = "unused by the relays, which keep their batch in flight in outbox::Cycle; drive a Cycle instead, and read the rule from Swept::keep_in_flight"
)]
pub struct InFlight {
    records: Vec<OutboxRecord>,
    confirms: Confirms,
}

// The deprecated type's own items: no warning for the crate's own use of it.
#[allow(deprecated)]
impl InFlight {
    /// `records` as sent, with the future of their confirms
    /// ([`OutboxPublisher::send_batch`](super::OutboxPublisher::send_batch)).
    pub fn new(records: Vec<OutboxRecord>, confirms: Confirms) -> Self {
        InFlight { records, confirms }
    }

    /// [`Swept::keep_in_flight`]: `previous.keep_in_flight(claimed, batch_size)`.
    pub fn worth_it(claimed: usize, batch_size: usize, previous: &Swept) -> bool {
        previous.keep_in_flight(claimed, batch_size)
    }

    /// Rows in flight.
    pub fn len(&self) -> usize {
        self.records.len()
    }

    /// Whether nothing is in flight (never, for a batch worth keeping).
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// Wait for the confirms and settle them ([`settle`]).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe in that nothing is lost: dropped, the rows stay leased
    /// and are published again after their lease.
    pub async fn settle(self) -> Settled {
        let results = self.confirms.await;
        settle(&self.records, results)
    }
}

#[allow(deprecated)]
impl std::fmt::Debug for InFlight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InFlight").field("rows", &self.records.len()).finish()
    }
}
