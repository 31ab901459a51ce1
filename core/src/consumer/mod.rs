//! Consuming: a pull consumer (next delivery, settle with an outcome) and a
//! push consumer built on it. Settling is where the retry ladder and the
//! dead-letter queue live: copy first, confirmed, then acknowledge.

use crate::ack::{Guarded, Outcome, Settlement, Verdict};
use crate::connection::Connection;
use crate::envelope::{now_secs, ATTEMPT_HEADER};
use crate::error::{Error, ErrorKind, Result};
use crate::events::{self, Event, ProcessOutcome};
use crate::message::Message;
use crate::retry::{dlq_name, rung_name, RetryPolicy};
use crate::topology::{QueueSpec, QueueType, Topology};
use crate::transport::queue::Pop;
use crate::transport::Link;
use crate::wire::{
    decode, decode_as, Payload, RawDelivery, ERROR_CLASS_HEADER, FAILED_AT_HEADER, ORIGINAL_EXCHANGE_HEADER, ORIGINAL_ROUTING_KEY_HEADER,
    QUEUE_HEADER, REASON_HEADER,
};
use serde_json::Value;
use std::future::Future;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

mod flow;
pub use flow::{BreakerState, CircuitBreaker, Throttle};

/// How long a delivery whose copy could not be made waits before it goes
/// back to its queue.
const REQUEUE_PAUSE: Duration = Duration::from_secs(1);

/// The handler deadline when none is given: well inside RabbitMQ's default
/// `consumer_timeout` (30 minutes), so the broker never closes a channel
/// over a slow handler before the consumer has settled its delivery.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(25 * 60);

/// RabbitMQ's default `consumer_timeout`.
pub const DEFAULT_BROKER_CONSUMER_TIMEOUT: Duration = Duration::from_secs(30 * 60);

/// The error class a delivery settled by its deadline carries
/// (`x-acemq-error-class`).
pub const TIMEOUT_CLASS: &str = "HandlerTimeout";

/// When the first wait began (seconds since the epoch), on a copy waiting for
/// another handler's idempotency claim ([`Outcome::Wait`]).
pub const WAITING_SINCE_HEADER: &str = "x-acemq-waiting-since";

/// How many times a copy has waited so far.
pub const WAITS_HEADER: &str = "x-acemq-waits";

/// How to consume.
#[derive(Debug, Clone)]
pub struct ConsumeOptions {
    /// Deliveries in flight at once, never unlimited. Default 32.
    pub prefetch: u16,
    /// Handlers running at once (push consumer; the Ruby consumer's threads).
    pub concurrency: usize,
    /// The retry ladder.
    pub retry: RetryPolicy,
    /// The type of the queue, which its DLQ and rungs take. None: what this
    /// connection applied for it in a topology, else classic.
    pub queue_type: Option<QueueType>,
    /// The handler deadline: a delivery not settled this long after it was
    /// handed out is settled by the consumer as a retry (reason and
    /// [`TIMEOUT_CLASS`] on the copy), and whatever its handler returns
    /// later is discarded (counted as `abandoned`). The handler is not
    /// interrupted: nothing is killed mid-write. Default [`DEFAULT_TIMEOUT`].
    pub timeout: Duration,
    /// The broker's `consumer_timeout`, which `timeout` must be shorter than
    /// (RabbitMQ 3.10 and 4.0 close the whole channel of a consumer holding a
    /// delivery longer; 4.3 cancels a quorum queue's consumer and leaves
    /// classic queues alone, so a queue known to be classic is not checked
    /// against it there). Default RabbitMQ's own,
    /// [`DEFAULT_BROKER_CONSUMER_TIMEOUT`].
    pub broker_consumer_timeout: Duration,
    /// The idempotency store's claim timeout, when the handler is guarded
    /// (the Ruby consumer fills it from the handler's store): `timeout` must
    /// not be longer, or a handler still running has its claim taken over.
    pub claim_timeout: Option<Duration>,
    /// The consumer's name in events and logs (the Ruby consumer class's
    /// name). None: the queue's.
    pub name: Option<String>,
    /// Pause when handlers keep failing ([`CircuitBreaker`]). None: never.
    pub circuit_breaker: Option<CircuitBreaker>,
    /// Hand out at most so many messages per period, in this process
    /// ([`Throttle`]). None: as fast as the handlers take them.
    pub throttle: Option<Throttle>,
    /// Share the throttle's limit with every process whose consumer of the
    /// same name uses the same store: leases of tokens from a SQL row
    /// ([`crate::throttle`]). Needs `throttle`. None: the limit is per process.
    pub throttle_store: Option<crate::throttle::SharedStore>,
    /// The queue is single active consumer and its order matters (a
    /// partition, [`crate::partition`]): stopping does not cancel on the
    /// broker, which would hand the next consumer the messages behind the
    /// ones this one still holds; it stops handing out, and closing the
    /// channel gives back what was held, at the head and in order, as the
    /// next consumer takes over. Default false.
    pub keep_order: bool,
}

impl Default for ConsumeOptions {
    fn default() -> Self {
        Self::with_concurrency(1)
    }
}

impl ConsumeOptions {
    /// The defaults for `concurrency` handlers: a prefetch of 32, or twice
    /// the concurrency when that is more (each handler has one delivery in
    /// hand and one waiting, so none idles while the broker sends the next),
    /// and the default retry ladder.
    pub fn with_concurrency(concurrency: usize) -> Self {
        Self::with_batches(concurrency, 1)
    }

    /// For a handler guarded by an idempotency store whose claims last
    /// `claim_timeout` ([`crate::idempotency::IdempotencyStore::claim_timeout`]):
    /// kept for the startup checks, and the handler deadline lowered to it
    /// when that is shorter, since past it the claim could be taken over
    /// and the message run twice at once. A `timeout` set after this is
    /// the caller's own (the checks refuse one longer than the claim).
    pub fn guarded_by(mut self, claim_timeout: Duration) -> Self {
        self.claim_timeout = Some(claim_timeout);
        self.timeout = self.timeout.min(claim_timeout);
        self
    }

    /// The defaults for `concurrency` handlers that each take up to `batch`
    /// deliveries at once (the idempotent guard's batch path): a prefetch of
    /// twice `concurrency × batch`, at least 32. Each handler has one batch in
    /// hand and the next arriving; with a prefetch of only one batch the
    /// broker sends nothing new until a batch is acknowledged, and a batch
    /// can never be bigger than the prefetch.
    pub fn with_batches(concurrency: usize, batch: usize) -> Self {
        let prefetch =
            u16::try_from(concurrency.saturating_mul(batch.max(1)).saturating_mul(2)).unwrap_or(u16::MAX).max(32);
        ConsumeOptions {
            prefetch,
            concurrency,
            retry: RetryPolicy::default(),
            queue_type: None,
            timeout: DEFAULT_TIMEOUT,
            broker_consumer_timeout: DEFAULT_BROKER_CONSUMER_TIMEOUT,
            claim_timeout: None,
            name: None,
            circuit_breaker: None,
            throttle: None,
            throttle_store: None,
            keep_order: false,
        }
    }

