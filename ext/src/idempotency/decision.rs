//! AceMQ::AMQP::Patterns::NativeGuard::Decision: what the guard's `_before`
//! decided for one message, for lib/acemq/amqp/patterns/idempotency.rb.
//! Named readers rather than "a String or `[ack, event]`", so a field added
//! is one edit.

use acemq::Guarded;
use magnus::{method, prelude::*, Error, RClass, Ruby, Symbol, Value};

#[magnus::wrap(class = "AceMQ::AMQP::Patterns::NativeGuard::Decision", free_immediately, size)]
pub struct RbDecision(pub(crate) Decision);

pub(crate) enum Decision {
    /// Run the handler; the key is claimed.
    Run { key: String },
    /// Settle with this outcome (and the guard's verdict beside it), unrun:
    /// the idempotency event it is ("duplicate", "in_progress",
    /// "store_error", "missing_key").
    Settle { outcome: Guarded, event: &'static str },
}

impl RbDecision {
    /// Whether to run the handler.
    fn run(&self) -> bool {
        matches!(self.0, Decision::Run { .. })
    }

    /// The claimed key, to hand to `_after`; nil unless run?.
    fn key(&self) -> Option<String> {
        match &self.0 {
            Decision::Run { key } => Some(key.clone()),
            Decision::Settle { .. } => None,
        }
    }

    /// The Ack to settle with, unrun; nil when run?. A new Ack each call
    /// (built from core's outcome, so no Ruby object is kept here).
    fn ack(ruby: &Ruby, rb_self: &Self) -> Result<Option<Value>, Error> {
        match &rb_self.0 {
            Decision::Run { .. } => Ok(None),
            Decision::Settle { outcome, .. } => crate::convert::ack(ruby, outcome.clone()).map(Some),
        }
    }

    /// The idempotency event (:duplicate, :in_progress, :store_error,
    /// :missing_key); nil when run?.
    fn event(ruby: &Ruby, rb_self: &Self) -> Option<Symbol> {
        match &rb_self.0 {
            Decision::Run { .. } => None,
            Decision::Settle { event, .. } => Some(ruby.to_symbol(event)),
        }
    }

    fn inspect(&self) -> String {
        match &self.0 {
            Decision::Run { key } => format!("#<Decision run {key:?}>"),
            Decision::Settle { event, .. } => format!("#<Decision {event}>"),
        }
    }
}

pub fn init(ruby: &Ruby, guard: RClass) -> Result<(), Error> {
    let class = guard.define_class("Decision", ruby.class_object())?;
    class.undef_default_alloc_func();
    class.define_method("run?", method!(RbDecision::run, 0))?;
    class.define_method("key", method!(RbDecision::key, 0))?;
    class.define_method("ack", method!(RbDecision::ack, 0))?;
    class.define_method("event", method!(RbDecision::event, 0))?;
    class.define_method("inspect", method!(RbDecision::inspect, 0))?;
    Ok(())
}
