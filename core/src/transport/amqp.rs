//! `amqp://`: RabbitMQ through lapin, with publisher confirms on every
//! publish, bounded prefetch, and acknowledgements coalesced into `multiple`
//! acks when deliveries are settled in order.

use super::queue::DeliveryQueue;
use super::tls::Tls;
use crate::error::{Error, ErrorKind, Result};
use crate::headers::Headers;
use crate::topology::{BindingSpec, ExchangeKind as Kind, ExchangeSpec, QueueSpec};
use crate::wire::{Props, RawDelivery};
use futures_lite::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicGetOptions, BasicNackOptions, BasicPublishOptions,
    BasicQosOptions, ConfirmSelectOptions, ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions,
};
use lapin::{Confirmation, PublisherConfirm};
use lapin::types::{AMQPValue, FieldArray, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, ConnectionProperties, ExchangeKind};
use serde_json::{Number, Value};
use std::collections::BTreeSet;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::Duration;
use tokio::sync::Notify;

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
    closed: std::sync::atomic::AtomicBool,
    connect_timeout: Duration,
    /// Exchanges known to exist: declared through this connection, or
    /// checked with a passive declare before the first publish to them. A
    /// publish to a missing exchange makes RabbitMQ close the channel, and
    /// publishes already pipelined behind it on that channel can then close
    /// the whole connection (504, "expected 'channel.open'"); checking first,
    /// on a throwaway channel, keeps the publishing channel out of it.
    known_exchanges: std::sync::Mutex<std::collections::HashSet<String>>,
    publish: Arc<tokio::sync::Mutex<Option<Channel>>>,
    confirm_timeout: Duration,
    /// For the `amqps://` addresses: read once at open, used by every dial.
    tls: Option<Tls>,
}

/// The outcome of a publish that has been sent and not yet confirmed.
pub(crate) struct AmqpConfirm {
    confirm: PublisherConfirm,
    timeout: Duration,
    /// To tell a confirm held back by a broker alarm from one that is lost.
    conn: Arc<lapin::Connection>,
    /// The publishing channel it was sent on, retired on a nack.
    retire: Retire,
}

/// What a nack needs to retire the channel it came on.
#[derive(Clone)]
struct Retire {
    publish: Arc<tokio::sync::Mutex<Option<Channel>>>,
    channel: Channel,
}

impl Retire {
    /// A quorum queue that had no leader when a channel first published to
    /// it can go on nacking everything that channel sends (RabbitMQ 3.10,
    /// seen in the cluster drill: 161 nacks in a row over 21 s after the
    /// leader's node was killed, while a new channel published at once). So
    /// the channel a nack came on is not used again: the next publish opens
    /// a fresh one. The old one is closed once what is still in flight on
    /// it has had its confirm timeout.
    async fn now(self, linger: Duration) {
        let mut guard = self.publish.lock().await;
        if guard.as_ref().is_some_and(|c| c.id() == self.channel.id()) {
            *guard = None;
            drop(guard);
            let old = self.channel;
            crate::runtime::handle().spawn(async move {
                tokio::time::sleep(linger).await;
                if old.status().connected() {
                    let _ = old.close(200, ShortString::from("OK")).await;
                }
            });
        }
    }
}

/// How often a publish waiting for the broker to lift a block looks again.
const BLOCKED_POLL: Duration = Duration::from_millis(25);

fn blocked_error(waited: Duration, sent: bool) -> Error {
    Error::new(
        ErrorKind::Blocked,
        format!(
            "RabbitMQ is blocking publishers on this connection (a memory or disk alarm) and did not lift it within {waited:?}: {}; \
             it lifts when the alarm clears (consumers draining queues, disk freed), and consumers on their own connection keep running",
            if sent { "the message was sent and may be stored once the block lifts" } else { "the message was not sent" }
        ),
    )
}

fn endpoint_of(url: &str) -> String {
    // Never echo the password back in an error message. The last @ ends the
    // user and password: one inside an unencoded password must not leave
    // its tail in the host part.
    match url.rsplit_once('@') {
        Some((_, rest)) => rest.to_owned(),
        None => url.trim_start_matches("amqps://").trim_start_matches("amqp://").to_owned(),
    }
}

