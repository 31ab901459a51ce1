//! JSON to Ruby objects, as `JSON.parse` would build them (string keys,
//! frozen): a payload straight from its bytes (`body_to_ruby`), headers and
//! events from serde_json values.

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

/// A JSON body straight to Ruby objects, in one pass over the bytes: no
/// serde_json `Value` built and dropped on the way (the consumer's payload,
/// see core's `wire::Payload::Checked`). Built as `JSON.parse` builds them;
/// a body whose numbers a float cannot hold exactly goes to `JSON.parse`
/// itself, as `payload_to_ruby` does.
pub fn body_to_ruby(ruby: &Ruby, body: &[u8]) -> Result<Value, Error> {
    let mut state = Build { ruby, saw_float: false, error: None };
    let mut de = serde_json::Deserializer::from_slice(body);
    let built = serde::de::DeserializeSeed::deserialize(RubySeed(&mut state), &mut de).and_then(|v| de.end().map(|()| v));
    match built {
        Ok(v) if !state.saw_float || !long_number(body) => Ok(v),
        Ok(_) => {
            let json: magnus::RModule = ruby.class_object().const_get("JSON")?;
            json.funcall("parse", (ruby.str_from_slice(body),))
        }
        Err(e) => Err(state.error.take().unwrap_or_else(|| {
            crate::errors::to_ruby(ruby, acemq::Error::new(acemq::ErrorKind::Encoding, format!("payload is not valid JSON: {e}")))
        })),
    }
}

struct Build<'r> {
    ruby: &'r Ruby,
    saw_float: bool,
    /// A Ruby exception met while building (kept: serde's error is text).
    error: Option<Error>,
}

struct RubySeed<'a, 'r>(&'a mut Build<'r>);

impl<'de> serde::de::DeserializeSeed<'de> for RubySeed<'_, '_> {
    type Value = Value;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl Build<'_> {
    fn fail<E: serde::de::Error>(&mut self, e: Error) -> E {
        self.error = Some(e);
        E::custom("a Ruby error while building the payload")
    }
}

impl<'de> serde::de::Visitor<'de> for RubySeed<'_, '_> {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("JSON")
    }
    fn visit_unit<E: serde::de::Error>(self) -> Result<Value, E> {
        Ok(self.0.ruby.qnil().into_value_with(self.0.ruby))
    }
    fn visit_bool<E: serde::de::Error>(self, b: bool) -> Result<Value, E> {
        Ok(b.into_value_with(self.0.ruby))
    }
    fn visit_i64<E: serde::de::Error>(self, i: i64) -> Result<Value, E> {
        Ok(i.into_value_with(self.0.ruby))
    }
    fn visit_u64<E: serde::de::Error>(self, u: u64) -> Result<Value, E> {
        Ok(u.into_value_with(self.0.ruby))
    }
    fn visit_f64<E: serde::de::Error>(self, f: f64) -> Result<Value, E> {
        self.0.saw_float = true;
        Ok(f.into_value_with(self.0.ruby))
    }
    fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Value, E> {
        Ok(self.0.ruby.str_new(s).into_value_with(self.0.ruby))
    }
    fn visit_borrowed_str<E: serde::de::Error>(self, s: &'de str) -> Result<Value, E> {
        self.visit_str(s)
    }
    fn visit_string<E: serde::de::Error>(self, s: String) -> Result<Value, E> {
        self.visit_str(&s)
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let arr: RArray = self.0.ruby.ary_new_capa(seq.size_hint().unwrap_or(0));
        while let Some(item) = seq.next_element_seed(RubySeed(self.0))? {
            if let Err(e) = arr.push(item) {
                return Err(self.0.fail(e));
            }
        }
        Ok(arr.into_value_with(self.0.ruby))
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let h: RHash = self.0.ruby.hash_new();
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            let key = self.0.ruby.str_new(&key);
            key.freeze();
            let item = map.next_value_seed(RubySeed(self.0))?;
            if let Err(e) = h.aset(key, item) {
                return Err(self.0.fail(e));
            }
        }
        Ok(h.into_value_with(self.0.ruby))
    }
}
