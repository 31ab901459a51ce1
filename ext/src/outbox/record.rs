//! AceMQ::AMQP::Patterns::OutboxRecord: core's `OutboxRecord`, built with
//! the connection's `envelope_for` so a relayed message carries exactly what
//! a direct publish would. lib/acemq/amqp/patterns/outbox_record.rb adds the
//! readers and `Patterns.record`.

use crate::outgoing::RbOutgoing;
use crate::errors::IntoRuby;
use acemq::outbox::OutboxRecord;
use acemq::{Error as CoreError, ErrorKind};
use magnus::{function, method, prelude::*, Error, RModule, Ruby, Value};

#[magnus::wrap(class = "AceMQ::AMQP::Patterns::OutboxRecord", free_immediately, size)]
pub struct RbOutboxRecord {
    pub(crate) inner: OutboxRecord,
}

impl RbOutboxRecord {
    /// The message `Connection#outgoing` built (core's `envelope_for`
    /// made its envelope, as for a direct publish), stored as it is and
    /// sent as it is by the relay.
    fn build(ruby: &Ruby, out: &RbOutgoing) -> Result<Self, Error> {
        let out = &out.inner;
        // Refused now, in the caller's code, rather than as a row the relay
        // can never send.
        // The body is a TEXT column: JSON.generate gives UTF-8, anything else
        // is refused here rather than mangled in the table.
        let body = String::from_utf8(out.body.clone()).map_err(|_| {
            crate::errors::to_ruby(ruby, CoreError::new(ErrorKind::Encoding, "the outbox body is not UTF-8 JSON text"))
        })?;
        let inner = OutboxRecord::new(out.exchange.clone(), out.routing_key.clone(), body, out.envelope.clone());
        inner.check().rb(ruby)?;
        Ok(Self { inner })
    }

    fn exchange(&self) -> String {
        self.inner.exchange.clone()
    }

    fn routing_key(&self) -> String {
        self.inner.routing_key.clone()
    }

    fn body(&self) -> String {
        self.inner.body.clone()
    }

    /// The envelope it will travel with, as a Ruby Envelope.
    fn envelope(ruby: &Ruby, rb_self: &Self) -> Result<Value, Error> {
        crate::outgoing::envelope_to_ruby(ruby, &rb_self.inner.envelope)
    }
}

pub fn init(ruby: &Ruby, patterns: RModule) -> Result<(), Error> {
    let class = patterns.define_class("OutboxRecord", ruby.class_object())?;
    class.define_singleton_method("_build", function!(RbOutboxRecord::build, 1))?;
    class.define_method("exchange", method!(RbOutboxRecord::exchange, 0))?;
    class.define_method("routing_key", method!(RbOutboxRecord::routing_key, 0))?;
    class.define_method("body", method!(RbOutboxRecord::body, 0))?;
    class.define_method("envelope", method!(RbOutboxRecord::envelope, 0))?;
    Ok(())
}