pub(crate) fn map_error(e: &lapin::Error, context: &str) -> Error {
    match e.kind() {
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
        let (at, conn) = dial_any(urls, &endpoints, origin, 0, connect_timeout, tls.as_ref()).await?;
        Ok(AmqpBackend {
            urls: urls.to_vec(),
            endpoints,
            at: std::sync::atomic::AtomicUsize::new(at),
            origin: origin.to_owned(),
            conn: Mutex::new(Arc::new(conn)),
            redial: tokio::sync::Mutex::new(()),
            closed: std::sync::atomic::AtomicBool::new(false),
            connect_timeout,
            known_exchanges: std::sync::Mutex::new(std::collections::HashSet::new()),
            publish: Arc::new(tokio::sync::Mutex::new(None)),
            confirm_timeout,
            tls,
        })
    }

    /// Where the current connection goes, for messages.
    fn endpoint(&self) -> &str {
        &self.endpoints[self.at.load(std::sync::atomic::Ordering::Acquire).min(self.endpoints.len() - 1)]
    }

    fn current(&self) -> Arc<lapin::Connection> {
        self.conn.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The connection, dialled again if the broker went away (a restart, a
    /// network cut, a forced close). lapin does not recover on its own; this
    /// is the recovery, done lazily by whoever needs the connection next, so
    /// a publish during an outage fails after `connect_timeout` rather than
    /// hanging, and the first one after it works.
    async fn connection(&self) -> Result<Arc<lapin::Connection>> {
        let c = self.current();
        if c.status().connected() {
            return Ok(c);
        }
        if self.closed.load(std::sync::atomic::Ordering::Acquire) {
            return Err(Error::closed(format!("the connection to {} is closed: open a new one", self.endpoint())));
        }
        let _one_at_a_time = self.redial.lock().await;
        let c = self.current();
        if c.status().connected() {
            return Ok(c);
        }
        // The next address first: the one that was lost is the likeliest to
        // be down (a node stopped, failed over), and the others are the
        // same cluster.
        crate::events::connection("lost", self.endpoint(), None);
        let start = (self.at.load(std::sync::atomic::Ordering::Acquire) + 1) % self.urls.len();
        let (at, fresh) = dial_any(&self.urls, &self.endpoints, &self.origin, start, self.connect_timeout, self.tls.as_ref()).await?;
        self.at.store(at, std::sync::atomic::Ordering::Release);
        let fresh = Arc::new(fresh);
        *self.conn.lock().unwrap_or_else(|p| p.into_inner()) = fresh.clone();
        // What was known of the old broker may not hold for this one.
        self.known().clear();
        crate::events::connection("recovered", self.endpoint(), None);
        Ok(fresh)
    }

    async fn open_channel(&self, confirms: bool) -> Result<Channel> {
        let conn = self.connection().await?;
        let ch = conn.create_channel().await.map_err(|e| map_error(&e, "opening a channel"))?;
        if confirms {
            ch.confirm_select(ConfirmSelectOptions::default()).await.map_err(|e| map_error(&e, "enabling publisher confirms"))?;
        }
        Ok(ch)
    }

    /// The publishing channel, reopened when the broker closed it (a publish
    /// to a missing exchange closes the channel it was sent on).
    async fn publish_channel(&self) -> Result<Channel> {
        let mut guard = self.publish.lock().await;
        if let Some(ch) = guard.as_ref() {
            if ch.status().connected() {
                return Ok(ch.clone());
            }
        }
        if guard.is_some() {
            // The broker closed the last one: something it was sent was
            // refused. Check exchanges again rather than trust the cache.
            self.known().clear();
        }
        let ch = self.open_channel(true).await?;
        *guard = Some(ch.clone());
        Ok(ch)
    }

    fn known(&self) -> std::sync::MutexGuard<'_, std::collections::HashSet<String>> {
        self.known_exchanges.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Remember exchanges that a topology declared.
    pub(crate) fn declared(&self, exchanges: impl IntoIterator<Item = String>) {
        self.known().extend(exchanges);
    }

    /// Make sure `exchange` exists before anything is published to it: the
    /// default exchange always does; a known one is not asked about again.
    async fn check_exchange(&self, exchange: &str) -> Result<()> {
        if exchange.is_empty() || exchange.starts_with("amq.") || self.known().contains(exchange) {
            return Ok(());
        }
        let ch = self.open_channel(false).await?;
        let checked = ch
            .exchange_declare(
                ShortString::from(exchange),
                ExchangeKind::Direct,
                ExchangeDeclareOptions { passive: true, ..Default::default() },
                FieldTable::default(),
            )
            .await
            .map_err(|e| map_error(&e, &format!("publishing to exchange '{exchange}'")));
        if ch.status().connected() {
            let _ = ch.close(200, ShortString::from("OK")).await;
        }
        checked?;
        self.known().insert(exchange.to_owned());
        Ok(())
    }

    /// Whether the broker is blocking publishers on this connection now.
    pub(crate) fn blocked(&self) -> bool {
        self.current().status().blocked()
    }

    /// Wait, up to the confirm timeout, for the broker to lift a block on
    /// this connection: a publish sent into a block sits in the socket
    /// unconfirmed, so it is better not sent, and said so.
    async fn unblocked(&self) -> Result<()> {
        if !self.blocked() {
            return Ok(());
        }
        crate::events::connection("blocked", self.endpoint(), None);
        let start = std::time::Instant::now();
        while self.blocked() {
            if start.elapsed() >= self.confirm_timeout {
                return Err(blocked_error(self.confirm_timeout, false));
            }
            tokio::time::sleep(BLOCKED_POLL).await;
        }
        crate::events::connection("unblocked", self.endpoint(), None);
        Ok(())
    }

    pub(crate) async fn send(&self, exchange: &str, routing_key: &str, body: &[u8], props: &Props) -> Result<AmqpConfirm> {
        self.unblocked().await?;
        self.check_exchange(exchange).await?;
        let ch = self.publish_channel().await?;
        let confirm = ch
            .basic_publish(
                ShortString::from(exchange),
                ShortString::from(routing_key),
                BasicPublishOptions { mandatory: true, immediate: false },
                body,
                to_basic_properties(props),
            )
            .await
            .map_err(|e| map_error(&e, &format!("publishing to exchange '{exchange}'")))?;
        let retire = Retire { publish: self.publish.clone(), channel: ch };
        Ok(AmqpConfirm { confirm, timeout: self.confirm_timeout, conn: self.current(), retire })
    }

    /// Send many on the publishing channel, in order, without waiting for
    /// each to be written before queueing the next. lapin's `basic_publish`
    /// resolves only once its frames are on the socket, so awaiting them one
    /// by one costs a hand-off to lapin's I/O thread and back per message;
    /// polled together, a window of publishes is written in a few writes.
    pub(crate) async fn send_many(&self, items: &[(&str, &str, &[u8], Props)]) -> Vec<Result<AmqpConfirm>> {
        /// Publishes queued before waiting for them to be written: bounds the
        /// memory lapin holds in frames and the cost of re-polling.
        const WINDOW: usize = 256;
        if let Err(e) = self.unblocked().await {
            return items.iter().map(|_| Err(e.clone())).collect();
        }
        // A message to a missing exchange fails here, unsent; the rest go.
        let mut missing: std::collections::HashMap<&str, Error> = std::collections::HashMap::new();
        for (exchange, ..) in items {
            if !missing.contains_key(exchange) {
                if let Err(e) = self.check_exchange(exchange).await {
                    missing.insert(exchange, e);
                }
            }
        }
        if !missing.is_empty() {
            let sendable: Vec<(&str, &str, &[u8], Props)> =
                items.iter().filter(|(ex, ..)| !missing.contains_key(ex)).cloned().collect();
            let mut sent = Box::pin(self.send_many(&sendable)).await.into_iter();
            return items
                .iter()
                .map(|(ex, ..)| match missing.get(ex) {
                    Some(e) => Err(e.clone()),
                    None => sent.next().expect("one result per message sent"),
                })
                .collect();
        }
        let ch = match self.publish_channel().await {
            Ok(ch) => ch,
            Err(e) => return items.iter().map(|_| Err(e.clone())).collect(),
        };
        let mut out = Vec::with_capacity(items.len());
        for window in items.chunks(WINDOW) {
            let mut sends: Vec<_> = window
                .iter()
                .map(|(exchange, routing_key, body, props)| {
                    let ch = &ch;
                    Box::pin(async move {
                        ch.basic_publish(
                            ShortString::from(*exchange),
                            ShortString::from(*routing_key),
                            BasicPublishOptions { mandatory: true, immediate: false },
                            body,
                            to_basic_properties(props),
                        )
                        .await
                        .map_err(|e| map_error(&e, &format!("publishing to exchange '{exchange}'")))
                    })
                })
                .collect();
            let mut done: Vec<Option<Result<PublisherConfirm>>> = (0..sends.len()).map(|_| None).collect();
            // The first pass polls every send once, in order: that is when
            // each takes its delivery tag and queues its frames, so the
            // broker sees them in the order given.
            std::future::poll_fn(|cx| {
                let mut all = true;
                for (send, slot) in sends.iter_mut().zip(done.iter_mut()) {
                    if slot.is_none() {
                        match send.as_mut().poll(cx) {
                            Poll::Ready(r) => *slot = Some(r),
                            Poll::Pending => all = false,
                        }
                    }
                }
                if all {
                    Poll::Ready(())
                } else {
                    Poll::Pending
                }
            })
            .await;
            let conn = self.current();
            let retire = Retire { publish: self.publish.clone(), channel: ch.clone() };
            out.extend(done.into_iter().flatten().map(|r| {
                r.map(|confirm| AmqpConfirm { confirm, timeout: self.confirm_timeout, conn: conn.clone(), retire: retire.clone() })
            }));
        }
        out
    }

    /// Declarations run on a channel of their own: a 406 or 404 closes the
    /// channel it happens on, and it must not be the publishing one.
    pub(crate) async fn with_declare_channel<F, Fut>(&self, f: F) -> Result<()>
    where
        F: FnOnce(Channel) -> Fut,
        Fut: std::future::Future<Output = Result<()>>,
    {
        let ch = self.open_channel(false).await?;
        let result = f(ch.clone()).await;
        if ch.status().connected() {
            let _ = ch.close(200, ShortString::from("OK")).await;
        }
        result
    }

    pub(crate) async fn close(&self) {
        self.closed.store(true, std::sync::atomic::Ordering::Release);
        let conn = self.current();
        if conn.status().connected() {
            let _ = tokio::time::timeout(Duration::from_secs(5), conn.close(200, ShortString::from("OK"))).await;
        }
    }

    /// Subscribe to `queue`. The subscription outlives its channel and its
    /// connection: when the broker takes either away, it subscribes again
    /// (backing off while the broker is unreachable) and goes on feeding the
    /// same delivery queue. Deliveries from the lost channel cannot be
    /// acknowledged any more; the broker has put them back and delivers them
    /// again, which is the redelivery the idempotent consumer is for.
    pub(crate) async fn consume(self: &Arc<Self>, queue: &str, prefetch: u16) -> Result<AmqpConsumer> {
        let (generation, stream) = subscribe(self, queue, prefetch, 1).await?;
        let consumer = AmqpConsumer {
            generation: Arc::new(Mutex::new(generation.clone())),
            out: Arc::new(DeliveryQueue::default()),
            stopped: Arc::new(std::sync::atomic::AtomicBool::new(false)),
            supervisor: Mutex::new(None),
            failure: Arc::new(Mutex::new(None)),
            down_since: Arc::new(Mutex::new(None)),
            resubscribed: Arc::new(std::sync::atomic::AtomicU64::new(0)),
        };
        let task = supervise(
            self.clone(),
            queue.to_owned(),
            prefetch,
            consumer.generation.clone(),
            stream,
            consumer.out.clone(),
            consumer.stopped.clone(),
            consumer.failure.clone(),
            consumer.down_since.clone(),
            consumer.resubscribed.clone(),
        );
        *consumer.supervisor.lock().unwrap_or_else(|p| p.into_inner()) = Some(crate::runtime::handle().spawn(task));
        Ok(consumer)
    }

    /// A channel for reading a queue with basic.get (manual acks).
    pub(crate) async fn reader_channel(&self) -> Result<Channel> {
        self.open_channel(false).await
    }

    /// A passive declare of `queue`: its ready messages and consumers, or
    /// None when it does not exist. On a channel of its own, because the
    /// broker closes the channel that asks about a missing queue; within
    /// the confirm timeout, so a status command never hangs on it.
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
            props: from_basic_properties(&d.properties),
        }
    }))
}

