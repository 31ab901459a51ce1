//! The one thing the relay needs from a broker connection.

use super::OutboxRecord;
use crate::error::Result;
use std::future::Future;
use std::pin::Pin;

/// The future returned by [`OutboxPublisher::publish_batch`].
pub type PublishFuture<'a> = Pin<Box<dyn Future<Output = Vec<Result<()>>> + Send + 'a>>;

/// What the relay needs from a connection: publish these records and await
/// their confirms together.
///
/// Awaiting the confirms of a batch together rather than one by one is what
/// makes the relay fast (several times the throughput on a real broker), and
/// per-record results are what let one bad destination fail alone: a record
/// whose exchange does not exist must not hold back the others in its batch.
pub trait OutboxPublisher: Send + Sync {
    /// One result per record, in order: `Ok` once the broker confirmed it.
    ///
    /// A missing result (a shorter vector) is treated as a failure of that
    /// record, so it is retried rather than deleted.
    fn publish_batch<'a>(&'a self, records: &'a [OutboxRecord]) -> PublishFuture<'a>;
}