    /// The rules for a consumer's sizes, once: what `open` checks, and what
    /// Ruby's `consume` and the Rails DSL check through the extension where
    /// they are given. `prefetch` None is the default (always valid).
    pub fn check_sizes(concurrency: u64, prefetch: Option<u64>, batch: u64) -> Result<()> {
        if concurrency == 0 {
            return Err(Error::invalid("concurrency must be at least 1"));
        }
        match prefetch {
            Some(0) => return Err(Error::invalid("prefetch must be at least 1: unlimited prefetch is not offered")),
            Some(p) if p > u64::from(u16::MAX) => {
                return Err(Error::invalid(format!("prefetch must be at most 65535, AMQP's 16-bit field (got {p})")))
            }
            _ => {}
        }
        if batch == 0 {
            return Err(Error::invalid("batch must be at least 1"));
        }
        Ok(())
    }
}

/// One delivery being handled: the message, for its handler, and the
/// [`Settler`] that settles it. [`Delivery::into_parts`] parts them when the
/// two go separate ways (the Ruby extension's delivery object keeps both).
#[derive(Debug)]
pub struct Delivery {
    /// The message, for the handler (see [`Delivery::take_message`]).
    pub message: Message,
    settler: Settler,
}

/// What settles one delivery, apart from its message: give it to
/// [`Consumer::accept`], [`Consumer::settle`] or [`Consumer::settle_later`]
/// of the consumer that handed it out. Whoever holds it is the one owner of
/// the delivery in flight: a settler dropped unsettled leaves its delivery
/// to its deadline (a retry), or to the broker when the consumer closes.
#[derive(Debug)]
pub struct Settler {
    /// The consumer that handed it out ([`Consumer::owns`]).
    consumer: u64,
    /// The attempt it arrived as: what settling needs of the message, kept
    /// apart from it so that the message can be handed to the handler.
    attempt: u32,
    /// Shared with the deadline's watch, which settles it without its
    /// handler: one copy of the body and headers per delivery, not two.
    raw: Arc<RawDelivery>,
    watch: Arc<Watched>,
    span: tracing::Span,
}

/// A delivery handed out and not settled yet, as its deadline watch sees it.
#[derive(Debug)]
struct Watched {
    id: u64,
    deadline: Instant,
    /// Set by whoever settles it first: its handler, the deadline, or the
    /// consumer closing.
    settled: AtomicBool,
    /// Set when it is the deadline that settled it: its handler is overdue.
    timed_out: AtomicBool,
}

/// The deliveries handed out, each with a copy of what the deadline needs
/// to settle it without its handler.
#[derive(Default)]
struct Watchlist {
    next_id: AtomicU64,
    watched: Mutex<HashMap<u64, (Arc<Watched>, Arc<RawDelivery>)>>,
    watching: AtomicBool,
    closed: AtomicBool,
}

/// Each consumer's number, which its settlers carry: a settler given to
/// another consumer would acknowledge that consumer's delivery of the same
/// tag.
static CONSUMER_IDS: AtomicU64 = AtomicU64::new(1);

/// A delivery's body, shared with the delivery ([`Delivery::shared_body`]).
#[derive(Clone)]
pub struct Body(Arc<RawDelivery>);

impl AsRef<[u8]> for Body {
    fn as_ref(&self) -> &[u8] {
        &self.0.body
    }
}

impl Body {
    /// The body as text. A delivery is handed out only once its body has
    /// been checked to be JSON, and so UTF-8: this is that text, without
    /// the check repeated byte by byte when it is ASCII.
    pub fn text(&self) -> Option<&str> {
        crate::wire::utf8(&self.0.body).ok()
    }

    /// The body of a message no consumer delivered (a reply: `crate::request`).
    pub(crate) fn of(raw: RawDelivery) -> Body {
        Body(Arc::new(raw))
    }
}

impl std::fmt::Debug for Body {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Body({} bytes)", self.0.body.len())
    }
}

impl Settler {
    /// The delivery tag (unique within its consumer while unsettled).
    pub fn tag(&self) -> u64 {
        self.raw.tag
    }

    /// The body as it arrived, shared rather than copied.
    pub fn shared_body(&self) -> Body {
        Body(self.raw.clone())
    }

    /// Its consumer span (`process`, see [`crate::trace`]): from hand-out
    /// until it is settled.
    pub fn span(&self) -> &tracing::Span {
        &self.span
    }

    /// Whether its deadline ([`ConsumeOptions::timeout`]) has settled it, as
    /// a retry, before its handler did: the handler is overdue, and what it
    /// returns will be discarded. What a pool of handler threads reads to
    /// replace the one still running it.
    pub fn is_overdue(&self) -> bool {
        self.watch.timed_out.load(Ordering::Acquire)
    }
}

impl From<Delivery> for Settler {
    fn from(delivery: Delivery) -> Settler {
        delivery.settler
    }
}

impl Delivery {
    /// The message and what settles it, apart.
    pub fn into_parts(self) -> (Message, Settler) {
        (self.message, self.settler)
    }

    /// What settles it.
    pub fn settler(&self) -> &Settler {
        &self.settler
    }

    /// The delivery tag (unique within this consumer while unsettled).
    pub fn tag(&self) -> u64 {
        self.settler.tag()
    }

    /// The body as it arrived, byte for byte.
    pub fn body(&self) -> &[u8] {
        &self.settler.raw.body
    }

    /// The body as it arrived, shared rather than copied: what a handler
    /// that outlives this borrow keeps (the Ruby extension's delivery
    /// object, whose payload is built from it when first read).
    pub fn shared_body(&self) -> Body {
        self.settler.shared_body()
    }

    /// The message, moved out for a handler that takes it by value (the
    /// push consumer), without a copy of its payload. What is left can
    /// still be settled: settling reads nothing of `message`, which is
    /// empty afterwards. [`Delivery::into_parts`] does the same without
    /// leaving a hollow message behind.
    pub fn take_message(&mut self) -> Message {
        let hollow = Message {
            payload: Value::Null,
            envelope: crate::envelope::Envelope {
                id: String::new(),
                kind: None,
                origin: None,
                timestamp: None,
                attempt: self.settler.attempt,
                headers: crate::headers::Headers::new(),
            },
            delivery: crate::message::DeliveryInfo::default(),
        };
        std::mem::replace(&mut self.message, hollow)
    }

    /// Its consumer span (`process`, see [`crate::trace`]): from hand-out
    /// until it is settled. Run the handler inside it (`.instrument(span)`)
    /// to make the handler's own spans its children.
    pub fn span(&self) -> &tracing::Span {
        self.settler.span()
    }
}

/// What a blocking wait produced.
pub enum Next {
    /// A message to handle.
    Delivery(Box<Delivery>),
    /// Nothing arrived within the wait.
    Empty,
    /// The consumer was stopped or the broker ended the subscription.
    Closed,
}

