//! AceMQ::AMQP::Patterns::OutboxRelay::Failure: one failure core's relay
//! cycle reported, for the Ruby relay to hand to `on_error`. Named readers
//! rather than a positional row, so a field added is one edit.

use acemq::outbox::Failure;
use magnus::{method, prelude::*, Error, Exception, ExceptionClass, RClass, Ruby, Value};

#[magnus::wrap(class = "AceMQ::AMQP::Patterns::OutboxRelay::Failure", free_immediately, size)]
pub struct RbFailure(pub(crate) Failure);

impl RbFailure {
    /// The Ruby exception, as `raise` would have made it.
    fn error(ruby: &Ruby, rb_self: &Self) -> Value {
        exception(ruby, rb_self.0.error.clone())
    }

    /// The record's exchange; nil when the sweep failed as a whole (the database).
    fn exchange(&self) -> Option<String> {
        self.0.exchange.clone()
    }

    /// The record's routing key; nil with exchange.
    fn routing_key(&self) -> Option<String> {
        self.0.routing_key.clone()
    }
}

/// The Ruby exception object for a core error, as `raise` would have made
/// it (errors::to_ruby gives a class and a message for most kinds).
fn exception(ruby: &Ruby, e: acemq::Error) -> Value {
    let message = e.to_string();
    let error = crate::errors::to_ruby(ruby, e);
    match error.value() {
        Some(v) if Exception::from_value(v).is_some() => v,
        Some(v) => ExceptionClass::from_value(v)
            .and_then(|c| c.new_instance((message.as_str(),)).ok())
            .map(|x| x.as_value())
            .unwrap_or_else(|| ruby.qnil().as_value()),
        None => ruby.qnil().as_value(),
    }
}

pub fn init(ruby: &Ruby, relay: RClass) -> Result<(), Error> {
    let class = relay.define_class("Failure", ruby.class_object())?;
    class.undef_default_alloc_func();
    class.define_method("error", method!(RbFailure::error, 0))?;
    class.define_method("exchange", method!(RbFailure::exchange, 0))?;
    class.define_method("routing_key", method!(RbFailure::routing_key, 0))?;
    Ok(())
}
