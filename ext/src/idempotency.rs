//! AceMQ::AMQP::Patterns' native half: the idempotency guard and the two
//! stores, one Ruby class per file under idempotency/. The decision (claim,
//! run, confirm or forget) is core's `Guard`; lib/acemq/amqp/patterns/
//! adds the keywords and the Proc.

mod decision;
mod guard;
mod memory;
mod ruby_store;
mod sql_store;

use magnus::{prelude::*, Error, RModule, RString, Ruby, Value};

/// An idempotency key as UTF-8 text. A binary (ASCII-8BIT) string and the
/// UTF-8 string of the same bytes are one key: the bytes are read whatever
/// the encoding says, and bound as text (a BLOB never equals the TEXT of the
/// same bytes in SQLite). Bytes that are not UTF-8 are an EncodingError:
/// replacing them would make two different keys one. Other encodings are
/// transcoded; non-strings use `to_s`. `nil` is `None`.
pub(crate) fn key(ruby: &Ruby, v: Value) -> Result<Option<String>, Error> {
    if v.is_nil() {
        return Ok(None);
    }
    let s = match RString::from_value(v) {
        Some(s) => s,
        None => v.funcall::<_, _, RString>("to_s", ())?,
    };
    let binary: bool = s.enc_get() == ruby.ascii8bit_encindex();
    let s = if binary || s.is_utf8_compatible_encoding() { s } else { s.funcall::<_, _, RString>("encode", ("UTF-8",))? };
    let bytes = unsafe { s.as_slice() }.to_vec();
    String::from_utf8(bytes).map(Some).map_err(|_| {
        Error::new(
            ruby.get_inner(&crate::errors::ENCODING_ERROR),
            format!("idempotency key {} is not UTF-8 text: give a key: that returns text (hex-encode binary ids)", s.inspect()),
        )
    })
}

/// `key`, for a store method, where nil is a mistake rather than a message
/// without a key.
pub(crate) fn required_key(ruby: &Ruby, v: Value) -> Result<String, Error> {
    key(ruby, v)?.ok_or_else(|| Error::new(ruby.exception_arg_error(), "an idempotency key is required, got nil"))
}

pub(crate) use crate::convert::seconds;

pub fn init(ruby: &Ruby, amqp: RModule) -> Result<(), Error> {
    let patterns = amqp.define_module("Patterns")?;
    memory::init(ruby, patterns)?;
    sql_store::init(ruby, patterns)?;
    guard::init(ruby, patterns)?;
    Ok(())
}