/// How long a delivery was out before its settlement was decided, and
/// whether its deadline decided it, or the idempotency guard (its verdict
/// came with the outcome: `Guarded`).
#[derive(Debug, Clone, Copy)]
struct Turnaround {
    out: Duration,
    deadline: bool,
    verdict: Option<Verdict>,
}

/// What the `process` event needs of a delivery, taken before the
/// settlement consumes it (only when somebody listens).
struct ProcessFacts {
    message_id: String,
    routing_key: String,
    attempt: u32,
    reason: Option<String>,
    error_class: Option<String>,
}

impl ProcessFacts {
    fn of(raw: &RawDelivery, attempt: u32, settlement: &Settlement) -> ProcessFacts {
        let (reason, error_class) = match settlement {
            Settlement::Accept => (None, None),
            Settlement::Retry { reason, error_class } | Settlement::Reject { reason, error_class } => {
                (Some(reason.clone()), error_class.clone())
            }
            Settlement::Wait { reason, .. } => (Some(reason.clone()), None),
        };
        ProcessFacts {
            message_id: crate::wire::envelope_of(&raw.props).id,
            routing_key: raw.routing_key.clone(),
            attempt,
            reason,
            error_class,
        }
    }
}

/// Counters a consumer keeps; read with [`Consumer::stats`].
#[derive(Debug, Default)]
struct Counters {
    accepted: AtomicU64,
    retried: AtomicU64,
    dead_lettered: AtomicU64,
    waited: AtomicU64,
    timed_out: AtomicU64,
    abandoned: AtomicU64,
}

/// A snapshot of a consumer's counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ConsumerStats {
    /// Settled by acceptance.
    pub accepted: u64,
    /// Copied to a rung of the retry ladder.
    pub retried: u64,
    /// Copied to the DLQ (rejected, exhausted, or undecodable).
    pub dead_lettered: u64,
    /// Copied to a rung without spending an attempt, waiting for another
    /// handler's idempotency claim ([`Outcome::Wait`]).
    pub waited: u64,
    /// Settled by the handler deadline (as retries) because their handler
    /// had not finished.
    pub timed_out: u64,
    /// Settlements discarded because the deadline had settled the delivery
    /// first: handlers that finished after their timeout.
    pub abandoned: u64,
}

/// The delivery's process span with what its settlement is recorded on it.
fn settled_span(span: &tracing::Span, settlement: &Settlement) -> tracing::Span {
    span.record("acemq.outcome", match settlement {
        Settlement::Accept => "accepted",
        Settlement::Retry { .. } => "retried",
        Settlement::Reject { .. } => "dead_lettered",
        Settlement::Wait { .. } => "waiting",
    });
    span.clone()
}

/// A pull consumer on one queue.
pub struct Consumer {
    /// Its number, which its settlers carry ([`Consumer::owns`]).
    id: u64,
    conn: Connection,
    queue: String,
    options: ConsumeOptions,
    link: Link,
    counters: Counters,
    stopped: AtomicBool,
    background: Background,
    watchlist: Watchlist,
    warnings: Vec<String>,
    flow: flow::Flow,
}

/// Settlements running on the runtime (see [`Consumer::settle_later`]):
/// how many, and the errors they met, for the caller to collect.
#[derive(Default)]
struct Background {
    running: std::sync::atomic::AtomicUsize,
    idle: tokio::sync::Notify,
    has_errors: AtomicBool,
    errors: std::sync::Mutex<Vec<Error>>,
}

/// The DLQ and one rung per distinct delay of `queue`'s ladder. Declared by
/// every consumer: a reject must never find its queue missing.
fn ladder(conn: &Connection, queue: &str, options: &ConsumeOptions) -> Topology {
    let kind = options.queue_type.or_else(|| conn.applied_type(queue)).unwrap_or_default();
    let mut t = Topology::new();
    t = t.queue_spec(QueueSpec::dead_letters_of(queue, kind));
    for delay in options.retry.rungs() {
        t = t.queue_spec(QueueSpec::delay(rung_name(queue, delay), delay, queue).with_type(kind));
    }
    t
}

impl Consumer {
    pub(crate) async fn open(conn: Connection, queue: &str, options: ConsumeOptions) -> Result<Consumer> {
        options.retry.validate()?;
        if queue.is_empty() {
            return Err(Error::invalid("consume needs a queue name"));
        }
        crate::limits::ladder(queue, &options.retry)?;
        ConsumeOptions::check_sizes(options.concurrency as u64, Some(u64::from(options.prefetch)), 1)?;
        // RabbitMQ 4.3 no longer applies consumer_timeout to classic queues
        // (measured: a classic queue's consumer held a delivery 75 s past a
        // 2 s timeout untouched), so there the handler deadline answers
        // only to the claim. Only a queue known to be classic is spared: one
        // of unknown type may be quorum.
        let known_type = options.queue_type.or_else(|| conn.applied_type(queue));
        let broker_timeout = match conn.broker_version() {
            Some(v) if !v.consumer_timeout_covers_classic_queues() && known_type == Some(QueueType::Classic) => Duration::MAX,
            _ => options.broker_consumer_timeout,
        };
        crate::checks::handler_timeout(options.timeout, broker_timeout, options.claim_timeout)?;
        let flow = flow::Flow::new(queue, &options)?;
        let warnings: Vec<String> = [
            crate::checks::delivery_limit(
                queue,
                conn.applied_delivery_limit(queue).or_else(|| {
                    // A quorum queue declared elsewhere without a limit has
                    // the broker's default (20 on 4.x, none on 3.10).
                    (known_type == Some(QueueType::Quorum)).then(|| conn.broker_version().and_then(|v| v.default_delivery_limit())).flatten()
                }),
                &options.retry,
            ),
            crate::checks::ladder_and_claim(queue, &options.retry, options.claim_timeout),
        ]
        .into_iter()
        .flatten()
        .collect();
        // Subscribing and declaring the ladder each take a channel of their
        // own and a few round trips: done together, opening costs the
        // longer of the two instead of both. Either way nothing is handled
        // before both are done, so a reject never finds its queue missing.
        let ladder = ladder(&conn, queue, &options);
        let (link, declared) =
            futures_lite::future::zip(conn.backend().subscribe(queue, options.prefetch), conn.backend().apply(&ladder)).await;
        let consumer = Consumer {
            id: CONSUMER_IDS.fetch_add(1, Ordering::Relaxed),
            conn,
            queue: queue.to_owned(),
            options,
            link: link?,
            counters: Counters::default(),
            stopped: AtomicBool::new(false),
            background: Background::default(),
            watchlist: Watchlist::default(),
            warnings,
            flow,
        };
        if let Err(e) = declared {
            consumer.close().await;
            return Err(e);
        }
        Ok(consumer)
    }

