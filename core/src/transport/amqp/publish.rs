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
    confirm: PublisherConfirm,
    timeout: Duration,
    /// To tell a confirm held back by a broker alarm from one that is lost.
    conn: Arc<lapin::Connection>,
    /// The publishing channel it was sent on, retired on a nack or a lost
    /// confirm.
    retire: Retire,
}

/// What a nack (or a confirm that never came) needs to retire the channel
/// it came on.
#[derive(Clone)]
pub(super) struct Retire {
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
    pub(super) async fn now(self, linger: Duration) {
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
        self.check_exchange(exchange).await?;
        let ch = self.publish_channel().await?;
        self.send_on(ch, exchange, routing_key, body, props).await
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
            // The first pass polls every send once, in order: that is when
            // each takes its delivery tag and queues its frames, so the
            // broker sees them in the order given.
            let done = super::in_order::in_order(window.iter().map(|(exchange, routing_key, body, props)| {
                let ch = &ch;
                async move {
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
            let retire = Retire { publish: self.publish.clone(), channel: ch.clone() };
            out.extend(done.into_iter().map(|r| {
                r.map(|confirm| AmqpConfirm { confirm, timeout: self.confirm_timeout, conn: conn.clone(), retire: retire.clone() })
            }));
        }
        out
    }
}

impl AmqpConfirm {
    pub(crate) async fn wait(self) -> Result<()> {
        match tokio::time::timeout(self.timeout, self.confirm).await {
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
