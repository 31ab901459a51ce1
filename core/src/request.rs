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
//!
//! A request carries its deadline ([`DEADLINE_HEADER`]) and whether it is
//! safe to retry ([`RETRY_SAFE_HEADER`]). A consumer whose handler fails on
//! a request sends back an error reply ([`ERROR_TYPE`], [`ERROR_HEADER`]),
//! which the requester returns as [`ErrorKind::Remote`]; a request whose
//! deadline has passed is dropped, since nobody waits for it
//! (docs/request-reply.md, "When the responder fails").

use crate::backtrace::Backtrace;
use crate::connection::{check_destination, Connection, PublishOptions, Replies};
use crate::envelope::Envelope;
use crate::decode::Payload;
use crate::error::{Error, ErrorKind, RemoteFailure, Result};
use crate::message::Message;
use crate::transport::Backend;
use crate::wire::{props_for, Body, Props, RawDelivery, REPLY_TO};
use serde::Serialize;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::oneshot;

/// How long [`Connection::request`] waits for a reply by default.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// On a request: when its requester stops waiting, in milliseconds since
/// the epoch (the requester's clock). Past it a consumer drops the request
/// unhandled: nobody would read the answer.
pub const DEADLINE_HEADER: &str = "x-acemq-deadline";

/// On a request: `true` when its requester said it is safe to handle more
/// than once ([`RequestOptions::retry_safe`]), so a failure goes round the
/// retry ladder before it is answered with an error.
pub const RETRY_SAFE_HEADER: &str = "x-acemq-retry-safe";

/// The `type` of an error reply: what a requester recognizes it by.
pub const ERROR_TYPE: &str = "acemq.error";

/// On an error reply: a table `{"class": …, "message": …}`, the failure's
/// error class (absent for a handler's own reject) and its message or
/// reason. Its frames travel as `x-acemq-backtrace`, bounded as a dead
/// letter's ([`Backtrace`]).
pub const ERROR_HEADER: &str = "x-acemq-error";

/// How to send one request.
#[derive(Debug, Clone)]
pub struct RequestOptions {
    /// Where and with what envelope, as a publish (`delay`/`at` are refused:
    /// a request waits for its answer now).
    pub publish: PublishOptions,
    /// How long to wait for the reply before [`ErrorKind::Timeout`]. The
    /// request carries the moment this runs out as its deadline
    /// ([`DEADLINE_HEADER`]): a consumer meeting it later drops it unhandled.
    pub timeout: Duration,
    /// Handling it twice does no harm, so a failing handler may be tried
    /// again: a failure before the deadline goes round the consumer's retry
    /// ladder, and the error reply comes only when the retries are spent (or
    /// the next one would come back after the deadline). Default false: the
    /// first failure is answered with an error reply at once and the request
    /// is not tried again.
    pub retry_safe: bool,
}

impl Default for RequestOptions {
    fn default() -> Self {
        RequestOptions { publish: PublishOptions::default(), timeout: DEFAULT_REQUEST_TIMEOUT, retry_safe: false }
    }
}

/// A [`RemoteFailure`] read from an error reply's headers (see the type's
/// doc).
fn remote_failure_of(raw: &RawDelivery) -> RemoteFailure {
    use serde_json::Value;
    let error = raw.props.header(ERROR_HEADER);
    let field = |name: &str| match error.as_deref() {
        Some(Value::Object(o)) => o.get(name).and_then(Value::as_str).map(str::to_owned),
        _ => None,
    };
    let class = field("class").filter(|c| !c.is_empty()).map(|c| crate::limits::bounded(&c, crate::limits::MAX_SHORT));
    let message = match field("message") {
        Some(m) => crate::limits::bounded(&m, crate::limits::MAX_REASON),
        None => format!("the responder sent an error reply without a readable {ERROR_HEADER} (a table with a message)"),
    };
    let backtrace = match raw.props.header(crate::wire::BACKTRACE_HEADER).as_deref() {
        Some(Value::String(text)) => Backtrace::from_frames(text.lines().collect::<Vec<_>>()),
        Some(Value::Array(frames)) => Backtrace::from_frames(frames.iter().filter_map(Value::as_str).collect::<Vec<_>>()),
        _ => None,
    };
    RemoteFailure { class, message, backtrace }
}

