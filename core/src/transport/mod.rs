//! The two transports behind one interface: `amqp://` (RabbitMQ through
//! lapin) and `memory://` (the in-process broker). Everything above this
//! module — publish rules, the retry ladder, dead-lettering — is written once
//! against one private `Backend` and behaves the same on both.

pub(crate) mod amqp;
mod frame_filter;
#[cfg(feature = "fuzzing")]
pub(crate) use frame_filter::Filtered;
pub mod memory;
pub(crate) mod queue;
#[cfg(feature = "tls")]
pub(crate) mod tls;
// Without the `tls` feature: the same names, and amqps:// refused.
#[cfg(not(feature = "tls"))]
#[path = "tls_off.rs"]
pub(crate) mod tls;
mod tls_options;

pub use tls_options::TlsOptions;
use crate::error::{Error, ErrorKind, Result};
use crate::topology::Topology;
use crate::wire::{Props, RawDelivery};
use memory::MemoryBroker;
use queue::DeliveryQueue;
use std::sync::Arc;
use std::time::Duration;

pub(crate) enum Backend {
    Amqp(Arc<amqp::AmqpBackend>),
    Memory(Arc<MemoryBroker>),
}

/// A publish that has been sent; [`Confirm::wait`] resolves when the broker
/// has confirmed it (or refused it).
pub struct Confirm(ConfirmInner, tracing::Span, Option<Box<Watch>>);

/// What the `publish` event needs, kept only while somebody listens.
struct Watch {
    sent: std::time::Instant,
    exchange: String,
    routing_key: String,
    message_id: String,
}

enum ConfirmInner {
    Ready(Result<()>),
    Amqp(amqp::AmqpConfirm),
}

impl Confirm {
    /// Wait for every one of `confirms` (each a publish sent, or the reason
    /// it was not), in order. Returns how many there were, or the first
    /// failure once every confirm has been waited for, so that what did go
    /// out is known to have gone out: the rule for a batch and a stream.
    ///
    /// # Cancel safety
    ///
    /// As [`Confirm::wait`]: a dropped future loses only answers.
    pub async fn wait_all(confirms: impl IntoIterator<Item = Result<Confirm>>) -> Result<usize> {
        let mut n = 0;
        let mut first_error = None;
        for c in confirms {
            n += 1;
            let r = match c {
                Ok(c) => c.wait().await,
                Err(e) => Err(e),
            };
            if let (Err(e), None) = (r, &first_error) {
                first_error = Some(e);
            }
        }
        first_error.map_or(Ok(n), Err)
    }

    /// Wait for the broker's verdict.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe in the sense that dropping it loses only the answer, not
    /// the message: it has been sent, and the broker stores it or not
    /// whether anyone waits.
    pub async fn wait(self) -> Result<()> {
        use tracing::Instrument;
        let span = self.1;
        let result = match self.0 {
            ConfirmInner::Ready(r) => r,
            ConfirmInner::Amqp(c) => c.wait().instrument(span.clone()).await,
        };
        if let Err(e) = &result {
            span.record("error.type", tracing::field::debug(e.kind()));
        }
        if let Some(w) = self.2 {
            crate::events::emit(|| crate::events::Event::Publish(crate::events::Publish {
                exchange: w.exchange,
                routing_key: w.routing_key,
                message_id: w.message_id,
                duration: w.sent.elapsed(),
                outcome: if result.is_ok() { "confirmed" } else { "failed" },
                error: result.as_ref().err().map(|e| e.to_string()),
            }));
        }
        result
    }

    /// Report this publish as a `publish` event when its confirm is awaited
    /// (only while somebody listens: otherwise nothing is kept).
    pub(crate) fn watched(mut self, exchange: &str, routing_key: &str, message_id: &str) -> Confirm {
        if crate::events::enabled() {
            self.2 = Some(Box::new(Watch {
                sent: std::time::Instant::now(),
                exchange: exchange.to_owned(),
                routing_key: routing_key.to_owned(),
                message_id: message_id.to_owned(),
            }));
        }
        self
    }

    /// The same confirm, ending `span` (the publish span) when it resolves.
    pub(crate) fn in_span(self, span: tracing::Span) -> Confirm {
        Confirm(self.0, span, self.2)
    }
}

