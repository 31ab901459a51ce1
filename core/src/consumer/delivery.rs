//! What a handler is given: the delivery, its message, and the settler that settles it.
//! Its part of `impl Consumer`: handing a delivery out (`hand_out`).

use crate::error::Error;
use crate::message::Message;
use crate::wire::{Body, RawDelivery};
use super::Consumer;
use super::deadline::Watched;
use serde_json::Value;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// One delivery being handled: the message, for its handler, and the
/// [`Settler`] that settles it. [`Delivery::into_parts`] parts them when the
/// two go separate ways (the Ruby extension's delivery object keeps both).
#[derive(Debug)]
pub struct Delivery {
    /// The message, for the handler (see [`Delivery::take_message`]).
    pub message: Message,
    pub(super) settler: Settler,
}

/// What settles one delivery, apart from its message: give it to
/// [`Consumer::accept`], [`Consumer::settle`] or [`Consumer::settle_later`]
/// of the consumer that handed it out. Whoever holds it is the one owner of
/// the delivery in flight: a settler dropped unsettled leaves its delivery
/// to its deadline (a retry), or to the broker when the consumer closes.
#[derive(Debug)]
pub struct Settler {
    /// The consumer that handed it out ([`Consumer::owns`]).
    pub(super) consumer: u64,
    /// The attempt it arrived as: what settling needs of the message, kept
    /// apart from it so that the message can be handed to the handler.
    pub(super) attempt: u32,
    /// Shared with the deadline's watch, which settles it without its
    /// handler: one copy of the body and headers per delivery, not two.
    pub(super) raw: Arc<RawDelivery>,
    pub(super) watch: Arc<Watched>,
    pub(super) span: tracing::Span,
}

/// Each consumer's number, which its settlers carry: a settler given to
/// another consumer would acknowledge that consumer's delivery of the same
/// tag.
pub(super) static CONSUMER_IDS: AtomicU64 = AtomicU64::new(1);

impl Settler {
    /// The delivery tag (unique within its consumer while unsettled).
    pub fn tag(&self) -> u64 {
        self.raw.tag
    }

    /// The body as it arrived, shared rather than copied.
    pub fn shared_body(&self) -> Body {
        Body(self.raw.clone())
    }

    /// Its consumer span (`process`, see [`crate::trace`]): from hand-out
    /// until it is settled.
    pub fn span(&self) -> &tracing::Span {
        &self.span
    }

    /// Whether its deadline ([`ConsumeOptions::timeout`](super::ConsumeOptions::timeout)) has settled it, as
    /// a retry, before its handler did: the handler is overdue, and what it
    /// returns will be discarded. What a pool of handler threads reads to
    /// replace the one still running it.
    pub fn is_overdue(&self) -> bool {
        self.watch.timed_out.load(Ordering::Acquire)
    }

    /// Count its deadline from now (the consumer's
    /// [`ConsumeOptions::timeout`](super::ConsumeOptions::timeout) ahead):
    /// for a delivery the idempotent guard held in place until another
    /// worker's claim on its key was settled, whose handler only starts now
    /// (the deadline is there so a handler's own claim is never outlived).
    /// False, and nothing done, when the deadline has already settled it.
    /// A push consumer (Rust [`ConsumerHandle`](super::ConsumerHandle))
    /// reads the deadline once, when its handler starts: this is for
    /// handlers that call it before they take a delivery's work on (the
    /// Ruby guard's hold).
    pub fn restart_deadline(&self) -> bool {
        if self.watch.settled.load(Ordering::Acquire) {
            return false;
        }
        self.watch.restart();
        true
    }
}

impl From<Delivery> for Settler {
    fn from(delivery: Delivery) -> Settler {
        delivery.settler
    }
}

impl Delivery {
    /// The message and what settles it, apart.
    pub fn into_parts(self) -> (Message, Settler) {
        (self.message, self.settler)
    }

    /// What settles it.
    pub fn settler(&self) -> &Settler {
        &self.settler
    }

    /// The delivery tag (unique within this consumer while unsettled).
    pub fn tag(&self) -> u64 {
        self.settler.tag()
    }

    /// The body as it arrived, byte for byte.
    pub fn body(&self) -> &[u8] {
        &self.settler.raw.body
    }

    /// The body as it arrived, shared rather than copied: what a handler
    /// that outlives this borrow keeps (the Ruby extension's delivery
    /// object, whose payload is built from it when first read).
    pub fn shared_body(&self) -> Body {
        self.settler.shared_body()
    }

    /// The message, moved out for a handler that takes it by value (the
    /// push consumer), without a copy of its payload. What is left can
    /// still be settled: settling reads nothing of `message`, which is
    /// empty afterwards. [`Delivery::into_parts`] does the same without
    /// leaving a hollow message behind.
    pub fn take_message(&mut self) -> Message {
        let hollow = Message {
            payload: Value::Null,
            envelope: crate::envelope::Envelope {
                id: String::new(),
                kind: None,
                origin: None,
                timestamp: None,
                attempt: self.settler.attempt,
                headers: crate::headers::Headers::new(),
            },
            delivery: crate::message::DeliveryInfo::default(),
        };
        std::mem::replace(&mut self.message, hollow)
    }

    /// Its consumer span (`process`, see [`crate::trace`]): from hand-out
    /// until it is settled. Run the handler inside it (`.instrument(span)`)
    /// to make the handler's own spans its children.
    pub fn span(&self) -> &tracing::Span {
        self.settler.span()
    }
}

impl Consumer {
    /// A delivery just taken off the queue, watched by its deadline.
    pub(super) fn hand_out(&self, message: Message, raw: Arc<RawDelivery>) -> Delivery {
        let watch = Arc::new(Watched::new(self.watchlist.next_id.fetch_add(1, Ordering::Relaxed), self.options.timeout));
        self.watchlist.watched.lock().unwrap_or_else(|p| p.into_inner()).insert(watch.id, (watch.clone(), raw.clone()));
        let span = crate::trace::process_span_from(&self.queue, &raw.exchange, &raw.routing_key, &message, raw.tag);
        let settler = Settler { consumer: self.id, attempt: message.envelope.attempt, raw, watch, span };
        Delivery { message, settler }
    }
}

/// What settling another consumer's delivery is.
pub(super) fn not_ours(settler: &Settler) -> Error {
    Error::invalid(format!("delivery {} was handed out by another consumer: settle it with that one", settler.tag()))
}
