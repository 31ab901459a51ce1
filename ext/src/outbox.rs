//! AceMQ::AMQP::Patterns' outbox, native half: the record (built by the
//! rules every publish follows), the SQL store, and the Ruby-thread driver
//! of core's relay cycle, one Ruby class per file under outbox/. The SQL,
//! the leases, the backoff, the cycle and the publish are core's;
//! lib/acemq/amqp/patterns/outbox*.rb adds the keywords and the relay's
//! thread.

mod backlog;
mod cycle;
mod failure;
mod record;
mod store;
mod stuck_record;

use magnus::{prelude::*, Error, RModule, Ruby};

pub fn init(ruby: &Ruby, amqp: RModule) -> Result<(), Error> {
    let patterns = amqp.define_module("Patterns")?;
    record::init(ruby, patterns)?;
    store::init(ruby, patterns)?;
    cycle::init(ruby, patterns)?;
    Ok(())
}
