//! The Ruby extension: an adapter over the `acemq` crate. It converts
//! values, releases the GVL around anything that waits, maps errors onto the
//! classes in lib/acemq/errors.rb, and holds no business rules.

mod connection;
mod consumer;
mod delivery;
mod errors;
mod events;
mod gvl;
mod idempotency;
mod json;
mod outbox;
mod outgoing;
mod runner;
mod sql;
mod stream;

use magnus::{function, prelude::*, Error, RModule, RString, Ruby, Value};

fn new_id() -> String {
    acemq::new_id()
}

/// A payload's JSON text as `JSON.generate` writes it, or nil when it holds
/// what only `JSON.generate` writes (`json::generate`).
fn generate(ruby: &Ruby, payload: Value) -> Option<RString> {
    json::generate(ruby, payload)
}

/// A payload's JSON as a publish sends it (`json::encode`): the native walk,
/// or `Connection.generate` for what only `JSON.generate` writes.
fn encode(ruby: &Ruby, payload: Value) -> Result<RString, Error> {
    let bytes = json::encode(ruby, payload)?;
    Ok(ruby.enc_str_new(&bytes, ruby.utf8_encoding()))
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
    outgoing::init(ruby, amqp)?;
    stream::init(ruby, amqp)?;
    consumer::init(ruby, amqp)?;
    delivery::init(ruby, amqp)?;
    sql::init(ruby, amqp)?;
    idempotency::init(ruby, amqp)?;
    outbox::init(ruby, amqp)?;
    runner::init(ruby, amqp)?;
    events::init(ruby, acemq)?;
    Ok(())
}
