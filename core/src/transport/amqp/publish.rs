//! Publishing one message or a batch on the publishing channel, and waiting
//! for the broker's confirms.

use super::fields::to_basic_properties_as;
use super::{map_error, AmqpBackend};
use crate::error::{Error, ErrorKind, Result};
use crate::wire::Props;
use lapin::options::BasicPublishOptions;
use lapin::types::ShortString;
use lapin::{Channel, Confirmation, PublisherConfirm};
use std::sync::Arc;
use std::time::Duration;

/// The outcome of a publish that has been sent and not yet confirmed.
pub(crate) struct AmqpConfirm {
    confirm: Pending,
    /// The exchange and body size of the publish: a channel the broker
    /// closed for a refusal names the exchange (403, 404) or the size (406),
    /// which tells this publish's refusal from another's on the same channel.
    exchange: String,
    size: usize,
    /// The backend's learnt `max_message_size`, set from a refusal.
    max_message: Arc<std::sync::atomic::AtomicUsize>,
    timeout: Duration,
    /// To tell a confirm held back by a broker alarm from one that is lost.
    conn: Arc<lapin::Connection>,
    /// The publishing channel it was sent on, retired on a nack or a lost
    /// confirm.
    retire: Retire,
}

/// A confirm still to come, or an outcome already known (a first publish to
/// an exchange, sent and confirmed on a channel of its own).
enum Pending {
    Confirm(PublisherConfirm),
    Done(Result<()>),
}

/// What a nack (or a confirm that never came) needs to retire the channel
/// it came on.
#[derive(Clone)]
pub(super) struct Retire {
    publish: Arc<tokio::sync::Mutex<Option<Channel>>>,
    channel: Channel,
    /// Retired channels of this connection not yet closed.
    lingering: Arc<std::sync::atomic::AtomicUsize>,
}

/// At most this many retired publishing channels wait to be closed at once.
/// A nack storm (a queue at its `x-max-length` with `reject-publish`: every
/// publish nacked) retired a channel per nack: 2,047 of them lingered, all
/// the connection has, and it had to be replaced (issue 47's soak). Past
/// this, a nacked channel is kept in use.
const MAX_LINGERING: usize = 8;

/// How long a retired channel stays open before its last confirms are
/// awaited and it is closed. Closed as soon as its confirms were in, good
/// publishes another thread had just sent on it lost their confirms: about
/// 200 of 1,000 beside two threads nacked by a full queue (issue 47's second
/// hostile run), stored all the same.
const RETIRE_GRACE: Duration = Duration::from_secs(1);

impl Retire {
    /// A quorum queue that had no leader when a channel first published to
    /// it can go on nacking everything that channel sends (RabbitMQ 3.10,
    /// seen in the cluster drill: 161 nacks in a row over 21 s after the
    /// leader's node was killed, while a new channel published at once). So
    /// the channel a nack came on is not used again: the next publish opens
    /// a fresh one. The old one is closed once every confirm still due on it
    /// has come, or after `linger` (the confirm timeout) at most.
    pub(super) async fn now(self, linger: Duration) {
        use std::sync::atomic::Ordering;
        let mut guard = self.publish.lock().await;
        if guard.as_ref().is_some_and(|c| c.id() == self.channel.id()) {
            if self.lingering.load(Ordering::Acquire) >= MAX_LINGERING {
                return;
            }
            *guard = None;
            drop(guard);
            self.lingering.fetch_add(1, Ordering::AcqRel);
            let (old, lingering) = (self.channel, self.lingering);
            crate::runtime::handle().spawn(async move {
                // A publisher that took this channel just before it was
                // retired may still publish on it: a moment for those, then
                // every confirm due on it, before it is closed under them.
                tokio::time::sleep(linger.min(RETIRE_GRACE)).await;
                let _ = tokio::time::timeout(linger, old.wait_for_confirms()).await;
                if old.status().connected() {
                    let _ = old.close(200, ShortString::from("OK")).await;
                }
                lingering.fetch_sub(1, Ordering::AcqRel);
            });
        }
    }
}

