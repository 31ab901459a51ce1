//! A connection to a broker: publish with confirms, apply a topology, open
//! consumers.

use crate::cascade;
use crate::envelope::Envelope;
use crate::error::{Error, Result};
use crate::headers::Headers;
use crate::topology::{QueueType, Topology};
use crate::transport::memory::MemoryBroker;
use crate::transport::{Backend, Confirm, QueueCounts, TlsOptions};
use crate::wire::{props_for, Props, RawDelivery};
use serde::Serialize;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// How to open a connection.
#[derive(Debug, Clone)]
pub struct ConnectionOptions {
    /// Stamped on every message this connection publishes (`app_id`,
    /// `x-acemq-origin`). Defaults to the program name and host.
    pub origin: Option<String>,
    /// How long to wait for the broker to accept the connection. A broker
    /// that is down must not hang a boot.
    pub connect_timeout: Duration,
    /// How long to wait for a publish confirm before reporting a timeout.
    pub confirm_timeout: Duration,
    /// The AMQP heartbeat to ask for, in whole seconds (the broker's own,
    /// 60 s on RabbitMQ, when None). Either side closes a connection that
    /// has been silent for two of them. Heartbeats are sent by the I/O
    /// thread, so a handler that runs long does not hold them up. A
    /// `heartbeat=` in the URL's query wins.
    pub heartbeat: Option<Duration>,
    /// TLS settings for `amqps://` addresses. None with `amqps://` is the
    /// system's CA store with verification on; settings given while an
    /// address is plain `amqp://` are refused (that address would not be
    /// encrypted).
    pub tls: Option<TlsOptions>,
}

impl Default for ConnectionOptions {
    fn default() -> Self {
        ConnectionOptions {
            origin: None,
            connect_timeout: Duration::from_secs(5),
            confirm_timeout: Duration::from_secs(30),
            heartbeat: None,
            tls: None,
        }
    }
}

/// `url` with `heartbeat` in its query, unless the query names one already.
fn with_heartbeat(url: &str, heartbeat: Option<Duration>) -> String {
    let Some(h) = heartbeat else { return url.to_owned() };
    if !url.starts_with("amqp") || url.contains("heartbeat=") {
        return url.to_owned();
    }
    let secs = h.as_secs().max(1);
    format!("{url}{}heartbeat={secs}", if url.contains('?') { '&' } else { '?' })
}

/// Where and how to publish one message.
#[derive(Debug, Clone, Default)]
pub struct PublishOptions {
    /// The exchange; empty for the default exchange, which routes to the queue
    /// named by the routing key.
    pub exchange: String,
    /// A ready-made envelope (its id is kept: publishing the same envelope
    /// twice is the same message twice). Without one, a fresh envelope.
    pub envelope: Option<Envelope>,
    /// The message type, when no envelope is given (or to override it).
    pub kind: Option<String>,
    /// Extra headers, over the envelope's own.
    pub headers: Headers,
    /// A trace context (`traceparent`, `tracestate`) to carry, added only
    /// when the headers have no `traceparent` yet: one already there is the
    /// caller's (a message forwarded with the context it came with), and a
    /// publish never rewrites a context.
    pub trace_context: Headers,
    /// Deliver it this long from now, through the delay cascade
    /// ([`crate::delay`]): whole seconds, rounded up, at most
    /// [`crate::cascade::MAX_DELAY`]. The envelope (its id, its trace
    /// context) is the one delivered.
    pub delay: Option<Duration>,
    /// Deliver it at this time instead (a time past is now). Not with `delay`.
    pub at: Option<std::time::SystemTime>,
    /// Send it to the partition of the routing key's queue that this key
    /// hashes to (`{queue}.pN`, see [`crate::partition`]): messages with one
    /// key are handled in the order they were published.
    pub partition: Option<crate::partition::PartitionKey>,
}

/// One message for [`Connection::send_json_batch`]: a JSON body and where it
/// goes, with the envelope it carries (see [`Connection::envelope_for`]).
#[derive(Debug, Clone, Copy)]
pub struct JsonMessage<'a> {
    /// The body, already JSON.
    pub body: &'a [u8],
    /// The exchange; empty for the default exchange.
    pub exchange: &'a str,
    /// The routing key (the queue name on the default exchange).
    pub routing_key: &'a str,
    /// The envelope, as [`Connection::envelope_for`] made it.
    pub envelope: &'a Envelope,
}

