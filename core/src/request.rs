//! Request/reply over RabbitMQ's direct reply-to (`amq.rabbitmq.reply-to`):
//! no queue is declared per request or per requester.
//!
//! Each connection has one reply channel, opened on its first request: it
//! consumes `amq.rabbitmq.reply-to` (no ack: RabbitMQ allows nothing else
//! there) and every request is published on it, with a fresh
//! `correlation_id` and `reply_to` set, because RabbitMQ sends a reply only
//! to the channel that published the request. Replies are matched to their
//! waiters by correlation id, so any number of requests from any number of
//! threads share the channel. A reply whose request has given up (timed
//! out) is dropped and counted ([`Connection::late_replies`]).
//!
//! A reply is at most once: it is not stored anywhere, and a requester that
//! is gone, or a reply channel lost with the connection, loses it.

use crate::connection::{check_destination, Connection, PublishOptions};
use crate::envelope::Envelope;
use crate::error::{Error, ErrorKind, Result};
use crate::message::Message;
use crate::transport::Backend;
use crate::wire::{props_for, Props, RawDelivery};
use serde::Serialize;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::oneshot;

/// RabbitMQ's direct reply-to pseudo-queue.
pub const REPLY_TO: &str = "amq.rabbitmq.reply-to";

/// How long [`Connection::request`] waits for a reply by default.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// How to send one request.
#[derive(Debug, Clone)]
pub struct RequestOptions {
    /// Where and with what envelope, as a publish (`delay`/`at` are refused:
    /// a request waits for its answer now).
    pub publish: PublishOptions,
    /// How long to wait for the reply before [`ErrorKind::Timeout`].
    pub timeout: Duration,
}

impl Default for RequestOptions {
    fn default() -> Self {
        RequestOptions { publish: PublishOptions::default(), timeout: DEFAULT_REQUEST_TIMEOUT }
    }
}

/// One connection's requests in flight and its reply channel.
#[derive(Default)]
pub(crate) struct Replies {
    waiters: Mutex<HashMap<String, oneshot::Sender<RawDelivery>>>,
    late: AtomicU64,
    channel: tokio::sync::Mutex<Option<lapin::Channel>>,
    /// memory://: this connection's reply address.
    address: std::sync::OnceLock<String>,
}

impl Replies {
    fn waiters(&self) -> std::sync::MutexGuard<'_, HashMap<String, oneshot::Sender<RawDelivery>>> {
        self.waiters.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A reply arrived: to its waiter, or dropped and counted.
    fn deliver(&self, raw: RawDelivery) {
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

/// Removes a waiter when its request ends, however it ends (a reply, a
/// timeout, an error, a dropped future).
struct Waiting<'a> {
    replies: &'a Replies,
    id: String,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.replies.waiters().remove(&self.id);
    }
}

impl Connection {
    /// The reply channel (opened on first use, and again after it was lost)
    /// on RabbitMQ; None on memory://, which registers an address instead.
    async fn reply_channel(&self) -> Result<Option<(lapin::Channel, &'static str)>> {
        let replies = self.replies();
        match self.backend() {
            Backend::Memory(b) => {
                let address = replies.address.get_or_init(|| format!("{REPLY_TO}.{}", crate::envelope::new_id()));
                let weak = Arc::downgrade(&replies);
                b.reply_sink(address, Arc::new(move |raw| {
                    if let Some(r) = weak.upgrade() {
                        r.deliver(raw)
                    }
                }));
                Ok(None)
            }
            Backend::Amqp(a) => {
                let mut guard = replies.channel.lock().await;
                if let Some(ch) = guard.as_ref().filter(|c| c.status().connected()) {
                    return Ok(Some((ch.clone(), REPLY_TO)));
                }
                let weak = Arc::downgrade(&replies);
                let ch = a
                    .reply_channel(move |raw| {
                        if let Some(r) = weak.upgrade() {
                            r.deliver(raw)
                        }
                    })
                    .await?;
                *guard = Some(ch.clone());
                Ok(Some((ch, REPLY_TO)))
            }
        }
    }

    /// Send `payload` as JSON to `routing_key` as a request and wait for its
    /// reply, which is returned as the [`Message`] the replier sent (its own
    /// envelope; `delivery.properties.correlation_id` is the request's).
    /// Safe to call from many tasks at once: they share one reply channel.
    ///
    /// Errors: [`ErrorKind::Timeout`] when no reply came within
    /// `options.timeout` (the request may still be handled: a reply after
    /// that is dropped and counted in [`Connection::late_replies`]); what a
    /// publish fails with when the request cannot be sent (`Unroutable` for
    /// a queue nobody declared).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe as far as this connection goes: a dropped future forgets
    /// its waiter, and its reply, if one comes, is counted late. The request
    /// may have been sent.
    pub async fn request<T: Serialize + ?Sized>(&self, payload: &T, routing_key: &str, options: RequestOptions) -> Result<Message> {
        let body = serde_json::to_vec(payload)?;
        let envelope = self.envelope_for(&options.publish);
        let raw = self.exchange_request(&body, &options.publish.exchange, routing_key, &envelope, options.timeout).await?;
        decoded(&raw, crate::wire::Payload::Parsed)
    }

