//! A payload's body to Ruby objects: read by core's `json_read`
//! ([`Objects`]), what that leaves by serde_json ([`RubySeed`]), and a body
//! whose numbers a float cannot hold exactly by `JSON.parse` itself.

use super::objects::Objects;
use super::raw::{raw, value};
use super::seed::RubySeed;
use magnus::{prelude::*, Error, Ruby, Value};

/// A JSON body straight to Ruby objects, in one pass over the bytes: no
/// serde_json `Value` built and dropped on the way. Built as `JSON.parse`
/// builds them; a body whose numbers a float cannot hold exactly goes to
/// `JSON.parse` itself, as `payload_to_ruby` does.
///
/// Text, not bytes: the parser then takes its strings as they are, where
/// from bytes it checks each one is UTF-8 again, which core has already
/// done for this body.
pub fn body_to_ruby(ruby: &Ruby, body: &str) -> Result<Value, Error> {
    match build(ruby, body) {
        Ok(Built::Value(v)) => Ok(v),
        Ok(Built::Later) => {
            let json: magnus::RModule = ruby.class_object().const_get("JSON")?;
            json.funcall("parse", (ruby.str_new(body),))
        }
        Err(e) => Err(not_json(ruby, e)),
    }
}

/// What [`build`] made of a JSON body.
pub enum Built {
    Value(Value),
    /// JSON, with a number a float cannot hold exactly: `JSON.parse` builds
    /// it ([`body_to_ruby`]), as `payload_to_ruby` does.
    Later,
}

/// A body into Ruby objects, or what the parser said when it is not JSON:
/// the one read of a consumed delivery's body (core's
/// `Consumer::fetch_blocking`), check and build in one pass.
///
/// Read by core's `json_read` first ([`Objects`]); what that leaves (text
/// that is not JSON, and the few kinds of JSON it does not take) is read by
/// serde_json, which builds the same objects or says what is wrong.
pub fn build(ruby: &Ruby, body: &str) -> Result<Built, serde_json::Error> {
    let mut state = Build { ruby, saw_float: false, keys: 0 };
    if let Some(v) = acemq::json_read::read(body, &mut Objects(&mut state)) {
        return Ok(if state.saw_float && long_number(body.as_bytes()) { Built::Later } else { Built::Value(value(v)) });
    }
    let mut state = Build { ruby, saw_float: false, keys: 0 };
    let mut de = serde_json::Deserializer::from_str(body);
    let v = serde::de::DeserializeSeed::deserialize(RubySeed(&mut state), &mut de)?;
    de.end()?;
    Ok(if state.saw_float && long_number(body.as_bytes()) { Built::Later } else { Built::Value(v) })
}

/// [`build`] under `rb_protect`: called from inside a consumer's `_next`,
/// where an exception Ruby raises mid-build (NoMemoryError) must not jump
/// over the delivery in hand. Such a build is `Later`: the payload is then
/// built when the handler reads it, and raises there.
pub fn build_protected(ruby: &Ruby, body: &str) -> Result<Built, serde_json::Error> {
    let mut out = None;
    let protected = magnus::rb_sys::protect(|| {
        out = Some(build(ruby, body));
        raw(ruby.qnil().as_value())
    });
    match (protected, out) {
        (Ok(_), Some(built)) => built,
        _ => Ok(Built::Later),
    }
}

/// A payload that cannot be read as JSON, as the Ruby error it raises.
pub fn not_json(ruby: &Ruby, why: impl std::fmt::Display) -> Error {
    crate::errors::to_ruby(ruby, acemq::Error::new(acemq::ErrorKind::Encoding, format!("payload is not valid JSON: {why}")))
}

pub(super) struct Build<'r> {
    pub(super) ruby: &'r Ruby,
    pub(super) saw_float: bool,
    /// Keys read so far: the next one's place in the payload
    /// ([`rkey`](super::keys::rkey)'s `place`).
    pub(super) keys: usize,
}

/// Whether `body` has a number (outside strings) with 16 or more digits.
fn long_number(body: &[u8]) -> bool {
    let (mut in_string, mut escaped, mut digits) = (false, false, 0usize);
    for &b in body {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => {
                in_string = true;
                digits = 0;
            }
            b'0'..=b'9' => {
                digits += 1;
                if digits >= 16 {
                    return true;
                }
            }
            b'.' => {}
            _ => digits = 0,
        }
    }
    false
}
