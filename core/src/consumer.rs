//! Consuming: a pull consumer (next delivery, settle with an outcome) and a
//! push consumer built on it. Settling is where the retry ladder and the
//! dead-letter queue live: copy first, confirmed, then acknowledge.

use crate::ack::{Outcome, Settlement};
use crate::connection::Connection;
use crate::envelope::{now_secs, ATTEMPT_HEADER};
use crate::error::{Error, ErrorKind, Result};
use crate::message::Message;
use crate::retry::{dlq_name, rung_name, RetryPolicy};
use crate::topology::{QueueSpec, QueueType, Topology};
use crate::transport::queue::Pop;
use crate::transport::Link;
use crate::wire::{
    decode, RawDelivery, ERROR_CLASS_HEADER, FAILED_AT_HEADER, ORIGINAL_EXCHANGE_HEADER, ORIGINAL_ROUTING_KEY_HEADER,
    QUEUE_HEADER, REASON_HEADER,
};
use serde_json::Value;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// How long a delivery whose copy could not be made waits before it goes
/// back to its queue.
const REQUEUE_PAUSE: Duration = Duration::from_secs(1);

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
        let prefetch = u16::try_from(concurrency.saturating_mul(2)).unwrap_or(u16::MAX).max(32);
        ConsumeOptions { prefetch, concurrency, retry: RetryPolicy::default(), queue_type: None }
    }
}

/// One delivery being handled: the message and what is needed to settle it.
#[derive(Debug)]
pub struct Delivery {
    /// The message, for the handler.
    pub message: Message,
    raw: RawDelivery,
}

impl Delivery {
    /// The delivery tag (unique within this consumer while unsettled).
    pub fn tag(&self) -> u64 {
        self.raw.tag
    }

