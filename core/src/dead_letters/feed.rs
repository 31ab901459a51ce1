//! The DLQ as the ingester reads it: an exclusive subscription to
//! `{queue}.dlq`, taken in batches, acknowledged only after the batch is
//! committed.

use super::NewDeadLetter;
use crate::connection::Connection;
use crate::error::{Error, ErrorKind, Result};
use crate::retry::dlq_name;
use crate::transport::Link;
use std::time::{Duration, Instant};

/// An exclusive subscription to one DLQ.
///
/// Exclusive (basic.consume's flag): while it lives no other consumer may
/// take from the DLQ, in this process or another, on this host or another;
/// a second one is refused ([`DeadLetterFeed::is_taken`]). That is what
/// keeps one ingester per DLQ without a lock of our own: the broker holds
/// it, and lets go when the connection does.
pub struct DeadLetterFeed {
    link: Link,
    queue: String,
    closed: std::sync::atomic::AtomicBool,
}

/// Deliveries taken together, to insert in one transaction and then
/// acknowledge.
#[derive(Debug, Default)]
pub struct Batch {
    /// What each delivery is stored as, in delivery order.
    pub letters: Vec<NewDeadLetter>,
    tags: Vec<u64>,
}

impl Batch {
    /// How many deliveries.
    pub fn len(&self) -> usize {
        self.letters.len()
    }

    /// Whether none came.
    pub fn is_empty(&self) -> bool {
        self.letters.is_empty()
    }
}

impl DeadLetterFeed {
    /// Subscribe to `{queue}.dlq` exclusively, with at most `prefetch`
    /// unacknowledged. Fails with [`DeadLetterFeed::is_taken`] when another
    /// consumer has it.
    pub async fn open(mq: &Connection, queue: &str, prefetch: u16) -> Result<DeadLetterFeed> {
        if queue.is_empty() {
            return Err(Error::invalid("dead-letter ingest needs the work queue whose DLQ to read (\"payments\" reads payments.dlq)"));
        }
        crate::limits::queue(queue)?;
        if prefetch == 0 {
            return Err(Error::invalid("dead-letter ingest prefetch must be at least 1 (200 is the default)"));
        }
        let link = mq.backend().subscribe_with(&dlq_name(queue), prefetch, true).await?;
        Ok(DeadLetterFeed { link, queue: queue.to_owned(), closed: Default::default() })
    }

    /// Whether `e` says another consumer has the DLQ (ACCESS_REFUSED).
    pub fn is_taken(e: &Error) -> bool {
        matches!(e.kind(), ErrorKind::Broker { reply_code: 403 })
    }

    /// The work queue.
    pub fn queue(&self) -> &str {
        &self.queue
    }

    /// Up to `max` deliveries: waits at most `wait` for the first, then at
    /// most `linger` more for the rest. Empty when none came.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: what a dropped call had taken stays unacknowledged and
    /// goes back to the DLQ when the feed closes.
    pub async fn next_batch(&self, max: usize, linger: Duration, wait: Duration) -> Result<Batch> {
        let mut batch = Batch::default();
        let Ok(first) = tokio::time::timeout(wait, self.link.pop()).await else { return Ok(batch) };
        let Some(first) = first else { return Err(self.ended()) };
        let now = crate::dead_letters::rules::now_secs();
        self.take(&mut batch, &first, now);
        let until = Instant::now() + linger;
        while batch.len() < max.max(1) {
            let left = until.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left, self.link.pop()).await {
                Ok(Some(raw)) => self.take(&mut batch, &raw, now),
                Ok(None) => break,
                Err(_) => break,
            }
        }
        Ok(batch)
    }

    fn take(&self, batch: &mut Batch, raw: &crate::wire::RawDelivery, now: i64) {
        batch.letters.push(NewDeadLetter::from_delivery(&self.queue, raw, now));
        batch.tags.push(raw.tag);
    }

    fn ended(&self) -> Error {
        Error::closed(format!("the subscription to {} ended: the connection was closed", dlq_name(&self.queue)))
    }

    /// Acknowledge `batch`: only once it is committed. A delivery of a
    /// channel lost meanwhile is not acknowledged anywhere; the broker has
    /// put it back, and ingesting it again finds its row.
    pub fn ack(&self, batch: &Batch) {
        for tag in &batch.tags {
            self.link.ack(*tag);
        }
    }

    /// Send the last acks and close: what is not acknowledged goes back to
    /// the DLQ, and another ingester may take it. A second close does nothing.
    pub async fn close(&self) {
        if !self.closed.swap(true, std::sync::atomic::Ordering::AcqRel) {
            self.link.close().await;
        }
    }
}