/// What a passive queue declare tells about a queue: the messages ready
/// for a consumer and the consumers attached. AMQP has no count of the
/// unacknowledged (that is the management API's, or `rabbitmqctl`'s).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueCounts {
    /// Waiting for a consumer.
    pub ready: u64,
    /// Consumers subscribed to it now, on any connection.
    pub consumers: u64,
}

pub(crate) enum Link {
    Amqp(amqp::AmqpConsumer),
    Memory { broker: Arc<MemoryBroker>, id: u64, out: Arc<DeliveryQueue> },
}

impl Link {
    /// The next delivery; None once stopped. Cancel safe.
    pub(crate) async fn pop(&self) -> Option<crate::wire::RawDelivery> {
        match self {
            Link::Amqp(c) => c.pop().await,
            Link::Memory { out, .. } => out.pop().await,
        }
    }

    /// The next delivery, waiting at most `timeout` on a thread outside
    /// the runtime.
    pub(crate) fn pop_blocking(&self, timeout: std::time::Duration) -> queue::Pop<Arc<crate::wire::RawDelivery>> {
        match self {
            Link::Amqp(c) => c.pop_blocking(timeout),
            Link::Memory { out, .. } => match out.pop_blocking(timeout) {
                queue::Pop::Item(d) => queue::Pop::Item(Arc::new(d)),
                queue::Pop::Empty => queue::Pop::Empty,
                queue::Pop::Closed => queue::Pop::Closed,
            },
        }
    }

    /// Stopped: a pop would say so. What a wait for something else (the
    /// throttle's next token) looks at, so a stopped consumer is not held
    /// until that token comes.
    pub(crate) fn is_closed(&self) -> bool {
        match self {
            Link::Amqp(c) => c.is_closed(),
            Link::Memory { out, .. } => out.is_closed(),
        }
    }

    /// Wake every thread blocked in `pop_blocking` (they return `Empty`).
    pub(crate) fn wake_all(&self) {
        match self {
            Link::Amqp(c) => c.wake_all(),
            Link::Memory { out, .. } => out.wake_all(),
        }
    }

    pub(crate) fn ack(&self, tag: u64) {
        match self {
            Link::Amqp(c) => c.ack(tag),
            Link::Memory { broker, id, .. } => broker.ack(*id, tag),
        }
    }

    pub(crate) async fn requeue(&self, tag: u64) {
        match self {
            Link::Amqp(c) => c.requeue(tag).await,
            Link::Memory { broker, id, .. } => broker.requeue(*id, tag),
        }
    }

    /// `cancel`: cancel the consumer on the broker (false: only stop
    /// handing out; the close gives back what is held).
    pub(crate) async fn stop(&self, cancel: bool) {
        match self {
            Link::Amqp(c) => c.stop(cancel).await,
            Link::Memory { out, .. } => {
                // As on RabbitMQ: what was delivered and not yet handed to a
                // handler is not run; it stays unacknowledged until close,
                // which gives it back to the queue marked redelivered.
                out.close();
                out.drain();
            }
        }
    }

    /// Take nothing more and give back what is buffered and not handed
    /// out (see [`crate::Consumer::pause`]).
    pub(crate) async fn pause(&self) {
        match self {
            Link::Amqp(c) => c.pause().await,
            Link::Memory { broker, id, .. } => broker.pause(*id),
        }
    }

    /// Hand nothing more out, and keep what is buffered (the first step of
    /// [`Link::pause_closing`]).
    pub(crate) fn hold(&self) {
        if let Link::Amqp(c) = self {
            c.hold();
        }
    }

    /// Pause by closing the channel (the broker requeues what it held, in
    /// order); the subscription comes back paused. memory:// has no single
    /// active consumer: the same as [`Link::pause`] there.
    pub(crate) async fn pause_closing(&self) {
        match self {
            Link::Amqp(c) => c.pause_closing().await,
            Link::Memory { broker, id, .. } => broker.pause(*id),
        }
    }

    /// Take deliveries again after [`Link::pause`].
    pub(crate) async fn resume(&self) -> Result<()> {
        match self {
            Link::Amqp(c) => c.resume().await,
            Link::Memory { broker, id, .. } => {
                broker.resume(*id);
                Ok(())
            }
        }
    }

