//! AceMQ::AMQP::Connection::DeadLetter: core's `DeadLetter` (one message in
//! a DLQ, left in place) with named readers, what
//! `Connection#peek_dead_letters` makes its hashes from.

use acemq::DeadLetter;
use magnus::{method, prelude::*, Error, RClass, RString, Ruby};

#[magnus::wrap(class = "AceMQ::AMQP::Connection::DeadLetter", free_immediately, size)]
pub struct RbDeadLetter(pub(crate) DeadLetter);

impl RbDeadLetter {
    fn id(&self) -> String {
        self.0.id.clone()
    }

    fn kind(&self) -> Option<String> {
        self.0.kind.clone()
    }

    /// Attempts made before it was dead-lettered.
    fn attempt(&self) -> u32 {
        self.0.attempt
    }

    fn reason(&self) -> Option<String> {
        self.0.reason.clone()
    }

    fn error_class(&self) -> Option<String> {
        self.0.error_class.clone()
    }

    /// Seconds since the epoch; nil when the header is missing.
    fn failed_at(&self) -> Option<u64> {
        self.0.failed_at
    }

    /// The body as it arrived, a binary String.
    fn body(ruby: &Ruby, rb_self: &Self) -> RString {
        ruby.str_from_slice(&rb_self.0.body)
    }

    fn exchange(&self) -> Option<String> {
        self.0.exchange.clone()
    }

    fn routing_key(&self) -> Option<String> {
        self.0.routing_key.clone()
    }

    /// Every header, as a JSON object.
    fn headers_json(&self) -> String {
        serde_json::Value::Object(self.0.headers.clone()).to_string()
    }
}

pub fn init(ruby: &Ruby, connection: RClass) -> Result<(), Error> {
    let class = connection.define_class("DeadLetter", ruby.class_object())?;
    class.undef_default_alloc_func();
    class.define_method("id", method!(RbDeadLetter::id, 0))?;
    class.define_method("type", method!(RbDeadLetter::kind, 0))?;
    class.define_method("attempt", method!(RbDeadLetter::attempt, 0))?;
    class.define_method("reason", method!(RbDeadLetter::reason, 0))?;
    class.define_method("error_class", method!(RbDeadLetter::error_class, 0))?;
    class.define_method("failed_at", method!(RbDeadLetter::failed_at, 0))?;
    class.define_method("body", method!(RbDeadLetter::body, 0))?;
    class.define_method("exchange", method!(RbDeadLetter::exchange, 0))?;
    class.define_method("routing_key", method!(RbDeadLetter::routing_key, 0))?;
    class.define_method("headers_json", method!(RbDeadLetter::headers_json, 0))?;
    Ok(())
}