/// Refuse a message with nowhere to go: the default exchange routes by the
/// routing key, so one of the two must be named. The rule for every publish,
/// the outbox's records included (checked when they are made, not at every
/// sweep).
pub fn check_destination(exchange: &str, routing_key: &str, props: &Props) -> Result<()> {
    if exchange.is_empty() && routing_key.is_empty() {
        return Err(Error::invalid("a publish needs a destination: a queue name, or an exchange and a routing key"));
    }
    crate::limits::outgoing(exchange, routing_key, props)
}

struct Inner {
    /// Dropped only in the process that opened it (see `Drop for Inner`).
    backend: std::mem::ManuallyDrop<Backend>,
    origin: String,
    url: String,
    closed: AtomicBool,
    /// The process that opened it (see `check_open`).
    pid: u32,
    /// The type each main queue was applied with here, so a consumer of it
    /// declares its DLQ and rungs alike.
    applied: std::sync::Mutex<std::collections::HashMap<String, (QueueType, Option<u64>)>>,
    /// What of the delay cascade this connection has declared.
    delays: std::sync::Mutex<crate::cascade::Declared>,
    /// Requests in flight and the reply channel (`crate::request`).
    replies: Arc<Replies>,
}

/// One connection's requests in flight and its reply channel: what
/// [`crate::request`] keeps per connection, held here with the connection.
#[derive(Default)]
pub(crate) struct Replies {
    pub(crate) waiters: std::sync::Mutex<std::collections::HashMap<String, tokio::sync::oneshot::Sender<RawDelivery>>>,
    pub(crate) late: std::sync::atomic::AtomicU64,
    pub(crate) channel: tokio::sync::Mutex<Option<lapin::Channel>>,
    /// memory://: this connection's reply address.
    pub(crate) address: std::sync::OnceLock<String>,
}