    pub(crate) async fn close(&self) {
        match self {
            Link::Amqp(c) => c.close().await,
            Link::Memory { broker, id, .. } => broker.cancel(*id),
        }
    }

    /// How many times the subscription has subscribed again after a loss.
    pub(crate) fn resubscriptions(&self) -> u64 {
        match self {
            Link::Amqp(c) => c.resubscribed.load(std::sync::atomic::Ordering::Relaxed),
            Link::Memory { .. } => 0,
        }
    }

    /// How long the subscription has been without a channel, if it is.
    pub(crate) fn down_for(&self) -> Option<std::time::Duration> {
        match self {
            Link::Amqp(c) => c.down_since.lock().unwrap_or_else(|p| p.into_inner()).map(|t| t.elapsed()),
            Link::Memory { .. } => None,
        }
    }

    /// Why the subscription ended, when the broker ended it.
    pub(crate) fn failure(&self) -> Option<Error> {
        match self {
            Link::Amqp(c) => c.failure.lock().unwrap_or_else(|p| p.into_inner()).clone(),
            Link::Memory { .. } => None,
        }
    }
}

/// `url` with its password replaced, for error messages: a URL in a log or
/// an exception report must never carry the credentials.
pub(crate) fn redacted(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else { return url.to_owned() };
    match rest.rsplit_once('@') {
        Some((userinfo, host)) => {
            let user = userinfo.split(':').next().unwrap_or("");
            format!("{scheme}://{user}:***@{host}")
        }
        None => url.to_owned(),
    }
}

/// An `amqp://` or `amqps://` URL lapin can parse, or the error that says
/// what to write. Plain `amqp://` is refused when TLS settings were given:
/// that address would not be encrypted, which is never what they meant.
fn check_amqp_url(url: &str, tls: Option<&TlsOptions>) -> Result<()> {
    let secure = url.starts_with("amqps://");
    if !secure && !url.starts_with("amqp://") {
        let scheme = url.split("://").next().filter(|s| *s != url).unwrap_or("(none)");
        return Err(Error::new(
            ErrorKind::InvalidUrl,
            format!(
                "unknown URL scheme {scheme:?} in {:?}: use amqp://user:pass@host:5672/vhost, amqps://user:pass@host:5671/vhost or memory://",
                redacted(url)
            ),
        ));
    }
    if !secure && tls.is_some() {
        return Err(Error::new(
            ErrorKind::InvalidUrl,
            format!(
                "tls: was given, but {:?} is plain amqp:// and would not be encrypted: write amqps:// (port 5671 by default), or leave tls: out",
                redacted(url)
            ),
        ));
    }
    if url.parse::<lapin::uri::AMQPUri>().is_err() {
        return Err(Error::new(
            ErrorKind::InvalidUrl,
            format!(
                "cannot parse {:?} as an AMQP URL: use {}://user:pass@host:{}/vhost",
                redacted(url),
                if secure { "amqps" } else { "amqp" },
                if secure { 5671 } else { 5672 }
            ),
        ));
    }
    Ok(())
}

impl Backend {
    /// Channel ids held on the current AMQP connection; 0 on memory://.
    pub(crate) fn channels_in_use(&self) -> usize {
        match self {
            Backend::Amqp(a) => a.channels_in_use(),
            Backend::Memory(_) => 0,
        }
    }

    pub(crate) async fn open(
        urls: &[String],
        origin: &str,
        connect_timeout: Duration,
        confirm_timeout: Duration,
        tls: Option<&TlsOptions>,
    ) -> Result<Backend> {
        let Some(first) = urls.first() else {
            return Err(Error::new(ErrorKind::InvalidUrl, "Connection.open needs at least one URL"));
        };
        if urls.len() == 1 {
            if let Some(rest) = first.strip_prefix("memory://") {
                let name = rest.trim_end_matches('/');
                return Ok(Backend::Memory(MemoryBroker::named(if name.is_empty() { "default" } else { name })));
            }
        }
        for url in urls {
            if url.starts_with("memory://") {
                return Err(Error::new(
                    ErrorKind::InvalidUrl,
                    "memory:// cannot be one of several addresses: it is one in-process broker; give it alone",
                ));
            }
            check_amqp_url(url, tls)?;
        }
        // Read the files once, for every address and every redial; only
        // when some address needs them (the system store is a disk read).
        let tls = match urls.iter().any(|u| u.starts_with("amqps://")) {
            true => Some(tls::Tls::new(&tls.cloned().unwrap_or_default())?),
            false => None,
        };
        Ok(Backend::Amqp(Arc::new(amqp::AmqpBackend::connect(urls, origin, connect_timeout, confirm_timeout, tls).await?)))
    }

