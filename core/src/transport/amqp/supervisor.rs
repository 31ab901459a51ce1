//! A subscription that outlives its channel: the task that subscribes again,
//! backing off, when the channel is lost. Its deliveries are read by the
//! handlers themselves (feed.rs).

use super::acks::{spawn_flusher, AckState};
use super::fields::from_basic_properties;
use super::{map_error, AmqpBackend};
use crate::error::{Error, ErrorKind, Result};
use super::feed::Feed;
use crate::transport::queue::Pop;
use crate::wire::RawDelivery;
use lapin::options::{BasicCancelOptions, BasicConsumeOptions, BasicQosOptions};
use lapin::types::{FieldTable, ShortString};
use futures_lite::StreamExt;
use lapin::Channel;
use std::sync::{Arc, Mutex};
use std::time::Duration;

impl AmqpBackend {
    /// Subscribe to `queue`. The subscription outlives its channel and its
    /// connection: when the broker takes either away, it subscribes again
    /// (backing off while the broker is unreachable) and goes on feeding the
    /// same delivery queue. Deliveries from the lost channel cannot be
    /// acknowledged any more; the broker has put them back and delivers them
    /// again, which is the redelivery the idempotent consumer is for.
    ///
    /// `exclusive`: basic.consume's exclusive flag, so that no other
    /// consumer may have the queue while this one does (the broker answers
    /// a second one with ACCESS_REFUSED, 403); a subscription that loses its
    /// channel asks for it again, and waits its turn while another has it.
    pub(crate) async fn consume(self: &Arc<Self>, queue: &str, prefetch: u16, exclusive: bool) -> Result<AmqpConsumer> {
        let (generation, stream) = subscribe(self, queue, prefetch, exclusive, 1).await?;
        let failure = Arc::new(Mutex::new(None));
        let feed = Arc::new(Feed::new(queue, failure.clone(), GENERATION_SHIFT));
        feed.install(generation.id, stream, generation.channel.status().clone());
        let consumer = AmqpConsumer {
            generation: Arc::new(Mutex::new(generation.clone())),
            feed: feed.clone(),
            stopped: Arc::new(std::sync::atomic::AtomicBool::new(false)),
            wake: Arc::new(tokio::sync::Notify::new()),
            supervisor: Mutex::new(None),
            failure,
            down_since: Arc::new(Mutex::new(None)),
            resubscribed: Arc::new(std::sync::atomic::AtomicU64::new(0)),
            paused: Arc::new(tokio::sync::Mutex::new(false)),
            queue: queue.to_owned(),
            exclusive,
        };
        let task = supervise(
            self.clone(),
            queue.to_owned(),
            prefetch,
            exclusive,
            consumer.generation.clone(),
            feed,
            consumer.stopped.clone(),
            consumer.wake.clone(),
            consumer.failure.clone(),
            consumer.down_since.clone(),
            consumer.resubscribed.clone(),
            consumer.paused.clone(),
        );
        *consumer.supervisor.lock().unwrap_or_else(|p| p.into_inner()) = Some(crate::runtime::handle().spawn(task));
        Ok(consumer)
    }
}

/// Delivery tags are per channel and start again at 1 on a new one, so the
/// tag handed out carries the subscription's generation in its high bits: a
/// settlement for a delivery from a channel that is gone is recognised and
/// dropped (the broker redelivers that message).
pub(super) const GENERATION_SHIFT: u32 = 40;
pub(super) const TAG_MASK: u64 = (1 << GENERATION_SHIFT) - 1;

/// The first pause before subscribing again.
pub(super) const MIN_RESUBSCRIBE_PAUSE: Duration = Duration::from_millis(100);
/// The longest: a broker back after a restart is picked up within this.
pub(super) const MAX_RESUBSCRIBE_PAUSE: Duration = Duration::from_secs(5);
/// A subscription that lived less than this before its channel went away
/// died young: the next one waits, and the pause keeps growing.
pub(super) const STABLE_SUBSCRIPTION: Duration = Duration::from_secs(5);

/// The longest subscribing waits for each of the broker's answers (the
/// channel, then the prefetch and the consume together; at most the
/// confirm timeout). Without a limit a consume the broker never answers
/// leaves the subscription with no deliveries and no error: seen on
/// RabbitMQ 3.10 when a quorum queue's leader was cut off by the network
/// (no FIN, no RST) and the consume went to another node. The runner gave
/// up after its recovery bound (60 s); with this limit each try fails and
/// the next one is made, and the consume was answered once the cluster had
/// given up on the lost node (drill/net_cluster.rb).
pub(super) const SUBSCRIBE_WAIT: Duration = Duration::from_secs(5);