    /// [`Connection::request`] with the body already JSON and the envelope
    /// made ([`Connection::envelope_for`]): what the Ruby gem calls. The
    /// reply's payload is checked to be JSON and left unbuilt
    /// ([`Payload::Checked`](crate::Payload::Checked)): its body is returned
    /// with it for the caller to build its own values from.
    ///
    /// # Cancel safety
    ///
    /// As [`Connection::request`].
    pub async fn send_request(
        &self,
        body: &[u8],
        exchange: &str,
        routing_key: &str,
        envelope: &Envelope,
        timeout: Duration,
    ) -> Result<(Message, crate::Body)> {
        let raw = self.exchange_request(body, exchange, routing_key, envelope, timeout).await?;
        let message = decoded(&raw, crate::wire::Payload::Checked)?;
        Ok((message, crate::Body::of(raw)))
    }

    async fn exchange_request(&self, body: &[u8], exchange: &str, routing_key: &str, envelope: &Envelope, timeout: Duration) -> Result<RawDelivery> {
        if crate::delay::due_of(&envelope.headers).is_some() {
            return Err(Error::invalid("a request cannot be delayed: it waits for its reply now; publish it with a delay instead"));
        }
        let mut props = props_for(envelope);
        check_destination(exchange, routing_key, &props)?;
        let correlation_id = crate::envelope::new_id();
        props.correlation_id = Some(correlation_id.clone());
        let replies = self.replies();
        let (tx, rx) = oneshot::channel();
        replies.waiters().insert(correlation_id.clone(), tx);
        let _waiting = Waiting { replies: &replies, id: correlation_id };
        let channel = self.reply_channel().await?;
        let reply = tokio::time::timeout(timeout, rx);
        tokio::pin!(reply);
        match channel {
            None => {
                let Backend::Memory(b) = self.backend() else { unreachable!("no reply channel only on memory://") };
                props.reply_to = replies.address.get().cloned();
                b.publish(exchange, routing_key, body, &props)?;
            }
            Some((ch, reply_to)) => {
                let Backend::Amqp(a) = self.backend() else { unreachable!("a reply channel only on amqp://") };
                props.reply_to = Some(reply_to.to_owned());
                let confirm = a.send_request(&ch, exchange, routing_key, body, &props).await?;
                // The confirm and the reply are awaited together: a reply
                // may come first, and a refusal must not wait the timeout.
                let confirmed = confirm.wait();
                tokio::pin!(confirmed);
                tokio::select! {
                    c = &mut confirmed => c?,
                    r = &mut reply => return answer(r, timeout, routing_key),
                }
            }
        }
        answer(reply.await, timeout, routing_key)
    }

    /// Replies that arrived after their request had timed out (or been
    /// dropped), and were dropped.
    pub fn late_replies(&self) -> u64 {
        self.replies().late.load(Ordering::Relaxed)
    }

    /// Reply to `request` (a message sent with [`Connection::request`]):
    /// `payload` as JSON to its `reply_to`, with its `correlation_id`, and
    /// an envelope of its own (`options` as a publish's). Returns it.
    ///
    /// A request with no `reply_to` is refused (`InvalidArgument`): it was
    /// published, not requested. A requester that is gone is not an error:
    /// the reply is dropped, as RabbitMQ drops it.
    ///
    /// # Cancel safety
    ///
    /// As [`Connection::publish`].
    pub async fn reply<T: Serialize + ?Sized>(&self, request: &Message, payload: &T, options: PublishOptions) -> Result<Envelope> {
        let body = serde_json::to_vec(payload)?;
        let envelope = self.envelope_for(&options);
        let p = &request.delivery.properties;
        self.send_reply(&body, p.reply_to.as_deref(), p.correlation_id.as_deref(), &envelope).await?;
        Ok(envelope)
    }

    /// [`Connection::reply`] with the body already JSON, to the request's
    /// `reply_to` and `correlation_id`.
    ///
    /// # Cancel safety
    ///
    /// As [`Connection::publish`].
    pub async fn send_reply(&self, body: &[u8], reply_to: Option<&str>, correlation_id: Option<&str>, envelope: &Envelope) -> Result<()> {
        let Some(reply_to) = reply_to.filter(|r| !r.is_empty()) else {
            return Err(Error::invalid(
                "this message has no reply_to: it was published, not sent as a request (request), so there is nobody to reply to",
            ));
        };
        let mut props: Props = props_for(envelope);
        props.correlation_id = correlation_id.map(str::to_owned);
        match self.send_json_props(body, reply_to, props).await {
            Err(e) if matches!(e.kind(), ErrorKind::Unroutable) => Ok(()),
            other => other,
        }
    }

    async fn send_json_props(&self, body: &[u8], routing_key: &str, props: Props) -> Result<()> {
        check_destination("", routing_key, &props)?;
        self.backend().send("", routing_key, body, &props).await?.wait().await
    }
}

fn decoded(raw: &RawDelivery, payload: crate::wire::Payload) -> Result<Message> {
    crate::wire::decode_as(REPLY_TO, raw, payload).map_err(|u| Error::invalid(format!("the reply could not be read: {}", u.reason)))
}

fn answer(
    got: std::result::Result<std::result::Result<RawDelivery, oneshot::error::RecvError>, tokio::time::error::Elapsed>,
    timeout: Duration,
    routing_key: &str,
) -> Result<RawDelivery> {
    match got {
        Ok(Ok(raw)) => Ok(raw),
        Ok(Err(_)) => Err(Error::closed("the connection closed while waiting for the reply")),
        Err(_) => Err(Error::new(
            ErrorKind::Timeout,
            format!(
                "no reply to the request to '{routing_key}' within {timeout:?}: it may still be handled, and a reply after now is dropped and counted (late_replies); ask again if the request is safe to repeat"
            ),
        )),
    }
}
