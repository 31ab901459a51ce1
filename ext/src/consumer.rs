//! AceMQ::AMQP::NativeConsumer: a pull consumer for the Ruby threads that
//! lib/acemq/amqp/subscription.rb starts. Each thread asks for the next
//! delivery (waiting without the GVL), calls the block with the GVL, and
//! settles the delivery here; core decides what the settlement does. What
//! settles a delivery lives in its Message::Consumed, not in a table here.

use crate::delivery::RbDelivery;
use crate::errors::IntoRuby;
use crate::convert::{KnownType, Typed};
use crate::gvl;
use acemq::{Ack, Consumer, Fetch, Outcome, Unread};
use magnus::{method, prelude::*, Error, RArray, RModule, Ruby, Value};
use std::sync::Arc;
use std::time::Instant;

/// What `_next` raises once the consumer is closed: Ruby's own word for a
/// source with nothing more to give (`loop` ends on it).
fn closed(ruby: &Ruby) -> Error {
    Error::new(ruby.exception_stop_iteration(), "the consumer is closed")
}

#[magnus::wrap(class = "AceMQ::AMQP::NativeConsumer", free_immediately, size)]
pub struct RbConsumer {
    inner: Arc<Consumer>,
    /// Its queue's name, which each of its deliveries shares.
    queue: Arc<str>,
}

impl KnownType for RbConsumer {
    fn known() -> &'static std::sync::atomic::AtomicPtr<rb_sys::rb_data_type_t> {
        static KNOWN: std::sync::atomic::AtomicPtr<rb_sys::rb_data_type_t> = std::sync::atomic::AtomicPtr::new(std::ptr::null_mut());
        &KNOWN
    }
}

impl RbConsumer {
    pub(crate) fn new(consumer: Consumer) -> Self {
        let inner = Arc::new(consumer);
        inner.watch_deadlines();
        let queue = Arc::from(inner.queue());
        RbConsumer { inner, queue }
    }

    /// A delivery as the Ruby object a handler's Message reads. Its body is
    /// read here, once: built into the payload's Ruby objects, which is also
    /// how it is found to be JSON (core has made every other check). Then
    /// the message and what settles it move into the object, the settler
    /// until `_settle` takes it. None when there is nothing to hand out: the
    /// body is not JSON (core dead-letters it, with what the parser said),
    /// or the circuit breaker sent it back.
    fn hand_out(&self, ruby: &Ruby, unread: Unread) -> Option<Value> {
        let payload = match crate::json::build_protected(ruby, unread.text()) {
            Ok(crate::json::Built::Value(v)) => Some(v),
            Ok(crate::json::Built::Later) => None,
            Err(e) => {
                self.inner.refuse(unread, &e);
                return None;
            }
        };
        // Where it came from is read off the delivery's body (Message::Consumed
        // #_exchange and the rest), not copied into the message.
        let (message, settler) = self.inner.admit_lean(unread)?.into_parts();
        let delivery = RbDelivery::handed_out(message, settler, payload, self.queue.clone()).into_message(ruby);
        // The payload lived only on this stack (and in the delivery's
        // struct, which Ruby marks once it is an object) until here.
        std::hint::black_box(payload);
        Some(delivery)
    }

    /// The next delivery (a Message::Consumed), nil when nothing arrived within
    /// `timeout` seconds. Raises StopIteration once the consumer is closed:
    /// there will be no more.
    fn next(ruby: &Ruby, rb_self: Typed<Self>, timeout: f64) -> Result<Option<Value>, Error> {
        Self::take_next(ruby, &rb_self, timeout)
    }

