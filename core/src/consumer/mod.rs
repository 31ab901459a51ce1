//! Consuming: a pull consumer (next delivery, settle with an outcome) and a
//! push consumer built on it. Settling is where the retry ladder and the
//! dead-letter queue live: copy first, confirmed, then acknowledge. This file
//! is the consumer itself (opening, taking deliveries, closing); each other
//! question has a file of its own.
//!
//! `impl Consumer` is spread over those files, one part of the consumer in
//! each: here its opening, state, taking deliveries and closing;
//! delivery.rs handing a delivery out; settle.rs settling it; ladder.rs its
//! copy to a retry rung or the DLQ; requests.rs a request's fate;
//! deadline.rs the deadline watch; flow/ its pause, circuit breaker and
//! throttle.

use crate::connection::Connection;
use crate::error::{Error, Result};
use crate::topology::QueueType;
use crate::transport::Link;
use crate::transport::queue::Pop;
use crate::message::Message;
use crate::decode::{decode, decode_as, decode_bare, Payload};
use crate::wire::RawDelivery;
use deadline::Watchlist;
use delivery::CONSUMER_IDS;
use ladder::ladder;
use settle::Background;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

mod breaker;
mod deadline;
mod delivery;
mod flow;
mod handle;
mod ladder;
mod options;
mod requests;
mod settle;

pub use deadline::TIMEOUT_CLASS;
pub use delivery::{Delivery, Settler};
pub use crate::wire::Body;
pub use breaker::{BreakerState, CircuitBreaker, Failed, DEFAULT_BREAKER_PROBE};
pub use crate::throttle::Throttle;
pub use handle::{ConsumerHandle, Drained};
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

/// What [`Consumer::fetch_blocking`] produced.
pub enum Fetch {
    /// A delivery whose body the caller reads: [`Consumer::admit`] or
    /// [`Consumer::refuse`] it.
    Unread(Box<Unread>),
    /// Nothing arrived within the wait.
    Empty,
    /// The consumer was stopped or the broker ended the subscription.
    Closed,
}

/// [`Fetch`] unboxed: what `next_blocking_as` admits at once, without the
/// box a caller that keeps it is given.
enum Taken {
    Unread(Unread),
    Empty,
    Closed,
}

impl From<Taken> for Fetch {
    fn from(t: Taken) -> Fetch {
        match t {
            Taken::Unread(unread) => Fetch::Unread(Box::new(unread)),
            Taken::Empty => Fetch::Empty,
            Taken::Closed => Fetch::Closed,
        }
    }
}

/// A delivery taken off the queue and not handed out yet: every check made
/// but the JSON one, which its taker makes by reading [`Unread::text`].
/// Dropped without [`Consumer::admit`] or [`Consumer::refuse`], it is never
/// acknowledged: the broker delivers it again when the consumer closes.
#[derive(Debug)]
pub struct Unread {
    message: Message,
    /// Shared already: what its settler keeps once it is handed out.
    raw: Arc<RawDelivery>,
    /// Where its text is, for a caller that reads the body
    /// ([`Consumer::fetch_blocking`]); a delivery whose JSON core read goes
    /// straight to [`Consumer::admit`] and keeps none.
    text: Text,
}

/// Where an [`Unread`]'s text is.
#[derive(Debug)]
enum Text {
    /// The body itself, checked to be UTF-8.
    Body,
    /// The body came compressed: this, decompressed and checked.
    Decompressed(String),
    /// Not kept: core read the JSON.
    None,
}

impl Unread {
    /// The body as text: UTF-8 (checked), decompressed when it came
    /// compressed. What the caller reads as JSON.
    pub fn text(&self) -> &str {
        match &self.text {
            // SAFETY: `Body` is set only once decode_bare has checked the
            // body is UTF-8 (fetch_as), and the body does not change.
            Text::Body => unsafe { std::str::from_utf8_unchecked(&self.raw.body) },
            Text::Decompressed(text) => text,
            Text::None => "",
        }
    }