pub(super) async fn subscribe(
    backend: &AmqpBackend,
    queue: &str,
    prefetch: u16,
    exclusive: bool,
    id: u64,
) -> Result<(Arc<Generation>, lapin::Consumer)> {
    // Dialling has its own limits (connect_timeout a node).
    let wait = SUBSCRIBE_WAIT.min(backend.confirm_timeout);
    let late = |what: &str| {
        Error::new(
            ErrorKind::Timeout,
            format!("{what}: no answer from {} within {}ms; subscribing again", backend.endpoint(), wait.as_millis()),
        )
    };
    let ch = tokio::time::timeout(wait, backend.create_channel()).await.map_err(|_| late("opening a channel"))??;
    let consumed = tokio::time::timeout(wait, async {
        ch.basic_qos(prefetch.max(1), BasicQosOptions::default()).await.map_err(|e| map_error(&e, "setting prefetch"))?;
        let options = BasicConsumeOptions { exclusive, ..Default::default() };
        ch.basic_consume(ShortString::from(queue), ShortString::from(""), options, FieldTable::default())
            .await
            .map_err(|e| map_error(&e, &format!("consuming from queue '{queue}'")))
    })
    .await;
    let stream = match consumed {
        Ok(result) => result?,
        Err(_) => {
            // A consume the broker answers later would hold deliveries
            // nobody reads: the channel goes, and with it the consumer.
            let stale = ch.clone();
            crate::runtime::handle().spawn(async move {
                let _ = tokio::time::timeout(Duration::from_secs(5), stale.close(200, ShortString::from("OK"))).await;
            });
            return Err(late(&format!("consuming from queue '{queue}'")));
        }
    };
    let acks = Arc::new(AckState::new(ch.clone(), prefetch));
    let flusher = spawn_flusher(acks.clone());
    let generation =
        Arc::new(Generation { id, tag: stream.tag(), channel: ch, acks, flusher: Mutex::new(Some(flusher)) });
    Ok((generation, stream))
}

/// A delivery as the engine holds it, its tag carrying its generation.
pub(super) fn raw_delivery(d: lapin::message::Delivery, generation: u64, shift: u32, mask: u64) -> RawDelivery {
    RawDelivery {
        tag: (generation << shift) | (d.delivery_tag & mask),
        // Moved out of lapin's strings, not copied.
        exchange: d.exchange.into(),
        routing_key: d.routing_key.into(),
        redelivered: d.redelivered,
        props: from_basic_properties(d.properties),
        body: d.data,
    }
}

/// How often the supervisor looks at the channel while no reader is
/// waiting on the stream (a reader reports the end itself, at once).
const WATCH_EVERY: Duration = Duration::from_millis(200);

