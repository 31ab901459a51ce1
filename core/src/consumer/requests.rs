//! A delivery that is a request ([`Connection::request`](crate::Connection::request)'s:
//! `reply_to`, `correlation_id` and its deadline, `x-acemq-deadline`): what
//! its failure becomes, and what becomes of it once its deadline has passed.
//! A message from another client that only carries `reply_to` and a
//! `correlation_id` (properties any publisher may set, for its own reasons)
//! is not one: its failures take the ladder as any message's (pika's
//! retried message went back to "replies" as an error reply instead, in a
//! full CI run).
//!
//! - Its deadline has passed (`x-acemq-deadline`): it is acknowledged and
//!   counted as `expired`, on arrival unhandled, or when its handler fails,
//!   instead of going round the ladder or to the DLQ. Nobody waits for its
//!   answer, and work done for nobody is not work to keep.
//! - Its handler failed before the deadline: an error reply goes to its
//!   requester at once, and it is acknowledged (counted `error_replied`),
//!   unless it was sent retry-safe and a retry is left that comes back
//!   before the deadline: then it goes round the ladder as any message.
//!
//! Not dead-lettered after an error reply: its requester has the error and
//! is the one who decides what happens next; a DLQ copy replayed later
//! would run the work again for a requester long gone.
//!
//! Its part of `impl Consumer`: an expired request dropped on arrival, a
//! delivery that cannot be a message refused (its requester told), and a
//! request's fate when its handler fails.

use crate::ack::{Settlement, Verdict};
use crate::backtrace::Backtrace;
use crate::error::{Error, Result};
use crate::events::{self, Event, ProcessOutcome};
use crate::request::{DEADLINE_HEADER, RETRY_SAFE_HEADER};
use crate::wire::RawDelivery;
use super::Consumer;
use serde_json::Value;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// How long a request whose error reply could not be sent waits before it
/// goes back to its queue: as a copy that failed (ladder.rs), so a broker
/// refusing everything is not a hot loop of redeliveries.
const REQUEUE_PAUSE: Duration = Duration::from_secs(1);

/// What ends a request in place of its settlement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Fate {
    /// Its deadline has passed: acknowledged, counted, nobody told.
    Expired,
    /// An error reply to its requester, then acknowledged.
    ErrorReply,
}

/// Its reply-to and correlation id, when `raw` is a request: both set, and
/// a deadline it can be read by.
fn request_of(raw: &RawDelivery) -> Option<(&str, &str)> {
    deadline_of(raw)?;
    let reply_to = raw.props.reply_to.as_deref().filter(|r| !r.is_empty())?;
    let correlation_id = raw.props.correlation_id.as_deref().filter(|c| !c.is_empty())?;
    Some((reply_to, correlation_id))
}

/// Its deadline in milliseconds since the epoch, when it carries one that
/// can be read (a number; anything else is no deadline). A negative one has
/// passed (it was taken as none, and such a request was handled).
fn deadline_of(raw: &RawDelivery) -> Option<u64> {
    let v = raw.props.header(DEADLINE_HEADER)?;
    v.as_u64()
        .or_else(|| v.as_i64().map(|i| i.max(0) as u64))
        .or_else(|| v.as_f64().filter(|f| f.is_finite()).map(|f| f.max(0.0) as u64))
}

/// Whether `raw` is a request whose deadline has passed.
fn expired(raw: &RawDelivery) -> bool {
    request_of(raw).is_some() && deadline_of(raw).is_some_and(|d| crate::request::now_millis() >= d)
}

impl Consumer {
    /// A request whose deadline has passed, met as it arrives: acknowledged
    /// unhandled, counted and reported. False for anything else, which is
    /// handed out as usual. Cheap for a message that is not a request: two
    /// property reads.
    pub(super) fn drop_if_expired(&self, raw: &RawDelivery) -> bool {
        if !expired(raw) {
            return false;
        }
        self.link.ack(raw.tag);
        self.counters.expired.fetch_add(1, Ordering::Relaxed);
        crate::events::emit(|| {
            let envelope = crate::wire::envelope_of(&raw.props);
            Event::Process(events::Process {
                consumer: self.options.name.clone().unwrap_or_else(|| self.queue.clone()),
                queue: self.queue.clone(),
                routing_key: raw.routing_key.clone(),
                message_id: envelope.id,
                attempt: envelope.attempt,
                duration: Duration::ZERO,
                outcome: ProcessOutcome::Expired,
                reason: Some("the request's deadline had passed when it arrived: dropped unhandled".into()),
                error_class: None,
            })
        });
        true
    }

    /// A delivery that cannot be a message (not JSON, a foreign content
    /// type), dead-lettered with `reason` as any such delivery is, its bytes
    /// kept for somebody to read. When it is a request before its deadline
    /// its requester is told at once, with an error reply giving the reason
    /// (no class), instead of waiting out its timeout for an answer that
    /// cannot come. That reply is best effort: the dead letter is what
    /// must not be lost, and a reply that fails leaves the requester to its
    /// timeout, as before.
    pub(super) async fn refuse_undecodable(&self, raw: RawDelivery, reason: &str) -> Result<()> {
        if !expired(&raw) {
            if let Some((reply_to, correlation_id)) = request_of(&raw) {
                let _ = self.conn.send_error_reply(reply_to, correlation_id, None, reason, None).await;
            }
        }
        self.dead_letter(raw, reason, None, None).await
    }