    async fn declare_ladder(&self) -> Result<()> {
        self.conn.backend().apply(&ladder(&self.conn, &self.queue, &self.options)).await
    }

    /// The queue.
    pub fn queue(&self) -> &str {
        &self.queue
    }

    /// What the startup checks found questionable in its settings (a
    /// delivery limit below `max_attempts`, a ladder shorter than the
    /// claim): each says what to change. Empty when nothing was.
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// The options it was opened with.
    pub fn options(&self) -> &ConsumeOptions {
        &self.options
    }

    /// Counters so far.
    pub fn stats(&self) -> ConsumerStats {
        ConsumerStats {
            accepted: self.counters.accepted.load(Ordering::Relaxed),
            retried: self.counters.retried.load(Ordering::Relaxed),
            dead_lettered: self.counters.dead_lettered.load(Ordering::Relaxed),
            waited: self.counters.waited.load(Ordering::Relaxed),
            timed_out: self.counters.timed_out.load(Ordering::Relaxed),
            abandoned: self.counters.abandoned.load(Ordering::Relaxed),
        }
    }

    /// How long the subscription has been without a channel (the broker
    /// unreachable, the queue gone), None while it is subscribed. A runner
    /// compares it with its recovery bound ([`crate::runner::Observation`]).
    pub fn down_for(&self) -> Option<Duration> {
        self.link.down_for()
    }

    /// How many times the subscription has lost its channel and subscribed
    /// again by itself (0 on `memory://`): what a runner logs, since nothing
    /// else says a broker restart happened.
    pub fn resubscriptions(&self) -> u64 {
        self.link.resubscriptions()
    }

    /// Why the broker ended the subscription, if it did.
    pub fn failure(&self) -> Option<Error> {
        self.link.failure()
    }

    /// Whether `settler` is of a delivery this consumer handed out: only
    /// then may it settle it here (another consumer's tag names another
    /// message on this one's channel).
    pub fn owns(&self, settler: &Settler) -> bool {
        settler.consumer == self.id
    }

