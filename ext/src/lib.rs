//! The Ruby extension: an adapter over the `acemq` crate. It converts
//! values, releases the GVL around anything that waits, maps errors onto the
//! classes in lib/acemq/errors.rb, and holds no business rules.

mod breaker;
mod connection;
mod consumer;
mod convert;
mod dead_letter;
mod dead_letter_store;
mod delay;
mod delivery;
mod errors;
mod events;
mod gvl;
mod idempotency;
mod json;
mod keywords;
mod outbox;
mod outgoing;
mod request;
mod partition;
mod runner;
mod sql;
mod stream;
mod table;
mod throttle;

use magnus::{function, prelude::*, Error, RModule, RString, Ruby, Value};

fn new_id() -> String {
    acemq::new_id()
}

/// The native walk alone (`json::generate`): a payload's JSON text as
/// `JSON.generate` writes it, or nil where it leaves the payload to
/// `JSON.generate`. Only the specs call it, to hold the walk to
/// `JSON.generate`'s bytes; a publish calls `_encode`.
fn generate(ruby: &Ruby, payload: Value) -> Option<RString> {
    json::generate(ruby, payload).map(|bytes| utf8(ruby, &bytes))
}

/// A payload's JSON as a publish sends it (`json::encode`): the native walk,
/// or `Connection.generate` for what only `JSON.generate` writes.
fn encode(ruby: &Ruby, payload: Value) -> Result<RString, Error> {
    Ok(utf8(ruby, &json::encode(ruby, payload)?))
}

/// JSON text (UTF-8) as a Ruby String.
fn utf8(ruby: &Ruby, bytes: &[u8]) -> RString {
    ruby.enc_str_new(bytes, ruby.utf8_encoding())
}

#[magnus::init(name = "acemq")]
fn init(ruby: &Ruby) -> Result<(), Error> {
    errors::init(ruby)?;
    let acemq: RModule = ruby.define_module("AceMQ")?;
    let amqp: RModule = acemq.define_module("AMQP")?;
    amqp.define_module_function("_new_id", function!(new_id, 0))?;
    amqp.define_module_function("_generate", function!(generate, 1))?;
    amqp.define_module_function("_encode", function!(encode, 1))?;
    connection::init(ruby, amqp)?;
    delay::init(ruby, amqp)?;
    request::init(ruby, amqp)?;
    outgoing::init(ruby, amqp)?;
    partition::init(ruby, amqp)?;
    stream::init(ruby, amqp)?;
    consumer::init(ruby, amqp)?;
    delivery::init(ruby, amqp)?;
    sql::init(ruby, amqp)?;
    idempotency::init(ruby, amqp)?;
    outbox::init(ruby, amqp)?;
    dead_letter_store::init(ruby, amqp)?;
    runner::init(ruby, amqp)?;
    events::init(ruby, acemq)?;
    Ok(())
}