/// Milliseconds since the epoch, now.
pub(crate) fn now_millis() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
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
    /// that is dropped and counted in [`Connection::late_replies`]);
    /// [`ErrorKind::Remote`] when the responder's handler failed on it
    /// ([`Error::remote`] says how); [`ErrorKind::Encoding`] for a reply
    /// whose body is not JSON; what a publish fails with when the request
    /// cannot be sent (`Unroutable` for a queue nobody declared).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe as far as this connection goes: a dropped future forgets
    /// its waiter, and its reply, if one comes, is counted late. The request
    /// may have been sent.
    pub async fn request<T: Serialize + ?Sized>(&self, payload: &T, routing_key: &str, options: RequestOptions) -> Result<Message> {
        let body = serde_json::to_vec(payload)?;
        let envelope = self.envelope_for(&options.publish);
        let raw = self.exchange_request(&body, &options.publish.exchange, routing_key, &envelope, &options).await?;
        decoded(&raw, Payload::Parsed)
    }

    /// [`Connection::request`] with the body already JSON and the envelope
    /// made ([`Connection::envelope_for`]): what the Ruby gem calls. The
    /// reply's payload is checked to be JSON and left unbuilt
    /// ([`Payload::Checked`](crate::Payload::Checked)): its body is returned
    /// with it for the caller to build its own values from. Of `options`
    /// only `timeout` and `retry_safe` are read: the exchange and envelope
    /// are the ones given.
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
        options: &RequestOptions,
    ) -> Result<(Message, Body)> {
        let raw = self.exchange_request(body, exchange, routing_key, envelope, options).await?;
        let message = decoded(&raw, Payload::Checked)?;
        Ok((message, Body::of(raw)))
    }

    async fn exchange_request(&self, body: &[u8], exchange: &str, routing_key: &str, envelope: &Envelope, options: &RequestOptions) -> Result<RawDelivery> {
        if crate::cascade::due_of(&envelope.headers).is_some() {
            return Err(Error::invalid("a request cannot be delayed: it waits for its reply now; publish it with a delay instead"));
        }
        let timeout = options.timeout;
        let mut props = props_for(envelope);
        let deadline = now_millis().saturating_add(u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX));
        props.headers_mut().insert(DEADLINE_HEADER.into(), serde_json::Value::from(deadline));
        if options.retry_safe {
            props.headers_mut().insert(RETRY_SAFE_HEADER.into(), serde_json::Value::Bool(true));
        } else {
            props.headers_mut().remove(RETRY_SAFE_HEADER);
        }
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

    /// The error reply to a request whose handler failed: type
    /// [`ERROR_TYPE`], the class and message in [`ERROR_HEADER`] (and in
    /// the body, `{"error": {…}}`, for a requester that reads only bodies),
    /// the frames as `x-acemq-backtrace`. A requester that is gone is not an
    /// error, as for [`Connection::send_reply`].
    pub(crate) async fn send_error_reply(
        &self,
        reply_to: &str,
        correlation_id: &str,
        class: Option<&str>,
        message: &str,
        backtrace: Option<&Backtrace>,
    ) -> Result<()> {
        use serde_json::Value;
        let mut envelope = self.envelope_for(&PublishOptions { kind: Some(ERROR_TYPE.to_owned()), ..Default::default() });
        let mut error = serde_json::Map::new();
        if let Some(class) = class {
            error.insert("class".into(), Value::from(crate::limits::bounded(class, crate::limits::MAX_SHORT)));
        }
        error.insert("message".into(), Value::from(crate::limits::bounded(message, crate::limits::MAX_REASON)));
        let body = serde_json::to_vec(&serde_json::json!({ "error": error }))?;
        envelope.headers.insert(ERROR_HEADER.into(), Value::Object(error));
        if let Some(b) = backtrace {
            envelope.headers.insert(crate::wire::BACKTRACE_HEADER.into(), Value::from(b.as_str()));
        }
        self.send_reply(&body, Some(reply_to), Some(correlation_id), &envelope).await
    }

    async fn send_json_props(&self, body: &[u8], routing_key: &str, props: Props) -> Result<()> {
        check_destination("", routing_key, &props)?;
        self.backend().send("", routing_key, body, &props).await?.wait().await
    }
}

fn decoded(raw: &RawDelivery, payload: Payload) -> Result<Message> {
    // Encoding, not InvalidArgument: the responder sent it, the caller's
    // arguments were fine (Ruby raises EncodingError, not ConfigurationError).
    crate::decode::decode_as(REPLY_TO, raw, payload)
        .map_err(|u| Error::new(ErrorKind::Encoding, format!("the reply could not be read: {}; it was dropped", u.reason)))
}

