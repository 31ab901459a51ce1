//! AceMQ::AMQP::Patterns::OutboxRelay::InFlight: core's `InFlight`, a full
//! batch a started Ruby relay has sent and not settled, handed from one
//! `_sweep` to the next so that the next claim runs while its confirms come
//! back. Opaque to Ruby: the relay's thread only passes it along, and hands
//! it to `_settle_in_flight` when it stops.

use acemq::outbox::InFlight;
use magnus::{prelude::*, Error, RClass, Ruby};
use std::sync::Mutex;

/// Dropped unsettled (the relay's thread killed, the object collected), the
/// rows stay leased and are published again after their lease.
#[magnus::wrap(class = "AceMQ::AMQP::Patterns::OutboxRelay::InFlight", free_immediately, size)]
pub struct RbInFlight(Mutex<Option<InFlight>>);

impl RbInFlight {
    pub(crate) fn new(batch: InFlight) -> Self {
        RbInFlight(Mutex::new(Some(batch)))
    }

    /// The batch, once: a second `_sweep` handed the same object finds it
    /// settled already.
    pub(crate) fn take(&self) -> Option<InFlight> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).take()
    }

    fn inspect(&self) -> String {
        match &*self.0.lock().unwrap_or_else(|p| p.into_inner()) {
            Some(batch) => format!("#<AceMQ::AMQP::Patterns::OutboxRelay::InFlight rows={}>", batch.len()),
            None => "#<AceMQ::AMQP::Patterns::OutboxRelay::InFlight settled>".to_owned(),
        }
    }
}

pub fn init(ruby: &Ruby, relay: RClass) -> Result<(), Error> {
    let class = relay.define_class("InFlight", ruby.class_object())?;
    class.undef_default_alloc_func();
    class.define_method("inspect", magnus::method!(RbInFlight::inspect, 0))?;
    Ok(())
}
