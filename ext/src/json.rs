//! serde_json values to Ruby objects, as `JSON.parse` would build them
//! (string keys, frozen and deduplicated).

use magnus::{prelude::*, Error, IntoValue, RArray, RHash, Ruby, Value};
use serde_json::Value as Json;

pub fn to_ruby(ruby: &Ruby, v: &Json) -> Result<Value, Error> {
    to_ruby_noting(ruby, v, &mut false)
}

/// A JSON object (headers) as a Ruby Hash, without copying it first.
pub fn map_to_ruby(ruby: &Ruby, map: &serde_json::Map<String, Json>) -> Result<Value, Error> {
    let h: RHash = ruby.hash_new();
    for (k, item) in map {
        let key = ruby.str_new(k);
        key.freeze();
        h.aset(key, to_ruby_noting(ruby, item, &mut false)?)?;
    }
    Ok(h.into_value_with(ruby))
}

/// A message payload as Ruby objects. serde_json reads an integer past 64
/// bits as a float, and does not promise the closest float for a number
/// written with 16 or more digits; JSON.parse does both exactly. So when
/// the payload holds a float and its text holds such a number, the body is
/// parsed again by Ruby's JSON: numbers round-trip exactly, and the common
/// payload (no floats, or short ones) never pays for it.
pub fn payload_to_ruby(ruby: &Ruby, v: &Json, body: &[u8]) -> Result<Value, Error> {
    let mut saw_float = false;
    let value = to_ruby_noting(ruby, v, &mut saw_float)?;
    if !saw_float || !long_number(body) {
        return Ok(value);
    }
    let json: magnus::RModule = ruby.class_object().const_get("JSON")?;
    json.funcall("parse", (ruby.str_from_slice(body),))
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

fn to_ruby_noting(ruby: &Ruby, v: &Json, saw_float: &mut bool) -> Result<Value, Error> {
    Ok(match v {
        Json::Null => ruby.qnil().into_value_with(ruby),
        Json::Bool(b) => b.into_value_with(ruby),
        Json::Number(n) => {
            if let Some(i) = n.as_i64() {
                i.into_value_with(ruby)
            } else if let Some(u) = n.as_u64() {
                u.into_value_with(ruby)
            } else {
                *saw_float = true;
                n.as_f64().unwrap_or(f64::NAN).into_value_with(ruby)
            }
        }
        Json::String(s) => ruby.str_new(s).into_value_with(ruby),
        Json::Array(a) => {
            let arr: RArray = ruby.ary_new_capa(a.len());
            for item in a {
                arr.push(to_ruby_noting(ruby, item, saw_float)?)?;
            }
            arr.into_value_with(ruby)
        }
        Json::Object(o) => {
            let h: RHash = ruby.hash_new();
            for (k, item) in o {
                let key = ruby.str_new(k);
                key.freeze();
                h.aset(key, to_ruby_noting(ruby, item, saw_float)?)?;
            }
            h.into_value_with(ruby)
        }
    })
}

pub fn parse(ruby: &Ruby, text: &str, what: &str) -> Result<Json, Error> {
    serde_json::from_str(text).map_err(|e| {
        crate::errors::to_ruby(ruby, acemq::Error::new(acemq::ErrorKind::Encoding, format!("{what} is not valid JSON: {e}")))
    })
}