/// Dial each address in turn from `start`, each within `connect_timeout`,
/// and return the first that answers with its index. A refused login is
/// reported as that (the same user is refused everywhere); otherwise what
/// each address said.
async fn dial_any(
    urls: &[String],
    endpoints: &[String],
    origin: &str,
    start: usize,
    connect_timeout: Duration,
    tls: Option<&Tls>,
) -> Result<(usize, lapin::Connection)> {
    let mut failures = Vec::new();
    // Every address failed in TLS: the same certificate problem everywhere
    // (one cluster, one CA), which is what to report, not "unreachable".
    let mut all_tls = true;
    for i in 0..urls.len() {
        let at = (start + i) % urls.len();
        match dial(&urls[at], origin, &endpoints[at], connect_timeout, tls).await {
            Ok(c) => return Ok((at, c)),
            Err(e) if urls.len() == 1 || matches!(e.kind(), ErrorKind::AuthenticationFailed) => return Err(e),
            Err(e) => {
                all_tls &= e.is_tls();
                failures.push(e.to_string());
            }
        }
    }
    Err(Error::new(
        if all_tls { ErrorKind::Tls } else { ErrorKind::ConnectionFailed },
        format!("could not connect to any of {} addresses: {}", urls.len(), failures.join("; ")),
    ))
}

