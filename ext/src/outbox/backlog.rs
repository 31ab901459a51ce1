//! AceMQ::AMQP::Patterns::SQLOutboxStore::Backlog: core's `Backlog` with
//! named readers, what `SQLOutboxStore#backlog` makes its hash from.

use acemq::outbox::Backlog;
use magnus::{method, prelude::*, Error, RClass, Ruby};

#[magnus::wrap(class = "AceMQ::AMQP::Patterns::SQLOutboxStore::Backlog", free_immediately, size)]
pub struct RbBacklog(pub(crate) Backlog);

impl RbBacklog {
    /// Rows not yet confirmed, leased ones included.
    fn count(&self) -> u64 {
        self.0.count
    }

    /// Seconds the oldest has waited; nil when the outbox is empty.
    fn oldest_age(&self) -> Option<f64> {
        self.0.oldest_age.map(|d| d.as_secs_f64())
    }

    /// Rows that have failed at least once.
    fn stuck(&self) -> u64 {
        self.0.stuck
    }
}

pub fn init(ruby: &Ruby, store: RClass) -> Result<(), Error> {
    let class = store.define_class("Backlog", ruby.class_object())?;
    class.undef_default_alloc_func();
    class.define_method("count", method!(RbBacklog::count, 0))?;
    class.define_method("oldest_age", method!(RbBacklog::oldest_age, 0))?;
    class.define_method("stuck", method!(RbBacklog::stuck, 0))?;
    Ok(())
}
