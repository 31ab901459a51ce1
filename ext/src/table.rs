//! A Ruby Hash as core's argument table (`acemq::Headers`), converted value
//! by value with no JSON text between: what `Topology#queue(arguments:)`
//! hands to `_apply`.

use acemq::Headers;
use magnus::value::{Qfalse, Qtrue};
use magnus::{prelude::*, r_hash::ForEach, Error, Float, Integer, RArray, RHash, RString, Ruby, Symbol, Value};
use serde_json::Value as Json;

/// Deeper than this is refused: JSON.generate's own limit (`max_nesting`),
/// which the arguments met when they crossed as JSON text, and far short of
/// the nesting that overflows lapin's recursive field-table parser.
const MAX_NESTING: usize = 100;

/// `hash` as an argument table; `what` names it in errors ("queue
/// arguments"). Keys are Strings or Symbols; values nil, true, false, an
/// Integer within 64 bits, a finite Float, a UTF-8 String, a Symbol (its
/// name), or an Array or Hash of those. Anything else is a
/// ConfigurationError naming the key.
pub fn from_ruby(ruby: &Ruby, hash: RHash, what: &str) -> Result<Headers, Error> {
    object(ruby, hash, what, 0)
}

fn object(ruby: &Ruby, hash: RHash, path: &str, depth: usize) -> Result<Headers, Error> {
    if depth >= MAX_NESTING {
        return Err(refused(ruby, format!("{path}: nesting of {MAX_NESTING} is too deep")));
    }
    let mut map = Headers::new();
    hash.foreach(|key: Value, v: Value| {
        let key = key_of(ruby, key, path)?;
        let inner = format!("{path}: {key}");
        map.insert(key, value(ruby, v, &inner, depth + 1)?);
        Ok(ForEach::Continue)
    })?;
    Ok(map)
}

fn key_of(ruby: &Ruby, key: Value, path: &str) -> Result<String, Error> {
    if let Some(s) = RString::from_value(key) {
        return text(ruby, s, path);
    }
    if let Some(s) = Symbol::from_value(key) {
        return Ok(s.name()?.into_owned());
    }
    Err(refused(ruby, format!("{path}: a key must be a String or a Symbol (got {})", class_name(key))))
}

fn value(ruby: &Ruby, v: Value, path: &str, depth: usize) -> Result<Json, Error> {
    if v.is_nil() {
        return Ok(Json::Null);
    }
    if Qtrue::from_value(v).is_some() {
        return Ok(Json::Bool(true));
    }
    if Qfalse::from_value(v).is_some() {
        return Ok(Json::Bool(false));
    }
    if let Some(i) = Integer::from_value(v) {
        if let Ok(n) = i.to_i64() {
            return Ok(Json::from(n));
        }
        if let Ok(n) = i.to_u64() {
            return Ok(Json::from(n));
        }
        return Err(refused(ruby, format!("{path}: {i} does not fit in 64 bits")));
    }
    if let Some(f) = Float::from_value(v) {
        let x = f.to_f64();
        return serde_json::Number::from_f64(x)
            .map(Json::Number)
            .ok_or_else(|| refused(ruby, format!("{path}: {x} is not a finite number")));
    }
    if let Some(s) = RString::from_value(v) {
        return Ok(Json::String(text(ruby, s, path)?));
    }
    if let Some(s) = Symbol::from_value(v) {
        return Ok(Json::String(s.name()?.into_owned()));
    }
    if let Some(a) = RArray::from_value(v) {
        if depth >= MAX_NESTING {
            return Err(refused(ruby, format!("{path}: nesting of {MAX_NESTING} is too deep")));
        }
        let mut items = Vec::with_capacity(a.len());
        for item in a {
            items.push(value(ruby, item, path, depth + 1)?);
        }
        return Ok(Json::Array(items));
    }
    if let Some(h) = RHash::from_value(v) {
        return Ok(Json::Object(object(ruby, h, path, depth)?));
    }
    Err(refused(
        ruby,
        format!(
            "{path}: a {} has no AMQP form (use a String, an Integer, a Float, true, false, nil, an Array or a Hash)",
            class_name(v)
        ),
    ))
}

/// A String's text, which the wire carries as UTF-8.
fn text(ruby: &Ruby, s: RString, path: &str) -> Result<String, Error> {
    // SAFETY: the GVL is held; the bytes are copied before Ruby runs again.
    let bytes = unsafe { s.as_slice() };
    std::str::from_utf8(bytes)
        .map(str::to_owned)
        .map_err(|_| refused(ruby, format!("{path}: {:?} is not UTF-8 text", String::from_utf8_lossy(bytes))))
}

fn class_name(v: Value) -> String {
    // SAFETY: the name is copied at once.
    unsafe { v.classname() }.into_owned()
}

fn refused(ruby: &Ruby, message: String) -> Error {
    Error::new(ruby.get_inner(&crate::errors::CONFIGURATION_ERROR_CLASS), message)
}