#[allow(clippy::too_many_arguments)]
pub(super) async fn supervise(
    backend: Arc<AmqpBackend>,
    queue: String,
    prefetch: u16,
    exclusive: bool,
    current: Arc<Mutex<Arc<Generation>>>,
    feed: Arc<Feed>,
    stopped: Arc<std::sync::atomic::AtomicBool>,
    wake: Arc<tokio::sync::Notify>,
    failure: Arc<Mutex<Option<Error>>>,
    down_since: Arc<Mutex<Option<std::time::Instant>>>,
    resubscribed: Arc<std::sync::atomic::AtomicU64>,
    paused: Arc<tokio::sync::Mutex<bool>>,
) {
    use std::sync::atomic::Ordering::Acquire;
    let record = |e: Error| *failure.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
    let done = || stopped.load(Acquire) || backend.closed.load(Acquire);
    // The pause before subscribing again. It grows while subscribing fails,
    // and also while fresh subscriptions keep dying young: a message that
    // makes the connection fail as soon as it is delivered would otherwise
    // be a reconnect a few milliseconds apart, for ever.
    let mut pause = MIN_RESUBSCRIBE_PAUSE;
    let mut subscribed_at = std::time::Instant::now();
    'subscription: loop {
        let generation = current.lock().unwrap_or_else(|p| p.into_inner()).clone();
        // Until the stream ends under a reader, or its channel goes down
        // while nobody reads it.
        loop {
            let ended = feed.ended.notified();
            tokio::pin!(ended);
            ended.as_mut().enable();
            if done() {
                break 'subscription;
            }
            if feed.ended(generation.id) {
                break;
            }
            if !generation.channel.status().connected() {
                // Nobody was reading: ask the stream why (a reader holding
                // it records the error itself).
                if let Some(e) = feed.lose(generation.id) {
                    record(e);
                }
                break;
            }
            tokio::select! {
                () = &mut ended => {}
                () = wake.notified() => {}
                () = tokio::time::sleep(WATCH_EVERY) => {}
            }
        }
        if done() {
            break;
        }
        crate::events::subscription_ended(&queue, &failure);
        // The channel or the connection went away under us. Whatever the
        // old channel delivered and we had not acknowledged is the broker's
        // again; retire it and subscribe anew, backing off while it is down.
        // What the lost channel delivered and no handler has taken yet can
        // never be acknowledged: the feed drops it rather than run it twice.
        if generation.channel.status().connected() {
            // The broker cancelled the consumer and left its channel open:
            // RabbitMQ 4.3 ends a quorum queue's consumer that held a
            // delivery past consumer_timeout with basic.cancel (measured;
            // 3.10 and 4.0 close the channel). Settlements already made are
            // sent, then the channel is closed so that whatever else it
            // holds goes back to the queue now, not when the connection
            // closes; the new subscription below gets it again.
            generation.acks.finish();
            let _ = tokio::time::timeout(Duration::from_secs(5), generation.channel.close(200, ShortString::from("OK"))).await;
        }
        generation.retire();
        feed.lose(generation.id);
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
            back_off(pause, &wake).await;
            pause = (pause * 2).min(MAX_RESUBSCRIBE_PAUSE);
        } else {
            pause = MIN_RESUBSCRIBE_PAUSE;
        }
        loop {
            if done() {
                break 'subscription;
            }
            match subscribe(&backend, &queue, prefetch, exclusive, generation.id + 1).await {
                Ok((fresh, stream)) => {
                    let id = fresh.id;
                    let fresh_status = fresh.channel.status().clone();
                    // Installed under the pause's lock: a consumer paused
                    // meanwhile holds nothing of the new channel either.
                    let paused = paused.lock().await;
                    *current.lock().unwrap_or_else(|p| p.into_inner()) = fresh.clone();
                    feed.install(id, stream, fresh_status);
                    if *paused {
                        hold_back(&fresh, &feed).await;
                    }
                    drop(paused);
                    *down_since.lock().unwrap_or_else(|p| p.into_inner()) = None;
                    resubscribed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    crate::events::subscription("resubscribed", &queue, None);
                    subscribed_at = std::time::Instant::now();
                    continue 'subscription;
                }
                Err(e) => {
                    crate::events::subscription("failed", &queue, Some(e.to_string()));
                    record(e);
                    back_off(pause, &wake).await;
                    pause = (pause * 2).min(MAX_RESUBSCRIBE_PAUSE);
                }
            }
        }
    }
    feed.close();
}

/// The pause before subscribing again, cut short when the subscription is
/// stopped or closed: a cancel of a subscription whose queue is gone waited
/// out up to 5 s of back-off (issue 47's soak: 4.3 s).
async fn back_off(pause: Duration, wake: &tokio::sync::Notify) {
    tokio::select! {
        () = tokio::time::sleep(pause) => {}
        () = wake.notified() => {}
    }
}

