//! AceMQ::AMQP::Patterns' outbox, native half: the record (built by the
//! rules every publish follows) and the SQL store with the relay's sweep,
//! one Ruby class per file under outbox/. The SQL, the leases, the backoff
//! and the publish are core's; lib/acemq/amqp/patterns/outbox*.rb adds the
//! keywords and the relay's thread.

mod in_flight;
mod record;
mod store;

use magnus::{prelude::*, Error, RModule, Ruby};

pub fn init(ruby: &Ruby, amqp: RModule) -> Result<(), Error> {
    let patterns = amqp.define_module("Patterns")?;
    record::init(ruby, patterns)?;
    store::init(ruby, patterns)?;
    Ok(())
}
