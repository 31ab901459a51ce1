//! serde_json values to Ruby objects, as `JSON.parse` would build them
//! (string keys, frozen): headers, events and dead letters' details; and
//! text to a serde_json value, its error the Ruby one.

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