    pub(crate) async fn apply(&self, topology: &Topology) -> Result<()> {
        topology.validate()?;
        let queues = topology.expanded_queues();
        match self {
            Backend::Memory(b) => {
                for e in &topology.exchanges {
                    b.declare_exchange(e)?;
                }
                for q in &queues {
                    b.declare_queue(q)?;
                }
                for bind in &topology.bindings {
                    b.bind(bind)?;
                }
                Ok(())
            }
            Backend::Amqp(a) => {
                let declared = topology.exchanges.iter().map(|e| e.name.clone()).collect::<Vec<_>>();
                // A quorum queue's DLQ that already exists without
                // DLQ_DELIVERY_LIMIT (declared by an older AceMQ, or by
                // hand) is refused as inequivalent on 3.10.8, 4.0.5 and
                // 4.3.6 alike: it is kept as it is, each on a channel of its
                // own since the refusal closes it. Peek and replay are safe
                // on it anyway (replay.rs refreshes a dead letter near a
                // limit); docs/production.md gives the policy that lifts it.
                let mut queues = queues;
                for q in queues.iter().filter(|q| q.is_quorum_dlq()) {
                    match a.with_declare_channel(|ch| async move { amqp::declare_queue(&ch, q).await }).await {
                        Err(e) if e.is_precondition_failed() && e.message().contains("'x-delivery-limit'") => {}
                        other => other?,
                    }
                }
                queues.retain(|q| !q.is_quorum_dlq());
                // Each group's declarations are sent together and their
                // replies awaited together: a channel answers its methods in
                // the order sent, so a consumer's DLQ and four rungs cost
                // one round trip, not five. A failure closes the channel and
                // fails what was sent behind it; the first failure in order
                // is the one reported. Bindings go after the queues and
                // exchanges they name have been declared.
                a.with_declare_channel(|ch| async move {
                    amqp::all(topology.exchanges.iter().map(|e| amqp::declare_exchange(&ch, e))).await?;
                    amqp::all(queues.iter().map(|q| amqp::declare_queue(&ch, q))).await?;
                    amqp::all(topology.bindings.iter().map(|b| amqp::bind(&ch, b))).await
                })
                .await?;
                a.declared(declared);
                Ok(())
            }
        }
    }

    pub(crate) async fn send(&self, exchange: &str, routing_key: &str, body: &[u8], props: &Props) -> Result<Confirm> {
        match self {
            Backend::Memory(b) => Ok(Confirm(ConfirmInner::Ready(b.publish(exchange, routing_key, body, props)), tracing::Span::none(), None)),
            Backend::Amqp(a) => Ok(Confirm(ConfirmInner::Amqp(a.send(exchange, routing_key, body, props).await?), tracing::Span::none(), None)),
        }
    }

    /// Send many, in order, without waiting for each to be written.
    pub(crate) async fn send_many(&self, items: &[(&str, &str, &[u8], Props)]) -> Vec<Result<Confirm>> {
        match self {
            Backend::Memory(b) => items
                .iter()
                .map(|(exchange, routing_key, body, props)| Ok(Confirm(ConfirmInner::Ready(b.publish(exchange, routing_key, body, props)), tracing::Span::none(), None)))
                .collect(),
            Backend::Amqp(a) => a.send_many(items).await.into_iter().map(|r| r.map(|c| Confirm(ConfirmInner::Amqp(c), tracing::Span::none(), None))).collect(),
        }
    }

    pub(crate) async fn subscribe(&self, queue: &str, prefetch: u16) -> Result<Link> {
        self.subscribe_with(queue, prefetch, false).await
    }