    /// The message: its payload is `Null` until the caller builds its own,
    /// and its `delivery` (where it came from) is filled in by
    /// [`Consumer::admit`].
    pub fn message(&self) -> &Message {
        &self.message
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
    expired: AtomicU64,
    error_replied: AtomicU64,
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
    /// Requests dropped because their deadline (`x-acemq-deadline`) had
    /// passed: on arrival, unhandled, or when their handler failed. Nobody
    /// waited for them; they went neither round the ladder nor to the DLQ.
    pub expired: u64,
    /// Requests whose handler failed, answered with an error reply and
    /// acknowledged (see docs/request-reply.md).
    pub error_replied: u64,
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
        // A consumer on a queue that does not exist (a typo) must not leave
        // its ladder behind: five queues a try, each dead-lettering into a
        // queue that is not there. Those it declared are taken down again if
        // they are empty and unused (one that holds messages stays).
        let link = match link {
            Err(e) if e.is_not_found() => {
                let names: Vec<String> = ladder.queues.iter().map(|q| q.name.clone()).collect();
                let _ = conn.backend().delete_queues_if_idle(&names).await;
                return Err(Error::new(
                    e.kind().clone(),
                    format!("{e}: declare the queue first (a Topology with the queue, applied) or check its name; the retry ladder declared for it was taken down again"),
                ));
            }
            other => other,
        };
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
            expired: self.counters.expired.load(Ordering::Relaxed),
            error_replied: self.counters.error_replied.load(Ordering::Relaxed),
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
            if self.drop_if_expired(&raw) {
                self.flow_refund();
                continue;
            }
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
        match self.fetch_as(timeout, Some(payload)) {
            Taken::Unread(unread) => self.admit(unread).map_or(Next::Empty, |d| Next::Delivery(Box::new(d))),
            Taken::Empty => Next::Empty,
            Taken::Closed => Next::Closed,
        }
    }

    /// Like [`Consumer::next_blocking`] for an adapter that builds its own
    /// values from the body (the Ruby extension builds Ruby objects): every
    /// check but the JSON one is made here, and the caller reads the JSON
    /// once, from [`Unread::text`], then hands the delivery to
    /// [`Consumer::admit`], or to [`Consumer::refuse`] with what its parser
    /// said when the body is not JSON. A check here and a build there read
    /// each body twice; this reads it once, and the same deliveries are
    /// refused for the same reasons, worded the same.
    pub fn fetch_blocking(self: &Arc<Self>, timeout: Duration) -> Fetch {
        self.fetch_as(timeout, None).into()
    }

    /// [`Consumer::fetch_blocking`] without waiting at all.
    pub fn try_fetch(self: &Arc<Self>) -> Fetch {
        self.fetch_as(Duration::ZERO, None).into()
    }

    /// The next delivery off the buffer, decoded (its payload read as
    /// `payload` says, or left to the caller when None). One that cannot be
    /// a message is dead-lettered in the background, as a handler's reject
    /// is (see [`Consumer::settle_later`]): the calling thread (a Ruby
    /// thread holding the GVL) never waits on the broker for it, and a copy
    /// that fails reaches [`Consumer::take_errors`].
    fn fetch_as(self: &Arc<Self>, timeout: Duration, payload: Option<Payload>) -> Taken {
        if !self.flow_token_blocking(timeout) {
            // A stopped consumer says so without a token: its threads end
            // now, not when the throttle's next token comes.
            return if self.link.is_closed() { Taken::Closed } else { Taken::Empty };
        }
        match self.link.pop_blocking(timeout) {
            Pop::Item(raw) if self.drop_if_expired(&raw) => {
                self.flow_refund();
                Taken::Empty
            }
            Pop::Item(raw) => {
                let decoded = match payload {
                    Some(payload) => decode_as(&self.queue, &raw, payload).map(|message| (message, Text::None)),
                    // Where it came from is filled in when it is admitted,
                    // and only for a caller that reads it there (`admit`).
                    None => decode_bare(&raw, |text| {
                        Ok(match text {
                            std::borrow::Cow::Owned(text) => Text::Decompressed(text),
                            std::borrow::Cow::Borrowed(_) => Text::Body,
                        })
                    }),
                };
                match decoded {
                    Ok((message, text)) => Taken::Unread(Unread { message, raw, text }),
                    Err(undecodable) => {
                        self.flow_refund();
                        let raw = Arc::unwrap_or_clone(raw);
                        self.in_background(move |this| async move { this.refuse_undecodable(raw, &undecodable.reason).await });
                        Taken::Empty
                    }
                }
            }
            Pop::Empty => {
                self.flow_refund();
                Taken::Empty
            }
            Pop::Closed => {
                self.flow_refund();
                Taken::Closed
            }
        }
    }

    /// Hand out a delivery whose body the caller has read as JSON
    /// ([`Consumer::fetch_blocking`]): from here it is in flight, its
    /// deadline running, and its [`Settler`] settles it. None when the
    /// circuit breaker is open: it went back to the queue, unspent.
    pub fn admit(self: &Arc<Self>, mut unread: Unread) -> Option<Delivery> {
        unread.message.delivery = crate::decode::delivery_info(&self.queue, &unread.raw);
        self.admit_lean(unread)
    }