async fn dial(url: &str, origin: &str, endpoint: &str, connect_timeout: Duration, tls: Option<&Tls>) -> Result<lapin::Connection> {
    let properties = ConnectionProperties::default().with_connection_name(origin.into());
    let mut uri = url
        .parse::<lapin::uri::AMQPUri>()
        .map_err(|e| Error::new(ErrorKind::InvalidUrl, format!("cannot parse {endpoint:?} as an AMQP URL ({e})")))?;
    // amqps:// is TLS done by the reactor, under the frame filter (tls.rs);
    // lapin is handed the same address as amqp:// (the port stays what the
    // URL said, or 5671) so that it does not try TLS itself.
    let secure = matches!(uri.scheme, lapin::uri::AMQPScheme::AMQPS);
    let tls_dial = match (secure, tls) {
        (true, Some(tls)) => {
            uri.scheme = lapin::uri::AMQPScheme::AMQP;
            Some(tls.dial(&uri.authority.host)?)
        }
        (true, None) => unreachable!("Backend::open reads the TLS settings for an amqps:// URL"),
        (false, _) => None,
    };
    // Through the frame filter: what another client published must not be
    // able to crash lapin's parser or make it close the connection (see
    // frame_filter.rs). It keeps repaired frames within the frame_max lapin
    // negotiates, which the URL can lower.
    let frame_max = uri.query.frame_max.unwrap_or(0);
    let connect =
        lapin::Connection::connect_uri_with_runtime(uri, properties, super::frame_filter::runtime(frame_max, tls_dial.clone()));
    let outcome = tokio::time::timeout(connect_timeout, connect).await;
    // A TLS failure reaches lapin as an I/O error ("invalid data"): the
    // reason rustls gave is what the caller needs.
    if let (Some(tls), Some(d)) = (tls, &tls_dial) {
        if !matches!(outcome, Ok(Ok(_))) {
            if let Some(failure) = d.failure() {
                return Err(tls.explain(&failure, endpoint, &d.name()));
            }
        }
    }
    match outcome {
        Err(_) => Err(Error::new(
            ErrorKind::ConnectionFailed,
            format!(
                "could not connect to {endpoint} within {connect_timeout:?}: is RabbitMQ running and reachable? (connect_timeout: sets the limit)"
            ),
        )),
        Ok(Err(e)) => Err(connect_error(&e, endpoint)),
        Ok(Ok(c)) => Ok(c),
    }
}

/// Delivery tags are per channel and start again at 1 on a new one, so the
/// tag handed out carries the subscription's generation in its high bits: a
/// settlement for a delivery from a channel that is gone is recognised and
/// dropped (the broker redelivers that message).
const GENERATION_SHIFT: u32 = 40;
const TAG_MASK: u64 = (1 << GENERATION_SHIFT) - 1;

/// The first pause before subscribing again.
const MIN_RESUBSCRIBE_PAUSE: Duration = Duration::from_millis(100);
/// The longest: a broker back after a restart is picked up within this.
const MAX_RESUBSCRIBE_PAUSE: Duration = Duration::from_secs(5);
/// A subscription that lived less than this before its channel went away
/// died young: the next one waits, and the pause keeps growing.
const STABLE_SUBSCRIPTION: Duration = Duration::from_secs(5);

async fn subscribe(backend: &AmqpBackend, queue: &str, prefetch: u16, id: u64) -> Result<(Arc<Generation>, lapin::Consumer)> {
    let ch = backend.open_channel(false).await?;
    ch.basic_qos(prefetch.max(1), BasicQosOptions::default()).await.map_err(|e| map_error(&e, "setting prefetch"))?;
    let stream = ch
        .basic_consume(ShortString::from(queue), ShortString::from(""), BasicConsumeOptions::default(), FieldTable::default())
        .await
        .map_err(|e| map_error(&e, &format!("consuming from queue '{queue}'")))?;
    let acks = Arc::new(AckState {
        inner: Mutex::new(AckInner::default()),
        notify: Notify::new(),
        batch: (usize::from(prefetch.max(1)) / 2).max(1),
    });
    let flusher = spawn_flusher(ch.clone(), acks.clone());
    let generation =
        Arc::new(Generation { id, tag: stream.tag(), channel: ch, acks, flusher: Mutex::new(Some(flusher)) });
    Ok((generation, stream))
}