    /// The body as it arrived, byte for byte.
    pub fn body(&self) -> &[u8] {
        &self.raw.body
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

/// Counters a consumer keeps; read with [`Consumer::stats`].
#[derive(Debug, Default)]
struct Counters {
    accepted: AtomicU64,
    retried: AtomicU64,
    dead_lettered: AtomicU64,
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
}

/// A pull consumer on one queue.
pub struct Consumer {
    conn: Connection,
    queue: String,
    options: ConsumeOptions,
    link: Link,
    counters: Counters,
    stopped: AtomicBool,
    background: Background,
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

impl Consumer {
    pub(crate) async fn open(conn: Connection, queue: &str, options: ConsumeOptions) -> Result<Consumer> {
        options.retry.validate()?;
        if queue.is_empty() {
            return Err(Error::invalid("consume needs a queue name"));
        }
        crate::limits::ladder(queue, &options.retry)?;
        if options.prefetch == 0 {
            return Err(Error::invalid("prefetch must be at least 1: unlimited prefetch is not offered"));
        }
        if options.concurrency == 0 {
            return Err(Error::invalid("concurrency must be at least 1"));
        }
        let link = conn.backend().subscribe(queue, options.prefetch).await?;
        let consumer = Consumer {
            conn,
            queue: queue.to_owned(),
            options,
            link,
            counters: Counters::default(),
            stopped: AtomicBool::new(false),
            background: Background::default(),
        };
        if let Err(e) = consumer.declare_ladder().await {
            consumer.close().await;
            return Err(e);
        }
        Ok(consumer)
    }

    /// The DLQ and one rung per distinct delay. Declared by every consumer:
    /// a reject must never find its queue missing.
    fn ladder(&self) -> Topology {
        let kind = self.options.queue_type.or_else(|| self.conn.applied_type(&self.queue)).unwrap_or_default();
        let mut t = Topology::new();
        let mut dlq = QueueSpec::new(dlq_name(&self.queue)).with_type(kind);
        dlq.dead_letter_queue = false;
        t = t.queue_spec(dlq);
        for delay in self.options.retry.rungs() {
            t = t.queue_spec(QueueSpec::delay(rung_name(&self.queue, delay), delay, &self.queue).with_type(kind));
        }
        t
    }

    async fn declare_ladder(&self) -> Result<()> {
        self.conn.backend().apply(&self.ladder()).await
    }

    /// The queue.
    pub fn queue(&self) -> &str {
        &self.queue
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

    /// The next message, or None once stopped. A delivery that cannot be a
    /// message (not JSON, a foreign content type) is dead-lettered here with
    /// the reason, and the wait goes on. Cancel safe.
    pub async fn next(&self) -> Option<Delivery> {
        loop {
            let raw = self.link.queue().pop().await?;
            if let Some(d) = self.understand(raw).await {
                return Some(d);
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
        match self.link.queue().pop_blocking(timeout) {
            Pop::Item(raw) => match decode(&self.queue, &raw) {
                Ok(message) => Next::Delivery(Box::new(Delivery { message, raw })),
                Err(undecodable) => {
                    self.in_background(move |this| async move { this.dead_letter(raw, &undecodable.reason, None).await });
                    Next::Empty
                }
            },
            Pop::Empty => Next::Empty,
            Pop::Closed => Next::Closed,
        }
    }

    /// Like [`Consumer::next_blocking`] without waiting at all.
    pub fn try_next(self: &Arc<Self>) -> Next {
        self.next_blocking(Duration::ZERO)
    }

    /// Wake every thread blocked in [`Consumer::next_blocking`] (they return `Empty`).
    pub fn wake(&self) {
        self.link.queue().wake_all();
    }

    async fn understand(&self, raw: RawDelivery) -> Option<Delivery> {
        match decode(&self.queue, &raw) {
            Ok(message) => Some(Delivery { message, raw }),
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
    pub async fn settle(&self, delivery: Delivery, outcome: Outcome) -> Result<()> {
        match outcome.settlement() {
            Settlement::Accept => {
                self.accept(delivery);
                Ok(())
            }
            Settlement::Retry { reason, error_class } => {
                let attempt = delivery.message.envelope.attempt;
                if attempt >= self.options.retry.max_attempts {
                    let reason = format!("retries exhausted after {attempt} attempts: {reason}");
                    self.dead_letter(delivery.raw, &reason, error_class.as_deref()).await
                } else {
                    self.retry(delivery.raw, attempt, &reason, error_class.as_deref()).await
                }
            }
            Settlement::Reject { reason, error_class } => self.dead_letter(delivery.raw, &reason, error_class.as_deref()).await,
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
    pub fn settle_later(self: &Arc<Self>, delivery: Delivery, outcome: Outcome) {
        if matches!(outcome, Outcome::Ack(crate::ack::Ack::Accept)) {
            self.accept(delivery);
            return;
        }
        self.in_background(move |this| async move { this.settle(delivery, outcome).await });
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
                this.background.errors.lock().unwrap_or_else(|p| p.into_inner()).push(e);
                this.background.has_errors.store(true, Ordering::Release);
            }
            if this.background.running.fetch_sub(1, Ordering::AcqRel) == 1 {
                this.background.idle.notify_waiters();
            }
        });
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
    pub fn accept(&self, delivery: Delivery) {
        self.link.ack(delivery.raw.tag);
        self.counters.accepted.fetch_add(1, Ordering::Relaxed);
    }

    fn failure_headers(&self, raw: &mut RawDelivery, reason: &str, error_class: Option<&str>) {
        let h = &mut raw.props.headers;
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
        raw.props.headers.insert(ATTEMPT_HEADER.into(), Value::from(attempt + 1));
        self.copy_then_ack(raw, &rung).await?;
        self.counters.retried.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    pub(crate) async fn dead_letter(&self, mut raw: RawDelivery, reason: &str, error_class: Option<&str>) -> Result<()> {
        self.failure_headers(&mut raw, reason, error_class);
        let attempt = crate::wire::envelope_of(&raw.props).attempt;
        raw.props.headers.insert(ATTEMPT_HEADER.into(), Value::from(attempt));
        self.copy_then_ack(raw, &dlq_name(&self.queue)).await?;
        self.counters.dead_lettered.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Publish the copy to `target` through the default exchange and wait for
    /// its confirm; only then acknowledge the original. A target queue that
    /// has gone (somebody deleted the DLQ) is declared again and the copy
    /// retried once. If the copy still fails, the original is requeued:
    /// nothing is acknowledged into nothing.
    async fn copy_then_ack(&self, mut raw: RawDelivery, target: &str) -> Result<()> {
        crate::limits::fit_copy(&mut raw.props);
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
    pub async fn stop(&self) {
        if !self.stopped.swap(true, Ordering::AcqRel) {
            self.link.stop().await;
        }
    }

    /// Stop, send the last acknowledgements and release the subscription.
    /// Anything unsettled goes back to the queue.
    pub async fn close(&self) {
        self.stop().await;
        // Settlements still in flight finish first: their acknowledgements
        // must go out on this subscription's channel.
        let _ = tokio::time::timeout(Duration::from_secs(30), self.background_idle()).await;
        self.link.close().await;
    }
}

/// A running push consumer. Dropping it does not stop it; call
/// [`ConsumerHandle::cancel`].
pub struct ConsumerHandle {
    consumer: Arc<Consumer>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl ConsumerHandle {
    pub(crate) fn spawn<H, Fut>(consumer: Consumer, handler: H) -> ConsumerHandle
    where
        H: Fn(Message) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Outcome> + Send + 'static,
    {
        let consumer = Arc::new(consumer);
        let handler = Arc::new(handler);
        let tasks = (0..consumer.options.concurrency)
            .map(|_| {
                let c = consumer.clone();
                let h = handler.clone();
                tokio::spawn(async move {
                    while let Some(d) = c.next().await {
                        let outcome = h(d.message.clone()).await;
                        c.settle_later(d, outcome);
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
    pub async fn cancel(self) {
        self.consumer.stop().await;
        for t in self.tasks {
            let _ = t.await;
        }
        self.consumer.close().await;
    }
}
