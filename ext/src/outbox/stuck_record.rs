//! AceMQ::AMQP::Patterns::SQLOutboxStore::StuckRecord: core's `StuckRecord`
//! with named readers, what `SQLOutboxStore#stuck` makes its hashes from.

use acemq::outbox::StuckRecord;
use magnus::{method, prelude::*, Error, RClass, Ruby};

#[magnus::wrap(class = "AceMQ::AMQP::Patterns::SQLOutboxStore::StuckRecord", free_immediately, size)]
pub struct RbStuckRecord(pub(crate) StuckRecord);

impl RbStuckRecord {
    fn id(&self) -> i64 {
        self.0.id
    }

    fn exchange(&self) -> String {
        self.0.exchange.clone()
    }

    fn routing_key(&self) -> String {
        self.0.routing_key.clone()
    }

    fn message_id(&self) -> String {
        self.0.message_id.clone()
    }

    fn attempts(&self) -> u32 {
        self.0.attempts
    }

    fn last_error(&self) -> Option<String> {
        self.0.last_error.clone()
    }

    /// Milliseconds since the epoch, the database's clock.
    fn next_attempt_at(&self) -> i64 {
        self.0.next_attempt_at
    }

    /// Milliseconds since the epoch, the database's clock.
    fn created_at(&self) -> i64 {
        self.0.created_at
    }
}

pub fn init(ruby: &Ruby, store: RClass) -> Result<(), Error> {
    let class = store.define_class("StuckRecord", ruby.class_object())?;
    class.undef_default_alloc_func();
    class.define_method("id", method!(RbStuckRecord::id, 0))?;
    class.define_method("exchange", method!(RbStuckRecord::exchange, 0))?;
    class.define_method("routing_key", method!(RbStuckRecord::routing_key, 0))?;
    class.define_method("message_id", method!(RbStuckRecord::message_id, 0))?;
    class.define_method("attempts", method!(RbStuckRecord::attempts, 0))?;
    class.define_method("last_error", method!(RbStuckRecord::last_error, 0))?;
    class.define_method("next_attempt_at", method!(RbStuckRecord::next_attempt_at, 0))?;
    class.define_method("created_at", method!(RbStuckRecord::created_at, 0))?;
    Ok(())
}