    fn take_next(ruby: &Ruby, rb_self: &Self, timeout: f64) -> Result<Option<Value>, Error> {
        // The fast path keeps the GVL: a delivery already buffered is handed
        // out without a thread switch.
        match rb_self.inner.try_fetch() {
            Fetch::Unread(unread) => {
                if let Some(d) = rb_self.hand_out(ruby, *unread) {
                    return Ok(Some(d));
                }
            }
            Fetch::Closed => return Err(closed(ruby)),
            Fetch::Empty => {}
        }
        let deadline = Instant::now() + crate::convert::seconds(ruby, "timeout", timeout)?;
        loop {
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                return Ok(None);
            }
            let consumer = rb_self.inner.clone();
            let waker = rb_self.inner.clone();
            let slice = remaining.min(gvl::SLICE);
            let next = gvl::without_gvl(ruby, move || consumer.fetch_blocking(slice), move || waker.wake())?;
            match next {
                Fetch::Unread(unread) => {
                    if let Some(d) = rb_self.hand_out(ruby, *unread) {
                        return Ok(Some(d));
                    }
                }
                Fetch::Closed => return Err(closed(ruby)),
                Fetch::Empty => ruby.thread_check_ints()?,
            }
        }
    }

    /// Up to `max` deliveries: waits (like `_next`) for the first, then takes
    /// what is already buffered without waiting. An array of deliveries, nil
    /// when nothing arrived within `timeout`; StopIteration once closed.
    fn next_many(ruby: &Ruby, rb_self: &Self, max: usize, timeout: f64) -> Result<Option<RArray>, Error> {
        let Some(first) = Self::take_next(ruby, rb_self, timeout)? else { return Ok(None) };
        let batch = ruby.ary_new_capa(max.max(1));
        batch.push(first)?;
        while batch.len() < max {
            match rb_self.inner.try_fetch() {
                Fetch::Unread(unread) => {
                    if let Some(d) = rb_self.hand_out(ruby, *unread) {
                        batch.push(d)?;
                    }
                }
                Fetch::Empty | Fetch::Closed => break,
            }
        }
        Ok(Some(batch))
    }

    /// Settle `delivery` with what its handler produced: an Ack, the
    /// StandardError it raised, or anything else (not an Ack); the rules for
    /// each live in core (`convert::guarded` reads it, `Outcome::settlement`
    /// decides). A retry or reject runs in the background (core's
    /// `settle_later`), so the handler thread goes on to the next delivery
    /// while the copy is confirmed. Returns the errors earlier background
    /// settlements met, as exceptions (nil when none): each of their
    /// messages went back to the queue.
    ///
    /// `counts`: whether a raised error counts toward the circuit breaker,
    /// as Subscription matched it against `on:` and `ignore:` (nil when the
    /// breaker has neither, or there is none).
    fn settle(ruby: &Ruby, rb_self: Typed<Self>, delivery: Typed<RbDelivery>, result: Value, counts: Option<bool>) -> Result<Option<RArray>, Error> {
        // Read before the settler is taken: an unreadable result (an Ack
        // whose reader raised) leaves the delivery settleable, not lost with
        // the exception.
        let guarded = crate::convert::guarded(ruby, result)?.counting(counts);
        let not_in_flight = |why: &str| {
            Error::new(ruby.exception_arg_error(), format!("delivery {} is not in flight on this consumer ({why})", delivery.tag()))
        };
        let Some(settler) = delivery.take_settler() else { return Err(not_in_flight("settled twice?")) };
        if !rb_self.inner.owns(&settler) {
            delivery.put_back(settler);
            return Err(not_in_flight("another consumer handed it out"));
        }
        // The guard's verdict rides with the outcome (a duplicate's accept
        // is reported as one).
        if guarded.verdict.is_none() && matches!(guarded.outcome, Outcome::Ack(Ack::Accept)) {
            rb_self.inner.accept(settler);
        } else {
            rb_self.inner.settle_later_guarded(settler, guarded);
        }
        Ok(rb_self.errors(ruby))
    }

    fn errors(&self, ruby: &Ruby) -> Option<RArray> {
        let errors = self.inner.take_errors();
        if errors.is_empty() {
            return None;
        }
        let arr = ruby.ary_new_capa(errors.len());
        for e in errors {
            let _ = arr.push(crate::errors::exception(ruby, e));
        }
        Some(arr)
    }

    fn take_errors(ruby: &Ruby, rb_self: &Self) -> Option<RArray> {
        rb_self.errors(ruby)
    }

    /// How many deliveries are handed out and not settled, as core counts
    /// them (`Consumer::in_flight`). One whose handler thread died stays
    /// unsettled until its deadline settles it as a retry, or the consumer
    /// closes and the broker has it back.
    fn inflight_count(&self) -> usize {
        self.inner.in_flight()
    }

    /// How often core's deadline watch looks, in seconds: how often asking
    /// NativeDelivery#_overdue? can find anything new.
    fn deadline_tick(&self) -> f64 {
        self.inner.deadline_tick().as_secs_f64()
    }

    fn stop(ruby: &Ruby, rb_self: &Self) -> Result<(), Error> {
        let consumer = rb_self.inner.clone();
        gvl::block_on(ruby, async move { consumer.stop().await })
    }

    fn close(ruby: &Ruby, rb_self: &Self) -> Result<(), Error> {
        // Unsettled deliveries go back to the queue with the subscription;
        // core discards what their handlers settle later (abandoned).
        let consumer = rb_self.inner.clone();
        gvl::block_on(ruby, async move { consumer.close().await })
    }

    fn stats(ruby: &Ruby, rb_self: &Self) -> Result<magnus::RHash, Error> {
        let s = rb_self.inner.stats();
        let h = ruby.hash_new();
        for (name, n) in [
            ("accepted", s.accepted),
            ("retried", s.retried),
            ("dead_lettered", s.dead_lettered),
            ("waited", s.waited),
            ("timed_out", s.timed_out),
            ("abandoned", s.abandoned),
            ("expired", s.expired),
            ("error_replied", s.error_replied),
        ] {
            h.aset(ruby.to_symbol(name), n)?;
        }
        Ok(h)
    }

    /// What the startup checks found questionable (strings; empty when nothing).
    fn warnings(&self) -> Vec<String> {
        self.inner.warnings().to_vec()
    }

    /// The handler deadline, in seconds.
    fn timeout(&self) -> f64 {
        self.inner.options().timeout.as_secs_f64()
    }

    /// Seconds the subscription has been without a channel, nil while subscribed.
    fn down_for(&self) -> Option<f64> {
        self.inner.down_for().map(|d| d.as_secs_f64())
    }

    fn resubscriptions(&self) -> u64 {
        self.inner.resubscriptions()
    }

    fn failure(&self) -> Option<String> {
        self.inner.failure().map(|e| e.to_string())
    }

    fn queue(&self) -> String {
        self.inner.queue().to_owned()
    }

    /// The core consumer, for the runner's supervisor (pause by name).
    pub(crate) fn core(&self) -> Arc<Consumer> {
        self.inner.clone()
    }

    fn pause(ruby: &Ruby, rb_self: &Self) -> Result<(), Error> {
        let consumer = rb_self.inner.clone();
        gvl::block_on(ruby, async move { consumer.pause().await })
    }

    fn resume(ruby: &Ruby, rb_self: &Self) -> Result<(), Error> {
        let consumer = rb_self.inner.clone();
        gvl::block_on(ruby, async move { consumer.resume().await })?.rb(ruby)
    }

    fn is_paused(&self) -> bool {
        self.inner.is_paused()
    }

    /// The circuit breaker's state (closed, open, half_open, trying), nil
    /// without one.
    fn breaker(&self) -> Option<&'static str> {
        self.inner.breaker_state().map(acemq::BreakerState::as_str)
    }
}

