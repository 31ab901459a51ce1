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
    let mut state = Build { ruby, saw_float: false };
    let mut de = serde_json::Deserializer::from_slice(body);
    let built = serde::de::DeserializeSeed::deserialize(RubySeed(&mut state), &mut de).and_then(|v| de.end().map(|()| v));
    match built {
        Ok(v) if !state.saw_float || !long_number(body) => Ok(v),
        Ok(_) => {
            let json: magnus::RModule = ruby.class_object().const_get("JSON")?;
            json.funcall("parse", (ruby.str_from_slice(body),))
        }
        Err(e) => Err(crate::errors::to_ruby(
            ruby,
            acemq::Error::new(acemq::ErrorKind::Encoding, format!("payload is not valid JSON: {e}")),
        )),
    }
}

struct Build<'r> {
    ruby: &'r Ruby,
    saw_float: bool,
}

struct RubySeed<'a, 'r>(&'a mut Build<'r>);

impl<'de> serde::de::DeserializeSeed<'de> for RubySeed<'_, '_> {
    type Value = Value;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

// The payload is built with Ruby's C API directly rather than through
// magnus's checked wrappers: every object here is one this function just
// made (a fresh Hash or Array, a String), so the only exception any of these
// calls can raise is NoMemoryError, which magnus's own allocators let through
// as well; magnus's `aset`/`push` wrap each call in rb_protect for the
// general case (a frozen receiver, a key whose #hash raises), and on a 1 KiB
// payload of some 40 objects that wrapping was a tenth of the build.
// Values live on this thread's stack or inside the object being built until
// they are returned, where Ruby's GC sees them.

/// A String of `s`, UTF-8 (serde_json has checked it is).
fn rstring(s: &str) -> rb_sys::VALUE {
    // SAFETY: called with the GVL held (a handler's thread, reading its payload).
    unsafe { rb_sys::rb_utf8_str_new(s.as_ptr().cast(), s.len() as _) }
}

/// A Hash key: the frozen, deduplicated String Ruby keeps for that text
/// (what `Hash#[]=` would make of a String key anyway, here without
/// allocating one first when the same key was seen before).
fn rkey(s: &str) -> rb_sys::VALUE {
    // SAFETY: as rstring; rb_enc_interned_str copies the bytes.
    unsafe { rb_sys::rb_enc_interned_str(s.as_ptr().cast(), s.len() as _, rb_sys::rb_utf8_encoding()) }
}

fn value(raw: rb_sys::VALUE) -> Value {
    use magnus::rb_sys::FromRawValue;
    // SAFETY: `raw` is an object just built by the C API on this thread.
    unsafe { Value::from_raw(raw) }
}

fn raw(v: Value) -> rb_sys::VALUE {
    use magnus::rb_sys::AsRawValue;
    v.as_raw()
}

/// A map key, straight from the bytes (a `Cow<str>` key would be an owned
/// String each time: serde's `Cow` never borrows).
struct KeySeed;

impl<'de> serde::de::DeserializeSeed<'de> for KeySeed {
    type Value = rb_sys::VALUE;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<rb_sys::VALUE, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> serde::de::Visitor<'de> for KeySeed {
    type Value = rb_sys::VALUE;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a string key")
    }
    fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<rb_sys::VALUE, E> {
        Ok(rkey(s))
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
        Ok(value(rstring(s)))
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let arr = raw(self.0.ruby.ary_new_capa(seq.size_hint().unwrap_or(0)).as_value());
        while let Some(item) = seq.next_element_seed(RubySeed(self.0))? {
            // SAFETY: a fresh, unfrozen Array; the GVL is held.
            unsafe { rb_sys::rb_ary_push(arr, raw(item)) };
        }
        Ok(value(arr))
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let h = raw(self.0.ruby.hash_new().as_value());
        while let Some(key) = map.next_key_seed(KeySeed)? {
            let item = map.next_value_seed(RubySeed(self.0))?;
            // SAFETY: a fresh, unfrozen Hash and a frozen String key; the GVL is held.
            unsafe { rb_sys::rb_hash_aset(h, key, raw(item)) };
        }
        Ok(value(h))
    }
}