    /// [`Backend::subscribe`], with basic.consume's `exclusive` flag when
    /// asked: while this subscription has the queue no other consumer may
    /// (the broker refuses one with ACCESS_REFUSED, 403; memory:// does the
    /// same), which is how one dead-letter ingester per DLQ is kept across
    /// processes and hosts.
    pub(crate) async fn subscribe_with(&self, queue: &str, prefetch: u16, exclusive: bool) -> Result<Link> {
        match self {
            Backend::Memory(b) => {
                let (id, out) = b.consume_with(queue, prefetch, exclusive)?;
                Ok(Link::Memory { broker: b.clone(), id, out })
            }
            Backend::Amqp(a) => Ok(Link::Amqp(a.consume(queue, prefetch, exclusive).await?)),
        }
    }

    /// A reader that takes the messages sitting in `queue` one by one
    /// without removing them: each is removed only when acknowledged, and
    /// whatever is not acknowledged goes back (in order) when the reader
    /// closes. For the DLQ replay.
    pub(crate) async fn reader(&self, queue: &str) -> Result<Reader> {
        match self {
            Backend::Memory(b) => {
                let (id, out) = b.consume(queue, u16::MAX)?;
                Ok(Reader::Memory { broker: b.clone(), id, out })
            }
            Backend::Amqp(a) => Ok(Reader::Amqp { channel: a.reader_channel().await?, queue: queue.to_owned(), acked: Default::default() }),
        }
    }

    pub(crate) async fn close(&self) {
        if let Backend::Amqp(a) = self {
            a.close().await;
        }
    }

    /// Ready messages and consumers of `queue`; None when it does not exist.
    /// [`Backend::queue_counts`] of each, in order, on one channel.
    pub(crate) async fn queue_counts_many(&self, queues: &[String]) -> Result<Vec<Option<QueueCounts>>> {
        match self {
            Backend::Memory(b) => Ok(queues.iter().map(|q| b.counts(q)).collect()),
            Backend::Amqp(a) => a.queue_counts_many(queues).await,
        }
    }

    /// Delete `queues` (what [`Connection::teardown`](crate::Connection::teardown) decided).
    pub(crate) async fn delete_queues(&self, queues: &[String]) -> Result<()> {
        match self {
            Backend::Memory(b) => {
                for q in queues {
                    b.delete_queue(q);
                }
                Ok(())
            }
            Backend::Amqp(a) => a.delete_queues(queues).await,
        }
    }

    /// Delete each of `queues` that is empty and has no consumer.
    pub(crate) async fn delete_queues_if_idle(&self, queues: &[String]) -> Result<()> {
        match self {
            Backend::Memory(b) => {
                for q in queues {
                    if matches!(b.counts(q), Some(c) if c.ready == 0 && c.consumers == 0) {
                        b.delete_queue(q);
                    }
                }
                Ok(())
            }
            Backend::Amqp(a) => a.delete_queues_if_idle(queues).await,
        }
    }

    pub(crate) async fn queue_counts(&self, queue: &str) -> Result<Option<QueueCounts>> {
        match self {
            Backend::Memory(b) => Ok(b.counts(queue)),
            Backend::Amqp(a) => a.queue_counts(queue).await,
        }
    }

    /// The broker's `version` server property; None on memory://.
    pub(crate) fn server_version(&self) -> Option<String> {
        match self {
            Backend::Memory(_) => None,
            Backend::Amqp(a) => a.server_version(),
        }
    }

    /// The broker is blocking publishers on this connection (never on memory://).
    pub(crate) fn blocked(&self) -> bool {
        matches!(self, Backend::Amqp(a) if a.blocked())
    }
}

/// How long [`Reader::finish`] waits at most for the broker to show what it
/// gave back (and so to have applied the acknowledgements before it).
const READ_SETTLE_WAIT: Duration = Duration::from_secs(5);
/// The pause [`Reader::finish`] makes before closing when it acknowledged
/// messages and gave none back, so there is nothing to watch for.
const READ_SETTLE_PAUSE: Duration = Duration::from_millis(250);

