//! AceMQ::AMQP::Patterns::InMemoryIdempotencyStore: core's in-process store.
//! lib/acemq/amqp/patterns/in_memory_idempotency_store.rb adds `new(window:)`.

use super::{required_key, seconds};
use crate::errors::IntoRuby;
use acemq::idempotency::{IdempotencyStore, InMemoryIdempotencyOptions, InMemoryIdempotencyStore};
use magnus::{function, method, prelude::*, Error, RModule, Ruby, Value};

#[magnus::wrap(class = "AceMQ::AMQP::Patterns::InMemoryIdempotencyStore", free_immediately, size)]
pub struct RbInMemoryStore {
    pub(crate) inner: InMemoryIdempotencyStore,
}

impl RbInMemoryStore {
    /// `nil` for what the caller left out: core has the defaults and
    /// refuses zeros.
    fn new(ruby: &Ruby, window: Option<f64>, claim_timeout: Option<f64>) -> Result<Self, Error> {
        let window = window.map(|w| seconds(ruby, "window", w)).transpose()?;
        let claim_timeout = claim_timeout.map(|c| seconds(ruby, "claim_timeout", c)).transpose()?;
        let options = InMemoryIdempotencyOptions::with(window, claim_timeout);
        Ok(Self { inner: InMemoryIdempotencyStore::with_options(options).rb(ruby)? })
    }

    fn first_time(ruby: &Ruby, rb_self: &Self, key: Value) -> Result<bool, Error> {
        rb_self.inner.first_time(&required_key(ruby, key)?).rb(ruby)
    }

    fn confirm(ruby: &Ruby, rb_self: &Self, key: Value) -> Result<(), Error> {
        rb_self.inner.confirm(&required_key(ruby, key)?).rb(ruby)
    }

    fn forget(ruby: &Ruby, rb_self: &Self, key: Value) -> Result<(), Error> {
        rb_self.inner.forget(&required_key(ruby, key)?).rb(ruby)
    }

    fn confirmed(ruby: &Ruby, rb_self: &Self, key: Value) -> Result<bool, Error> {
        rb_self.inner.confirmed(&required_key(ruby, key)?).rb(ruby)
    }

    /// Seconds a claim lives before another worker may take it over.
    fn claim_timeout(&self) -> f64 {
        acemq::idempotency::IdempotencyStore::claim_timeout(&self.inner).map_or(0.0, |d| d.as_secs_f64())
    }

    fn size(&self) -> usize {
        self.inner.len()
    }

    fn clear(&self) {
        self.inner.clear()
    }
}

pub fn init(ruby: &Ruby, patterns: RModule) -> Result<(), Error> {
    let class = patterns.define_class("InMemoryIdempotencyStore", ruby.class_object())?;
    class.define_singleton_method("_new", function!(RbInMemoryStore::new, 2))?;
    class.define_method("first_time?", method!(RbInMemoryStore::first_time, 1))?;
    class.define_method("confirm", method!(RbInMemoryStore::confirm, 1))?;
    class.define_method("forget", method!(RbInMemoryStore::forget, 1))?;
    class.define_method("confirmed?", method!(RbInMemoryStore::confirmed, 1))?;
    class.define_method("size", method!(RbInMemoryStore::size, 0))?;
    class.define_method("claim_timeout", method!(RbInMemoryStore::claim_timeout, 0))?;
    class.define_method("clear", method!(RbInMemoryStore::clear, 0))?;
    Ok(())
}