/// What a pause does on the channel: readers leave the stream alone, the
/// broker's consumer is cancelled, and every delivery it had sent and no
/// handler has taken goes back to the queue with basic.nack (requeue), at
/// the head and in order on a classic queue. AceMQ counts attempts in its
/// own header, which a requeue leaves alone: a message given back by a pause
/// has spent no attempt. Deliveries already in handlers settle as usual on
/// the same channel, which stays open.
async fn hold_back(generation: &Generation, feed: &Feed) {
    feed.pause();
    // A reader waiting on the stream gives it back when interrupted; one
    // that has just read a delivery hands that one out and gives it back.
    let mut stream = None;
    let until = std::time::Instant::now() + Duration::from_secs(2);
    while std::time::Instant::now() < until {
        stream = feed.take_paused(generation.id);
        if stream.is_some() || feed.ended(generation.id) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    if !generation.channel.status().connected() {
        return;
    }
    let cancelled =
        tokio::time::timeout(SUBSCRIBE_WAIT, generation.channel.basic_cancel(generation.tag.clone(), BasicCancelOptions::default())).await;
    let Some(mut stream) = stream else { return };
    // After the cancel-ok lapin ends the stream behind what it had buffered:
    // everything up to the end goes back. Without the cancel-ok (timed out)
    // only what is there now does, and the rest when the channel closes.
    let finished = matches!(cancelled, Ok(Ok(())));
    loop {
        let next = if finished {
            tokio::time::timeout(Duration::from_secs(1), stream.next()).await.ok()
        } else {
            futures_lite::future::poll_once(stream.next()).await
        };
        match next {
            Some(Some(Ok(d))) => generation.acks.requeue(d.delivery_tag),
            _ => break,
        }
    }
}

/// A subscription: the channel it is on now (a generation) and the task
/// that feeds its deliveries and subscribes again when the channel is lost.
pub(crate) struct AmqpConsumer {
    generation: Arc<Mutex<Arc<Generation>>>,
    feed: Arc<Feed>,
    stopped: Arc<std::sync::atomic::AtomicBool>,
    /// Wakes the supervisor out of a pause or a watch when it is stopped
    /// (a permit kept if it is not waiting yet).
    wake: Arc<tokio::sync::Notify>,
    supervisor: Mutex<Option<tokio::task::JoinHandle<()>>>,
    pub(crate) failure: Arc<Mutex<Option<Error>>>,
    /// Since when the subscription has been without a channel (None while
    /// subscribed): what tells a broker that is restarting from a consumer
    /// that will never subscribe again.
    pub(crate) down_since: Arc<Mutex<Option<std::time::Instant>>>,
    /// How many times it has subscribed again after losing its channel.
    pub(crate) resubscribed: Arc<std::sync::atomic::AtomicU64>,
    /// Paused ([`AmqpConsumer::pause`]); the lock orders pause, resume and
    /// the supervisor's resubscription.
    paused: Arc<tokio::sync::Mutex<bool>>,
    queue: String,
    /// Consumed with basic.consume's exclusive flag (asked again on resume).
    exclusive: bool,
}

/// One channel's worth of a subscription.
pub(super) struct Generation {
    pub(super) id: u64,
    pub(super) tag: ShortString,
    pub(super) channel: Channel,
    pub(super) acks: Arc<AckState>,
    pub(super) flusher: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Generation {
    /// The channel is gone: stop its flusher (nothing it holds can be
    /// acknowledged any more).
    pub(super) fn retire(&self) {
        self.acks.retire();
    }

    /// Send the last acks (each bounded by 5 s), then close the channel with
    /// `reason`: anything still unsettled is requeued by the broker, in order.
    async fn settle_and_close(&self, reason: &str) {
        self.acks.finish();
        let flusher = self.flusher.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(f) = flusher {
            let _ = tokio::time::timeout(Duration::from_secs(5), f).await;
        }
        if self.channel.status().connected() {
            let _ = tokio::time::timeout(Duration::from_secs(5), self.channel.close(200, ShortString::from(reason))).await;
        }
    }
}

impl AmqpConsumer {
    /// Wait for the next delivery (see [`Feed::pop`]).
    pub(crate) async fn pop(&self) -> Option<RawDelivery> {
        self.feed.pop().await
    }

    /// Stopped or closed: no more deliveries.
    pub(crate) fn is_closed(&self) -> bool {
        self.feed.is_closed()
    }

    /// Wait at most `timeout` on a thread outside the runtime.
    pub(crate) fn pop_blocking(&self, timeout: Duration) -> Pop<Arc<RawDelivery>> {
        self.feed.pop_blocking(timeout)
    }

    /// Wake every thread blocked in `pop_blocking`.
    pub(crate) fn wake_all(&self) {
        self.feed.wake_all();
    }

    /// The generation a tag was handed out under, if it is still current.
    pub(super) fn live(&self, tag: u64) -> Option<(Arc<Generation>, u64)> {
        let g = self.generation.lock().unwrap_or_else(|p| p.into_inner()).clone();
        (tag >> GENERATION_SHIFT == g.id).then_some((g, tag & TAG_MASK))
    }

    /// Put the delivery back on the queue (nothing was copied anywhere).
    pub(crate) async fn requeue(&self, tag: u64) {
        if let Some((g, tag)) = self.live(tag) {
            g.acks.requeue(tag);
        }
    }

    /// Take nothing more and give back what is buffered (see [`hold_back`]).
    /// The channel stays open for the settlements of what handlers hold.
    pub(crate) async fn pause(&self) {
        let mut paused = self.paused.lock().await;
        if *paused {
            return;
        }
        *paused = true;
        let g = self.generation.lock().unwrap_or_else(|p| p.into_inner()).clone();
        hold_back(&g, &self.feed).await;
    }

    /// Hand nothing more out (see [`Feed::pause`]).
    pub(crate) fn hold(&self) {
        self.feed.pause();
    }

    /// Pause by closing the channel: what it delivered and nobody settled
    /// goes back to the head of the queue, in order, before the broker makes
    /// another consumer active. The supervisor subscribes again and, paused,
    /// holds nothing of the new channel ([`hold_back`]).
    pub(crate) async fn pause_closing(&self) {
        let mut paused = self.paused.lock().await;
        if *paused {
            return;
        }
        *paused = true;
        self.feed.pause();
        let g = self.generation.lock().unwrap_or_else(|p| p.into_inner()).clone();
        g.settle_and_close("paused").await;
    }

    /// Consume again on the same channel (a new consumer tag, the same
    /// generation: tags on a channel go on counting). When the channel was
    /// lost meanwhile, the supervisor's resubscription brings the stream.
    pub(crate) async fn resume(&self) -> Result<()> {
        let mut paused = self.paused.lock().await;
        if !*paused {
            return Ok(());
        }
        let g = self.generation.lock().unwrap_or_else(|p| p.into_inner()).clone();
        if g.channel.status().connected() && !self.feed.ended(g.id) {
            let consumed = tokio::time::timeout(
                SUBSCRIBE_WAIT,
                g.channel.basic_consume(
                    ShortString::from(self.queue.as_str()),
                    ShortString::from(""),
                    BasicConsumeOptions { exclusive: self.exclusive, ..Default::default() },
                    FieldTable::default(),
                ),
            )
            .await;
            let stream = match consumed {
                Ok(Ok(stream)) => stream,
                Ok(Err(e)) => return Err(map_error(&e, &format!("consuming from queue '{}' again after a pause", self.queue))),
                Err(_) => {
                    return Err(Error::new(
                        ErrorKind::Timeout,
                        format!("resuming '{}': no answer to basic.consume within {}s; still paused", self.queue, SUBSCRIBE_WAIT.as_secs()),
                    ))
                }
            };
            let flusher = g.flusher.lock().unwrap_or_else(|p| p.into_inner()).take();
            let fresh = Arc::new(Generation {
                id: g.id,
                tag: stream.tag(),
                channel: g.channel.clone(),
                acks: g.acks.clone(),
                flusher: Mutex::new(flusher),
            });
            *self.generation.lock().unwrap_or_else(|p| p.into_inner()) = fresh;
            self.feed.install(g.id, stream, g.channel.status().clone());
        }
        *paused = false;
        self.feed.resume();
        Ok(())
    }

    /// Stop new deliveries. What is buffered and not yet handed out goes back
    /// to the queue when the channel closes.
    pub(crate) async fn stop(&self, cancel: bool) {
        self.stopped.store(true, std::sync::atomic::Ordering::Release);
        self.wake.notify_one();
        // At once, not after the broker's cancel-ok: a handler thread that
        // finishes meanwhile must not start a buffered delivery.
        self.feed.stop_handing_out();
        let g = self.generation.lock().unwrap_or_else(|p| p.into_inner()).clone();
        if !cancel {
            // keep_order: the broker's consumer stays until the close, which
            // gives back what this channel holds at the head, in order, and
            // only then makes the next consumer active.
            return;
        }
        if g.channel.status().connected() {
            let _ = tokio::time::timeout(Duration::from_secs(5), g.channel.basic_cancel(g.tag.clone(), BasicCancelOptions::default())).await;
        }
        self.feed.close();
    }

    /// Send the last acks, then close the channel: anything unsettled is
    /// requeued by the broker.
    pub(crate) async fn close(&self) {
        self.stopped.store(true, std::sync::atomic::Ordering::Release);
        self.wake.notify_one();
        self.feed.close();
        let g = self.generation.lock().unwrap_or_else(|p| p.into_inner()).clone();
        g.settle_and_close("OK").await;
        let supervisor = self.supervisor.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(task) = supervisor {
            // Its stream ends with the channel; if the broker is away it is
            // backing off, and the wake cuts the pause short.
            let _ = tokio::time::timeout(Duration::from_secs(6), task).await;
        }
        // Only now: dropped before the channel's close, the stream would
        // send basic.cancel first (see Feed::close).
        self.feed.release();
    }
}