#[allow(clippy::too_many_arguments)]
async fn supervise(
    backend: Arc<AmqpBackend>,
    queue: String,
    prefetch: u16,
    current: Arc<Mutex<Arc<Generation>>>,
    mut stream: lapin::Consumer,
    out: Arc<DeliveryQueue>,
    stopped: Arc<std::sync::atomic::AtomicBool>,
    failure: Arc<Mutex<Option<Error>>>,
    down_since: Arc<Mutex<Option<std::time::Instant>>>,
    resubscribed: Arc<std::sync::atomic::AtomicU64>,
) {
    use std::sync::atomic::Ordering::Acquire;
    let record = |e: Error| *failure.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
    // The pause before subscribing again. It grows while subscribing fails,
    // and also while fresh subscriptions keep dying young: a message that
    // makes the connection fail as soon as it is delivered would otherwise
    // be a reconnect a few milliseconds apart, for ever.
    let mut pause = MIN_RESUBSCRIBE_PAUSE;
    let mut subscribed_at = std::time::Instant::now();
    'subscription: loop {
        let id = current.lock().unwrap_or_else(|p| p.into_inner()).id;
        while let Some(item) = stream.next().await {
            match item {
                Ok(d) => out.push(RawDelivery {
                    tag: (id << GENERATION_SHIFT) | (d.delivery_tag & TAG_MASK),
                    exchange: d.exchange.to_string(),
                    routing_key: d.routing_key.to_string(),
                    redelivered: d.redelivered,
                    body: d.data,
                    props: from_basic_properties(&d.properties),
                }),
                Err(e) => {
                    record(map_error(&e, &format!("consuming from queue '{queue}'")));
                    break;
                }
            }
        }
        if stopped.load(Acquire) || backend.closed.load(Acquire) {
            break;
        }
        crate::events::subscription_ended(&queue, &failure);
        // The channel or the connection went away under us. Whatever the
        // old channel delivered and we had not acknowledged is the broker's
        // again; retire it and subscribe anew, backing off while it is down.
        current.lock().unwrap_or_else(|p| p.into_inner()).retire();
        // What the lost channel delivered and no handler has taken yet can
        // never be acknowledged: the broker has put it back and will deliver
        // it again. Handing it out now would run it twice for nothing.
        out.drain();
        *down_since.lock().unwrap_or_else(|p| p.into_inner()) = Some(std::time::Instant::now());
        let lived = subscribed_at.elapsed();
        if lived < STABLE_SUBSCRIPTION {
            record(Error::new(
                ErrorKind::Closed,
                format!(
                    "the subscription to '{queue}' died {}ms after subscribing; subscribing again in {}ms",
                    lived.as_millis(),
                    pause.as_millis()
                ),
            ));
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(MAX_RESUBSCRIBE_PAUSE);
        } else {
            pause = MIN_RESUBSCRIBE_PAUSE;
        }
        loop {
            if stopped.load(Acquire) || backend.closed.load(Acquire) {
                break 'subscription;
            }
            match subscribe(&backend, &queue, prefetch, id + 1).await {
                Ok((generation, fresh)) => {
                    *current.lock().unwrap_or_else(|p| p.into_inner()) = generation;
                    *down_since.lock().unwrap_or_else(|p| p.into_inner()) = None;
                    resubscribed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    crate::events::subscription("resubscribed", &queue, None);
                    subscribed_at = std::time::Instant::now();
                    stream = fresh;
                    continue 'subscription;
                }
                Err(e) => {
                    crate::events::subscription("failed", &queue, Some(e.to_string()));
                    record(e);
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(MAX_RESUBSCRIBE_PAUSE);
                }
            }
        }
    }
    out.close();
}

fn connect_error(e: &lapin::Error, endpoint: &str) -> Error {
    if let lapin::ErrorKind::ProtocolError(amqp) = e.kind() {
        if amqp.get_id() == 403 {
            return Error::new(
                ErrorKind::AuthenticationFailed,
                format!("{endpoint} refused the login ({}): check the user and password in the URL", amqp.get_message()),
            );
        }
        if amqp.get_id() == 530 || amqp.get_id() == 402 {
            return Error::new(
                ErrorKind::Broker { reply_code: amqp.get_id() },
                format!("{endpoint} refused the connection ({}): check the vhost in the URL", amqp.get_message()),
            );
        }
    }
    let mut err = map_error(e, &format!("could not connect to {endpoint}"));
    if !matches!(err.kind(), ErrorKind::Broker { .. }) {
        err = Error::new(ErrorKind::ConnectionFailed, format!("{err}: is RabbitMQ running and reachable?"));
    }
    err
}

impl AmqpConfirm {
    pub(crate) async fn wait(self) -> Result<()> {
        match tokio::time::timeout(self.timeout, self.confirm).await {
            Err(_) if self.conn.status().blocked() => Err(blocked_error(self.timeout, true)),
            Err(_) => Err(Error::new(
                ErrorKind::Timeout,
                format!("the broker did not confirm the publish within {:?}; it may or may not have been stored", self.timeout),
            )),
            Ok(Err(e)) => Err(map_error(&e, "waiting for the publish confirm")),
            Ok(Ok(Confirmation::Ack(None))) | Ok(Ok(Confirmation::NotRequested)) => Ok(()),
            Ok(Ok(Confirmation::Ack(Some(returned)))) | Ok(Ok(Confirmation::Nack(Some(returned)))) => Err(Error::new(
                ErrorKind::Unroutable,
                format!(
                    "NO_ROUTE - nothing is bound to exchange '{}' with routing key '{}': the broker returned the message; declare and bind the queue first",
                    returned.delivery.exchange, returned.delivery.routing_key
                ),
            )),
            Ok(Ok(Confirmation::Nack(None))) => {
                self.retire.now(self.timeout).await;
                Err(Error::new(
                    ErrorKind::Nacked,
                    "the broker nacked the publish (it could not store it): publish again (the next publish goes on a fresh channel), it was not stored",
                ))
            }
        }
    }
}