    /// How many deliveries are handed out and not settled yet, by their
    /// handler or their deadline. One whose handler dropped it unsettled is
    /// counted until its deadline settles it.
    pub fn in_flight(&self) -> usize {
        self.watchlist.watched.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// The next message, or None once stopped. A delivery that cannot be a
    /// message (not JSON, a foreign content type) is dead-lettered here with
    /// the reason, and the wait goes on.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a message is taken from the buffer only in the poll that
    /// returns it. A future dropped while it dead-letters an undecodable
    /// delivery leaves that one unacknowledged, and the broker delivers it
    /// again when the subscription closes; nothing is lost.
    pub async fn next(&self) -> Option<Delivery> {
        loop {
            self.flow_token().await;
            let Some(raw) = self.link.pop().await else {
                self.flow_refund();
                return None;
            };
            if let Some(d) = self.parse_delivery(raw).await {
                if self.flow_admits(d.settler.watch.id) {
                    return Some(d);
                }
                // Its circuit breaker is open: back to the queue, unspent.
                self.flow_refund();
                if self.claim(&d.settler) {
                    self.link.requeue(d.tag()).await;
                }
            } else {
                self.flow_refund();
            }
        }
    }

    /// Like [`Consumer::next`] for a thread outside the runtime: wait at most
    /// `timeout`. Must not be called from inside a tokio runtime. A delivery
    /// that cannot be a message is dead-lettered in the background, as a
    /// handler's reject is (see [`Consumer::settle_later`]): the calling
    /// thread (a Ruby thread holding the GVL) never waits on the broker for
    /// it, and a copy that fails reaches [`Consumer::take_errors`].
    pub fn next_blocking(self: &Arc<Self>, timeout: Duration) -> Next {
        self.next_blocking_as(timeout, Payload::Parsed)
    }

    /// [`Consumer::next_blocking`], reading the payload as `payload` says
    /// (see [`Payload::Checked`]).
    pub fn next_blocking_as(self: &Arc<Self>, timeout: Duration, payload: Payload) -> Next {
        if !self.flow_token_blocking(timeout) {
            return Next::Empty;
        }
        match self.link.pop_blocking(timeout) {
            Pop::Item(raw) => match decode_as(&self.queue, &raw, payload) {
                Ok(message) => {
                    self.watch_deadlines();
                    let d = self.hand_out(message, raw);
                    if self.flow_admits(d.settler.watch.id) {
                        return Next::Delivery(Box::new(d));
                    }
                    // Its circuit breaker is open: back to the queue, unspent.
                    self.flow_refund();
                    if self.claim(&d.settler) {
                        let tag = d.tag();
                        self.in_background(move |this| async move {
                            this.link.requeue(tag).await;
                            Ok(())
                        });
                    }
                    Next::Empty
                }
                Err(undecodable) => {
                    self.flow_refund();
                    self.in_background(move |this| async move { this.dead_letter(raw, &undecodable.reason, None).await });
                    Next::Empty
                }
            },
            Pop::Empty => {
                self.flow_refund();
                Next::Empty
            }
            Pop::Closed => {
                self.flow_refund();
                Next::Closed
            }
        }
    }

    /// Like [`Consumer::next_blocking`] without waiting at all.
    pub fn try_next(self: &Arc<Self>) -> Next {
        self.next_blocking(Duration::ZERO)
    }

    /// [`Consumer::try_next`], reading the payload as `payload` says.
    pub fn try_next_as(self: &Arc<Self>, payload: Payload) -> Next {
        self.next_blocking_as(Duration::ZERO, payload)
    }

    /// Wake every thread blocked in [`Consumer::next_blocking`] (they return `Empty`).
    pub fn wake(&self) {
        self.link.wake_all();
    }

    async fn parse_delivery(&self, raw: RawDelivery) -> Option<Delivery> {
        match decode(&self.queue, &raw) {
            Ok(message) => Some(self.hand_out(message, raw)),
            Err(undecodable) => {
                let _ = self.dead_letter(raw, &undecodable.reason, None).await;
                None
            }
        }
    }

    /// Settle a delivery with what its handler produced: accept acknowledges;
    /// retry copies to the next rung (or the DLQ past `max_attempts`); reject
    /// copies to the DLQ. A copy is confirmed by the broker before the
    /// original is acknowledged, so a crash in between duplicates and never
    /// loses. If the copy cannot be made the original goes back to the queue
    /// and the error is returned.
    ///
    /// A delivery its deadline has settled already (see
    /// [`ConsumeOptions::timeout`]) is not settled again: the outcome is
    /// discarded and counted as `abandoned`.
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe: the delivery is claimed when this is first polled,
    /// so a dropped settle leaves it unsettled (and uncounted) until the
    /// subscription closes, when the broker redelivers it. A copy already
    /// confirmed is not taken back: that is a duplicate, never a loss. Use
    /// [`Consumer::settle_later`] to settle without awaiting.
    pub async fn settle(&self, delivery: impl Into<Settler>, outcome: Outcome) -> Result<()> {
        self.settle_guarded(delivery, outcome.into()).await
    }

    /// [`Consumer::settle`] with the idempotency guard's verdict beside the
    /// outcome ([`Before::guarded_without_running`](crate::idempotency::Before::guarded_without_running)):
    /// the same settlement, reported as `duplicate` or `in_progress`.
    ///
    /// # Cancel safety
    ///
    /// As [`Consumer::settle`].
    pub async fn settle_guarded(&self, delivery: impl Into<Settler>, guarded: Guarded) -> Result<()> {
        let Guarded { outcome, verdict } = guarded;
        let settler = delivery.into();
        if !self.owns(&settler) {
            return Err(not_ours(&settler));
        }
        if !self.claim(&settler) {
            return Ok(());
        }
        let attempt = settler.attempt;
        let settlement = outcome.settlement();
        self.flow_settled(settler.watch.id, matches!(settlement, Settlement::Retry { .. }));
        let span = settled_span(&settler.span, &settlement);
        let turnaround = Turnaround { verdict, ..self.turnaround(&settler.watch, false) };
        tracing::Instrument::instrument(self.settle_raw(settler.raw, attempt, settlement, turnaround), span).await
    }

    /// The settlement's rules, for a delivery already claimed by whoever
    /// settles it (its handler, or its deadline).
    async fn settle_raw(&self, raw: Arc<RawDelivery>, attempt: u32, settlement: Settlement, turnaround: Turnaround) -> Result<()> {
        let facts = crate::events::enabled().then(|| ProcessFacts::of(&raw, attempt, &settlement));
        let settled = match settlement {
            Settlement::Accept => {
                self.link.ack(raw.tag);
                self.counters.accepted.fetch_add(1, Ordering::Relaxed);
                Ok(ProcessOutcome::Accepted)
            }
            // A copy is made of it: the watch has let go of its share by
            // now (claimed), so this takes the delivery without copying.
            Settlement::Retry { reason, error_class } => {
                self.retry_or_exhaust(Arc::unwrap_or_clone(raw), attempt, &reason, error_class.as_deref()).await
            }
            Settlement::Reject { reason, error_class } => self
                .dead_letter(Arc::unwrap_or_clone(raw), &reason, error_class.as_deref())
                .await
                .map(|()| ProcessOutcome::DeadLettered),
            Settlement::Wait { reason, up_to } => self.wait(Arc::unwrap_or_clone(raw), attempt, &reason, up_to).await,
        };
        if let Some(facts) = facts {
            self.processed(facts, turnaround, settled.as_ref().ok().copied());
        }
        settled.map(|_| ())
    }

    /// How long the delivery behind `watch` has been out, and whether its
    /// deadline is what settles it.
    fn turnaround(&self, watch: &Watched, deadline: bool) -> Turnaround {
        let out = watch.deadline.checked_sub(self.options.timeout).map_or(Duration::ZERO, |t| t.elapsed());
        Turnaround { out, deadline, verdict: None }
    }

    /// The `process` event for a settlement (`settled` None: it failed).
    #[cold]
    fn processed(&self, facts: ProcessFacts, turnaround: Turnaround, settled: Option<ProcessOutcome>) {
        let outcome = match (settled, turnaround.verdict) {
            (None, _) => ProcessOutcome::Failed,
            (Some(ProcessOutcome::Retried), _) if turnaround.deadline => ProcessOutcome::TimedOut,
            (Some(ProcessOutcome::Accepted), Some(Verdict::Duplicate)) => ProcessOutcome::Duplicate,
            (Some(ProcessOutcome::Retried), Some(Verdict::InProgress)) => ProcessOutcome::InProgress,
            (Some(o), _) => o,
        };
        crate::events::emit(|| Event::Process(events::Process {
            consumer: self.options.name.clone().unwrap_or_else(|| self.queue.clone()),
            queue: self.queue.clone(),
            routing_key: facts.routing_key,
            message_id: facts.message_id,
            attempt: facts.attempt,
            duration: turnaround.out,
            outcome,
            reason: facts.reason,
            error_class: facts.error_class,
        }));
    }

    /// A retry, or past `max_attempts` a dead letter saying so.
    async fn retry_or_exhaust(&self, raw: RawDelivery, attempt: u32, reason: &str, error_class: Option<&str>) -> Result<ProcessOutcome> {
        if attempt >= self.options.retry.max_attempts {
            tracing::Span::current().record("acemq.outcome", "dead_lettered");
            let reason = format!("retries exhausted after {attempt} attempts: {reason}");
            self.dead_letter(raw, &reason, error_class).await.map(|()| ProcessOutcome::DeadLettered)
        } else {
            self.retry(raw, attempt, reason, error_class).await.map(|()| ProcessOutcome::Retried)
        }
    }

    /// A copy whose key another handler has claimed goes round the ladder
    /// without spending an attempt: the other handler may be alive and about
    /// to confirm (then it is a duplicate), or dead (then its claim expires
    /// after `up_to` and the message runs). Each wait takes the next longer
    /// rung. Past `up_to` since the first wait — a handler running longer
    /// than its claim — it is an ordinary retry; and with no rungs at all
    /// (`max_attempts` 1) there is nowhere to wait.
    async fn wait(&self, mut raw: RawDelivery, attempt: u32, reason: &str, up_to: Duration) -> Result<ProcessOutcome> {
        let max = self.options.retry.max_attempts;
        let now = now_secs();
        let h = raw.props.headers();
        let since = h.get(WAITING_SINCE_HEADER).and_then(Value::as_u64).unwrap_or(now);
        let waits = h.get(WAITS_HEADER).and_then(Value::as_u64).unwrap_or(0);
        let waited = Duration::from_secs(now.saturating_sub(since));
        if max <= 1 || waited > up_to {
            let reason = if max <= 1 { reason.to_owned() } else { format!("{reason}; waited {}s, longer than the claim timeout", waited.as_secs()) };
            return self.retry_or_exhaust(raw, attempt, &reason, None).await;
        }
        let step = u32::try_from(u64::from(attempt).saturating_add(waits)).unwrap_or(u32::MAX).clamp(1, max - 1);
        let rung = rung_name(&self.queue, self.options.retry.delay_after(step));
        self.failure_headers(&mut raw, reason, None);
        let h = raw.props.headers_mut();
        h.insert(WAITING_SINCE_HEADER.into(), Value::from(since));
        h.insert(WAITS_HEADER.into(), Value::from(waits + 1));
        h.insert(ATTEMPT_HEADER.into(), Value::from(attempt));
        self.copy_then_ack(raw, &rung).await?;
        self.counters.waited.fetch_add(1, Ordering::Relaxed);
        Ok(ProcessOutcome::Waited)
    }

    /// A delivery just taken off the queue, watched by its deadline.
    fn hand_out(&self, message: Message, raw: RawDelivery) -> Delivery {
        let watch = Arc::new(Watched {
            id: self.watchlist.next_id.fetch_add(1, Ordering::Relaxed),
            deadline: Instant::now() + self.options.timeout,
            settled: AtomicBool::new(false),
            timed_out: AtomicBool::new(false),
        });
        let raw = Arc::new(raw);
        self.watchlist.watched.lock().unwrap_or_else(|p| p.into_inner()).insert(watch.id, (watch.clone(), raw.clone()));
        let span = crate::trace::process_span(&message, raw.tag);
        let settler = Settler { consumer: self.id, attempt: message.envelope.attempt, raw, watch, span };
        Delivery { message, settler }
    }

    /// Take the right to settle `settler`'s delivery: false when its
    /// deadline settled it already (or the consumer closed), and then what
    /// its handler produced is discarded.
    fn claim(&self, settler: &Settler) -> bool {
        if settler.watch.settled.swap(true, Ordering::AcqRel) {
            self.counters.abandoned.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        self.watchlist.watched.lock().unwrap_or_else(|p| p.into_inner()).remove(&settler.watch.id);
        true
    }

    /// Keep the handler deadline ([`ConsumeOptions::timeout`]): a task on
    /// the runtime settles, as a retry, every delivery handed out longer
    /// ago than that. Started by the first delivery a shared consumer hands
    /// out (a [`ConsumerHandle`], [`Consumer::next_blocking`]); a pull
    /// consumer used through [`Consumer::next`] starts it by calling this.
    /// It ends when the consumer is closed or dropped.
    pub fn watch_deadlines(self: &Arc<Self>) {
        self.watch_flow();
        if self.watchlist.watching.swap(true, Ordering::AcqRel) {
            return;
        }
        let weak = Arc::downgrade(self);
        let tick = self.deadline_tick();
        crate::runtime::handle().spawn(async move {
            loop {
                tokio::time::sleep(tick).await;
                let Some(this) = weak.upgrade() else { return };
                if this.watchlist.closed.load(Ordering::Acquire) {
                    return;
                }
                this.expire(Instant::now());
            }
        });
    }

    /// How often the deadline watch looks: a delivery is settled by its
    /// deadline within this much after it passed ([`Settler::is_overdue`]
    /// turns true then), so whoever asks about overdue handlers need not
    /// ask more often.
    pub fn deadline_tick(&self) -> Duration {
        (self.options.timeout / 4).clamp(Duration::from_millis(10), Duration::from_secs(1))
    }

    /// Settle, as retries, the deliveries whose deadline has passed.
    fn expire(self: &Arc<Self>, now: Instant) {
        let expired: Vec<(Arc<RawDelivery>, Turnaround, u64)> = {
            let mut watched = self.watchlist.watched.lock().unwrap_or_else(|p| p.into_inner());
            let due: Vec<u64> = watched.iter().filter(|(_, (w, _))| w.deadline <= now).map(|(id, _)| *id).collect();
            due.into_iter()
                .filter_map(|id| watched.remove(&id))
                .filter(|(w, _)| !w.settled.swap(true, Ordering::AcqRel))
                .inspect(|(w, _)| w.timed_out.store(true, Ordering::Release))
                .map(|(w, raw)| (raw, self.turnaround(&w, true), w.id))
                .collect()
        };
        for (raw, turnaround, id) in expired {
            self.flow_settled(id, true);
            self.counters.timed_out.fetch_add(1, Ordering::Relaxed);
            let attempt = crate::wire::envelope_of(&raw.props).attempt;
            let reason = format!(
                "the handler did not finish within its timeout of {}: settled as a retry; what it returns later is discarded",
                crate::checks::human(self.options.timeout)
            );
            let settlement = Settlement::Retry { reason, error_class: Some(TIMEOUT_CLASS.into()) };
            self.in_background(move |this| async move { this.settle_raw(raw, attempt, settlement, turnaround).await });
        }
    }

    /// Settle without waiting: an accept is queued at once, a retry or reject
    /// (a copy to publish and have confirmed before the original is
    /// acknowledged) runs on the runtime while the caller goes on to the next
    /// delivery. That is what keeps a handler thread that retries from running
    /// at one broker round trip per message: the copies of many deliveries
    /// are in flight together, bounded by the prefetch. What goes wrong is
    /// collected for [`Consumer::take_errors`]; the rule is unchanged (a copy
    /// that cannot be made puts the original back on the queue).
    /// [`Consumer::close`] waits for them.
    ///
    /// A settler of another consumer's delivery settles nothing here: its
    /// error is collected as the others are.
    pub fn settle_later(self: &Arc<Self>, delivery: impl Into<Settler>, outcome: Outcome) {
        self.settle_later_guarded(delivery, outcome.into());
    }

    /// [`Consumer::settle_later`] with the idempotency guard's verdict
    /// beside the outcome (see [`Consumer::settle_guarded`]).
    pub fn settle_later_guarded(self: &Arc<Self>, delivery: impl Into<Settler>, guarded: Guarded) {
        let Guarded { outcome, verdict } = guarded;
        let settler = delivery.into();
        if matches!(outcome, Outcome::Ack(crate::ack::Ack::Accept)) {
            self.accept_as(settler, verdict);
            return;
        }
        if !self.owns(&settler) {
            self.keep_error(not_ours(&settler));
            return;
        }
        if !self.claim(&settler) {
            return;
        }
        let attempt = settler.attempt;
        let settlement = outcome.settlement();
        self.flow_settled(settler.watch.id, matches!(settlement, Settlement::Retry { .. }));
        let span = settled_span(&settler.span, &settlement);
        let turnaround = Turnaround { verdict, ..self.turnaround(&settler.watch, false) };
        self.in_background(move |this| {
            tracing::Instrument::instrument(async move { this.settle_raw(settler.raw, attempt, settlement, turnaround).await }, span)
        });
    }

    /// Run a settlement on the runtime, counted (close waits for it) and
    /// with its error kept for take_errors.
    fn in_background<F, Fut>(self: &Arc<Self>, work: F)
    where
        F: FnOnce(Arc<Self>) -> Fut + Send + 'static,
        Fut: Future<Output = Result<()>> + Send + 'static,
    {
        self.background.running.fetch_add(1, Ordering::AcqRel);
        let this = self.clone();
        crate::runtime::handle().spawn(async move {
            if let Err(e) = work(this.clone()).await {
                this.keep_error(e);
            }
            if this.background.running.fetch_sub(1, Ordering::AcqRel) == 1 {
                this.background.idle.notify_waiters();
            }
        });
    }

    /// Keep `e` for [`Consumer::take_errors`].
    fn keep_error(&self, e: Error) {
        self.background.errors.lock().unwrap_or_else(|p| p.into_inner()).push(e);
        self.background.has_errors.store(true, Ordering::Release);
    }

    /// Errors met by [`Consumer::settle_later`] since the last call. Each
    /// one's message went back to its queue.
    pub fn take_errors(&self) -> Vec<Error> {
        if !self.background.has_errors.swap(false, Ordering::AcqRel) {
            return Vec::new();
        }
        std::mem::take(&mut *self.background.errors.lock().unwrap_or_else(|p| p.into_inner()))
    }

    async fn background_idle(&self) {
        loop {
            let idle = self.background.idle.notified();
            if self.background.running.load(Ordering::Acquire) == 0 {
                return;
            }
            idle.await;
        }
    }

    /// Accept without waiting for anything: the acknowledgement is queued and
    /// coalesced with its neighbours. The same as settling with
    /// `Outcome::Ack(Ack::Accept)`, callable from outside the runtime.
    ///
    /// A settler of another consumer's delivery accepts nothing here: its
    /// error is collected for [`Consumer::take_errors`].
    pub fn accept(&self, delivery: impl Into<Settler>) {
        self.accept_as(delivery.into(), None);
    }

    /// `accept`, reported as the guard's verdict says (a duplicate).
    fn accept_as(&self, settler: Settler, verdict: Option<Verdict>) {
        if !self.owns(&settler) {
            self.keep_error(not_ours(&settler));
            return;
        }
        if !self.claim(&settler) {
            return;
        }
        settler.span.record("acemq.outcome", "accepted");
        self.flow_settled(settler.watch.id, false);
        self.link.ack(settler.raw.tag);
        self.counters.accepted.fetch_add(1, Ordering::Relaxed);
        if crate::events::enabled() {
            let facts = ProcessFacts::of(&settler.raw, settler.attempt, &Settlement::Accept);
            self.processed(facts, Turnaround { verdict, ..self.turnaround(&settler.watch, false) }, Some(ProcessOutcome::Accepted));
        }
    }

    fn failure_headers(&self, raw: &mut RawDelivery, reason: &str, error_class: Option<&str>) {
        let h = raw.props.headers_mut();
        h.insert(REASON_HEADER.into(), Value::from(crate::limits::bounded(reason, crate::limits::MAX_REASON)));
        match error_class {
            Some(c) => h.insert(ERROR_CLASS_HEADER.into(), Value::from(crate::limits::bounded(c, crate::limits::MAX_SHORT))),
            None => h.remove(ERROR_CLASS_HEADER),
        };
        h.insert(FAILED_AT_HEADER.into(), Value::from(now_secs()));
        h.insert(QUEUE_HEADER.into(), Value::from(self.queue.as_str()));
        // The first failure records where the message was really going; a
        // copy coming back from a rung has the rung's exchange and key.
        if !h.contains_key(ORIGINAL_EXCHANGE_HEADER) {
            h.insert(ORIGINAL_EXCHANGE_HEADER.into(), Value::from(raw.exchange.as_str()));
            h.insert(ORIGINAL_ROUTING_KEY_HEADER.into(), Value::from(raw.routing_key.as_str()));
        }
    }

    async fn retry(&self, mut raw: RawDelivery, attempt: u32, reason: &str, error_class: Option<&str>) -> Result<()> {
        let delay = self.options.retry.delay_after(attempt);
        let rung = rung_name(&self.queue, delay);
        self.failure_headers(&mut raw, reason, error_class);
        raw.props.headers_mut().insert(ATTEMPT_HEADER.into(), Value::from(attempt + 1));
        raw.props.headers_mut().remove(WAITING_SINCE_HEADER);
        raw.props.headers_mut().remove(WAITS_HEADER);
        let id = crate::events::enabled().then(|| crate::wire::envelope_of(&raw.props).id);
        self.copy_then_ack(raw, &rung).await?;
        self.counters.retried.fetch_add(1, Ordering::Relaxed);
        crate::events::emit(|| Event::Retry(events::Retry {
            queue: self.queue.clone(),
            message_id: id.unwrap_or_default(),
            attempt,
            rung,
            reason: reason.to_owned(),
            error_class: error_class.map(str::to_owned),
        }));
        Ok(())
    }

    pub(crate) async fn dead_letter(&self, mut raw: RawDelivery, reason: &str, error_class: Option<&str>) -> Result<()> {
        self.failure_headers(&mut raw, reason, error_class);
        let attempt = crate::wire::envelope_of(&raw.props).attempt;
        raw.props.headers_mut().insert(ATTEMPT_HEADER.into(), Value::from(attempt));
        let id = crate::events::enabled().then(|| crate::wire::envelope_of(&raw.props).id);
        self.copy_then_ack(raw, &dlq_name(&self.queue)).await?;
        self.counters.dead_lettered.fetch_add(1, Ordering::Relaxed);
        crate::events::emit(|| Event::DeadLetter(events::DeadLetter {
            queue: self.queue.clone(),
            message_id: id.unwrap_or_default(),
            attempt,
            dlq: dlq_name(&self.queue),
            reason: reason.to_owned(),
            error_class: error_class.map(str::to_owned),
        }));
        Ok(())
    }

    /// Publish the copy to `target` through the default exchange and wait for
    /// its confirm; only then acknowledge the original. A target queue that
    /// has gone (somebody deleted the DLQ) is declared again and the copy
    /// retried once. If the copy still fails, the original is requeued:
    /// nothing is acknowledged into nothing.
    async fn copy_then_ack(&self, mut raw: RawDelivery, target: &str) -> Result<()> {
        crate::wire::copy_props(&mut raw.props);
        let backend = self.conn.backend();
        let mut result = async { backend.send("", target, &raw.body, &raw.props).await?.wait().await }.await;
        if matches!(&result, Err(e) if *e.kind() == ErrorKind::Unroutable) {
            let redeclared = self.declare_ladder().await;
            result = match redeclared {
                Ok(()) => async { backend.send("", target, &raw.body, &raw.props).await?.wait().await }.await,
                Err(e) => Err(e),
            };
        }
        match result {
            Ok(()) => {
                crate::fault::point("exit-after-copy");
                self.link.ack(raw.tag);
                Ok(())
            }
            Err(e) => {
                // Not at once: a copy that fails now (a DLQ refusing
                // messages, a broker under memory alarm) fails again at
                // once, and an immediate requeue is a hot loop of
                // redeliveries. The delivery stays ours meanwhile, counted
                // against the prefetch, so the loop slows to this pace.
                tokio::time::sleep(REQUEUE_PAUSE).await;
                self.link.requeue(raw.tag).await;
                Err(Error::new(
                    e.kind().clone(),
                    format!("could not copy the message to {target} ({e}); it was put back on {}", self.queue),
                ))
            }
        }
    }

    /// Stop receiving. Messages already handed out can still be settled;
    /// buffered ones go back to the queue. Call [`Consumer::close`] after the
    /// handlers are done.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: once first polled the consumer is stopped; a drop only
    /// skips waiting for the broker's cancel-ok.
    pub async fn stop(&self) {
        if !self.stopped.swap(true, Ordering::AcqRel) {
            self.link.stop(!self.options.keep_order).await;
        }
    }

    /// Stop, send the last acknowledgements and release the subscription.
    /// Anything unsettled goes back to the queue.
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe: dropped part way, settlements in the background may
    /// still be running and the subscription may stay open (stopped). Await
    /// it to the end.
    pub async fn close(&self) {
        self.stop().await;
        // Settlements still in flight finish first: their acknowledgements
        // must go out on this subscription's channel.
        let _ = tokio::time::timeout(Duration::from_secs(30), self.background_idle()).await;
        // What is still handed out goes back to the queue with the
        // subscription; a handler settling one later is discarded.
        self.watchlist.closed.store(true, Ordering::Release);
        for (w, _) in self.watchlist.watched.lock().unwrap_or_else(|p| p.into_inner()).drain().map(|(_, v)| v) {
            w.settled.store(true, Ordering::Release);
        }
        self.link.close().await;
    }
}

/// What settling another consumer's delivery is.
fn not_ours(settler: &Settler) -> Error {
    Error::invalid(format!("delivery {} was handed out by another consumer: settle it with that one", settler.tag()))
}

/// A handler's result, a panic settled as a retry.
fn unwound(done: std::thread::Result<Guarded>) -> Guarded {
    done.unwrap_or_else(|panic| {
        let what = panic
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a non-string payload".to_owned());
        Outcome::Raised { class: "panic".into(), message: format!("the handler panicked: {what}"), fatal: false }.into()
    })
}

/// A running push consumer. Dropping it does not stop it; call
/// [`ConsumerHandle::cancel`].
pub struct ConsumerHandle {
    consumer: Arc<Consumer>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl ConsumerHandle {
    pub(crate) fn spawn<H: crate::Handler>(consumer: Consumer, handler: H) -> ConsumerHandle {
        let consumer = Arc::new(consumer);
        consumer.watch_deadlines();
        let handler = Arc::new(handler);
        let tasks = (0..consumer.options.concurrency)
            .map(|_| {
                let c = consumer.clone();
                let h = handler.clone();
                tokio::spawn(async move {
                    while let Some(mut d) = c.next().await {
                        // The handler runs on this worker's task, polled in
                        // place (a task of its own per delivery cost a
                        // spawn and a cross-thread wake-up each). Past its
                        // deadline the same future, never dropped mid-await,
                        // moves to a task of its own to finish there, its
                        // outcome discarded, and this worker goes on to the
                        // next delivery. A panic is caught where it happens
                        // and settled as a retry.
                        use futures_lite::FutureExt as _;
                        let (h, message) = (h.clone(), d.take_message());
                        let mut running = Box::pin(std::panic::AssertUnwindSafe(tracing::Instrument::instrument(
                            async move { h.handle_guarded(message).await },
                            d.span().clone(),
                        ))
                        .catch_unwind());
                        // A handler that is done at its first poll (it
                        // awaited nothing that was not ready) settles
                        // without a deadline timer registered and cancelled
                        // for it.
                        if let Some(done) = futures_lite::future::poll_once(&mut running).await {
                            c.settle_later_guarded(d, unwound(done));
                            continue;
                        }
                        let deadline = tokio::time::Instant::from_std(d.settler.watch.deadline);
                        tokio::select! {
                            biased;
                            done = &mut running => c.settle_later_guarded(d, unwound(done)),
                            _ = tokio::time::sleep_until(deadline) => {
                                let c = c.clone();
                                tokio::spawn(async move {
                                    let outcome = unwound(running.await);
                                    c.settle_later_guarded(d, outcome);
                                });
                            }
                        }
                    }
                })
            })
            .collect();
        ConsumerHandle { consumer, tasks }
    }

    /// The consumer, for its counters.
    pub fn consumer(&self) -> &Consumer {
        &self.consumer
    }

    /// Stop taking deliveries, and nothing else: handlers in progress go on
    /// and settle. What a shutdown does to every consumer first, before it
    /// waits for any of them ([`crate::runner::drain`]), so that one slow
    /// consumer does not keep the others taking work meanwhile.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: the consumer is stopped as soon as this is first polled.
    pub async fn stop_taking(&self) {
        self.consumer.stop().await;
    }

    /// Stop, let the handlers in progress finish until `deadline`, then
    /// close. A handler still running at the deadline is abandoned: its task
    /// is aborted at its next await, its delivery is never settled, and
    /// closing the subscription gives the message back to the broker, which
    /// delivers it again. Never acknowledged unrun, never lost.
    ///
    /// A handler that blocks its thread instead of awaiting cannot be
    /// aborted until it yields; closing does not wait for it.
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe: a dropped drain leaves the handlers running and the
    /// subscription open (stopped). Drain to the end; shorten the deadline
    /// instead.
    pub async fn drain(self, deadline: std::time::Instant) -> crate::runner::Drained {
        self.consumer.stop().await;
        let mut abandoned = 0;
        for mut task in self.tasks {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if tokio::time::timeout(left, &mut task).await.is_err() {
                task.abort();
                abandoned += 1;
            }
        }
        self.consumer.close().await;
        crate::runner::Drained { abandoned }
    }

    /// Stop, let the handlers in progress finish and settle, then close.
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe: a dropped cancel leaves the handlers running and the
    /// subscription open (stopped). Use [`ConsumerHandle::drain`] to bound
    /// the wait.
    pub async fn cancel(self) {
        self.consumer.stop().await;
        for t in self.tasks {
            let _ = t.await;
        }
        self.consumer.close().await;
    }
}

#[cfg(test)]
mod tests {
    use super::ConsumeOptions;

    #[test]
    fn the_default_prefetch_is_two_deliveries_or_two_batches_per_handler() {
        assert_eq!(ConsumeOptions::with_concurrency(1).prefetch, 32);
        assert_eq!(ConsumeOptions::with_concurrency(40).prefetch, 80);
        assert_eq!(ConsumeOptions::with_batches(1, 100).prefetch, 200);
        assert_eq!(ConsumeOptions::with_batches(4, 100).prefetch, 800);
        assert_eq!(ConsumeOptions::with_batches(1000, 1000).prefetch, u16::MAX);
    }

    #[test]
    fn a_guarded_handlers_deadline_is_its_claims_when_that_is_shorter() {
        use std::time::Duration;
        let short = ConsumeOptions::default().guarded_by(Duration::from_secs(60));
        assert_eq!((short.timeout, short.claim_timeout), (Duration::from_secs(60), Some(Duration::from_secs(60))));
        let long = ConsumeOptions::default().guarded_by(Duration::from_secs(3600));
        assert_eq!(long.timeout, super::DEFAULT_TIMEOUT);
        // A timeout the caller sets afterwards is theirs; the startup checks
        // refuse it when it outlives the claim.
        let mut named = ConsumeOptions::default().guarded_by(Duration::from_secs(60));
        named.timeout = Duration::from_secs(120);
        assert!(crate::checks::handler_timeout(named.timeout, named.broker_consumer_timeout, named.claim_timeout).is_err());
    }
}
