//! The one thing the relay needs from a broker connection.

use super::OutboxRecord;
use crate::error::{Error, Result};
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

/// A broker connection publishes a batch the way [`Connection::publish`]
/// would publish each record, except that every record is sent before any
/// confirm is awaited.
///
/// The envelope goes out exactly as it was stored: the id, type, origin,
/// timestamp and headers were fixed when the record was built (by
/// [`Connection::envelope_for`](crate::Connection::envelope_for), the rules every publish follows), and
/// nothing here re-stamps them, so a relayed message is indistinguishable
/// on the wire from a direct one.
///
/// A publish to a missing exchange closes the channel it was sent on, and
/// anything pipelined behind it on that channel fails with it — worse, a
/// publish that reaches the broker after the client acknowledged the close
/// is a connection error (504, "expected 'channel.open'") that takes every
/// channel down with it. So the first record to each exchange of a batch is
/// sent alone and its confirm awaited; the records to an exchange that
/// turned out to be missing are not sent at all (they fail with its 404),
/// and the rest are then sent together. One bad destination costs only its
/// own records, plus one round trip per distinct exchange per batch (none for
/// the default exchange, which always exists).
impl OutboxPublisher for crate::Connection {
    fn publish_batch<'a>(&'a self, records: &'a [OutboxRecord]) -> PublishFuture<'a> {
        Box::pin(async move {
            let mut results: Vec<Option<Result<()>>> = (0..records.len()).map(|_| None).collect();
            let mut probed: Vec<&str> = vec![""];
            let mut missing: Vec<(&str, Error)> = Vec::new();
            for (i, record) in records.iter().enumerate() {
                if probed.contains(&record.exchange.as_str()) {
                    continue;
                }
                probed.push(&record.exchange);
                let result = send_all(self, records, &[i]).await.pop().unwrap_or(Ok(()));
                if let Err(e) = &result {
                    if e.is_not_found() {
                        missing.push((&record.exchange, e.clone()));
                    }
                }
                results[i] = Some(result);
            }
            let mut rest = Vec::new();
            for (i, record) in records.iter().enumerate() {
                if results[i].is_some() {
                    continue;
                }
                match missing.iter().find(|(exchange, _)| *exchange == record.exchange) {
                    Some((_, e)) => results[i] = Some(Err(e.clone())),
                    None => rest.push(i),
                }
            }
            for (i, r) in rest.iter().zip(send_all(self, records, &rest).await) {
                results[*i] = Some(r);
            }
            let results: Vec<Result<()>> = results
                .into_iter()
                .map(|r| r.unwrap_or_else(|| Err(Error::store("this outbox record was not sent; it will be retried"))))
                .collect();
            if results.iter().any(|r| r.is_ok()) {
                fault_point("exit-after-publish");
            }
            results
        })
    }
}

/// Send `records[i]` for every `i` in `which`, then await their confirms
/// together; one result per index, in order.
async fn send_all(conn: &crate::Connection, records: &[OutboxRecord], which: &[usize]) -> Vec<Result<()>> {
    let mut sent = Vec::with_capacity(which.len());
    for &i in which {
        let record = &records[i];
        sent.push(conn.send_json(record.body.as_bytes(), &record.exchange, &record.routing_key, &record.envelope).await);
    }
    let mut results = Vec::with_capacity(sent.len());
    for confirm in sent {
        results.push(match confirm {
            Ok(confirm) => confirm.wait().await,
            Err(e) => Err(e),
        });
    }
    results
}

/// Fault injection for the specs that prove "confirm first, then delete":
/// with `ACEMQ_FAULT_INJECT=exit-after-publish` in its environment a process
/// exits (status 86, no cleanup) right after a batch is confirmed and before
/// its rows are completed, which is the window a crash can hit. Read once;
/// without the variable this is one branch on a cached bool.
fn fault_point(name: &str) {
    static FAULT: once_cell::sync::Lazy<Option<String>> =
        once_cell::sync::Lazy::new(|| std::env::var("ACEMQ_FAULT_INJECT").ok());
    if FAULT.as_deref() == Some(name) {
        std::process::exit(86);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Connection, Envelope, Topology};

    #[tokio::test]
    async fn one_result_per_record_and_a_missing_exchange_fails_alone() {
        let mq = Connection::open("memory://outbox-publisher").await.unwrap();
        mq.apply(&Topology::new().queue("receipts")).await.unwrap();
        let envelope = Envelope::new().with_type("receipt.v1").with_header("tenant", "acme");
        let records = vec![
            OutboxRecord::new("", "receipts", "{\"n\":1}", envelope.clone()),
            OutboxRecord::new("no-such-exchange", "x", "{\"n\":2}", Envelope::new()),
            OutboxRecord::new("", "receipts", "{\"n\":3}", Envelope::new()),
        ];
        let results = mq.publish_batch(&records).await;
        assert_eq!(results.len(), 3);
        assert!(results[0].is_ok() && results[2].is_ok());
        assert!(results[1].as_ref().unwrap_err().is_not_found());

        // Sent as stored: the id, type and headers are the record's own.
        let consumer = mq.consumer("receipts", Default::default()).await.unwrap();
        let first = consumer.next().await.expect("a delivery");
        assert_eq!(first.message.envelope.id, envelope.id);
        assert_eq!(first.message.envelope.kind.as_deref(), Some("receipt.v1"));
        assert_eq!(first.message.envelope.headers.get("tenant"), Some(&serde_json::json!("acme")));
        mq.close().await;
    }
}
