//! `amqp://`: RabbitMQ through lapin, with publisher confirms on every
//! publish, bounded prefetch, and acknowledgements coalesced into `multiple`
//! acks when deliveries are settled in order.

use super::queue::DeliveryQueue;
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
    conn: lapin::Connection,
    /// Exchanges known to exist: declared through this connection, or
    /// checked with a passive declare before the first publish to them. A
    /// publish to a missing exchange makes RabbitMQ close the channel, and
    /// publishes already pipelined behind it on that channel can then close
    /// the whole connection (504, "expected 'channel.open'"); checking first,
    /// on a throwaway channel, keeps the publishing channel out of it.
    known_exchanges: std::sync::Mutex<std::collections::HashSet<String>>,
    publish: tokio::sync::Mutex<Option<Channel>>,
    confirm_timeout: Duration,
    endpoint: String,
}

/// The outcome of a publish that has been sent and not yet confirmed.
pub(crate) struct AmqpConfirm {
    confirm: PublisherConfirm,
    timeout: Duration,
}

fn endpoint_of(url: &str) -> String {
    // Never echo the password back in an error message.
    match url.split_once('@') {
        Some((_, rest)) => rest.to_owned(),
        None => url.trim_start_matches("amqp://").to_owned(),
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
    pub(crate) async fn connect(url: &str, connect_timeout: Duration, confirm_timeout: Duration) -> Result<Self> {
        let endpoint = endpoint_of(url);
        let props = ConnectionProperties::default();
        let conn = match tokio::time::timeout(connect_timeout, lapin::Connection::connect(url, props)).await {
            Err(_) => {
                return Err(Error::new(
                    ErrorKind::ConnectionFailed,
                    format!(
                        "could not connect to {endpoint} within {:?}: is RabbitMQ running and reachable? (connect_timeout: sets the limit)",
                        connect_timeout
                    ),
                ))
            }
            Ok(Err(e)) => return Err(connect_error(&e, &endpoint)),
            Ok(Ok(c)) => c,
        };
        Ok(AmqpBackend {
            conn,
            known_exchanges: std::sync::Mutex::new(std::collections::HashSet::new()),
            publish: tokio::sync::Mutex::new(None),
            confirm_timeout,
            endpoint,
        })
    }

    async fn open_channel(&self, confirms: bool) -> Result<Channel> {
        let ch = self.conn.create_channel().await.map_err(|e| map_error(&e, "opening a channel"))?;
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
        if !self.conn.status().connected() {
            return Err(Error::closed(format!("the connection to {} is closed: open a new one", self.endpoint)));
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

    pub(crate) async fn send(&self, exchange: &str, routing_key: &str, body: &[u8], props: &Props) -> Result<AmqpConfirm> {
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
        Ok(AmqpConfirm { confirm, timeout: self.confirm_timeout })
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
            out.extend(done.into_iter().flatten().map(|r| r.map(|confirm| AmqpConfirm { confirm, timeout: self.confirm_timeout })));
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
        let _ = tokio::time::timeout(Duration::from_secs(5), self.conn.close(200, ShortString::from("OK"))).await;
    }

    pub(crate) async fn consume(&self, queue: &str, prefetch: u16) -> Result<AmqpConsumer> {
        let ch = self.open_channel(false).await?;
        ch.basic_qos(prefetch.max(1), BasicQosOptions::default()).await.map_err(|e| map_error(&e, "setting prefetch"))?;
        let consumer = ch
            .basic_consume(ShortString::from(queue), ShortString::from(""), BasicConsumeOptions::default(), FieldTable::default())
            .await
            .map_err(|e| map_error(&e, &format!("consuming from queue '{queue}'")))?;
        let tag = consumer.tag();
        let out = Arc::new(DeliveryQueue::default());
        let feed = out.clone();
        let mut stream = consumer;
        let failure: Arc<Mutex<Option<Error>>> = Arc::new(Mutex::new(None));
        let failure_w = failure.clone();
        crate::runtime::handle().spawn(async move {
            while let Some(item) = stream.next().await {
                match item {
                    Ok(d) => feed.push(RawDelivery {
                        tag: d.delivery_tag,
                        exchange: d.exchange.to_string(),
                        routing_key: d.routing_key.to_string(),
                        redelivered: d.redelivered,
                        body: d.data,
                        props: from_basic_properties(&d.properties),
                    }),
                    Err(e) => {
                        *failure_w.lock().unwrap_or_else(|p| p.into_inner()) = Some(map_error(&e, "consuming"));
                        break;
                    }
                }
            }
            feed.close();
        });
        let acks = Arc::new(AckState {
            inner: Mutex::new(AckInner::default()),
            notify: Notify::new(),
            batch: (usize::from(prefetch.max(1)) / 2).max(1),
        });
        let flusher = spawn_flusher(ch.clone(), acks.clone());
        Ok(AmqpConsumer { channel: ch, tag, out, acks, flusher: Mutex::new(Some(flusher)), failure })
    }

    /// A channel for reading a queue with basic.get (manual acks).
    pub(crate) async fn reader_channel(&self) -> Result<Channel> {
        self.open_channel(false).await
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
            Ok(Ok(Confirmation::Nack(None))) => Err(Error::new(
                ErrorKind::Nacked,
                "the broker nacked the publish (it could not store it): publish again, it was not stored",
            )),
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
        to_field_table(&spec.arguments),
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

/// A subscription on its own channel.
pub(crate) struct AmqpConsumer {
    channel: Channel,
    tag: ShortString,
    pub(crate) out: Arc<DeliveryQueue>,
    acks: Arc<AckState>,
    flusher: Mutex<Option<tokio::task::JoinHandle<()>>>,
    pub(crate) failure: Arc<Mutex<Option<Error>>>,
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
    /// The delivery is done with: acknowledge it (coalesced).
    pub(crate) fn ack(&self, tag: u64) {
        let pending = {
            let mut g = self.acks.lock();
            g.settled.insert(tag);
            g.pending.insert(tag);
            g.pending.len()
        };
        // Wake the flusher for the first of a batch (it starts the
        // MAX_ACK_DELAY clock) and when the batch is full; not in between.
        if pending == 1 || pending >= self.acks.batch {
            self.acks.notify.notify_one();
        }
    }

    /// Put the delivery back on the queue (nothing was copied anywhere).
    pub(crate) async fn requeue(&self, tag: u64) {
        {
            let mut g = self.acks.lock();
            g.settled.insert(tag);
        }
        let _ = self.channel.basic_nack(tag, BasicNackOptions { multiple: false, requeue: true }).await;
        self.acks.notify.notify_one();
    }

    /// Stop new deliveries. What is buffered and not yet handed out goes back
    /// to the queue when the channel closes.
    pub(crate) async fn stop(&self) {
        let _ = tokio::time::timeout(
            Duration::from_secs(5),
            self.channel.basic_cancel(self.tag.clone(), BasicCancelOptions::default()),
        )
        .await;
        self.out.close();
        self.out.drain();
    }

    /// Send the last acks, then close the channel: anything unsettled is
    /// requeued by the broker.
    pub(crate) async fn close(&self) {
        self.acks.lock().closing = true;
        self.acks.notify.notify_one();
        let flusher = self.flusher.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(f) = flusher {
            let _ = tokio::time::timeout(Duration::from_secs(5), f).await;
        }
        if self.channel.status().connected() {
            let _ = tokio::time::timeout(Duration::from_secs(5), self.channel.close(200, ShortString::from("OK"))).await;
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
        b = b.with_headers(to_field_table(&p.headers));
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
    }
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
    t.inner().iter().map(|(k, v)| (k.as_str().to_owned(), from_amqp(v))).collect()
}

fn from_amqp(v: &AMQPValue) -> Value {
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
        AMQPValue::FieldArray(a) => Value::Array(a.as_slice().iter().map(from_amqp).collect()),
        AMQPValue::Timestamp(t) => Value::from(*t),
        AMQPValue::FieldTable(t) => Value::Object(from_field_table(t)),
        AMQPValue::ByteArray(b) => Value::from(String::from_utf8_lossy(b.as_slice()).into_owned()),
        AMQPValue::Void => Value::Null,
    }
}