/// How often a publish waiting for the broker to lift a block looks again.
pub(super) const BLOCKED_POLL: Duration = Duration::from_millis(25);

pub(super) fn blocked_error(waited: Duration, sent: bool) -> Error {
    Error::new(
        ErrorKind::Blocked,
        format!(
            "RabbitMQ is blocking publishers on this connection (a memory or disk alarm) and did not lift it within {waited:?}: {}; \
             it lifts when the alarm clears (consumers draining queues, disk freed), and consumers on their own connection keep running",
            if sent { "the message was sent and may be stored once the block lifts" } else { "the message was not sent" }
        ),
    )
}

impl AmqpBackend {
    /// `props` for the wire, a `user_id` this connection may not send moved
    /// to a header (see [`super::fields::to_basic_properties_as`]). The user
    /// is the current address's (lapin's default, `guest`, when it names
    /// none), read only for the rare publish that carries a `user_id`.
    fn properties(&self, props: &Props) -> lapin::BasicProperties {
        let user = match &props.user_id {
            None => String::new(),
            Some(_) => {
                let url = &self.urls[self.at.load(std::sync::atomic::Ordering::Relaxed).min(self.urls.len() - 1)];
                url.parse::<lapin::uri::AMQPUri>().map(|u| u.authority.userinfo.username).unwrap_or_default()
            }
        };
        to_basic_properties_as(props, &user)
    }