    /// What ends `raw` instead of `settlement`, when it is a request whose
    /// handler failed; None for anything else, which settles as usual. The
    /// guard's verdicts settle as usual too: a duplicate's first delivery
    /// answers its requester.
    pub(super) fn request_fate(&self, raw: &RawDelivery, attempt: u32, settlement: &Settlement, verdict: Option<Verdict>) -> Option<Fate> {
        if verdict.is_some() || !matches!(settlement, Settlement::Retry { .. } | Settlement::Reject { .. }) {
            return None;
        }
        request_of(raw)?;
        let deadline = deadline_of(raw);
        let now = crate::request::now_millis();
        if deadline.is_some_and(|d| now >= d) {
            return Some(Fate::Expired);
        }
        let retry_safe = raw.props.header(RETRY_SAFE_HEADER).is_some_and(|v| *v == Value::Bool(true));
        if retry_safe && matches!(settlement, Settlement::Retry { .. }) && attempt < self.options.retry.max_attempts {
            // A retry that comes back after the deadline would be dropped
            // unanswered: its requester is better told now.
            let back = u64::try_from(self.options.retry.delay_after(attempt).as_millis()).unwrap_or(u64::MAX);
            if deadline.is_none_or(|d| now.saturating_add(back) < d) {
                return None;
            }
        }
        Some(Fate::ErrorReply)
    }

    /// End the request `raw` as `fate` says (see [`Consumer::request_fate`]).
    /// An error reply that cannot be sent puts the request back on its
    /// queue, as a copy that cannot be made does, and returns the error.
    pub(super) async fn end_request(&self, raw: RawDelivery, fate: Fate, settlement: Settlement, backtrace: Option<&Backtrace>) -> Result<ProcessOutcome> {
        // The span was named by the settlement (retried, dead_lettered):
        // it says what became of the request instead.
        tracing::Span::current().record("acemq.outcome", if fate == Fate::Expired { "expired" } else { "error_replied" });
        if fate == Fate::Expired {
            self.link.ack(raw.tag);
            self.counters.expired.fetch_add(1, Ordering::Relaxed);
            return Ok(ProcessOutcome::Expired);
        }
        let (Settlement::Retry { reason, error_class } | Settlement::Reject { reason, error_class }) = settlement else {
            unreachable!("request_fate ends only failures")
        };
        // The reason is "Class: message" for a raise: the requester is told
        // the message alone, beside the class.
        let message = match error_class.as_deref() {
            Some(class) => reason.strip_prefix(class).and_then(|r| r.strip_prefix(": ")).unwrap_or(&reason),
            None => &reason,
        };
        let (reply_to, correlation_id) = request_of(&raw).expect("request_fate checked it is a request");
        match self.conn.send_error_reply(reply_to, correlation_id, error_class.as_deref(), message, backtrace).await {
            Ok(()) => {
                self.link.ack(raw.tag);
                self.counters.error_replied.fetch_add(1, Ordering::Relaxed);
                Ok(ProcessOutcome::ErrorReplied)
            }
            Err(e) => {
                tokio::time::sleep(REQUEUE_PAUSE).await;
                self.link.requeue(raw.tag).await;
                Err(Error::new(e.kind().clone(), format!("could not send the error reply to a failed request ({e}); it was put back on {}", self.queue)))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::Props;

    fn delivery(reply_to: Option<&str>, deadline: Option<Value>) -> RawDelivery {
        let mut props = Props::default();
        props.reply_to = reply_to.map(Into::into);
        props.correlation_id = Some("c-1".into());
        if let Some(d) = deadline {
            props.headers_mut().insert(DEADLINE_HEADER.into(), d);
        }
        RawDelivery { tag: 1, exchange: String::new(), routing_key: "q".into(), redelivered: false, body: b"{}".to_vec(), props }
    }

    #[test]
    fn a_request_carries_its_deadline() {
        let far = Value::from(crate::request::now_millis() + 60_000);
        assert!(request_of(&delivery(Some("amq.rabbitmq.reply-to"), Some(far.clone()))).is_some());
        // Another client's message with reply_to and a correlation id only
        // (pika's, in the interop spec) is an ordinary message.
        assert!(request_of(&delivery(Some("replies"), None)).is_none());
        assert!(request_of(&delivery(None, Some(far))).is_none());
        assert!(request_of(&delivery(Some("r"), Some(Value::from("soon")))).is_none());
    }

    #[test]
    fn a_negative_or_past_deadline_has_passed() {
        // The break-it run: -1 and -(2^40) were taken as no deadline and handled.
        for d in [Value::from(-1), Value::from(-(1i64 << 40)), Value::from(-1.5), Value::from(0), Value::from(1)] {
            assert!(expired(&delivery(Some("r"), Some(d.clone()))), "{d}");
        }
        assert!(!expired(&delivery(Some("r"), Some(Value::from(crate::request::now_millis() + 60_000)))));
    }
}
