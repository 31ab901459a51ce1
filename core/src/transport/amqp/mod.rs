//! `amqp://`: RabbitMQ through lapin, with publisher confirms on every
//! publish, bounded prefetch, and acknowledgements coalesced into `multiple`
//! acks when deliveries are settled in order.
//!
//! One concept per file: `redial` (dialling the addresses, and dialling
//! again when the connection is lost), `exchanges` (the cache of exchanges
//! known to exist), `publish` (sending one or a batch, and their confirms),
//! `supervisor` (a subscription that subscribes again when its channel is
//! lost), `feed` (its deliveries, read by the handlers themselves), `declare` (topology declarations), `in_order` (futures run together, in order), `acks` (coalescing
//! acknowledgements into `multiple` acks) and `fields` (AMQP properties and
//! field tables to and from the engine's).

mod acks;
mod declare;
mod delay;
mod exchanges;
mod feed;
mod fields;
#[cfg(feature = "fuzzing")]
pub(crate) use fields::to_basic_properties;
mod in_order;
mod publish;
mod redial;
mod request;
mod supervisor;

pub(crate) use declare::{all, bind, declare_exchange, declare_queue};
pub(crate) use publish::AmqpConfirm;
pub(crate) use supervisor::AmqpConsumer;

use super::tls::Tls;
pub(crate) use fields::from_basic_properties;
use redial::{dial_any, endpoint_of};
use crate::error::{Error, ErrorKind, Result};
use crate::wire::RawDelivery;
use lapin::options::{BasicGetOptions, ConfirmSelectOptions, QueueDeclareOptions};
use lapin::types::{FieldTable, ShortString};
use lapin::Channel;
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub(crate) struct AmqpBackend {
    /// Every address it may dial, in the order given (the nodes of a
    /// cluster, or one broker).
    urls: Vec<String>,
    /// The same without their passwords, for messages.
    endpoints: Vec<String>,
    /// The address of the current connection.
    at: std::sync::atomic::AtomicUsize,
    /// Shown as the connection's name in `rabbitmqctl list_connections` and
    /// the management UI, so an operator can tell whose connection it is.
    origin: String,
    /// The current connection; replaced when the broker went away and a
    /// later call dialled again.
    conn: Mutex<Arc<lapin::Connection>>,
    /// One redial at a time: the first caller to find the connection down
    /// dials, the others wait for it and use what it got.
    redial: tokio::sync::Mutex<()>,
    /// When the connection was last replaced because lapin could not open a
    /// channel for reasons of its own (redial.rs, `create_channel`).
    replaced: Mutex<Option<std::time::Instant>>,
    closed: std::sync::atomic::AtomicBool,
    connect_timeout: Duration,
    /// Exchanges known to exist: declared through this connection, or
    /// checked with a passive declare before the first publish to them. A
    /// publish to a missing exchange makes RabbitMQ close the channel, and
    /// publishes already pipelined behind it on that channel can then close
    /// the whole connection (504, "expected 'channel.open'"); checking first,
    /// on a throwaway channel, keeps the publishing channel out of it.
    known_exchanges: std::sync::Mutex<std::collections::HashSet<String>>,
    /// The broker's `version` server property (`4.3.6`), from the current
    /// connection's connection.start.
    server_version: Mutex<Option<String>>,
    publish: Arc<tokio::sync::Mutex<Option<Channel>>>,
    /// The broker's `max_message_size` once it refused a message for its
    /// size (0 until then): larger ones are refused before they are sent.
    max_message: Arc<std::sync::atomic::AtomicUsize>,
    /// Publishing channels retired after a nack and not yet closed
    /// (publish.rs, `Retire`).
    lingering: Arc<std::sync::atomic::AtomicUsize>,
    confirm_timeout: Duration,
    /// For the `amqps://` addresses: read once at open, used by every dial.
    tls: Option<Tls>,
}