    /// The publishing channel, reopened when the broker closed it (a publish
    /// to a missing exchange closes the channel it was sent on).
    pub(super) async fn publish_channel(&self) -> Result<Channel> {
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

    /// Whether the broker is blocking publishers on this connection now.
    pub(crate) fn blocked(&self) -> bool {
        self.current().status().blocked()
    }

    /// Wait, up to the confirm timeout, for the broker to lift a block on
    /// this connection: a publish sent into a block sits in the socket
    /// unconfirmed, so it is better not sent, and said so.
    pub(super) async fn unblocked(&self) -> Result<()> {
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
        self.check_size(body.len())?;
        if !self.is_known(exchange) {
            return self.send_alone(exchange, routing_key, body, props).await;
        }
        let ch = self.publish_channel().await?;
        match self.send_on(ch.clone(), exchange, routing_key, body, props).await {
            // The broker closed the publishing channel (another publish on it
            // was refused) after this one took it: nothing of this one was
            // sent, so it goes once more on a fresh channel.
            Err(e) if !ch.status().connected() && e.kind() == &ErrorKind::Closed => {
                let ch = self.publish_channel().await?;
                self.send_on(ch, exchange, routing_key, body, props).await
            }
            sent => sent,
        }
    }

    /// The first publish to an exchange this connection has not published
    /// to: sent alone on a channel of its own and confirmed there. A publish
    /// the broker refuses (the exchange is missing, this user may not write
    /// to it) makes the broker close the channel it came on, and every
    /// publish in flight on that channel with it: 484 of 500 good publishes
    /// on another thread raised the other's AccessRefused in issue 47's
    /// hostile run. Once one publish to the exchange was accepted, the
    /// others go on the shared publishing channel.
    async fn send_alone(&self, exchange: &str, routing_key: &str, body: &[u8], props: &Props) -> Result<AmqpConfirm> {
        let ch = self.open_channel(true).await?;
        let sent = match self.send_on(ch.clone(), exchange, routing_key, body, props).await {
            Ok(c) => c.wait_on_own_channel().await,
            Err(e) => Err(e),
        };
        if ch.status().connected() {
            let _ = ch.close(200, ShortString::from("OK")).await;
        }
        // Unroutable says the exchange is there and took the message.
        if sent.is_ok() || sent.as_ref().is_err_and(|e| e.kind() == &ErrorKind::Unroutable) {
            self.known().insert(exchange.to_owned());
        }
        Ok(AmqpConfirm {
            confirm: Pending::Done(sent),
            exchange: String::new(),
            size: 0,
            max_message: self.max_message.clone(),
            timeout: self.confirm_timeout,
            conn: self.current(),
            retire: Retire { publish: self.publish.clone(), channel: ch, lingering: self.lingering.clone() },
        })
    }

    /// Refuse at once a body larger than the broker refused before on this
    /// connection (its `max_message_size`, learnt from its refusal): sent, it
    /// would close the publishing channel under every publish in flight.
    pub(super) fn check_size(&self, size: usize) -> Result<()> {
        let max = self.max_message.load(std::sync::atomic::Ordering::Relaxed);
        if max > 0 && size > max {
            return Err(too_large(size, max, false));
        }
        Ok(())
    }

    /// Send one on `ch` (the publishing channel, or a request's channel,
    /// which must be the one consuming its replies), mandatory, its confirm
    /// to be awaited.
    pub(super) async fn send_on(&self, ch: Channel, exchange: &str, routing_key: &str, body: &[u8], props: &Props) -> Result<AmqpConfirm> {
        let confirm = ch
            .basic_publish(
                ShortString::from(exchange),
                ShortString::from(routing_key),
                BasicPublishOptions { mandatory: true, immediate: false },
                body,
                self.properties(props),
            )
            .await
            .map_err(|e| map_error(&e, &format!("publishing to exchange '{exchange}'")))?;
        let retire = Retire { publish: self.publish.clone(), channel: ch, lingering: self.lingering.clone() };
        Ok(AmqpConfirm {
            confirm: Pending::Confirm(confirm),
            exchange: exchange.to_owned(),
            size: body.len(),
            max_message: self.max_message.clone(),
            timeout: self.confirm_timeout,
            conn: self.current(),
            retire,
        })
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
            // The first pass polls every send once, in order: that is when
            // each takes its delivery tag and queues its frames, so the
            // broker sees them in the order given.
            let done = super::in_order::in_order(window.iter().map(|(exchange, routing_key, body, props)| {
                let too_large = self.check_size(body.len());
                let ch = &ch;
                async move {
                    too_large?;
                    ch.basic_publish(
                        ShortString::from(*exchange),
                        ShortString::from(*routing_key),
                        BasicPublishOptions { mandatory: true, immediate: false },
                        body,
                        self.properties(props),
                    )
                    .await
                    .map_err(|e| map_error(&e, &format!("publishing to exchange '{exchange}'")))
                }
            }))
            .await;
            let conn = self.current();
            let retire = Retire { publish: self.publish.clone(), channel: ch.clone(), lingering: self.lingering.clone() };
            out.extend(done.into_iter().zip(window).map(|(r, (exchange, _, body, _))| {
                r.map(|confirm| AmqpConfirm {
                    confirm: Pending::Confirm(confirm),
                    exchange: (*exchange).to_owned(),
                    size: body.len(),
                    max_message: self.max_message.clone(),
                    timeout: self.confirm_timeout,
                    conn: conn.clone(),
                    retire: retire.clone(),
                })
            }));
        }
        out
    }
}

impl AmqpConfirm {
    pub(crate) async fn wait(self) -> Result<()> {
        // Sent alone and confirmed (send_alone): its outcome is its own.
        if matches!(self.confirm, Pending::Done(_)) {
            return self.wait_on_own_channel().await;
        }
        let (exchange, size, max_message) = (self.exchange.clone(), self.size, self.max_message.clone());
        let outcome = self.wait_on_own_channel().await;
        if let Err(e) = &outcome {
            if let Some((_, max)) = refused_size(e) {
                max_message.store(max, std::sync::atomic::Ordering::Relaxed);
            }
        }
        match outcome {
            Err(e) if matches!(e.kind(), ErrorKind::Broker { .. }) && !refusal_of(&e, &exchange, size) => Err(Error::new(
                ErrorKind::Closed,
                format!(
                    "the broker closed the publishing channel for another publish on it ({e}); this message may or may not have been stored: \
                     publish it again (it keeps its message id, so a copy is harmless to an idempotent consumer)"
                ),
            )),
            other => other,
        }
    }