    /// [`Consumer::admit`] for an adapter that reads where a delivery came
    /// from off the delivery itself ([`Body::exchange`], [`Body::properties`]
    /// and the rest, through [`Delivery::shared_body`]) rather than from
    /// the message: the message's `delivery` is left empty
    /// ([`DeliveryInfo::default`](crate::DeliveryInfo)). The Ruby
    /// extension's: a message's copy of the properties and names was six
    /// allocations a delivery, made and freed unread by a handler that
    /// reads only the payload.
    pub fn admit_lean(self: &Arc<Self>, unread: Unread) -> Option<Delivery> {
        let Unread { message, raw, .. } = unread;
        self.watch_deadlines();
        let d = self.hand_out(message, raw);
        if self.flow_admits(d.settler.watch.id) {
            return Some(d);
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
        None
    }

    /// A delivery whose body is not JSON (`why`: what the caller's parser
    /// said): dead-lettered in the background with core's reason, as
    /// [`Consumer::fetch_blocking`] does with every other delivery that
    /// cannot be a message. It was never handed out.
    pub fn refuse(self: &Arc<Self>, unread: Unread, why: &dyn std::fmt::Display) {
        let reason = crate::decode::not_json(why).reason;
        let raw = Arc::unwrap_or_clone(unread.raw);
        self.flow_refund();
        self.in_background(move |this| async move { this.refuse_undecodable(raw, &reason).await });
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
            Ok(message) => Some(self.hand_out(message, Arc::new(raw))),
            Err(undecodable) => {
                let _ = self.refuse_undecodable(raw, &undecodable.reason).await;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::Props;
    use crate::{ConsumeOptions, Topology};

    /// What an adapter that builds its own values does with
    /// [`Consumer::fetch_blocking`]: read the text, admit what parses,
    /// refuse what does not. A bad body between good ones: the good ones are
    /// handed out in order, the bad one is dead-lettered with the reason
    /// core gives when it parses (and a compressed body is read
    /// decompressed); on memory:// and, with AMQP_URL, RabbitMQ.
    #[tokio::test(flavor = "multi_thread")]
    async fn fetched_bodies_are_admitted_or_refused_with_cores_reason() {
        let mut urls = vec![format!("memory://fetch-{}", uuid::Uuid::now_v7().simple())];
        urls.extend(std::env::var("AMQP_URL").ok());
        for url in urls {
            let mq = Connection::open(&url).await.unwrap();
            let q = format!("fetch-{}", uuid::Uuid::now_v7().simple());
            mq.apply(&Topology::new().queue(&q)).await.unwrap();
            let mut json = Props::default();
            json.content_type = Some("application/json".into());
            let mut gzip = json.clone();
            gzip.content_encoding = Some("gzip".into());
            let bodies: [(&[u8], &Props); 4] =
                [(br#"{"n":1}"#, &json), (b"{\"n\":2} trailing", &json), (&crate::wire::gzip(br#"{"n":3}"#), &gzip), (br#"{"n":4}"#, &json)];
            for (body, props) in bodies {
                mq.backend().send("", &q, body, props).await.unwrap().wait().await.unwrap();
            }
            let c = Arc::new(mq.consumer(&q, ConsumeOptions::default()).await.unwrap());
            let reader = c.clone();
            let (seen, refused) = tokio::task::spawn_blocking(move || {
                let (mut seen, mut refused) = (Vec::new(), Vec::new());
                while seen.len() + refused.len() < 4 {
                    let Fetch::Unread(unread) = reader.fetch_blocking(Duration::from_secs(10)) else { continue };
                    assert_eq!(unread.message().payload, serde_json::Value::Null, "nothing built by core");
                    match serde_json::from_str::<serde_json::Value>(unread.text()) {
                        Ok(v) => {
                            let d = reader.admit(*unread).expect("no breaker: admitted");
                            seen.push(v["n"].as_i64().unwrap());
                            reader.accept(d);
                        }
                        Err(e) => {
                            refused.push(crate::decode::not_json(&e).reason);
                            reader.refuse(*unread, &e);
                        }
                    }
                }
                (seen, refused)
            })
            .await
            .unwrap();
            assert_eq!(seen, [1, 3, 4], "{url}");
            let dead = {
                let until = std::time::Instant::now() + Duration::from_secs(10);
                loop {
                    let dead = mq.peek_dead_letters(&q, 10).await.unwrap();
                    if !dead.is_empty() || std::time::Instant::now() > until {
                        break dead;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            };
            // A copy the broker refused puts the original back on the
            // queue (and keeps the error): say so, not just "0 != 1".
            assert_eq!(dead.len(), 1, "{url}: the refused body was not dead-lettered in 10 s; background errors {:?}, stats {:?}", c.take_errors(), c.stats());
            assert_eq!(dead[0].reason.as_deref(), Some(refused[0].as_str()), "{url}");
            assert!(refused[0].starts_with("body is not JSON (trailing characters"), "{}", refused[0]);
            // The copy is in the DLQ before the settlement that made it
            // counts it: wait for that settlement, not for the copy.
            c.background_idle().await;
            assert_eq!(c.stats().dead_lettered, 1, "{url}");
            c.close().await;
        }
    }
}
