//! Where a failed delivery's copy goes (a rung of the retry ladder or the DLQ), copied first and then acknowledged.
//! Its part of `impl Consumer`: the ladder declared, and a delivery
//! retried, waited or dead-lettered.

use crate::connection::Connection;
use crate::envelope::{ATTEMPT_HEADER, now_secs};
use crate::error::{Error, ErrorKind, Result};
use crate::events::{self, Event, ProcessOutcome};
use crate::retry::{dlq_name, rung_name};
use crate::topology::{QueueSpec, Topology};
use crate::backtrace::Backtrace;
use crate::wire::{BACKTRACE_HEADER, ERROR_CLASS_HEADER, FAILED_AT_HEADER, ORIGINAL_EXCHANGE_HEADER, ORIGINAL_ROUTING_KEY_HEADER, QUEUE_HEADER, RawDelivery, REASON_HEADER};
use super::Consumer;
use super::options::ConsumeOptions;
use serde_json::Value;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// How long a delivery whose copy could not be made waits before it goes
/// back to its queue.
const REQUEUE_PAUSE: Duration = Duration::from_secs(1);

/// When the first wait began (seconds since the epoch), on a copy waiting for
/// another handler's idempotency claim ([`Outcome::Wait`](crate::ack::Outcome::Wait)).
pub const WAITING_SINCE_HEADER: &str = "x-acemq-waiting-since";

/// How many times a copy has waited so far.
pub const WAITS_HEADER: &str = "x-acemq-waits";

/// The DLQ and one rung per distinct delay of `queue`'s ladder. Declared by
/// every consumer: a reject must never find its queue missing.
pub(super) fn ladder(conn: &Connection, queue: &str, options: &ConsumeOptions) -> Topology {
    let kind = options.queue_type.or_else(|| conn.applied_type(queue)).unwrap_or_default();
    let mut t = Topology::new();
    t = t.queue_spec(QueueSpec::dead_letters_of(queue, kind));
    for delay in options.retry.rungs() {
        t = t.queue_spec(QueueSpec::delay(rung_name(queue, delay), delay, queue).with_type(kind));
    }
    t
}

impl Consumer {
    async fn declare_ladder(&self) -> Result<()> {
        self.conn.backend().apply(&ladder(&self.conn, &self.queue, &self.options)).await
    }

    /// A retry, or past `max_attempts` a dead letter saying so.
    pub(super) async fn retry_or_exhaust(
        &self,
        raw: RawDelivery,
        attempt: u32,
        reason: &str,
        error_class: Option<&str>,
        backtrace: Option<&Backtrace>,
    ) -> Result<ProcessOutcome> {
        if attempt >= self.options.retry.max_attempts {
            tracing::Span::current().record("acemq.outcome", "dead_lettered");
            let reason = format!("retries exhausted after {attempt} attempts: {reason}");
            self.dead_letter(raw, &reason, error_class, backtrace).await.map(|()| ProcessOutcome::DeadLettered)
        } else {
            self.retry(raw, attempt, reason, error_class, backtrace).await.map(|()| ProcessOutcome::Retried)
        }
    }

    /// A copy whose key another handler has claimed goes round the ladder
    /// without spending an attempt: the other handler may be alive and about
    /// to confirm (then it is a duplicate), or dead (then its claim expires
    /// after `up_to` and the message runs). Each wait takes the next longer
    /// rung. Past `up_to` since the first wait — a handler running longer
    /// than its claim — it is an ordinary retry; and with no rungs at all
    /// (`max_attempts` 1) there is nowhere to wait.
    pub(super) async fn wait(&self, mut raw: RawDelivery, attempt: u32, reason: &str, up_to: Duration) -> Result<ProcessOutcome> {
        let max = self.options.retry.max_attempts;
        let now = now_secs();
        let h = raw.props.headers();
        let since = h.get(WAITING_SINCE_HEADER).and_then(Value::as_u64).unwrap_or(now);
        let waits = h.get(WAITS_HEADER).and_then(Value::as_u64).unwrap_or(0);
        let waited = Duration::from_secs(now.saturating_sub(since));
        if max <= 1 || waited > up_to {
            let reason = if max <= 1 { reason.to_owned() } else { format!("{reason}; waited {}s, longer than the claim timeout", waited.as_secs()) };
            return self.retry_or_exhaust(raw, attempt, &reason, None, None).await;
        }
        let step = u32::try_from(u64::from(attempt).saturating_add(waits)).unwrap_or(u32::MAX).clamp(1, max - 1);
        let rung = rung_name(&self.queue, self.options.retry.delay_after(step));
        self.failure_headers(&mut raw, reason, None, None);
        let h = raw.props.headers_mut();
        h.insert(WAITING_SINCE_HEADER.into(), Value::from(since));
        h.insert(WAITS_HEADER.into(), Value::from(waits + 1));
        h.insert(ATTEMPT_HEADER.into(), Value::from(attempt));
        self.copy_then_ack(raw, &rung).await?;
        self.counters.waited.fetch_add(1, Ordering::Relaxed);
        Ok(ProcessOutcome::Waited)
    }

    /// The newest failure's reason, class and backtrace, each replacing the
    /// one before: a class or backtrace this failure has none of is
    /// removed, so the copy never pairs this reason with an older failure's
    /// frames. (The history header keeps earlier reasons, never backtraces:
    /// twenty frames a failure would make it the heaviest header.)
    fn failure_headers(&self, raw: &mut RawDelivery, reason: &str, error_class: Option<&str>, backtrace: Option<&Backtrace>) {
        let h = raw.props.headers_mut();
        h.insert(REASON_HEADER.into(), Value::from(crate::limits::bounded(reason, crate::limits::MAX_REASON)));
        match error_class {
            Some(c) => h.insert(ERROR_CLASS_HEADER.into(), Value::from(crate::limits::bounded(c, crate::limits::MAX_SHORT))),
            None => h.remove(ERROR_CLASS_HEADER),
        };
        match backtrace {
            Some(b) => h.insert(BACKTRACE_HEADER.into(), Value::from(b.as_str())),
            None => h.remove(BACKTRACE_HEADER),
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

    async fn retry(&self, mut raw: RawDelivery, attempt: u32, reason: &str, error_class: Option<&str>, backtrace: Option<&Backtrace>) -> Result<()> {
        let delay = self.options.retry.delay_after(attempt);
        let rung = rung_name(&self.queue, delay);
        self.failure_headers(&mut raw, reason, error_class, backtrace);
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

    pub(crate) async fn dead_letter(&self, mut raw: RawDelivery, reason: &str, error_class: Option<&str>, backtrace: Option<&Backtrace>) -> Result<()> {
        self.failure_headers(&mut raw, reason, error_class, backtrace);
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
        crate::limits::copy_props(&mut raw.props);
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
}