pub(crate) fn map_error(e: &lapin::Error, context: &str) -> Error {
    match e.kind() {
        // 320 CONNECTION_FORCED: the broker closed the whole connection (an
        // operator, a restart, a failover), not refused this call: closed,
        // as a cut is, so a caller's retry on ConnectionError catches it
        // (a publish racing a `rabbitmqctl close_connection` raised
        // BrokerError in a .ci/run).
        lapin::ErrorKind::ProtocolError(amqp) if amqp.get_id() == 320 => {
            Error::new(ErrorKind::Closed, format!("{} ({context})", amqp.get_message()))
        }
        lapin::ErrorKind::ProtocolError(amqp) => {
            let code = amqp.get_id();
            Error::new(ErrorKind::Broker { reply_code: code }, format!("{} ({context})", amqp.get_message()))
        }
        lapin::ErrorKind::IOError(io) => Error::new(ErrorKind::ConnectionFailed, format!("{context}: {io}")),
        lapin::ErrorKind::MissingHeartbeatError => {
            Error::new(ErrorKind::ConnectionFailed, format!("{context}: the broker stopped sending heartbeats"))
        }
        other => Error::new(ErrorKind::Closed, format!("{context}: {other:?}")),
    }
}

impl AmqpBackend {
    pub(crate) async fn connect(
        urls: &[String],
        origin: &str,
        connect_timeout: Duration,
        confirm_timeout: Duration,
        tls: Option<Tls>,
    ) -> Result<Self> {
        let endpoints: Vec<String> = urls.iter().map(|u| endpoint_of(u)).collect();
        let (at, dialed) = dial_any(urls, &endpoints, origin, 0, connect_timeout, tls.as_ref()).await?;
        Ok(AmqpBackend {
            urls: urls.to_vec(),
            endpoints,
            at: std::sync::atomic::AtomicUsize::new(at),
            origin: origin.to_owned(),
            conn: Mutex::new(Arc::new(dialed.conn)),
            server_version: Mutex::new(dialed.version),
            redial: tokio::sync::Mutex::new(()),
            replaced: Mutex::new(None),
            closed: std::sync::atomic::AtomicBool::new(false),
            connect_timeout,
            known_exchanges: std::sync::Mutex::new(std::collections::HashSet::new()),
            publish: Arc::new(tokio::sync::Mutex::new(None)),
            max_message: Default::default(),
            lingering: Default::default(),
            confirm_timeout,
            tls,
        })
    }

