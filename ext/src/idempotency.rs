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

/// An idempotency key as text, by core's rule (`key_text`): the bytes are
/// read whatever the encoding says (a binary string and the UTF-8 string of
/// the same bytes are one key), and bytes that are not UTF-8 are an
/// EncodingError with core's reason. Other encodings are transcoded first;
/// non-strings use `to_s`. `nil` is `None`.
pub(crate) fn key(ruby: &Ruby, v: Value) -> Result<Option<String>, Error> {
    key_or_refusal(ruby, v)?.map_err(|refusal| Error::new(ruby.get_inner(&crate::errors::ENCODING_ERROR), refusal))
}

/// `key`, with core's refusal of a key that is not text as a value: the
/// guard settles that message as it settles one with no key, with this
/// reason (the same key function finds the same bytes on every retry).
pub(crate) fn key_or_refusal(ruby: &Ruby, v: Value) -> Result<Result<Option<String>, String>, Error> {
    if v.is_nil() {
        return Ok(Ok(None));
    }
    let s = match RString::from_value(v) {
        Some(s) => s,
        None => v.funcall::<_, _, RString>("to_s", ())?,
    };
    let binary: bool = s.enc_get() == ruby.ascii8bit_encindex();
    let s = if binary || s.is_utf8_compatible_encoding() { s } else { s.funcall::<_, _, RString>("encode", ("UTF-8",))? };
    // Safe: the borrowed bytes are copied before Ruby runs again.
    let text = acemq::idempotency::key_text(unsafe { s.as_slice() }).map(str::to_owned);
    Ok(text.map(Some).map_err(|e| e.message().to_owned()))
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
