//! Consuming: a pull consumer (next delivery, settle with an outcome) and a
//! push consumer built on it. Settling is where the retry ladder and the
//! dead-letter queue live: copy first, confirmed, then acknowledge. This file
//! is the consumer itself (opening, taking deliveries, closing); each other
//! question has a file of its own.

use crate::connection::Connection;
use crate::error::{Error, Result};
use crate::topology::QueueType;
use crate::transport::Link;
use crate::transport::queue::Pop;
use crate::wire::{decode, decode_as, Payload, RawDelivery};
use deadline::Watchlist;
use delivery::CONSUMER_IDS;
use ladder::ladder;
use settle::Background;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

mod deadline;
mod delivery;
mod flow;
mod handle;
mod ladder;
mod options;
mod settle;

pub use deadline::TIMEOUT_CLASS;
pub use delivery::{Body, Delivery, Settler};
pub use flow::{BreakerState, CircuitBreaker, Throttle};
pub use handle::ConsumerHandle;
pub use options::{ConsumeOptions, DEFAULT_BROKER_CONSUMER_TIMEOUT, DEFAULT_TIMEOUT};

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
    /// handler's idempotency claim ([`Outcome::Wait`](crate::ack::Outcome::Wait)).
    pub waited: u64,
    /// Settled by the handler deadline (as retries) because their handler
    /// had not finished.
    pub timed_out: u64,
    /// Settlements discarded because the deadline had settled the delivery
    /// first: handlers that finished after their timeout.
    pub abandoned: u64,
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