    /// The broker's version as the current connection's connection.start
    /// gave it.
    pub(crate) fn server_version(&self) -> Option<String> {
        self.server_version.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Channel ids held on the current connection (lapin's map).
    pub(crate) fn channels_in_use(&self) -> usize {
        self.current().channels_in_use()
    }

    async fn open_channel(&self, confirms: bool) -> Result<Channel> {
        let ch = self.create_channel().await?;
        if confirms {
            ch.confirm_select(ConfirmSelectOptions::default()).await.map_err(|e| map_error(&e, "enabling publisher confirms"))?;
        }
        Ok(ch)
    }

    /// The channel in `slot` while it is open, else a new one put there:
    /// for a run of operations any of which may make the broker close it.
    async fn reuse_channel(&self, slot: &mut Option<Channel>) -> Result<Channel> {
        if let Some(c) = slot.as_ref().filter(|c| c.status().connected()) {
            return Ok(c.clone());
        }
        let c = self.open_channel(false).await?;
        *slot = Some(c.clone());
        Ok(c)
    }

    pub(crate) async fn close(&self) {
        self.closed.store(true, std::sync::atomic::Ordering::Release);
        let conn = self.current();
        if conn.status().connected() {
            let _ = tokio::time::timeout(Duration::from_secs(5), conn.close(200, ShortString::from("OK"))).await;
        }
    }

    /// A channel for reading a queue with basic.get (manual acks).
    pub(crate) async fn reader_channel(&self) -> Result<Channel> {
        self.open_channel(false).await
    }

    /// A passive declare of `queue`: its ready messages and consumers, or
    /// None when it does not exist. On a channel of its own, because the
    /// broker closes the channel that asks about a missing queue; within
    /// the confirm timeout, so a status command never hangs on it.
    /// Counts of each of `queues` by passive declares on one channel,
    /// opened again after a queue that does not exist (the broker closes
    /// the channel on a 404): a channel per queue costs two round trips
    /// more each, which AceMQ::Web's overview of 300 queues felt.
    pub(crate) async fn queue_counts_many(&self, queues: &[String]) -> Result<Vec<Option<super::QueueCounts>>> {
        let mut out = Vec::with_capacity(queues.len());
        let mut ch: Option<Channel> = None;
        for queue in queues {
            let c = self.reuse_channel(&mut ch).await?;
            let declared = tokio::time::timeout(
                self.confirm_timeout,
                c.queue_declare(
                    ShortString::from(queue.as_str()),
                    QueueDeclareOptions { passive: true, ..Default::default() },
                    FieldTable::default(),
                ),
            )
            .await
            .map_err(|_| {
                Error::new(ErrorKind::Timeout, format!("asking the broker about queue '{queue}': no answer within the confirm timeout"))
            });
            let declared = match declared {
                Ok(d) => d,
                Err(e) => {
                    if c.status().connected() {
                        let _ = c.close(200, ShortString::from("OK")).await;
                    }
                    return Err(e);
                }
            };
            match declared {
                Ok(q) => out.push(Some(super::QueueCounts { ready: q.message_count().into(), consumers: q.consumer_count().into() })),
                Err(e) => {
                    let err = map_error(&e, &format!("asking the broker about queue '{queue}'"));
                    if !err.is_not_found() {
                        return Err(err);
                    }
                    out.push(None);
                }
            }
        }
        if let Some(c) = ch {
            if c.status().connected() {
                let _ = c.close(200, ShortString::from("OK")).await;
            }
        }
        Ok(out)
    }

    pub(crate) async fn queue_counts(&self, queue: &str) -> Result<Option<super::QueueCounts>> {
        let ch = self.open_channel(false).await?;
        let declared = tokio::time::timeout(
            self.confirm_timeout,
            ch.queue_declare(
                ShortString::from(queue),
                QueueDeclareOptions { passive: true, ..Default::default() },
                FieldTable::default(),
            ),
        )
        .await;
        if ch.status().connected() {
            let _ = ch.close(200, ShortString::from("OK")).await;
        }
        let declared = declared.map_err(|_| {
            Error::new(ErrorKind::Timeout, format!("asking the broker about queue '{queue}': no answer within the confirm timeout"))
        })?;
        match declared {
            Ok(q) => Ok(Some(super::QueueCounts { ready: q.message_count().into(), consumers: q.consumer_count().into() })),
            Err(e) => {
                let err = map_error(&e, &format!("asking the broker about queue '{queue}'"));
                if err.is_not_found() { Ok(None) } else { Err(err) }
            }
        }
    }
}

impl AmqpBackend {
    /// queue.delete each of `queues`, on one channel.
    pub(crate) async fn delete_queues(&self, queues: &[String]) -> Result<()> {
        let ch = self.open_channel(false).await?;
        for queue in queues {
            ch.queue_delete(ShortString::from(queue.as_str()), lapin::options::QueueDeleteOptions::default())
                .await
                .map_err(|e| map_error(&e, &format!("deleting queue '{queue}'")))?;
        }
        let _ = ch.close(200, ShortString::from("OK")).await;
        Ok(())
    }
}

impl AmqpBackend {
    /// queue.delete each of `queues` that is empty and has no consumer; one
    /// that is not stays (the broker refuses it, and closes the channel:
    /// the next is asked on a new one).
    pub(crate) async fn delete_queues_if_idle(&self, queues: &[String]) -> Result<()> {
        let mut ch: Option<Channel> = None;
        for queue in queues {
            let c = self.reuse_channel(&mut ch).await?;
            let options = lapin::options::QueueDeleteOptions { if_unused: true, if_empty: true, ..Default::default() };
            let _ = c.queue_delete(ShortString::from(queue.as_str()), options).await;
        }
        if let Some(c) = ch.filter(|c| c.status().connected()) {
            let _ = c.close(200, ShortString::from("OK")).await;
        }
        Ok(())
    }
}

/// One message off `queue` with basic.get, left unacknowledged on `ch`.
pub(crate) async fn get(ch: &Channel, queue: &str) -> Result<Option<RawDelivery>> {
    let got = ch
        .basic_get(ShortString::from(queue), BasicGetOptions { no_ack: false })
        .await
        .map_err(|e| map_error(&e, &format!("reading from queue '{queue}'")))?;
    Ok(got.map(|g| {
        let d = g.delivery;
        RawDelivery {
            tag: d.delivery_tag,
            exchange: d.exchange.to_string(),
            routing_key: d.routing_key.to_string(),
            redelivered: d.redelivered,
            body: d.data,
            props: from_basic_properties(d.properties),
        }
    }))
}