pub(crate) enum Reader {
    /// `acked`: acknowledgements sent, which [`Reader::finish`] waits for
    /// the broker to apply.
    Amqp { channel: lapin::Channel, queue: String, acked: std::sync::atomic::AtomicUsize },
    Memory { broker: Arc<MemoryBroker>, id: u64, out: Arc<DeliveryQueue> },
}

impl Reader {
    /// The next message still in the queue, or None when none is left.
    pub(crate) async fn next(&self) -> Result<Option<RawDelivery>> {
        match self {
            Reader::Memory { out, .. } => Ok(match out.try_pop() {
                queue::Pop::Item(d) => Some(d),
                _ => None,
            }),
            Reader::Amqp { channel, queue, .. } => amqp::get(channel, queue).await,
        }
    }

    /// Remove it for good (its copy is stored elsewhere).
    pub(crate) async fn ack(&self, tag: u64) -> Result<()> {
        match self {
            Reader::Memory { broker, id, .. } => {
                broker.ack(*id, tag);
                Ok(())
            }
            Reader::Amqp { channel, acked, .. } => {
                channel
                    .basic_ack(tag, lapin::options::BasicAckOptions::default())
                    .await
                    .map_err(|e| amqp::map_error(&e, "acknowledging a replayed message"))?;
                acked.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                Ok(())
            }
        }
    }

    /// End the read: give back every delivery up to `held`'s tag not
    /// acknowledged (`held`: that tag and how many it gives back), in
    /// order, with basic.nack (multiple, requeue), then close the channel.
    /// The nack because on RabbitMQ 4.3 it does not count toward a quorum
    /// queue's delivery limit, where a closed channel's return does (3.10
    /// and 4.0 count both).
    ///
    /// Before the close, the broker must have applied the acknowledgements
    /// sent: a quorum queue applies a channel's acks and returns after the
    /// news that the channel closed, so acks sent just before the close
    /// were lost and their messages returned, though each had been copied
    /// elsewhere first: a read that gave up on a deep DLQ left up to 200
    /// twice (measured on 4.3.6: 14, 102 and 89 of 20,000 in 4 of 8 reads,
    /// and 19 once on 3.10). The returns are applied in order after the
    /// acks, so once the DLQ's ready count shows the nack's messages back,
    /// the acks before them are applied too; with nothing to give back, a
    /// pause stands in. A DLQ with messages arriving meanwhile only makes
    /// the wait shorter.
    pub(crate) async fn finish(&self, held: Option<(u64, usize)>) {
        if let Reader::Amqp { channel, queue, acked } = self {
            let acks = acked.load(std::sync::atomic::Ordering::Relaxed) > 0;
            let ready = || async {
                let declare = channel.queue_declare(
                    lapin::types::ShortString::from(queue.as_str()),
                    lapin::options::QueueDeclareOptions { passive: true, ..Default::default() },
                    lapin::types::FieldTable::default(),
                );
                match tokio::time::timeout(Duration::from_secs(2), declare).await {
                    Ok(Ok(q)) => Some(u64::from(q.message_count())),
                    _ => None,
                }
            };
            let before = if acks && held.is_some() { ready().await } else { None };
            if let Some((tag, _)) = held {
                let nack = channel.basic_nack(tag, lapin::options::BasicNackOptions { multiple: true, requeue: true });
                let _ = tokio::time::timeout(Duration::from_secs(5), nack).await;
            }
            if acks {
                match (before, held) {
                    (Some(before), Some((_, n))) => {
                        let deadline = std::time::Instant::now() + READ_SETTLE_WAIT;
                        while std::time::Instant::now() < deadline {
                            match ready().await {
                                Some(now) if now >= before + n as u64 => break,
                                Some(_) => tokio::time::sleep(Duration::from_millis(20)).await,
                                None => break,
                            }
                        }
                    }
                    _ => tokio::time::sleep(READ_SETTLE_PAUSE).await,
                }
            }
        }
        self.close().await;
    }

    /// Give back everything not acknowledged.
    pub(crate) async fn close(&self) {
        match self {
            Reader::Memory { broker, id, .. } => broker.cancel(*id),
            Reader::Amqp { channel, .. } => {
                let _ = tokio::time::timeout(Duration::from_secs(5), channel.close(200, lapin::types::ShortString::from("OK"))).await;
            }
        }
    }
}