pub fn init(ruby: &Ruby, amqp: RModule) -> Result<(), Error> {
    let class = amqp.define_class("NativeConsumer", ruby.class_object())?;
    class.define_method("_next", method!(RbConsumer::next, 1))?;
    class.define_method("_next_many", method!(RbConsumer::next_many, 2))?;
    class.define_method("_settle", method!(RbConsumer::settle, 3))?;
    class.define_method("_warnings", method!(RbConsumer::warnings, 0))?;
    class.define_method("_timeout", method!(RbConsumer::timeout, 0))?;
    class.define_method("_deadline_tick", method!(RbConsumer::deadline_tick, 0))?;
    class.define_method("_stop", method!(RbConsumer::stop, 0))?;
    class.define_method("_close", method!(RbConsumer::close, 0))?;
    class.define_method("_stats", method!(RbConsumer::stats, 0))?;
    class.define_method("_errors", method!(RbConsumer::take_errors, 0))?;
    class.define_method("_failure", method!(RbConsumer::failure, 0))?;
    class.define_method("_down_for", method!(RbConsumer::down_for, 0))?;
    class.define_method("_resubscriptions", method!(RbConsumer::resubscriptions, 0))?;
    class.define_method("_inflight", method!(RbConsumer::inflight_count, 0))?;
    class.define_method("queue", method!(RbConsumer::queue, 0))?;
    class.define_method("_pause", method!(RbConsumer::pause, 0))?;
    class.define_method("_resume", method!(RbConsumer::resume, 0))?;
    class.define_method("_paused?", method!(RbConsumer::is_paused, 0))?;
    class.define_method("_breaker", method!(RbConsumer::breaker, 0))?;
    Ok(())
}
