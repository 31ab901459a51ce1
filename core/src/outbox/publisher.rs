//! The one thing the relay needs from a broker connection.

use super::OutboxRecord;
use crate::error::Result;
use std::future::Future;
use std::pin::Pin;

/// The future returned by [`OutboxPublisher::publish_batch`].
pub type PublishFuture<'a> = Pin<Box<dyn Future<Output = Vec<Result<()>>> + Send + 'a>>;

/// The confirms of a batch already sent, one result per record as
/// [`OutboxPublisher::publish_batch`] gives them; owns what it waits on.
pub type Confirms = Pin<Box<dyn Future<Output = Vec<Result<()>>> + Send + 'static>>;

/// The future returned by [`OutboxPublisher::send_batch`].
pub type SendFuture<'a> = Pin<Box<dyn Future<Output = Confirms> + Send + 'a>>;

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

    /// Send `records` and resolve once they are on their way, with the
    /// future of their confirms: what lets a started relay claim its next
    /// batch while this one's confirms come back. Whatever is sent after
    /// this resolves goes out after these records.
    ///
    /// The default publishes the whole batch first, confirms included
    /// (nothing overlaps, which is always correct).
    // Resolving to a future is the point: the confirms, awaited later.
    #[allow(clippy::async_yields_async)]
    fn send_batch<'a>(&'a self, records: &'a [OutboxRecord]) -> SendFuture<'a> {
        Box::pin(async move {
            let results = self.publish_batch(records).await;
            Box::pin(std::future::ready(results)) as Confirms
        })
    }
}

/// A shared publisher is one: an `Arc<dyn OutboxPublisher>` or an `Arc` of
/// a test's publisher that the test goes on reading.
impl<P: OutboxPublisher + ?Sized> OutboxPublisher for std::sync::Arc<P> {
    fn publish_batch<'a>(&'a self, records: &'a [OutboxRecord]) -> PublishFuture<'a> {
        (**self).publish_batch(records)
    }

    #[allow(clippy::async_yields_async)]
    fn send_batch<'a>(&'a self, records: &'a [OutboxRecord]) -> SendFuture<'a> {
        (**self).send_batch(records)
    }
}

/// A broker connection publishes a batch the way [`Connection::publish`](crate::Connection::publish)
/// would publish each record, except that every record is sent before any
/// confirm is awaited.
///
/// The envelope goes out exactly as it was stored: the id, type, origin,
/// timestamp and headers were fixed when the record was built (by
/// [`Connection::envelope_for`](crate::Connection::envelope_for), the rules every publish follows), and
/// nothing here re-stamps them, so a relayed message is indistinguishable
/// on the wire from a direct one.
///
/// A record whose exchange does not exist fails alone with its 404, unsent:
/// the transport checks an exchange before the first publish to it (see
/// `transport::amqp`), because a publish to a missing exchange closes the
/// publishing channel and can take what is pipelined behind it down too.
impl OutboxPublisher for crate::Connection {
    fn publish_batch<'a>(&'a self, records: &'a [OutboxRecord]) -> PublishFuture<'a> {
        Box::pin(async move { self.send_batch(records).await.await })
    }

    #[allow(clippy::async_yields_async)]
    fn send_batch<'a>(&'a self, records: &'a [OutboxRecord]) -> SendFuture<'a> {
        Box::pin(async move {
            let messages: Vec<crate::connection::JsonMessage<'_>> = records
                .iter()
                .map(|r| crate::connection::JsonMessage {
                    body: r.body.as_bytes(),
                    exchange: &r.exchange,
                    routing_key: &r.routing_key,
                    envelope: &r.envelope,
                })
                .collect();
            // Every publish is on the wire (queued to lapin, in order) once
            // this returns; only the confirms are left to wait for.
            let sent = self.send_json_batch(&messages).await;
            Box::pin(async move {
                let mut results = Vec::with_capacity(sent.len());
                for sent in sent {
                    results.push(match sent {
                        Ok(confirm) => confirm.wait().await,
                        Err(e) => Err(e),
                    });
                }
                if results.iter().any(|r: &Result<()>| r.is_ok()) {
                    crate::fault::point("exit-after-publish");
                }
                results
            }) as Confirms
        })
    }
}