pub(crate) async fn declare_exchange(ch: &Channel, spec: &ExchangeSpec) -> Result<()> {
    let kind = match spec.kind {
        Kind::Direct => ExchangeKind::Direct,
        Kind::Topic => ExchangeKind::Topic,
        Kind::Fanout => ExchangeKind::Fanout,
        Kind::Headers => ExchangeKind::Headers,
    };
    ch.exchange_declare(
        ShortString::from(spec.name.as_str()),
        kind,
        ExchangeDeclareOptions { durable: true, ..Default::default() },
        FieldTable::default(),
    )
    .await
    .map_err(|e| precondition_hint(map_error(&e, &format!("declaring exchange '{}'", spec.name))))
}

pub(crate) async fn declare_queue(ch: &Channel, spec: &QueueSpec) -> Result<()> {
    ch.queue_declare(
        ShortString::from(spec.name.as_str()),
        QueueDeclareOptions { durable: true, ..Default::default() },
        to_field_table(&spec.declared_arguments()),
    )
    .await
    .map(|_| ())
    .map_err(|e| precondition_hint(map_error(&e, &format!("declaring queue '{}'", spec.name))))
}

pub(crate) async fn bind(ch: &Channel, spec: &BindingSpec) -> Result<()> {
    ch.queue_bind(
        ShortString::from(spec.queue.as_str()),
        ShortString::from(spec.exchange.as_str()),
        ShortString::from(spec.routing_key.as_str()),
        QueueBindOptions::default(),
        FieldTable::default(),
    )
    .await
    .map_err(|e| map_error(&e, &format!("binding queue '{}' to exchange '{}'", spec.queue, spec.exchange)))
}

fn precondition_hint(e: Error) -> Error {
    if e.is_precondition_failed() {
        Error::new(
            e.kind().clone(),
            format!(
                "{}: it exists with other arguments; declare it with the same arguments, or delete it by hand once it is drained (acemq never deletes a queue or exchange)",
                e.message()
            ),
        )
    } else {
        e
    }
}

/// A subscription: the channel it is on now (a generation) and the task
/// that feeds its deliveries and subscribes again when the channel is lost.
pub(crate) struct AmqpConsumer {
    generation: Arc<Mutex<Arc<Generation>>>,
    pub(crate) out: Arc<DeliveryQueue>,
    stopped: Arc<std::sync::atomic::AtomicBool>,
    supervisor: Mutex<Option<tokio::task::JoinHandle<()>>>,
    pub(crate) failure: Arc<Mutex<Option<Error>>>,
    /// Since when the subscription has been without a channel (None while
    /// subscribed): what tells a broker that is restarting from a consumer
    /// that will never subscribe again.
    pub(crate) down_since: Arc<Mutex<Option<std::time::Instant>>>,
    /// How many times it has subscribed again after losing its channel.
    pub(crate) resubscribed: Arc<std::sync::atomic::AtomicU64>,
}

/// One channel's worth of a subscription.
struct Generation {
    id: u64,
    tag: ShortString,
    channel: Channel,
    acks: Arc<AckState>,
    flusher: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Generation {
    /// The channel is gone: stop its flusher (nothing it holds can be
    /// acknowledged any more).
    fn retire(&self) {
        self.acks.lock().closing = true;
        self.acks.lock().pending.clear();
        self.acks.notify.notify_one();
    }
}

/// The longest an acceptance waits before it is acknowledged on the wire,
/// when fewer than a batch are pending (a slow or idle consumer). Short
/// enough that a crash duplicates little; long enough that a busy consumer
/// sends one `multiple` ack per batch instead of one frame per message, which
/// on a small machine is what the broker, lapin's I/O thread and the handler
/// threads would otherwise spend their CPU on.
const MAX_ACK_DELAY: Duration = Duration::from_millis(10);

#[derive(Default)]
struct AckInner {
    /// Every tag at or below this is settled.
    floor: u64,
    /// Settled tags above the floor.
    settled: BTreeSet<u64>,
    /// Settled by acceptance and not yet acknowledged on the wire.
    pending: BTreeSet<u64>,
    closing: bool,
}

struct AckState {
    inner: Mutex<AckInner>,
    notify: Notify,
    /// Pending acceptances that are flushed at once: half the prefetch, so
    /// the broker always has room to send the next half while this one is
    /// handled (at most `prefetch` unacknowledged means it never stalls:
    /// once every delivery it sent is settled, `pending` is at least this).
    batch: usize,
}

impl AckState {
    fn lock(&self) -> std::sync::MutexGuard<'_, AckInner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// What to send now: a `multiple` ack up to the contiguous settled run,
    /// and single acks for settled tags beyond a gap (a slow handler on
    /// another thread must not hold back everyone else's acks).
    fn take(&self) -> (Option<u64>, Vec<u64>) {
        let mut g = self.lock();
        while g.settled.first() == Some(&(g.floor + 1)) {
            let next = g.floor + 1;
            g.settled.remove(&next);
            g.floor = next;
        }
        let floor = g.floor;
        let below: Vec<u64> = g.pending.range(..=floor).copied().collect();
        let multiple = below.last().copied();
        for t in &below {
            g.pending.remove(t);
        }
        let singles: Vec<u64> = g.pending.iter().copied().collect();
        g.pending.clear();
        (multiple, singles)
    }
}

fn spawn_flusher(ch: Channel, acks: Arc<AckState>) -> tokio::task::JoinHandle<()> {
    crate::runtime::handle().spawn(async move {
        loop {
            let notified = acks.notify.notified();
            let (pending, closing) = {
                let g = acks.lock();
                (g.pending.len(), g.closing)
            };
            if pending == 0 {
                if closing {
                    return;
                }
                notified.await;
                continue;
            }
            if pending < acks.batch && !closing {
                // A partial batch: wait for the rest, at most MAX_ACK_DELAY.
                tokio::pin!(notified);
                let timer = tokio::time::sleep(MAX_ACK_DELAY);
                tokio::select! {
                    _ = &mut notified => continue,
                    _ = timer => {}
                }
            }
            let (multiple, singles) = acks.take();
            if let Some(tag) = multiple {
                let _ = ch.basic_ack(tag, BasicAckOptions { multiple: true }).await;
            }
            for tag in singles {
                let _ = ch.basic_ack(tag, BasicAckOptions { multiple: false }).await;
            }
        }
    })
}

impl AmqpConsumer {
    /// The generation a tag was handed out under, if it is still current.
    fn live(&self, tag: u64) -> Option<(Arc<Generation>, u64)> {
        let g = self.generation.lock().unwrap_or_else(|p| p.into_inner()).clone();
        (tag >> GENERATION_SHIFT == g.id).then_some((g, tag & TAG_MASK))
    }