    /// The outcome as the broker gave it for the channel the publish went on.
    async fn wait_on_own_channel(self) -> Result<()> {
        let confirm = match self.confirm {
            Pending::Done(outcome) => return outcome,
            Pending::Confirm(c) => c,
        };
        match tokio::time::timeout(self.timeout, confirm).await {
            Err(_) if self.conn.status().blocked() => Err(blocked_error(self.timeout, true)),
            Err(_) => {
                // Retired as after a nack: on RabbitMQ 3.10 a channel that
                // first published to a quorum queue whose leader's node had
                // been cut off by the network (not killed) went on getting
                // no confirms at all, 14 timeouts in a row over 70 s, while
                // another connection's channel published (drill/net_cluster.rb).
                self.retire.now(self.timeout).await;
                Err(Error::new(
                    ErrorKind::Timeout,
                    format!(
                        "the broker did not confirm the publish within {:?}; it may or may not have been stored (the next publish goes on a fresh channel)",
                        self.timeout
                    ),
                ))
            }
            Ok(Err(e)) => {
                let err = publish_refused(map_error(&e, &format!("publishing to exchange '{}'", self.exchange)));
                if err.kind() != &ErrorKind::Closed {
                    return Err(err);
                }
                Err(Error::new(
                    ErrorKind::Closed,
                    format!(
                        "the channel this publish went on closed before its confirm came ({err}); it may or may not have been stored: \
                         publish it again (it keeps its message id, so a copy is harmless to an idempotent consumer)"
                    ),
                ))
            }
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

/// "message size N is larger than configured max size M": N and M.
fn refused_size(e: &Error) -> Option<(usize, usize)> {
    if !matches!(e.kind(), ErrorKind::Broker { reply_code: 406 }) {
        return None;
    }
    let text = e.to_string();
    let number_after = |marker: &str| -> Option<usize> {
        let at = text.find(marker)? + marker.len();
        text[at..].split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
    };
    // The broker's words, or ours once publish_refused rewrote them.
    Some((number_after("message size ")?, number_after("max size ").or_else(|| number_after("max_message_size "))?))
}

/// Whether a channel's closing error is the broker's refusal of this
/// publish (its exchange, or its size), not of another on the same channel.
fn refusal_of(e: &Error, exchange: &str, size: usize) -> bool {
    match e.kind() {
        // The broker's words ("no exchange 'x' in vhost", "access to
        // exchange 'x' in vhost"), not the context this side adds after them
        // ("publishing to exchange ''"), which named every publish's own.
        ErrorKind::Broker { reply_code: 403 | 404 } => e.to_string().contains(&format!("exchange '{exchange}' in vhost")),
        ErrorKind::Broker { reply_code: 406 } => refused_size(e).is_some_and(|(n, _)| n == size),
        _ => true,
    }
}

/// A broker's refusal of a message for its size, said with what to do.
fn publish_refused(e: Error) -> Error {
    match refused_size(&e) {
        Some((size, max)) => too_large(size, max, true),
        None => e,
    }
}

fn too_large(size: usize, max: usize, sent: bool) -> Error {
    Error::new(
        ErrorKind::Broker { reply_code: 406 },
        format!(
            "PRECONDITION_FAILED - message size {size} is larger than the broker's max_message_size {max}{}: \
             publish less (keep the body elsewhere and publish a reference to it) or raise max_message_size in rabbitmq.conf",
            if sent { "" } else { " (refused here: the broker refused one this large before on this connection)" }
        ),
    )
}