fn answer(
    got: std::result::Result<std::result::Result<RawDelivery, oneshot::error::RecvError>, tokio::time::error::Elapsed>,
    timeout: Duration,
    routing_key: &str,
) -> Result<RawDelivery> {
    match got {
        Ok(Ok(raw)) if raw.props.kind.as_deref() == Some(ERROR_TYPE) => {
            let failure = remote_failure_of(&raw);
            let what = match failure.class() {
                Some(class) => format!("{class}: {}", failure.message()),
                None => failure.message().to_owned(),
            };
            Err(Error::remote_failure(
                format!("the responder to '{routing_key}' failed on this request ({what}); it was not retried unless sent retry_safe"),
                failure,
            ))
        }
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

#[cfg(test)]
mod tests {
    use crate::wire::Props;
    use crate::{Ack, ConsumeOptions, Connection, ErrorKind, RequestOptions, Topology, ERROR_TYPE};
    use serde_json::json;
    use std::time::Duration;

    /// A responder that is not AceMQ, or not well: replies whose body is not
    /// JSON, and error replies whose headers are not what AceMQ sends,
    /// between good replies. Each is a clean error of its own kind
    /// (Encoding, Remote), and the replies around them are read; on
    /// memory:// and, with AMQP_URL, RabbitMQ.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_bad_reply_between_good_ones_is_a_clean_error() {
        let mut urls = vec![format!("memory://bad-reply-{}", uuid::Uuid::now_v7().simple())];
        urls.extend(std::env::var("AMQP_URL").ok());
        for url in urls {
            let mq = Connection::open(&url).await.unwrap();
            let q = format!("bad-reply-{}", uuid::Uuid::now_v7().simple());
            mq.apply(&Topology::new().queue(&q)).await.unwrap();
            let server = mq.clone();
            let handle = mq
                .consume(&q, ConsumeOptions::default(), move |m: crate::Message| {
                    let server = server.clone();
                    async move {
                        let p = &m.delivery.properties;
                        let mut props = Props::default();
                        props.correlation_id = p.correlation_id.clone();
                        let body: Vec<u8> = match m.payload["kind"].as_str() {
                            Some("not json") => b"<html>oops</html>".to_vec(),
                            Some("odd error") => {
                                props.kind = Some(ERROR_TYPE.into());
                                let h = props.headers_mut();
                                h.insert(super::ERROR_HEADER.into(), json!({"class": ["x"], "message": 12}));
                                h.insert(crate::wire::BACKTRACE_HEADER.into(), json!({"not": "frames"}));
                                b"{}".to_vec()
                            }
                            _ => br#"{"ok":true}"#.to_vec(),
                        };
                        props.content_type = Some("application/json".into());
                        let to = p.reply_to.clone().unwrap();
                        server.backend().send("", &to, &body, &props).await.unwrap().wait().await.unwrap();
                        Ack::accept()
                    }
                })
                .await
                .unwrap();
            let ask = |kind: &'static str| {
                let (mq, q) = (mq.clone(), q.clone());
                async move { mq.request(&json!({ "kind": kind }), &q, RequestOptions { timeout: Duration::from_secs(10), ..Default::default() }).await }
            };
            assert_eq!(ask("good").await.unwrap().payload["ok"], true, "{url}");
            let e = ask("not json").await.unwrap_err();
            assert_eq!(e.kind(), &ErrorKind::Encoding, "{url}: {e}");
            assert_eq!(ask("good").await.unwrap().payload["ok"], true, "{url}");
            let e = ask("odd error").await.unwrap_err();
            let remote = e.remote().expect("an error reply, however odd, is a remote error");
            assert_eq!((remote.class(), remote.backtrace()), (None, None), "{url}");
            assert!(remote.message().contains("without a readable x-acemq-error"), "{url}: {}", remote.message());
            assert_eq!(ask("good").await.unwrap().payload["ok"], true, "{url}");
            // A request whose own body is not JSON cannot be handled: it is
            // dead-lettered as any such message, and its requester told at
            // once rather than after its 30 s.
            let asked = std::time::Instant::now();
            let options = RequestOptions { timeout: Duration::from_secs(30), ..Default::default() };
            let e = mq.send_request(b"<not json>", "", &q, &crate::Envelope::new(), &options).await.unwrap_err();
            assert!(asked.elapsed() < Duration::from_secs(5), "{url}: waited {:?}", asked.elapsed());
            let remote = e.remote().expect("an error reply");
            assert!(remote.message().starts_with("body is not JSON"), "{url}: {}", remote.message());
            assert_eq!(remote.class(), None, "{url}");
            let until = std::time::Instant::now() + Duration::from_secs(10);
            while mq.peek_dead_letters(&q, 10).await.unwrap().is_empty() {
                assert!(std::time::Instant::now() < until, "{url}: the undecodable request was not dead-lettered");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            assert_eq!(ask("good").await.unwrap().payload["ok"], true, "{url}");
            handle.cancel().await;
            mq.close().await;
        }
    }
}