    /// The delivery is done with: acknowledge it (coalesced). A delivery from
    /// a channel that has since been lost is not acknowledged anywhere: the
    /// broker has put it back already.
    pub(crate) fn ack(&self, tag: u64) {
        let Some((g, tag)) = self.live(tag) else { return };
        let pending = {
            let mut a = g.acks.lock();
            a.settled.insert(tag);
            a.pending.insert(tag);
            a.pending.len()
        };
        // Wake the flusher for the first of a batch (it starts the
        // MAX_ACK_DELAY clock) and when the batch is full; not in between.
        if pending == 1 || pending >= g.acks.batch {
            g.acks.notify.notify_one();
        }
    }

    /// Put the delivery back on the queue (nothing was copied anywhere).
    pub(crate) async fn requeue(&self, tag: u64) {
        let Some((g, tag)) = self.live(tag) else { return };
        g.acks.lock().settled.insert(tag);
        let _ = g.channel.basic_nack(tag, BasicNackOptions { multiple: false, requeue: true }).await;
        g.acks.notify.notify_one();
    }

    /// Stop new deliveries. What is buffered and not yet handed out goes back
    /// to the queue when the channel closes.
    pub(crate) async fn stop(&self) {
        self.stopped.store(true, std::sync::atomic::Ordering::Release);
        let g = self.generation.lock().unwrap_or_else(|p| p.into_inner()).clone();
        if g.channel.status().connected() {
            let _ = tokio::time::timeout(Duration::from_secs(5), g.channel.basic_cancel(g.tag.clone(), BasicCancelOptions::default())).await;
        }
        self.out.close();
        self.out.drain();
    }

    /// Send the last acks, then close the channel: anything unsettled is
    /// requeued by the broker.
    pub(crate) async fn close(&self) {
        self.stopped.store(true, std::sync::atomic::Ordering::Release);
        let g = self.generation.lock().unwrap_or_else(|p| p.into_inner()).clone();
        g.acks.lock().closing = true;
        g.acks.notify.notify_one();
        let flusher = g.flusher.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(f) = flusher {
            let _ = tokio::time::timeout(Duration::from_secs(5), f).await;
        }
        if g.channel.status().connected() {
            let _ = tokio::time::timeout(Duration::from_secs(5), g.channel.close(200, ShortString::from("OK"))).await;
        }
        let supervisor = self.supervisor.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(task) = supervisor {
            // Its stream ends with the channel; if the broker is away it is
            // backing off, and sees the stop within one pause.
            let _ = tokio::time::timeout(Duration::from_secs(6), task).await;
        }
    }
}

fn to_basic_properties(p: &Props) -> BasicProperties {
    let mut b = BasicProperties::default();
    if let Some(ct) = &p.content_type {
        b = b.with_content_type(ShortString::from(ct.as_str()));
    }
    if let Some(id) = &p.message_id {
        b = b.with_message_id(ShortString::from(id.as_str()));
    }
    if let Some(k) = &p.kind {
        b = b.with_type(ShortString::from(k.as_str()));
    }
    if let Some(a) = &p.app_id {
        b = b.with_app_id(ShortString::from(a.as_str()));
    }
    if let Some(t) = p.timestamp {
        b = b.with_timestamp(t);
    }
    if let Some(c) = &p.correlation_id {
        b = b.with_correlation_id(ShortString::from(c.as_str()));
    }
    if p.persistent {
        b = b.with_delivery_mode(2);
    }
    if !p.headers.is_empty() {
        b = b.with_headers(to_field_table_keeping(&p.headers, p.received.0.as_deref()));
    }
    b
}

fn from_basic_properties(b: &BasicProperties) -> Props {
    let s = |v: &Option<ShortString>| v.as_ref().map(|x| x.as_str().to_owned());
    Props {
        content_type: s(b.content_type()),
        message_id: s(b.message_id()),
        kind: s(b.kind()),
        app_id: s(b.app_id()),
        timestamp: *b.timestamp(),
        correlation_id: s(b.correlation_id()),
        persistent: *b.delivery_mode() == Some(2),
        headers: b.headers().as_ref().map(from_field_table).unwrap_or_default(),
        received: crate::wire::Received(b.headers().as_ref().map(|t| Arc::new(t.clone()))),
    }
}

/// The table for `h`, taking from `received` every value that `h` still
/// has unchanged, as it arrived (see [`Props::received`]).
fn to_field_table_keeping(h: &Headers, received: Option<&FieldTable>) -> FieldTable {
    let Some(received) = received else { return to_field_table(h) };
    let mut t = FieldTable::default();
    for (k, v) in h {
        let kept = received.inner().get(k.as_str()).filter(|orig| from_amqp(orig) == *v);
        t.insert(ShortString::from(k.as_str()), kept.cloned().unwrap_or_else(|| to_amqp(v)));
    }
    t
}

pub(crate) fn to_field_table(h: &Headers) -> FieldTable {
    let mut t = FieldTable::default();
    for (k, v) in h {
        t.insert(ShortString::from(k.as_str()), to_amqp(v));
    }
    t
}

fn to_amqp(v: &Value) -> AMQPValue {
    match v {
        Value::Null => AMQPValue::Void,
        Value::Bool(b) => AMQPValue::Boolean(*b),
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                AMQPValue::LongLongInt(i)
            } else if let Some(u) = n.as_u64() {
                AMQPValue::LongLongInt(u.min(i64::MAX as u64) as i64)
            } else {
                AMQPValue::Double(n.as_f64().unwrap_or(0.0))
            }
        }
        Value::String(s) => AMQPValue::LongString(LongString::from(s.as_bytes().to_vec())),
        Value::Array(a) => AMQPValue::FieldArray(FieldArray::from(a.iter().map(to_amqp).collect::<Vec<_>>())),
        Value::Object(o) => AMQPValue::FieldTable(to_field_table(o)),
    }
}