impl Replies {
    pub(crate) fn waiters(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, tokio::sync::oneshot::Sender<RawDelivery>>> {
        self.waiters.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A reply arrived: to its waiter, or dropped and counted.
    pub(crate) fn deliver(&self, raw: RawDelivery) {
        let waiter = raw.props.correlation_id.as_deref().and_then(|id| self.waiters().remove(id));
        match waiter.map(|w| w.send(raw)) {
            Some(Ok(())) => {}
            _ => {
                self.late.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(target: "acemq", "a reply came after its request gave up: dropped");
            }
        }
    }
}

/// A connection inherited by a forked child is leaked there, never dropped:
/// its I/O thread is the parent's, and dropping lapin's handle to it detaches
/// a thread that does not exist in the child (seen: SIGSEGV in
/// `pthread_detach`, from Ruby's GC freeing a parent's connection in a child
/// process). The child opens its own connections.
impl Drop for Inner {
    fn drop(&mut self) {
        if self.pid == std::process::id() {
            // SAFETY: dropped once, here, and never used again.
            unsafe { std::mem::ManuallyDrop::drop(&mut self.backend) }
        }
    }
}

/// What a [`Connection`] holds at one moment: see [`Connection::resources`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Resources {
    /// Channel ids the client holds on the current AMQP connection: open,
    /// opening, or closed and not yet given back. 0 on `memory://`, which has
    /// no channels. RabbitMQ allows 2,047 (its `channel_max`).
    pub channels: usize,
    /// Tasks alive on the engine's runtime ([`crate::runtime`]: the
    /// subscriptions, retired channels waiting to close) and, called from
    /// inside another tokio runtime (a Rust service's), on that one too
    /// (lapin's, which run where the connection was dialled). A closed
    /// connection's heartbeat task ends at its next beat, up to about 30 s
    /// later.
    pub tasks: usize,
}

/// A connection to RabbitMQ (`amqp://`) or to an in-process broker (`memory://`).
/// Cheap to clone; every clone is the same connection.
#[derive(Clone)]
pub struct Connection {
    inner: Arc<Inner>,
}

fn default_origin() -> String {
    let program = std::env::args()
        .next()
        .and_then(|p| std::path::Path::new(&p).file_name().map(|s| s.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "acemq".into());
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .or_else(|_| std::env::var("HOSTNAME"))
        .unwrap_or_else(|_| "localhost".into());
    format!("{program}@{host}")
}

impl Connection {
    /// Open `url` with default options.
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe: a future dropped while dialling may leave a half-open
    /// connection, which the broker closes on its own after its handshake
    /// timeout. Nothing else is left behind.
    pub async fn open(url: &str) -> Result<Connection> {
        Self::open_with(url, ConnectionOptions::default()).await
    }

    /// Open `url` with `options`.
    ///
    /// # Cancel safety
    ///
    /// As [`Connection::open`]: not cancel safe, a half-open connection may be
    /// left for the broker to close.
    pub async fn open_with(url: &str, options: ConnectionOptions) -> Result<Connection> {
        Self::open_any(&[url], options).await
    }

    /// Open the first of `urls` that answers: the nodes of a cluster, in the
    /// order to try them. When the connection is lost later, the next one
    /// in the list is dialled first, and so on round. One URL is the same
    /// as [`Connection::open_with`].
    ///
    /// # Cancel safety
    ///
    /// As [`Connection::open`]: not cancel safe, a half-open connection may be
    /// left for the broker to close.
    pub async fn open_any(urls: &[&str], options: ConnectionOptions) -> Result<Connection> {
        let origin = options.origin.unwrap_or_else(default_origin);
        crate::limits::short("origin", &origin)?;
        let dialled: Vec<String> = urls.iter().map(|u| with_heartbeat(u, options.heartbeat)).collect();
        let backend =
            Backend::open(&dialled, &origin, options.connect_timeout, options.confirm_timeout, options.tls.as_ref()).await?;
        Ok(Connection {
            inner: Arc::new(Inner {
                backend: std::mem::ManuallyDrop::new(backend),
                origin,
                url: urls.join(" "),
                closed: AtomicBool::new(false),
                pid: std::process::id(),
                applied: Default::default(),
                delays: Default::default(),
                replies: Default::default(),
            }),
        })
    }

    /// The origin stamped on what this connection publishes.
    pub fn origin(&self) -> &str {
        &self.inner.origin
    }

    /// The URL it was opened with.
    pub fn url(&self) -> &str {
        &self.inner.url
    }

    /// The in-process broker, for a `memory://` connection.
    pub fn memory_broker(&self) -> Option<Arc<MemoryBroker>> {
        match &*self.inner.backend {
            Backend::Memory(b) => Some(b.clone()),
            Backend::Amqp(_) => None,
        }
    }

    /// How many messages wait in `queue` and how many consumers it has, by
    /// a passive declare (nothing is created); `Ok(None)` when the queue
    /// does not exist. What `acemq status` shows.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only asks. A dropped future leaves at most the channel
    /// it asked on open until the broker answers.
    pub async fn queue_counts(&self, queue: &str) -> Result<Option<QueueCounts>> {
        self.check_open()?;
        crate::limits::queue(queue)?;
        self.inner.backend.queue_counts(queue).await
    }

    /// [`Connection::queue_counts`] of each of `queues`, in order, asked on
    /// one channel: what `acemq status` and AceMQ::Web's overview sample
    /// (300 queues for 50 consumers with their rungs and DLQs).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only asks.
    pub async fn queue_counts_many(&self, queues: &[String]) -> Result<Vec<Option<QueueCounts>>> {
        self.check_open()?;
        for q in queues {
            crate::limits::queue(q)?;
        }
        self.inner.backend.queue_counts_many(queues).await
    }

    /// What this connection holds now: channels, and the tasks alive on the
    /// runtime it runs on. A soak (`rake soak`, `examples/soak.rs`) or a
    /// health check reads it to see that failed operations give back what
    /// they took: after any number of them these stay where they were.
    pub fn resources(&self) -> Resources {
        // The engine's runtime runs subscriptions and retired channels'
        // closers; lapin's own tasks run on the runtime that dialled, a
        // Rust service's own when it is called from one.
        let engine = crate::runtime::handle();
        let mut tasks = engine.metrics().num_alive_tasks();
        if let Ok(current) = tokio::runtime::Handle::try_current() {
            if current.id() != engine.id() {
                tasks += current.metrics().num_alive_tasks();
            }
        }
        Resources { channels: self.inner.backend.channels_in_use(), tasks }
    }

    pub(crate) fn replies(&self) -> Arc<Replies> {
        self.inner.replies.clone()
    }

    pub(crate) fn delays(&self) -> std::sync::MutexGuard<'_, crate::cascade::Declared> {
        self.inner.delays.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn backend(&self) -> &Backend {
        &self.inner.backend
    }

    pub(crate) fn check_open(&self) -> Result<()> {
        if self.inner.closed.load(Ordering::Acquire) {
            return Err(Error::closed("the connection is closed: open a new one"));
        }
        // A forked child has the parent's socket and none of the runtime
        // that drove it: a publish would wait for a confirm nothing reads.
        if self.inner.pid != std::process::id() {
            return Err(Error::closed(format!(
                "this connection was opened in process {} and this is {} (a fork): open a new connection in the child, \
                 after forking (Puma's on_worker_boot, Unicorn's after_fork)",
                self.inner.pid,
                std::process::id()
            )));
        }
        Ok(())
    }

    /// Declare `topology` (each queue with its `{queue}.dlq`). Idempotent:
    /// run it from every process at boot.
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe, but safe to repeat: a dropped future may have
    /// declared part of the topology, and applying it again declares the
    /// rest (declarations are idempotent).
    pub async fn apply(&self, topology: &Topology) -> Result<()> {
        self.check_open()?;
        self.inner.backend.apply(topology).await?;
        let mut applied = self.inner.applied.lock().unwrap_or_else(|p| p.into_inner());
        for q in topology.queues.iter().filter(|q| q.dead_letter_queue) {
            let limit = q.declared_arguments().get("x-delivery-limit").and_then(serde_json::Value::as_u64);
            applied.insert(q.name.clone(), (q.queue_type, limit));
        }
        Ok(())
    }

    /// The broker's version as the current connection's connection.start
    /// gave it (`4.3.6`); None on `memory://`, or from a broker that does
    /// not say. What RabbitMQ does with delivery limits, dead-letter headers
    /// and consumer timeouts depends on it ([`crate::BrokerVersion`]).
    pub fn server_version(&self) -> Option<String> {
        self.inner.backend.server_version()
    }

    /// [`Connection::server_version`], parsed.
    pub fn broker_version(&self) -> Option<crate::BrokerVersion> {
        self.server_version().as_deref().and_then(crate::BrokerVersion::parse)
    }

    /// The type `queue` was applied with on this connection, if it was.
    pub(crate) fn applied_type(&self, queue: &str) -> Option<QueueType> {
        self.inner.applied.lock().unwrap_or_else(|p| p.into_inner()).get(queue).map(|a| a.0)
    }

    /// The `x-delivery-limit` `queue` was applied with on this connection,
    /// if it was and has one.
    pub(crate) fn applied_delivery_limit(&self, queue: &str) -> Option<u64> {
        self.inner.applied.lock().unwrap_or_else(|p| p.into_inner()).get(queue).and_then(|a| a.1)
    }

    /// The envelope a publish with `options` carries: the given envelope (its
    /// id, timestamp and origin kept) or a fresh one, the type and headers
    /// applied, this connection's origin where it has none, and attempt 1.
    /// These are the rules for every message, the outbox's and the Ruby
    /// gem's included.
    pub fn envelope_for(&self, options: &PublishOptions) -> Envelope {
        let mut env = options.envelope.clone().unwrap_or_default();
        // A publish is a first delivery, whatever envelope it reuses: a
        // handler that forwards the envelope of its third attempt must not
        // hand the next queue's consumer a message two retries closer to
        // its dead-letter queue. Retries and dead letters copy the delivery
        // itself (consumer.rs), never through here.
        env.attempt = 1;
        if let Some(k) = &options.kind {
            env.kind = Some(k.clone());
        }
        // A reused envelope (a forward of a delivered delayed message) is
        // not delayed again unless this publish says so.
        env.headers.remove(crate::cascade::DUE_HEADER);
        for (k, v) in &options.headers {
            env.headers.insert(k.clone(), v.clone());
        }
        if let Some(due) = crate::cascade::due_unchecked(options.delay, options.at) {
            env.headers.insert(crate::cascade::DUE_HEADER.into(), serde_json::Value::from(due));
        }
        if !env.headers.contains_key(crate::trace::TRACEPARENT_HEADER) {
            for (k, v) in &options.trace_context {
                env.headers.insert(k.clone(), v.clone());
            }
        }
        if env.origin.is_none() {
            env.origin = Some(self.inner.origin.clone());
        }
        env
    }

    /// Publish `payload` as JSON to `routing_key` and wait for the broker's
    /// confirm. Returns the envelope it went out with.
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe: a future dropped after the message was sent loses
    /// only the broker's answer, so the message may or may not be stored.
    /// Publishing the returned envelope again is the same message id again,
    /// which a consumer's idempotency guard sees as a duplicate.
    pub async fn publish<T: Serialize + ?Sized>(&self, payload: &T, routing_key: &str, options: PublishOptions) -> Result<Envelope> {
        let body = serde_json::to_vec(payload)?;
        let env = self.envelope_for(&options);
        let partitioned = options.partition.as_ref().map(|p| p.queue(routing_key)).transpose()?;
        let routing_key = partitioned.as_deref().unwrap_or(routing_key);
        self.send_json(&body, &options.exchange, routing_key, &env).await?.wait().await?;
        Ok(env)
    }

    /// Send a JSON body with `envelope` and return without waiting for the
    /// confirm: await [`Confirm::wait`] on each, together, to publish many
    /// at the speed of the network rather than of a round trip each.
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe: a future dropped while the frames are being written
    /// may have sent the message, with no [`Confirm`] to say whether the
    /// broker stored it.
    pub async fn send_json(&self, body: &[u8], exchange: &str, routing_key: &str, envelope: &Envelope) -> Result<Confirm> {
        self.check_open()?;
        let mut props = props_for(envelope);
        check_destination(exchange, routing_key, &props)?;
        // The producer span lasts until the confirm resolves (Confirm::wait).
        let span = crate::trace::publish_span(exchange, routing_key, envelope);
        let delayed = prepare_delay(self, exchange, routing_key, &mut props).await?;
        let (to_exchange, to_key) = delayed.as_ref().map_or((exchange, routing_key), |(e, k)| (e.as_str(), k.as_str()));
        let confirm = tracing::Instrument::instrument(self.inner.backend.send(to_exchange, to_key, body, &props), span.clone()).await?;
        Ok(confirm.in_span(span).watched(exchange, routing_key, &envelope.id))
    }

    /// Send many JSON bodies, in the order given, and return without waiting
    /// for any confirm: one [`Confirm`] (or the reason it could not be sent)
    /// per message, in the same order. Faster than calling
    /// [`Connection::send_json`] in a loop: the sends are not waited for one
    /// by one.
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe: a dropped future may have sent some of the messages,
    /// in order, and there are no [`Confirm`]s to say which were stored.
    pub async fn send_json_batch(&self, messages: &[JsonMessage<'_>]) -> Vec<Result<Confirm>> {
        if let Err(e) = self.check_open() {
            return messages.iter().map(|_| Err(e.clone())).collect();
        }
        let mut results: Vec<Option<Result<Confirm>>> = Vec::with_capacity(messages.len());
        let mut items = Vec::with_capacity(messages.len());
        let mut spans = Vec::with_capacity(messages.len());
        let mut watched = Vec::with_capacity(messages.len());
        // Where each delayed one goes instead (owned: the items borrow it).
        let mut rerouted: Vec<Option<(String, String)>> = Vec::with_capacity(messages.len());
        let mut all_props = Vec::with_capacity(messages.len());
        for m in messages {
            let mut props = props_for(m.envelope);
            let route = match check_destination(m.exchange, m.routing_key, &props) {
                Ok(()) => prepare_delay(self, m.exchange, m.routing_key, &mut props).await,
                Err(e) => Err(e),
            };
            rerouted.push(route.as_ref().ok().cloned().flatten());
            all_props.push((props, route.err()));
        }
        for ((m, (props, refused)), route) in messages.iter().zip(all_props).zip(&rerouted) {
            let (exchange, routing_key) = route.as_ref().map_or((m.exchange, m.routing_key), |(e, k)| (e.as_str(), k.as_str()));
            if let Some(e) = refused {
                results.push(Some(Err(e)));
            } else {
                results.push(None);
                items.push((exchange, routing_key, m.body, props));
                spans.push(crate::trace::publish_span(m.exchange, m.routing_key, m.envelope));
                watched.push((m.exchange, m.routing_key, m.envelope.id.as_str()));
            }
        }
        let mut sent = self.inner.backend.send_many(&items).await.into_iter().zip(spans).zip(watched);
        results
            .into_iter()
            .map(|r| {
                r.unwrap_or_else(|| {
                    let ((sent, span), (e, k, id)) = sent.next().expect("one result per message sent");
                    sent.map(|c| c.in_span(span).watched(e, k, id))
                })
            })
            .collect()
    }

    /// Close the connection. Consumers' unsettled messages go back to their
    /// queues.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: the connection is marked closed before anything is
    /// awaited, so a dropped future leaves it refusing new work; the broker
    /// closes the socket and requeues unsettled messages on its own.
    pub async fn close(&self) {
        // In a forked child the socket is the parent's: closing it from here
        // would close the parent's connection, or wait on a runtime that is
        // not in this process. The child only forgets it.
        if !self.inner.closed.swap(true, Ordering::AcqRel) && self.inner.pid == std::process::id() {
            self.inner.backend.close().await;
        }
    }

    /// Is RabbitMQ blocking publishers on this connection (a memory or disk
    /// alarm)? A publish meanwhile waits, up to the confirm timeout, for the
    /// block to lift, then fails with [`ErrorKind::Blocked`](crate::ErrorKind::Blocked)
    /// unsent. Consumers on another connection are not blocked: that is why
    /// a runner publishes on a connection of its own.
    pub fn is_blocked(&self) -> bool {
        self.inner.backend.blocked()
    }

    /// Is it closed?
    pub fn is_closed(&self) -> bool {
        self.inner.closed.load(Ordering::Acquire)
    }
}

/// Where a message with `props` is sent on `conn`: to the cascade, with the
/// routing key rewritten and `CC` set, when it carries a due time still in
/// the future and the broker is RabbitMQ (declaring the cascade on this
/// connection's first delayed publish, and the destination's binding on its
/// first to that destination); None to send it as it is. `memory://` delays
/// on its own clock as it stores the message (`MemoryBroker`).
async fn prepare_delay(
    conn: &Connection,
    exchange: &str,
    routing_key: &str,
    props: &mut Props,
) -> Result<Option<(String, String)>> {
    let Backend::Amqp(amqp) = conn.backend() else { return Ok(None) };
    let Some(due) = props.header(cascade::DUE_HEADER).and_then(|v| cascade::due_value(&v)) else {
        return Ok(None);
    };
    let secs = cascade::remaining_secs(due, cascade::epoch_ms(std::time::SystemTime::now()));
    if secs == 0 {
        return Ok(None);
    }
    if secs > cascade::MAX_DELAY.as_secs() {
        return Err(cascade::too_long());
    }
    let r = cascade::route(exchange, routing_key, secs)?;
    let (cascade_needed, bind_needed) = {
        let d = conn.delays();
        (!d.cascade, !d.destinations.contains(&r.destination))
    };
    if cascade_needed {
        amqp.declare_cascade().await?;
        conn.delays().cascade = true;
    }
    if bind_needed {
        amqp.bind_delay_destination(&r.destination).await?;
        conn.delays().destinations.insert(r.destination.clone());
    }
    if let Some(cc) = r.cc {
        props.headers_mut().insert("CC".into(), serde_json::Value::Array(vec![serde_json::Value::from(cc)]));
    }
    Ok(Some((r.exchange, r.routing_key)))
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let endpoint = self.inner.url.split('@').next_back().unwrap_or("");
        write!(f, "Connection({endpoint}, origin: {})", self.inner.origin)
    }
}