fn from_field_table(t: &FieldTable) -> Headers {
    table_at(t, 1)
}

/// `t`, a table `depth` levels down. Bounded like what the engine sends
/// ([`crate::limits::MAX_HEADER_DEPTH`]): the frame filter already cuts
/// deeper tables into long strings before lapin parses them, and this keeps
/// the conversion from recursing without end should one get here anyway.
fn table_at(t: &FieldTable, depth: usize) -> Headers {
    t.inner().iter().map(|(k, v)| (k.as_str().to_owned(), value_at(v, depth))).collect()
}

fn from_amqp(v: &AMQPValue) -> Value {
    value_at(v, 1)
}

/// `v`, found in a table or array `depth` levels down.
fn value_at(v: &AMQPValue, depth: usize) -> Value {
    if matches!(v, AMQPValue::FieldArray(_) | AMQPValue::FieldTable(_)) && depth >= crate::limits::MAX_HEADER_DEPTH {
        return Value::from(format!("[nested deeper than {} levels]", crate::limits::MAX_HEADER_DEPTH));
    }
    match v {
        AMQPValue::Boolean(b) => Value::Bool(*b),
        AMQPValue::ShortShortInt(i) => Value::from(*i),
        AMQPValue::ShortShortUInt(i) => Value::from(*i),
        AMQPValue::ShortInt(i) => Value::from(*i),
        AMQPValue::ShortUInt(i) => Value::from(*i),
        AMQPValue::LongInt(i) => Value::from(*i),
        AMQPValue::LongUInt(i) => Value::from(*i),
        AMQPValue::LongLongInt(i) => Value::from(*i),
        AMQPValue::Float(f) => Number::from_f64(*f as f64).map_or(Value::Null, Value::Number),
        AMQPValue::Double(f) => Number::from_f64(*f).map_or(Value::Null, Value::Number),
        AMQPValue::DecimalValue(d) => {
            Number::from_f64(d.value as f64 / 10f64.powi(d.scale as i32)).map_or(Value::Null, Value::Number)
        }
        AMQPValue::ShortString(s) => Value::from(s.as_str()),
        AMQPValue::LongString(s) => Value::from(String::from_utf8_lossy(s.as_bytes()).into_owned()),
        AMQPValue::FieldArray(a) => Value::Array(a.as_slice().iter().map(|x| value_at(x, depth + 1)).collect()),
        AMQPValue::Timestamp(t) => Value::from(*t),
        AMQPValue::FieldTable(t) => Value::Object(table_at(t, depth + 1)),
        AMQPValue::ByteArray(b) => Value::from(String::from_utf8_lossy(b.as_slice()).into_owned()),
        AMQPValue::Void => Value::Null,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn converting_headers_is_bounded_in_depth() {
        // Deeper than the frame filter lets through, built bottom up.
        let mut v = AMQPValue::LongLongInt(1);
        for _ in 0..100 {
            let mut t = FieldTable::default();
            t.insert(ShortString::from("a"), v);
            v = AMQPValue::FieldTable(t);
        }
        let AMQPValue::FieldTable(top) = v else { unreachable!() };
        let mut h = Value::Object(from_field_table(&top));
        let mut levels = 1;
        while let Some(inner) = h.get("a").filter(|x| x.is_object()).cloned() {
            h = inner;
            levels += 1;
        }
        assert_eq!(levels, crate::limits::MAX_HEADER_DEPTH);
        assert_eq!(h["a"], Value::from("[nested deeper than 32 levels]"));
        let p = Props { headers: from_field_table(&top), ..Props::default() };
        assert!(crate::limits::properties(&p).is_ok(), "what it converts to can be sent again");
    }
}
